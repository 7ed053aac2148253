//! Float32 `x · Wᵀ` for Linear layers with the weight packed once at load.
//!
//! Decoding multiplies a few rows by large weights (the output projection is 65k x 512),
//! so the weight stream dominates: packing it per call (as general GEMM libraries do)
//! costs more than the product. Here `W [n, k]` is stored as panels of `NR = 32` output
//! columns, each `[k][32]` contiguous (zero-padded at the tail), and register-tiled
//! kernels walk them: AVX-512F takes blocks of panels that stay in L2 while every group of
//! 8 rows multiplies them, AVX2+FMA blocks of rows per panel; a portable scalar reference
//! checks both. The kernel is chosen at run time.
use super::isa::{self, FloatLevel};
use super::OutPtr;

/// Output columns per packed panel.
pub const NR: usize = 32;
/// Rows of `x` processed while one panel is hot in cache (AVX2 and scalar paths): as many
/// as keep them within about 512 KiB of L2 (a multiple of 8, at least 8).
fn row_block(k: usize) -> usize {
    ((128 * 1024 / k.max(1)) / 8 * 8).clamp(8, 512)
}

/// A weight matrix `[n, k]` (row = output feature) packed for `matmul_packed`.
pub struct PackedMatrix {
    /// Panels start at `data[start]`, 64-byte aligned so that no vector load of the
    /// kernels straddles two cache lines.
    data: Vec<f32>,
    start: usize,
    n: usize,
    k: usize,
}

impl PackedMatrix {
    pub fn pack(w: &[f32], n: usize, k: usize) -> PackedMatrix {
        assert_eq!(w.len(), n * k, "PackedMatrix::pack: size mismatch");
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0f32; panels * k * NR + 16];
        let start = data.as_ptr().align_offset(64).min(15);
        for p in 0..panels {
            let panel = &mut data[start + p * k * NR..start + (p + 1) * k * NR];
            for c in 0..NR.min(n - p * NR) {
                let row = &w[(p * NR + c) * k..(p * NR + c + 1) * k];
                for (kk, &v) in row.iter().enumerate() {
                    panel[kk * NR + c] = v;
                }
            }
        }
        PackedMatrix { data, start, n, k }
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
        self.panels(p, p + 1)
    }

    /// Panels `p0..p1`, contiguous.
    fn panels(&self, p0: usize, p1: usize) -> &[f32] {
        &self.data[self.start + p0 * self.k * NR..self.start + p1 * self.k * NR]
    }
}

