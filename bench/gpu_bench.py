#!/usr/bin/env python3
"""Tolk on a CUDA GPU against Hugging Face transformers running the same weights, zh->en.

    python3 bench/gpu_bench.py [--repeat 4] [--beam 4] [--batch 64]
                               [--compute-types float16,float32] [--engines tolk,hf]
                               [--models DIR] [--data DIR] [--hf-dir DIR] [--json FILE]

The peer: CTranslate2's wheels want libcublas.so.12 and cannot run where only CUDA 13 is
installed (the GPU machine this was measured on), so the peer is transformers'
MarianMTModel, its weights converted from zh-en-ct2/model.bin by
bench/ct2_to_hf_marian.py (int8 dequantized, then cast to the compute type), run with
torch in float16 or float32.

The source (dev-matthew.zh, 500 verses) is tokenized once with zh-en-ct2's SentencePiece
model and repeated --repeat times. Each (engine, compute type) runs in its own subprocess:
load, one warm-up batch, then one timed call over every sentence (Tolk: translate_batch
with max_batch_size --batch, which sorts by length; transformers: generate over batches
of --batch sentences sorted by length, num_beams --beam, length_penalty 1,
early_stopping True as CTranslate2 and Tolk stop, max_new_tokens 256). Target tokens =
generated tokens without </s> and padding. GPU
memory = the peak of nvidia-smi's memory.used, sampled every 20 ms while the worker runs,
minus the reading before it started. BLEU = sacrebleu (else a plain BLEU-4) of the
detokenized pieces against dev-matthew.en, first copy only.

Roofline: Tolk's worker also times one batch of --batch sentences alone and divides by
its decoding steps (longest output + 1), against the bytes one decoder step must read:
every decoder weight and the output projection once, in the compute type's width
(caches and activations not counted, so the achieved figure is a lower bound).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples-c", "python"))
sys.path.insert(0, os.path.join(ROOT, "ffi-tests", "gpu"))

from bench import default_dir  # noqa: E402  (bench/bench.py: $ENV, ../shared/NAME, NAME/)


def load_sources(args):
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(args.models, "zh-en-ct2", "sentencepiece.model"))
    lines = open(os.path.join(args.data, "dev-matthew.zh"), encoding="utf-8").read().splitlines()
    return [sp.encode(line, out_type=str) for line in lines[: args.limit]]


def detok(pieces):
    return "".join(pieces).replace("\u2581", " ").strip()


def bleu(hyps, args):
    import bleu as bleu_module  # ffi-tests/gpu/bleu.py

    refs = open(os.path.join(args.data, "dev-matthew.en"), encoding="utf-8").read().splitlines()[: len(hyps)]
    try:
        import sacrebleu

        return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    except ImportError:
        return round(bleu_module.plain_bleu(hyps, refs), 2)


def decoder_step_bytes(width):
    """Bytes of zh-en-ct2's decoder weights and output projection (what one step reads):
    d 512, feed-forward 2048, 6 decoder layers, 65001 output rows."""
    d, ffn, layers, vocab = 512, 2048, 6, 65001
    per_layer = 4 * d * d + 2 * d * d + 2 * d * ffn  # self-attention, cross q + out, feed-forward
    return width * (layers * per_layer + vocab * d)


def worker_tolk(args, sources):
    import tolk

    model_dir = os.path.join(args.models, "zh-en-ct2")
    translator = tolk.Translator(model_dir, compute_type=args.compute_type, device=args.device)
    options = dict(beam_size=args.beam, max_batch_size=args.batch)
    translator.translate_batch(sources[: args.batch], **options)  # warm-up
    batch = sources * args.repeat
    start = time.perf_counter()
    results = translator.translate_batch(batch, **options)
    elapsed = time.perf_counter() - start
    tokens = sum(len(r.hypotheses[0]) for r in results)
    hyps = [detok(r.hypotheses[0]) for r in results[: len(sources)]]
    # One batch alone, for the time per decoding step.
    one = sources[: args.batch]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = translator.translate_batch(one, **options)
        times.append(time.perf_counter() - start)
    steps = max(len(r.hypotheses[0]) for r in out) + 1
    step_ms = 1000 * min(times) / steps
    width = 2 if args.compute_type == "float16" else 4
    step_bytes = decoder_step_bytes(width)
    return dict(tokens=tokens, seconds=elapsed, hyps=hyps, step_ms=step_ms, steps=steps, step_gb_s=step_bytes / (step_ms / 1000) / 1e9,
                step_mb=step_bytes / 1e6)


def worker_hf(args, sources):
    import torch
    from transformers import MarianMTModel

    hf_dir = args.hf_dir
    dtype = torch.float16 if args.compute_type == "float16" else torch.float32
    device = "cuda" if args.device == "cuda" else "cpu"
    model = MarianMTModel.from_pretrained(hf_dir, dtype=dtype).to(device).eval()
    vocab = json.load(open(os.path.join(args.models, "zh-en-ct2", "shared_vocabulary.json"), encoding="utf-8"))
    index = {t: i for i, t in enumerate(vocab)}
    unk, eos, pad = index["<unk>"], index["</s>"], model.config.pad_token_id

    def ids(tokens):
        return [index.get(t, unk) for t in tokens] + [eos]

    def run(batch_tokens):
        order = sorted(range(len(batch_tokens)), key=lambda i: len(batch_tokens[i]))
        outputs = [None] * len(batch_tokens)
        count = 0
        with torch.inference_mode():
            for b in range(0, len(order), args.batch):
                chunk = order[b : b + args.batch]
                seqs = [ids(batch_tokens[i]) for i in chunk]
                width = max(len(s) for s in seqs)
                input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=device)
                mask = (input_ids != pad).long()
                out = model.generate(input_ids=input_ids, attention_mask=mask, num_beams=args.beam, max_new_tokens=256,
                                     length_penalty=1.0, early_stopping=True, do_sample=False)
                for i, row in zip(chunk, out.tolist()):
                    toks = [t for t in row[1:] if t not in (pad, eos)]
                    outputs[i] = toks
                    count += len(toks)
        if device == "cuda":
            torch.cuda.synchronize()
        return outputs, count

    run(sources[: args.batch])  # warm-up
    batch = sources * args.repeat
    start = time.perf_counter()
    outputs, tokens = run(batch)
    elapsed = time.perf_counter() - start
    hyps = [detok([vocab[t] for t in o]) for o in outputs[: len(sources)]]
    return dict(tokens=tokens, seconds=elapsed, hyps=hyps)


def nvidia_smi(query):
    """One nvidia-smi --query-gpu answer ("" without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True)
    except OSError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def gpu_memory_used():
    used = nvidia_smi("memory.used")
    return int(used.split()[0]) if used else 0


