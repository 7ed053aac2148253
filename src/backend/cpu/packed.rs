//! Float32 `x · Wᵀ` for Linear layers with the weight packed once at load.
//!
//! Decoding multiplies a few rows by large weights (the output projection is 65k x 512),
//! so the weight stream dominates: packing it per call (as general GEMM libraries do)
//! costs more than the product. Here `W [n, k]` is stored as panels of `NR = 32` output
//! columns, each `[k][32]` contiguous (zero-padded at the tail), and register-tiled
//! kernels multiply a block of rows by one panel after the other, the part of the panel
//! in use held in L1 (AVX-512) or L2 (AVX2) while every tile of rows walks it: AVX-512F
//! in groups of 8 interleaved rows x 32 columns with k in blocks of 256, AVX2+FMA in
//! tiles of 3 rows x 32 columns. Meanwhile each fetches a later panel into L2, so that
//! the weights stream from memory under the FMAs. Whatever the tiling, every output
//! element is one chain of FMAs in k order, so both levels give the same bits. A portable
//! scalar reference checks them. The kernel is chosen at run time.
use super::huge_pages::Buffer;
use super::isa::{self, dispatch_isa, FloatLevel};
use super::OutPtr;

/// Output columns per packed panel.
pub const NR: usize = 32;
/// Rows of `x` multiplied by each panel before the next panel: as many as keep them within
/// about 512 KiB of L2 (a multiple of 8, whole AVX-512 groups, at least 8).
fn row_block(k: usize) -> usize {
    ((128 * 1024 / k.max(1)) / 8 * 8).clamp(8, 512)
}

/// A weight matrix `[n, k]` (row = output feature) packed for `matmul_packed`.
pub struct PackedMatrix {
    /// Panels, 64-byte aligned (`Buffer`).
    data: Buffer<f32>,
    n: usize,
    k: usize,
}

