//! CPU kernels, dispatched at run time by `isa`: matrix products with weights packed at
//! load in float32 (`packed`), int8 (`int8`) and int16 (`int16`), and the element-wise
//! and row-wise operations of a Transformer (`ops`).
pub mod int16;
pub mod int8;
pub mod isa;
pub mod ops;
pub mod packed;
pub mod weight;

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
