#!/usr/bin/env python3
"""Tiny random-weight Marian transformer models with expected greedy outputs (numpy only).

    python3 tests/python/make_marian_models.py OUTDIR [--seed N] [--dim 32] [--ffn 64]
        [--only NAME[,NAME...]] [--list]

Every model directory holds what a Marian/Bergamot package holds:

  model.bin | model.npz   Marian weights + the "special:model.yml" item (the architecture)
  vocab.yml               Marian YAML vocabulary (token: id, "</s>" = 0, "<unk>" = 1);
                          untied models have vocab.src.yml + vocab.trg.yml
  lex.s2t.bin             (some) binary lexical shortlist with a valid checksum
  config.yml              package YAML: models, vocabs, beam-size 1, normalize 1.0,
                          max-length-factor, gemm-precision, optional shortlist
  reference.json          source token ids and the greedy output ids of
                          tests/python/marian_reference.py for each case, with the top-1 /
                          top-2 logit margin of every step (compare token for token where
                          the margin is not tiny) and every step's logits over the target
                          vocabulary (null = outside the shortlist; <unk> before its
                          suppression), for a teacher-forced numeric check
  input.txt               the cases' source text, one per line

Layout rules followed (marian-dev src/tensors/cpu/expression_graph_packable.h, binary.cpp):
.bin items sorted by name, every blob padded to 256 bytes, special:model.yml last (int8,
not padded). intgemm8 (type 0x4101): names ending in "_W?" / "_W??" or containing "Wemb"
are quantized with quantMult = 127/max|W| (round half to even, clamp [-127, 127]) and the
float32 quantMult appended; all but the Wemb ones are stored transposed ([out][in]). The
activation scales "<W>_QuantMultA" (float32 1x1; the Wemb ones quantized like Wemb, as
marian-conv does) come from a calibration run of the float model over the cases
(127 / (0.9 * max|A|), so some activations clip), plus "none_QuantMultA" for the output
layer (the same value as the output matrix's own alpha).
"""
from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import marian_reference as mr  # noqa: E402

F32 = np.float32

# name, decoder autoreg, storage, tying, shortlist, extra yml
MODELS = [
    ("ssru_f32_bin", "rnn", "f32-bin", "all", False, {}),
    ("ssru_f32_npz_shortlist", "rnn", "f32-npz", "all", True, {}),
    ("self_f32_bin_untied", "self-attention", "f32-bin", "none", False, {"transformer-ffn-activation": "swish"}),
    ("self_f32_npz_tied_dec", "self-attention", "f32-npz", "dec", True, {}),
    ("aan_f32_npz", "average-attention", "f32-npz", "dec", False,
     {"transformer-aan-depth": 2, "transformer-aan-activation": "swish", "transformer-aan-nogate": False}),
    ("aan_nogate_f32_bin", "average-attention", "f32-bin", "all", True,
     {"transformer-aan-depth": 2, "transformer-aan-activation": "relu", "transformer-aan-nogate": True}),
    ("ssru_int8_bin_shortlist", "rnn", "int8-bin", "all", True, {}),
    ("ssru_int8_bin", "rnn", "int8-bin", "all", False, {}),
    ("self_int8_bin_tied_dec", "self-attention", "int8-bin", "dec", True, {}),
    ("aan_int8_bin_shortlist", "average-attention", "int8-bin", "all", True,
     {"transformer-aan-depth": 2, "transformer-aan-activation": "swish", "transformer-aan-nogate": False}),
    ("prenorm_gelu_f32_npz", "self-attention", "f32-npz", "all", False,
     {"transformer-preprocess": "n", "transformer-postprocess": "da", "transformer-postprocess-top": "n",
      "transformer-ffn-activation": "gelu"}),
]


def model_yml(V_src, V_trg, d, ffn, heads, enc, dec, autoreg, tying, extra):
    c = {
        "type": "transformer",
        "dim-emb": d,
        "dim-vocabs": [V_src, V_trg],
        "enc-depth": enc,
        "dec-depth": dec,
        "transformer-heads": heads,
        "transformer-dim-ffn": ffn,
        "transformer-ffn-depth": 2,
        "transformer-ffn-activation": "relu",
        "transformer-decoder-autoreg": autoreg,
        "dec-cell": "ssru",
        "dec-cell-base-depth": 2,
        "dec-cell-high-depth": 1,
        "transformer-aan-activation": "swish",
        "transformer-aan-depth": 2,
        "transformer-aan-nogate": False,
        "transformer-dim-aan": 2 * d,
        "transformer-postprocess": "dan",
        "transformer-postprocess-emb": "d",
        "transformer-postprocess-top": "",
        "transformer-preprocess": "",
        "transformer-train-position-embeddings": False,
        "transformer-no-projection": False,
        "transformer-tied-layers": [],
        "transformer-pool": False,
        "layer-normalization": False,
        "output-omit-bias": False,
        "right-left": False,
        "skip": False,
        "tied-embeddings": tying == "dec",
        "tied-embeddings-all": tying == "all",
        "tied-embeddings-src": False,
        "lemma-dim-emb": 0,
        "ulr": False,
        "version": "tolk make_marian_models.py (random weights)",
    }
    c.update(extra)
    return c


