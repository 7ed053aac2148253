#!/usr/bin/env python3
"""Plain-numpy reference for Marian / Bergamot transformer models (greedy decoding).

    python3 tests/python/marian_reference.py --model MODEL.{bin,npz} \
        (--vocab-spm VOCAB.spm | --vocab-yml VOCAB.yml) [--shortlist LEX.bin] \
        --input FILE --output FILE [--max-sentences N] [--exact-int8 [--no-saturation]] \
        [--config PACKAGE.yml] [--max-length-factor F] [--input-ids] [--output-ids]

What it implements (checked against browsermt/marian-dev, kpu/intgemm and
browsermt/bergamot-translator sources; file names in the comments):

* .bin reading (src/common/binary.cpp): u64 version, u64 n, n x {nameLen, type, shapeLen,
  dataLen}, names, int32 shapes, u64 offset + padding, blobs (dataLen includes padding).
  Types: float32 0x404, int8 0x101 (the special:model.yml text), intgemm8 0x4101.
  intgemm8 items (src/tensors/cpu/expression_graph_packable.h) hold int8 values
  quantized with quantMult = 127/max|W| (round-to-nearest-even, clamp [-127,127]),
  then the float32 quantMult. Every matrix is stored transposed ([out][in] row-major
  while the shape says [in, out]) except names containing "Wemb", which the loader
  (binary.cpp + integer_common.h unquantizeWemb) turns back into float32 as
  int8 * (1/quantMult); that includes the 1x1 "Wemb_QuantMultA" alpha item.
* .npz: numpy arrays by name, "special:model.yml" as an int8 char array.
* Transformer (src/models/transformer.h): embeddings * sqrt(dim-emb) + sinusoidal
  positions (src/graph/node_initializers.cpp: [sin | cos] halves, position p from 0,
  frequency exp(-i * log(10000)/(d/2 - 1))); pre/post-process op strings
  ('d' dropout = no-op, 'a' residual, 'n' layer norm with eps 1e-6,
  layers/generic.h) named <prefix>_ln_scale / _ln_bias (suffix "_pre" for preprocess);
  attention softmax(q k^T / sqrt(d_head)) v with biases on Wq/Wk/Wv/Wo; FFN
  W1 -> activation -> W2 (transformer-ffn-depth); encoder -> decoder layers
  [autoregressive layer | cross-attention "context" | FFN]; output
  logits = h W^T + decoder_ff_logit_out_b with W = Wemb (tied-embeddings-all or
  tied-embeddings-src), decoder_Wemb (tied-embeddings), else
  decoder_ff_logit_out_Wt ([V, d]) or legacy decoder_ff_logit_out_W ([d, V]).
* Decoder autoregressive layer (transformer-decoder-autoreg):
  - self-attention (decoder_lN_self_*, causal; post-process prefix decoder_lN_self_Wo)
  - rnn with dec-cell ssru (src/rnn/cells.h SSRU, highway op):
      f = sigmoid(x Wf + bf); c = f * c_prev + (1 - f) * (x W); h = relu(c)
      pre-process prefix decoder_lN_rnn, post-process prefix decoder_lN_rnn_ffn
  - average-attention (LayerAAN / DecoderLayerAAN): g_t = mean(x_0..x_t);
      y = FFN_aan(g) (transformer-aan-depth layers: W1..W{depth-1} with
      transformer-aan-activation at dim transformer-dim-aan, then W{depth} back to
      dim-emb without activation, only if the width differs); unless
      transformer-aan-nogate: y = sigmoid(x Wi + bi) * x + sigmoid(y Wf + bf) * y;
      post-process(y, residual x) with prefix decoder_lN_aan_ffn.
  Step 0 feeds a zero embedding (decoder.h embeddingsFromPrediction) plus position 0.
* Greedy search (src/translator/beam_search.cpp, history.h): source = tokens + </s>;
  at most ceil(max-length-factor * source length incl. </s>) target tokens (the last
  one kept even if not </s>); <unk> suppressed unless --allow-unk; stops at </s>.
* Shortlist (src/data/shortlist.cpp BinaryShortlistGenerator::generate): ids
  [0, firstNum) + (if shared vocab: the source ids) + the lists of every source id
  (incl. </s>), then padded to a multiple of 8 with the smallest unused ids >= firstNum;
  logits only over that sorted set. Binary layout: u64 magic 0xF11A48D5013417F5,
  checksum (boost-style hash_combine over all u64 words after the checksum),
  firstNum, bestNum, wordToOffsetSize, shortListsSize; u64 wordToOffset[]; u32 lists[].
* --exact-int8 (src/tensors/cpu/intgemm_interface.h + wasm_intgemm_fallback.cpp +
  intgemm ssse3_gemm.h/multiply.h): for every affine/dot whose B is an intgemm8
  parameter (and the output layer), A is quantized with the precomputed alpha
  <Bname>_QuantMultA (127/max|A| computed on the fly if the model has none):
  q = clamp(rne(f32(x*alpha)), -127, 127), u = q + 127 (uint8);
  acc = sum over k-pairs of sat16(u[2i] b[2i] + u[2i+1] b[2i+1]) (pmaddubsw, the
  SSSE3/AVX2/AVX512BW and WASM path; --no-saturation for AVX512-VNNI which does not
  saturate pairs); out = f32(acc) * (1/(alpha*qB)) + bias', with
  bias' = bias + f32(sum_k b) * -((127/alpha)*(127/qB)/127) (Int8Shift::PrepareBias).
  The output layer re-quantizes the dequantized float Wemb with qB = 127/max|Wemb|.
  Without --exact-int8, intgemm8 matrices are dequantized (int8 / quantMult) and
  everything runs in float32.
* --float-mode wasm (default) reproduces the float32 operation order of the bergamot WASM
  build: layer norm with sequential sums; softmax = marian's Softmax<float32x4> (Cephes
  exp_ps, 4 lane sums) when the row length is a multiple of 4, else the scalar path (musl
  expf, sequential sum); sigmoid = exp_ps(x) / (1 + exp_ps(x)) on rows that are multiples of
  4 (float32x4 Element), else 1/(1+expf(-x)) | expf(x)/(1+expf(x)); attention products in
  Eigen 3.3 gebp order (onnxjs gemm_f32_imp, see eigen_gemm). --float-mode numpy is plain
  numpy float32.

Verified: with --exact-int8 (default float mode) this reproduces the WASM build of
bergamot-translator 0.4.9 (tests/python/bergamot_oracle.js) on all 500 en->pt dev lines
(identical text, batch size 1), and every intgemm call of a traced sentence bit for bit;
it reproduces real Marian (pymarian 1.12.42, float32) and the bergamot WASM (intgemm8) on
the random models of make_marian_models.py.
"""
from __future__ import annotations

