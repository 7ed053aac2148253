#!/usr/bin/env python3
"""Text in, text out: Tolk's text API against the usual CTranslate2 pipeline, same run.

    python3 bench/text_bench.py [--limit N] [--beam 1] [--compute-type int8] [--repeat K]
                                [--models DIR] [--data DIR]

Both engines get the raw zh dev verses (dev-matthew.zh), one verse per text, and return
English text:
- Tolk: ``tolk.Translator.translate_text(verses, split="lines")`` (SentencePiece,
  batching and detokenization inside the library);
- CTranslate2: python ``sentencepiece`` encode -> ``translate_batch`` -> detokenize
  (join pieces, "▁" -> space), as Argos Translate does.
Same options (max_batch_size 32 sentences, one thread, the given beam and compute type).
Each engine runs in a fresh subprocess; the time covers the whole text -> text call (best
of --repeat), not model loading. Prints sentences/s, the Tolk/CT2 ratio, how many
translations are identical, and how long python sentencepiece alone takes to encode.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from bench import default_dir  # shared with bench.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLK_PY = os.path.join(ROOT, "examples-c", "python")


def detokenize(pieces):
    return "".join(pieces).replace("\u2581", " ").strip()


def worker(args):
    with open(os.path.join(args.data, "dev-matthew.zh"), encoding="utf-8") as f:
        verses = [line.rstrip("\n") for line in f][: args.limit]
    model_dir = os.path.join(args.models, "zh-en-ct2")
    spm_path = os.path.join(model_dir, "sentencepiece.model")
    options = dict(beam_size=args.beam, max_batch_size=32)
    if args.engine == "tolk":
        sys.path.insert(0, TOLK_PY)
        import tolk

        translator = tolk.Translator(model_dir, compute_type=args.compute_type, intra_threads=1)
        version = "Tolk %s (%s)" % (tolk.version(), tolk.cpu_isa())

        def run():
            return translator.translate_text(verses, split="lines", **options)
    else:
        import ctranslate2
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=spm_path)
        translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=args.compute_type,
                                            intra_threads=1, inter_threads=1)
        version = "CTranslate2 %s + sentencepiece %s" % (ctranslate2.__version__, spm.__version__)

        def run():
            tokens = sp.encode(verses, out_type=str)
            results = translator.translate_batch(tokens, batch_type="examples", **options)
            return [detokenize(r.hypotheses[0]) for r in results]

        def tokenize_only():
            return sp.encode(verses, out_type=str)

    times, out = [], None
    for _ in range(args.repeat):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    tok_s = None
    if args.engine == "ct2":
        start = time.perf_counter()
        tokenize_only()
        tok_s = time.perf_counter() - start
    json.dump({"version": version, "seconds": min(times), "tokenize_s": tok_s, "outputs": out},
              sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models"))
    p.add_argument("--data", default=default_dir("TOLK_DATA", "data"))
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--compute-type", default="int8")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rows = {}
    for engine in ("tolk", "ct2"):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--engine", engine,
               "--models", args.models, "--data", args.data, "--limit", str(args.limit),
               "--beam", str(args.beam), "--compute-type", args.compute_type, "--repeat", str(args.repeat)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{engine} failed:\n{proc.stderr[-3000:]}")
        rows[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    n = args.limit
    same = sum(a == b for a, b in zip(rows["tolk"]["outputs"], rows["ct2"]["outputs"]))
    print(f"{n} zh->en verses, text in / text out, {args.compute_type}, beam {args.beam}, "
          f"max_batch_size 32, 1 thread, best of {args.repeat}")
    print("| engine | seconds | sentences/s |")
    print("|---|--:|--:|")
    for engine in ("tolk", "ct2"):
        r = rows[engine]
        print(f"| {r['version']} | {r['seconds']:.2f} | {n / r['seconds']:.1f} |")
    ratio = rows["ct2"]["seconds"] / rows["tolk"]["seconds"]
    print(f"Tolk/CT2 speed: {ratio:.2f}x; identical translations: {same}/{n} ({100.0 * same / n:.1f}%); "
          f"python sentencepiece encode alone: {rows['ct2']['tokenize_s']:.3f} s")


if __name__ == "__main__":
    main()
