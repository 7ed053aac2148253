//! Multi-head attention kernels. The attention runs per query row over that row's own
//! keys, so no padding or mask is ever materialized (each sequence only sees its real
//! length); the projections around it are the layers' matrix products.
use super::isa::{self, dispatch_isa};
use super::ops;

mod kv_view;
use kv_view::{rows_ahead, Cache, Eight, KEYS_AHEAD};
pub use kv_view::{prefetch_rows, KvView};

/// `scores[h * len + j] = scale * dot(q_h, key_j)` for every head and key, in the order of
/// MKL's sgemm kernels for CTranslate2's batched `Q·Kᵀ` (measured against the MKL bundled
/// with CTranslate2 4.8.5 on an AVX-512 machine). With several query rows (the encoder)
/// each dot is a sequential chain of FMAs over the head dimension. With one query row (a
/// decoder step) and 64-wide heads, MKL's matrix-vector path runs keys by groups of 4 with
/// 16 lanes (`single_query_dot`), and the last `padded % 4` keys with another 16-lane order
/// (`single_query_dot_rest`). `padded` is the key count of CTranslate2's product (the
/// batch's padded source length in cross-attention), which decides where the groups end.
/// Each score depends on its own key only: the keys go block by block, all heads of a
/// block at once (its rows are read once, in order).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn key_scores(
    query: &[f32],
    keys: &KvView,
    values: &KvView,
    len: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    single_query: bool,
    padded: usize,
    scores: &mut [f32],
) {
    if single_query && head_dim == 64 {
        let grouped = padded / 4 * 4;
        #[cfg(target_arch = "x86_64")]
        let avx512 = isa::current().float_level() == isa::FloatLevel::Avx512;
        #[cfg(target_arch = "x86_64")]
        let avx2 = isa::current().float_level() == isa::FloatLevel::Avx2;
        let width = num_heads * head_dim;
        // Key by key (eight at a time among the grouped keys), all heads at once. A decoder
        // step's keys and values are usually in memory only (the weights streamed since the
        // last step evicted them), and a key's heads take too little time to hide the
        // latency: each key asks for a later key's row into L1 (26 keys from memory: 6.7 ->
        // 5.0 us at AVX2), and for the keys and values `rows_ahead` later into L2 (see
        // `prefetch_rows`).
        // The caller asked for the first rows (`prefetch_rows`); the later ones as far ahead.
        let ahead = rows_ahead(width);
        // (A plain fn: as a closure it was left as a call.)
        #[inline(always)]
        fn prefetch(keys: &KvView, values: &KvView, j: usize, ahead: usize, len: usize, width: usize) {
            keys.prefetch(j + KEYS_AHEAD, len, width, Cache::L1);
            keys.prefetch(j + ahead, len, width, Cache::L2);
            values.prefetch(j + ahead, len, width, Cache::L2);
        }
        for (first, count, block) in keys.blocks(len) {
            let mut i = 0;
            while i < count {
                let j = first + i;
                // Eight grouped keys of a head at once: their dots side by side, each folded
                // by the same tree of additions (`x86::single_query_dots8_*`).
                #[cfg(target_arch = "x86_64")]
                if (avx512 || avx2) && i + 8 <= count && j + 8 <= grouped {
                    for j in j..j + 8 {
                        prefetch(keys, values, j, ahead, len, width);
                    }
                    for (h, q) in query.chunks_exact(64).take(num_heads).enumerate() {
                        let k: [&[f32]; 8] = std::array::from_fn(|l| block.head(i + l, h, head_dim));
                        // SAFETY: the level is supported (isa::current); each slice holds 64 values.
                        let dots = unsafe {
                            if avx512 {
                                x86::single_query_dots8_avx512(&q[..64], k)
                            } else {
                                x86::single_query_dots8_avx2(&q[..64], k)
                            }
                        };
                        for (s, d) in scores[h * len + j..h * len + j + 8].iter_mut().zip(dots) {
                            *s = d * scale;
                        }
                    }
                    i += 8;
                    continue;
                }
                prefetch(keys, values, j, ahead, len, width);
                for (h, q) in query.chunks_exact(64).take(num_heads).enumerate() {
                    let k = block.head(i, h, head_dim);
                    let s = if j < grouped {
                        #[cfg(target_arch = "x86_64")]
                        if avx512 {
                            // SAFETY: the level is supported (isa::current); both slices hold 64 values.
                            scores[h * len + j] = unsafe { x86::single_query_dot_avx512(&q[..64], &k[..64]) } * scale;
                            continue;
                        } else if avx2 {
                            // SAFETY: as above.
                            scores[h * len + j] = unsafe { x86::single_query_dot_avx2(&q[..64], &k[..64]) } * scale;
                            continue;
                        }
                        single_query_dot(q, k)
                    } else {
                        single_query_dot_rest(q, k, j % 2 == 0)
                    };
                    scores[h * len + j] = s * scale;
                }
                i += 1;
            }
        }
        return;
    }
    for (first, count, keys) in keys.groups(len) {
        for (h, q) in query.chunks_exact(head_dim).take(num_heads).enumerate() {
            let scores = &mut scores[h * len + first..][..count];
            if count == 8 {
                // The eight dots side by side: independent chains instead of one long dependent one.
                let k: [&[f32]; 8] = std::array::from_fn(|l| keys.head(l, h, head_dim));
                let mut acc = [0.0f32; 8];
                for (p, &qp) in q.iter().enumerate() {
                    for l in 0..8 {
                        acc[l] = qp.mul_add(k[l][p], acc[l]);
                    }
                }
                for l in 0..8 {
                    scores[l] = acc[l] * scale;
                }
                continue;
            }
            for (i, s) in scores.iter_mut().enumerate() {
                let k = keys.head(i, h, head_dim);
                *s = q.iter().zip(k).fold(0.0f32, |acc, (&a, &b)| a.mul_add(b, acc)) * scale;
            }
        }
    }
}

