#!/usr/bin/env python3
"""Convert a CTranslate2 OPUS-MT (Marian) model directory into a Hugging Face
`transformers` MarianMTModel directory, so the same weights can be run by transformers
(e.g. on a GPU in float16) as a speed peer for Tolk and CTranslate2.

    python3 bench/ct2_to_hf_marian.py CT2_DIR OUT_DIR
    python3 bench/ct2_to_hf_marian.py --check CT2_DIR OUT_DIR TEXT   # vs ctranslate2, CPU

CT2_DIR holds model.bin, config.json and shared_vocabulary.json (as made by
`ct2-opus-mt-converter` / `ct2-marian-converter`). `model.bin` is read here with numpy
(the layout of ctranslate2/specs/model_spec.py `_serialize`, binary versions 5 and 6), so
ctranslate2 need not be installed. OUT_DIR gets config.json, generation_config.json and
the weights (whatever `save_pretrained` writes: model.safetensors).

Mapping: int8/int16 weights are dequantized as `w / <name>_scale` (one scale per output
row), float16/bfloat16 ones are widened; everything is written in float32. Fused
projections are split (self-attention linear_0 = q|k|v, cross-attention linear_1 = k|v).
CT2's vocabulary has no <pad>; one is appended (id = len(vocab)) with a zero embedding row,
as in the Hugging Face OPUS-MT checkpoints, and used as pad and decoder start token (its
zero embedding reproduces CT2's `start_from_zero_embedding`); its logit gets a -inf bias
(`final_logits_bias`) so it is never generated.

Decoding like CTranslate2 (same length normalization, score = logprob sum / length) needs
`generate(..., num_beams=N, length_penalty=1.0, early_stopping=True)` (early_stopping cannot
go in generation_config.json while num_beams=1). With transformers' default
(early_stopping=False) beam search keeps looking and often returns longer hypotheses.

Limits: only what HF Marian can express: a post-norm TransformerSpec with shared
(source=target) vocabulary and tied embeddings/projection, sinusoidal positions in Marian's
sin|cos layout (checked against HF's formula, which transformers recomputes on load and
does not read from the file), the same activation in encoder and decoder, no alibi, no
relative positions, no alignment heads used. HF Marian's LayerNorm epsilon is fixed at
1e-5 whereas CTranslate2 uses 1e-6 for these models (config.json layer_norm_epsilon null):
outputs differ by rounding-level amounts. `max_position_embeddings` is the length of the
stored position table (inputs longer than that fail in transformers).
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # 5: bfloat16
ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "swish", 3: "gelu", 5: "tanh", 6: "sigmoid"}


def read_model_bin(path):
    """Returns (spec_name, {name: numpy array}) with aliases resolved."""
    data = open(path, "rb").read()
    pos = 0

    def unpack(fmt):
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = unpack("H")  # length includes the trailing NUL
        s = data[pos:pos + n - 1].decode("utf-8")
        pos += n
        return s

    version = unpack("I")
    if version not in (5, 6):
        raise SystemExit(f"{path}: unsupported CTranslate2 binary version {version}")
    spec = string()
    unpack("I")  # spec revision
    variables = {}
    for _ in range(unpack("I")):
        name = string()
        shape = [unpack("I") for _ in range(unpack("B"))]
        dtype_id = unpack("B")
        num_bytes = unpack("I")
        raw = data[pos:pos + num_bytes]
        pos += num_bytes
        if dtype_id == 5:  # bfloat16: the high half of a float32
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, DTYPES[dtype_id])
        variables[name] = arr.reshape(shape)
    for _ in range(unpack("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    return spec, variables


def convert(ct2_dir, out_dir):
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    spec, v = read_model_bin(os.path.join(ct2_dir, "model.bin"))
    ct2_config = json.load(open(os.path.join(ct2_dir, "config.json")))
    vocab = json.load(open(os.path.join(ct2_dir, "shared_vocabulary.json")))

    def scalar(name, default=None):
        return int(v[name]) if name in v else default

    def weight(name):
        w = v[name + "/weight"]
        if w.dtype in (np.int8, np.int16):
            return w.astype(np.float32) / v[name + "/weight_scale"].astype(np.float32)[:, None]
        return w.astype(np.float32)

    def f32(name):
        return v[name].astype(np.float32)

    # --- What HF Marian can represent.
    if spec != "TransformerSpec":
        raise SystemExit(f"expected a TransformerSpec, got {spec}")
    for side in ("encoder", "decoder"):
        if scalar(side + "/pre_norm", 0):
            raise SystemExit("pre-norm models cannot be expressed as HF Marian (post-norm only)")
        if not scalar(side + "/scale_embeddings", 1):
            raise SystemExit("unscaled embeddings are not supported by this converter")
    if scalar("decoder/alibi", 0) or any("relative_position" in k for k in v):
        raise SystemExit("alibi / relative positions are not supported by HF Marian")
    act = scalar("encoder/activation", 0)
    if act != scalar("decoder/activation", 0) or act not in ACTIVATIONS:
        raise SystemExit(f"unsupported activation ids {act}/{scalar('decoder/activation')}")
    emb = weight("decoder/embeddings")
    for name in ("encoder/embeddings_0/weight", "decoder/projection/weight"):
        if name in v and not np.array_equal(v[name], v["decoder/embeddings/weight"]):
            raise SystemExit(f"{name} is not shared with decoder/embeddings: unsupported")
    n_enc = len({k.split("/")[1] for k in v if k.startswith("encoder/layer_")})
    n_dec = len({k.split("/")[1] for k in v if k.startswith("decoder/layer_")})
    d_model = emb.shape[1]
    ffn = v["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    heads = scalar("encoder/num_heads")
    if heads is None or heads != scalar("decoder/num_heads"):
        raise SystemExit("encoder/decoder num_heads missing or different")
    positions = f32("decoder/position_encodings/encodings")
    if "encoder/position_encodings/encodings" in v and not np.array_equal(
            v["encoder/position_encodings/encodings"], v["decoder/position_encodings/encodings"]):
        raise SystemExit("encoder and decoder position tables differ: unsupported")

    # --- Token ids: append <pad> (as HF OPUS-MT checkpoints do).
    if len(vocab) != emb.shape[0]:
        raise SystemExit(f"vocabulary has {len(vocab)} entries but embeddings {emb.shape[0]} rows")
    eos_id, unk_id = vocab.index(ct2_config.get("eos_token", "</s>")), vocab.index(ct2_config.get("unk_token", "<unk>"))
    pad_id = vocab.index("<pad>") if "<pad>" in vocab else len(vocab)
    vocab_size = max(len(vocab), pad_id + 1)
    shared = np.zeros((vocab_size, d_model), np.float32)
    shared[:emb.shape[0]] = emb
    bias = np.zeros((1, vocab_size), np.float32)
    if "decoder/projection/bias" in v:
        bias[0, :emb.shape[0]] = f32("decoder/projection/bias")
    bias[0, pad_id] = -np.inf

    config = MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d_model,
        encoder_layers=n_enc, decoder_layers=n_dec,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, activation_function=ACTIVATIONS[act],
        max_position_embeddings=positions.shape[0], scale_embedding=True, normalize_embedding=False,
        static_position_embeddings=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=pad_id, eos_token_id=eos_id, decoder_start_token_id=pad_id,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    model = MarianMTModel(config).eval()

    # transformers recomputes the table on load (MarianSinusoidalPositionalEmbedding: sin of
    # the even-j angles in the first half, cos of the odd-j ones in the second): must match.
    n_pos, dim = positions.shape
    j = np.arange(dim)
    angles = np.arange(n_pos)[:, None] / np.power(10000, 2 * (j // 2) / dim)[None, :]
    hf_positions = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1)
    err = np.abs(hf_positions - positions).max()
    if err > 1e-4:
        raise SystemExit(f"CT2 position encodings differ from HF Marian's sinusoids (max diff {err})")

    sd = {"model.shared.weight": shared, "final_logits_bias": bias,
          "model.encoder.embed_positions.weight": positions, "model.decoder.embed_positions.weight": positions}

    def linear(dst, src, parts=None):
        w, b = weight(src), f32(src + "/bias")
        names = parts or [dst]
        for i, (wi, bi) in enumerate(zip(np.split(w, len(names)), np.split(b, len(names)))):
            sd[names[i] + ".weight"], sd[names[i] + ".bias"] = wi, bi

    def layer_norm(dst, src):
        sd[dst + ".weight"], sd[dst + ".bias"] = f32(src + "/gamma"), f32(src + "/beta")

    def attention(dst, src, fused):  # fused: linear index -> HF projection names
        for index, names in fused.items():
            linear(None, f"{src}/linear_{index}", [f"{dst}.{n}_proj" for n in names])

    for side, n in (("encoder", n_enc), ("decoder", n_dec)):
        for i in range(n):
            src, dst = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            attention(dst + ".self_attn", src + "/self_attention", {0: "qkv", 1: ["out"]})
            layer_norm(dst + ".self_attn_layer_norm", src + "/self_attention/layer_norm")
            if side == "decoder":
                attention(dst + ".encoder_attn", src + "/attention", {0: "q", 1: "kv", 2: ["out"]})
                layer_norm(dst + ".encoder_attn_layer_norm", src + "/attention/layer_norm")
            linear(dst + ".fc1", src + "/ffn/linear_0")
            linear(dst + ".fc2", src + "/ffn/linear_1")
            layer_norm(dst + ".final_layer_norm", src + "/ffn/layer_norm")

    state = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in sd.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in ("lm_head.weight", "model.encoder.embed_tokens.weight",
                                                "model.decoder.embed_tokens.weight")]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.shared.weight)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, max_length=512)
    model.save_pretrained(out_dir)
    print(f"{ct2_dir} ({spec}, {n_enc}+{n_dec} layers, d={d_model}, {heads} heads, ffn {ffn}, "
          f"{len(vocab)} tokens) -> {out_dir}")
    print(f"ids: pad={pad_id} (decoder start) eos={eos_id} unk={unk_id}; vocab_size={vocab_size}; "
          f"position table max diff vs HF sinusoids {err:.2e}")
    print(json.dumps(config.to_diff_dict(), indent=1, sort_keys=True))
    return model


def check(ct2_dir, hf_dir, text_file, limit=20, beams=(1, 4), ln_eps=None):
    """Translates the first `limit` lines of `text_file` on CPU in float32 with the
    converted model and with ctranslate2 (needs it installed), and counts identical outputs."""
    import ctranslate2
    import sentencepiece
    import torch
    from transformers import MarianMTModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(ct2_dir, "sentencepiece.model"))
    vocab = json.load(open(os.path.join(ct2_dir, "shared_vocabulary.json")))
    ids = {t: i for i, t in enumerate(vocab)}
    lines = [l.strip() for l in open(text_file, encoding="utf-8")][:limit]
    pieces = [sp.encode(l, out_type=str) + ["</s>"] for l in lines]
    model = MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32).eval()
    if ln_eps is not None:  # CTranslate2 uses 1e-6, HF Marian 1e-5
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = ln_eps
    ct2 = ctranslate2.Translator(ct2_dir, device="cpu", compute_type="float32")
    for beam in beams:
        want = [r.hypotheses[0] for r in ct2.translate_batch(
            [p[:-1] for p in pieces], beam_size=beam, max_decoding_length=256)]  # CT2 appends </s>
        same = 0
        for i, p in enumerate(pieces):
            x = torch.tensor([[ids.get(t, ids["<unk>"]) for t in p]])
            with torch.no_grad():
                y = model.generate(x, num_beams=beam, max_new_tokens=256, length_penalty=1.0,
                                   early_stopping=True, do_sample=False)
            got = [vocab[t] for t in y[0].tolist()[1:] if t != model.config.eos_token_id]
            same += got == want[i]
            if got != want[i]:
                print(f"  beam {beam} line {i}:\n    ct2 {' '.join(want[i])}\n    hf  {' '.join(got)}")
        print(f"beam {beam}: {same}/{len(pieces)} identical to CTranslate2")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--check":  # --check CT2_DIR HF_DIR TEXT
        check(*sys.argv[2:5], limit=int(os.environ.get("CHECK_LINES", "20")),
              ln_eps=float(os.environ["LN_EPS"]) if "LN_EPS" in os.environ else None)
    elif len(sys.argv) == 3:
        convert(sys.argv[1], sys.argv[2])
    else:
        raise SystemExit(__doc__)