impl PackedMatrix {
    pub fn pack(w: &[f32], n: usize, k: usize) -> PackedMatrix {
        assert_eq!(w.len(), n * k, "PackedMatrix::pack: size mismatch");
        let panels = n.div_ceil(NR);
        let mut data = Buffer::filled(panels * k * NR, 0.0f32);
        pack_panels(w, n, k, &mut data);
        PackedMatrix { data, n, k }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    /// Copies row `i` of the original matrix (an embedding lookup on a tied projection).
    pub fn copy_row(&self, i: usize, out: &mut [f32]) {
        let (panel, c) = (self.panel(i / NR), i % NR);
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            *o = panel[kk * NR + c];
        }
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

/// Stores rows `w [n, k]` as panels `[k][NR]`, compiled per ISA. A panel is written in
/// steps of 16 values of k, in which its rows' stores stay in 16 cache lines: row by row over
/// the whole k, they spread over a panel larger than L1 (128 KiB at k = 1024), and packing
/// had taken a third of a float32 load of the zh-en model (2026-12-07).
fn pack_panels(w: &[f32], n: usize, k: usize, panels: &mut [f32]) {
    dispatch_isa!(pack_panels_generic(w: &[f32], n: usize, k: usize, panels: &mut [f32]) -> ())
}

#[inline(always)]
fn pack_panels_generic(w: &[f32], n: usize, k: usize, panels: &mut [f32]) {
    const STEP: usize = 16;
    for (p, panel) in panels.chunks_exact_mut((k * NR).max(1)).enumerate() {
        let rows = &w[p * NR * k..(p * NR + NR.min(n - p * NR)) * k];
        for k0 in (0..k).step_by(STEP) {
            let width = STEP.min(k - k0);
            let block = &mut panel[k0 * NR..(k0 + width) * NR];
            for (c, row) in rows.chunks_exact(k).enumerate() {
                for (j, &v) in row[k0..k0 + width].iter().enumerate() {
                    block[j * NR + c] = v;
                }
            }
        }
    }
}

/// `y[m, n] = x[m, k] · Wᵀ` (+ bias), overwriting `y`. With `threads > 1` the panels
/// (disjoint output columns) are split across the worker's intra threads (`team`).
pub fn matmul_packed(x: &[f32], w: &PackedMatrix, bias: Option<&[f32]>, y: &mut [f32], m: usize, threads: usize) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= m * k && y.len() >= m * n, "matmul_packed: buffer too small");
    if let Some(b) = bias {
        assert!(b.len() >= n);
    }
    let level = isa::current().float_level();
    let panels = n.div_ceil(NR);
    let out = OutPtr(y.as_mut_ptr());
    // AVX-512 reads the rows of x interleaved in groups of 8 ([k][8] per group, zero
    // padded), so the broadcasts in the kernel walk memory sequentially.
    let x_interleaved = if level == FloatLevel::Avx512 { interleave_rows(x, m, k) } else { Vec::new() };
    let block = row_block(k);
    let run = |p0: usize, p1: usize| {
        for r0 in (0..m).step_by(block) {
            let rows = block.min(m - r0);
            for p in p0..p1 {
                let cols = NR.min(n - p * NR);
                // The kernel fetches the panel after next into L2 while it computes this one:
                // with few rows a panel takes too little time to hide the memory latency of
                // the next (m = 8 and 32 ran 10-20% slower so); the hardware prefetcher
                // brings the first two.
                let prefetch = if p + 2 < p1 { w.panel(p + 2) } else { &[] };
                // `block` is a multiple of 8: row r0 starts group r0 / 8 of the interleaved x.
                let x = if level == FloatLevel::Avx512 { &x_interleaved[r0 * k..] } else { &x[r0 * k..] };
                let tile = Tile { x, k, panel: w.panel(p), bias: bias.map(|b| &b[p * NR..p * NR + cols]), prefetch };
                // SAFETY: each panel writes only its own columns of rows r0..r0+rows, all
                // inside `y` (checked above), so concurrent panels never overlap.
                let y = unsafe { std::slice::from_raw_parts_mut(out.get().add(r0 * n + p * NR), (rows - 1) * n + cols) };
                match level {
                    // SAFETY: `level` never exceeds what the CPU supports (see isa::current).
                    #[cfg(target_arch = "x86_64")]
                    FloatLevel::Avx512 => unsafe { x86::panel_avx512(&tile, y, n, rows, cols) },
                    #[cfg(target_arch = "x86_64")]
                    FloatLevel::Avx2 => unsafe { x86::panel_avx2(&tile, y, n, rows, cols) },
                    _ => panel_scalar(&tile, y, n, rows, cols),
                }
            }
        }
    };
    super::split_panels(panels, threads, m * n * k, run);
}

/// Rows of `x` regrouped 8 at a time as `[group][k][8]`, the last group zero-padded.
fn interleave_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let groups = m.div_ceil(8);
    let mut out = vec![0.0f32; groups * k * 8];
    for r in 0..m {
        let (g, lane) = (r / 8, r % 8);
        let dst = &mut out[g * k * 8..(g + 1) * k * 8];
        for (kk, &v) in x[r * k..(r + 1) * k].iter().enumerate() {
            dst[kk * 8 + lane] = v;
        }
    }
    out
}

/// Inputs of one panel product: rows of `x` (row stride `k`; AVX-512 takes them
/// interleaved, see `interleave_rows`) times one packed panel.
struct Tile<'a> {
    x: &'a [f32],
    k: usize,
    panel: &'a [f32],
    bias: Option<&'a [f32]>,
    /// Weights the kernel fetches into L2 while it computes (a later panel; each tile of
    /// rows takes a share).
    prefetch: &'a [f32],
}

