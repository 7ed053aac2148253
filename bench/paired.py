#!/usr/bin/env python3
"""Tolk and CTranslate2 timed in turns inside one process, chunk by chunk: the speed ratio
on a shared machine whose speed changes within seconds.

    python3 bench/paired.py [--compute-type int8] [--beam 1] [--isa avx2] [--limit 500]
                            [--chunk 64] [--repeat 3] [--json FILE]

bench.py runs each engine in a fresh process (peak RSS needs that), so a slow spell of a
shared VM during one engine's run skews its ratio. Here both engines are loaded in one
process. The verses (tokenized once, outside any timing) are sorted longest first, as both
engines batch them, and cut into chunks of --chunk verses; each chunk is translated by
both engines in turn, the first of the two alternating, --repeat times, and each engine's
time is the sum over the chunks of its fastest translation of each. A spell longer than a
chunk's few seconds then lands on both engines. Options as bench.py's: max_batch_size 32,
batch_type "examples", one thread, no scores. Each chunk is its own translate_batch call,
so Tolk's continuous batching joins batches only within a chunk (a larger --chunk is
closer to bench.py's one call). No peak RSS: use bench.py for memory.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ISA_LEVELS, TOLK_PY, cpu_model, default_dir, detokenize, hold_isa, read_verses  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models"), help="folder holding zh-en-ct2/")
    p.add_argument("--data", default=default_dir("TOLK_DATA", "data"), help="folder holding dev-matthew.zh/.en")
    p.add_argument("--limit", type=int, default=500, help="first N verses (default 500, all)")
    p.add_argument("--compute-type", default="int8")
    p.add_argument("--beam", type=int, default=1, help="1 = greedy")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--chunk", type=int, default=64, help="verses per chunk (default 64: two batches)")
    p.add_argument("--repeat", type=int, default=3, help="turns per chunk; each engine keeps its fastest")
    p.add_argument("--isa", metavar="LEVEL", choices=sorted(ISA_LEVELS), help="hold both engines to one ISA level")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args()
    if args.chunk < 1 or args.repeat < 1 or args.limit < 1:
        p.error("--chunk, --repeat and --limit take a count of at least 1")
    if args.isa:
        hold_isa(args.isa)  # before either engine is imported: they read it at load
    model_dir = os.path.join(args.models, "zh-en-ct2")
    zh_path, en_path = (os.path.join(args.data, f"dev-matthew.{lang}") for lang in ("zh", "en"))
    for path in (model_dir, zh_path, en_path):
        if not os.path.exists(path):
            sys.exit(f"missing {path}: run scripts/fetch_models.sh, or set TOLK_MODELS/TOLK_DATA")

    import ctranslate2
    import sacrebleu

    sys.path.insert(0, TOLK_PY)
    import tolk

    _, en, source = read_verses(zh_path, en_path, model_dir, args.limit)

    engines = {
        "tolk": tolk.Translator(model_dir, compute_type=args.compute_type, intra_threads=1),
        "ct2": ctranslate2.Translator(model_dir, device="cpu", compute_type=args.compute_type, intra_threads=1,
                                      inter_threads=1),
    }
    names = {"tolk": f"Tolk {tolk.version()} ({tolk.cpu_isa()})", "ct2": f"CTranslate2 {ctranslate2.__version__}"}
    options = dict(beam_size=args.beam, max_batch_size=args.max_batch_size, batch_type="examples", return_scores=False)
    order = sorted(range(len(source)), key=lambda i: -len(source[i]))
    chunks = [order[i:i + args.chunk] for i in range(0, len(order), args.chunk)]

    best = {e: [float("inf")] * len(chunks) for e in engines}
    outputs = {e: [None] * len(source) for e in engines}
    for turn in range(args.repeat):
        for c, chunk in enumerate(chunks):
            turns = ["tolk", "ct2"] if (turn + c) % 2 == 0 else ["ct2", "tolk"]
            for engine in turns:
                batch = [source[i] for i in chunk]
                start = time.perf_counter()
                results = engines[engine].translate_batch(batch, **options)
                seconds = time.perf_counter() - start
                best[engine][c] = min(best[engine][c], seconds)
                for i, r in zip(chunk, results):
                    outputs[engine][i] = list(r.hypotheses[0])
        print(f"turn {turn + 1} of {args.repeat} done", file=sys.stderr, flush=True)

    rows = {}
    for engine in engines:
        hyps = outputs[engine]
        text = [detokenize(h) for h in hyps]
        tokens = sum(len(h) for h in hyps)
        seconds = sum(best[engine])
        rows[engine] = {"engine": names[engine], "tokens": tokens, "seconds": seconds,
                        "tokens_per_s": tokens / seconds, "chunk_seconds": best[engine],
                        "bleu": sacrebleu.corpus_bleu(text, [en]).score}
    same = sum(a == b for a, b in zip(outputs["tolk"], outputs["ct2"])) / len(source)
    ratio = rows["tolk"]["tokens_per_s"] / rows["ct2"]["tokens_per_s"]
    decoding = "greedy" if args.beam == 1 else f"beam {args.beam}"
    print(f"\n{len(source)} zh->en verses, {args.compute_type} {decoding}, chunks of {args.chunk} verses, "
          f"each engine's fastest of {args.repeat} turns per chunk; {cpu_model()}"
          f"{', ISA held to ' + args.isa if args.isa else ''}\n")
    print("| engine | target tokens/s | BLEU | seconds |")
    print("|---|--:|--:|--:|")
    for r in rows.values():
        print(f"| {r['engine']} | {r['tokens_per_s']:.1f} | {r['bleu']:.2f} | {r['seconds']:.2f} |")
    print(f"\nTolk/CT2 tokens/s: {ratio:.2f}x; same output as CT2: {same:.0%}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": {"cpu": cpu_model(), "isa": args.isa, "compute_type": args.compute_type,
                                "beam": args.beam, "chunk": args.chunk, "repeat": args.repeat,
                                "verses": len(source)},
                       "rows": rows, "tolk_over_ct2": ratio, "same_as_ct2": same}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
