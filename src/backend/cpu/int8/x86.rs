//! What the x86 int8 kernels share: the L2 prefetcher of the next block's weights, the
//! dispatch over a tile's row count, the weights' sign flip, stores through the epilogue.
use super::{TileOut, MR, NR};
use std::arch::x86_64::*;

/// Issues the lines of `TileOut::prefetch` into L2 from the tile's first k steps on, the
/// same number each step (`per`, at least two; one for a unit's part of a spread share,
/// `for_unit`), so that the only branches are a loop of constant count and a test that
/// stays true until the share is done. (It had spread the lines evenly with a credit loop
/// whose exit the data decided: mispredicted, it made a tile's first unit 10% slower;
/// bench/RESULTS.md, 2026-12-07.) For a block's share taken by a tile's first unit, two a
/// step beat one (gemm_bench AVX2 32 x 65000 x 512, 85 lines in 64 steps: 197 -> 210
/// GOP/s); more than the share needs did not (4 a step at 8 and 16 rows: equal or slower),
/// nor did spreading that share over every unit of the tile (8-15% slower, and on
/// 2026-12-07 the same time). The panel-outer order spreads thin shares instead (see
/// `PANEL_AHEAD`).
pub(super) struct Prefetcher {
    ptr: *const u8,
    /// The next line's offset, and the end of the share.
    next: usize,
    end: usize,
    per: usize,
}

impl Prefetcher {
    #[inline(always)]
    pub(super) fn new(data: &[u8], steps: usize) -> Prefetcher {
        Prefetcher::with_least(data, steps, 2)
    }

    /// What unit `unit` of a tile's `units` fetches over its `steps`: its part of a spread
    /// share (`TileOut::spread`), else the whole share for the first unit and nothing for
    /// the others.
    #[inline(always)]
    pub(super) fn of_unit(t: &TileOut, unit: usize, units: usize, steps: usize) -> Prefetcher {
        match (t.spread, unit) {
            (true, _) => Prefetcher::for_unit(t.prefetch, unit, units, steps),
            (false, 0) => Prefetcher::new(t.prefetch, steps),
            (false, _) => Prefetcher::new(&[], steps),
        }
    }

    /// Unit `unit` of `units`' part of a spread share: a few lines, one a step.
    #[inline(always)]
    fn for_unit(share: &[u8], unit: usize, units: usize, steps: usize) -> Prefetcher {
        Prefetcher::with_least(super::line_share(share, unit, units), steps, 1)
    }

    #[inline(always)]
    fn with_least(data: &[u8], steps: usize, least: usize) -> Prefetcher {
        let lines = data.len() / 64;
        let per = lines.div_ceil(steps.max(1)).max(least);
        Prefetcher { ptr: data.as_ptr(), next: 0, end: lines * 64, per }
    }

    /// Whether there is nothing to fetch.
    #[inline(always)]
    pub(super) fn is_empty(&self) -> bool {
        self.end == 0
    }

    #[inline(always)]
    pub(super) unsafe fn step(&mut self) {
        if self.next < self.end {
            for _ in 0..self.per {
                // The last step's lines past the share fetch its last line again.
                _mm_prefetch::<_MM_HINT_T1>(self.ptr.add(self.next.min(self.end - 64)) as *const i8);
                self.next += 64;
            }
        }
    }
}

#[cfg(test)]
#[test]
fn the_prefetcher_issues_every_line_within_the_steps() {
    let data = vec![0u8; 64 * 300];
    for (lines, steps) in [(0, 64), (1, 64), (63, 64), (64, 64), (85, 64), (256, 64), (300, 1), (5, 0)] {
        let mut p = Prefetcher::new(&data[..64 * lines], steps);
        for _ in 0..steps.max(1) {
            // SAFETY: prefetches of lines inside `data` (a hint; never faults).
            unsafe { p.step() };
        }
        assert!(p.next >= 64 * lines, "{lines} lines in {steps} steps");
    }
    // The units' parts cover a share once, in order, whatever the counts.
    for (lines, units) in [(0, 4), (1, 4), (16, 4), (17, 3), (64, 1), (5, 8)] {
        let mut covered = 0;
        for u in 0..units {
            let p = Prefetcher::for_unit(&data[..64 * lines], u, units, 64);
            assert_eq!(p.ptr as usize - data.as_ptr() as usize, 64 * covered, "{lines} lines, unit {u} of {units}");
            assert_eq!(p.is_empty(), p.end == 0);
            covered += p.end / 64;
        }
        assert_eq!(covered, lines);
    }
}