def yaml_dump(c):
    out = []
    for k, v in c.items():
        if isinstance(v, bool):
            out.append(f"{k}: {'true' if v else 'false'}")
        elif isinstance(v, list):
            if not v:
                out.append(f"{k}: []")
            else:
                out.append(f"{k}:")
                out.extend(f"  - {x}" for x in v)
        elif isinstance(v, str):
            out.append(f'{k}: "{v}"' if (v == "" or ":" in v or v.strip() != v) else f"{k}: {v}")
        else:
            out.append(f"{k}: {v}")
    return "\n".join(out) + "\n"


def vocab_yaml(v):
    return "".join(f'"{t}": {i}\n' for t, i in sorted(v.items(), key=lambda kv: kv[1]))


def make_params(rng, c):
    """Random float32 parameters with Marian's names and shapes."""
    d, ffn, V_src, V_trg = c["dim-emb"], c["transformer-dim-ffn"], c["dim-vocabs"][0], c["dim-vocabs"][1]
    P = {}

    def W(name, i, o, gain=1.0):
        P[name] = (rng.standard_normal((i, o)) * gain / math.sqrt(i)).astype(F32)

    def b(name, o, s=0.1):
        P[name] = (rng.standard_normal((1, o)) * s).astype(F32)

    def ln(prefix, suffix=""):
        P[f"{prefix}_ln_scale{suffix}"] = (1.0 + 0.1 * rng.standard_normal((1, d))).astype(F32)
        P[f"{prefix}_ln_bias{suffix}"] = (0.1 * rng.standard_normal((1, d))).astype(F32)

    def emb(name, V):
        P[name] = (rng.standard_normal((V, d)) / math.sqrt(d)).astype(F32)

    pre = c["transformer-preprocess"]
    post = c["transformer-postprocess"]

    def pp(prefix):  # layer norms a pre/post-process string asks for
        if "n" in pre:
            ln(prefix, "_pre")
        if "n" in post:
            ln(prefix)

    def attn(prefix):
        for m in ("q", "k", "v", "o"):
            W(f"{prefix}_W{m}", d, d)
            b(f"{prefix}_b{m}", d)

    def ffn_layer(prefix):
        W(f"{prefix}_W1", d, ffn)
        b(f"{prefix}_b1", ffn)
        W(f"{prefix}_W2", ffn, d)
        b(f"{prefix}_b2", d)

    tall, tdec = c["tied-embeddings-all"], c["tied-embeddings"]
    if tall:
        emb("Wemb", V_trg)
    else:
        emb("encoder_Wemb", V_src)
        emb("decoder_Wemb", V_trg)
        if not tdec:
            P["decoder_ff_logit_out_Wt"] = (rng.standard_normal((V_trg, d)) / math.sqrt(d)).astype(F32)
    b("decoder_ff_logit_out_b", V_trg, 0.5)
    for l in range(1, c["enc-depth"] + 1):
        attn(f"encoder_l{l}_self")
        pp(f"encoder_l{l}_self_Wo")
        ffn_layer(f"encoder_l{l}_ffn")
        pp(f"encoder_l{l}_ffn_ffn")
    if "n" in c["transformer-postprocess-top"]:
        ln("encoder_top")
        ln("decoder_top")
    ar = c["transformer-decoder-autoreg"]
    for l in range(1, c["dec-depth"] + 1):
        if ar == "self-attention":
            attn(f"decoder_l{l}_self")
            pp(f"decoder_l{l}_self_Wo")
        elif ar == "rnn":
            p = f"decoder_l{l}_rnn"
            W(p + "_W", d, d)
            W(p + "_Wf", d, d)
            b(p + "_bf", d, 0.5)
            if "n" in pre:
                ln(p, "_pre")
            if "n" in post:
                ln(p + "_ffn")
        else:
            p = f"decoder_l{l}_aan"
            depth, daan = c["transformer-aan-depth"], c["transformer-dim-aan"]
            width = d
            for j in range(1, depth):
                W(f"{p}_W{j}", width, daan)
                b(f"{p}_b{j}", daan)
                width = daan
            if width != d:
                W(f"{p}_W{depth}", width, d)
                b(f"{p}_b{depth}", d)
            if not c["transformer-aan-nogate"]:
                W(p + "_Wi", d, d)
                b(p + "_bi", d)
                W(p + "_Wf", d, d)
                b(p + "_bf", d)
            pp(p + "_ffn")
        attn(f"decoder_l{l}_context")
        pp(f"decoder_l{l}_context_Wo")
        ffn_layer(f"decoder_l{l}_ffn")
        pp(f"decoder_l{l}_ffn_ffn")
    return P


