#!/usr/bin/env python3
"""Build small random-weight CTranslate2 Transformer models for parity tests.

Each model is a tiny ``TransformerSpec`` filled with seeded numpy values and
saved with ``ctranslate2``'s own serializer, so the files are exactly what the
CTranslate2 converters write.  The set covers the variations Tolk must handle:

  * pre-norm and post-norm layers
  * ReLU, GELU (erf), GELU-tanh and Swish activations
  * shared and separate source/target vocabularies (of different sizes)
  * learned position tables (``position_encodings/encodings``) and generated
    sinusoidal ones (nothing stored)
  * ``scale_embeddings`` on/off
  * tied (aliased) and separate embeddings / output projection
  * ``layer_norm_epsilon`` in config.json, ``add_source_bos``/``add_source_eos``
  * storage types float32, float16, bfloat16, int16, int8, int8_float16
  * vocabularies saved as ``.json`` and as ``.txt``
  * decoder_start_token ``<s>``, ``</s>`` and ``null`` (start token given in the
    target prefix)

Usage as a script::

    python3 tests/python/make_random_models.py OUT_DIR [--check]

``--check`` loads every model in ctranslate2 and prints a few translations.
As a module: ``build_all(out_dir) -> dict[name, ModelInfo]``.

Random transformers tend to emit one token forever and never </s>.  The
per-model knobs below (tuned once with a small grid search against ctranslate2,
then frozen) avoid that: small gains on the self-attention/FFN outputs and a
larger one on cross-attention (outputs depend on the source), sharper
attention (qk_gain), and a "successor" structure in the output layer - for
untied projections each row leans towards the embedding of a predecessor token
(chain_mix), for tied ones the last decoder FFN is made nearly linear and
rotates the state (rotate_gain) - with a set of tokens that lead to </s>
(eos_set_frac) and an </s> bias.  Result: varied outputs of typically 3-30
tokens, most ending with </s> (checked by test_outputs_are_non_trivial).

bfloat16 storage is written without torch (ctranslate2 needs torch for it) by
a small Variable subclass that rounds float32 to nearest-even bfloat16.
"""

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from ctranslate2.specs import common_spec, model_spec, transformer_spec

SPECIALS = ["<unk>", "<s>", "</s>"]
# A few non-ASCII tokens so that UTF-8 handling is exercised.
EXOTIC = ["▁é", "中文", "▁ß", "ø", "🙂", "▁x\u0301"]


@dataclass
class ModelConfig:
    name: str
    seed: int
    d_model: int
    num_heads: int
    ffn: int
    layers: tuple  # (encoder, decoder)
    pre_norm: bool
    activation: common_spec.Activation
    src_vocab: int
    tgt_vocab: Optional[int] = None  # None = shared vocabulary
    learned_positions: int = 0  # 0 = sinusoidal (nothing stored)
    scale_embeddings: bool = True
    share_src_tgt_embeddings: bool = False  # only with a shared vocabulary
    tie_projection: bool = False
    layer_norm_epsilon: Optional[float] = None
    add_source_bos: bool = False
    add_source_eos: bool = False
    decoder_start_token: Optional[str] = "<s>"
    quantization: Optional[str] = None  # None = float32
    txt_vocab: bool = False
    # Position of the special tokens in the target vocabulary (tests that the
    # library looks tokens up by name instead of assuming ids 0/1/2).
    tgt_special_offset: int = 0
    unit_layer_norms: bool = False  # gamma=1, beta=0 -> many aliases
    eos_bias: float = -1.0
    logit_scale: float = 3.0
    # Gains of the sublayer output projections: > 1 makes each layer change the
    # residual stream a lot, so the decoder does not just copy its input token
    # (tied random embeddings otherwise predict the previous token forever).
    self_gain: float = 0.5
    cross_gain: float = 1.0
    ffn_gain: float = 0.5
    qk_gain: float = 1.0
    bias_std: float = 0.1
    emb_gain: float = 1.0
    # Untied projection: row j leans towards the embedding of the token that
    # precedes j in a random permutation, so the output is a pseudo-random walk
    # instead of a fixed point.  A subset of tokens leads to </s>.
    chain_mix: float = 0.0
    eos_set_frac: float = 0.0
    # Tied projection: the last decoder FFN is made (nearly) linear and maps its
    # input x to rotate_gain * R x (R a random rotation), so that the logits
    # E.h do not favour the previous token (which would then repeat forever).
    rotate_gain: float = 0.0
    notes: str = ""