import argparse
import math
import struct
import sys
from pathlib import Path

import numpy as np

F32 = np.float32
TYPE_INT8 = 0x101
TYPE_FLOAT32 = 0x404
TYPE_FLOAT16 = 0x402
TYPE_INTGEMM8 = 0x4101
TYPE_INTGEMM16 = 0x4102
SHORTLIST_MAGIC = 0xF11A48D5013417F5


# ----------------------------------------------------------------------------- I/O

def read_bin_items(path):
    """Returns {name: (type, shape tuple, bytes)} from a Marian .bin file."""
    buf = Path(path).read_bytes()
    version, n = struct.unpack_from("<QQ", buf, 0)
    if version != 1:
        raise ValueError(f"unsupported .bin version {version}")
    off = 16
    headers = [struct.unpack_from("<QQQQ", buf, off + 32 * i) for i in range(n)]
    off += 32 * n
    names = []
    for nl, _, _, _ in headers:
        names.append(buf[off:off + nl - 1].decode("utf-8"))
        off += nl
    shapes = []
    for _, _, sl, _ in headers:
        shapes.append(struct.unpack_from(f"<{sl}i", buf, off))
        off += 4 * sl
    pad = struct.unpack_from("<Q", buf, off)[0]
    off += 8 + pad
    items = {}
    for (nl, t, sl, dl), name, shape in zip(headers, names, shapes):
        items[name] = (t, tuple(shape), buf[off:off + dl])
        off += dl
    return items


def hash_u64_words(words):
    """marian util::hashMem<uint64_t,uint64_t>: boost hash_combine, std::hash = identity."""
    seed = 0
    M = (1 << 64) - 1
    for w in words:
        seed ^= (int(w) + 0x9E3779B9 + ((seed << 6) & M) + (seed >> 2)) & M
        seed &= M
    return seed


class Shortlist:
    def __init__(self, path, check=True):
        buf = Path(path).read_bytes()
        magic, checksum, first, best, w2o_size, lists_size = struct.unpack_from("<6Q", buf, 0)
        if magic != SHORTLIST_MAGIC:
            raise ValueError("not a binary shortlist (text shortlists are not supported here)")
        expected = 48 + 8 * w2o_size + 4 * lists_size
        if expected != len(buf):
            raise ValueError(f"shortlist size {len(buf)} != header's {expected}")
        if check:
            nwords = (len(buf) - 16) // 8
            words = np.frombuffer(buf, dtype="<u8", count=nwords, offset=16)
            if hash_u64_words(words.tolist()) != checksum:
                raise ValueError("shortlist checksum mismatch")
        self.first, self.best = first, best
        self.word_to_offset = np.frombuffer(buf, dtype="<u8", count=w2o_size, offset=48).astype(np.int64)
        self.lists = np.frombuffer(buf, dtype="<u4", count=lists_size, offset=48 + 8 * w2o_size).astype(np.int64)

    def generate(self, src_ids, trg_vocab_size, shared):
        sel = np.zeros(trg_vocab_size, dtype=bool)
        sel[:min(self.first, trg_vocab_size)] = True
        for s in src_ids:
            if shared:
                sel[s] = True
            a, b = self.word_to_offset[s], self.word_to_offset[s + 1]
            sel[self.lists[a:b]] = True
        count = int(sel.sum())
        i = self.first
        while i < trg_vocab_size and count % 8 != 0:
            if not sel[i]:
                sel[i] = True
                count += 1
            i += 1
        return np.nonzero(sel)[0]