/// Calls the register-tiled kernel instantiated for the tile's row count (1..=8), and
/// for `$flag` after it where given.
macro_rules! by_rows {
    ($kernel:ident $(, $flag:literal)?; $rows:expr, $($arg:expr),*) => {
        match $rows {
            8 => $kernel::<8 $(, $flag)?>($($arg),*),
            7 => $kernel::<7 $(, $flag)?>($($arg),*),
            6 => $kernel::<6 $(, $flag)?>($($arg),*),
            5 => $kernel::<5 $(, $flag)?>($($arg),*),
            4 => $kernel::<4 $(, $flag)?>($($arg),*),
            3 => $kernel::<3 $(, $flag)?>($($arg),*),
            2 => $kernel::<2 $(, $flag)?>($($arg),*),
            _ => $kernel::<1 $(, $flag)?>($($arg),*),
        }
    };
}

/// Runs a 256-bit kernel (`$kernel::<R>`, and `$flag` where given) over the tile's rows
/// two at a time, then the odd row left; `$r` is the first row of each call.
macro_rules! by_row_pairs {
    ($kernel:ident $(, $flag:literal)?; $t:expr, |$r:ident| ($($arg:expr),*)) => {{
        let mut $r = 0;
        while $r + 2 <= $t.rows {
            $kernel::<2 $(, $flag)?>($($arg),*);
            $r += 2;
        }
        if $r < $t.rows {
            $kernel::<1 $(, $flag)?>($($arg),*);
        }
    }};
}

/// Runs a planned kernel's `$unit::<R, PREFETCH>(x, plan, r, panel, t, prefetcher)` over
/// the tile's rows two at a time (a unit), then the odd one. The first unit fetches the
/// tile's share of the next block, or each unit its part of a spread share
/// (`Prefetcher::of_unit`, a fetch per 8 k); units with nothing to fetch are instantiated
/// without the prefetcher's per-step check.
macro_rules! by_planned_units {
    ($unit:ident; $x:expr, $plan:expr, $panel:expr, $kp:expr, $t:expr) => {{
        let (units, steps) = ($t.rows.div_ceil(2), $kp / 8);
        let mut r = 0;
        while r < $t.rows {
            let pf = Prefetcher::of_unit($t, r / 2, units, steps);
            match ($t.rows - r >= 2, pf.is_empty()) {
                (true, false) => $unit::<2, true>($x, $plan, r, $panel, $t, pf),
                (true, true) => $unit::<2, false>($x, $plan, r, $panel, $t, pf),
                (false, false) => $unit::<1, true>($x, $plan, r, $panel, $t, pf),
                (false, true) => $unit::<1, false>($x, $plan, r, $panel, $t, pf),
            }
            r += 2;
        }
    }};
}

pub(super) use {by_planned_units, by_row_pairs, by_rows};

/// 64 stored weight bytes at `w` as the signed weights.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn signed512(w: *const u8) -> __m512i {
    _mm512_xor_si512(_mm512_loadu_si512(w as *const _), _mm512_set1_epi8(super::WEIGHT_FLIP as i8))
}

/// 32 stored weight bytes at `w` as the signed weights.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn signed256(w: *const u8) -> __m256i {
    _mm256_xor_si256(_mm256_loadu_si256(w as *const _), _mm256_set1_epi8(super::WEIGHT_FLIP as i8))
}