@dataclass
class ModelInfo:
    name: str
    path: str
    config: ModelConfig
    source_vocab: List[str]
    target_vocab: List[str]
    requires_prefix: bool  # decoder_start_token is null
    start_token: Optional[str]
    notes: str = ""
    learned_positions: int = 0


MODEL_CONFIGS: List[ModelConfig] = [
    ModelConfig(
        name="prenorm_relu_shared_f32",
        seed=1,
        d_model=64,
        num_heads=4,
        ffn=128,
        layers=(2, 2),
        pre_norm=True,
        activation=common_spec.Activation.RELU,
        src_vocab=120,
        share_src_tgt_embeddings=True,
        tie_projection=True,
        rotate_gain=4.0,
        eos_set_frac=0.03,
        qk_gain=3.0,
        self_gain=0.3,
        cross_gain=2.0,
        ffn_gain=0.3,
        eos_bias=2.0,
        emb_gain=1.5,
        notes="pre-norm, relu, shared vocab, all 3 embeddings tied, sinusoid, float32",
    ),
    ModelConfig(
        name="postnorm_gelu_sep_learned_f16",
        seed=2,
        d_model=48,
        num_heads=4,
        ffn=96,
        layers=(2, 2),
        pre_norm=False,
        activation=common_spec.Activation.GELU,
        src_vocab=90,
        tgt_vocab=150,
        learned_positions=320,
        layer_norm_epsilon=1e-6,
        add_source_eos=True,
        tgt_special_offset=7,
        quantization="float16",
        chain_mix=0.85,
        eos_set_frac=0.15,
        qk_gain=3.0,
        self_gain=0.3,
        cross_gain=2.0,
        ffn_gain=0.3,
        eos_bias=-1.0,
        notes="post-norm, gelu(erf), separate vocabs 90/150, learned positions, eps 1e-6, "
        "add_source_eos, specials at offset 7 in target vocab, float16 storage",
    ),
    ModelConfig(
        name="prenorm_gelutanh_int8_marian",
        seed=3,
        d_model=64,
        num_heads=8,
        ffn=192,
        layers=(2, 1),
        pre_norm=True,
        activation=common_spec.Activation.GELUTanh,
        src_vocab=160,
        tie_projection=True,
        add_source_bos=True,
        add_source_eos=True,
        decoder_start_token="</s>",
        quantization="int8",
        rotate_gain=1.5,
        eos_set_frac=0.05,
        qk_gain=2.0,
        self_gain=0.3,
        cross_gain=1.0,
        ffn_gain=1.0,
        eos_bias=0.0,
        notes="pre-norm, gelu-tanh, shared vocab but separate enc/dec embeddings, tied "
        "projection, add_source_bos+eos, decoder_start </s>, int8 storage, 2+1 layers",
    ),
    ModelConfig(
        name="postnorm_swish_int16_noscale",
        seed=4,
        d_model=32,
        num_heads=2,
        ffn=64,
        layers=(1, 3),
        pre_norm=False,
        activation=common_spec.Activation.SWISH,
        src_vocab=70,
        tgt_vocab=110,
        scale_embeddings=False,
        quantization="int16",
        chain_mix=0.85,
        eos_set_frac=0.1,
        qk_gain=2.0,
        self_gain=0.3,
        cross_gain=1.0,
        ffn_gain=0.3,
        eos_bias=3.0,
        notes="post-norm, swish, separate vocabs 70/110, scale_embeddings false, untied "
        "projection, int16 storage, 1+3 layers",
    ),
    ModelConfig(
        name="prenorm_relu_bf16_learned_txt",
        seed=5,
        d_model=48,
        num_heads=6,
        ffn=96,
        layers=(2, 2),
        pre_norm=True,
        activation=common_spec.Activation.RELU,
        src_vocab=100,
        learned_positions=300,
        layer_norm_epsilon=1e-3,
        txt_vocab=True,
        quantization="bfloat16",
        unit_layer_norms=True,
        chain_mix=0.7,
        eos_set_frac=0.1,
        qk_gain=3.0,
        self_gain=1.0,
        cross_gain=2.0,
        ffn_gain=1.0,
        eos_bias=-1.0,
        notes="pre-norm, relu, shared vocab as shared_vocabulary.txt, learned positions, "
        "eps 1e-3, unit layer norms (many aliases), bfloat16 storage",
    ),
    ModelConfig(
        name="postnorm_relu_int8_zhen_like_txt",
        seed=6,
        d_model=64,
        num_heads=4,
        ffn=128,
        layers=(2, 2),
        pre_norm=False,
        activation=common_spec.Activation.RELU,
        src_vocab=80,
        tgt_vocab=130,
        txt_vocab=True,
        tie_projection=True,
        add_source_eos=True,
        quantization="int8",
        rotate_gain=3.0,
        eos_set_frac=0.05,
        qk_gain=2.0,
        self_gain=0.3,
        cross_gain=1.0,
        ffn_gain=0.3,
        eos_bias=2.0,
        emb_gain=2.0,
        notes="post-norm, relu, separate vocabs as source/target_vocabulary.txt, tied "
        "projection, add_source_eos, int8 storage (zh-en-like)",
    ),
    ModelConfig(
        name="prenorm_gelu_nostart_int8f16",
        seed=7,
        d_model=32,
        num_heads=4,
        ffn=128,
        layers=(1, 2),
        pre_norm=True,
        activation=common_spec.Activation.GELU,
        src_vocab=60,
        add_source_bos=True,
        decoder_start_token=None,
        quantization="int8_float16",
        chain_mix=0.7,
        eos_set_frac=0.15,
        qk_gain=2.0,
        self_gain=0.3,
        cross_gain=2.0,
        ffn_gain=0.3,
        eos_bias=1.0,
        notes="pre-norm, gelu, shared vocab, untied, decoder_start_token null (start "
        "token given in the target prefix), add_source_bos only, int8_float16 storage",
    ),
    ModelConfig(
        name="postnorm_gelutanh_learned_noscale_f32",
        seed=8,
        d_model=40,
        num_heads=5,
        ffn=80,
        layers=(3, 2),
        pre_norm=False,
        activation=common_spec.Activation.GELUTanh,
        src_vocab=200,
        tgt_vocab=55,
        learned_positions=310,
        scale_embeddings=False,
        tie_projection=True,
        tgt_special_offset=3,
        layer_norm_epsilon=1e-5,
        rotate_gain=3.0,
        eos_set_frac=0.05,
        qk_gain=1.0,
        self_gain=0.3,
        cross_gain=1.0,
        ffn_gain=0.3,
        eos_bias=2.0,
        notes="post-norm, gelu-tanh, separate vocabs 200/55, learned positions, no "
        "embedding scale, tied projection, specials at offset 3, float32, 3+2 layers",
    ),
]


