//! Activation rows quantized with AVX2 + FMA, bit for bit as `quantize_row_scalar`: the
//! compiler's vectorization of that loop took ~3.5 cycles a value at d = 512 (its bytes
//! were stored 4 at a time through a scalar loop), 16% of a 32-row product with 512
//! outputs, together with its plan.

use super::{quantize_byte, scale_of_amax};
use std::arch::x86_64::*;

/// `quantize_row_scalar` for a CPU with AVX2 and FMA: the row's k-quads (at `dst`,
/// `quad_stride` bytes apart) get its bytes, and the scale is returned.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_row(row: &[f32], dst: &mut [u8], quad_stride: usize, shifted: bool, fixed_scale: Option<f32>) -> f32 {
    let (scale, low) = match fixed_scale {
        Some(scale) => (scale, 1.0f32),
        None => (amax_scale(row), 0.0),
    };
    let flip: u8 = if shifted { 0 } else { 0x80 };
    let k = row.len();
    let whole = k / 32 * 32;
    assert!(quad_stride >= 4 && (k == 0 || dst.len() >= (k.div_ceil(4) - 1) * quad_stride + 4), "quantize_row: destination too small");
    let (vscale, vshift, vlow, vhigh) = (_mm256_set1_ps(scale), _mm256_set1_ps(128.0), _mm256_set1_ps(low), _mm256_set1_ps(255.0));
    let vflip = _mm256_set1_epi8(flip as i8);
    let (x, base) = (row.as_ptr(), dst.as_mut_ptr());
    // Byte 0 of k-group `g` (4 values) of this row (inside `dst`, asserted above).
    let out = |g: usize| base.add(g * quad_stride) as *mut i32;
    for c in (0..whole).step_by(32) {
        // `fma(v, scale, 128)` clamped to [low, 255] (a NaN becomes `low`: `max` returns its
        // second operand), rounded half to even.
        let q = |i: usize| {
            let y = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(c + 8 * i)), vscale, vshift);
            _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(y, vlow), vhigh))
        };
        let bytes = _mm256_packus_epi16(_mm256_packus_epi32(q(0), q(1)), _mm256_packus_epi32(q(2), q(3)));
        let bytes = _mm256_xor_si256(bytes, vflip);
        // The packs interleave 128-bit lanes: the low one holds k-groups 0, 2, 4, 6 of the
        // 32 values, the high one 1, 3, 5, 7.
        let (lo, hi) = (_mm256_castsi256_si128(bytes), _mm256_extracti128_si256::<1>(bytes));
        let g = c / 4;
        out(g).write_unaligned(_mm_cvtsi128_si32(lo));
        out(g + 1).write_unaligned(_mm_cvtsi128_si32(hi));
        out(g + 2).write_unaligned(_mm_extract_epi32::<1>(lo));
        out(g + 3).write_unaligned(_mm_extract_epi32::<1>(hi));
        out(g + 4).write_unaligned(_mm_extract_epi32::<2>(lo));
        out(g + 5).write_unaligned(_mm_extract_epi32::<2>(hi));
        out(g + 6).write_unaligned(_mm_extract_epi32::<3>(lo));
        out(g + 7).write_unaligned(_mm_extract_epi32::<3>(hi));
    }
    // The last values (fewer than 32) one by one; a partial k-group is padded with zero
    // bytes, against zero weights.
    let mut tail = [0u8; 32];
    for (o, &v) in tail.iter_mut().zip(&row[whole..]) {
        *o = quantize_byte(v, scale, low, flip);
    }
    for i in 0..(k - whole).div_ceil(4) {
        out(whole / 4 + i).write_unaligned(i32::from_le_bytes(tail[4 * i..4 * i + 4].try_into().expect("4 bytes")));
    }
    scale
}

/// `127 / max|v|` (1 for a zero row), NaNs skipped as `f32::max` skips them.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn amax_scale(row: &[f32]) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut acc = [_mm256_setzero_ps(); 4];
    let blocks = row.chunks_exact(32);
    let rest = blocks.remainder();
    for b in blocks {
        for (i, a) in acc.iter_mut().enumerate() {
            // `max` returns its second operand where the first is NaN.
            *a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(b.as_ptr().add(8 * i)), abs), *a);
        }
    }
    let v = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    scale_of_amax(rest.iter().chain(&lanes).fold(0.0f32, |m, &x| m.max(x.abs())))
}
