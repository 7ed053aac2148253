//! The CPU backend (`backend`: [`CpuBackend`] implements [`crate::backend::Backend`]) and
//! its kernels, dispatched at run time by `isa`: matrix products with weights packed at
//! load in float32 (`packed`), int8 (`int8`) and int16 (`int16`), the element-wise and
//! row-wise operations of a Transformer (`ops`), multi-head attention (`attention`), the
//! decoder's paged self-attention cache (`kv_cache`) and the compact forms attention keys
//! and values can be kept in (`kv_storage`).
pub mod attention;
pub mod backend;
pub mod int16;
pub mod int8;
pub mod isa;
pub mod kv_cache;
pub mod kv_storage;
pub mod ops;
pub mod packed;
pub mod weight;

pub use backend::CpuBackend;

/// The output pointer shared by the threads of one matrix product: each writes its own
/// columns of `y`, so no two threads touch the same element.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: see above; the products that share it write disjoint columns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `run(p0, p1)` over the panels `0..panels` (disjoint output columns): split across
/// `threads` of the current rayon pool when the product (`work` multiply-adds) is worth
/// it, else on this thread.
pub(crate) fn split_panels(panels: usize, threads: usize, work: usize, run: impl Fn(usize, usize) + Sync) {
    if threads > 1 && work >= 1 << 20 && panels >= 2 * threads {
        let chunk = panels.div_ceil(threads);
        // The pool's threads run at the level forced on this one (isa::with_isa), so that
        // whatever `run` dispatches matches the level the caller chose.
        let forced = isa::forced_here();
        rayon::scope(|s| {
            for t in 0..threads {
                let (p0, p1) = (t * chunk, ((t + 1) * chunk).min(panels));
                if p0 < p1 {
                    let run = &run;
                    s.spawn(move |_| isa::with_forced(forced, || run(p0, p1)));
                }
            }
        });
    } else {
        run(0, panels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A product split across the pool runs every part at the level forced on the caller.
    #[test]
    fn split_products_run_at_the_forced_level() {
        let seen = Mutex::new(Vec::new());
        isa::with_isa(isa::Isa::Scalar, || {
            split_panels(64, 4, 1 << 24, |p0, _| seen.lock().unwrap().push((p0, isa::current())));
        });
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 4);
        assert!(seen.iter().all(|&(_, level)| level == isa::Isa::Scalar), "{seen:?}");
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