def make_vocab(size: int, prefix: str, special_offset: int = 0) -> List[str]:
    assert size > len(SPECIALS) + len(EXOTIC) + special_offset
    n_plain = size - len(SPECIALS) - len(EXOTIC)
    plain = ["%s%d" % (prefix, i) for i in range(n_plain)]
    words = plain[:special_offset] + SPECIALS + EXOTIC + plain[special_offset:]
    assert len(words) == size and len(set(words)) == size
    return words


def float32_to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest even, like torch) -> uint16 bits."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    out[nan] = 0x7FC0
    return out


class BFloat16Variable(model_spec.Variable):
    """A bfloat16 variable without torch (ctranslate2 needs torch for bfloat16)."""

    def __init__(self, array: np.ndarray):
        self.bits = float32_to_bfloat16_bits(array)

    @property
    def shape(self):
        return self.bits.shape

    @property
    def dtype(self):
        return "bfloat16"

    def numpy(self):
        return (self.bits.astype(np.uint32) << 16).view(np.float32)

    def num_bytes(self):
        return self.bits.nbytes

    def to_bytes(self):
        return self.bits.tobytes()

    def _to(self, dtype):
        return model_spec.NumpyVariable(self.numpy().astype(dtype))

    def _equal(self, other):
        return self.bits.shape == other.bits.shape and np.array_equal(self.bits, other.bits)


