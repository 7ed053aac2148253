//! CPU kernels: float32 matrix products with packed weights (`packed`, dispatched by
//! `isa`) and the element-wise and row-wise operations of a Transformer (`ops`).
pub mod isa;
pub mod ops;
pub mod packed;

/// Per-call execution settings shared by every kernel of one translation.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// Threads a single matrix product may use (the translator's intra_threads).
    pub threads: usize,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx { threads: 1 }
    }
}