/// Row `r`'s 32 accumulators (two zmm, column order) through the tile's epilogue, in
/// registers: `TileOut::store`'s arithmetic lane for lane (see `store256`).
///
/// # Safety
/// Only for the AVX-512 kernels (the CPU runs AVX-512F), with `t` and `r` as for
/// `TileOut::store`: row `r` of the tile exists in the output.
#[inline(always)]
pub(super) unsafe fn store512(t: &TileOut, r: usize, s: [__m512i; 2]) {
    let e = t.e;
    let at = |v: &[f32; NR], j: usize| _mm512_loadu_ps(v.as_ptr().add(16 * j));
    let mut out = [_mm512_setzero_ps(); 2];
    if e.intgemm {
        for j in 0..2 {
            out[j] = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[j]), at(&e.w_scales, j)), at(&e.bias, j));
        }
    } else {
        let inv_x = _mm512_set1_ps(t.inv_x[r]);
        for j in 0..2 {
            let acc = _mm512_sub_epi32(s[j], _mm512_loadu_si512(e.compensation.as_ptr().add(16 * j) as *const _));
            out[j] = _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), inv_x), at(&e.w_scales, j)), at(&e.bias, j));
        }
    }
    if e.relu {
        out = out.map(|v| _mm512_max_ps(v, _mm512_setzero_ps()));
    }
    crate::backend::cpu::row_store::store512(t.y.add(r * t.ldy), out, e.cols);
}

/// Row `r`'s 32 accumulators (four ymm, column order) through the tile's epilogue, in
/// registers: `TileOut::store`'s arithmetic lane for lane (the same operations in the same
/// order, none fused), so the outputs are the same bits. Through `TileOut::store`'s arrays
/// the accumulators went to the stack and back three times, each trip a store-to-load
/// forward on the unit's critical path: about 100 cycles a unit of two rows outside its k
/// loop, a tenth of the unit at k = 512 (Zen 4 held to AVX2, 2026-12-07: a tile of 8 rows
/// over one panel in L1, 107 ns fixed per tile against 4 x 3.7 ns per 8 k). It has no
/// target feature of its own, so that it inlines into its callers (with one, LLVM left it
/// a call that passed the accumulators through memory again).
///
/// # Safety
/// Only for the 256-bit kernels (the CPU runs AVX2), with `t` and `r` as for
/// `TileOut::store`: row `r` of the tile exists in the output.
#[inline(always)]
pub(super) unsafe fn store256(t: &TileOut, r: usize, s: [__m256i; 4]) {
    let e = t.e;
    let at = |v: &[f32; NR], j: usize| _mm256_loadu_ps(v.as_ptr().add(8 * j));
    let mut out = [_mm256_setzero_ps(); 4];
    if e.intgemm {
        for j in 0..4 {
            out[j] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[j]), at(&e.w_scales, j)), at(&e.bias, j));
        }
    } else {
        let inv_x = _mm256_set1_ps(t.inv_x[r]);
        for j in 0..4 {
            let acc = _mm256_sub_epi32(s[j], _mm256_loadu_si256(e.compensation.as_ptr().add(8 * j) as *const _));
            out[j] = _mm256_add_ps(_mm256_div_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), inv_x), at(&e.w_scales, j)), at(&e.bias, j));
        }
    }
    if e.relu {
        // `f32::max(v, 0.0)` as it compiles: 0 for a NaN (and for -0).
        out = out.map(|v| _mm256_max_ps(v, _mm256_setzero_ps()));
    }
    crate::backend::cpu::row_store::store256(t.y.add(r * t.ldy), out, e.cols);
}

/// The 4 activation bytes of row `r` in k-group `g`, broadcast as one 32-bit value.
#[inline(always)]
pub(super) unsafe fn x4(a: *const u8, g: usize, r: usize) -> i32 {
    (a.add((g * MR + r) * 4) as *const i32).read_unaligned()
}