def _convert_floats_to_bfloat16(spec):
    def fn(layer, name, value):
        if isinstance(value, model_spec.NumpyVariable) and not value.is_scalar() \
                and value.dtype == "float32":
            setattr(layer, name.split("/")[-1], BFloat16Variable(value.numpy()))

    model_spec.visit_spec(spec, fn)


class _Filler:
    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def linear(self, spec, out_dim, in_dim, bias=True, gain=1.0):
        spec.weight = self.normal((out_dim, in_dim), gain / np.sqrt(in_dim))
        if bias:
            spec.bias = self.normal((out_dim,), self.cfg.bias_std)

    def layer_norm(self, spec, d):
        if self.cfg.unit_layer_norms:
            spec.gamma = np.ones((d,), dtype=np.float32)
            spec.beta = np.zeros((d,), dtype=np.float32)
        else:
            spec.gamma = (1.0 + self.normal((d,), 0.1)).astype(np.float32)
            spec.beta = self.normal((d,), 0.1)

    def ffn(self, spec, d, ff):
        self.layer_norm(spec.layer_norm, d)
        self.linear(spec.linear_0, ff, d)
        self.linear(spec.linear_1, d, ff, gain=self.cfg.ffn_gain)

    def self_attention(self, spec, d):
        self.layer_norm(spec.layer_norm, d)
        qkv = self.normal((3 * d, d), 1.0 / np.sqrt(d))
        qkv[: 2 * d] *= self.cfg.qk_gain
        spec.linear[0].weight = qkv  # fused QKV
        spec.linear[0].bias = self.normal((3 * d,), self.cfg.bias_std)
        self.linear(spec.linear[1], d, d, gain=self.cfg.self_gain)

    def cross_attention(self, spec, d):
        self.layer_norm(spec.layer_norm, d)
        self.linear(spec.linear[0], d, d, gain=self.cfg.qk_gain)  # Q
        self.linear(spec.linear[1], 2 * d, d)  # fused KV
        self.linear(spec.linear[2], d, d, gain=self.cfg.cross_gain)


def _rotation_ffn(fill, ffn, d, cfg):
    """Make ``ffn`` compute x -> (g*R - I) x in its linear range (large positive
    pre-activation bias so relu/gelu/swish act as the identity).  Returns R."""
    ff = cfg.ffn
    q, _ = np.linalg.qr(fill.rng.standard_normal((d, d)))
    rot = q.astype(np.float32)
    scale = 1.0 if not cfg.pre_norm else 1.3  # rough std of the pre-norm residual
    a = scale * (cfg.rotate_gain * rot - np.eye(d, dtype=np.float32))
    w1 = fill.normal((ff, d), 1.0 / np.sqrt(d))
    b1 = np.full((ff,), 12.0, dtype=np.float32)
    w2 = (a @ np.linalg.pinv(w1)).astype(np.float32)
    ffn.linear_0.weight = w1
    ffn.linear_0.bias = b1
    ffn.linear_1.weight = w2
    ffn.linear_1.bias = (-(w2 @ b1)).astype(np.float32)
    return rot


