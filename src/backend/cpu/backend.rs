//! The CPU implementation of [`Backend`]: buffers are `Vec<f32>`, weights are packed at
//! load for the compute type's kernels, and every operation dispatches on the ISA found at
//! run time. Attention reproduces the summation orders of the engine the model came from
//! ([`FloatOrder`]), which is what keeps Tolk's outputs identical to theirs.
use std::sync::Arc;

use super::attention::{alignment_weights, attend_row, attend_row_padded, attend_row_sequential, attend_rows, prefetch_rows, KvView};
use super::huge_pages;
use super::int16::PackedI16Matrix;
use super::int8::PackedI8Matrix;
use super::isa;
use super::kv_cache::CpuKvCache;
use super::kv_storage::KvCodec;
use super::memory_kv::CpuMemoryKv;
use super::ops;
use super::packed::PackedMatrix;
use super::weight::PackedWeight;
use crate::backend::{
    Activation, AttentionShape, Backend, ComputeType, Ctx, EmbeddingRows, FloatOrder, KvCacheType, MatrixData, PositionTable, Quantized,
    SequenceLayout,
};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The CPU backend. It holds nothing: kernels are chosen per call from `isa::current()`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

/// Resizes a product's output to `len` without zeroing what is kept: every element is
/// overwritten, and zeroing the 65k-wide logits of every step would cost as much as
/// writing them.
fn resize_output(out: &mut Vec<f32>, len: usize) {
    if out.len() < len {
        // Exactly: a growing batch (continuous batching) would otherwise double the
        // capacity of buffers as large as the logits (rows x 65k floats).
        out.reserve_exact(len - out.len());
        out.resize(len, 0.0);
    }
    out.truncate(len);
}

thread_local! {
    /// Keys/values stored compactly, widened to float32 for one attention call (kept per
    /// thread: a buffer this size allocated anew would be mapped and faulted in each time).
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's buffer for widened keys/values, which keeps its size from
/// call to call but not the size of a rare long sentence (1,024 tokens: 8 MB).
fn with_widened<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    WIDENED.with_borrow_mut(|wide| {
        let result = f(wide);
        if wide.capacity() > 1 << 18 && wide.capacity() > 4 * wide.len() {
            wide.shrink_to(wide.len());
        }
        result
    })
}

/// `f` of an example's memory keys/values (`len` fused `[k | v]` rows of `2d` floats) as
/// float32: as stored, or widened from their compact `kv` storage.
fn as_float32<R>(mem: &[f32], kv: KvCacheType, len: usize, d: usize, head_dim: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    if kv == KvCacheType::Float32 {
        return f(mem);
    }
    with_widened(|wide| {
        KvCodec::new(kv, head_dim).decode_rows(mem, len, 2 * d, wide);
        f(wide)
    })
}

/// `out` as `len` zeros.
fn zeroed(out: &mut Vec<f32>, len: usize) {
    out.clear();
    out.reserve_exact(len);
    out.resize(len, 0.0);
}

