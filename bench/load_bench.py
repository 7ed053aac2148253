#!/usr/bin/env python3
"""How long Tolk and CTranslate2 take to load the zh-en model, side by side.

    python3 bench/load_bench.py [--compute-types int8,float32] [--rounds 5] [--reloads 5]
                                [--engines tolk,ct2] [--models DIR] [--isa LEVEL] [--json FILE]

Time to a usable translator matters where a process translates little: a command-line
call, a desktop application's start. Each round starts one fresh process per engine and
compute type, in turn: it imports the engine (not timed), loads the model once (the first
load: the process's first touch of the library and of the model file's pages), then frees
it and loads it again --reloads times (the steady cost). The model's files are read once
before the first round so that both engines find them in the page cache. Prints, per engine
and compute type, the median first load and the median reload over the rounds (ms), with
Tolk/CTranslate2 ratios; one thread each (Tolk intra_threads=1; CTranslate2
intra_threads=1, inter_threads=1). --isa holds both engines to one instruction-set level
(TOLK_CPU_ISA, CT2_FORCE_CPU_ISA), as bench.py does.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ENGINE_NAMES, TOLK_PY, cpu_model, default_dir, hold_isa  # noqa: E402


def worker(args):
    """One engine and compute type in this (fresh) process: prints one JSON object."""
    if args.engine == "tolk":
        sys.path.insert(0, TOLK_PY)
        import tolk

        def load():
            return tolk.Translator(args.model_dir, compute_type=args.compute_type, intra_threads=1)

        version = "%s (%s)" % (tolk.version(), tolk.cpu_isa())
    else:
        import ctranslate2

        def load():
            return ctranslate2.Translator(args.model_dir, device="cpu", compute_type=args.compute_type,
                                          intra_threads=1, inter_threads=1)

        version = ctranslate2.__version__
    times = []
    for _ in range(1 + args.reloads):
        start = time.perf_counter()
        translator = load()
        times.append(time.perf_counter() - start)
        del translator
    json.dump({"version": version, "first_s": times[0], "reload_s": times[1:]}, sys.stdout)
    sys.stdout.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compute-types", default="int8,float32")
    p.add_argument("--engines", default="tolk,ct2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reloads", type=int, default=5)
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models"))
    p.add_argument("--isa", help="hold both engines to this level (avx2, avx512bw, avx512vnni, ...)")
    p.add_argument("--json", help="save the rows to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--compute-type", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    model_dir = os.path.join(args.models, "zh-en-ct2")
    if not os.path.isdir(model_dir):
        raise SystemExit(f"{model_dir} not found: run scripts/fetch_models.sh or set TOLK_MODELS")
    if args.isa:
        hold_isa(args.isa)
    for name in os.listdir(model_dir):
        with open(os.path.join(model_dir, name), "rb") as f:
            while f.read(1 << 24):
                pass
    engines = args.engines.split(",")
    compute_types = args.compute_types.split(",")
    runs = {(e, c): [] for e in engines for c in compute_types}
    for _ in range(args.rounds):
        for c in compute_types:
            for e in engines:
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--engine", e, "--compute-type", c,
                       "--model-dir", model_dir, "--reloads", str(args.reloads)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[(e, c)].append(json.loads(out.strip().splitlines()[-1]))

    rows = []
    for (e, c), results in runs.items():
        rows.append({
            "engine": e, "compute_type": c, "version": results[0]["version"],
            "first_ms": 1e3 * statistics.median(r["first_s"] for r in results),
            "reload_ms": 1e3 * statistics.median(t for r in results for t in r["reload_s"]),
        })
    print(f"\nzh-en model load ({model_dir}), median of {args.rounds} fresh processes and "
          f"{args.rounds * args.reloads} reloads; {cpu_model()}"
          f"{', ISA held to ' + args.isa if args.isa else ''}\n")
    print("| engine | compute type | first load (ms) | reload (ms) | Tolk/CT2 first | Tolk/CT2 reload |")
    print("|---|---|--:|--:|--:|--:|")
    for r in rows:
        peer = next((x for x in rows if x["engine"] == "ct2" and x["compute_type"] == r["compute_type"]), None)
        ratios = ["", ""]
        if r["engine"] == "tolk" and peer:
            r["first_over_ct2"] = r["first_ms"] / peer["first_ms"]
            r["reload_over_ct2"] = r["reload_ms"] / peer["reload_ms"]
            ratios = [f"{r['first_over_ct2']:.2f}x", f"{r['reload_over_ct2']:.2f}x"]
        print(f"| {ENGINE_NAMES[r['engine']]} {r['version']} | {r['compute_type']} | {r['first_ms']:.0f} "
              f"| {r['reload_ms']:.0f} | {ratios[0]} | {ratios[1]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "isa": args.isa, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
