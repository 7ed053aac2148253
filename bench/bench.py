#!/usr/bin/env python3
"""Tolk vs CTranslate2 on the same sentences, same options, in one invocation.

    python3 bench/bench.py [--limit 500] [--beams 1,4] [--compute-types float32]

Each (engine, compute type, beam) run happens in a fresh subprocess so that its peak
RSS (ru_maxrss, model load included) belongs to it alone; the timing covers
translate_batch only. Sources are the zh dev verses tokenized with the model's
SentencePiece model; BLEU is sacrebleu's corpus BLEU against the English verses.
Prints a Markdown table (and --json FILE writes the rows).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_dir(env, local, shared):
    if os.environ.get(env):
        return os.environ[env]
    for candidate in (os.path.join(ROOT, local), os.path.join(ROOT, "..", "shared", shared)):
        if os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return os.path.join(ROOT, local)


def worker(args):
    """Runs one configuration and prints a JSON line: tokens, seconds, hypotheses, RSS."""
    import resource

    with open(args.tokens_file, encoding="utf-8") as f:
        source = [line.split() for line in f.read().splitlines()]
    model_dir = os.path.join(args.models, "zh-en-ct2")
    if args.engine == "ct2":
        import ctranslate2

        translator = ctranslate2.Translator(
            model_dir, device="cpu", compute_type=args.compute_type, intra_threads=args.threads, inter_threads=1
        )
        run = lambda: [r.hypotheses[0] for r in translator.translate_batch(
            source, beam_size=args.beam, max_batch_size=args.max_batch_size)]
    else:
        sys.path.insert(0, os.path.join(ROOT, "examples-c", "python"))
        import tolk

        translator = tolk.Translator(tolk.Model(model_dir), compute_type=args.compute_type, intra_threads=args.threads)
        run = lambda: [r.hypotheses[0] for r in translator.translate_batch(
            source, beam_size=args.beam, max_batch_size=args.max_batch_size)]
    best = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        hyps = run()
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens": sum(len(h) for h in hyps), "seconds": best, "rss_mb": rss_mb, "hypotheses": hyps}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models", "models"))
    p.add_argument("--data", default=default_dir("TOLK_DATA", "data", "data"))
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--beams", default="1,4")
    p.add_argument("--compute-types", default="float32")
    p.add_argument("--engines", default="tolk,ct2")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1, help="best of K timings")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--compute-type", help=argparse.SUPPRESS)
    p.add_argument("--beam", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokens-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    import sacrebleu
    import sentencepiece as spm

    with open(os.path.join(args.data, "dev-matthew.zh"), encoding="utf-8") as f:
        zh = f.read().splitlines()[: args.limit]
    with open(os.path.join(args.data, "dev-matthew.en"), encoding="utf-8") as f:
        en = f.read().splitlines()[: args.limit]
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.models, "zh-en-ct2", "sentencepiece.model"))
    tokens_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tolk-bench-{os.getpid()}.tok")
    with open(tokens_file, "w", encoding="utf-8") as f:
        for line in zh:
            f.write(" ".join(sp.encode(line, out_type=str)) + "\n")

    rows = []
    for compute_type in args.compute_types.split(","):
        for beam in [int(b) for b in args.beams.split(",")]:
            for engine in args.engines.split(","):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--engine", engine,
                       "--compute-type", compute_type, "--beam", str(beam), "--tokens-file", tokens_file,
                       "--models", args.models, "--max-batch-size", str(args.max_batch_size),
                       "--threads", str(args.threads), "--repeat", str(args.repeat)]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{engine} {compute_type} beam {beam} failed:\n{out.stderr}", file=sys.stderr)
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                hyps = ["".join(h).replace("\u2581", " ").strip() for h in r.pop("hypotheses")]
                r.update(engine=engine, compute_type=compute_type, beam=beam,
                         tokens_per_s=r["tokens"] / r["seconds"],
                         bleu=sacrebleu.corpus_bleu(hyps, [en]).score, outputs=hyps)
                rows.append(r)
                print(f"  {engine:5} {compute_type:8} beam {beam}: {r['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    os.unlink(tokens_file)

    print(f"\n{len(zh)} zh->en verses, max_batch_size {args.max_batch_size}, {args.threads} thread(s)\n")
    print("| engine | compute | decoding | target tokens/s | BLEU | peak RSS | vs CTranslate2 | same output as CT2 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer = next((x for x in rows if x["engine"] == "ct2" and x["beam"] == r["beam"]
                     and x["compute_type"] == r["compute_type"]), None)
        ratio = f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer else "-"
        same = f"{sum(a == b for a, b in zip(r['outputs'], peer['outputs'])) / len(zh):.1%}" if peer else "-"
        name = "Tolk" if r["engine"] == "tolk" else "CTranslate2 4.8.5"
        decoding = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        print(f"| {name} | {r['compute_type']} | {decoding} | {r['tokens_per_s']:.0f} | {r['bleu']:.2f} "
              f"| {r['rss_mb']:.0f} MB | {ratio} | {same} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "outputs"} for r in rows], f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