/// Sum of 16 lanes by halving: lanes 8 apart, then 4, 2, 1 (a 512-bit horizontal add).
#[inline(always)]
fn fold16(r: &[f32; 16]) -> f32 {
    let h8: [f32; 8] = std::array::from_fn(|l| r[l] + r[l + 8]);
    let h4: [f32; 4] = std::array::from_fn(|l| h8[l] + h8[l + 4]);
    (h4[0] + h4[2]) + (h4[1] + h4[3])
}

/// MKL's dot of 64 for one query row, keys in groups of 4: the first product starts lane 0,
/// elements 1..49 go through 16 FMA lanes, which are folded; the sum starts lane 0 of a
/// second set of lanes for elements 49..64, folded in turn.
#[inline(always)]
fn single_query_dot(q: &[f32], k: &[f32]) -> f32 {
    // Fixed-size slices, so each 16-element step compiles to one full-width vector FMA.
    let (q, k): (&[f32; 64], &[f32; 64]) = (q[..64].try_into().unwrap(), k[..64].try_into().unwrap());
    let lanes = |x: &[f32; 64], from: usize| -> [f32; 16] { std::array::from_fn(|l| x[(from + l).min(63)]) };
    // (lane 15 of the tail reads element 63 twice but is never accumulated)
    let mut acc = [0.0f32; 16];
    acc[0] = q[0] * k[0];
    for t in 0..3 {
        let (qs, ks) = (lanes(q, 1 + 16 * t), lanes(k, 1 + 16 * t));
        for l in 0..16 {
            acc[l] = qs[l].mul_add(ks[l], acc[l]);
        }
    }
    let mut tail = [0.0f32; 16];
    tail[0] = fold16(&acc);
    let (qs, ks) = (lanes(q, 49), lanes(k, 49));
    for l in 0..15 {
        tail[l] = qs[l].mul_add(ks[l], tail[l]);
    }
    fold16(&tail)
}

#[cfg(target_arch = "x86_64")]
mod x86;

/// MKL's dot of 64 for one query row, the last `padded % 4` keys: elements 1..64 go to lane
/// `p % 16` of 16 accumulators, folded, plus the first product. Elements 1..17, 33..64
/// are fused multiply-adds; elements 17..33 too for odd keys, but for even keys they are
/// rounded products added.
#[inline(always)]
fn single_query_dot_rest(q: &[f32], k: &[f32], even: bool) -> f32 {
    let (q, k) = (&q[..64], &k[..64]);
    let mut acc = [0.0f32; 16];
    for p in 1..64 {
        let l = p % 16;
        acc[l] = if even && (17..33).contains(&p) { acc[l] + q[p] * k[p] } else { q[p].mul_add(k[p], acc[l]) };
    }
    fold16(&acc) + q[0] * k[0]
}

