//! int16 Linear layers: `y = x · Wᵀ` with `W` quantized per tensor and `x` quantized on the
//! fly, multiplied as 16-bit integers with 32-bit accumulation.
//!
//! CTranslate2 4.8 on CPU (rne = round half to even, `nearbyintf`, binary version >= 5):
//! - weights (src/ops/quantize_cpu.cc, PER_LAYER): `s_w = 1024 / amax(|W|)`, `q = clamp(rne(w * s_w))`;
//! - inputs (src/layers/common.cc Dense, GLOBAL scale = 1000 from src/ops/quantize.cc):
//!   `q = clamp(rne(x * 1000), -32768, 32767)`, so |x| > 32.767 saturates;
//! - output (src/ops/dequantize_cpu.cc, then BiasAdd): `y = float(acc) * (1 / (1000 * s_w)) + b`.
//!
//! Weights are packed once into panels of `NR = 32` output columns with k in pairs,
//! `[k/2][32][2]` i16, the operand layout of `vpmaddwd` / `vpdpwssd` (two s16 x s16 products
//! summed per 32-bit lane); activation rows are interleaved by 8 as `[k/2][8]` 32-bit pairs
//! so that one broadcast feeds a whole panel row. With CT2's weights (|q| <= 1024) a sum is
//! exact while `Σ|x| < 2097` over its row (|acc| <= 1024 · 1000 · Σ|x| < 2^31), CT2/MKL's limit too;
//! beyond that every path wraps modulo 2^32 alike, so all ISAs stay bit-identical.
use super::huge_pages::Buffer;
use super::isa::{self, dispatch_isa, Isa};
use super::OutPtr;

/// Output columns per packed panel.
pub const NR: usize = 32;
/// Activation rows interleaved together (the tile height of the AVX-512 kernels).
const MR: usize = 8;
/// CTranslate2's fixed input scale of int16 Dense layers (`global_int16_scale`).
const X_SCALE: f32 = 1000.0;

/// `clamp(rne(v * scale))` as an i16, as CTranslate2's quantize_s16_kernel (a NaN gives 0).
#[inline(always)]
fn quantize_value(v: f32, scale: f32) -> i16 {
    (v * scale).round_ties_even().clamp(-32768.0, 32767.0) as i16
}

// Compiled per ISA, where rounding is an instruction: in the baseline build it is a call to
// the C library's rintf per weight, 0.5 s of an int16 load of the zh-en model.
fn max_magnitude(w: &[f32]) -> f32 {
    dispatch_isa!(max_magnitude_generic(w: &[f32]) -> f32)
}

