//! The CPU backend (`backend`: [`CpuBackend`] implements [`crate::backend::Backend`]) and
//! its kernels, dispatched at run time by `isa`: matrix products with weights packed at
//! load in float32 (`packed`), int8 (`int8`) and int16 (`int16`), the element-wise and
//! row-wise operations of a Transformer (`ops`), multi-head attention (`attention`), the
//! decoder's paged self-attention cache (`kv_cache`), its cross-attention keys and values per
//! example (`memory_kv`), the compact forms attention keys and values can be kept in
//! (`kv_storage`), the huge pages the packed weights are allocated in (`huge_pages`), and
//! the quantized kernels' stores of their output rows (`row_store`).
// Off x86-64 only the portable kernels are built: the SIMD kernels' plumbing (prefetch
// shares, ISA matches, unsafe dispatch) is left unused there.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused_imports, unused_unsafe, dead_code))]
pub mod attention;
pub mod backend;
pub mod huge_pages;
pub mod int16;
pub mod int8;
pub mod isa;
pub mod kv_cache;
pub mod kv_storage;
pub mod memory_kv;
pub mod ops;
pub mod packed;
mod row_store;
pub mod team;
pub mod tuning;
pub mod weight;

pub use backend::CpuBackend;

/// The output pointer shared by the threads of one operation split across the team: each
/// writes its own part (a product's columns, a part's rows), so no two threads touch the
/// same element.
pub(crate) struct OutPtr<T = f32>(pub *mut T);
// SAFETY: see above; the threads that share it write disjoint elements.
unsafe impl<T> Send for OutPtr<T> {}
unsafe impl<T> Sync for OutPtr<T> {}

// Not derived: the derives would ask `T: Copy`, which a pointer does not need.
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}

impl<T> OutPtr<T> {
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// The work (multiply-adds) from which a matrix product is split across threads: below it,
/// handing parts to the team's threads costs more than they save.
const WORTH_SPLITTING: usize = 1 << 20;
/// The same for attention (`split_rows`), whose multiply-adds each read a key or value
/// element from memory and run some 20 times slower than a product's: a decoder step's
/// self-attention over 32 rows of 20 keys (650k) takes ~140 us on one thread (Zen 4).
const ATTENTION_WORTH_SPLITTING: usize = 1 << 16;

/// Runs `run(p0, p1)` over the panels `0..panels` (disjoint output columns): split across
/// `threads` of the worker's team (`team::run_parts`) when the product (`work`
/// multiply-adds) is worth it, else on this thread.
pub(crate) fn split_panels(panels: usize, threads: usize, work: usize, run: impl Fn(usize, usize) + Sync) {
    let threads = threads.min(team::available());
    if threads > 1 && work >= WORTH_SPLITTING && panels >= 2 * threads {
        let chunk = panels.div_ceil(threads);
        // The team's threads run at the level forced on this one (isa::with_isa), so that
        // whatever `run` dispatches matches the level the caller chose.
        let forced = isa::forced_here();
        team::run_parts(threads, &|t| {
            let (p0, p1) = (t * chunk, ((t + 1) * chunk).min(panels));
            if p0 < p1 {
                isa::with_forced(forced, || run(p0, p1));
            }
        });
    } else {
        run(0, panels);
    }
}

/// Runs `run(first, rows)` over the rows of `out` (`row_len` values each) in contiguous
/// parts, one per thread of the worker's team (at most `threads`) when the attention's
/// work (`work` multiply-adds) is worth it, else over all rows at once on this thread. A
/// part starts only at a row where `may_start(row)` (rows computed together, such as an
/// example's beams, stay together). For operations whose rows depend only on their own
/// inputs (attention's query rows), the result is the same either way.
pub(crate) fn split_rows(out: &mut [f32], row_len: usize, threads: usize, work: usize, may_start: impl Fn(usize) -> bool, run: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len().checked_div(row_len).unwrap_or(0);
    let threads = threads.min(team::available());
    if threads <= 1 || work < ATTENTION_WORTH_SPLITTING || rows < 2 {
        run(0, out);
        return;
    }
    let target = rows.div_ceil(threads);
    let mut starts = vec![0];
    for r in 1..rows {
        if r - starts[starts.len() - 1] >= target && may_start(r) {
            starts.push(r);
        }
    }
    if starts.len() == 1 {
        run(0, out);
        return;
    }
    // As in split_panels: the team's threads run at the level forced on this one.
    let forced = isa::forced_here();
    let base = OutPtr(out.as_mut_ptr());
    team::run_parts(starts.len(), &|i| {
        let (first, end) = (starts[i], starts.get(i + 1).copied().unwrap_or(rows));
        // SAFETY: the parts' row ranges are disjoint and within `out`, which outlives
        // `run_parts` (it returns once every part has).
        let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(first * row_len), (end - first) * row_len) };
        isa::with_forced(forced, || run(first, part));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A product split across the pool runs every part at the level forced on the caller.
    #[test]
    fn split_products_run_at_the_forced_level() {
        let seen = Mutex::new(Vec::new());
        team::Team::new(4).unwrap().install(|| {
            isa::with_isa(isa::Isa::Scalar, || {
                split_panels(64, 4, 1 << 24, |p0, _| seen.lock().unwrap().push((p0, isa::current(), std::thread::current().id())));
            })
        });
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 4);
        let mut threads: Vec<String> = seen.iter().map(|p| format!("{:?}", p.2)).collect();
        threads.sort();
        threads.dedup();
        assert_eq!(threads.len(), 4, "one part per thread");
        assert!(seen.iter().all(|&(_, level, _)| level == isa::Isa::Scalar), "{seen:?}");
    }

