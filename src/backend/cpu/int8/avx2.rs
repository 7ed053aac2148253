//! The planned int8 product with 256-bit AVX2 (see `plan`): per unit of rows, each k step
//! through the kernel its plan names.

use super::plan::GroupPlan;
use super::x86::{by_planned_units, Prefetcher};
use super::{TileOut, NR};
use std::arch::x86_64::*;

/// The product of one row group (`x` and its plan) with one
/// panel: rows two at a time (a unit), then the odd one.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(x: &[u8], plan: &GroupPlan, panel: &[u8], kp: usize, t: &TileOut) {
    by_planned_units!(unit; x, plan, panel, kp, t)
}

/// The 4 activation bytes of row `r` in step `g`, broadcast.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast(a: *const u8, g: usize, r: usize) -> __m256i {
    _mm256_set1_epi32(super::x86::x4(a, g, r))
}

/// Columns `8j..8j + 8` of step `g` of a panel, as stored: `w + 128`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_weights(w: *const u8, g: usize, j: usize) -> __m256i {
    _mm256_loadu_si256(w.add(g * NR * 4 + 32 * j) as *const _)
}

/// `vpmaddwd` by ones (adjacent int16 lanes summed to int32) with the ones read from
/// memory: as a register they made the octet loop's 17th live value, and the compiler
/// spilled an accumulator instead (a load and a store every step).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pair_sums(p: __m256i) -> __m256i {
    /// Aligned, so that the load never straddles two cache lines.
    #[repr(align(32))]
    struct Ones([i16; 16]);
    static ONES: Ones = Ones([1; 16]);
    let mut v = p;
    std::arch::asm!("vpmaddwd {v}, {v}, ymmword ptr [{ones}]", v = inout(ymm_reg) v, ones = in(reg) ONES.0.as_ptr(), options(pure, readonly, nostack, preserves_flags));
    v
}

#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
unsafe fn unit<const R: usize, const PREFETCH: bool>(x: &[u8], plan: &GroupPlan, r0: usize, panel: &[u8], t: &TileOut, mut pf: Prefetcher) {
    let (a, w) = (x.as_ptr(), panel.as_ptr());
    let unit = r0 / 2;
    let [hexadecets, octets, quads, exact] = plan.step_lists(unit);
    let ones = _mm256_set1_epi16(1);
    let mut s = [[_mm256_setzero_si256(); 4]; R];
    // Hexadecets (pairs of rows only) 16 columns at a time: two rows' 4 sums, 8 broadcasts
    // and the weights fit the 16 registers (all 32 columns would spill).
    for half in [0, 2] {
        for &h in hexadecets {
            if PREFETCH && half == 0 {
                pf.step();
                pf.step();
            }
            let g = 4 * h as usize;
            let mut xv = [[_mm256_setzero_si256(); 4]; R];
            for r in 0..R {
                for i in 0..4 {
                    xv[r][i] = broadcast(a, g + i, r0 + r);
                }
            }
            for j in half..half + 2 {
                let wv = [0, 1, 2, 3].map(|i| load_weights(w, g + i, j));
                for r in 0..R {
                    let p01 = _mm256_add_epi16(_mm256_maddubs_epi16(wv[0], xv[r][0]), _mm256_maddubs_epi16(wv[1], xv[r][1]));
                    let p23 = _mm256_add_epi16(_mm256_maddubs_epi16(wv[2], xv[r][2]), _mm256_maddubs_epi16(wv[3], xv[r][3]));
                    s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones));
                }
            }
        }
    }
    for &o in octets {
        if PREFETCH {
            pf.step();
        }
        let g = 2 * o as usize;
        let (mut xa_, mut xb_) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
        for r in 0..R {
            (xa_[r], xb_[r]) = (broadcast(a, g, r0 + r), broadcast(a, g + 1, r0 + r));
        }
        for j in 0..4 {
            let (wa, wb) = (load_weights(w, g, j), load_weights(w, g + 1, j));
            for r in 0..R {
                let p = _mm256_add_epi16(_mm256_maddubs_epi16(wa, xa_[r]), _mm256_maddubs_epi16(wb, xb_[r]));
                s[r][j] = _mm256_add_epi32(s[r][j], pair_sums(p));
            }
        }
    }
    for &g in quads {
        let g = g as usize;
        let mut xv = [_mm256_setzero_si256(); R];
        for r in 0..R {
            xv[r] = broadcast(a, g, r0 + r);
        }
        for j in 0..4 {
            let wj = load_weights(w, g, j);
            for r in 0..R {
                s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(_mm256_maddubs_epi16(wj, xv[r]), ones));
            }
        }
    }
    for &g in exact {
        let g = g as usize;
        for r in 0..R {
            let xv = broadcast(a, g, r0 + r);
            let xav = _mm256_abs_epi8(xv);
            for j in 0..4 {
                let p = _mm256_maddubs_epi16(xav, _mm256_sign_epi8(super::x86::signed256(w.add(g * NR * 4 + 32 * j)), xv));
                s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(p, ones));
            }
        }
    }
    for r in 0..R {
        let shift = _mm256_set1_epi32(plan.compensation[r0 + r]);
        for v in s[r].iter_mut() {
            *v = _mm256_sub_epi32(*v, shift);
        }
        super::x86::store256(t, r0 + r, s[r]);
    }
}