#[inline(always)]
fn max_magnitude_generic(w: &[f32]) -> f32 {
    w.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

fn quantize_all(w: &[f32], scale: f32, q: &mut [i16]) {
    dispatch_isa!(quantize_all_generic(w: &[f32], scale: f32, q: &mut [i16]) -> ())
}

#[inline(always)]
fn quantize_all_generic(w: &[f32], scale: f32, q: &mut [i16]) {
    q.iter_mut().zip(w).for_each(|(q, &v)| *q = quantize_value(v, scale));
}

/// A weight matrix `[n, k]` quantized to int16 (one scale) and packed for [`matmul_i16`].
pub struct PackedI16Matrix {
    /// Panels `[pairs][NR][2]`, 64-byte aligned (`Buffer`).
    data: Buffer<i16>,
    n: usize,
    k: usize,
    /// `k / 2` rounded up (an odd k is padded with a zero).
    pairs: usize,
    /// CTranslate2's scale: `w = q / scale`.
    scale: f32,
}

impl PackedI16Matrix {
    /// Quantizes float weights `[n, k]` (row = output feature) as CTranslate2 does for
    /// compute_type int16. A zero tensor gets scale inf and q = 0 (CT2's 0 * inf is NaN,
    /// cast to an unspecified int, then dequantized by 1 / inf = 0: outputs are 0 + bias).
    pub fn quantize(w: &[f32], n: usize, k: usize) -> PackedI16Matrix {
        assert_eq!(w.len(), n * k, "PackedI16Matrix::quantize: size mismatch");
        let (amax, mut q) = (max_magnitude(w), vec![0i16; w.len()]);
        let scale = 1024.0 / amax;
        quantize_all(w, scale, &mut q);
        PackedI16Matrix::from_quantized(&q, scale, n, k)
    }

    /// Packs weights already quantized (an int16 model.bin): `q[n * k]`, `w = q / scale`.
    pub fn from_quantized(q: &[i16], scale: f32, n: usize, k: usize) -> PackedI16Matrix {
        assert_eq!(q.len(), n * k, "PackedI16Matrix::from_quantized: size mismatch");
        let pairs = k.div_ceil(2);
        let panel_len = pairs * NR * 2;
        let mut data = Buffer::filled(n.div_ceil(NR) * panel_len, 0i16);
        // A row's pairs stored a lane apart (an odd k's last pair padded with the zero).
        for (c, row) in q.chunks_exact(k.max(1)).enumerate() {
            let (p, at) = (c / NR, (c % NR) * 2);
            let panel = &mut data[p * panel_len..(p + 1) * panel_len];
            for (group, two) in panel.chunks_exact_mut(NR * 2).zip(row.chunks(2)) {
                group[at..at + two.len()].copy_from_slice(two);
            }
        }
        PackedI16Matrix { data, n, k, pairs, scale }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    /// Row `i` dequantized as CTranslate2's Dequantize does (`q * (1 / scale)`): an
    /// embedding lookup on a tied projection.
    pub fn copy_row(&self, i: usize, out: &mut [f32]) {
        assert!(i < self.n, "PackedI16Matrix::copy_row: row {i} out of {}", self.n);
        let (panel, lane, inv_scale) = (self.panel(i / NR), i % NR, 1.0 / self.scale);
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            *o = panel[(kk / 2) * NR * 2 + lane * 2 + kk % 2] as f32 * inv_scale;
        }
    }

    /// The rows `ids` as a new matrix (an output layer restricted to a shortlist).
    pub fn gather_rows(&self, ids: &[u32]) -> PackedI16Matrix {
        let mut q = vec![0i16; ids.len() * self.k];
        for (row, &id) in q.chunks_exact_mut(self.k.max(1)).zip(ids) {
            let (panel, lane) = (self.panel(id as usize / NR), id as usize % NR);
            for (kk, o) in row.iter_mut().enumerate() {
                *o = panel[(kk / 2) * NR * 2 + lane * 2 + kk % 2];
            }
        }
        PackedI16Matrix::from_quantized(&q, self.scale, ids.len(), self.k)
    }

    fn panel(&self, p: usize) -> &[i16] {
        let len = self.pairs * NR * 2;
        &self.data[p * len..(p + 1) * len]
    }
}

/// Quantizes `x [m, k]` with the fixed scale into rows interleaved by groups of `MR`:
/// `[group][pairs][MR]`, each entry two consecutive k values as (low, high) halves of an i32
/// (the 32-bit broadcast of the kernels); padding rows and the odd-k tail are zero.
fn quantize_activations(x: &[f32], m: usize, k: usize, pairs: usize) -> Vec<i32> {
    fn quantize_row(row: &[f32], out: &mut [i16]) {
        #[inline(always)]
        fn generic(row: &[f32], out: &mut [i16]) {
            for (o, &v) in out.iter_mut().zip(row) {
                *o = quantize_value(v, X_SCALE);
            }
        }
        super::isa::dispatch_isa!(generic(row: &[f32], out: &mut [i16]) -> ())
    }
    let mut data = vec![0i32; m.div_ceil(MR) * pairs * MR];
    let mut q = vec![0i16; pairs * 2];
    for r in 0..m {
        quantize_row(&x[r * k..(r + 1) * k], &mut q[..k]);
        let (g, lane) = (r / MR, r % MR);
        let dst = &mut data[g * pairs * MR..(g + 1) * pairs * MR];
        for (p, pair) in q.chunks_exact(2).enumerate() {
            dst[p * MR + lane] = (pair[0] as u16 as u32 | (pair[1] as u16 as u32) << 16) as i32;
        }
    }
    data
}

/// One row group (`rows` <= MR interleaved rows, `pairs` k-pairs) times one panel.
struct Tile<'a> {
    a: &'a [i32],
    panel: &'a [i16],
    pairs: usize,
    rows: usize,
}

