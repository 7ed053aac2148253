//! The VNNI kernels (`vpdpbusd`: u8 x s8 -> s32, four products a lane, exact): AVX-512
//! VNNI on 512-bit registers and AVX-VNNI on 256-bit ones.
use super::x86::{by_rows, signed512, store256, store512, x4, Prefetcher};
use super::{TileOut, NR};
use std::arch::x86_64::*;

/// AVX-512 VNNI: up to 8 rows x 32 columns, 2 zmm accumulators per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn tile_avx512_vnni(a: &[u8], panel: &[u8], kp: usize, t: &TileOut) {
    by_rows!(vnni512; t.rows, a, panel, kp, t)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni512<const R: usize>(a: &[u8], panel: &[u8], kp: usize, t: &TileOut) {
    let (a, w) = (a.as_ptr(), panel.as_ptr());
    let mut s0 = [_mm512_setzero_si512(); R];
    let mut s1 = [_mm512_setzero_si512(); R];
    let mut pf = Prefetcher::new(t.prefetch, kp / 4);
    for g in 0..kp / 4 {
        pf.step();
        // The row groups after the first find the panel in L2 and fetch it 8 steps ahead
        // into L1. The first group does not: it streams the weights from memory, which
        // the hardware prefetcher keeps ahead of, and the extra requests slowed it (Zen
        // 4, 2026-11-29, alternating runs, one sentence at a time, where the first
        // group is the only one: int8 beam 4 196-221 -> 244-250 tokens/s, greedy 202-248
        // -> 260-288; gemm_bench 4x65000x512 162-177 -> 192-215 GOP/s).
        if !t.streams {
            _mm_prefetch::<_MM_HINT_T0>(w.add((g + 8) * NR * 4) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(w.add((g + 8) * NR * 4 + 64) as *const i8);
        }
        let w0 = signed512(w.add(g * NR * 4));
        let w1 = signed512(w.add(g * NR * 4 + 64));
        for r in 0..R {
            let xv = _mm512_set1_epi32(x4(a, g, r));
            s0[r] = _mm512_dpbusd_epi32(s0[r], xv, w0);
            s1[r] = _mm512_dpbusd_epi32(s1[r], xv, w1);
        }
    }
    for r in 0..R {
        store512(t, r, [s0[r], s1[r]]);
    }
}

/// AVX-VNNI (256-bit): rows three at a time x 32 columns (4 ymm per row), the rest two
/// or one. `vpdpbusd` multiplies the stored `w + 128` (its unsigned operand) by signed
/// `x`, so the weights need no flip; `row_shifts` holds each row's `128 Σ x`, taken off
/// before the epilogue. Three rows make 12 independent sums against two rows' 8:
/// `vpdpbusd` takes 4 cycles and 2 issue a cycle, so 8 chains reach 93% of its peak and
/// 12 all of it (Zen 5, 2026-12-01); 12 sums, 3 broadcasts and one weight register are
/// the 16 registers, which the flip's constant no longer needs.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub unsafe fn tile_avx_vnni(a: &[u8], row_shifts: &[i32], panel: &[u8], kp: usize, t: &TileOut) {
    let mut r = 0;
    while r < t.rows {
        match t.rows - r {
            1 => vnni256::<1>(a, row_shifts, r, panel, kp, t),
            2 => vnni256::<2>(a, row_shifts, r, panel, kp, t),
            _ => vnni256::<3>(a, row_shifts, r, panel, kp, t),
        }
        r += 3;
    }
}

#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn vnni256<const R: usize>(a: &[u8], row_shifts: &[i32], r0: usize, panel: &[u8], kp: usize, t: &TileOut) {
    let (a, w) = (a.as_ptr(), panel.as_ptr());
    let mut s = [[_mm256_setzero_si256(); 4]; R];
    let mut pf = Prefetcher::of_unit(t, r0 / 3, t.rows.div_ceil(3), kp / 4);
    for g in 0..kp / 4 {
        pf.step();
        let mut xv = [_mm256_setzero_si256(); R];
        for r in 0..R {
            xv[r] = _mm256_set1_epi32(x4(a, g, r0 + r));
        }
        for j in 0..4 {
            let wj = _mm256_loadu_si256(w.add(g * NR * 4 + 32 * j) as *const _);
            for r in 0..R {
                s[r][j] = _mm256_dpbusd_avx_epi32(s[r][j], wj, xv[r]);
            }
        }
    }
    for r in 0..R {
        let shift = _mm256_set1_epi32(row_shifts[r0 + r]);
        store256(t, r0 + r, s[r].map(|v| _mm256_sub_epi32(v, shift)));
    }
}
