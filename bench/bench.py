#!/usr/bin/env python3
"""Tolk vs CTranslate2 on the same zh->en dev verses, same options, one invocation.

    python3 bench/bench.py [--limit N] [--beams 1,4] [--compute-types float32,int8]
                           [--engines tolk,ct2] [--repeat K] [--rounds R] [--models DIR] [--data DIR]
                           [--vmap FILE] [--json FILE] [--kv-cache-types float32,int8]
                           [--max-decoding-memory-mb N]

The source (dev-matthew.zh) is tokenized once with zh-en-ct2/sentencepiece.model, outside
any timing. Each (engine, compute type, decoding) runs in its own fresh subprocess that
loads the model, then times translate_batch only (max_batch_size 32, batch_type
"examples", one thread: Tolk intra_threads=1; CTranslate2 device="cpu", intra_threads=1,
inter_threads=1), best of --repeat; --rounds R runs every engine R times, alternating, each
time in a fresh process, and keeps each engine's best (on a shared machine whose speed comes
and goes, a slow spell then hits both engines alike). Target tokens = all output tokens (SentencePiece
pieces, no </s>). BLEU = sacrebleu corpus BLEU of the detokenized pieces
("".join(pieces).replace("▁", " ").strip()) against dev-matthew.en. Peak RSS = the
worker's VmHWM (model load included; ru_maxrss is not used because a child inherits its
parent's high-water mark across fork+exec). Prints one Markdown table and the Tolk/CT2
tokens/s ratio of each configuration; --json FILE saves the rows. --vmap FILE translates
with use_vmap=True on a copy of zh-en-ct2 (its files linked) whose vmap.txt is FILE.
--kv-cache-types runs Tolk once per kv_cache_type (how it keeps attention keys/values:
float32, bfloat16, int8), each row compared with the same CTranslate2 run.
--max-decoding-memory-mb N gives Tolk's greedy runs that budget of decoding state (sentences
start when their keys/values fit: a lower peak, fewer rows a step, the same outputs); 0 = no
bound; without it, Tolk's default (half the model's weights, at least 32 MB).
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLK_PY = os.path.join(ROOT, "examples-c", "python")
ENGINE_NAMES = {"tolk": "Tolk", "ct2": "CTranslate2"}


def default_dir(env, name):
    """$env, else ../shared/<name> beside the repository, else <name>/ in it."""
    if os.environ.get(env):
        return os.path.abspath(os.environ[env])
    for candidate in (os.path.join(ROOT, "..", "shared", name), os.path.join(ROOT, name)):
        if os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return os.path.join(ROOT, name)


def precompile_binding():
    """Byte-compiles the Python binding once, as installing a package does (pip compiled
    CTranslate2's). Otherwise, where Python writes no bytecode (PYTHONDONTWRITEBYTECODE),
    every worker compiles tolk.py from source and the compiler's memory stays in its peak
    RSS: 3.9 MB for `import tolk` against 0.9 MB from bytecode (2026-11-28)."""
    import compileall

    compileall.compile_dir(TOLK_PY, quiet=2)


def peak_rss_mb():
    """This process's peak resident set (VmHWM), in MB; ru_maxrss as a fallback."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024 if sys.platform == "darwin" else 1024)


# --------------------------------------------------------------------------- worker
def worker(args):
    """One configuration in a fresh process; prints one JSON object on stdout."""
    import resource

    with open(args.tokens_file, encoding="utf-8") as f:
        source = json.load(f)
    model_dir = args.model_dir or os.path.join(args.models, "zh-en-ct2")
    options = dict(beam_size=args.beam, max_batch_size=args.max_batch_size, batch_type="examples",
                   return_scores=False)
    if args.model_dir:
        options.update(use_vmap=True)
    if args.engine == "tolk" and args.kv_cache_type != "float32":
        options.update(kv_cache_type=args.kv_cache_type)
    if args.engine == "tolk" and args.max_decoding_memory_mb is not None:
        options.update(max_decoding_memory_mb=args.max_decoding_memory_mb)

    t0 = time.perf_counter()
    if args.engine == "ct2":
        import ctranslate2

        version = ctranslate2.__version__ + (" (MKL)" if os.environ.get("CT2_USE_MKL") == "1" else "")
        translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=args.compute_type,
                                            intra_threads=args.threads, inter_threads=1)
    elif args.engine == "tolk":
        sys.path.insert(0, TOLK_PY)
        import tolk

        version = "%s (%s)" % (tolk.version(), tolk.cpu_isa())
        # Loaded for the compute type, as ctranslate2.Translator(path, compute_type) does.
        translator = tolk.Translator(model_dir, compute_type=args.compute_type, intra_threads=args.threads)
    else:
        raise SystemExit(f"unknown engine {args.engine!r}")
    load_s = time.perf_counter() - t0

    times = []
    hyps = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        results = translator.translate_batch(source, **options)
        times.append(time.perf_counter() - start)
        out = [list(r.hypotheses[0]) for r in results]
        if hyps is not None and out != hyps:
            print("warning: outputs differ between repeats", file=sys.stderr)
        hyps = out
    if len(hyps) != len(source):
        raise SystemExit(f"{len(source)} inputs but {len(hyps)} results")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    json.dump({
        "version": version,
        "tokens": sum(len(h) for h in hyps),
        "seconds": min(times),
        "times": times,
        "load_s": load_s,
        "rss_mb": peak_rss_mb(),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "hypotheses": hyps,
    }, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


# --------------------------------------------------------------------------- parent
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_worker(args, engine, compute_type, beam, tokens_file, tmpdir, kv="float32", env=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--engine", engine,
           "--compute-type", compute_type, "--beam", str(beam), "--tokens-file", tokens_file,
           "--kv-cache-type", kv,
           "--models", args.models, "--max-batch-size", str(args.max_batch_size),
           "--threads", str(args.threads), "--repeat", str(args.repeat)]
    if args.max_decoding_memory_mb is not None:
        cmd += ["--max-decoding-memory-mb", str(args.max_decoding_memory_mb)]
    if args.model_dir:
        cmd += ["--model-dir", args.model_dir]
    out_path = os.path.join(tmpdir, f"{engine}-{compute_type}-{beam}-{kv}.out")
    err_path = os.path.join(tmpdir, f"{engine}-{compute_type}-{beam}-{kv}.err")
    start = time.perf_counter()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.run(cmd, stdout=out, stderr=err, env=env)
    wall = time.perf_counter() - start
    with open(err_path, encoding="utf-8", errors="replace") as f:
        stderr = f.read()
    if proc.returncode != 0 and engine == "ct2" and "efficient int16" in stderr and env is None:
        # CTranslate2 with oneDNN (its wheels' backend off Intel) has no int16 products; with
        # MKL it has, if slowly off Intel: measure that, labelled "(MKL)".
        print("  CTranslate2 refused int16 with oneDNN: rerunning with CT2_USE_MKL=1", file=sys.stderr, flush=True)
        return run_worker(args, engine, compute_type, beam, tokens_file, tmpdir, kv, env=dict(os.environ, CT2_USE_MKL="1"))
    if proc.returncode != 0:
        code = proc.returncode
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return None, f"{why}\n{stderr.strip()[-4000:]}"
    try:
        with open(out_path, encoding="utf-8") as f:
            r = json.loads(f.read().strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        return None, f"unreadable worker output ({e})\n{stderr.strip()[-4000:]}"
    r["process_wall_s"] = wall
    if stderr.strip():
        r["stderr"] = stderr.strip()[-2000:]
    return r, None


# Tolk's ISA level -> (CT2_FORCE_CPU_ISA, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS) that hold
# CTranslate2 to the same instructions: its own kernels know AVX2 and AVX512, and its int8
# products come from oneDNN (AMD, pip wheels) or MKL (Intel), which tell VNNI apart.
ISA_LEVELS = {
    "avx2": ("AVX2", "AVX2", "AVX2"),
    "avxvnni": ("AVX2", "AVX2_VNNI", "AVX2_E1"),
    "avx512bw": ("AVX512", "AVX512_CORE", "AVX512"),
    "avx512vnni": ("AVX512", "AVX512_CORE_VNNI", "AVX512_E1"),
    # Tolk's int8 products on AMX tiles; CTranslate2's own kernels stop at AVX-512, its
    # oneDNN and MKL may take AMX.
    "amx": ("AVX512", "AVX512_CORE_AMX", "AVX512_E4"),
}


def hold_isa(level):
    """Holds Tolk and CTranslate2 (its own kernels, oneDNN and MKL) to ISA `level`, for this
    process and those it starts; set before either engine is loaded."""
    ct2_isa, onednn_isa, mkl_isa = ISA_LEVELS[level]
    os.environ.update(TOLK_CPU_ISA=level, CT2_FORCE_CPU_ISA=ct2_isa, ONEDNN_MAX_CPU_ISA=onednn_isa,
                      MKL_ENABLE_INSTRUCTIONS=mkl_isa)


def read_verses(zh_path, en_path, model_dir, limit):
    """The first `limit` zh sources and en references, and the sources tokenized with the
    model's SentencePiece model."""
    import sentencepiece as spm

    with open(zh_path, encoding="utf-8") as f:
        zh = f.read().splitlines()[:limit]
    with open(en_path, encoding="utf-8") as f:
        en = f.read().splitlines()[:limit]
    sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "sentencepiece.model"))
    return zh, en, [sp.encode(line, out_type=str) for line in zh]