/// `o = Σ_j probs[j] · value_j` for one query row and 64-wide heads, in the order of MKL's
/// matrix-vector path for CTranslate2's batched `P·V` (`padded` keys, the last
/// `padded - probs.len()` of which are padding with probability 0, which MKL still
/// walks). Fewer than 8 keys: one FMA chain in key order. Otherwise keys go by blocks of
/// 8: the first block is `G(0) + G(4)`, where `G(b) = (p[b]·v[b] ⊕ p[b+2]·v[b+2]) +
/// (p[b+1]·v[b+1] ⊕ p[b+3]·v[b+3])` (⊕: fused onto the rounded later product); each
/// further block adds keys b+6, b+4 (fused), then `p[b+5]·v[b+5] ⊕ p[b+7]·v[b+7]`, then
/// `G(b)`; the last `padded % 8` keys are fused in order.
#[inline(always)]
fn single_query_values(probs: &[f32], values: &KvView, h: usize, padded: usize, o: &mut [f32]) {
    // Plain inline functions rather than closures: closures would not inherit the target
    // features of the dispatch_isa! copy (calling the software fmaf). They take the keys
    // of one group of 8 (`eight`).
    const D: usize = 64;
    /// The probabilities and values of keys `b..b + 8` (`b` a multiple of 8); the keys
    /// past `probs` are padding.
    #[inline(always)]
    fn eight<'a>(probs: &'a [f32], values: &KvView<'a>, b: usize) -> (&'a [f32], Eight<'a>) {
        let len = probs.len();
        (&probs[b.min(len)..(b + 8).min(len)], values.eight(b))
    }
    /// acc += p[i] · v[i] (fused); nothing for a padding key.
    #[inline(always)]
    fn fuse(probs: &[f32], values: &Eight, h: usize, i: usize, acc: &mut [f32; D]) {
        if i < probs.len() {
            let (p, v) = (probs[i], &values.head(i, h, D)[..D]);
            for c in 0..D {
                acc[c] = p.mul_add(v[c], acc[c]);
            }
        }
    }
    /// p[i] · v[i] rounded (zero for a padding key).
    #[inline(always)]
    fn product(probs: &[f32], values: &Eight, h: usize, i: usize) -> [f32; D] {
        let mut out = [0.0; D];
        if i < probs.len() {
            let (p, v) = (probs[i], &values.head(i, h, D)[..D]);
            for c in 0..D {
                out[c] = p * v[c];
            }
        }
        out
    }
    #[inline(always)]
    fn add(acc: &mut [f32; D], x: &[f32; D]) {
        for c in 0..D {
            acc[c] += x[c];
        }
    }
    #[inline(always)]
    fn group(probs: &[f32], values: &Eight, h: usize, b: usize) -> [f32; D] {
        let mut even = product(probs, values, h, b + 2);
        fuse(probs, values, h, b, &mut even);
        let mut odd = product(probs, values, h, b + 3);
        fuse(probs, values, h, b + 1, &mut odd);
        add(&mut even, &odd);
        even
    }
    let len = probs.len();
    let o: &mut [f32; D] = (&mut o[..D]).try_into().unwrap();
    let (p, rows) = eight(probs, values, 0);
    if padded < 8 {
        o.fill(0.0);
        for i in 0..len {
            fuse(p, &rows, h, i, o);
        }
        return;
    }
    *o = group(p, &rows, h, 0);
    add(o, &group(p, &rows, h, 4));
    let blocks = padded / 8;
    for b in (8..blocks * 8).step_by(8) {
        let (p, rows) = eight(probs, values, b);
        fuse(p, &rows, h, 6, o);
        fuse(p, &rows, h, 4, o);
        let mut pair = product(p, &rows, h, 7);
        fuse(p, &rows, h, 5, &mut pair);
        add(o, &pair);
        add(o, &group(p, &rows, h, 0));
    }
    let (p, rows) = eight(probs, values, blocks * 8);
    for i in 0..len.saturating_sub(blocks * 8) {
        fuse(p, &rows, h, i, o);
    }
}

/// One query row attending over `len` keys/values, all heads; writes [num_heads * head_dim].
/// `single_query`: the row is a decoder step (CTranslate2 multiplies one query row at a
/// time there, which MKL sums in another order).
/// The same loops are compiled for AVX-512 and AVX2 and picked by `isa::current()`.
#[allow(clippy::too_many_arguments)]
pub fn attend_row(
    query: &[f32],
    keys: KvView,
    values: KvView,
    len: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    single_query: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_row_padded(query, keys, values, len, len, num_heads, head_dim, scale, single_query, scores, out)
}

/// `attend_row` for a row whose keys CTranslate2 pads to `padded` (≥ `len`) positions:
/// in cross-attention, the longest source length of the batch the row's example was
/// translated in. Padding changes no value, only the order MKL sums decoder-step products
/// in, which this reproduces.
#[allow(clippy::too_many_arguments)]
pub fn attend_row_padded(
    query: &[f32],
    keys: KvView,
    values: KvView,
    len: usize,
    padded: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    single_query: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let padded = padded.max(len);
    dispatch_isa!(attend_row_generic(
        query: &[f32],
        keys: KvView,
        values: KvView,
        len: usize,
        padded: usize,
        num_heads: usize,
        head_dim: usize,
        scale: f32,
        single_query: bool,
        scores: &mut Vec<f32>,
        out: &mut [f32]
    ) -> ())
}