/// One panel's epilogue: `y = float(acc) * inv_scale (+ bias)` on its `cols` columns.
struct Epilogue {
    inv_scale: f32,
    bias: Option<[f32; NR]>,
    cols: usize,
}

/// Dequantizes `rows` accumulated rows into `y` (row stride `ldy`). Inlined into every
/// kernel, so it is vectorized for each ISA with the same float operations.
#[inline(always)]
fn store_rows(acc: &[[i32; NR]; MR], rows: usize, e: &Epilogue, y: &mut [f32], ldy: usize) {
    for (r, a) in acc.iter().enumerate().take(rows) {
        let mut row = [0.0f32; NR];
        match &e.bias {
            Some(b) => (0..NR).for_each(|c| row[c] = a[c] as f32 * e.inv_scale + b[c]),
            None => (0..NR).for_each(|c| row[c] = a[c] as f32 * e.inv_scale),
        }
        y[r * ldy..r * ldy + e.cols].copy_from_slice(&row[..e.cols]);
    }
}


/// `y[m, n] = x[m, k] · Wᵀ` (+ bias), overwriting `y`, with CTranslate2's int16 numerics
/// (see the module comment). With `threads > 1` the panels (disjoint output columns) are
/// split across the worker's intra threads (`team`).
pub fn matmul_i16(x: &[f32], w: &PackedI16Matrix, bias: Option<&[f32]>, y: &mut [f32], m: usize, threads: usize) {
    let (n, k, pairs) = (w.n, w.k, w.pairs);
    assert!(x.len() >= m * k && y.len() >= m * n, "matmul_i16: buffer too small");
    if let Some(b) = bias {
        assert!(b.len() >= n, "matmul_i16: bias too short");
    }
    if m == 0 || n == 0 {
        return;
    }
    // Read here: the override of isa::with_isa is per thread.
    let isa = isa::current();
    let a = quantize_activations(x, m, k, pairs);
    let inv_scale = 1.0 / (X_SCALE * w.scale);
    let (panels, groups) = (n.div_ceil(NR), m.div_ceil(MR));
    // Row groups per block: the block's activations (~256 KiB) stay in L2 across panels.
    let block = (256 * 1024 / (pairs * MR * 4).max(1)).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let run = |p0: usize, p1: usize| {
        let mut acc = [[0i32; NR]; MR];
        for g0 in (0..groups).step_by(block) {
            for p in p0..p1 {
                let cols = NR.min(n - p * NR);
                let e = Epilogue {
                    inv_scale,
                    bias: bias.map(|b| std::array::from_fn(|c| if c < cols { b[p * NR + c] } else { 0.0 })),
                    cols,
                };
                let panel = w.panel(p);
                for g in g0..(g0 + block).min(groups) {
                    let rows = MR.min(m - g * MR);
                    let t = Tile { a: &a[g * pairs * MR..(g + 1) * pairs * MR], panel, pairs, rows };
                    // SAFETY: rows g*MR.. g*MR+rows and the panel's columns lie inside `y`
                    // (checked above); concurrent panels write disjoint columns.
                    let y = unsafe { std::slice::from_raw_parts_mut(out.get().add(g * MR * n + p * NR), (rows - 1) * n + cols) };
                    // SAFETY: `isa` never exceeds what the CPU supports (see isa::current); the
                    // kernels read `pairs` rows of the panel and of the row group, both that long.
                    unsafe {
                        match isa {
                            #[cfg(target_arch = "x86_64")]
                            Isa::Avx512Vnni | Isa::Amx => x86::avx512_vnni(&t, &e, y, n),
                            #[cfg(target_arch = "x86_64")]
                            Isa::Avx512Bw => x86::avx512_bw(&t, &e, y, n),
                            #[cfg(target_arch = "x86_64")]
                            Isa::AvxVnni => x86::avx_vnni(&t, &e, y, n),
                            #[cfg(target_arch = "x86_64")]
                            Isa::Avx2 => x86::avx2(&t, &e, y, n),
                            _ => {
                                tile_scalar(&t, &mut acc);
                                store_rows(&acc, rows, &e, y, n);
                            }
                        }
                    }
                }
            }
        }
    };
    super::split_panels(panels, threads, m * n * k, run);
}

