//! Storing a row of an epilogue's output vectors: the kernels' accumulators go through
//! their epilogue in registers and out through here, whole vectors where the row has room,
//! else the first `cols` floats (the last panel of a width that is not a multiple of the
//! panel's). Shared by the int8 and int16 kernels, whose arithmetic differs.
#![cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Stores the first `cols` floats of `v` (`N` <= 4 ymm, lanes in order) at `y`.
///
/// # Safety
/// The CPU runs AVX; `y` has room for `min(cols, 8 * N)` floats. No target feature of its
/// own, so that it inlines into the kernels (see `int8::x86::store256`).
#[inline(always)]
pub(crate) unsafe fn store256<const N: usize>(y: *mut f32, v: [__m256; N], cols: usize) {
    if cols >= 8 * N {
        for (j, v) in v.into_iter().enumerate() {
            _mm256_storeu_ps(y.add(8 * j), v);
        }
    } else {
        let mut row = [0.0f32; 32];
        for (j, v) in v.into_iter().enumerate() {
            _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), v);
        }
        std::ptr::copy_nonoverlapping(row.as_ptr(), y, cols);
    }
}

/// Stores the first `cols` floats of `v` (`N` <= 2 zmm, lanes in order) at `y`.
///
/// # Safety
/// The CPU runs AVX-512F; `y` has room for `min(cols, 16 * N)` floats.
#[inline(always)]
pub(crate) unsafe fn store512<const N: usize>(y: *mut f32, v: [__m512; N], cols: usize) {
    if cols >= 16 * N {
        for (j, v) in v.into_iter().enumerate() {
            _mm512_storeu_ps(y.add(16 * j), v);
        }
    } else {
        let mut row = [0.0f32; 32];
        for (j, v) in v.into_iter().enumerate() {
            _mm512_storeu_ps(row.as_mut_ptr().add(16 * j), v);
        }
        std::ptr::copy_nonoverlapping(row.as_ptr(), y, cols);
    }
}