/// CTranslate2's alignment attention of one decoder query row: its attention
/// probabilities over `len` keys (padded to `padded` as in `attend_row_padded`) averaged
/// over heads `0..heads`, into `out[..len]`. The scores are those `attend_row_padded`
/// normalizes; only the heads asked for are computed.
#[allow(clippy::too_many_arguments)]
pub fn alignment_weights(query: &[f32], keys: KvView, len: usize, padded: usize, heads: usize, head_dim: usize, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    let padded = padded.max(len);
    scores.resize(heads * len, 0.0);
    // (The dispatch returns from here: it comes last.)
    dispatch_isa!(alignment_weights_generic(
        query: &[f32],
        keys: KvView,
        len: usize,
        padded: usize,
        heads: usize,
        head_dim: usize,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32]
    ) -> ())
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn alignment_weights_generic(query: &[f32], keys: KvView, len: usize, padded: usize, heads: usize, head_dim: usize, scale: f32, scores: &mut [f32], out: &mut [f32]) {
    // The keys' view stands in for the values', which only the prefetcher reads.
    key_scores(query, &keys, &keys, len, heads, head_dim, scale, true, padded, scores);
    scores.chunks_exact_mut(len.max(1)).for_each(ops::softmax);
    let out = &mut out[..len];
    out.fill(0.0);
    for head in scores.chunks_exact(len.max(1)).take(heads) {
        for (o, &p) in out.iter_mut().zip(head) {
            *o += p;
        }
    }
    if heads > 1 {
        out.iter_mut().for_each(|o| *o /= heads as f32);
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_row_generic(
    query: &[f32],
    keys: KvView,
    values: KvView,
    len: usize,
    padded: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    single_query: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    // Head h's scores at [h * len..]; each head is normalized on its own.
    scores.resize(num_heads * len, 0.0);
    key_scores(query, &keys, &values, len, num_heads, head_dim, scale, single_query, padded, scores);
    scores.chunks_exact_mut(len.max(1)).for_each(ops::softmax);
    let out = &mut out[..num_heads * head_dim];
    if single_query && head_dim == 64 {
        // Head by head: each head's sum stays in registers across the keys.
        for (h, o) in out.chunks_exact_mut(64).enumerate() {
            single_query_values(&scores[h * len..(h + 1) * len], &values, h, padded, o);
        }
        return;
    }
    // One FMA per key in key order (MKL's order for the batched `P·V` with several query rows).
    weighted_values::<true>(scores, &values, len, head_dim, out);
}

/// Several query rows attending over the same `len` keys/values, each as `attend_row` with
/// several query rows computes it (CTranslate2's batched product): the encoder's
/// self-attention (every row of a sequence) and beam search's cross-attention (an
/// example's hypotheses). Row `r`'s query is at `queries[r * stride..]`, its output at
/// `out[r * num_heads * head_dim..]`. The dots run as vectors whose lanes are each still
/// the sequential FMA chain in element order that `key_scores` computes, with the same
/// bits: with 8 rows or more, each head's keys are transposed once and eight keys fill a
/// vector (2.1x faster than row by row on a 26-token sequence, which was 4% of int8 greedy
/// decoding at AVX2); with fewer, the queries are transposed four rows at a time and one
/// key element multiplies the four rows (beam search's hypotheses; it was a scalar FMA per row).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    queries: &[f32],
    stride: usize,
    rows: usize,
    keys: KvView,
    values: KvView,
    len: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
) {
    dispatch_isa!(attend_rows_generic(
        queries: &[f32],
        stride: usize,
        rows: usize,
        keys: KvView,
        values: KvView,
        len: usize,
        num_heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut [f32]
    ) -> ())
}

/// The query rows of one chunk of `attend_rows`, and where their scores go.
struct RowChunk<'a> {
    queries: &'a [f32],
    stride: usize,
    first: usize,
    rows: usize,
    /// Row `r`'s head `h` at `[(r * num_heads + h) * len..][..len]`.
    scores: &'a mut [f32],
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_rows_generic(
    queries: &[f32],
    stride: usize,
    rows: usize,
    keys: KvView,
    values: KvView,
    len: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
) {
    let width = num_heads * head_dim;
    let shape = (len, num_heads, head_dim, scale);
    let by_keys = rows >= 8;
    // Rows per chunk: two by 32 transposed keys make 8 independent vector chains (one alone
    // would wait on the FMA latency; an odd last row is computed twice), or the four rows of
    // a transposed query block.
    let chunk_rows = if by_keys { 2 } else { 4 };
    let mut transposed = if by_keys { transpose_keys(&keys, shape) } else { vec![0.0f32; width * 4] };
    let mut scores = vec![0.0f32; chunk_rows * num_heads * len];
    for first in (0..rows).step_by(chunk_rows) {
        let count = chunk_rows.min(rows - first);
        let chunk = RowChunk { queries, stride, first, rows: count, scores: &mut scores };
        if by_keys {
            scores_by_transposed_keys(&transposed, chunk, shape);
        } else {
            scores_by_transposed_queries(&mut transposed, &keys, chunk, shape);
        }
        for (r, out) in out[first * width..(first + count) * width].chunks_exact_mut(width).enumerate() {
            let scores = &mut scores[r * num_heads * len..(r + 1) * num_heads * len];
            scores.chunks_exact_mut(len.max(1)).for_each(ops::softmax);
            weighted_values::<true>(scores, &values, len, head_dim, out);
        }
    }
}

/// Each head's keys as `[head_dim][len rounded up to 8]` (head h at `[h * head_dim *
/// lanes..]`, the padding zero).
#[inline(always)]
fn transpose_keys(keys: &KvView, (len, num_heads, head_dim, _): (usize, usize, usize, f32)) -> Vec<f32> {
    let lanes = len.div_ceil(8) * 8;
    let mut transposed = vec![0.0f32; num_heads * head_dim * lanes];
    for (first, count, rows) in keys.blocks(len) {
        for i in 0..count {
            for h in 0..num_heads {
                let head = &mut transposed[h * head_dim * lanes..(h + 1) * head_dim * lanes];
                for (p, &v) in rows.head(i, h, head_dim).iter().enumerate() {
                    head[p * lanes + first + i] = v;
                }
            }
        }
    }
    transposed
}

/// The scores of (at most) two rows against the keys of `transpose_keys`, 32 at a time.
#[inline(always)]
fn scores_by_transposed_keys(transposed: &[f32], chunk: RowChunk, (len, num_heads, head_dim, scale): (usize, usize, usize, f32)) {
    let lanes = len.div_ceil(8) * 8;
    let RowChunk { queries, stride, first, rows, scores } = chunk;
    for h in 0..num_heads {
        let head = &transposed[h * head_dim * lanes..(h + 1) * head_dim * lanes];
        let q = |r: usize| &queries[(first + r) * stride + h * head_dim..(first + r) * stride + (h + 1) * head_dim];
        for g in (0..lanes).step_by(32) {
            let (q0, q1) = (q(0), q(rows - 1));
            let acc = match ((lanes - g) / 8).min(4) {
                1 => widen(key_dots::<1>(head, lanes, g, q0, q1)),
                2 => widen(key_dots::<2>(head, lanes, g, q0, q1)),
                3 => widen(key_dots::<3>(head, lanes, g, q0, q1)),
                _ => key_dots::<4>(head, lanes, g, q0, q1),
            };
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let scores = &mut scores[(r * num_heads + h) * len..(r * num_heads + h + 1) * len];
                for (s, a) in scores[g.min(len)..].iter_mut().zip(acc.iter().flatten()) {
                    *s = a * scale;
                }
            }
        }
    }
}