impl CpuBackend {
    /// A model's matrix packed for the kernels of its compute type.
    fn pack_matrix(&self, data: MatrixData<'_>, n: usize, k: usize, compute_type: ComputeType) -> Result<PackedWeight> {
        Ok(match (compute_type, data) {
            // Saved in the compute type: used as is, exactly as CTranslate2 does.
            (ComputeType::Int8, MatrixData::Quantized(Quantized::Int8 { values, scales, activation_scale, intgemm })) => {
                let packed = PackedI8Matrix::from_quantized(&values, scales, n, k);
                PackedWeight::Int8(packed.with_activation_scale(activation_scale).with_intgemm_emulation(intgemm))
            }
            (ComputeType::Int16, MatrixData::Quantized(Quantized::Int16 { values, scale })) => {
                PackedWeight::Int16(PackedI16Matrix::from_quantized(&values, scale, n, k))
            }
            (ComputeType::Int8, MatrixData::Float(w)) => PackedWeight::Int8(PackedI8Matrix::quantize(&w, n, k)),
            (ComputeType::Int16, MatrixData::Float(w)) => PackedWeight::Int16(PackedI16Matrix::quantize(&w, n, k)),
            (ComputeType::Float32, MatrixData::Float(w)) => PackedWeight::Float32(PackedMatrix::pack(&w, n, k)),
            (compute_type, _) => {
                return Err(Error::unsupported(format!("the CPU backend cannot compute in {} from this storage", compute_type.name())))
            }
        })
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;
    type Matrix = PackedWeight;
    type Vector = Arc<Tensor>;
    type KvCache = CpuKvCache;
    type MemoryKv = CpuMemoryKv;

    const GENERATES_POSITION_TABLES: bool = true;

    fn name(&self) -> String {
        format!("cpu ({})", isa::current().name())
    }

    fn matrix(&self, data: MatrixData<'_>, n: usize, k: usize, compute_type: ComputeType) -> Result<PackedWeight> {
        // A model's matrices, packed side by side in huge pages (see huge_pages).
        huge_pages::for_model_weights(|| self.pack_matrix(data, n, k, compute_type))
    }

    fn gather_rows(&self, matrix: &PackedWeight, ids: &[u32]) -> PackedWeight {
        matrix.gather_rows(ids)
    }

    fn vector(&self, data: Arc<Tensor>) -> Result<Arc<Tensor>> {
        // Owned, never borrowed from the mapped file: a loaded model then reads nothing of
        // it, and the mapping ends with the load, so a model.bin truncated or rewritten in
        // place under a loaded model cannot fault (SIGBUS) its next translation. Of the
        // large vectors, a sinusoid table is generated instead (GENERATES_POSITION_TABLES);
        // an embedding table not tied to the projection, at float32, is held whole (before,
        // only the pages of the rows looked up were resident), as CTranslate2 holds it.
        if data.is_mapped() {
            return Ok(Arc::new(Tensor::from_vec(data.to_vec(), data.shape().to_vec())));
        }
        Ok(data)
    }

    fn gather(&self, vector: &Arc<Tensor>, ids: &[u32]) -> Arc<Tensor> {
        Arc::new(Tensor::from_vec(ids.iter().map(|&i| vector[i as usize]).collect(), vec![ids.len()]))
    }

    fn linear(&self, ctx: &Ctx, x: &Vec<f32>, rows: usize, w: &PackedWeight, bias: Option<&Arc<Tensor>>, relu: bool, out: &mut Vec<f32>) {
        resize_output(out, rows * w.rows());
        let bias = bias.map(|b| &b[..]);
        if relu {
            w.matmul_relu(x, bias, out, rows, ctx.threads);
        } else {
            w.matmul(x, bias, out, rows, ctx.threads);
        }
    }

    fn layer_norm(&self, x: &mut Vec<f32>, gamma: &Arc<Tensor>, beta: Option<&Arc<Tensor>>, epsilon: f32, order: FloatOrder) {
        match beta {
            Some(beta) if order == FloatOrder::Marian => ops::layer_norm_sequential(x, gamma, beta, epsilon),
            Some(beta) => ops::layer_norm(x, gamma, beta, epsilon),
            None => ops::rms_norm(x, gamma, epsilon),
        }
    }

    fn activation(&self, ctx: &Ctx, x: &mut Vec<f32>, activation: Activation) {
        // Element by element, in parts of whole 64-value chunks: each value takes the same
        // (vector) path as in one pass. An exponential costs about 4 multiply-adds.
        let (work, whole) = (x.len() * 4, x.len() / 64 * 64);
        let (chunks, rest) = x.split_at_mut(whole);
        super::split_rows(chunks, 64, ctx.threads, work, |_| true, |_, part| activation.apply(part));
        activation.apply(rest);
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) {
        ops::add_assign(x, y);
    }

    fn copy(&self, src: &Vec<f32>, dst: &mut Vec<f32>) {
        dst.clear();
        dst.extend_from_slice(src);
    }

    fn zeros(&self, out: &mut Vec<f32>, rows: usize, dim: usize) {
        zeroed(out, rows * dim);
    }

    fn embed(&self, table: EmbeddingRows<'_, Self>, dim: usize, ids: &[u32], scale: Option<f32>, out: &mut Vec<f32>) {
        resize_output(out, ids.len() * dim);
        for (row, &id) in out.chunks_exact_mut(dim).zip(ids) {
            match table {
                EmbeddingRows::Dense(t) => row.copy_from_slice(t.row(id as usize)),
                EmbeddingRows::Packed(p) => p.copy_row(id as usize, row),
            }
            if let Some(s) = scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
    }

    fn add_positions(&self, x: &mut Vec<f32>, dim: usize, table: PositionTable<'_, Self>, positions: &[usize]) {
        for (row, &position) in x.chunks_exact_mut(dim).zip(positions) {
            match table {
                PositionTable::Table(t) => ops::add_assign(row, t.row(position)),
                PositionTable::Sinusoidal { start } => add_sinusoid(row, position + start),
                PositionTable::Generated(t) => ops::add_assign(row, t.row(position)),
            }
        }
    }

    fn sequence_attention(&self, ctx: &Ctx, qkv: &Vec<f32>, layout: &SequenceLayout, shape: AttentionShape, out: &mut Vec<f32>) {
        let AttentionShape { num_heads: heads, dim: d, order } = shape;
        let head_dim = d / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        zeroed(out, layout.total_rows() * d);
        // Marian multiplies the batch padded to its longest source: Eigen's kernel then sums
        // the keys past the last multiple of 4 of that length otherwise, for the query rows
        // before it.
        let whole = layout.lengths.iter().copied().max().unwrap_or(0) / 4 * 4;
        let work = layout.lengths.iter().map(|&len| len * len).sum::<usize>() * 2 * d;
        // Sequences apart: the offsets ascend.
        let starts_sequence = |r: usize| layout.offsets.binary_search(&r).is_ok();
        super::split_rows(out, d, ctx.threads, work, starts_sequence, |first, out| {
            let mut scores = Vec::new();
            let end = first + out.len() / d;
            for (&off, &len) in layout.offsets.iter().zip(&layout.lengths).filter(|(&off, _)| (first..end).contains(&off)) {
                let seq = &qkv[off * 3 * d..(off + len) * 3 * d];
                let keys = KvView::contiguous(&seq, 3 * d, d);
                let values = KvView::contiguous(&seq, 3 * d, 2 * d);
                let out = &mut out[(off - first) * d..(off - first + len) * d];
                if order == FloatOrder::Ctranslate2 {
                    attend_rows(seq, 3 * d, len, keys, values, len, heads, head_dim, scale, out);
                    continue;
                }
                for (t, o) in out.chunks_exact_mut(d).enumerate() {
                    let q = &seq[t * 3 * d..t * 3 * d + d];
                    let peeled = if t < whole { whole } else { usize::MAX };
                    attend_row_sequential(q, keys, values, len, peeled, heads, head_dim, scale, &mut scores, o);
                }
            }
        });
    }

    fn stores_kv_as(&self, _kv: KvCacheType) -> bool {
        true
    }

    fn new_kv_cache(&self, rows: usize, kv: KvCacheType) -> CpuKvCache {
        CpuKvCache::new(rows, kv)
    }

    fn cached_attention(&self, ctx: &Ctx, qkv: &Vec<f32>, cache: &mut CpuKvCache, shape: AttentionShape, out: &mut Vec<f32>) {
        let AttentionShape { num_heads: heads, dim: d, order } = shape;
        let head_dim = d / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let rows = cache.num_rows();
        for (r, row) in qkv.chunks_exact(3 * d).take(rows).enumerate() {
            cache.append(r, &row[d..], head_dim);
        }
        zeroed(out, rows * d);
        let cache = &*cache;
        let attend = |q: &[f32], keys: KvView, values: KvView, len: usize, scores: &mut Vec<f32>, o: &mut [f32]| match order {
            // One query row per product: no peeled keys.
            FloatOrder::Marian => attend_row_sequential(q, keys, values, len, usize::MAX, heads, head_dim, scale, scores, o),
            FloatOrder::Ctranslate2 => attend_row(q, keys, values, len, heads, head_dim, scale, true, scores, o),
        };
        let work = (0..rows).map(|r| cache.len(r)).sum::<usize>() * 2 * d;
        super::split_rows(out, d, ctx.threads, work, |_| true, |first, out| {
            let (mut scores, mut blocks, mut next) = (Vec::new(), Vec::new(), Vec::new());
            let (count, float32) = (out.len() / d, cache.is_float32());
            // A row's blocks are found a row ahead, and its first keys and values asked for
            // while the row before it attends (see `prefetch_rows`).
            fn find_ahead<'a>(cache: &'a CpuKvCache, r: usize, d: usize, blocks: &mut Vec<&'a [f32]>) {
                cache.blocks(r, blocks);
                prefetch_rows(&cache.keys(blocks), &cache.values(blocks), cache.len(r), d);
            }
            if float32 && count > 0 {
                find_ahead(cache, first, d, &mut next);
            }
            for (i, o) in out.chunks_exact_mut(d).enumerate() {
                let r = first + i;
                let (q, len) = (&qkv[r * 3 * d..r * 3 * d + d], cache.len(r));
                if float32 {
                    std::mem::swap(&mut blocks, &mut next);
                    if i + 1 < count {
                        find_ahead(cache, r + 1, d, &mut next);
                    }
                    attend(q, cache.keys(&blocks), cache.values(&blocks), len, &mut scores, o);
                } else {
                    with_widened(|wide| {
                        cache.widen(r, wide);
                        let wide: &[f32] = wide;
                        attend(q, KvView::contiguous(&wide, 2 * d, 0), KvView::contiguous(&wide, 2 * d, d), len, &mut scores, o);
                    });
                }
            }
        });
    }

    fn reorder_kv_cache(&self, cache: &mut CpuKvCache, sources: &[usize]) {
        cache.reorder(sources);
    }

    fn shrink_kv_cache(&self, cache: &mut CpuKvCache) {
        cache.shrink();
    }

    fn memory_attention(
        &self,
        ctx: &Ctx,
        query: &Vec<f32>,
        memory_kv: &CpuMemoryKv,
        kv: KvCacheType,
        memory: &SequenceLayout,
        row_example: &[usize],
        shape: AttentionShape,
        out: &mut Vec<f32>,
    ) {
        let AttentionShape { num_heads: heads, dim: d, order } = shape;
        let head_dim = d / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        zeroed(out, row_example.len() * d);
        debug_assert_eq!(memory_kv.num_examples(), memory.lengths.len(), "one memory per example of the layout");
        let work = row_example.iter().map(|&ex| memory.lengths[ex]).sum::<usize>() * 2 * d;
        // An example's rows (its beams) are adjacent and attended together.
        let starts_example = |r: usize| row_example[r] != row_example[r - 1];
        super::split_rows(out, d, ctx.threads, work, starts_example, |first, out| {
            let mut scores = Vec::new();
            let end = first + out.len() / d;
            // Each example's first keys and values asked for while the example before it
            // attends (see `prefetch_rows`).
            let prefetch = |r: usize| {
                if kv == KvCacheType::Float32 && r < end {
                    let (mem, len) = (memory_kv.example(row_example[r]), memory.lengths[row_example[r]]);
                    prefetch_rows(&KvView::contiguous(&mem, 2 * d, 0), &KvView::contiguous(&mem, 2 * d, d), len, d);
                }
            };
            prefetch(first);
            let mut r = first;
            while r < end {
                let ex = row_example[r];
                // CTranslate2 keeps the memory keys/values once per example, not per beam: with
                // several rows per example (beam search after the first step), the example's
                // beams are the query rows of one product (`beam_size > 1` in its
                // cross-attention), which MKL sums in its several-rows order instead of the
                // one-query-row order. An example's rows are adjacent.
                let rows = row_example[r..end].iter().take_while(|&&e| e == ex).count();
                prefetch(r + rows);
                let (mem, len) = (memory_kv.example(ex), memory.lengths[ex]);
                // CTranslate2 pads the batch's sources to the longest one, which decides MKL's order.
                let padded = memory.padded[ex];
                let (q, o) = (&query[r * d..(r + rows) * d], &mut out[(r - first) * d..(r - first + rows) * d]);
                let attend = |mem: &[f32]| {
                    let (keys, values) = (KvView::contiguous(&mem, 2 * d, 0), KvView::contiguous(&mem, 2 * d, d));
                    match order {
                        // One query row per product (Marian keeps the beams apart): no peeled keys.
                        FloatOrder::Marian => {
                            for (q, o) in q.chunks_exact(d).zip(o.chunks_exact_mut(d)) {
                                attend_row_sequential(q, keys, values, len, usize::MAX, heads, head_dim, scale, &mut scores, o);
                            }
                        }
                        FloatOrder::Ctranslate2 if rows == 1 => {
                            attend_row_padded(q, keys, values, len, padded, heads, head_dim, scale, true, &mut scores, o)
                        }
                        FloatOrder::Ctranslate2 => attend_rows(q, d, rows, keys, values, len, heads, head_dim, scale, o),
                    }
                };
                // Widened once per example, for all its rows (beams).
                as_float32(mem, kv, len, d, head_dim, attend);
                r += rows;
            }
        });
    }

    fn gives_attention_weights(&self) -> bool {
        true
    }

    fn memory_attention_weights(
        &self,
        _ctx: &Ctx,
        query: &Vec<f32>,
        memory_kv: &CpuMemoryKv,
        kv: KvCacheType,
        memory: &SequenceLayout,
        row_example: &[usize],
        shape: AttentionShape,
        heads: usize,
    ) -> Option<Vec<Vec<f32>>> {
        let AttentionShape { num_heads, dim: d, .. } = shape;
        let head_dim = d / num_heads;
        let (scale, heads) = (1.0 / (head_dim as f32).sqrt(), heads.clamp(1, num_heads));
        let mut scores = Vec::new();
        let weights = row_example
            .iter()
            .enumerate()
            .map(|(r, &ex)| {
                let (mem, len) = (memory_kv.example(ex), memory.lengths[ex]);
                let mut out = vec![0.0; len];
                as_float32(mem, kv, len, d, head_dim, |mem| {
                    let q = &query[r * d..(r + 1) * d];
                    alignment_weights(q, KvView::contiguous(&mem, 2 * d, 0), len, memory.padded[ex], heads, head_dim, scale, &mut scores, &mut out)
                });
                out
            })
            .collect();
        Some(weights)
    }

    fn ssru(&self, cells: &mut Vec<f32>, input: &Vec<f32>, forget: &Vec<f32>, out: &mut Vec<f32>) {
        ops::ssru_update(cells, input, forget, out);
    }

    fn running_average(&self, average: &mut Vec<f32>, x: &Vec<f32>, step: usize) {
        let t = step as f32;
        for (g, &v) in average.iter_mut().zip(x) {
            *g = if step == 0 { v } else { (*g * t + v) / (t + 1.0) };
        }
    }

    fn gate(&self, y: &mut Vec<f32>, x: &Vec<f32>, input_gate: &Vec<f32>, forget_gate: &Vec<f32>) {
        let (mut gi, mut gf) = (input_gate.clone(), forget_gate.clone());
        ops::sigmoid(&mut gi);
        ops::sigmoid(&mut gf);
        for (((v, &xi), &gi), &gf) in y.iter_mut().zip(x).zip(&gi).zip(&gf) {
            *v = gi * xi + gf * *v;
        }
    }

    fn reorder_rows(&self, x: &mut Vec<f32>, dim: usize, sources: &[usize]) {
        if sources.windows(2).all(|w| w[0] < w[1]) {
            // Rows kept in order (finished examples dropped): moved down in place, so the
            // buffer's pages are neither copied nor handed back and faulted in again.
            for (i, &s) in sources.iter().enumerate() {
                x.copy_within(s * dim..(s + 1) * dim, i * dim);
            }
            x.truncate(sources.len() * dim);
            x.shrink_to_fit();
        } else {
            *x = sources.iter().flat_map(|&s| x[s * dim..(s + 1) * dim].iter().copied()).collect();
        }
    }

    fn can_append_rows(&self) -> bool {
        true
    }

    fn append_rows(&self, dst: &mut Vec<f32>, src: &Vec<f32>) {
        dst.reserve_exact(src.len());
        dst.extend_from_slice(src);
    }

    fn append_memory_kv(&self, memory: &mut CpuMemoryKv, rows: &mut Vec<f32>, lengths: &[usize], width: usize, kv: KvCacheType, chunk: usize) {
        memory.append(rows, lengths, width, KvCodec::new(kv, chunk));
    }

    fn keep_memory_kv(&self, memory: &mut CpuMemoryKv, _layout: &SequenceLayout, kept: &[usize], _slots: usize) {
        memory.keep(kept);
    }

    fn drops_memory_kv_freely(&self) -> bool {
        true
    }

    fn zero_rows(&self, x: &mut Vec<f32>, dim: usize, rows: &[usize]) {
        for &r in rows {
            x[r * dim..(r + 1) * dim].fill(0.0);
        }
    }

    fn feed_forward_rows(&self) -> Option<usize> {
        // 256 rows of 2048 floats (zh-en) are 2 MB instead of 10-13 MB for a batch of long
        // sentences, and products of 256 rows run as fast as larger ones.
        Some(256)
    }

    fn copy_rows(&self, src: &Vec<f32>, dim: usize, first: usize, count: usize, dst: &mut Vec<f32>) {
        dst.clear();
        dst.extend_from_slice(&src[first * dim..(first + count) * dim]);
    }

    fn write_rows(&self, dst: &mut Vec<f32>, dim: usize, first: usize, src: &Vec<f32>) {
        dst[first * dim..first * dim + src.len()].copy_from_slice(src);
    }

    fn append_kv_cache(&self, dst: &mut CpuKvCache, src: CpuKvCache) {
        dst.append_rows(src);
    }

    fn best_logits(
        &self,
        ctx: &Ctx,
        x: &Vec<f32>,
        rows: usize,
        w: &PackedWeight,
        bias: Option<&Arc<Tensor>>,
        disabled: &[&[u32]],
    ) -> Option<Vec<(usize, f32)>> {
        w.best_columns(x, bias.map(|b| &b[..]), rows, ctx.threads, disabled)
    }

    fn logits_to_host(&self, logits: &mut Vec<f32>, host: &mut Vec<f32>) {
        // Already on the host: hand the buffer over instead of copying it.
        std::mem::swap(logits, host);
    }

    fn logits(&self, ctx: &Ctx, x: &Vec<f32>, rows: usize, w: &PackedWeight, bias: Option<&Arc<Tensor>>, _: &mut Vec<f32>, host: &mut Vec<f32>) {
        // Straight into the host's buffer: a second logits buffer would cost
        // rows x vocabulary floats (33 MB for beam 4 over 32 sentences of a 65k vocabulary).
        self.linear(ctx, x, rows, w, bias, false, host);
    }
}

/// Adds the sinusoidal encoding of `position` to one row: `[sin | cos]` halves with the
/// frequency step `ln(10000) / (d/2 - 1)`.
fn add_sinusoid(x: &mut [f32], position: usize) {
    let half = x.len() / 2;
    let increment = 10000f32.ln() / (half - 1) as f32;
    let p = position as f32;
    for j in 0..half {
        let timescale = (-increment * j as f32).exp();
        let t = p * timescale;
        x[j] += t.sin();
        x[half + j] += t.cos();
    }
}