    /// Rows split across the pool start parts only where allowed, cover every row once, and
    /// run at the level forced on the caller.
    #[test]
    fn split_rows_cover_every_row_in_allowed_parts() {
        let pool = team::Team::new(3).unwrap();
        let seen = Mutex::new(Vec::new());
        let mut out = vec![0.0f32; 10 * 2];
        pool.install(|| {
            isa::with_isa(isa::Isa::Scalar, || {
                split_rows(&mut out, 2, 3, 1 << 24, |r| r % 2 == 0, |first, part| {
                    part.iter_mut().enumerate().for_each(|(i, v)| *v += (first * 2 + i) as f32);
                    seen.lock().unwrap().push((first, part.len() / 2, isa::current()));
                })
            })
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort_by_key(|p| p.0);
        assert_eq!(seen.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), [(0, 4), (4, 4), (8, 2)]);
        assert!(seen.iter().all(|p| p.2 == isa::Isa::Scalar), "{seen:?}");
        assert_eq!(out, (0..20).map(|v| v as f32).collect::<Vec<_>>());
    }

    /// Attention split across the pool's threads (`Ctx::threads`) gives one thread's
    /// result bit for bit: the decoder's self- and cross-attention (an example's beams kept
    /// together) and the encoder's, in both engines' orders.
    #[test]
    fn attention_across_threads_is_attention_on_one() {
        use crate::backend::{AttentionShape, Backend, Ctx, FloatOrder, KvCacheType, SequenceLayout};
        let b = backend::CpuBackend;
        let (heads, d) = (8, 512);
        let mut seed = 1u32;
        let mut values = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        let layout = SequenceLayout::new((0..9).map(|i| 30 + 7 * i).collect());
        let encoder_qkv = values(layout.total_rows() * 3 * d);
        let memory = values(layout.total_rows() * 2 * d);
        // 32 rows, whose attention over 30-86 keys is worth splitting (see split_rows).
        // Example 5's four rows (9..13) straddle the first third.
        let row_example = [0, 0, 0, 0, 1, 2, 2, 3, 4, 5, 5, 5, 5, 6, 7, 7, 8, 8, 8, 8, 7, 6, 6, 5, 4, 3, 2, 1, 1, 1, 1, 0];
        let query = values(row_example.len() * d);
        let steps: Vec<Vec<f32>> = (0..48).map(|_| values(row_example.len() * 3 * d)).collect();
        let pool = team::Team::new(3).unwrap();
        for order in [FloatOrder::Ctranslate2, FloatOrder::Marian] {
            let shape = AttentionShape { num_heads: heads, dim: d, order };
            let run = |ctx: &Ctx| {
                let (mut encoded, mut crossed, mut attended) = (Vec::new(), Vec::new(), Vec::new());
                b.sequence_attention(ctx, &encoder_qkv, &layout, shape, &mut encoded);
                let memory = memory_kv::CpuMemoryKv::float32(&memory, &layout.lengths, 2 * d);
                b.memory_attention(ctx, &query, &memory, KvCacheType::Float32, &layout, &row_example, shape, &mut crossed);
                let mut cache = b.new_kv_cache(row_example.len(), KvCacheType::Float32);
                let mut out = Vec::new();
                for qkv in &steps {
                    b.cached_attention(ctx, qkv, &mut cache, shape, &mut out);
                    attended.extend_from_slice(&out);
                }
                (encoded, crossed, attended)
            };
            let one = pool.install(|| run(&Ctx { threads: 1 }));
            let three = pool.install(|| run(&Ctx { threads: 3 }));
            let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one.0), bits(&three.0), "encoder attention, {order:?}");
            assert_eq!(bits(&one.1), bits(&three.1), "cross-attention, {order:?}");
            assert_eq!(bits(&one.2), bits(&three.2), "cached self-attention, {order:?}");
        }
    }

    /// Keeping rows in order (moved down in place) and in any other order (gathered into a
    /// new buffer) give the rows asked for.
    #[test]
    fn reordered_rows_are_the_rows_asked_for() {
        use crate::backend::Backend;
        let (b, dim) = (backend::CpuBackend, 3);
        let rows: Vec<f32> = (0..6 * dim).map(|v| v as f32).collect();
        for sources in [vec![1, 2, 5], vec![0, 1, 2, 3, 4, 5], vec![], vec![5], vec![3, 3, 0], vec![2, 1]] {
            let mut x = rows.clone();
            b.reorder_rows(&mut x, dim, &sources);
            let expected: Vec<f32> = sources.iter().flat_map(|&s| rows[s * dim..(s + 1) * dim].to_vec()).collect();
            assert_eq!(x, expected, "sources {sources:?}");
        }
    }
}