/// The scores of (at most) four rows, transposed into `transposed` (`[(h * head_dim + p) *
/// 4 + r]`, rows past the chunk zero), against the keys in groups of 8.
#[inline(always)]
fn scores_by_transposed_queries(transposed: &mut [f32], keys: &KvView, chunk: RowChunk, (len, num_heads, head_dim, scale): (usize, usize, usize, f32)) {
    let width = num_heads * head_dim;
    let RowChunk { queries, stride, first, rows, scores } = chunk;
    // Whether the level has 128-bit FMAs (`four_row_dots`), looked up once.
    let vector = cfg!(target_arch = "x86_64") && isa::current().float_level() != isa::FloatLevel::Scalar;
    transposed.fill(0.0);
    for r in 0..rows {
        for (e, &v) in queries[(first + r) * stride..(first + r) * stride + width].iter().enumerate() {
            transposed[e * 4 + r] = v;
        }
    }
    for (first_key, count, group) in keys.groups(len) {
        for h in 0..num_heads {
            let q = &transposed[h * head_dim * 4..(h + 1) * head_dim * 4];
            let acc = four_row_dots(q, &group, count, h, head_dim, vector);
            for (i, acc) in acc.iter().take(count).enumerate() {
                for (r, &a) in acc.iter().take(rows).enumerate() {
                    scores[(r * num_heads + h) * len + first_key + i] = a * scale;
                }
            }
        }
    }
}

/// The dots of four transposed query rows (`q`: `[head_dim][4]`) with keys `0..K` of a
/// group, head `h`: K independent 4-lane chains.
#[inline(always)]
fn row_dots<const K: usize>(q: &[f32], keys: &Eight, h: usize, head_dim: usize) -> [[f32; 4]; 8] {
    let k: [&[f32]; K] = std::array::from_fn(|i| &keys.head(i, h, head_dim)[..head_dim]);
    let mut acc = [[0.0f32; 4]; 8];
    for (p, q) in q.chunks_exact(4).take(head_dim).enumerate() {
        for i in 0..K {
            let kp = k[i][p];
            for r in 0..4 {
                acc[i][r] = q[r].mul_add(kp, acc[i][r]);
            }
        }
    }
    acc
}

/// `row_dots` for the `count` (<= 8) keys of a group, with 128-bit FMAs if `vector` (the
/// level has AVX2 and FMA at least).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn four_row_dots(q: &[f32], keys: &Eight, count: usize, h: usize, head_dim: usize, vector: bool) -> [[f32; 4]; 8] {
    #[cfg(target_arch = "x86_64")]
    if vector {
        let k = |i: usize| &keys.head(i, h, head_dim)[..head_dim];
        // SAFETY: `vector`: the level is supported (isa::current) and has AVX2 and FMA.
        unsafe {
            return match count {
                8 => x86::row_dots4::<8>(q, std::array::from_fn(k), head_dim),
                7 => x86::row_dots4::<7>(q, std::array::from_fn(k), head_dim),
                6 => x86::row_dots4::<6>(q, std::array::from_fn(k), head_dim),
                5 => x86::row_dots4::<5>(q, std::array::from_fn(k), head_dim),
                4 => x86::row_dots4::<4>(q, std::array::from_fn(k), head_dim),
                3 => x86::row_dots4::<3>(q, std::array::from_fn(k), head_dim),
                2 => x86::row_dots4::<2>(q, std::array::from_fn(k), head_dim),
                _ => x86::row_dots4::<1>(q, std::array::from_fn(k), head_dim),
            };
        }
    }
    if count == 8 {
        row_dots::<8>(q, keys, h, head_dim)
    } else {
        row_dots_few(q, keys, count, h, head_dim)
    }
}