/// `y[m, n] = x[m, k] · Wᵀ` (+ bias), overwriting `y`. With `threads > 1` the panels
/// (disjoint output columns) are split across the current rayon pool.
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
    // AVX-512 takes the panels in blocks of about 512 KiB that stay in L2 while every group
    // of 8 rows multiplies them (long contiguous output runs per row, no partial sums).
    let panel_block = (512 * 1024 / (4 * k * NR).max(1)).max(1);
    let run = |p0: usize, p1: usize| {
        #[cfg(target_arch = "x86_64")]
        if level == FloatLevel::Avx512 {
            for b0 in (p0..p1).step_by(panel_block) {
                let b1 = (b0 + panel_block).min(p1);
                let groups = m.div_ceil(8);
                // The first group streams the block from memory; the others fetch the next
                // block into L2 meanwhile, each tile a share, so no group waits for memory.
                let next = w.panels(b1, (b1 + panel_block).min(p1));
                let tiles = (groups - 1) * (b1 - b0);
                let share = |g: usize, p: usize| {
                    if g == 0 {
                        return &next[..0];
                    }
                    let t = (g - 1) * (b1 - b0) + (p - b0);
                    let lines = next.len() / 16;
                    &next[t * lines / tiles * 16..(t + 1) * lines / tiles * 16]
                };
                for g in 0..groups {
                    let rows = 8.min(m - g * 8);
                    for p in b0..b1 {
                        let cols = NR.min(n - p * NR);
                        let tile = Tile {
                            x: &x_interleaved[g * 8 * k..],
                            k,
                            panel: w.panel(p),
                            bias: bias.map(|b| &b[p * NR..p * NR + cols]),
                            prefetch: share(g, p),
                        };
                        // SAFETY: as below; the level is supported (see isa::current).
                        unsafe {
                            let y = std::slice::from_raw_parts_mut(out.get().add(g * 8 * n + p * NR), (rows - 1) * n + cols);
                            x86::group_avx512(&tile, y, n, rows, cols)
                        }
                    }
                }
            }
            return;
        }
        for r0 in (0..m).step_by(block) {
            let rows = block.min(m - r0);
            for p in p0..p1 {
                let cols = NR.min(n - p * NR);
                let tile = Tile { x: &x[r0 * k..], k, panel: w.panel(p), bias: bias.map(|b| &b[p * NR..p * NR + cols]), prefetch: &[] };
                // SAFETY: each panel writes only its own columns of rows r0..r0+rows, all
                // inside `y` (checked above), so concurrent panels never overlap.
                let y = unsafe { std::slice::from_raw_parts_mut(out.get().add(r0 * n + p * NR), (rows - 1) * n + cols) };
                match level {
                    // SAFETY: `level` never exceeds what the CPU supports (see isa::current).
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


/// Inputs of one panel product: rows of `x` (row stride `k`) times one packed panel.
struct Tile<'a> {
    x: &'a [f32],
    k: usize,
    panel: &'a [f32],
    bias: Option<&'a [f32]>,
    /// Weights this tile fetches into L2 while it computes (its share of the next block).
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

    /// Stores `NR` accumulated columns (as `L` vectors of `W` lanes) of one row, adding the
    /// bias and dropping the zero-padded tail columns.
    #[inline(always)]
    fn store_row(acc: &[f32; NR], t: &Tile, y: &mut [f32], cols: usize) {
        for c in 0..cols {
            y[c] = acc[c] + t.bias.map_or(0.0, |b| b[c]);
        }
    }

    /// AVX-512: one group of 8 interleaved rows (`t.x`, `[k][8]`) x one panel over the whole
    /// of k, accumulators in registers.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn group_avx512(t: &Tile, y: &mut [f32], ldy: usize, rows: usize, cols: usize) {
        let (x, w) = (t.x.as_ptr(), t.panel.as_ptr());
        let mut acc0 = [_mm512_setzero_ps(); 8];
        let mut acc1 = [_mm512_setzero_ps(); 8];
        let (pf, pf_lines) = (t.prefetch.as_ptr(), t.prefetch.len() / 16);
        let pf_every = t.k.div_ceil(pf_lines.max(1)).max(1);
        let (mut pf_line, mut pf_wait) = (0, 0);
        for kk in 0..t.k {
            if pf_line < pf_lines {
                if pf_wait == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(pf.add(pf_line * 16) as *const i8);
                    pf_line += 1;
                    pf_wait = pf_every;
                }
                pf_wait -= 1;
            }
            _mm_prefetch::<_MM_HINT_T0>(w.add(kk * NR + 16 * NR) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(w.add(kk * NR + 16 * NR + 16) as *const i8);
            let w0 = _mm512_loadu_ps(w.add(kk * NR));
            let w1 = _mm512_loadu_ps(w.add(kk * NR + 16));
            for r in 0..8 {
                let xv = _mm512_set1_ps(*x.add(kk * 8 + r));
                acc0[r] = _mm512_fmadd_ps(xv, w0, acc0[r]);
                acc1[r] = _mm512_fmadd_ps(xv, w1, acc1[r]);
            }
        }
        for r in 0..rows {
            let mut row = [0.0f32; NR];
            _mm512_storeu_ps(row.as_mut_ptr(), acc0[r]);
            _mm512_storeu_ps(row.as_mut_ptr().add(16), acc1[r]);
            store_row(&row, t, &mut y[r * ldy..], cols);
        }
    }

    /// AVX2 + FMA: tiles of MR rows x 32 columns (4 ymm per row).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn panel_avx2(t: &Tile, y: &mut [f32], ldy: usize, rows: usize, cols: usize) {
        let mut r = 0;
        while r + 3 <= rows {
            tile_avx2::<3>(t, r, y, ldy, cols);
            r += 3;
        }
        while r < rows {
            tile_avx2::<1>(t, r, y, ldy, cols);
            r += 1;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const MR: usize>(t: &Tile, r0: usize, y: &mut [f32], ldy: usize, cols: usize) {
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        let k = t.k;
        let x = t.x.as_ptr().add(r0 * k);
        let w = t.panel.as_ptr();
        for kk in 0..k {
            let wv = [
                _mm256_loadu_ps(w.add(kk * NR)),
                _mm256_loadu_ps(w.add(kk * NR + 8)),
                _mm256_loadu_ps(w.add(kk * NR + 16)),
                _mm256_loadu_ps(w.add(kk * NR + 24)),
            ];
            for r in 0..MR {
                let xv = _mm256_set1_ps(*x.add(r * k + kk));
                for j in 0..4 {
                    acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
                }
            }
        }
        for r in 0..MR {
            let mut row = [0.0f32; NR];
            for j in 0..4 {
                _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), acc[r][j]);
            }
            store_row(&row, t, &mut y[(r0 + r) * ldy..], cols);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_matches_the_naive_product() {
        for &(m, n, k) in &[(1, 1, 1), (5, 33, 7), (9, 64, 16), (13, 70, 130), (100, 40, 3)] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            let packed = PackedMatrix::pack(&w, n, k);
            for isa in isa::available() {
                let mut y = vec![f32::NAN; m * n];
                isa::with_isa(isa, || matmul_packed(&x, &packed, Some(&bias), &mut y, m, 1));
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
