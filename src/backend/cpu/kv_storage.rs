//! Keys and values kept compactly ([`KvCacheType::BFloat16`], [`KvCacheType::Int8`]) in
//! the slots of float32 buffers, and widened back to float32 rows before attention: the
//! attention kernels then run on them exactly as on float32 keys/values, and reading the
//! narrow rows from memory costs less than reading float32 ones did (a decoding step's
//! keys/values do not stay in the caches: the weights streamed between uses evict them).
//!
//! A stored row of `len` values takes `KvCacheType::row_slots(len, chunk)` floats:
//! bfloat16 packs two values per slot; int8 packs four, then one float32 scale per
//! `chunk` values (a head of the key, then of the value).
use super::isa::dispatch_isa;
use crate::backend::KvCacheType;

/// How rows of keys/values are stored: the type, and the values each int8 scale covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCodec {
    pub kv: KvCacheType,
    pub chunk: usize,
}

impl KvCodec {
    pub fn new(kv: KvCacheType, chunk: usize) -> KvCodec {
        KvCodec { kv, chunk: chunk.max(1) }
    }

    /// Floats one stored row of `len` values takes.
    pub fn slots(&self, len: usize) -> usize {
        self.kv.row_slots(len, self.chunk)
    }

    /// Stores `src` into `dst` (`slots(src.len())` floats).
    pub fn encode(&self, src: &[f32], dst: &mut [f32]) {
        debug_assert_eq!(dst.len(), self.slots(src.len()));
        let codec = *self;
        dispatch_isa!(encode_generic(codec: KvCodec, src: &[f32], dst: &mut [f32]) -> ())
    }

    /// Widens `rows` stored rows of `width` values each (`src`: `rows * slots(width)`
    /// floats) into `dst`, which becomes `[rows, width]`.
    pub fn decode_rows(&self, src: &[f32], rows: usize, width: usize, dst: &mut Vec<f32>) {
        // Every float is written: no zeroing of what the buffer already holds.
        dst.resize(dst.len().max(rows * width), 0.0);
        dst.truncate(rows * width);
        self.decode_into(src, rows, width, dst);
    }

    /// [`KvCodec::decode_rows`] into the first `rows * width` floats of `dst`.
    pub fn decode_into(&self, src: &[f32], rows: usize, width: usize, dst: &mut [f32]) {
        let (codec, slots) = (*self, self.slots(width));
        let src = &src[..rows * slots];
        let dst = &mut dst[..rows * width];
        dispatch_isa!(decode_generic(codec: KvCodec, src: &[f32], slots: usize, width: usize, dst: &mut [f32]) -> ())
    }
}

#[inline(always)]
fn encode_generic(codec: KvCodec, src: &[f32], dst: &mut [f32]) {
    match codec.kv {
        KvCacheType::Float32 => dst.copy_from_slice(src),
        KvCacheType::BFloat16 => {
            let halves: &mut [u16] = bytemuck::cast_slice_mut(dst);
            halves.fill(0);
            for (h, &x) in halves.iter_mut().zip(src) {
                *h = half::bf16::from_f32(x).to_bits();
            }
        }
        KvCacheType::Int8 => {
            let (values, scales) = dst.split_at_mut(src.len().div_ceil(4));
            let bytes: &mut [i8] = bytemuck::cast_slice_mut(values);
            bytes.fill(0);
            for ((piece, q), scale) in src.chunks(codec.chunk).zip(bytes.chunks_mut(codec.chunk)).zip(scales) {
                // (A non-finite value, already a broken activation, spoils its head.)
                let largest = piece.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                *scale = largest / 127.0;
                let inverse = if largest > 0.0 { 127.0 / largest } else { 0.0 };
                for (q, &x) in q.iter_mut().zip(piece) {
                    *q = (x * inverse).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
            }
        }
    }
}

#[inline(always)]
fn decode_generic(codec: KvCodec, src: &[f32], slots: usize, width: usize, dst: &mut [f32]) {
    for (r, (stored, out)) in src.chunks_exact(slots).zip(dst.chunks_exact_mut(width)).enumerate() {
        // The rows come from memory (the weights streamed between steps evict them): the
        // row after next is fetched meanwhile.
        prefetch(src.get((r + 2) * slots..(r + 3) * slots));
        match codec.kv {
            KvCacheType::Float32 => out.copy_from_slice(stored),
            KvCacheType::BFloat16 => {
                let halves: &[u16] = bytemuck::cast_slice(stored);
                for (o, &h) in out.iter_mut().zip(halves) {
                    *o = f32::from_bits((h as u32) << 16);
                }
            }
            KvCacheType::Int8 => {
                let (values, scales) = stored.split_at(width.div_ceil(4));
                let bytes: &[i8] = bytemuck::cast_slice(values);
                for ((o, q), &scale) in out.chunks_mut(codec.chunk).zip(bytes.chunks(codec.chunk)).zip(scales) {
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = q as f32 * scale;
                    }
                }
            }
        }
    }
}