/// `row_dots` for the `count` (< 8) keys of a last group.
#[inline(always)]
fn row_dots_few(q: &[f32], keys: &Eight, count: usize, h: usize, head_dim: usize) -> [[f32; 4]; 8] {
    match count {
        1 => row_dots::<1>(q, keys, h, head_dim),
        2 => row_dots::<2>(q, keys, h, head_dim),
        3 => row_dots::<3>(q, keys, h, head_dim),
        4 => row_dots::<4>(q, keys, h, head_dim),
        5 => row_dots::<5>(q, keys, h, head_dim),
        6 => row_dots::<6>(q, keys, h, head_dim),
        _ => row_dots::<7>(q, keys, h, head_dim),
    }
}

/// The dots of queries `q0` and `q1` with the keys `g..g + 8 G` of one head's transposed
/// keys (`[head_dim][lanes]`): 2 G independent vectors of sequential FMA chains.
#[inline(always)]
fn key_dots<const G: usize>(head: &[f32], lanes: usize, g: usize, q0: &[f32], q1: &[f32]) -> [[[f32; 8]; G]; 2] {
    let mut acc = [[[0.0f32; 8]; G]; 2];
    for (p, (&a, &b)) in q0.iter().zip(q1).enumerate() {
        let k = &head[p * lanes + g..p * lanes + g + 8 * G];
        for i in 0..G {
            for l in 0..8 {
                acc[0][i][l] = a.mul_add(k[8 * i + l], acc[0][i][l]);
                acc[1][i][l] = b.mul_add(k[8 * i + l], acc[1][i][l]);
            }
        }
    }
    acc
}

/// `key_dots` of fewer groups padded to four.
#[inline(always)]
fn widen<const G: usize>(acc: [[[f32; 8]; G]; 2]) -> [[[f32; 8]; 4]; 2] {
    let mut out = [[[0.0f32; 8]; 4]; 2];
    for r in 0..2 {
        out[r][..G].copy_from_slice(&acc[r]);
    }
    out
}

/// `out_h = Σ_j scores[h * len + j] · value_j` for every head, each a sequential sum in key
/// order: of fused multiply-adds (`FUSED`), or of rounded products. With AVX2 and heads a
/// multiple of 32 wide, head by head with the sums in registers (`x86::head_values`; with
/// `x86::row_dots4`, `attend_rows` went from 4.9% to 2.5% of int8 beam 4 at AVX2 on a Zen 4,
/// +2.3% tokens/s); otherwise the keys go block by block, all heads of a block at once.
#[inline(always)]
fn weighted_values<const FUSED: bool>(scores: &[f32], values: &KvView, len: usize, head_dim: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if head_dim.is_multiple_of(32) && isa::current().float_level() != isa::FloatLevel::Scalar {
        for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
            let probs = &scores[h * len..(h + 1) * len];
            // SAFETY: the level (AVX2 and FMA at least) is supported (isa::current).
            unsafe {
                if head_dim.is_multiple_of(64) {
                    x86::head_values::<FUSED, 8>(probs, values, len, h, head_dim, o);
                } else {
                    x86::head_values::<FUSED, 4>(probs, values, len, h, head_dim, o);
                }
            }
        }
        return;
    }
    out.fill(0.0);
    for (first, count, values) in values.blocks(len) {
        for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
            for (i, &p) in scores[h * len + first..][..count].iter().enumerate() {
                let v = values.head(i, h, head_dim);
                if FUSED {
                    o.iter_mut().zip(v).for_each(|(o, &v)| *o = p.mul_add(v, *o));
                } else {
                    o.iter_mut().zip(v).for_each(|(o, &v)| *o += p * v);
                }
            }
        }
    }
}

/// One query row attending over `len` keys/values, all heads, in Marian's order as the
/// Bergamot engine (Marian's WASM build, whose float GEMM is Eigen 3.3's) computes it:
/// every `q·k` and every `Σ p·v` is a sequential sum of rounded products (no fused
/// multiply-adds), scaled after; except that Eigen's kernel sums the keys from `peeled`
/// on (the keys after the last multiple of 4, for the query rows of the batch's first
/// multiple of 4) as four interleaved partial sums `(s0 + s1) + (s2 + s3)`, then the
/// rest of the head dimension. `peeled = usize::MAX`: no such keys (a single query row).
#[allow(clippy::too_many_arguments)]
pub fn attend_row_sequential(
    query: &[f32],
    keys: KvView,
    values: KvView,
    len: usize,
    peeled: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    // Head h's scores at [h * len..], the keys in groups of 8 for all heads at once (each
    // score depends on its own key only).
    scores.resize(num_heads * len, 0.0);
    for (first, count, keys) in keys.groups(len) {
        for (h, q) in query.chunks_exact(head_dim).take(num_heads).enumerate() {
            group_sequential_scores(q, &keys, first, peeled, h, head_dim, scale, &mut scores[h * len + first..][..count]);
        }
    }
    scores.chunks_exact_mut(len.max(1)).for_each(ops::softmax);
    weighted_values::<false>(scores, &values, len, head_dim, &mut out[..num_heads * head_dim]);
}

