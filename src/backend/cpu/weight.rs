//! A Linear layer's weight in the form its compute type multiplies: float32, int8 or int16,
//! packed once at load.
use super::int16::{matmul_i16, PackedI16Matrix};
use super::int8::{best_columns_i8, matmul_i8, matmul_i8_relu, PackedI8Matrix};
use super::ops::Activation;
use super::packed::{matmul_packed, PackedMatrix};

pub enum PackedWeight {
    Float32(PackedMatrix),
    Int8(PackedI8Matrix),
    Int16(PackedI16Matrix),
}

impl PackedWeight {
    /// Output features (rows of the stored `[n, k]` weight).
    pub fn rows(&self) -> usize {
        match self {
            PackedWeight::Float32(w) => w.rows(),
            PackedWeight::Int8(w) => w.rows(),
            PackedWeight::Int16(w) => w.rows(),
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            PackedWeight::Float32(w) => w.cols(),
            PackedWeight::Int8(w) => w.cols(),
            PackedWeight::Int16(w) => w.cols(),
        }
    }

    /// Row `i` as float32 (dequantized): embedding lookups on tied or quantized tables.
    pub fn copy_row(&self, i: usize, out: &mut [f32]) {
        match self {
            PackedWeight::Float32(w) => w.copy_row(i, out),
            PackedWeight::Int8(w) => w.copy_row(i, out),
            PackedWeight::Int16(w) => w.copy_row(i, out),
        }
    }

    /// The rows `ids` (output features) as a new weight, packed the same way.
    pub fn gather_rows(&self, ids: &[u32]) -> PackedWeight {
        match self {
            PackedWeight::Float32(w) => {
                let k = w.cols();
                let mut rows = vec![0.0f32; ids.len() * k];
                for (row, &id) in rows.chunks_exact_mut(k.max(1)).zip(ids) {
                    w.copy_row(id as usize, row);
                }
                PackedWeight::Float32(PackedMatrix::pack(&rows, ids.len(), k))
            }
            PackedWeight::Int8(w) => PackedWeight::Int8(w.gather_rows(ids)),
            PackedWeight::Int16(w) => PackedWeight::Int16(w.gather_rows(ids)),
        }
    }

    /// `y[m, n] = x[m, k] · Wᵀ (+ bias)`, overwriting `y`.
    pub fn matmul(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32], m: usize, threads: usize) {
        match self {
            PackedWeight::Float32(w) => matmul_packed(x, w, bias, y, m, threads),
            PackedWeight::Int8(w) => matmul_i8(x, w, bias, y, m, threads),
            PackedWeight::Int16(w) => matmul_i16(x, w, bias, y, m, threads),
        }
    }

    /// Each row's arg-max of [`matmul`](Self::matmul)'s output (`disabled[row]` columns
    /// counted as `f32::MIN`) where the kernels reduce blocks as they go: the int8 ones.
    pub fn best_columns(&self, x: &[f32], bias: Option<&[f32]>, m: usize, threads: usize, disabled: &[&[u32]]) -> Option<Vec<(usize, f32)>> {
        match self {
            PackedWeight::Int8(w) => Some(best_columns_i8(x, w, bias, m, threads, disabled)),
            _ => None,
        }
    }

    /// [`matmul`](Self::matmul) followed by ReLU: fused into the int8 kernels' epilogue,
    /// a second pass for the others.
    pub fn matmul_relu(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32], m: usize, threads: usize) {
        match self {
            PackedWeight::Int8(w) => matmul_i8_relu(x, w, bias, true, y, m, threads),
            _ => {
                self.matmul(x, bias, y, m, threads);
                Activation::Relu.apply(&mut y[..m * self.rows()]);
            }
        }
    }
}
