//! Float32 weight tensors. A tensor either borrows its data from the memory-mapped model
//! file (float32 weights stored 4-byte aligned need no copy) or owns a converted buffer
//! (dequantized int8/int16, widened float16/bfloat16, or realigned float32). Borrowed
//! tensors live only while a model loads: backends copy what they keep (`Backend::vector`).
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

enum Storage {
    Owned(Vec<f32>),
    Mapped { map: Arc<Mmap>, offset: usize, len: usize },
}

pub struct Tensor {
    storage: Storage,
    shape: Vec<usize>,
}

impl Tensor {
    pub fn from_vec(data: Vec<f32>, shape: Vec<usize>) -> Tensor {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Tensor { storage: Storage::Owned(data), shape }
    }

    /// Borrows `len` float32 values at byte `offset` of the mapping. Returns `None` when the
    /// data is not 4-byte aligned (the caller then copies) or out of bounds.
    pub fn from_mapped(map: &Arc<Mmap>, offset: usize, len: usize, shape: Vec<usize>) -> Option<Tensor> {
        let end = offset.checked_add(len.checked_mul(4)?)?;
        let base = map.as_ptr() as usize;
        if end > map.len() || !(base + offset).is_multiple_of(std::mem::align_of::<f32>()) || cfg!(target_endian = "big") {
            return None;
        }
        Some(Tensor { storage: Storage::Mapped { map: Arc::clone(map), offset, len }, shape })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of rows when viewed as a matrix `[shape[0], rest]`.
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Length of a row when viewed as a matrix `[shape[0], rest]`.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        let n = self.row_len();
        &self[i * n..(i + 1) * n]
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
}

impl Deref for Tensor {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.storage {
            Storage::Owned(v) => v,
            Storage::Mapped { map, offset, len } => {
                // SAFETY: `from_mapped` checked bounds and alignment; the mapping is read-only
                // and kept alive by the Arc for as long as this tensor exists. Every bit
                // pattern is a valid f32.
                unsafe { std::slice::from_raw_parts(map.as_ptr().add(*offset) as *const f32, *len) }
            }
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor{:?}{}", self.shape, if self.is_mapped() { " (mapped)" } else { "" })
    }
}