def build_spec(cfg: ModelConfig):
    d = cfg.d_model
    spec = transformer_spec.TransformerSpec.from_config(
        cfg.layers,
        cfg.num_heads,
        pre_norm=cfg.pre_norm,
        activation=cfg.activation,
    )
    fill = _Filler(cfg)

    shared = cfg.tgt_vocab is None
    src_words = make_vocab(cfg.src_vocab, "w" if shared else "s")
    if shared:
        tgt_words = src_words
    else:
        tgt_words = make_vocab(cfg.tgt_vocab, "t", cfg.tgt_special_offset)
    if cfg.share_src_tgt_embeddings:
        assert shared

    emb_std = ((1.0 / np.sqrt(d)) if cfg.scale_embeddings else 1.0) * cfg.emb_gain
    # Embeddings: when scaled by sqrt(d) at run time the input has std ~1.
    enc = spec.encoder
    dec = spec.decoder
    src_emb = fill.normal((len(src_words), d), emb_std)
    enc.embeddings[0].weight = src_emb
    enc.scale_embeddings = cfg.scale_embeddings
    dec.scale_embeddings = cfg.scale_embeddings
    if cfg.share_src_tgt_embeddings:
        tgt_emb = src_emb
    else:
        tgt_emb = fill.normal((len(tgt_words), d), emb_std)
    dec.embeddings.weight = tgt_emb

    if cfg.learned_positions:
        enc.position_encodings.encodings = fill.normal((cfg.learned_positions, d), 0.5)
        dec.position_encodings.encodings = fill.normal((cfg.learned_positions, d), 0.5)

    for layer in enc.layer:
        fill.self_attention(layer.self_attention, d)
        fill.ffn(layer.ffn, d, cfg.ffn)
    for layer in dec.layer:
        fill.self_attention(layer.self_attention, d)
        fill.cross_attention(layer.attention, d)
        fill.ffn(layer.ffn, d, cfg.ffn)
    if cfg.pre_norm:
        fill.layer_norm(enc.layer_norm, d)
        fill.layer_norm(dec.layer_norm, d)

    eos_id = tgt_words.index("</s>")
    v = len(tgt_words)
    specials = [tgt_words.index(t) for t in SPECIALS]
    # Tokens after which </s> is likely.
    n_eos = max(1, int(cfg.eos_set_frac * v)) if cfg.eos_set_frac else 0
    candidates = [i for i in range(v) if i not in specials]
    eos_set = fill.rng.choice(candidates, n_eos, replace=False) if n_eos else np.array([], dtype=int)
    if cfg.tie_projection:
        # The projection shares the decoder embedding matrix (saved as an alias).
        if cfg.rotate_gain:
            rot = _rotation_ffn(fill, dec.layer[-1].ffn, d, cfg)
            if n_eos:
                target = (rot @ tgt_emb[eos_set].T).T.sum(0)
                tgt_emb[eos_id] = target / np.linalg.norm(target) * np.linalg.norm(tgt_emb, axis=1).mean()
        dec.projection.weight = tgt_emb
        bias = fill.normal((v,), 0.5)
    else:
        w = fill.normal((v, d), 1.0 / np.sqrt(d))
        if cfg.chain_mix:
            unit = tgt_emb / np.linalg.norm(tgt_emb, axis=1, keepdims=True)
            # Row j leans towards the embedding of its predecessor pred[j]; the
            # tokens of eos_set lead to </s> only.
            others = np.array([i for i in range(v) if i not in set(eos_set.tolist())])
            pred = fill.rng.permutation(others)
            targets = [j for j in range(v) if j != eos_id][: len(pred)]
            for j, i in zip(targets, pred):
                w[j] = (1 - cfg.chain_mix) * w[j] + cfg.chain_mix * unit[i]
            if n_eos:
                w[eos_id] = (1 - cfg.chain_mix) * w[eos_id] + cfg.chain_mix * unit[eos_set].sum(0)
        dec.projection.weight = (w * cfg.logit_scale).astype(np.float32)
        bias = fill.normal((v,), 0.5)
    bias[eos_id] += cfg.eos_bias
    dec.projection.bias = bias.astype(np.float32)

    spec.register_source_vocabulary(src_words)
    spec.register_target_vocabulary(tgt_words)

    spec.config.add_source_bos = cfg.add_source_bos
    spec.config.add_source_eos = cfg.add_source_eos
    spec.config.decoder_start_token = cfg.decoder_start_token
    spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
    return spec, src_words, tgt_words