def write_shortlist(path, first, best, lists_per_src):
    """Writes a binary shortlist; lists_per_src[s] = sorted target ids for source id s."""
    offsets, flat = [], []
    for lst in lists_per_src:
        offsets.append(len(flat))
        flat.extend(sorted(int(x) for x in lst))
    offsets.append(len(flat))
    body = struct.pack("<4Q", first, best, len(offsets), len(flat))
    body += np.asarray(offsets, dtype="<u8").tobytes() + np.asarray(flat, dtype="<u4").tobytes()
    nwords = len(body) // 8
    checksum = hash_u64_words(np.frombuffer(body[:nwords * 8], dtype="<u8").tolist())
    Path(path).write_bytes(struct.pack("<QQ", SHORTLIST_MAGIC, checksum) + body)


# ----------------------------------------------------------------------------- model

class Param:
    """A weight: float32 value, or an intgemm8 matrix (int8 [in, out] + quantMult)."""

    def __init__(self, value=None, q=None, qmult=None):
        self.q = q            # int8 array in Marian's logical shape ([in, out]) or None
        self.qmult = qmult    # float32 quantMult of q
        self._value = value   # float32 array

    @property
    def value(self):
        if self._value is None:
            self._value = self.q.astype(F32) / F32(self.qmult)
        return self._value


def load_model(path):
    path = str(path)
    params, yml = {}, None
    if path.endswith(".npz"):
        z = np.load(path)
        for name in z.files:
            a = z[name]
            if name.startswith("special:"):
                if name == "special:model.yml":
                    yml = bytes(a.astype(np.int8).tobytes()).split(b"\0", 1)[0].decode("utf-8")
                continue
            a = np.asarray(a, dtype=F32)
            if a.ndim == 1:
                a = a.reshape(1, -1)
            params[name] = Param(value=a)
    else:
        for name, (t, shape, data) in read_bin_items(path).items():
            if name.startswith("special:"):
                if name == "special:model.yml":
                    yml = data.split(b"\0", 1)[0].decode("utf-8")
                continue
            n = int(np.prod(shape))
            if t == TYPE_FLOAT32:
                params[name] = Param(value=np.frombuffer(data, dtype="<f4", count=n).reshape(shape).copy())
            elif t == TYPE_FLOAT16:
                params[name] = Param(value=np.frombuffer(data, dtype="<f2", count=n).astype(F32).reshape(shape))
            elif t == TYPE_INTGEMM8:
                q = np.frombuffer(data, dtype=np.int8, count=n)
                qmult = np.frombuffer(data, dtype="<f4", count=1, offset=n)[0]
                if "Wemb" in name:
                    # binary.cpp: unquantizeWemb -> float32, int8 * (1/quantMult), not transposed
                    params[name] = Param(value=(q.astype(F32) * (F32(1) / qmult)).reshape(shape))
                else:
                    # stored transposed: bytes are [out][in]; logical shape [in, out]
                    rows, cols = shape[0], int(np.prod(shape[1:]))
                    params[name] = Param(q=q.reshape(cols, rows).T.copy(), qmult=F32(qmult))
            elif t == TYPE_INTGEMM16:
                raise ValueError(f"{name}: intgemm16 items are not supported by this reference")
            else:
                raise ValueError(f"{name}: unsupported item type {t:#x}")
    if yml is None:
        raise ValueError("model has no special:model.yml")
    import yaml

    cfg = yaml.safe_load(yml)
    return params, cfg


# ----------------------------------------------------------------------------- math

# --- float32 kernels. Two flavours: "wasm" reproduces the operation order of the
# bergamot-translator WASM build bit for bit (verified against its intgemm call trace:
# see tests/python/bergamot_oracle.js --trace), "numpy" is plain numpy float32.

_EXP2F_T = np.array([  # musl/ARM optimized-routines exp2f_data.c: 2^(i/32) words minus i << 47
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540], dtype=np.uint64)


