#!/usr/bin/env python3
"""Serving figures, Tolk vs CTranslate2 in one invocation, zh->en, int8 by default.

    python3 bench/serving.py [--limit N] [--workers 1,2] [--beam 4] [--compute-type int8]
                             [--calls 200] [--json FILE]

- Throughput: the dev verses in one translate_batch (max_batch_size 32, examples) with W
  workers: Tolk inter_threads=W, CTranslate2 inter_threads=W, both intra_threads=1. Each
  (engine, W) runs in a fresh process: tokens/s, BLEU, peak RSS (VmHWM, load included).
- Latency: one short verse translated alone, --calls times after 5 warm-up calls, p50 and
  p95 in ms (greedy and --beam; 1 worker, 1 thread).
- Time to first token: the median verse with greedy search and a per-token callback (Tolk
  on_token, CTranslate2 callback=), p50 over 50 calls, next to the whole call's p50.

The source is tokenized once with the model's SentencePiece model, outside any timing.
Prints Markdown tables with the CPU model and Tolk's ISA.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import ROOT, TOLK_PY, cpu_model, default_dir, peak_rss_mb  # noqa: E402

ENGINES = {"tolk": "Tolk", "ct2": "CTranslate2"}


def load(engine, model_dir, compute_type, workers, kv_cache_type="float32"):
    if engine == "ct2":
        import ctranslate2

        return ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type, intra_threads=1,
                                      inter_threads=workers), ctranslate2.__version__
    sys.path.insert(0, TOLK_PY)
    import tolk

    return (tolk.Translator(model_dir, compute_type=compute_type, intra_threads=1, inter_threads=workers,
                            kv_cache_type=kv_cache_type),
            "%s (%s)" % (tolk.version(), tolk.cpu_isa()))


def percentile(values, p):
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def worker(args):
    """One measurement in a fresh process; prints one JSON object."""
    with open(args.tokens_file, encoding="utf-8") as f:
        source = json.load(f)
    model_dir = os.path.join(args.models, "zh-en-ct2")
    translator, version = load(args.engine, model_dir, args.compute_type, args.workers, args.kv_cache_type)
    out = {"version": version}
    if args.task == "throughput":
        start = time.perf_counter()
        results = translator.translate_batch(source, beam_size=args.beam, max_batch_size=32, batch_type="examples")
        seconds = time.perf_counter() - start
        hyps = [list(r.hypotheses[0]) for r in results]
        out.update(seconds=seconds, tokens=sum(len(h) for h in hyps), hypotheses=hyps, rss_mb=peak_rss_mb())
    elif args.task == "latency":
        short = min((s for s in source if len(s) >= 6), key=len)
        for beam in (1, args.beam):
            times = []
            for i in range(5 + args.calls):
                start = time.perf_counter()
                translator.translate_batch([short], beam_size=beam)
                if i >= 5:
                    times.append(time.perf_counter() - start)
            out[f"beam{beam}"] = {"p50_ms": 1000 * percentile(times, 50), "p95_ms": 1000 * percentile(times, 95)}
        out["source_tokens"] = len(short)
    elif args.task == "first_token":
        verse = sorted(source, key=len)[len(source) // 2]
        first, whole = [], []
        for i in range(5 + 50):
            seen = []
            start = time.perf_counter()

            def on_token(_event):
                if not seen:
                    seen.append(time.perf_counter())
                # CTranslate2: returning True stops; Tolk: False stops. None goes on in both.

            if args.engine == "ct2":
                translator.translate_batch([verse], beam_size=1, callback=on_token)
            else:
                translator.translate_batch([verse], beam_size=1, on_token=on_token)
            end = time.perf_counter()
            if i >= 5 and seen:
                first.append(seen[0] - start)
                whole.append(end - start)
        out.update(first_ms=1000 * statistics.median(first), whole_ms=1000 * statistics.median(whole),
                   source_tokens=len(verse))
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


def run(args, engine, task, workers, tokens_file):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--engine", engine, "--task", task,
           "--workers", str(workers), "--tokens-file", tokens_file, "--models", args.models,
           "--compute-type", args.compute_type, "--beam", str(args.beam), "--calls", str(args.calls),
           "--kv-cache-type", args.kv_cache_type]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{ENGINES[engine]} {task} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models"))
    p.add_argument("--data", default=default_dir("TOLK_DATA", "data"))
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--workers", default="1,2", help="worker counts for the throughput runs (default 1,2)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--compute-type", default="int8")
    p.add_argument("--kv-cache-type", default="float32",
                   help="how Tolk keeps attention keys/values: float32 (default), bfloat16, int8")
    p.add_argument("--calls", type=int, default=200, help="calls of the latency run (default 200)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--tokens-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.workers = int(args.workers)
        return worker(args)

    import sacrebleu
    import sentencepiece as spm

    model_dir = os.path.join(args.models, "zh-en-ct2")
    with open(os.path.join(args.data, "dev-matthew.zh"), encoding="utf-8") as f:
        zh = f.read().splitlines()[: args.limit]
    with open(os.path.join(args.data, "dev-matthew.en"), encoding="utf-8") as f:
        en = f.read().splitlines()[: args.limit]
    sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "sentencepiece.model"))
    source = [sp.encode(line, out_type=str) for line in zh]
    workers = [int(w) for w in args.workers.split(",")]
    report = {"cpu": cpu_model(), "cpus": os.cpu_count(), "compute_type": args.compute_type, "beam": args.beam,
              "tolk_kv_cache_type": args.kv_cache_type,
              "verses": len(zh), "throughput": [], "latency": {}, "first_token": {}}
    with tempfile.TemporaryDirectory(prefix="tolk-serving-") as tmp:
        tokens_file = os.path.join(tmp, "source.json")
        with open(tokens_file, "w", encoding="utf-8") as f:
            json.dump(source, f, ensure_ascii=False)
        for w in workers:
            for engine in ENGINES:
                print(f"throughput: {ENGINES[engine]}, {w} worker(s) ...", file=sys.stderr, flush=True)
                r = run(args, engine, "throughput", w, tokens_file)
                hyps = ["".join(h).replace("\u2581", " ").strip() for h in r.pop("hypotheses")]
                r.update(engine=engine, workers=w, tokens_per_s=r["tokens"] / r["seconds"],
                         bleu=sacrebleu.corpus_bleu(hyps, [en]).score)
                report["throughput"].append(r)
        for engine in ENGINES:
            print(f"latency and first token: {ENGINES[engine]} ...", file=sys.stderr, flush=True)
            report["latency"][engine] = run(args, engine, "latency", 1, tokens_file)
            report["first_token"][engine] = run(args, engine, "first_token", 1, tokens_file)

    tolk_version = next(r["version"] for r in report["throughput"] if r["engine"] == "tolk")
    print(f"\n{len(zh)} zh->en verses, {args.compute_type}, beam {args.beam}, max_batch_size 32, "
          f"Tolk kv_cache_type {args.kv_cache_type}; "
          f"{report['cpu']}, {report['cpus']} CPUs; Tolk {tolk_version}\n")
    print("| engine | workers | tokens/s | vs 1 worker | BLEU | peak RSS MB |")
    print("|---|--:|--:|--:|--:|--:|")
    for r in report["throughput"]:
        one = next(x for x in report["throughput"] if x["engine"] == r["engine"] and x["workers"] == workers[0])
        print(f"| {ENGINES[r['engine']]} | {r['workers']} | {r['tokens_per_s']:.0f} | "
              f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}x | {r['bleu']:.2f} | {r['rss_mb']:.0f} |")
    for w in workers:
        t = next(x for x in report["throughput"] if x["engine"] == "tolk" and x["workers"] == w)
        c = next(x for x in report["throughput"] if x["engine"] == "ct2" and x["workers"] == w)
        print(f"\n{w} worker(s): Tolk/CT2 speed {t['tokens_per_s'] / c['tokens_per_s']:.2f}x, "
              f"peak RSS {t['rss_mb'] / c['rss_mb']:.2f}x", end="")
    lat = report["latency"]
    print(f"\n\nOne short verse ({lat['tolk']['source_tokens']} tokens) alone, {args.calls} calls, ms:\n")
    print("| engine | greedy p50 | greedy p95 | beam %d p50 | beam %d p95 |" % (args.beam, args.beam))
    print("|---|--:|--:|--:|--:|")
    for engine in ENGINES:
        g, b = lat[engine]["beam1"], lat[engine][f"beam{args.beam}"]
        print(f"| {ENGINES[engine]} | {g['p50_ms']:.1f} | {g['p95_ms']:.1f} | {b['p50_ms']:.1f} | {b['p95_ms']:.1f} |")
    ft = report["first_token"]
    print(f"\nTime to first token, greedy, the median verse ({ft['tolk']['source_tokens']} tokens), p50 of 50 calls:\n")
    print("| engine | first token ms | whole translation ms |")
    print("|---|--:|--:|")
    for engine in ENGINES:
        print(f"| {ENGINES[engine]} | {ft[engine]['first_ms']:.1f} | {ft[engine]['whole_ms']:.1f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