def _json_vocab_to_txt(path_dir: str):
    for name in ("shared_vocabulary", "source_vocabulary", "target_vocabulary"):
        jpath = os.path.join(path_dir, name + ".json")
        if os.path.exists(jpath):
            with open(jpath, encoding="utf-8") as f:
                tokens = json.load(f)
            with open(os.path.join(path_dir, name + ".txt"), "w", encoding="utf-8") as f:
                for tok in tokens:
                    f.write(tok + "\n")
            os.remove(jpath)


def build_model(cfg: ModelConfig, out_dir: str) -> ModelInfo:
    spec, src_words, tgt_words = build_spec(cfg)
    spec.validate()
    if cfg.quantization == "bfloat16":
        # ctranslate2 needs torch to write bfloat16; do the same conversion here.
        spec.optimize(quantization=None)
        _convert_floats_to_bfloat16(spec)
    else:
        spec.optimize(quantization=cfg.quantization)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    spec.save(out_dir)
    if cfg.txt_vocab:
        _json_vocab_to_txt(out_dir)
    info = ModelInfo(
        name=cfg.name,
        path=out_dir,
        config=cfg,
        source_vocab=src_words,
        target_vocab=tgt_words,
        requires_prefix=cfg.decoder_start_token is None,
        start_token="<s>" if cfg.decoder_start_token is None else None,
        notes=cfg.notes,
        learned_positions=cfg.learned_positions,
    )
    return info


def build_all(root: str, names: Optional[List[str]] = None) -> Dict[str, ModelInfo]:
    os.makedirs(root, exist_ok=True)
    models = {}
    for cfg in MODEL_CONFIGS:
        if names and cfg.name not in names:
            continue
        models[cfg.name] = build_model(cfg, os.path.join(root, cfg.name))
    return models


def random_sentences(info: ModelInfo, n: int = 50, seed: int = 0, max_len: int = 20,
                     unknown_rate: float = 0.05) -> List[List[str]]:
    """Random source sentences: lengths 0..max_len, the first one empty, some
    tokens unknown to the vocabulary (and special tokens now and then)."""
    rng = np.random.default_rng(seed)
    vocab = info.source_vocab
    out = [[]]
    for i in range(1, n):
        length = int(rng.integers(0, max_len + 1))
        sent = []
        for _ in range(length):
            r = rng.random()
            if r < unknown_rate:
                sent.append("UNKNOWN_%d" % int(rng.integers(0, 5)))
            else:
                sent.append(vocab[int(rng.integers(0, len(vocab)))])
        out.append(sent)
    return out


def _check(models: Dict[str, ModelInfo]):
    import ctranslate2

    for name, info in models.items():
        tr = ctranslate2.Translator(info.path, device="cpu", compute_type="float32")
        sents = random_sentences(info, 50)
        prefix = [[info.start_token] for _ in sents] if info.requires_prefix else None
        res = tr.translate_batch(sents, target_prefix=prefix, beam_size=1)
        lens = [len(r.hypotheses[0]) for r in res]
        distinct = len({tuple(r.hypotheses[0]) for r in res})
        print(
            "%-40s files=%s\n    mean_len=%.1f max_len=%d empty=%d distinct=%d/%d"
            % (name, sorted(os.listdir(info.path)), np.mean(lens), max(lens),
               sum(1 for x in lens if x == 0), distinct, len(res))
        )
        for s, r in list(zip(sents, res))[:3]:
            print("    %s -> %s" % (" ".join(s), " ".join(r.hypotheses[0])))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--check", action="store_true", help="translate a few sentences with ctranslate2")
    ap.add_argument("--only", nargs="*", help="model names to build")
    args = ap.parse_args(argv)
    models = build_all(args.out_dir, args.only)
    for name, info in models.items():
        print("%s: %s" % (name, info.notes))
    if args.check:
        _check(models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