def expf_musl(x):
    """musl (emscripten) expf: binary64 evaluation with a 32-entry table, one final rounding."""
    x = np.asarray(x, F32)
    xd = x.astype(np.float64)
    z = float.fromhex("0x1.71547652b82fep+0") * 32 * xd
    shift = float.fromhex("0x1.8p+52")
    kd = z + shift
    ki = kd.view(np.uint64)
    kd = kd - shift
    r = z - kd
    t = _EXP2F_T[ki % np.uint64(32)] + (ki << np.uint64(47))
    s = t.view(np.float64)
    c0 = float.fromhex("0x1.c6af84b912394p-5") / 32 / 32 / 32
    c1 = float.fromhex("0x1.ebfce50fac4f3p-3") / 32 / 32
    c2 = float.fromhex("0x1.62e42ff0c52d6p-1") / 32
    y = (c0 * r + c1) * (r * r) + (c2 * r + 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (y * s).astype(F32)
    out = np.where(x < F32(-103.97208), F32(0), out)
    return np.where(x > F32(88.72283), F32(np.inf), out).astype(F32)


def exp_ps(x):
    """Cephes exp_ps of sse_mathfun.h (marian's float32x4 exp), in float32 steps."""
    x = np.asarray(x, F32)
    x = np.maximum(np.minimum(x, F32(88.3762626647949)), F32(-88.3762626647949))
    fx = (x * F32(1.44269504088896341) + F32(0.5)).astype(F32)
    tmp = np.trunc(fx).astype(F32)
    fx = (tmp - np.where(tmp > fx, F32(1), F32(0))).astype(F32)
    x = ((x - (fx * F32(0.693359375)).astype(F32)).astype(F32) - (fx * F32(-2.12194440e-4)).astype(F32)).astype(F32)
    z = (x * x).astype(F32)
    y = F32(1.9875691500e-4)
    for p in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = ((y * x).astype(F32) + F32(p)).astype(F32)
    y = (((y * z).astype(F32) + x).astype(F32) + F32(1)).astype(F32)
    n = (np.trunc(fx).astype(np.int32) + 127).astype(np.uint32) << np.uint32(23)
    return (y * n.view(F32)).astype(F32)


def seq_sum(a):
    """Sequential float32 sum over the last axis (numpy's cumsum does not reorder)."""
    return np.cumsum(a, axis=-1, dtype=F32)[..., -1]


def eigen_gemm(A, Bt, alpha):
    """C[m, n] = alpha * sum_k A[m, k] Bt[n, k] in the order of Eigen 3.3's gebp kernel with
    4-float SSE packets (onnxjs gemm_f32_imp, the float GEMM of the WASM build): Eigen
    computes C^T = Bt A^T; every element is a sequential k-sum, except the rows of Bt left
    over after the multiples of 4, which (when A has >= 4 rows, for the first
    (rows(A)//4)*4 rows) use 4 interleaved partial sums combined as (s0+s1)+(s2+s3), then the
    k % 4 tail. alpha multiplies the finished sum."""
    M, K = A.shape[-2], A.shape[-1]
    N = Bt.shape[-2]
    P = (A[..., :, None, :] * Bt[..., None, :, :]).astype(F32)  # [..., M, N, K]
    acc = seq_sum(P) if K else np.zeros(P.shape[:-1], F32)
    peeled, pc4 = (N // 4) * 4, (M // 4) * 4
    if peeled < N and pc4 > 0 and K > 0:
        Q = P[..., :pc4, peeled:, :]
        e4 = (K // 4) * 4
        if e4:
            c = [seq_sum(Q[..., r:e4:4]) for r in range(4)]
            s = ((c[0] + c[1]).astype(F32) + (c[2] + c[3]).astype(F32)).astype(F32)
        else:
            s = np.zeros(Q.shape[:-1], F32)
        for k in range(e4, K):
            s = (s + Q[..., k]).astype(F32)
        acc[..., :pc4, peeled:] = s
    return (F32(alpha) * acc).astype(F32)


class FloatOps:
    def __init__(self, mode="wasm"):
        if mode not in ("wasm", "numpy"):
            raise ValueError(mode)
        self.wasm = mode == "wasm"

    def layer_norm(self, x, scale, bias, eps=1e-6):
        """marian LayerNormalizationImpl: mean, sum of squared deviations, sigma = sqrt(var+eps),
        out = scale * ((x - mean) / sigma) + bias (sequential sums in the WASM build)."""
        x = x.astype(F32)
        n = F32(x.shape[-1])
        if self.wasm:
            mean = (seq_sum(x) / n).astype(F32)[..., None]
            d = (x - mean).astype(F32)
            var = (seq_sum((d * d).astype(F32)) / n).astype(F32)[..., None]
        else:
            mean = x.mean(-1, keepdims=True, dtype=F32)
            d = x - mean
            var = (d * d).mean(-1, keepdims=True, dtype=F32)
        sigma = np.sqrt((var + F32(eps)).astype(F32)).astype(F32)
        return ((scale * (d / sigma)).astype(F32) + bias).astype(F32)

    def sigmoid(self, x):
        x = np.asarray(x, F32)
        if not self.wasm:
            return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)
        if x.shape[-1] % 4 == 0:  # float32x4 path: e / (1 + e) with exp_ps
            e = exp_ps(x)
            return (e / (F32(1) + e)).astype(F32)
        en, ep = expf_musl(-x), expf_musl(x)
        return np.where(x > 0, F32(1) / (F32(1) + en), ep / (F32(1) + ep)).astype(F32)

    def softmax(self, z):
        z = np.asarray(z, F32)
        m = z.max(-1, keepdims=True)
        if not self.wasm:
            e = np.exp(z - m).astype(F32)
            return (e / e.sum(-1, keepdims=True, dtype=F32)).astype(F32)
        L = z.shape[-1]
        d = (z - m).astype(F32)
        if L % 4 == 0:  # Softmax<float32x4>: exp_ps, 4 lane sums, lanes added in order
            e = exp_ps(d)
            lanes = [seq_sum(e[..., r::4]) for r in range(4)]
            s = lanes[0]
            for l in lanes[1:]:
                s = (s + l).astype(F32)
        else:
            e = expf_musl(d)
            s = seq_sum(e)
        return (e / s[..., None]).astype(F32)

    def matmul_bt(self, A, Bt, alpha=1.0):
        """alpha * A @ Bt^T over the last two axes (marian bdot)."""
        if self.wasm:
            return eigen_gemm(A, Bt, alpha)
        return (F32(alpha) * (A @ np.swapaxes(Bt, -1, -2)).astype(F32)).astype(F32)

    def act(self, name):
        if name == "relu":
            return relu
        if name == "swish":
            return lambda x: (x * self.sigmoid(x)).astype(F32)
        if name == "gelu":  # marian: x * sigmoid(1.702 x)
            return lambda x: (x * self.sigmoid((F32(1.702) * x).astype(F32))).astype(F32)
        raise ValueError(f"unknown activation {name}")


def relu(x):
    return np.maximum(x, F32(0))


def sinusoidal(start, n, d):
    """src/graph/node_initializers.cpp sinusoidalPositionEmbeddings: float32
    log(10000)/(d/2-1) increment, v = p * expf(i * -inc), [sinf(v) | cosf(v)]."""
    nts = d // 2
    inc = F32(F32(math.log(10000.0)) / F32(nts - 1))
    i = np.arange(nts, dtype=F32)
    freqs = expf_musl((i * -inc).astype(F32))
    p = np.arange(start, start + n, dtype=F32)[:, None]
    v = (p * freqs[None, :]).astype(F32).astype(np.float64)
    return np.concatenate([np.sin(v), np.cos(v)], axis=-1).astype(F32)


def quantize_a(x, alpha):
    """intgemm QuantizeU minus the +127 shift: clamp(rne(x*alpha), -127, 127)."""
    v = (x.astype(F32) * F32(alpha)).astype(F32)
    bad = ~np.isfinite(v) | (np.abs(v) >= F32(2.0 ** 31))  # cvtps_epi32 -> INT_MIN -> -128 -> -127
    r = np.rint(np.where(bad, 0, v))
    r = np.clip(r, -127, 127)
    r[bad] = -127
    return r.astype(np.int32)


def int_gemm_u8s8(u, b, saturate=True):
    """sum_k u[n,k] b[k,m] with pmaddubsw pair saturation (pairs (2i, 2i+1) along k)."""
    uf = u.astype(np.float64)
    bf = b.astype(np.float64)
    acc = uf @ bf  # exact: |acc| < 2^53
    if not saturate:
        return acc.astype(np.int64)
    k = u.shape[1]
    assert k % 2 == 0
    bmax = np.abs(b).max(axis=1).astype(np.int64)  # [k]
    u64 = u.astype(np.int64)
    bound = u64[:, 0::2] * bmax[0::2] + u64[:, 1::2] * bmax[1::2]  # [n, k/2]
    rows, pairs = np.nonzero(bound > 32767)
    if len(rows):
        corr = np.zeros_like(acc)
        for p in np.unique(pairs):
            rr = rows[pairs == p]
            s = (u64[rr, 2 * p, None] * b[2 * p].astype(np.int64)[None, :]
                 + u64[rr, 2 * p + 1, None] * b[2 * p + 1].astype(np.int64)[None, :])
            corr[rr] += (np.clip(s, -32768, 32767) - s)
        acc = acc + corr
    return acc.astype(np.int64)


def int8_shift_affine(x, bq, qb, alpha, bias, saturate=True):
    """intgemm Int8Shift::Multiply + UnquantizeAndAddBiasAndWrite with PrepareBias."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    u = quantize_a(x2, alpha) + 127
    acc = int_gemm_u8s8(u, bq, saturate)
    alpha, qb = F32(alpha), F32(qb)
    sum_b = bq.astype(np.int64).sum(axis=0).astype(F32)
    factor = -(((F32(127) / alpha) * (F32(127) / qb)).astype(F32) / F32(127))
    bprep = (sum_b * F32(factor)).astype(F32)
    if bias is not None:
        bprep = (bprep + bias.reshape(-1)).astype(F32)
    unq = F32(1) / F32(alpha * qb)
    out = (acc.astype(F32) * unq).astype(F32) + bprep
    return out.reshape(shape[:-1] + (bq.shape[1],)).astype(F32)


# ----------------------------------------------------------------------------- the model

class MarianReference:
    def __init__(self, model_path, exact_int8=False, saturate=True, cfg_overrides=None, float_mode="wasm"):
        self.params, self.cfg = load_model(model_path)
        self.f = FloatOps(float_mode)
        if cfg_overrides:
            self.cfg.update(cfg_overrides)
        c = self.cfg
        if c.get("type", "transformer") != "transformer":
            raise ValueError(f"model type {c.get('type')} is not supported (transformer only)")
        self.exact = exact_int8
        self.saturate = saturate
        self.d = int(c["dim-emb"])
        self.heads = int(c.get("transformer-heads", 8))
        self.enc_depth = int(c.get("enc-depth", 6))
        self.dec_depth = int(c.get("dec-depth", 6))
        self.pre = c.get("transformer-preprocess", "") or ""
        self.post = c.get("transformer-postprocess", "dan") or ""
        self.post_emb = c.get("transformer-postprocess-emb", "d") or ""
        self.post_top = c.get("transformer-postprocess-top", "") or ""
        self.ffn_act = self.f.act(c.get("transformer-ffn-activation", "swish"))
        self.ffn_depth = int(c.get("transformer-ffn-depth", 2))
        self.autoreg = c.get("transformer-decoder-autoreg", "self-attention")
        if self.autoreg == "rnn" and c.get("dec-cell", "ssru") != "ssru":
            raise ValueError(f"dec-cell {c.get('dec-cell')} is not supported (ssru only)")
        if c.get("transformer-train-position-embeddings") or c.get("transformer-train-positions"):
            raise ValueError("learned positions are not supported")
        tall = bool(c.get("tied-embeddings-all"))
        tsrc = bool(c.get("tied-embeddings-src"))
        tied = bool(c.get("tied-embeddings"))
        self.enc_emb = "Wemb" if (tall or tsrc) else "encoder_Wemb"
        self.dec_emb = "Wemb" if (tall or tsrc) else "decoder_Wemb"
        if tall or tied:
            self.out_w, self.out_layout = ("Wemb" if (tall or tsrc) else "decoder_Wemb"), "Vd"
        elif "decoder_ff_logit_out_Wt" in self.params:
            self.out_w, self.out_layout = "decoder_ff_logit_out_Wt", "Vd"
        else:
            self.out_w, self.out_layout = "decoder_ff_logit_out_W", "dV"
        self.out_b = "decoder_ff_logit_out_b" if "decoder_ff_logit_out_b" in self.params else None
        self.trg_vocab_size = int(c["dim-vocabs"][-1])
        self._out_q = None

    # --- helpers
    def P(self, name):
        return self.params[name]

    def has(self, name):
        return name in self.params

    def alpha(self, wname, x):
        a = self.params.get(wname + "_QuantMultA")
        if a is not None:
            return F32(a.value.reshape(-1)[0])
        m = F32(np.abs(x).max())  # dynamic: QuantMultNodeOp 127 / MaxAbsolute(A)
        return F32(127) / m if m > 0 else F32(1)

    def affine(self, x, wname, bname=None):
        w = self.P(wname)
        b = self.P(bname).value if bname else None
        if self.exact and w.q is not None:
            return int8_shift_affine(x, w.q, w.qmult, self.alpha(wname, x), b, self.saturate)
        y = (x @ w.value).astype(F32)
        if b is not None:
            y = y + b.reshape(-1)
        return y.astype(F32)

    def dense(self, x, prefix, suffix, act=None):
        y = self.affine(x, f"{prefix}_W{suffix}", f"{prefix}_b{suffix}")
        return act(y) if act else y

    def ln(self, x, prefix, suffix=""):
        return self.f.layer_norm(x, self.P(f"{prefix}_ln_scale{suffix}").value.reshape(-1),
                          self.P(f"{prefix}_ln_bias{suffix}").value.reshape(-1))

    def preprocess(self, prefix, ops, x):
        for op in ops:
            if op == "n":
                x = self.ln(x, prefix, "_pre")
            elif op != "d":
                raise ValueError(f"unknown preprocess op {op}")
        return x

    def postprocess(self, prefix, ops, x, prev):
        for op in ops:
            if op == "a":
                x = (x + prev).astype(F32)
            elif op == "n":
                x = self.ln(x, prefix)
            elif op != "d":
                raise ValueError(f"unsupported postprocess op {op}")
        return x

    def embed(self, name, ids):
        return self.P(name).value[np.asarray(ids, dtype=np.int64)]

    # --- attention
    def split(self, x):  # [T, d] -> [H, T, dh]
        T = x.shape[0]
        return x.reshape(T, self.heads, -1).transpose(1, 0, 2)

    def attention(self, prefix, q_in, kh, vh):
        qh = self.split(self.affine(q_in, f"{prefix}_Wq", f"{prefix}_bq"))
        dk = qh.shape[-1]
        scale = F32(1) / np.sqrt(F32(dk))
        z = self.f.matmul_bt(qh, kh, scale)                # bdot(q, k, transB, scale) [H, Tq, Tk]
        w = self.f.softmax(z)                              # + mask (0 at batch size 1)
        o = self.f.matmul_bt(w, vh.transpose(0, 2, 1))     # bdot(w, v) [H, Tq, dh]
        o = o.transpose(1, 0, 2).reshape(q_in.shape[0], -1)
        return self.affine(o, f"{prefix}_Wo", f"{prefix}_bo")

    def kv(self, prefix, x):
        return (self.split(self.affine(x, f"{prefix}_Wk", f"{prefix}_bk")),
                self.split(self.affine(x, f"{prefix}_Wv", f"{prefix}_bv")))

    def layer_attention(self, prefix, x, kh, vh, q_pre=None):
        out = self.preprocess(prefix + "_Wo", self.pre, x)
        out = self.attention(prefix, out, kh, vh)
        return self.postprocess(prefix + "_Wo", self.post, out, x)

    def layer_ffn(self, prefix, x):
        out = self.preprocess(prefix + "_ffn", self.pre, x)
        for i in range(1, self.ffn_depth):
            out = self.dense(out, prefix, str(i), self.ffn_act)
        out = self.dense(out, prefix, str(self.ffn_depth))
        return self.postprocess(prefix + "_ffn", self.post, out, x)

    # --- encoder
    def encode(self, src_ids):
        x = self.embed(self.enc_emb, src_ids) * F32(math.sqrt(self.d))
        x = (x + sinusoidal(0, len(src_ids), self.d)).astype(F32)
        prev = x
        x = self.preprocess("encoder_emb", self.post_emb, x)
        for i in range(1, self.enc_depth + 1):
            p = f"encoder_l{i}_self"
            xin = self.preprocess(p + "_Wo", self.pre, x)
            kh, vh = self.kv(p, xin)
            out = self.attention(p, xin, kh, vh)
            x = self.postprocess(p + "_Wo", self.post, out, x)
            x = self.layer_ffn(f"encoder_l{i}_ffn", x)
        return self.postprocess("encoder_top", self.post_top, x, prev)

    # --- decoder
    def init_decoder(self, enc):
        st = {"pos": 0, "layers": []}
        for i in range(1, self.dec_depth + 1):
            kh, vh = self.kv(f"decoder_l{i}_context", enc)
            st["layers"].append({"ctx": (kh, vh), "c": np.zeros((1, self.d), F32),
                                 "avg": None, "keys_in": []})
        return st

    def autoreg_layer(self, i, ls, x, t):
        if self.autoreg == "self-attention":
            p = f"decoder_l{i}_self"
            xin = self.preprocess(p + "_Wo", self.pre, x)
            ls["keys_in"].append(xin)
            allx = np.concatenate(ls["keys_in"], axis=0)
            kh, vh = self.kv(p, allx)
            out = self.attention(p, xin, kh, vh)
            return self.postprocess(p + "_Wo", self.post, out, x)
        if self.autoreg == "rnn":
            p = f"decoder_l{i}_rnn"
            xin = self.preprocess(p, self.pre, x)
            xw = self.affine(xin, p + "_W")                 # dot(): no bias (fake bias when exact)
            f = self.f.sigmoid(self.affine(xin, p + "_Wf", p + "_bf"))
            c = (f * ls["c"] + (F32(1) - f) * xw).astype(F32)  # highway(c_prev, xW, f)
            ls["c"] = c
            return self.postprocess(p + "_ffn", self.post, relu(c), x)
        if self.autoreg == "average-attention":
            p = f"decoder_l{i}_aan"
            g = x if t == 0 else ((ls["avg"] * F32(t) + x) / F32(t + 1)).astype(F32)
            ls["avg"] = g
            y = self.preprocess(p + "_ffn", self.pre, g)
            act = self.f.act(self.cfg.get("transformer-aan-activation", "swish"))
            depth = int(self.cfg.get("transformer-aan-depth", 2))
            for j in range(1, depth):
                y = self.dense(y, p, str(j), act)
            if y.shape[-1] != self.d:
                y = self.dense(y, p, str(depth))
            if not self.cfg.get("transformer-aan-nogate", False):
                gi = self.dense(x, p, "i", self.f.sigmoid)
                gf = self.dense(y, p, "f", self.f.sigmoid)
                y = (gi * x + gf * y).astype(F32)
            return self.postprocess(p + "_ffn", self.post, y, x)
        raise ValueError(f"unknown transformer-decoder-autoreg {self.autoreg}")

    def decoder_step(self, st, prev_id):
        t = st["pos"]
        if prev_id is None:
            e = np.zeros((1, self.d), F32)
        else:
            e = self.embed(self.dec_emb, [prev_id])
        x = (e * F32(math.sqrt(self.d)) + sinusoidal(t, 1, self.d)).astype(F32)
        prev = x
        x = self.preprocess("decoder_emb", self.post_emb, x)
        for i in range(1, self.dec_depth + 1):
            ls = st["layers"][i - 1]
            x = self.autoreg_layer(i, ls, x, t)
            p = f"decoder_l{i}_context"
            kh, vh = ls["ctx"]
            x = self.layer_attention(p, x, kh, vh)
            x = self.layer_ffn(f"decoder_l{i}_ffn", x)
        x = self.postprocess("decoder_top", self.post_top, x, prev)
        st["pos"] = t + 1
        return x

    def output_matrix(self):
        w = self.P(self.out_w)
        return w.value if self.out_layout == "Vd" else w.value.T  # [V, d]

    def logits(self, h, cols=None):
        W = self.output_matrix()
        b = self.P(self.out_b).value.reshape(-1) if self.out_b else None
        wq = self.P(self.out_w)
        quantized_model = any(p.q is not None for p in self.params.values())
        if self.exact and quantized_model:
            # generic.cpp Output::applyAsLogits: float (dequantized) Wemb is re-quantized
            # with quantMult 127/max|W| (PrepareBTransposed), alpha from the model.
            if self._out_q is None:
                if wq.q is not None:  # untied intgemm output matrix (not produced by marian-conv in practice)
                    self._out_q = (wq.q if self.out_layout == "dV" else wq.q.T, wq.qmult)
                else:
                    qb = F32(127) / F32(np.abs(W).max())
                    bq = np.clip(np.rint((W * qb).astype(F32)), -127, 127).astype(np.int8).T.copy()  # [d, V]
                    self._out_q = (bq, qb)
            bq, qb = self._out_q
            a = self.params.get("none_QuantMultA") or self.params.get(self.out_w + "_QuantMultA")
            alpha = F32(a.value.reshape(-1)[0]) if a is not None else self.alpha("", h)
            if cols is not None:
                bsel, bb = bq[:, cols], (b[cols] if b is not None else None)
            else:
                bsel, bb = bq, b
            return int8_shift_affine(h, bsel, qb, alpha, bb, self.saturate)
        Wsel = W if cols is None else W[cols]
        y = (h @ Wsel.T).astype(F32)
        if b is not None:
            y = y + (b if cols is None else b[cols])
        return y.astype(F32)

    def translate_ids(self, src_ids, eos=0, unk=1, shortlist=None, shared=True,
                      max_length_factor=3.0, allow_unk=False):
        src = list(src_ids) + [eos]
        enc = self.encode(src)
        st = self.init_decoder(enc)
        cols = shortlist.generate(src, self.trg_vocab_size, shared) if shortlist is not None else None
        max_len = math.ceil(F32(max_length_factor) * F32(len(src)))
        out, prev = [], None
        for _ in range(max_len):
            h = self.decoder_step(st, prev)
            lg = self.logits(h, cols)[0]
            if not allow_unk:
                if cols is None:
                    lg[unk] = -np.inf
                else:
                    j = np.searchsorted(cols, unk)
                    if j < len(cols) and cols[j] == unk:
                        lg[j] = -np.inf
            k = int(np.argmax(lg))
            y = int(cols[k]) if cols is not None else k
            if y == eos:
                break
            out.append(y)
            prev = y
        return out


# ----------------------------------------------------------------------------- vocab

class YamlVocab:
    def __init__(self, path):
        import yaml

        m = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        self.tok2id = {str(k): int(v) for k, v in m.items()}
        self.id2tok = {v: k for k, v in self.tok2id.items()}
        self.eos = self.tok2id.get("</s>", 0)
        self.unk = self.tok2id.get("<unk>", 1)

    def encode(self, line):
        return [self.tok2id.get(t, self.unk) for t in line.split()]

    def decode(self, ids):
        return " ".join(self.id2tok[i] for i in ids)


class SpmVocab:
    def __init__(self, path):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.eos = self.sp.eos_id() if self.sp.eos_id() >= 0 else 0
        self.unk = self.sp.unk_id()

    def encode(self, line):
        return self.sp.encode(line)

    def decode(self, ids):
        return self.sp.decode(ids)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--vocab-spm")
    g.add_argument("--vocab-yml")
    ap.add_argument("--shortlist")
    ap.add_argument("--shortlist-shared", choices=["true", "false"], default="true",
                    help="add the source ids themselves (bergamot: source vocab == target vocab)")
    ap.add_argument("--config", help="package YAML (max-length-factor, allow-unk)")
    ap.add_argument("--max-length-factor", type=float, default=None)
    ap.add_argument("--allow-unk", action="store_true")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-sentences", type=int, default=None)
    ap.add_argument("--exact-int8", action="store_true")
    ap.add_argument("--no-saturation", action="store_true",
                    help="with --exact-int8: no pmaddubsw pair saturation (AVX512-VNNI behaviour)")
    ap.add_argument("--float-mode", choices=["wasm", "numpy"], default="wasm",
                    help="wasm: the float operation order of the bergamot WASM build (default); numpy: plain numpy")
    ap.add_argument("--input-ids", action="store_true", help="input lines are space-separated ids (no </s>)")
    ap.add_argument("--output-ids", action="store_true")
    args = ap.parse_args(argv)

    mlf, allow_unk = 3.0, args.allow_unk
    if args.config:
        import yaml

        pc = yaml.safe_load(Path(args.config).read_text())
        mlf = float(pc.get("max-length-factor", mlf))
        allow_unk = allow_unk or bool(pc.get("allow-unk", False))
    if args.max_length_factor is not None:
        mlf = args.max_length_factor

    model = MarianReference(args.model, exact_int8=args.exact_int8, saturate=not args.no_saturation,
                            float_mode=args.float_mode)
    vocab = SpmVocab(args.vocab_spm) if args.vocab_spm else (YamlVocab(args.vocab_yml) if args.vocab_yml else None)
    if vocab is None and not (args.input_ids and args.output_ids):
        ap.error("a vocabulary is needed unless --input-ids and --output-ids")
    sl = Shortlist(args.shortlist) if args.shortlist else None
    eos = vocab.eos if vocab else 0
    unk = vocab.unk if vocab else 1

    lines = Path(args.input).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if args.max_sentences is not None:
        lines = lines[:args.max_sentences]
    with open(args.output, "w", encoding="utf-8") as f:
        for line in lines:
            ids = [int(t) for t in line.split()] if args.input_ids else vocab.encode(line)
            if not ids:
                f.write("\n")
                continue
            out = model.translate_ids(ids, eos=eos, unk=unk, shortlist=sl,
                                      shared=args.shortlist_shared == "true",
                                      max_length_factor=mlf, allow_unk=allow_unk)
            f.write((" ".join(map(str, out)) if args.output_ids else vocab.decode(out)) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