/// Asks for every cache line of `row` (hints only).
#[inline(always)]
fn prefetch(row: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if let Some(row) = row {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for c in (0..row.len()).step_by(16).chain([row.len().saturating_sub(1)]) {
            // SAFETY: a prefetch never faults, and `c` is within `row` (or 0 of an empty one).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().add(c) as *const i8) }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::memory_kv::CpuMemoryKv;

    fn values(seed: u32, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                // Heads of very different magnitudes, zeros and a lone large value.
                let magnitude = [0.01f32, 1.0, 30.0, 0.0][(i / 8) % 4];
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * magnitude * if i % 13 == 0 { 10.0 } else { 1.0 }
            })
            .collect()
    }

    #[test]
    fn stored_rows_widen_back_within_each_types_rounding() {
        let (width, chunk, rows) = (2 * 24 + 2, 8, 3);
        let src = values(7, rows * width);
        for kv in [KvCacheType::Float32, KvCacheType::BFloat16, KvCacheType::Int8] {
            let codec = KvCodec::new(kv, chunk);
            let slots = codec.slots(width);
            let mut stored = vec![f32::NAN; rows * slots];
            for (row, out) in src.chunks_exact(width).zip(stored.chunks_exact_mut(slots)) {
                codec.encode(row, out);
            }
            let mut wide = Vec::new();
            codec.decode_rows(&stored, rows, width, &mut wide);
            assert_eq!(wide.len(), src.len());
            for (r, (row, back)) in src.chunks_exact(width).zip(wide.chunks_exact(width)).enumerate() {
                for (c, (piece, back)) in row.chunks(chunk).zip(back.chunks(chunk)).enumerate() {
                    let largest = piece.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    for (&x, &y) in piece.iter().zip(back) {
                        let bound = match kv {
                            KvCacheType::Float32 => 0.0,
                            // 8 significant bits, rounded to nearest.
                            KvCacheType::BFloat16 => x.abs() / 256.0,
                            // Half a step of largest / 127, plus the product's rounding.
                            KvCacheType::Int8 => largest / 254.0 * 1.0001,
                        };
                        assert!((x - y).abs() <= bound, "{kv:?} row {r} piece {c}: {x} came back as {y} (bound {bound})");
                    }
                }
            }
        }
        assert_eq!(KvCodec::new(KvCacheType::BFloat16, chunk).slots(width), width / 2);
        assert_eq!(KvCodec::new(KvCacheType::Int8, chunk).slots(1024), 256 + 128);
        assert_eq!(KvCodec::new(KvCacheType::Int8, 64).slots(1024), 256 + 16);
    }

    /// Attention over stored keys/values (cross-attention's and the cache's) is float32
    /// attention over their widened values, bit for bit, in both engines' orders, for an
    /// example with one row (greedy) and one with three (beams).
    #[test]
    fn attention_over_stored_keys_is_attention_over_their_widened_values() {
        use crate::backend::{AttentionShape, Backend, Ctx, FloatOrder, SequenceLayout};
        let b = super::super::CpuBackend;
        let (heads, d) = (4, 64);
        let head_dim = d / heads;
        let layout = SequenceLayout::new(vec![5, 11]);
        let memory = values(11, layout.total_rows() * 2 * d);
        let row_example = [0, 1, 1, 1];
        let query = values(5, row_example.len() * d);
        for order in [FloatOrder::Ctranslate2, FloatOrder::Marian] {
            let shape = AttentionShape { num_heads: heads, dim: d, order };
            for kv in [KvCacheType::BFloat16, KvCacheType::Int8] {
                let codec = KvCodec::new(kv, head_dim);
                let mut stored = CpuMemoryKv::default();
                b.append_memory_kv(&mut stored, &mut memory.clone(), &layout.lengths, 2 * d, kv, head_dim);
                let mut widened = Vec::new();
                for e in 0..layout.lengths.len() {
                    assert_eq!(stored.example(e).len(), layout.lengths[e] * codec.slots(2 * d));
                    let mut wide = Vec::new();
                    codec.decode_rows(stored.example(e), layout.lengths[e], 2 * d, &mut wide);
                    widened.extend(wide);
                }
                let widened = CpuMemoryKv::float32(&widened, &layout.lengths, 2 * d);
                let (mut got, mut expected) = (Vec::new(), Vec::new());
                b.memory_attention(&Ctx::default(), &query, &stored, kv, &layout, &row_example, shape, &mut got);
                b.memory_attention(&Ctx::default(), &query, &widened, KvCacheType::Float32, &layout, &row_example, shape, &mut expected);
                assert!(got.iter().zip(&expected).all(|(a, e)| a.to_bits() == e.to_bits()), "memory attention, {kv:?}, {order:?}");
                assert_eq!(got.len(), expected.len());

                // Three steps of self-attention: the stored cache against a float32 one fed
                // the widened positions.
                let (rows, mut cache, mut reference) = (2, b.new_kv_cache(2, kv), b.new_kv_cache(2, KvCacheType::Float32));
                for step in 0..3 {
                    let qkv = values(100 + step, rows * 3 * d);
                    let mut widened_qkv = qkv.clone();
                    for row in widened_qkv.chunks_exact_mut(3 * d) {
                        let mut one = vec![0.0; codec.slots(2 * d)];
                        codec.encode(&row[d..], &mut one);
                        let mut back = Vec::new();
                        codec.decode_rows(&one, 1, 2 * d, &mut back);
                        row[d..].copy_from_slice(&back);
                    }
                    b.cached_attention(&Ctx::default(), &qkv, &mut cache, shape, &mut got);
                    b.cached_attention(&Ctx::default(), &widened_qkv, &mut reference, shape, &mut expected);
                    assert!(got.iter().zip(&expected).all(|(a, e)| a.to_bits() == e.to_bits()), "cached attention step {step}, {kv:?}, {order:?}");
                    b.reorder_kv_cache(&mut cache, &[1, 1]);
                    b.reorder_kv_cache(&mut reference, &[1, 1]);
                }
            }
        }
    }

    #[test]
    fn widening_is_the_same_on_every_isa() {
        use crate::backend::cpu::isa::{self, Isa};
        let (width, chunk, rows) = (128, 64, 5);
        let src = values(3, rows * width);
        for kv in [KvCacheType::BFloat16, KvCacheType::Int8] {
            let codec = KvCodec::new(kv, chunk);
            let slots = codec.slots(width);
            let mut stored = vec![0.0; rows * slots];
            for (row, out) in src.chunks_exact(width).zip(stored.chunks_exact_mut(slots)) {
                isa::with_isa(Isa::Scalar, || codec.encode(row, out));
            }
            let mut reference = Vec::new();
            isa::with_isa(Isa::Scalar, || codec.decode_rows(&stored, rows, width, &mut reference));
            for level in isa::available() {
                let mut wide = Vec::new();
                isa::with_isa(level, || codec.decode_rows(&stored, rows, width, &mut wide));
                assert!(wide.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()), "{kv:?} widened at {level:?}");
                let mut again = vec![0.0; slots];
                isa::with_isa(level, || codec.encode(&src[..width], &mut again));
                assert!(again.iter().zip(&stored).all(|(a, b)| a.to_bits() == b.to_bits()), "{kv:?} stored at {level:?}");
            }
        }
    }
}
