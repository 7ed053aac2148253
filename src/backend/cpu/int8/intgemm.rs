//! intgemm's shifted product for Marian's int8 models (see `tile_intgemm_scalar`): u8
//! activations against s8 weights with `vpmaddubsw`, whose pair sums saturate as intgemm's
//! do, at 512 and 256 bits.
use super::x86::{by_row_pairs, by_rows, signed256, signed512, store256, store512, x4};
use super::{TileOut, NR};
use std::arch::x86_64::*;

/// intgemm's shifted product (see `tile_intgemm_scalar`) with 512-bit `vpmaddubsw`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn tile_intgemm_512(a: &[u8], panel: &[u8], kp: usize, t: &TileOut) {
    by_rows!(intgemm512; t.rows, a, panel, kp, t)
}

#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn intgemm512<const R: usize>(a: &[u8], panel: &[u8], kp: usize, t: &TileOut) {
    let (a, w) = (a.as_ptr(), panel.as_ptr());
    let ones = _mm512_set1_epi16(1);
    let mut s0 = [_mm512_setzero_si512(); R];
    let mut s1 = [_mm512_setzero_si512(); R];
    for g in 0..kp / 4 {
        let w0 = signed512(w.add(g * NR * 4));
        let w1 = signed512(w.add(g * NR * 4 + 64));
        for r in 0..R {
            let xv = _mm512_set1_epi32(x4(a, g, r));
            s0[r] = _mm512_add_epi32(s0[r], _mm512_madd_epi16(_mm512_maddubs_epi16(xv, w0), ones));
            s1[r] = _mm512_add_epi32(s1[r], _mm512_madd_epi16(_mm512_maddubs_epi16(xv, w1), ones));
        }
    }
    for r in 0..R {
        store512(t, r, [s0[r], s1[r]]);
    }
}

/// intgemm's shifted product (see `tile_intgemm_scalar`) with 256-bit `vpmaddubsw`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn tile_intgemm_256(a: &[u8], panel: &[u8], kp: usize, t: &TileOut) {
    by_row_pairs!(intgemm256; t, |r| (a, r, panel, kp, t))
}

#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
unsafe fn intgemm256<const R: usize>(a: &[u8], r0: usize, panel: &[u8], kp: usize, t: &TileOut) {
    let (a, w) = (a.as_ptr(), panel.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut s = [[_mm256_setzero_si256(); 4]; R];
    for g in 0..kp / 4 {
        let wv = [0, 1, 2, 3].map(|j| signed256(w.add(g * NR * 4 + 32 * j)));
        for r in 0..R {
            let xv = _mm256_set1_epi32(x4(a, g, r0 + r));
            for j in 0..4 {
                s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(_mm256_maddubs_epi16(xv, wv[j]), ones));
            }
        }
    }
    for r in 0..R {
        store256(t, r0 + r, s[r]);
    }
}