def quantized_name(name):
    """expression_graph_packable.h: which parameters marian-conv turns into intgemm8."""
    i = name.find("_W")
    return (i >= 0 and (i == len(name) - 3 or i == len(name) - 2)) or "Wemb" in name


def quantize(w):
    qm = F32(127.0) / F32(np.abs(w).max())
    q = np.clip(np.rint((w * qm).astype(F32)), -127, 127).astype(np.int8)
    return q, qm


def pad256(b):
    return b + b"\0" * ((-len(b)) % 256)


def write_bin(path, items, yml_text):
    """items: name -> (type, shape, raw bytes). Writes marian's binary format, version 1."""
    names = sorted(items)
    entries = [(n, *items[n], True) for n in names]
    meta = yml_text.encode("utf-8") + b"\0"
    entries.append(("special:model.yml", mr.TYPE_INT8, (len(meta),), meta, False))
    headers, nm, sh, data = b"", b"", b"", []
    for name, t, shape, raw, pad in entries:
        blob = pad256(raw) if pad else raw
        data.append(blob)
        headers += struct.pack("<QQQQ", len(name.encode()) + 1, t, len(shape), len(blob))
        nm += name.encode() + b"\0"
        sh += struct.pack(f"<{len(shape)}i", *shape)
    out = struct.pack("<QQ", 1, len(entries)) + headers + nm + sh
    pos = len(out)
    nextpos = ((pos + 8) // 256 + 1) * 256
    offset = nextpos - pos - 8
    out += struct.pack("<Q", offset) + b"\0" * offset
    out += b"".join(data)
    Path(path).write_bytes(out)


def write_npz(path, params, yml_text):
    arrays = {k: v for k, v in params.items()}
    arrays["special:model.yml"] = np.frombuffer(yml_text.encode("utf-8") + b"\0", dtype=np.int8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def calibrate(model_path, cases, extra_alpha_names):
    """max |A| per intgemm8 matrix over the cases, from the float (dequantized) model."""
    ref = mr.MarianReference(model_path, exact_int8=False)
    maxes = {}
    orig = ref.affine

    def hook(x, wname, bname=None):
        maxes[wname] = max(maxes.get(wname, 0.0), float(np.abs(x).max()))
        return orig(x, wname, bname)

    ref.affine = hook
    orig_logits = ref.logits

    def hook_logits(h, cols=None):
        for n in extra_alpha_names:
            maxes[n] = max(maxes.get(n, 0.0), float(np.abs(h).max()))
        return orig_logits(h, cols)

    ref.logits = hook_logits
    for src in cases:
        ref.translate_ids(src, max_length_factor=2.5)
    return maxes


def run_reference(model_path, cases, shortlist, shared, mlf, exact):
    ref = mr.MarianReference(model_path, exact_int8=exact)
    out = []
    for src in cases:
        s = list(src) + [0]
        enc = ref.encode(s)
        st = ref.init_decoder(enc)
        cols = shortlist.generate(s, ref.trg_vocab_size, shared) if shortlist else None
        max_len = math.ceil(F32(mlf) * F32(len(s)))
        ids, margins, prev, step_logits, stop = [], [], None, [], "max_length"
        for t in range(max_len):
            h = ref.decoder_step(st, prev)
            lg = ref.logits(h, cols)[0].astype(np.float64)
            full = np.full(ref.trg_vocab_size, -np.inf)
            if cols is None:
                full[:] = lg
            else:
                full[cols] = lg
            step_logits.append([None if not np.isfinite(v) else round(float(v), 5) for v in full])
            full[1] = -np.inf  # <unk> suppressed
            order = np.argsort(-full, kind="stable")
            y = int(order[0])
            margins.append(round(float(full[order[0]] - full[order[1]]), 6) if np.isfinite(full[order[1]]) else None)
            if y == 0:
                stop = "eos"
                break
            ids.append(y)
            prev = y
        out.append({"output_ids": ids, "stop": stop, "margins": margins, "step_logits": step_logits,
                    "shortlist_ids": None if cols is None else [int(x) for x in cols]})
    return out


def build(outdir, spec, rng, d, ffn, heads, n_cases, spm_vocab=None):
    name, autoreg, storage, tying, with_sl, extra = spec
    md = Path(outdir) / name
    md.mkdir(parents=True, exist_ok=True)
    sp = None
    if spm_vocab:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(spm_vocab))
        if sp.eos_id() != 0 or sp.unk_id() != 1:
            raise SystemExit("the SentencePiece vocabulary must have </s> = 0 and <unk> = 1")
    V_src = 40 if tying != "none" else 36
    V_trg = 40
    if sp:
        V_src = V_trg = sp.get_piece_size()
    c = model_yml(V_src, V_trg, d, ffn, heads, 2, 2, autoreg, tying, extra)
    yml = yaml_dump(c)
    params = make_params(rng, c)

    # vocabularies
    def vocab(V, prefix):
        return {"</s>": 0, "<unk>": 1, **{f"{prefix}{i:02d}": i for i in range(2, V)}}

    if sp:
        (md / "vocab.spm").write_bytes(Path(spm_vocab).read_bytes())
        vs = vt = {sp.id_to_piece(i): i for i in range(V_trg)}
        vocab_files = ["vocab.spm", "vocab.spm"]
    elif tying == "none":
        vs, vt = vocab(V_src, "s"), vocab(V_trg, "t")
        (md / "vocab.src.yml").write_text(vocab_yaml(vs))
        (md / "vocab.trg.yml").write_text(vocab_yaml(vt))
        vocab_files = ["vocab.src.yml", "vocab.trg.yml"]
    else:
        vs = vt = vocab(V_trg, "w")
        (md / "vocab.yml").write_text(vocab_yaml(vs))
        vocab_files = ["vocab.yml", "vocab.yml"]
    id2src = {i: t for t, i in vs.items()}
    id2trg = {i: t for t, i in vt.items()}

    # cases: random source sentences (ids 2..V_src-1, one with <unk>, one with a repeat)
    cases = []
    for i in range(n_cases):
        L = int(rng.integers(1, 11))
        cases.append([int(x) for x in rng.integers(2, V_src, size=L)])
    cases[0] = [int(rng.integers(2, V_src))]               # one-token source
    cases[1] = cases[1][:3] + [1] + cases[1][3:]            # contains <unk>
    cases[2] = cases[2][:2] * 3                             # repeated ids

    # shortlist
    sl_file, sl = None, None
    if with_sl:
        first, best = 8, 6
        lists = [sorted(set(int(x) for x in rng.choice(np.arange(2, V_trg), size=best, replace=False)))
                 for _ in range(V_src)]
        sl_file = "lex.s2t.bin"
        mr.write_shortlist(md / sl_file, first, best, lists)
        sl = mr.Shortlist(md / sl_file)

    # weights. The </s> output bias is raised until some cases stop at </s> and some at the
    # length limit (tested on the float model).
    int8 = storage == "int8-bin"
    model_file = "model.npz" if storage == "f32-npz" else "model.bin"
    base = float(params["decoder_ff_logit_out_b"][0, 0])
    for boost in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0):
        params["decoder_ff_logit_out_b"][0, 0] = F32(base + boost)
        if storage == "f32-npz":
            write_npz(md / model_file, params, yml)
        else:
            items = {n: (mr.TYPE_FLOAT32, v.shape, v.astype("<f4").tobytes()) for n, v in params.items()}
            write_bin(md / model_file, items, yml)
        n_eos = sum(r["stop"] == "eos" for r in run_reference(md / model_file, cases, sl, True, 2.5, exact=False))
        if n_eos >= len(cases) // 3:
            break
    if int8:
        # calibrate alphas on the float model, then write the intgemm8 model over it
        out_w = "Wemb" if tying == "all" else "decoder_Wemb"
        maxes = calibrate(md / model_file, cases, ["__output__"])
        items = {}
        for n, v in params.items():
            if quantized_name(n):
                q, qm = quantize(v)
                raw = (q if "Wemb" in n else q.T).astype(np.int8).tobytes() + struct.pack("<f", qm)
                items[n] = (mr.TYPE_INTGEMM8, v.shape, raw)
            else:
                items[n] = (mr.TYPE_FLOAT32, v.shape, v.astype("<f4").tobytes())
        for wname, m in maxes.items():
            alpha = F32(127.0) / F32(0.9 * m)
            if wname == "__output__":
                # marian-conv quantizes "<Wemb>_QuantMultA" like Wemb; the loader dequantizes it
                # to 127 * (1/qm). none_QuantMultA carries the same float.
                qa, qma = quantize(np.array([[alpha]], F32))
                deq = F32(qa[0, 0]) * (F32(1) / qma)
                items[out_w + "_QuantMultA"] = (mr.TYPE_INTGEMM8, (1, 1), qa.tobytes() + struct.pack("<f", qma))
                items["none_QuantMultA"] = (mr.TYPE_FLOAT32, (1, 1), np.array([[deq]], "<f4").tobytes())
            else:
                items[wname + "_QuantMultA"] = (mr.TYPE_FLOAT32, (1, 1), np.array([[alpha]], "<f4").tobytes())
        write_bin(md / model_file, items, yml)

    # package config
    cfg = {"relative-paths": True, "models": [model_file], "vocabs": vocab_files, "beam-size": 1,
           "normalize": 1.0, "word-penalty": 0, "max-length-factor": 2.5,
           "gemm-precision": "int8shiftAlphaAll" if int8 else "float32"}
    text = yaml_dump(cfg)
    if sl_file:
        text += f"shortlist:\n  - {sl_file}\n  - false\n"
    (md / "config.yml").write_text(text)

    mlf = 2.5
    main = run_reference(md / model_file, cases, sl, True, mlf, exact=int8)
    ref = {
        "model": model_file, "config": "config.yml", "vocabs": vocab_files, "shortlist": sl_file,
        "shortlist_shared": True if sl_file else None,
        "architecture": {k: c[k] for k in ("dim-emb", "dim-vocabs", "enc-depth", "dec-depth", "transformer-heads",
                                           "transformer-dim-ffn", "transformer-ffn-activation",
                                           "transformer-decoder-autoreg", "tied-embeddings",
                                           "tied-embeddings-all", "transformer-preprocess",
                                           "transformer-postprocess", "transformer-postprocess-top")},
        "storage": storage,
        "eos_id": 0, "unk_id": 1, "max_length_factor": mlf,
        "semantics": ("greedy, source = ids + </s>, at most ceil(max-length-factor * (len+1)) output tokens, "
                      "<unk> suppressed, output_ids exclude the final </s>"
                      + ("; intgemm8: int8shiftAlphaAll emulated exactly (marian_reference.py --exact-int8, "
                         "pmaddubsw pair saturation), output_ids_dequant = weights dequantized, float32 math"
                         if int8 else "")),
        "cases": [],
    }
    deq = run_reference(md / model_file, cases, sl, True, mlf, exact=False) if int8 else None
    for i, src in enumerate(cases):
        r = {"source_ids": src,
             "source_text": sp.decode(src) if sp else " ".join(id2src[x] for x in src)}
        r.update(main[i])
        r["output_text"] = sp.decode(r["output_ids"]) if sp else " ".join(id2trg[x] for x in r["output_ids"])
        if deq:
            r["output_ids_dequant"] = deq[i]["output_ids"]
            r["margins_dequant"] = deq[i]["margins"]
        ref["cases"].append(r)
    (md / "reference.json").write_text(json.dumps(ref, indent=1))
    (md / "input.txt").write_text("".join(r["source_text"] + "\n" for r in ref["cases"]))
    size = sum(f.stat().st_size for f in md.iterdir())
    stops = [r["stop"] for r in ref["cases"]]
    mins = [min([m for m in r["margins"] if m is not None] or [float("inf")]) for r in ref["cases"]]
    agree = None
    if deq:
        agree = sum(r["output_ids"] == r["output_ids_dequant"] for r in ref["cases"])
    return name, size, stops.count("eos"), len(stops), min(mins), agree


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--spm-vocab", default=None,
                    help="use this SentencePiece model (</s>=0, <unk>=1) as the vocabulary of every model "
                         "instead of vocab.yml (needed to run the models in bergamot-translator, which reads only .spm)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for m in MODELS:
            print(m[0])
        return
    if not args.outdir:
        ap.error("OUTDIR is required")
    only = set(args.only.split(",")) if args.only else None
    for k, spec in enumerate(MODELS):
        if only and spec[0] not in only:
            continue
        rng = np.random.default_rng([args.seed, k])
        name, size, n_eos, n, min_margin, agree = build(args.outdir, spec, rng, args.dim, args.ffn, args.heads, args.cases,
                                                       args.spm_vocab)
        extra = f", exact-int8 == dequant on {agree}/{n}" if agree is not None else ""
        print(f"{name:26s} {size / 1024:6.1f} KiB  stopped at </s>: {n_eos}/{n}  "
              f"smallest top-2 margin {min_margin:.4g}{extra}")


if __name__ == "__main__":
    main()
