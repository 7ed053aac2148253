//! The planned int8 product with 512-bit AVX-512BW (see `plan`), for CPUs without VNNI
//! (Skylake-SP/X): the AVX2 kernel's scheme at twice the width. With 32 registers a pair
//! of rows takes its hexadecets over all 32 columns at once (four sums, eight broadcasts,
//! eight weight registers), so each step of the panel is read once per unit. AVX-512 has
//! no `vpsignb`: the sign trick negates `w` under the sign mask of `x` instead.
//!
//! It replaced the sign trick on every step (`|w|` times `x` blended with a precomputed
//! `-x`): gemm_bench 337-389 -> 441-558 GOP/s, zh-en int8 beam 4 +20%, greedy +5%. Tried
//! and not kept: k blocked by 512 so that a k = 2048 panel stays in L1 (+28% on that shape
//! alone, 4% slower at k = 512 and no faster end to end).

use super::plan::GroupPlan;
use super::x86::{by_planned_units, Prefetcher};
use super::{TileOut, NR};
use std::arch::x86_64::*;

/// The product of one row group (`x` and its plan) with one panel: rows two at a time (a
/// unit), then the odd one.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn tile(x: &[u8], plan: &GroupPlan, panel: &[u8], kp: usize, t: &TileOut) {
    by_planned_units!(unit; x, plan, panel, kp, t)
}

/// The 4 activation bytes of row `r` in step `g`, broadcast.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn broadcast(a: *const u8, g: usize, r: usize) -> __m512i {
    _mm512_set1_epi32(super::x86::x4(a, g, r))
}

/// Columns `16j..16j + 16` of step `g` of a panel, as stored: `w + 128`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_weights(w: *const u8, g: usize, j: usize) -> __m512i {
    _mm512_loadu_si512(w.add(g * NR * 4 + 64 * j) as *const _)
}

#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unit<const R: usize, const PREFETCH: bool>(x: &[u8], plan: &GroupPlan, r0: usize, panel: &[u8], t: &TileOut, mut pf: Prefetcher) {
    let (a, w) = (x.as_ptr(), panel.as_ptr());
    let unit = r0 / 2;
    let [hexadecets, octets, quads, exact] = plan.step_lists(unit);
    let ones = _mm512_set1_epi16(1);
    let mut s = [[_mm512_setzero_si512(); 2]; R];
    for &h in hexadecets {
        if PREFETCH {
            pf.step();
            pf.step();
        }
        let g = 4 * h as usize;
        let mut xv = [[_mm512_setzero_si512(); 4]; R];
        for r in 0..R {
            for i in 0..4 {
                xv[r][i] = broadcast(a, g + i, r0 + r);
            }
        }
        for j in 0..2 {
            let wv = [0, 1, 2, 3].map(|i| load_weights(w, g + i, j));
            for r in 0..R {
                let p01 = _mm512_add_epi16(_mm512_maddubs_epi16(wv[0], xv[r][0]), _mm512_maddubs_epi16(wv[1], xv[r][1]));
                let p23 = _mm512_add_epi16(_mm512_maddubs_epi16(wv[2], xv[r][2]), _mm512_maddubs_epi16(wv[3], xv[r][3]));
                s[r][j] = _mm512_add_epi32(s[r][j], _mm512_madd_epi16(_mm512_add_epi16(p01, p23), ones));
            }
        }
    }
    for &o in octets {
        if PREFETCH {
            pf.step();
        }
        let g = 2 * o as usize;
        let (mut xa, mut xb) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
        for r in 0..R {
            (xa[r], xb[r]) = (broadcast(a, g, r0 + r), broadcast(a, g + 1, r0 + r));
        }
        for j in 0..2 {
            let (wa, wb) = (load_weights(w, g, j), load_weights(w, g + 1, j));
            for r in 0..R {
                let p = _mm512_add_epi16(_mm512_maddubs_epi16(wa, xa[r]), _mm512_maddubs_epi16(wb, xb[r]));
                s[r][j] = _mm512_add_epi32(s[r][j], _mm512_madd_epi16(p, ones));
            }
        }
    }
    for &g in quads {
        let g = g as usize;
        let mut xv = [_mm512_setzero_si512(); R];
        for r in 0..R {
            xv[r] = broadcast(a, g, r0 + r);
        }
        for j in 0..2 {
            let wj = load_weights(w, g, j);
            for r in 0..R {
                s[r][j] = _mm512_add_epi32(s[r][j], _mm512_madd_epi16(_mm512_maddubs_epi16(wj, xv[r]), ones));
            }
        }
    }
    for &g in exact {
        let g = g as usize;
        for r in 0..R {
            // `|x|` times `w` negated where `x` is negative (`x = 0` multiplies to 0 either way).
            let xv = broadcast(a, g, r0 + r);
            let (xav, negative) = (_mm512_abs_epi8(xv), _mm512_movepi8_mask(xv));
            for j in 0..2 {
                let wj = super::x86::signed512(w.add(g * NR * 4 + 64 * j));
                let ws = _mm512_mask_sub_epi8(wj, negative, _mm512_setzero_si512(), wj);
                s[r][j] = _mm512_add_epi32(s[r][j], _mm512_madd_epi16(_mm512_maddubs_epi16(xav, ws), ones));
            }
        }
    }
    for r in 0..R {
        let shift = _mm512_set1_epi32(plan.compensation[r0 + r]);
        for v in s[r].iter_mut() {
            *v = _mm512_sub_epi32(*v, shift);
        }
        super::x86::store512(t, r0 + r, s[r]);
    }
}