/// The reference kernel: `acc[r][c] = Σ x[r][k] * w[c][k]` over the packed layouts,
/// wrapping on overflow as the SIMD kernels do.
fn tile_scalar(t: &Tile, acc: &mut [[i32; NR]; MR]) {
    for (r, acc_row) in acc.iter_mut().enumerate().take(t.rows) {
        *acc_row = [0; NR];
        for p in 0..t.pairs {
            let xp = t.a[p * MR + r];
            let (x0, x1) = (xp as i16 as i32, xp >> 16);
            let ws = &t.panel[p * NR * 2..(p + 1) * NR * 2];
            for (c, s) in acc_row.iter_mut().enumerate() {
                *s = s.wrapping_add(x0 * ws[2 * c] as i32).wrapping_add(x1 * ws[2 * c + 1] as i32);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Epilogue, Tile, MR, NR};
    use crate::backend::cpu::row_store;
    use std::arch::x86_64::*;

    /// Fetches the first `lines` cache lines of the panel row `PREFETCH` pairs ahead into L1
    /// (2: the whole row; 1: the half a 256-bit tile reads): without it, a row group that
    /// uses each panel once waits on L2 (a wrapping address: prefetching past the end is
    /// harmless).
    #[inline(always)]
    unsafe fn prefetch(w: *const i16, p: usize, lines: usize) {
        const PREFETCH: usize = 16;
        let ahead = w.wrapping_add((p + PREFETCH) * NR * 2) as *const i8;
        for line in 0..lines {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line));
        }
    }

    /// AVX-512 with VNNI: `vpdpwssd` fuses the pair products and the accumulation.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn avx512_vnni(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        panel512::<true>(t, e, y, ldy)
    }

    /// AVX-512BW: `vpmaddwd` then `vpaddd`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn avx512_bw(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        panel512::<false>(t, e, y, ldy)
    }

    /// One row group: a tile of up to 8 rows x 32 columns (2 zmm per row), as many rows as
    /// the group has (no zero rows multiplied), stored from registers.
    #[inline(always)]
    unsafe fn panel512<const VNNI: bool>(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        match t.rows {
            8 => tile512::<8, VNNI>(t, e, y, ldy),
            7 => tile512::<7, VNNI>(t, e, y, ldy),
            6 => tile512::<6, VNNI>(t, e, y, ldy),
            5 => tile512::<5, VNNI>(t, e, y, ldy),
            4 => tile512::<4, VNNI>(t, e, y, ldy),
            3 => tile512::<3, VNNI>(t, e, y, ldy),
            2 => tile512::<2, VNNI>(t, e, y, ldy),
            _ => tile512::<1, VNNI>(t, e, y, ldy),
        }
    }

    /// `R` rows (exactly the tile's) times the panel, then each row through the epilogue.
    #[inline(always)]
    unsafe fn tile512<const R: usize, const VNNI: bool>(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        let (a, w) = (t.a.as_ptr(), t.panel.as_ptr());
        let mut s0 = [_mm512_setzero_si512(); R];
        let mut s1 = [_mm512_setzero_si512(); R];
        for p in 0..t.pairs {
            // Weights are streamed once per row group: fetch ahead of use.
            prefetch(w, p, 2);
            let w0 = _mm512_loadu_si512(w.add(p * NR * 2) as *const _);
            let w1 = _mm512_loadu_si512(w.add(p * NR * 2 + 32) as *const _);
            for r in 0..R {
                let xv = _mm512_set1_epi32(*a.add(p * MR + r));
                if VNNI {
                    s0[r] = _mm512_dpwssd_epi32(s0[r], xv, w0);
                    s1[r] = _mm512_dpwssd_epi32(s1[r], xv, w1);
                } else {
                    s0[r] = _mm512_add_epi32(s0[r], _mm512_madd_epi16(xv, w0));
                    s1[r] = _mm512_add_epi32(s1[r], _mm512_madd_epi16(xv, w1));
                }
            }
        }
        for r in 0..R {
            store512(e, [s0[r], s1[r]], y.as_mut_ptr().add(r * ldy));
        }
    }

    /// AVX-VNNI (256-bit `vpdpwssd`).
    #[target_feature(enable = "avx2,fma,avxvnni")]
    pub unsafe fn avx_vnni(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        panel256::<true>(t, e, y, ldy)
    }

    /// AVX2: `vpmaddwd` then `vpaddd`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        panel256::<false>(t, e, y, ldy)
    }

    /// One row group. Four rows or more go in tiles of 4 rows x 16 columns (half a panel,
    /// one cache line a pair): 8 accumulators and the 2 weight vectors stay in registers,
    /// 6 loads feed 8 `vpmaddwd`. The earlier tile of 3 rows x 32 columns needed 17 ymm, so
    /// LLVM reloaded the weights for every row (15 loads a step: load-bound at 46-57% of
    /// the level's peak on a Zen 4; 72-83% now, gemm_bench 2026-12-08, int16 zh-en beam 4
    /// +34%). Up to 3 rows stream the weights from memory, and one pass reads them once.
    #[inline(always)]
    unsafe fn panel256<const VNNI: bool>(t: &Tile, e: &Epilogue, y: &mut [f32], ldy: usize) {
        if t.rows <= 3 {
            match t.rows {
                1 => tile256::<1, 4, VNNI>(t, 0, 0, e, y, ldy),
                2 => tile256::<2, 4, VNNI>(t, 0, 0, e, y, ldy),
                _ => tile256::<3, 4, VNNI>(t, 0, 0, e, y, ldy),
            }
            return;
        }
        for c0 in (0..e.cols).step_by(16) {
            for r0 in (0..t.rows).step_by(4) {
                match t.rows - r0 {
                    1 => tile256::<1, 2, VNNI>(t, r0, c0, e, y, ldy),
                    2 => tile256::<2, 2, VNNI>(t, r0, c0, e, y, ldy),
                    3 => tile256::<3, 2, VNNI>(t, r0, c0, e, y, ldy),
                    _ => tile256::<4, 2, VNNI>(t, r0, c0, e, y, ldy),
                }
            }
        }
    }

    /// Rows `r0..r0 + R` times the panel's columns `c0..c0 + 8 * C` (`C` ymm a row), then
    /// each row through the epilogue.
    #[inline(always)]
    unsafe fn tile256<const R: usize, const C: usize, const VNNI: bool>(t: &Tile, r0: usize, c0: usize, e: &Epilogue, y: &mut [f32], ldy: usize) {
        let (a, w) = (t.a.as_ptr(), t.panel.as_ptr().add(2 * c0));
        let mut s = [[_mm256_setzero_si256(); C]; R];
        for p in 0..t.pairs {
            prefetch(w, p, C / 2);
            let wp = w.add(p * NR * 2);
            let wv: [__m256i; C] = std::array::from_fn(|j| _mm256_loadu_si256(wp.add(16 * j) as *const _));
            for (r, sr) in s.iter_mut().enumerate() {
                let xv = _mm256_set1_epi32(*a.add(p * MR + r0 + r));
                for (sj, &wj) in sr.iter_mut().zip(&wv) {
                    *sj = if VNNI {
                        _mm256_dpwssd_avx_epi32(*sj, xv, wj)
                    } else {
                        _mm256_add_epi32(*sj, _mm256_madd_epi16(xv, wj))
                    };
                }
            }
        }
        for (r, sr) in s.iter().enumerate() {
            store256(e, c0, sr, y.as_mut_ptr().add((r0 + r) * ldy));
        }
    }

    /// A row's 32 accumulators (two zmm, column order) through the epilogue in registers:
    /// `store_rows`' arithmetic lane for lane (see `store256`).
    ///
    /// # Safety
    /// Only for the AVX-512 kernels (the CPU runs AVX-512F); `y` has room for `e.cols` floats.
    #[inline(always)]
    unsafe fn store512(e: &Epilogue, s: [__m512i; 2], y: *mut f32) {
        let inv_scale = _mm512_set1_ps(e.inv_scale);
        let mut out = s.map(|v| _mm512_mul_ps(_mm512_cvtepi32_ps(v), inv_scale));
        if let Some(b) = &e.bias {
            for (j, v) in out.iter_mut().enumerate() {
                *v = _mm512_add_ps(*v, _mm512_loadu_ps(b.as_ptr().add(16 * j)));
            }
        }
        row_store::store512(y, out, e.cols);
    }

    /// A row's accumulators for columns `c0..c0 + 8 * C` through the epilogue in registers:
    /// `store_rows`' operations in its order (a multiply, then the bias's add: none fused),
    /// so the same bits. Through `store_rows`' array the accumulators went to the stack and
    /// back (store-to-load forwards on each tile's way out). Like the int8 epilogue
    /// (`int8::x86::store256`) it has no target feature of its own so that it inlines.
    ///
    /// # Safety
    /// Only for the 256-bit kernels (the CPU runs AVX2); `y` is the row's output, with room
    /// for `e.cols` floats, and `c0 < e.cols`.
    #[inline(always)]
    unsafe fn store256<const C: usize>(e: &Epilogue, c0: usize, s: &[__m256i; C], y: *mut f32) {
        let inv_scale = _mm256_set1_ps(e.inv_scale);
        let mut out = s.map(|v| _mm256_mul_ps(_mm256_cvtepi32_ps(v), inv_scale));
        if let Some(b) = &e.bias {
            for (j, v) in out.iter_mut().enumerate() {
                *v = _mm256_add_ps(*v, _mm256_loadu_ps(b.as_ptr().add(c0 + 8 * j)));
            }
        }
        row_store::store256(y.add(c0), out, e.cols - c0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// CTranslate2's formulas written directly on unpacked data (integer sums wrap to i32).
    fn reference(x: &[f32], wq: &[i16], w_scale: f32, bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f32> {
        let xq: Vec<i64> = x.iter().map(|&v| (v * 1000.0).round_ties_even().clamp(-32768.0, 32767.0) as i64).collect();
        let r_scale = 1.0 / (1000.0 * w_scale);
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let acc: i64 = (0..k).map(|p| xq[i * k + p] * wq[j * k + p] as i64).sum();
                let v = acc as i32 as f32 * r_scale;
                y[i * n + j] = bias.map_or(v, |b| v + b[j]);
            }
        }
        y
    }

    fn check_all_isas(x: &[f32], w: &PackedI16Matrix, bias: Option<&[f32]>, m: usize, expected: &[f32]) {
        for isa in isa::available() {
            for threads in [1, 2] {
                let mut y = vec![f32::NAN; m * w.n];
                isa::with_isa(isa, || matmul_i16(x, w, bias, &mut y, m, threads));
                let same = y.iter().zip(expected).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} {m}x{}x{} threads={threads}", w.n, w.k);
            }
        }
    }

    #[test]
    fn every_kernel_is_bit_identical_to_the_reference() {
        let mut seed = 11;
        let shapes = [(1, 1, 1), (2, 3, 2), (3, 5, 3), (8, 32, 4), (9, 33, 7), (11, 64, 16), (37, 70, 131), (9, 257, 513)];
        // Every row count of a group; last panels narrower than half a panel and wider.
        let partial = [(5, 40, 2050), (13, 96, 64), (6, 50, 9), (7, 60, 33), (4, 17, 5), (15, 49, 12)];
        for &(m, n, k) in shapes.iter().chain(&partial) {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed) * 0.2).collect();
            let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let packed = PackedI16Matrix::quantize(&w, n, k);
            let wq: Vec<i16> = w.iter().map(|&v| quantize_value(v, packed.scale)).collect();
            for b in [Some(&bias[..]), None] {
                let expected = reference(&x, &wq, packed.scale, b, m, n, k);
                check_all_isas(&x, &packed, b, m, &expected);
            }
            // And close to the float product: each operand is off by half a quantization step.
            let expected = reference(&x, &wq, packed.scale, Some(&bias), m, n, k);
            let wmax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for i in 0..m {
                for j in 0..n {
                    let f: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f32>() + bias[j];
                    let tol = k as f32 * (3.0 * wmax / 2048.0 + wmax * 0.0005) + 1e-4;
                    assert!((expected[i * n + j] - f).abs() <= tol, "{m}x{n}x{k} [{i},{j}]");
                }
            }
        }
    }

    #[test]
    fn saturation_and_overflow_match_on_every_path() {
        // Activations beyond 32.767 saturate; (-32768)^2 products overflow i32 and wrap.
        let (m, n, k) = (3, 40, 8);
        let row = [-50.0, -40.0, -33.0, -1e9, 0.0004, 0.0026, 0.0, 0.0];
        let x: Vec<f32> = (0..m * k).map(|i| row[i % k]).collect();
        let wq: Vec<i16> = (0..n * k).map(|i| if i < k { 1 } else { -32768 }).collect();
        let packed = PackedI16Matrix::from_quantized(&wq, 2.0, n, k);
        let expected = reference(&x, &wq, 2.0, None, m, n, k);
        check_all_isas(&x, &packed, None, m, &expected);
        // 4 * 2^30 - 3 * 32768 wraps to -98304.
        assert_eq!(expected[1], -98304.0 * (1.0 / 2000.0));
        assert_eq!(expected[0], (4.0 * -32768.0 + 3.0) * (1.0 / 2000.0));
    }

    /// Quantizing and packing (compiled per ISA) give every level the same values: halfway
    /// values (a largest magnitude of 1024 makes the scale 1), NaN, any k and a last
    /// partial panel, padded with zeros.
    #[test]
    fn packing_and_quantizing_are_the_same_on_every_isa() {
        let mut seed = 9;
        for (n, k) in [(1, 1), (33, 7), (70, 131), (5, 2050)] {
            let specials = [0.5, -2.5, f32::NAN, 1e-40, 0.0, 3.5];
            let mut w: Vec<f32> = (0..n * k).map(|i| if i % 13 == 5 { specials[i % specials.len()] } else { lcg(&mut seed) * 300.0 }).collect();
            w[0] = -1024.0;
            let scale = 1.0f32;
            let mut row = vec![0.0f32; k];
            for isa in isa::available() {
                let p = isa::with_isa(isa, || PackedI16Matrix::quantize(&w, n, k));
                assert_eq!(p.scale.to_bits(), scale.to_bits(), "{isa:?}");
                for c in 0..n {
                    p.copy_row(c, &mut row);
                    let want: Vec<f32> = w[c * k..(c + 1) * k].iter().map(|&v| quantize_value(v, scale) as f32 * (1.0 / scale)).collect();
                    assert!(row.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} {n}x{k} row {c}");
                }
                // An odd k's pad and the lanes past n hold zeros.
                let last = (n - 1) / NR;
                for (pair, group) in p.panel(last).chunks_exact(NR * 2).enumerate() {
                    for (i, &v) in group.iter().enumerate() {
                        let (c, kk) = (last * NR + i / 2, pair * 2 + i % 2);
                        assert!(c < n && kk < k || v == 0, "{isa:?} {n}x{k} pad of row {c} at {kk}");
                    }
                }
            }
        }
    }

    #[test]
    fn quantization_matches_ct2_rules() {
        // amax 2 -> scale 512: 0.0009765625 * 512 = 0.5 rounds to 0, 0.0029296875 * 512 = 1.5 to 2,
        // 2045 / 1024 * 512 = 1022.5 to 1022.
        let w = [2.0, -1.0, 0.0009765625, 0.0029296875, -0.0029296875, 2045.0 / 1024.0];
        let p = PackedI16Matrix::quantize(&w, 2, 3);
        assert_eq!(p.scale, 512.0);
        let q: Vec<i16> = w.iter().map(|&v| quantize_value(v, p.scale)).collect();
        assert_eq!(q, [1024, -512, 0, 2, -2, 1022]);
        let mut row = [0.0f32; 3];
        p.copy_row(1, &mut row);
        assert_eq!(row, [2.0 / 512.0, -2.0 / 512.0, 1022.0 / 512.0]);
        assert_eq!((p.rows(), p.cols()), (2, 3));

        let zero = PackedI16Matrix::quantize(&[0.0; 6], 3, 2);
        zero.copy_row(2, &mut row[..2]);
        assert_eq!(row[..2], [0.0, 0.0]);
        let mut y = [f32::NAN; 3];
        matmul_i16(&[1.0, -2.0], &zero, Some(&[0.5, 0.0, -1.0]), &mut y, 1, 1);
        assert_eq!(y, [0.5, 0.0, -1.0]);

        let q = PackedI16Matrix::from_quantized(&[3, -7, 100, 0], 4.0, 2, 2);
        q.copy_row(1, &mut row[..2]);
        assert_eq!(row[..2], [25.0, 0.0]);
    }
}