/// The reference kernel every SIMD kernel is tested against.
fn panel_scalar(t: &Tile, y: &mut [f32], ldy: usize, rows: usize, cols: usize) {
    for r in 0..rows {
        let mut acc = [0.0f32; NR];
        let xr = &t.x[r * t.k..(r + 1) * t.k];
        for (kk, &xv) in xr.iter().enumerate() {
            let w = &t.panel[kk * NR..(kk + 1) * NR];
            for c in 0..NR {
                acc[c] += xv * w[c];
            }
        }
        for c in 0..cols {
            y[r * ldy + c] = acc[c] + t.bias.map_or(0.0, |b| b[c]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Tile, NR};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Share `i` of `parts` of `data`, in whole cache lines.
    fn share(data: &[f32], i: usize, parts: usize) -> &[f32] {
        let lines = data.len() / 16;
        &data[i * lines / parts * 16..(i + 1) * lines / parts * 16]
    }

    /// Splits the k steps of a kernel into runs, each led by its share of `next` (the lines
    /// of a later panel this kernel fetches into L2): a line every few steps, or a few
    /// lines every step. So reading that panel from memory overlaps the FMAs instead of
    /// stalling them later (the hardware prefetcher alone leaves gaps).
    #[inline(always)]
    fn prefetch_runs(next: &[f32], k: usize) -> impl Iterator<Item = (&[f32], Range<usize>)> {
        let lines = next.len() / 16;
        let runs = lines.clamp(1, k.max(1));
        let (mut line, mut step) = (Splits::new(lines, runs), Splits::new(k, runs));
        (0..runs).map(move |_| {
            let l = line.next();
            (&next[l.start * 16..l.end * 16], step.next())
        })
    }

    /// Cuts `0..total` into `parts` near-equal consecutive pieces, `floor(i * total / parts)`
    /// apart, without a division per piece (the kernels take one every k step or two).
    struct Splits {
        quotient: usize,
        remainder: usize,
        parts: usize,
        error: usize,
        at: usize,
    }

    impl Splits {
        fn new(total: usize, parts: usize) -> Splits {
            Splits { quotient: total / parts, remainder: total % parts, parts, error: 0, at: 0 }
        }

        #[inline(always)]
        fn next(&mut self) -> Range<usize> {
            let start = self.at;
            self.at += self.quotient;
            self.error += self.remainder;
            if self.error >= self.parts {
                self.error -= self.parts;
                self.at += 1;
            }
            start..self.at
        }
    }

    /// Fetches the cache lines of `lines` into L2.
    #[inline(always)]
    fn prefetch_l2(lines: &[f32]) {
        for line in lines.chunks(16) {
            // SAFETY: a prefetch is a hint that never faults; the line is inside a live
            // slice anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8) };
        }
    }

    /// Steps of k per pass of the AVX-512 kernel: 256 x 128 bytes of the panel (32 KiB)
    /// stay in L1 while every group of rows multiplies them.
    const KC_AVX512: usize = 256;

    /// AVX-512: the rows in groups of 8 (interleaved, `[k][8]` each) x the whole panel,
    /// 16 accumulators, k in blocks of `KC_AVX512` so that the weights come from L1: each
    /// block's partial sums wait in `y` for the next (the same FMAs in the same order as
    /// one pass, so the same result). Each pass fetches its share of `t.prefetch` into L2.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn panel_avx512(t: &Tile, y: &mut [f32], ldy: usize, rows: usize, cols: usize) {
        let groups = rows.div_ceil(8);
        let passes = groups * t.k.div_ceil(KC_AVX512).max(1);
        let mut done = 0;
        // k = 0 still takes one (empty) block, which writes the bias.
        for k0 in (0..t.k.max(1)).step_by(KC_AVX512) {
            let steps = k0..(k0 + KC_AVX512).min(t.k);
            for g in 0..groups {
                let group = Tile { x: &t.x[g * 8 * t.k..], prefetch: share(t.prefetch, done, passes), ..*t };
                group_avx512(&group, steps.clone(), &mut y[g * 8 * ldy..], ldy, 8.min(rows - g * 8), cols);
                done += 1;
            }
        }
    }

    /// AVX-512: one group of 8 interleaved rows (`t.x`, `[k][8]`) x one panel over the k
    /// `steps`, accumulators in registers, starting from the partial sums in `y` unless
    /// `steps` starts at 0, adding the bias if it ends at k.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn group_avx512(t: &Tile, steps: Range<usize>, y: &mut [f32], ldy: usize, rows: usize, cols: usize) {
        let (x, w) = (t.x.as_ptr(), t.panel.as_ptr());
        // Lanes of the two column vectors that are real columns of y: the masked loads and
        // stores below touch only those of the `rows` real rows, all inside `y`.
        let masks = [mask16(cols), mask16(cols.saturating_sub(16))];
        let mut acc = [[_mm512_setzero_ps(); 2]; 8];
        if steps.start > 0 {
            for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_maskz_loadu_ps(masks[j], y.as_ptr().add(r * ldy + 16 * j));
                }
            }
        }
        let (k0, k1) = (steps.start, steps.end);
        for (line, run) in prefetch_runs(t.prefetch, k1 - k0) {
            prefetch_l2(line);
            for kk in k0 + run.start..k0 + run.end {
                let w0 = _mm512_loadu_ps(w.add(kk * NR));
                let w1 = _mm512_loadu_ps(w.add(kk * NR + 16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_ps(*x.add(kk * 8 + r));
                    acc[0] = _mm512_fmadd_ps(xv, w0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(xv, w1, acc[1]);
                }
            }
        }
        // Partial sums are stored as they are; the final ones plus the bias, or plus 0 as
        // the AVX2 kernel does (-0 becomes +0), so that both levels give the same bits.
        let last = k1 == t.k;
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (j, &a) in acc.iter().enumerate() {
                let v = match t.bias {
                    _ if !last => a,
                    Some(b) => _mm512_add_ps(a, _mm512_maskz_loadu_ps(masks[j], b.as_ptr().add(16 * j))),
                    None => _mm512_add_ps(a, _mm512_setzero_ps()),
                };
                _mm512_mask_storeu_ps(y.as_mut_ptr().add(r * ldy + 16 * j), masks[j], v);
            }
        }
    }

    /// The first `n` (at most 16) lanes.
    fn mask16(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// AVX2 + FMA: the rows in tiles of 3 rows x the whole panel (32 columns): 12
    /// accumulators + 3 broadcasts + 1 weight vector = the 16 ymm registers, 3 broadcasts
    /// and 4 weight loads per 12 FMAs. Broadcasts are what limits: on an AVX2-only AMD EPYC
    /// (Zen 3) 12 FMAs took as long with 8 plain loads as alone, 6% longer with 3
    /// broadcasts + 4 loads, but 30% longer with the 6 broadcasts + 2 loads of the former
    /// 6 x 16 tiles (2026-11-27; gemm_bench then gained 7-16%, float32 zh-en greedy 6-9%,
    /// beam 4 15%). The 1 or 2 leftover rows take a tile of their own. Each tile fetches
    /// its share of `t.prefetch` into L2.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn panel_avx2(t: &Tile, y: &mut [f32], ldy: usize, rows: usize, cols: usize) {
        let full = rows / 3 * 3;
        let left = rows - full;
        let tiles = full / 3 + usize::from(left > 0);
        let mut done = 0;
        let mut next = || {
            done += 1;
            Tile { prefetch: share(t.prefetch, done - 1, tiles), ..*t }
        };
        for r0 in (0..full).step_by(3) {
            tile_avx2::<3>(&next(), r0, y, ldy, cols);
        }
        match left {
            0 => {}
            1 => tile_avx2::<1>(&next(), full, y, ldy, cols),
            _ => tile_avx2::<2>(&next(), full, y, ldy, cols),
        }
    }

    /// Rows `r0..r0 + MR` x the panel's 32 columns (`cols` of them are real): per k step
    /// the rows' broadcasts first, then one weight vector at a time (so 3 x 32 fits the
    /// registers).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const MR: usize>(t: &Tile, r0: usize, y: &mut [f32], ldy: usize, cols: usize) {
        const NV: usize = NR / 8;
        let mut acc = [[_mm256_setzero_ps(); NV]; MR];
        let k = t.k;
        let x = t.x.as_ptr().add(r0 * k);
        let w = t.panel.as_ptr();
        // One k step of the tile.
        let step = |kk: usize, acc: &mut [[__m256; NV]; MR]| {
            let mut xv = [_mm256_setzero_ps(); MR];
            for (r, v) in xv.iter_mut().enumerate() {
                *v = _mm256_set1_ps(*x.add(r * k + kk));
            }
            for j in 0..NV {
                let wv = _mm256_loadu_ps(w.add(kk * NR + 8 * j));
                for (acc, &xv) in acc.iter_mut().zip(&xv) {
                    acc[j] = _mm256_fmadd_ps(xv, wv, acc[j]);
                }
            }
        };
        for (line, run) in prefetch_runs(t.prefetch, k) {
            prefetch_l2(line);
            // Two k steps per turn of the loop: one step's 21 instructions are within 3 of
            // what the 4-wide front end issues while the FMA ports take 6 cycles, and
            // the loop's own count and branch made the difference (Skylake-SP, gemm_bench
            // float32 128x2048x512: 54 -> 63 GFLOP/s; by four, the accumulators spilled).
            let mut kk = run.start;
            while kk + 2 <= run.end {
                step(kk, &mut acc);
                step(kk + 1, &mut acc);
                kk += 2;
            }
            if kk < run.end {
                step(kk, &mut acc);
            }
        }
        let width = NR.min(cols);
        for (r, acc) in acc.iter().enumerate() {
            let y = y[(r0 + r) * ldy..(r0 + r) * ldy + width].as_mut_ptr();
            for (j, &a) in acc.iter().enumerate() {
                let lanes = width.saturating_sub(8 * j).min(8);
                if lanes == 0 {
                    break;
                }
                let bias = t.bias.map_or(_mm256_setzero_ps(), |b| load8(b[8 * j..].as_ptr(), lanes));
                store8(y.add(8 * j), _mm256_add_ps(a, bias), lanes);
            }
        }
    }

    /// Loads the first `lanes` floats at `p` (the others zero), reading nothing beyond.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const f32, lanes: usize) -> __m256 {
        if lanes == 8 {
            _mm256_loadu_ps(p)
        } else {
            _mm256_maskload_ps(p, mask8(lanes))
        }
    }

    /// Stores the first `lanes` floats of `v` at `p`, writing nothing beyond.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store8(p: *mut f32, v: __m256, lanes: usize) {
        if lanes == 8 {
            _mm256_storeu_ps(p, v)
        } else {
            _mm256_maskstore_ps(p, mask8(lanes), v)
        }
    }

    /// The first `lanes` (at most 8) lanes set.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn mask8(lanes: usize) -> __m256i {
        _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing (compiled per ISA, in steps of k) keeps every row and pads with zeros.
    #[test]
    fn packing_keeps_every_row_on_every_isa() {
        for &(n, k) in &[(1, 1), (33, 7), (70, 130), (40, 513), (3, 0), (64, 16)] {
            let w: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.25 - 3.0).collect();
            let mut row = vec![0.0f32; k];
            for isa in isa::available() {
                let packed = isa::with_isa(isa, || PackedMatrix::pack(&w, n, k));
                for c in 0..n {
                    packed.copy_row(c, &mut row);
                    assert_eq!(row, &w[c * k..(c + 1) * k], "{isa:?} {n}x{k} row {c}");
                }
                let last = packed.panel((n - 1) / NR);
                let lanes = n - (n - 1) / NR * NR;
                assert!(last.chunks_exact(NR).all(|step| step[lanes..].iter().all(|&v| v == 0.0)), "{isa:?} {n}x{k}");
            }
        }
    }

    #[test]
    fn every_kernel_matches_the_naive_product_and_the_simd_ones_agree_bit_for_bit() {
        // Every leftover row count of the AVX2 tiles, partial panels and half panels, k
        // over one AVX-512 block and k = 0.
        for &(m, n, k) in &[(1, 1, 1), (5, 33, 7), (9, 64, 16), (13, 70, 130), (100, 40, 3), (8, 50, 600), (17, 40, 513), (3, 20, 0)] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            let packed = PackedMatrix::pack(&w, n, k);
            let mut simd_bits = None;
            for isa in isa::available() {
                let mut y = vec![f32::NAN; m * n];
                isa::with_isa(isa, || matmul_packed(&x, &packed, Some(&bias), &mut y, m, 1));
                // One FMA chain in k order per element at every SIMD level, whatever its tiles.
                if isa.float_level() != FloatLevel::Scalar {
                    let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(simd_bits.get_or_insert_with(|| bits.clone()), &bits, "{isa:?} {m}x{n}x{k}");
                }
                for i in 0..m {
                    for j in 0..n {
                        let r: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f32>() + bias[j];
                        let v = y[i * n + j];
                        assert!((v - r).abs() <= 1e-4 * r.abs().max(1.0), "{isa:?} {m}x{n}x{k} [{i},{j}]: {v} vs {r}");
                    }
                }
            }
        }
    }
}