def run_engine(args, engine, compute_type):
    before = gpu_memory_used()
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], gpu_memory_used())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cmd = [sys.executable, __file__, "--worker", engine, "--compute-type", compute_type, "--repeat", str(args.repeat), "--beam",
           str(args.beam), "--batch", str(args.batch), "--models", args.models, "--data", args.data, "--hf-dir", args.hf_dir,
           "--limit", str(args.limit), "--device", args.device]
    out = subprocess.run(cmd, capture_output=True, text=True)
    stop.set()
    sampler.join()
    if out.returncode != 0:
        print(f"{engine} {compute_type} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return None
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(engine=engine, compute_type=compute_type, gpu_mb=peak[0] - before, tokens_per_s=row["tokens"] / row["seconds"])
    row["bleu"] = bleu(row.pop("hyps"), args)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--compute-types", default="float16,float32")
    p.add_argument("--engines", default="tolk,hf")
    p.add_argument("--models", default=default_dir("TOLK_MODELS", "models"))
    p.add_argument("--data", default=default_dir("TOLK_DATA", "data"))
    p.add_argument("--hf-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "zh-en-hf-marian"))
    p.add_argument("--limit", type=int, default=500, help="the first N verses only")
    p.add_argument("--device", default="cuda", help="Tolk's device (cpu: to try the script without a GPU)")
    p.add_argument("--json")
    p.add_argument("--worker")
    p.add_argument("--compute-type")
    args = p.parse_args()
    if args.worker:
        sources = load_sources(args)
        result = (worker_tolk if args.worker == "tolk" else worker_hf)(args, sources)
        print(json.dumps(result))
        return
    engines = args.engines.split(",")
    if "hf" in engines and not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ct2_to_hf_marian.py"), os.path.join(args.models, "zh-en-ct2"), args.hf_dir],
                       check=True, stdout=subprocess.DEVNULL)
    gpu = nvidia_smi("name,driver_version") or "none found"
    print(f"GPU: {gpu}; zh-en, {args.limit} verses x {args.repeat}, beam {args.beam}, batch {args.batch}")
    rows = []
    for compute_type in args.compute_types.split(","):
        for engine in engines:
            row = run_engine(args, engine, compute_type)
            if row:
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| engine | compute | tokens/s | GPU MB | BLEU | step ms | step GB/s |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for r in rows:
        step = f"{r['step_ms']:.3f} | {r['step_gb_s']:.0f}" if "step_ms" in r else " | "
        print(f"| {r['engine']} | {r['compute_type']} | {r['tokens_per_s']:.0f} | {r['gpu_mb']} | {r['bleu']} | {step} |")
    for compute_type in args.compute_types.split(","):
        t = [r for r in rows if r["compute_type"] == compute_type and r["engine"] == "tolk"]
        h = [r for r in rows if r["compute_type"] == compute_type and r["engine"] == "hf"]
        if t and h:
            print(f"{compute_type}: Tolk / transformers = {t[0]['tokens_per_s'] / h[0]['tokens_per_s']:.2f}x")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