/// `attend_row_sequential`'s scores for one head and group of keys, the first of which is
/// key `first`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn group_sequential_scores(q: &[f32], keys: &Eight, first: usize, peeled: usize, h: usize, head_dim: usize, scale: f32, scores: &mut [f32]) {
    if scores.len() == 8 && first + 8 <= peeled {
        // The eight dots side by side, each still summed in its own sequential order:
        // independent chains instead of one long dependent one.
        let k: [&[f32]; 8] = std::array::from_fn(|l| keys.head(l, h, head_dim));
        let mut acc = [0.0f32; 8];
        for (p, &qp) in q.iter().enumerate() {
            for l in 0..8 {
                acc[l] += qp * k[l][p];
            }
        }
        for l in 0..8 {
            scores[l] = acc[l] * scale;
        }
        return;
    }
    for (i, s) in scores.iter_mut().enumerate() {
        let k = keys.head(i, h, head_dim);
        let dot = if first + i >= peeled {
            let whole = head_dim / 4 * 4;
            let mut partial = [0.0f32; 4];
            for (i, (&a, &b)) in q[..whole].iter().zip(&k[..whole]).enumerate() {
                partial[i % 4] += a * b;
            }
            let mut sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
            for (&a, &b) in q[whole..].iter().zip(&k[whole..head_dim]) {
                sum += a * b;
            }
            sum
        } else {
            q.iter().zip(k).fold(0.0f32, |acc, (&a, &b)| acc + a * b)
        };
        *s = dot * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::isa;

    fn values(seed: u32, n: usize) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 8) as f32 / (1 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The explicit AVX2 and AVX-512 one-key dots give the portable one's bits.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn explicit_dots_are_bit_identical_to_the_portable_one() {
        #[allow(clippy::type_complexity)]
        let kernels: [(isa::Isa, unsafe fn(&[f32], &[f32]) -> f32); 2] =
            [(isa::Isa::Avx2, x86::single_query_dot_avx2), (isa::Isa::Avx512Bw, x86::single_query_dot_avx512)];
        for (level, dot) in kernels.into_iter().filter(|(level, _)| level.is_supported()) {
            for seed in 0..2000 {
                let (q, k) = (values(seed, 64), values(seed + 7777, 64));
                // SAFETY: the level is supported (filtered above).
                let fast = unsafe { dot(&q, &k) };
                assert_eq!(fast.to_bits(), single_query_dot(&q, &k).to_bits(), "{level:?} seed {seed}");
            }
        }
    }

    /// Eight keys' dots folded together give each key's bits of the one-key dot, at AVX2 and
    /// AVX-512 (zeros, signs and magnitudes mixed: the products of values in [-1, 1), some
    /// keys scaled up or zeroed so that sums cancel and round differently).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn eight_keys_at_once_are_bit_identical_to_one_at_a_time() {
        #[allow(clippy::type_complexity)]
        let kernels: [(isa::Isa, unsafe fn(&[f32], [&[f32]; 8]) -> [f32; 8]); 2] =
            [(isa::Isa::Avx2, x86::single_query_dots8_avx2), (isa::Isa::Avx512Bw, x86::single_query_dots8_avx512)];
        for (level, dots8) in kernels.into_iter().filter(|(level, _)| level.is_supported()) {
            for seed in 0..500u32 {
                let q = values(seed, 64);
                let keys: Vec<Vec<f32>> = (0..8u32)
                    .map(|l| {
                        let mut k = values(seed * 8 + l + 9999, 64);
                        match (seed + l) % 5 {
                            0 => k.iter_mut().for_each(|v| *v *= 1e4),
                            1 => k[..32].fill(0.0),
                            2 => k.iter_mut().zip(&q).for_each(|(v, &x)| *v = if x != 0.0 { 1.0 / x } else { 0.0 }),
                            _ => {}
                        }
                        k
                    })
                    .collect();
                let k: [&[f32]; 8] = std::array::from_fn(|l| &keys[l][..]);
                // SAFETY: the level is supported (filtered above); every slice holds 64 values.
                let got = unsafe { dots8(&q, k) };
                for l in 0..8 {
                    assert_eq!(got[l].to_bits(), single_query_dot(&q, &keys[l]).to_bits(), "{level:?} seed {seed} key {l}");
                }
            }
        }
    }

    /// Keys and values read from blocks (the decoder's paged cache) give the same bits as
    /// from one contiguous sequence, on every ISA and in every kernel.
    #[test]
    fn paged_views_read_what_contiguous_ones_do() {
        let (heads, d) = (2, 64);
        let width = 2 * heads * d;
        for shift in [2, 3, 4, 5] {
            for len in [1, 5, 8, 9, 16, 17, 31, 40] {
                let q = values(len as u32, heads * d);
                let kv = values(300 + len as u32, len * width);
                let owned: Vec<Vec<f32>> = kv.chunks(width << shift).map(|b| b.to_vec()).collect();
                let blocks: Vec<&[f32]> = owned.iter().map(|b| &b[..]).collect();
                let kv = &kv[..];
                let contiguous = (KvView::contiguous(&kv, width, 0), KvView::contiguous(&kv, width, heads * d));
                let paged = (KvView::paged(&blocks, shift, width, 0), KvView::paged(&blocks, shift, width, heads * d));
                let run = |level, (keys, vals): (KvView, KvView), kernel: usize| {
                    let mut out = vec![0.0f32; heads * d];
                    let scores = &mut Vec::new();
                    isa::with_isa(level, || match kernel {
                        0 => attend_row(&q, keys, vals, len, heads, d, 0.125, true, scores, &mut out),
                        1 => attend_row(&q, keys, vals, len, heads, d, 0.125, false, scores, &mut out),
                        2 => attend_row_padded(&q, keys, vals, len, len + 11, heads, d, 0.125, true, scores, &mut out),
                        _ => attend_row_sequential(&q, keys, vals, len, len / 4 * 4, heads, d, 0.125, scores, &mut out),
                    });
                    out
                };
                for kernel in 0..4 {
                    // Every level's vector code reads paged blocks as the portable code does.
                    let portable = run(isa::Isa::Scalar, contiguous, kernel);
                    for level in isa::available() {
                        let (a, b) = (run(level, contiguous, kernel), run(level, paged, kernel));
                        assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?} shift {shift} len {len} kernel {kernel}");
                        assert!(a.iter().zip(&portable).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?} len {len} kernel {kernel}: not the portable result");
                    }
                }
            }
        }
    }

    /// Several query rows over shared keys give each row the bits of `attend_row` with
    /// several query rows, on every ISA: a sequence's own rows (the encoder, queries at a
    /// stride, 8 rows or more taking the transposed keys) and an example's beam rows (fewer
    /// than 8 taking transposed queries, 8 the keys).
    #[test]
    fn several_rows_are_row_attention_bit_for_bit() {
        for (heads, d) in [(2, 64), (3, 24), (2, 32)] {
            let width = heads * d;
            let sequences = [1, 5, 8, 9, 17, 26].map(|len| (len, len, true));
            let beams = [(1, 1), (2, 5), (4, 8), (4, 26), (5, 9), (8, 17), (3, 40)].map(|(rows, len)| (rows, len, false));
            for (rows, len, sequence) in sequences.into_iter().chain(beams) {
                // A sequence's rows as the encoder lays them out, [query | key | value]; beam
                // rows' queries apart from the [key | value] rows they share.
                let (kv, beam_queries) = match sequence {
                    true => (values(900 + len as u32, len * 3 * width), Vec::new()),
                    false => (values(700 + len as u32, len * 2 * width), values(500 + len as u32, rows * width)),
                };
                let kv = &kv[..];
                let (queries, stride, kv_stride, keys_at) = match sequence {
                    true => (kv, 3 * width, 3 * width, width),
                    false => (&beam_queries[..], width, 2 * width, 0),
                };
                let keys = KvView::contiguous(&kv, kv_stride, keys_at);
                let vals = KvView::contiguous(&kv, kv_stride, keys_at + width);
                // The portable code is the reference of the levels' vector kernels.
                let mut portable = vec![f32::NAN; rows * width];
                isa::with_isa(isa::Isa::Scalar, || attend_rows(queries, stride, rows, keys, vals, len, heads, d, 0.125, &mut portable));
                for level in isa::available() {
                    let mut all = vec![f32::NAN; rows * width];
                    isa::with_isa(level, || attend_rows(queries, stride, rows, keys, vals, len, heads, d, 0.125, &mut all));
                    let same = all.iter().zip(&portable).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{level:?} heads {heads} d {d} rows {rows} len {len} sequence {sequence}: not the portable result");
                    for r in 0..rows {
                        let mut row = vec![0.0f32; width];
                        let q = &queries[r * stride..r * stride + width];
                        isa::with_isa(level, || attend_row(q, keys, vals, len, heads, d, 0.125, false, &mut Vec::new(), &mut row));
                        let same = row.iter().zip(&all[r * width..]).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{level:?} heads {heads} d {d} rows {rows} len {len} sequence {sequence} row {r}");
                    }
                }
            }
        }
    }

    /// Decoder-step attention with 64-wide heads (the MKL-order paths) on every ISA.
    #[test]
    fn single_query_attention_is_identical_on_every_isa() {
        let (heads, d) = (2, 64);
        for len in [1, 3, 7, 8, 9, 13, 16, 21, 40] {
            let q = values(len as u32, heads * d);
            let kv = values(100 + len as u32, len * 2 * heads * d);
            let kv = &kv[..];
            let keys = KvView::contiguous(&kv, 2 * heads * d, 0);
            let vals = KvView::contiguous(&kv, 2 * heads * d, heads * d);
            let run = |level| {
                let mut out = vec![0.0f32; heads * d];
                isa::with_isa(level, || {
                    attend_row_padded(&q, keys, vals, len, len + 3, heads, d, 0.125, true, &mut Vec::new(), &mut out)
                });
                out
            };
            let reference = run(isa::Isa::Scalar);
            for level in isa::available() {
                let out = run(level);
                assert!(out.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?} len {len}");
            }
        }
    }
}