def detokenize(pieces):
    return "".join(pieces).replace("\u2581", " ").strip()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models"),
                   help="folder holding zh-en-ct2/ ($TOLK_MODELS, ../shared/models, models/)")
    p.add_argument("--data", default=default_dir("TOLK_DATA", "data"),
                   help="folder holding dev-matthew.zh/.en ($TOLK_DATA, ../shared/data, data/)")
    p.add_argument("--limit", type=int, default=500, help="first N verses (default 500, all)")
    p.add_argument("--beams", default="1,4", help="beam sizes, 1 = greedy (default 1,4)")
    p.add_argument("--compute-types", default="float32", help="e.g. float32,int8 (default float32)")
    p.add_argument("--engines", default="tolk,ct2", help="tolk,ct2 (default both)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="intra_threads for both engines (default 1)")
    p.add_argument("--repeat", type=int, default=1, help="time translate_batch K times, keep the best")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every engine R times, alternating, each in a fresh process; keep each one's best")
    p.add_argument("--isa", metavar="LEVEL", choices=sorted(ISA_LEVELS),
                   help="hold both engines to one ISA level (avx2, avxvnni, avx512bw, avx512vnni, amx): "
                        "TOLK_CPU_ISA, CT2_FORCE_CPU_ISA, ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS "
                        "(CT2_FORCE_CPU_ISA alone "
                        "leaves CTranslate2's oneDNN products on the machine's best ISA); avx512bw is "
                        "AVX-512 without VNNI (Skylake-SP/X)")
    p.add_argument("--json", metavar="FILE", help="also write the table (and metadata) as JSON")
    p.add_argument("--outputs", metavar="DIR", help="also write each run's detokenized output here")
    p.add_argument("--vmap", metavar="FILE", help="translate with use_vmap=True and this vmap.txt")
    p.add_argument("--kv-cache-types", default="float32",
                   help="Tolk's kv_cache_type, one row each: float32 (default), bfloat16, int8")
    p.add_argument("--max-decoding-memory-mb", type=int, default=None, metavar="N",
                   help="Tolk's max_decoding_memory_mb (decoding state budget; 0 = none; "
                        "default: Tolk's, half the model's weights, at least 32)")
    # Worker mode (internal).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--compute-type", help=argparse.SUPPRESS)
    p.add_argument("--beam", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokens-file", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)  # the model copy with --vmap
    p.add_argument("--kv-cache-type", default="float32", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.isa:
        hold_isa(args.isa)  # inherited by every worker process
    precompile_binding()

    if args.rounds < 1 or args.repeat < 1:
        p.error("--rounds and --repeat take a count of at least 1")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINE_NAMES:
            p.error(f"unknown engine {e!r} (tolk, ct2)")
    beams = [int(b) for b in args.beams.split(",")]
    compute_types = [c.strip() for c in args.compute_types.split(",") if c.strip()]
    kv_types = [c.strip() for c in args.kv_cache_types.split(",") if c.strip()]
    model_dir = os.path.join(args.models, "zh-en-ct2")
    zh_path = os.path.join(args.data, "dev-matthew.zh")
    en_path = os.path.join(args.data, "dev-matthew.en")
    for path in (model_dir, zh_path, en_path) + ((args.vmap,) if args.vmap else ()):
        if not os.path.exists(path):
            sys.exit(f"missing {path}: run scripts/fetch_models.sh, or set TOLK_MODELS/TOLK_DATA "
                     "(or --models/--data)")

    import sacrebleu

    zh, en, source = read_verses(zh_path, en_path, model_dir, args.limit)

    rows, failures, table = [], [], []
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="tolk-bench-") as tmpdir:
        tokens_file = os.path.join(tmpdir, "source.json")
        with open(tokens_file, "w", encoding="utf-8") as f:
            json.dump(source, f, ensure_ascii=False)
        if args.vmap:
            args.model_dir = os.path.join(tmpdir, "zh-en-ct2-vmap")
            os.makedirs(args.model_dir)
            for name in os.listdir(model_dir):
                if name != "vmap.txt":
                    os.symlink(os.path.join(model_dir, name), os.path.join(args.model_dir, name))
            os.symlink(os.path.abspath(args.vmap), os.path.join(args.model_dir, "vmap.txt"))
        for compute_type in compute_types:
            for beam in beams:
                runs = [(e, k) for e in engines for k in (kv_types if e == "tolk" else ["float32"])]
                best, round_seconds = {}, {}
                # Rounds alternate the engines, each in a fresh process, and keep each one's
                # fastest: a shared machine's slow spells then fall on both, not on one.
                for rnd in range(args.rounds):
                    for engine, kv in runs:
                        prev = best.get((engine, kv))
                        if prev is not None and "error" in prev:
                            continue  # failed in an earlier round: reported once, not rerun
                        label = f"{ENGINE_NAMES[engine]} {compute_type} {'greedy' if beam == 1 else f'beam {beam}'}"
                        label += f" (kv_cache_type {kv})" if kv != "float32" else ""
                        label += f", round {rnd + 1} of {args.rounds}" if args.rounds > 1 else ""
                        print(f"running {label} ...", file=sys.stderr, flush=True)
                        r, error = run_worker(args, engine, compute_type, beam, tokens_file, tmpdir, kv)
                        if error:
                            last = error.strip().splitlines()[-1]
                            print(f"  FAILED: {label}: {last}\n{error}", file=sys.stderr)
                            best[(engine, kv)] = {"engine": engine, "compute_type": compute_type, "beam": beam,
                                                  "kv_cache_type": kv, "error": error, "summary": last}
                            continue
                        print(f"  {r['tokens'] / r['seconds']:.1f} target tokens/s, {r['rss_mb']:.0f} MB, "
                              f"{r['seconds']:.2f} s", file=sys.stderr, flush=True)
                        if prev is not None and r["hypotheses"] != prev["hypotheses"]:
                            print(f"  warning: {label}: output differs from an earlier round", file=sys.stderr)
                        round_seconds.setdefault((engine, kv), []).append(r["seconds"])
                        if prev is None or r["seconds"] < prev["seconds"]:
                            best[(engine, kv)] = r
                for (engine, kv), r in best.items():
                    if "error" in r:
                        failures.append(r)
                        table.append(r)
                        continue
                    r["round_seconds"] = round_seconds[(engine, kv)]
                    hyps = [detokenize(h) for h in r.pop("hypotheses")]
                    r.update(engine=engine, compute_type=compute_type, beam=beam, kv_cache_type=kv,
                             tokens_per_s=r["tokens"] / r["seconds"],
                             bleu=sacrebleu.corpus_bleu(hyps, [en]).score)
                    r["_outputs"] = hyps
                    rows.append(r)
                    table.append(r)
                    if args.outputs:
                        os.makedirs(args.outputs, exist_ok=True)
                        name = f"{engine}-{compute_type}-beam{beam}{'' if kv == 'float32' else '-kv-' + kv}.en"
                        with open(os.path.join(args.outputs, name), "w", encoding="utf-8") as f:
                            f.writelines(h + "\n" for h in hyps)
    load_after = os.getloadavg()

    def peer_of(r):
        return next((x for x in rows if x["engine"] == "ct2" and x["beam"] == r["beam"]
                     and x["compute_type"] == r["compute_type"]), None)

    for r in rows:
        peer = peer_of(r)
        if r["engine"] == "tolk" and peer:
            r["tolk_over_ct2"] = r["tokens_per_s"] / peer["tokens_per_s"]
            r["rss_over_ct2"] = r["rss_mb"] / peer["rss_mb"]
            r["same_as_ct2"] = sum(a == b for a, b in zip(r["_outputs"], peer["_outputs"])) / len(zh)

    ncpu = os.cpu_count() or 1
    print(f"\n{len(zh)} zh->en verses ({zh_path}), "
          f"max_batch_size {args.max_batch_size}, {args.threads} thread(s), best of {args.repeat}"
          f"{f' in each of {args.rounds} alternating rounds' if args.rounds > 1 else ''}"
          f"{', use_vmap with ' + args.vmap if args.vmap else ''}; "
          f"{cpu_model()}, {ncpu} CPUs, load average {load_before[0]:.2f} -> {load_after[0]:.2f}"
          f"{', ISA held to ' + args.isa if args.isa else ''}\n")
    print("| engine | compute type | decoding | target tokens/s | BLEU | peak RSS (MB) | wall time (s) "
          "| Tolk/CT2 tokens/s | Tolk/CT2 peak RSS | same output as CT2 |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in table:
        decoding = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        if "error" in r:
            kv = f", kv {r['kv_cache_type']}" if r.get("kv_cache_type", "float32") != "float32" else ""
            print(f"| {ENGINE_NAMES[r['engine']]}{kv} | {r['compute_type']} | {decoding} "
                  f"| failed: {r['summary'][:80].replace('|', '/')} | | | | | | |")
            continue
        ratio = f"{r['tolk_over_ct2']:.2f}x" if "tolk_over_ct2" in r else ""
        same = f"{r['same_as_ct2']:.1%}" if "same_as_ct2" in r else ""
        rss = f"{r['rss_over_ct2']:.2f}x" if "rss_over_ct2" in r else ""
        kv = f", kv {r['kv_cache_type']}" if r.get("kv_cache_type", "float32") != "float32" else ""
        print(f"| {ENGINE_NAMES[r['engine']]} {r['version']}{kv} | {r['compute_type']} | {decoding} "
              f"| {r['tokens_per_s']:.1f} | {r['bleu']:.2f} | {r['rss_mb']:.0f} | {r['seconds']:.2f} "
              f"| {ratio} | {rss} | {same} |")
    print()
    for r in rows:
        if "tolk_over_ct2" in r:
            decoding = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            kv = f" (kv_cache_type {r['kv_cache_type']})" if r["kv_cache_type"] != "float32" else ""
            print(f"Tolk/CT2 target tokens/s, {r['compute_type']} {decoding}{kv}: {r['tolk_over_ct2']:.2f}x "
                  f"({r['tokens_per_s']:.1f} / {peer_of(r)['tokens_per_s']:.1f}), "
                  f"peak RSS {r['rss_over_ct2']:.2f}x ({r['rss_mb']:.0f} / {peer_of(r)['rss_mb']:.0f} MB)")
    if load_before[0] > ncpu - 0.5 or load_after[0] > ncpu - 0.5:
        print(f"\nwarning: the machine was busy (load average {load_before[0]:.2f} -> {load_after[0]:.2f} "
              f"on {ncpu} CPUs); timings are noisy", file=sys.stderr)

    if args.json:
        meta = {
            "date": started,
            "cpu": cpu_model(), "cpus": ncpu, "python": platform.python_version(),
            "models": args.models, "data": args.data, "sentences": len(zh),
            "max_batch_size": args.max_batch_size, "threads": args.threads, "repeat": args.repeat, "rounds": args.rounds,
            "vmap": args.vmap,
            "load_average": [load_before[0], load_after[0]],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta,
                       "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                       "failures": failures}, f, indent=1)
            f.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
