//! int8 Linear layers: `y = x · Wᵀ` with `W` quantized per output row and `x` quantized per
//! row on the fly, multiplied as 8-bit integers with exact 32-bit accumulation.
//!
//! Numerics follow CTranslate2 4.8 on CPU (src/cpu/kernels.cc): a row `v` is quantized with
//! `scale = 127 / amax(|v|)` (1 when the row is zero); weights as `rne(v * scale)`,
//! activations as `rne(fma(v, scale, 128)) - 128` (its u8-shifted kernels round once, after
//! the shift); the product is dequantized as `acc * (1 / scale_x) / scale_w + bias`.
//!
//! Weights are packed once at load into panels of `NR = 32` output columns, k grouped by
//! four: `[k/4][32][4]` bytes, the operand layout of `vpdpbusd` (u8 x s8 -> s32, four
//! products per 32-bit lane). A byte holds `w + 128` (`w ^ 0x80`), the unsigned form the
//! planned kernels multiply; the other kernels flip it back with one `vpxor` per
//! weight register, shared by all the rows of a tile. `vpdpbusd` needs one unsigned
//! operand: the AVX-512 VNNI kernel reads `x + 128` against the signed weights and
//! subtracts the per-column compensation `128 * Σk w` precomputed at packing; the AVX-VNNI
//! kernel reads the stored `w + 128` against signed `x` and subtracts each row's `128 Σ x`.
//! Without VNNI, `vpmaddubsw` would saturate its 16-bit pair sums on `x + 128`, so the
//! AVX2 and AVX-512BW kernels plan each product (`plan`): k steps whose `|x|` are small
//! enough multiply `w + 128` by signed `x`, summing up to four `vpmaddubsw` in int16, and
//! the rest take the sign trick (`|x|` times `w` with the sign of `x`). The AMX kernel
//! (`amx`) reads the same panels as tiles, with signed `x` as AVX-VNNI does.
//! Every path is exact and all of them give bit-identical results.
//!
//! Here: the weights' packing and the product's driver (blocks of panels, row groups,
//! epilogue) with the scalar references. `activations`: the rows quantized on the fly;
//! `plan`: the AVX2 / AVX-512BW plans; a file per kernel family (`vnni`, `avx2`,
//! `avx512bw`, `amx`, `intgemm` for Marian's shifted product) and `x86` for what they share.
use super::huge_pages::Buffer;
use super::isa::{self, dispatch_isa, Isa};
use super::tuning::Switch;
use super::{ops, OutPtr};
use std::sync::Mutex;
use activations::{QuantizedRows, ACTIVATIONS};

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512bw;
#[cfg(target_arch = "x86_64")]
mod intgemm;
#[cfg(target_arch = "x86_64")]
mod plan;
#[cfg(target_arch = "x86_64")]
mod quantize_avx2;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Output columns per packed panel.
pub const NR: usize = 32;
/// Activation rows interleaved together: `[k/4][MR][4]` bytes per group of rows.
const MR: usize = 8;
/// Activation rows per group of the AMX kernel (two 16-row A tiles), stored row-major.
const AMX_ROWS: usize = 32;
/// The u8 shift applied to activations for the VNNI kernels.
const SHIFT: i32 = 128;
/// The bit that turns a stored weight byte (`w + 128`) into `w` and back.
const WEIGHT_FLIP: u8 = 0x80;

/// The weight `w` of its stored byte `w + 128`.
#[inline(always)]
fn weight(byte: u8) -> i8 {
    (byte ^ WEIGHT_FLIP) as i8
}

/// Quantization scale of a row as CTranslate2 computes it.
#[inline(always)]
pub fn row_scale(v: &[f32]) -> f32 {
    scale_of_amax(v.iter().fold(0.0f32, |m, x| m.max(x.abs())))
}

/// The scale of a row whose largest magnitude is `amax`: `127 / amax`, or 1 for a zero row.
#[inline(always)]
fn scale_of_amax(amax: f32) -> f32 {
    if amax != 0.0 {
        127.0 / amax
    } else {
        1.0
    }
}

/// One activation byte: `fma(v, scale, 128)` clamped to `[low, 255]` (a NaN becomes `low`:
/// `max` takes the number), rounded half to even, XORed with `flip`.
#[inline(always)]
fn quantize_byte(v: f32, scale: f32, low: f32, flip: u8) -> u8 {
    #[allow(clippy::manual_clamp)]
    let y = v.mul_add(scale, 128.0).max(low).min(255.0);
    // Adding 1.5 * 2^23 rounds to an integer, half to even, in the low mantissa bits.
    ((y + 12_582_912.0).to_bits() as u8) ^ flip
}

/// A weight value: `round(v * scale)` as an int8, rounding half to even as CTranslate2's
/// `vroundps` and numpy's `rint` do.
#[inline(always)]
pub fn quantize_value(v: f32, scale: f32) -> i8 {
    (v * scale).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// Quantizes float weights `[n, k]` per row as CTranslate2 does: `(values, scales)`.
pub fn quantize_rows(w: &[f32], n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    assert_eq!(w.len(), n * k);
    let mut q = vec![0i8; n * k];
    let mut scales = vec![1.0f32; n];
    // Compiled per ISA, where rounding is an instruction (a call to rintf per weight in the
    // baseline build).
    quantize_rows_into(w, k, &mut q, &mut scales);
    (q, scales)
}

fn quantize_rows_into(w: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
    dispatch_isa!(quantize_rows_generic(w: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) -> ())
}

#[inline(always)]
fn quantize_rows_generic(w: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
    if k > 0 {
        for ((row, out), s) in w.chunks_exact(k).zip(q.chunks_exact_mut(k)).zip(scales.iter_mut()) {
            *s = row_scale(row);
            for (o, &v) in out.iter_mut().zip(row) {
                *o = quantize_value(v, *s);
            }
        }
    }
}

/// A weight matrix `[n, k]` quantized to int8 per row and packed for [`matmul_i8`].
pub struct PackedI8Matrix {
    /// Panels `[kp/4][NR][4]`, 64-byte aligned (`Buffer`).
    data: Buffer<u8>,
    n: usize,
    k: usize,
    /// `k` rounded up to a multiple of 4 (the padding is zero).
    kp: usize,
    /// CTranslate2's scales (`q = round(w * scale)`), one per row.
    scales: Vec<f32>,
    /// `128 * Σk q[c][k]` per column, padded to whole panels.
    compensation: Vec<i32>,
    /// A fixed scale for the activations (Marian's precomputed `QuantMultA`): inputs are
    /// quantized as `round(x * scale)` clamped to ±127 instead of per row by their maximum.
    activation_scale: Option<f32>,
    /// Reproduce intgemm's `Int8Shift` product exactly as Marian/Bergamot run it: inputs
    /// shifted by +127 to u8, pairs of products summed by `vpmaddubsw` with its int16
    /// saturation, then unquantized as `acc * (1 / (scale_x * scale_w)) + bias'` where
    /// `bias'` folds the shift back in (see [`PackedI8Matrix::with_intgemm_emulation`]).
    intgemm: bool,
}

/// Packs rows of int8 weights (`q`, `k` each) into `panels` (`[kp/4][NR][4]` each, already
/// filled with flipped zeros), clamping `-128` to `-127`, with each row's compensation.
/// A row at a time: clamped, flipped and summed whole (this vectorizes), then its 4-byte
/// groups stored a lane apart. Byte by byte into the panel, packing had taken half of the
/// zh-en int8 model's load (2026-12-07).
fn pack_rows(q: &[i8], k: usize, kp: usize, panels: &mut [u8], compensation: &mut [i32]) {
    dispatch_isa!(pack_rows_generic(q: &[i8], k: usize, kp: usize, panels: &mut [u8], compensation: &mut [i32]) -> ())
}

#[inline(always)]
fn pack_rows_generic(q: &[i8], k: usize, kp: usize, panels: &mut [u8], compensation: &mut [i32]) {
    let mut row = vec![WEIGHT_FLIP; kp];
    for (c, (src, comp)) in q.chunks_exact(k.max(1)).zip(compensation).enumerate() {
        let mut sum = 0i32;
        for (d, &v) in row.iter_mut().zip(src) {
            let v = v.max(-127);
            sum += v as i32;
            *d = v as u8 ^ WEIGHT_FLIP;
        }
        *comp = SHIFT * sum;
        let (p, at) = (c / NR, (c % NR) * 4);
        let panel = &mut panels[p * kp * NR..(p + 1) * kp * NR];
        for (group, four) in panel.chunks_exact_mut(NR * 4).zip(row.chunks_exact(4)) {
            group[at..at + 4].copy_from_slice(four);
        }
    }
}

impl PackedI8Matrix {
    /// Quantizes and packs float weights.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> PackedI8Matrix {
        let (q, scales) = quantize_rows(w, n, k);
        PackedI8Matrix::from_quantized(&q, scales, n, k)
    }

    /// Packs weights already quantized per row (an int8 model.bin). `-128` is clamped to
    /// `-127`, the range CTranslate2 produces, which the sign trick of the AVX2 kernels needs.
    pub fn from_quantized(q: &[i8], scales: Vec<f32>, n: usize, k: usize) -> PackedI8Matrix {
        assert!(q.len() == n * k && scales.len() == n, "PackedI8Matrix: size mismatch");
        let kp = k.div_ceil(4) * 4;
        let panels = n.div_ceil(NR);
        // Padding (k past the end, columns past n) holds zero weights.
        let mut data = Buffer::filled(panels * kp * NR, WEIGHT_FLIP);
        let mut compensation = vec![0i32; panels * NR];
        pack_rows(q, k, kp, &mut data, &mut compensation);
        PackedI8Matrix { data, n, k, kp, scales, compensation, activation_scale: None, intgemm: false }
    }

    /// Quantizes the activations of every product with this fixed scale (`None` = per row).
    pub fn with_activation_scale(mut self, scale: Option<f32>) -> PackedI8Matrix {
        self.activation_scale = scale.filter(|s| s.is_finite() && *s > 0.0);
        self
    }

    pub fn activation_scale(&self) -> Option<f32> {
        self.activation_scale
    }

    /// Runs products as intgemm's shifted int8 multiply does (Marian's `int8shift*`
    /// precisions, which Bergamot runs): with a fixed activation scale and one weight
    /// scale, saturating pair sums included. The weights' translations were produced with
    /// these numerics, so reproducing them reproduces the reference engine's output.
    /// Ignored without a fixed activation scale.
    pub fn with_intgemm_emulation(mut self, on: bool) -> PackedI8Matrix {
        self.intgemm = on;
        self
    }

    fn emulates_intgemm(&self) -> Option<f32> {
        self.activation_scale.filter(|_| self.intgemm)
    }

    /// The rows `ids` as a new matrix (an output layer restricted to a shortlist): each
    /// row's 4-byte groups copied from its panel lane to its new one, with its scale and
    /// compensation (no unpacking; a batch of one sentence pays this every time).
    pub fn gather_rows(&self, ids: &[u32]) -> PackedI8Matrix {
        let (n, kp) = (ids.len(), self.kp);
        let panels = n.div_ceil(NR);
        let mut data = Buffer::filled(panels * kp * NR, WEIGHT_FLIP);
        let mut compensation = vec![0i32; panels * NR];
        for (c, &id) in ids.iter().enumerate() {
            let id = id as usize;
            let src = self.panel(id / NR);
            let dst = &mut data[(c / NR) * kp * NR..(c / NR + 1) * kp * NR];
            let (from, to) = ((id % NR) * 4, (c % NR) * 4);
            for g in 0..kp / 4 {
                let at = g * NR * 4;
                dst[at + to..at + to + 4].copy_from_slice(&src[at + from..at + from + 4]);
            }
            compensation[c] = self.compensation[id];
        }
        PackedI8Matrix {
            data,
            n,
            k: self.k,
            kp,
            scales: ids.iter().map(|&id| self.scales[id as usize]).collect(),
            compensation,
            activation_scale: self.activation_scale,
            intgemm: self.intgemm,
        }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Bytes held by the packed weight.
    pub fn memory_size(&self) -> usize {
        self.data.len() + 8 * self.compensation.len()
    }

    /// Quantized row `i` of the original matrix.
    pub fn quantized_row(&self, i: usize, out: &mut [i8]) {
        let panel = self.panel(i / NR);
        let lane = i % NR;
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            *o = weight(panel[(kk / 4) * NR * 4 + lane * 4 + kk % 4]);
        }
    }

    /// Row `i` dequantized (`q * (1 / scale)`, as CTranslate2's Dequantize): an int8
    /// embedding lookup on a tied projection.
    pub fn copy_row(&self, i: usize, out: &mut [f32]) {
        let panel = self.panel(i / NR);
        let (lane, inv_scale) = (i % NR, 1.0 / self.scales[i]);
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            *o = weight(panel[(kk / 4) * NR * 4 + lane * 4 + kk % 4]) as f32 * inv_scale;
        }
    }

    fn panel(&self, p: usize) -> &[u8] {
        self.panels(p, p + 1)
    }

    /// Panels `p0..p1`, contiguous.
    fn panels(&self, p0: usize, p1: usize) -> &[u8] {
        &self.data[p0 * self.kp * NR..p1 * self.kp * NR]
    }
}

/// Whether the product on `isa` is planned (`plan`): the kernels without VNNI, except
/// intgemm's emulation, which reads `x + 127` alone.
#[cfg(target_arch = "x86_64")]
fn is_planned(isa: Isa, intgemm: bool) -> bool {
    !intgemm && matches!(isa, Isa::Avx2 | Isa::Avx512Bw)
}

/// One panel's share of the epilogue: scales, compensation and bias of its columns.
#[derive(Clone)]
struct PanelEpilogue {
    w_scales: [f32; NR],
    compensation: [i32; NR],
    bias: [f32; NR],
    cols: usize,
    /// Apply ReLU after the bias (CTranslate2 fuses the activation the same way).
    relu: bool,
    /// intgemm's unquantization `acc * unquant + bias'` (`unquant = 1 / (scale_x *
    /// scale_w)` in `w_scales`, bias' in `bias`), instead of CTranslate2's
    /// `(acc - compensation) * (1 / scale_x) / scale_w + bias`.
    intgemm: bool,
}

/// Where one tile's rows go: `rows` rows of `y` starting at `y` with stride `ldy`, each
/// scaled by its `inv_x`.
struct TileOut<'a> {
    y: *mut f32,
    ldy: usize,
    rows: usize,
    inv_x: &'a [f32],
    e: &'a PanelEpilogue,
    /// Weights this tile fetches into L2 while it computes (its share of the next block,
    /// or of a later panel in the panel-outer order).
    prefetch: &'a [u8],
    /// Whether every unit of the tile fetches its part of `prefetch`, a line a step (the
    /// panel-outer order's thin shares), rather than the first unit all of it.
    spread: bool,
    /// Whether this tile reads its panel first, from memory (the block's first row group);
    /// the later groups find it in L2.
    streams: bool,
}

impl TileOut<'_> {
    /// `y = (acc - compensation) * (1 / scale_x) / scale_w + bias` for row `r` of the tile,
    /// in CTranslate2's order of operations: the reference, and the epilogue of the scalar
    /// and AMX kernels. The AVX2 and AVX-512 kernels run the same arithmetic on their
    /// accumulators in registers (`x86::store256`, `x86::store512`).
    #[inline(always)]
    fn store(&self, r: usize, acc: &[i32; NR]) {
        let e = self.e;
        let mut row = [0.0f32; NR];
        if e.intgemm {
            for c in 0..NR {
                row[c] = acc[c] as f32 * e.w_scales[c] + e.bias[c];
            }
        } else {
            for c in 0..NR {
                row[c] = (acc[c] - e.compensation[c]) as f32 * self.inv_x[r] / e.w_scales[c] + e.bias[c];
            }
        }
        if e.relu {
            for v in row.iter_mut() {
                *v = v.max(0.0);
            }
        }
        // SAFETY: matmul_i8 checked that rows x cols of `y` from this tile's origin exist,
        // and no other thread writes these columns.
        unsafe {
            let y = self.y.add(r * self.ldy);
            if e.cols == NR {
                (y as *mut [f32; NR]).write_unaligned(row);
            } else {
                std::ptr::copy_nonoverlapping(row.as_ptr(), y, e.cols);
            }
        }
    }
}

/// `y[m, n] = x[m, k] · Wᵀ` (+ bias), overwriting `y`. With `threads > 1` the panels
/// (disjoint output columns) are split across the worker's intra threads (`team`).
pub fn matmul_i8(x: &[f32], w: &PackedI8Matrix, bias: Option<&[f32]>, y: &mut [f32], m: usize, threads: usize) {
    matmul_i8_relu(x, w, bias, false, y, m, threads)
}

/// [`matmul_i8`], optionally with ReLU applied to the outputs in the same pass.
pub fn matmul_i8_relu(x: &[f32], w: &PackedI8Matrix, bias: Option<&[f32]>, relu: bool, y: &mut [f32], m: usize, threads: usize) {
    assert!(x.len() >= m * w.k && y.len() >= m * w.n, "matmul_i8: buffer too small");
    quantized_product(x, w, bias, relu, Output::Rows(OutPtr(y.as_mut_ptr())), m, threads)
}

/// For each row of `x · Wᵀ (+ bias)`, the first column holding its largest value and that
/// value, with the columns `disabled[row]` counted as `f32::MIN`: the arg-max of each row
/// of [`matmul_i8`]'s output, bit for bit, without that output. Each block of columns goes
/// to a scratch buffer that stays in cache (greedy decoding: the 65k logits of 32 rows
/// are 8 MB written and read back every step).
pub fn best_columns_i8(x: &[f32], w: &PackedI8Matrix, bias: Option<&[f32]>, m: usize, threads: usize, disabled: &[&[u32]]) -> Vec<(usize, f32)> {
    assert!(x.len() >= m * w.k && disabled.len() >= m, "best_columns_i8: buffer too small");
    let found = Mutex::new(Vec::new());
    quantized_product(x, w, bias, false, Output::Best { disabled, found: &found }, m, threads);
    // Each thread's panels in order; a later part wins only with a larger value, so the
    // first column of the maximum wins as in one scan.
    let mut parts = found.into_inner().unwrap_or_else(|e| e.into_inner());
    parts.sort_by_key(|(p0, _)| *p0);
    let mut best = vec![(0, f32::NEG_INFINITY); m];
    for (_, part) in parts {
        for (b, (c, v)) in best.iter_mut().zip(part) {
            if v > b.1 {
                *b = (c, v);
            }
        }
    }
    best
}

/// A thread's first panel and each row's best `(column, value)` over its panels.
type BestOfPanels = (usize, Vec<(usize, f32)>);

/// Where the blocks of a product's output go.
enum Output<'a> {
    /// Into `y` (`[m, n]`).
    Rows(OutPtr),
    /// Into a scratch block per thread, each row then reduced to its best column: each
    /// thread adds `(first panel, best (column, value) per row)` to `found`.
    Best { disabled: &'a [&'a [u32]], found: &'a Mutex<Vec<BestOfPanels>> },
}

fn quantized_product(x: &[f32], w: &PackedI8Matrix, bias: Option<&[f32]>, relu: bool, out: Output, m: usize, threads: usize) {
    let k = w.k;
    if let Some(b) = bias {
        assert!(b.len() >= w.n);
    }
    if m == 0 || w.n == 0 {
        if let Output::Best { found, .. } = out {
            found.lock().unwrap_or_else(|e| e.into_inner()).push((0, vec![(0, f32::NEG_INFINITY); m]));
        }
        return;
    }
    let intgemm = w.emulates_intgemm().is_some();
    let isa = match isa::current() {
        // A product deeper than a plan can index (no model's) takes the scalar kernel.
        #[cfg(target_arch = "x86_64")]
        isa if is_planned(isa, intgemm) && !plan::fits(w.kp) => Isa::Scalar,
        // AMX takes depths in whole tile rows (every model's: 256, 512, 1024, 2048); the
        // others, intgemm's emulation and products of few rows stay on AVX-512 VNNI.
        Isa::Amx if intgemm || !w.kp.is_multiple_of(K_STEP_AMX) || m < AMX_MIN_ROWS => Isa::Avx512Vnni,
        isa => isa,
    };
    // The AVX-512 VNNI kernel reads `x + 128` against signed weights; AVX-VNNI and AMX read
    // signed `x` against the stored `w + 128` (see `vnni::vnni256`, `amx`).
    let shifted = intgemm || isa == Isa::Avx512Vnni;
    ACTIVATIONS.with(|a| {
        let mut a = a.borrow_mut();
        a.fill(x, m, k, shifted, w.activation_scale, intgemm, isa == Isa::Amx, threads);
        if matches!(isa, Isa::AvxVnni | Isa::Amx) && !intgemm {
            a.fill_row_shifts(m);
        }
        #[cfg(target_arch = "x86_64")]
        if is_planned(isa, intgemm) {
            a.plan(m, isa);
        }
        run_panels(&a, w, bias, relu, &out, m, threads, isa, shifted)
    })
}

/// Bytes of k an AMX tile product takes (an A tile's row).
const K_STEP_AMX: usize = 64;

/// Rows below which a product stays on AVX-512 VNNI on an AMX CPU: an A tile holds 16 rows
/// whatever the product's count, and below 4 its products lose to `vpdpbusd` (gemm_bench,
/// Xeon with AMX, 2026-12-02, GOP/s AMX against AVX-512 VNNI: 2 x 2048 x 512 157 / 176,
/// 2 x 65000 x 512 93 / 102; at 4 rows 413 / 264 and 169 / 189, at 8 rows 660-760 / 385
/// and 280 / 300, at 32 rows 1176 / 485 and 596 / 337).
const AMX_MIN_ROWS: usize = 4;

/// Bytes of weight panels `run_panels` takes per block: 512 KiB where L2 holds 1 MiB or
/// more (measured best on Zen 4, Zen 5, Skylake-SP and Sapphire Rapids), a quarter of L2
/// where it is smaller, so that the block, the next one being fetched and the step's
/// other data share it (Zen 3, 512 KiB of L2, 2026-12-02: 128 KiB blocks ran int8 greedy
/// 2% and beam 4 3-5% faster end to end than 512 KiB, alternating runs at AVX2).
fn block_bytes() -> usize {
    const LARGE: usize = 512 * 1024;
    match crate::backend::cpu::isa::l2_bytes() {
        Some(l2) if l2 < 2 * LARGE => (l2 / 4).max(64 * 1024),
        _ => LARGE,
    }
}

/// How many row groups take a block's panels one at a time (a panel by each group of the
/// pass, then the next panel), rather than each group taking the whole block in turn; 0
/// for the order by groups. Each panel is then read from L2 or memory once a pass, by its
/// first group, and from L1 by the others, provided the pass's activations stay in L1
/// beside it (here: both within two thirds of L1d), so a pass holds as many groups as fit,
/// all of them where all fit. Measured only where it pays: on a Xeon with AMX held to AVX2
/// (48 KiB L1d, 2026-12-07) a tile's first unit took twice the time of the others when it
/// read the panel from L2 and fetched its share of the next block, and this order over
/// all groups made int8 greedy (32 rows at k = 512) 1.5-7% faster in 7 of 8 alternating
/// pairs. The AVX-VNNI kernel (Intel's client cores since Alder Lake) reads its panels the
/// same way: held to it on that Xeon (2026-12-07, 250 verses, alternating), int8 greedy
/// +4.2/+2.0/+1.2/+0.8/+3.4%, beam 4 +0.7/+2.2/+2.5%. Beam 4's 128 rows do not fit; taken
/// in passes of 4 groups (32 rows) once the pass's first group fetched the weights two
/// panels ahead (`PANEL_AHEAD`), int8 beam 4 ran +3.3/+4.1/+6.0/+3.0/-0.2% at AVX2 and
/// +3.4/+1.1/+1.3/+2.2% at AVX-VNNI (alternating in one process, 120 verses); passes of 2
/// groups alike, of 6 +1.7% and of 8 (past L1) +0.0%; greedy (the encoder's products of
/// 1280 rows) +1.0% in the mean of 5. The 512-bit kernels gain more, though they take a
/// group's rows in one pass over the panel (AVX-512 VNNI) or in pairs (AVX-512BW): on the
/// same Xeon (`examples/ab`, the order on and off in turn, 4 rounds each) int8 greedy
/// +5.8% (4 of 4) and +8.6% (4 of 4; +4.7% before its units spread their fetches as the
/// AVX2 kernel's do), beam 4 +0.2% and +2.6%. AMX's groups of 32 rows fill the pass at
/// k = 512. Not measured on AMD's cores since the weights are
/// fetched panels ahead: `TOLK_INT8_PANELS_OUTER=1` takes the order on any vendor's core
/// (`=0` nowhere), to measure a new one (`tuning::Switch::Int8PanelsOuter`; on 32 KiB of
/// L1d a pass at k = 512 holds one group, so only fewer rows or shallower products take
/// it there).
fn outer_pass_groups(isa: Isa, groups: usize, gr: usize, kp: usize) -> usize {
    if !matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Bw | Isa::Avx512Vnni) || groups < 2 || !Switch::Int8PanelsOuter.is_on() {
        return 0;
    }
    // Rows whose activations fit beside a panel (NR columns of kp bytes) in 2/3 of L1d.
    let rows = isa::l1d_bytes().map_or(0, |l1d| (2 * l1d / 3 / kp.max(1)).saturating_sub(NR));
    match (rows / gr).min(groups) {
        pass if pass >= 2 => pass,
        _ => 0,
    }
}

/// How many panels ahead the panel-outer order fetches the weights into L2: each row group's
/// tile a share of that panel, each unit of the tile a part, a line a k step (`TileOut::
/// spread`), so that the fetches stay few and even. They had been the next block's (up to
/// an eighth of the product), in shares that the first unit of each tile after the first
/// group's issued two a step, in bursts; that first unit then took 1.6 times the others'
/// time. Xeon with AMX (2026-12-07), zh-en int8 greedy, 250 verses, the old and new
/// fetches in turn in one process (rounds of both): held to AVX2 +2.1% (6 rounds), +4.2%
/// (4), +2.4% (6); held to AVX-VNNI +9.6% (5 of 5 between +8.0 and +10.7%); beam 4 (128
/// rows, not panel-outer until its rows thin out) -0.1..+1.0%. Exploring at AVX2: 1, 2, 3
/// panels ahead alike, 4 and 6 a little worse; the shares taken by the first group alone
/// or not spread over the units, half the gain. Spreading the blocks' shares over the
/// units too where they exceed a line a step (the order by groups: the decoder's products
/// of k = 2048) within the noise (greedy +0.5%, beam 4 -0.1%, 5 and 8 rounds).
const PANEL_AHEAD: usize = 2;

/// Share `i` of `n` of the cache lines of `data` (whole lines, in order; the shares cover
/// them once): what one tile, or one unit of a tile, fetches.
fn line_share(data: &[u8], i: usize, n: usize) -> &[u8] {
    let (lines, n) = (data.len() / 64, n.max(1));
    &data[i * lines / n * 64..(i + 1) * lines / n * 64]
}

#[allow(clippy::too_many_arguments)]
fn run_panels(a: &QuantizedRows, w: &PackedI8Matrix, bias: Option<&[f32]>, relu: bool, out: &Output, m: usize, threads: usize, isa: Isa, shifted: bool) {
    let n = w.n;
    let panels = n.div_ceil(NR);
    let gr = a.group_rows();
    let groups = m.div_ceil(gr);
    // Panels are taken in blocks (`block_bytes`) that stay in L2 while every row group
    // multiplies them: each group then writes long contiguous runs of its output rows
    // (with one panel at a time, a 65k-wide output is written 128 bytes per row and page).
    // With several row groups, a block is at most an eighth of the product (and at least
    // two panels): nobody fetches a product's first block, which the first group then reads
    // from memory at about half speed, and the decoder's products of 512-2048 columns fit
    // one 512 KiB block whole. Xeon with AMX held to AVX2, 2026-12-02: gemm_bench int8
    // 32 x 512 x 512 / 32 x 2048 x 512 / 32 x 512 x 2048 with cold weights 158-160 /
    // 157-171 / 151-164 -> 172-173 / 180-181 / 168-174 GOP/s; zh-en int8 greedy (250
    // verses, 3 alternating rounds) +0.4 / +5.3 / +2.3%, beam 4 and AMX greedy the same.
    // The blocks then grow from one panel, doubling up to that size, so that the first group
    // reads a single panel from memory unfetched. A small gain at most (same Xeon,
    // 2026-12-07, AVX2 int8 greedy in alternating pairs: +1.2% in the mean of 6 with the
    // growth switched in one build, +0.3% of 5 build against build; AMX greedy +0.4..+3.0%
    // and alike; AVX2 beam 4 -0.7..+2.4%; blocks grown on to the whole 512 KiB 2% slower).
    let pass = outer_pass_groups(isa, groups, gr, a.kp);
    let outer = pass > 0;
    let whole = (block_bytes() / (a.kp * NR)).max(1);
    let block = if groups > 1 { whole.min(panels.div_ceil(8).max(2)) } else { whole };
    let run = |p0: usize, p1: usize| {
        // SAFETY: Isa::Amx is chosen only where the CPU and OS run AMX (isa::current).
        #[cfg(target_arch = "x86_64")]
        let _tiles = (isa == Isa::Amx).then(|| unsafe { amx::Tiles::configure() });
        let blank = PanelEpilogue { w_scales: [1.0; NR], compensation: [0; NR], bias: [0.0; NR], cols: NR, relu, intgemm: false };
        let mut epilogues: Vec<PanelEpilogue> = (0..block.min(p1 - p0)).map(|_| blank.clone()).collect();
        let (mut scratch, mut best) = (Vec::new(), Vec::new());
        if let Output::Best { .. } = out {
            best = vec![(0, f32::NEG_INFINITY); m];
        }
        let (mut b0, mut size) = (p0, if groups > 1 { 1 } else { block });
        while b0 < p1 {
            let b1 = (b0 + size).min(p1);
            let next_size = (2 * size).min(block);
            // Filled in place, whole panels by fixed-size copies: building each panel's
            // epilogue and moving it into the list took four memcpy calls a panel (perf,
            // int8 greedy at AVX2, Zen 5, 2026-12-03: memmove 1.54% -> 0.19%, with this
            // loop 2.95% -> 2.6%; the rest is reading the scales and bias from memory).
            for (p, e) in (b0..b1).zip(&mut epilogues) {
                let cols = NR.min(n - p * NR);
                e.cols = cols;
                if cols == NR {
                    e.w_scales = w.scales[p * NR..(p + 1) * NR].try_into().unwrap();
                    e.bias = bias.map_or([0.0; NR], |b| b[p * NR..(p + 1) * NR].try_into().unwrap());
                } else {
                    *e = PanelEpilogue { cols, ..blank.clone() };
                    e.w_scales[..cols].copy_from_slice(&w.scales[p * NR..p * NR + cols]);
                    if let Some(b) = bias {
                        e.bias[..cols].copy_from_slice(&b[p * NR..p * NR + cols]);
                    }
                }
                if let Some(scale_x) = w.emulates_intgemm() {
                    // intgemm's PrepareBias: bias' = bias + colsum(w) * -(127/sx * 127/sw) / 127.
                    for c in 0..cols {
                        let scale_w = e.w_scales[c];
                        let factor = -((127.0 / scale_x) * (127.0 / scale_w) / 127.0);
                        let colsum = (w.compensation[p * NR + c] / SHIFT) as f32;
                        e.bias[c] += colsum * factor;
                        e.w_scales[c] = 1.0 / (scale_x * scale_w);
                    }
                    e.intgemm = true;
                } else if shifted {
                    e.compensation = w.compensation[p * NR..(p + 1) * NR].try_into().unwrap();
                }
            }
            let epilogues = &epilogues[..b1 - b0];
            // The first group streams the block from memory; the others fetch the next block
            // into L2 meanwhile, each tile a share, so no group waits for memory (in the
            // panel-outer order every tile of the first pass fetches a share of a later
            // panel instead).
            let next = w.panels(b1, (b1 + next_size).min(p1));
            let tiles = (groups - 1) * (b1 - b0);
            // The block's column b0 * NR of row 0, and the distance between rows.
            let (origin, ldy) = match out {
                // SAFETY: column b0 * NR < n is inside each row of y.
                Output::Rows(y) => (unsafe { y.get().add(b0 * NR) }, n),
                Output::Best { .. } => {
                    scratch.resize(m * (b1 - b0) * NR, 0.0);
                    (scratch.as_mut_ptr(), (b1 - b0) * NR)
                }
            };
            let tile = |g: usize, p: usize| {
                let (ag, e) = (a.group(g), &epilogues[p - b0]);
                let panel = w.panel(p);
                let prefetch = if outer {
                    // Each tile of the first pass a share of the panel `PANEL_AHEAD` later
                    // (this thread's); the later passes find the block in L2.
                    if p + PANEL_AHEAD < p1 && g < pass {
                        line_share(w.panel(p + PANEL_AHEAD), g, pass)
                    } else {
                        &next[..0]
                    }
                } else if g == 0 {
                    // A lone group (up to MR rows) has no later group to fetch for it:
                    // it fetches its own next panel (gemm_bench AVX2 4 x 65000 x 512
                    // 85-101 -> 137-139 GOP/s; with more groups it gained nothing).
                    if groups == 1 && p + 1 < panels { w.panel(p + 1) } else { &next[..0] }
                } else {
                    line_share(next, (g - 1) * (b1 - b0) + (p - b0), tiles)
                };
                let t = TileOut {
                    // SAFETY: row g*gr < m and column p*NR < n: inside the output.
                    y: unsafe { origin.add(g * gr * ldy + (p - b0) * NR) },
                    ldy,
                    rows: gr.min(m - g * gr),
                    inv_x: &a.inv_scales[g * gr..(g + 1) * gr],
                    e,
                    prefetch,
                    spread: outer,
                    streams: g == 0,
                };
                // SAFETY: `isa` never exceeds what the CPU supports (see isa::current);
                // the kernels read `kp/4` groups of the panel, of the row group and of
                // its plan (filled for these ISAs, see is_planned).
                unsafe {
                    match isa {
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512Vnni | Isa::Avx512Bw if t.e.intgemm => intgemm::tile_intgemm_512(ag, panel, a.kp, &t),
                        #[cfg(target_arch = "x86_64")]
                        Isa::AvxVnni | Isa::Avx2 if t.e.intgemm => intgemm::tile_intgemm_256(ag, panel, a.kp, &t),
                        _ if t.e.intgemm => tile_intgemm_scalar(ag, panel, a.kp, &t),
                        #[cfg(target_arch = "x86_64")]
                        Isa::Amx => amx::tile(ag, &a.row_shifts[g * gr..(g + 1) * gr], panel, a.kp, &t),
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512Vnni => vnni::tile_avx512_vnni(ag, panel, a.kp, &t),
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512Bw => avx512bw::tile(ag, &a.plans.group(g), panel, a.kp, &t),
                        #[cfg(target_arch = "x86_64")]
                        Isa::AvxVnni => vnni::tile_avx_vnni(ag, &a.row_shifts[g * MR..(g + 1) * MR], panel, a.kp, &t),
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 => avx2::tile(ag, &a.plans.group(g), panel, a.kp, &t),
                        _ => tile_scalar(ag, panel, a.kp, shifted, &t),
                    }
                }
            };
            if outer {
                for g0 in (0..groups).step_by(pass) {
                    for p in b0..b1 {
                        for g in g0..(g0 + pass).min(groups) {
                            tile(g, p);
                        }
                    }
                }
            } else {
                for g in 0..groups {
                    for p in b0..b1 {
                        tile(g, p);
                    }
                }
            }
            if let Output::Best { disabled, .. } = out {
                let (first, cols) = (b0 * NR, (b1 * NR).min(n) - b0 * NR);
                for ((row, off), best) in scratch.chunks_exact_mut(ldy).zip(disabled.iter()).zip(&mut best) {
                    let row = &mut row[..cols];
                    for &id in off.iter() {
                        if let Some(v) = (id as usize).checked_sub(first).and_then(|c| row.get_mut(c)) {
                            *v = f32::MIN;
                        }
                    }
                    let (c, v) = ops::argmax(row);
                    if v > best.1 {
                        *best = (first + c, v);
                    }
                }
            }
            (b0, size) = (b1, next_size);
        }
        if let Output::Best { found, .. } = out {
            found.lock().unwrap_or_else(|e| e.into_inner()).push((p0, best));
        }
    };
    super::split_panels(panels, threads, m * n * w.k, run);
}

/// intgemm's shifted product: u8 activations times s8 weights, each pair (k = 2i, 2i + 1)
/// summed and saturated to int16 as `vpmaddubsw` does, then summed exactly.
fn tile_intgemm_scalar(a: &[u8], panel: &[u8], kp: usize, t: &TileOut) {
    for r in 0..t.rows {
        let mut acc = [0i32; NR];
        for g in 0..kp / 4 {
            let xs = &a[(g * MR + r) * 4..(g * MR + r) * 4 + 4];
            let ws = &panel[g * NR * 4..(g + 1) * NR * 4];
            for (c, out) in acc.iter_mut().enumerate() {
                for pair in [0, 2] {
                    let sum = xs[pair] as i32 * weight(ws[c * 4 + pair]) as i32 + xs[pair + 1] as i32 * weight(ws[c * 4 + pair + 1]) as i32;
                    *out += sum.clamp(i16::MIN as i32, i16::MAX as i32);
                }
            }
        }
        t.store(r, &acc);
    }
}

/// The reference kernel: `acc[r][c] = Σk a[r][k] * w[c][k]` over the packed layouts, with
/// `a` read as u8 when `shifted` (the VNNI operand) and as i8 otherwise.
fn tile_scalar(a: &[u8], panel: &[u8], kp: usize, shifted: bool, t: &TileOut) {
    for r in 0..t.rows {
        let mut acc = [0i32; NR];
        for g in 0..kp / 4 {
            let xs = &a[(g * MR + r) * 4..(g * MR + r) * 4 + 4];
            let ws = &panel[g * NR * 4..(g + 1) * NR * 4];
            for (c, out) in acc.iter_mut().enumerate() {
                for j in 0..4 {
                    let xv = if shifted { xs[j] as i32 } else { xs[j] as i8 as i32 };
                    *out += xv * weight(ws[c * 4 + j]) as i32;
                }
            }
        }
        t.store(r, &acc);
    }
}

#[cfg(test)]
mod tests {
    use super::activations::quantize_row_scalar;
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// CTranslate2's formulas written directly on unpacked data.
    fn reference(x: &[f32], w: &[f32], bias: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let (wq, ws) = quantize_rows(w, n, k);
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            let row = &x[i * k..(i + 1) * k];
            let xs = row_scale(row);
            let xq: Vec<i32> = row.iter().map(|v| (v.mul_add(xs, 128.0).round_ties_even() - 128.0) as i32).collect();
            for j in 0..n {
                let acc: i32 = (0..k).map(|p| xq[p] * wq[j * k + p] as i32).sum();
                y[i * n + j] = acc as f32 * (1.0 / xs) / ws[j] + bias[j];
            }
        }
        y
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_quantizer_writes_the_scalar_bytes() {
        if !Isa::Avx2.is_supported() {
            eprintln!("no AVX2: nothing to compare");
            return;
        }
        let mut seed = 11;
        let specials = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, 0.5, -0.5, 1.5];
        for k in (1..=70).chain([127, 512, 2048, 2051]) {
            for case in 0..5 {
                let row: Vec<f32> = (0..k)
                    .map(|i| match case {
                        0 => lcg(&mut seed) * 5.0,
                        1 => 0.0,
                        // Values that land half-way between integers once scaled.
                        2 => (i % 9) as f32 * 0.5 - 2.0,
                        // NaNs among finite values: skipped by the maximum, `low` once scaled.
                        3 if i % 5 == 2 => f32::NAN,
                        3 => lcg(&mut seed) * 7.0,
                        _ if i % 7 == 3 => specials[i % specials.len()],
                        _ => lcg(&mut seed) * 1e3,
                    })
                    .collect();
                for (shifted, fixed) in [(false, None), (true, None), (false, Some(40.0)), (true, Some(0.37))] {
                    // Interleaved by MR rows, and row-major (the AMX layout).
                    let lane = (k + case) % MR;
                    for (offset, quad_stride) in [(lane * 4, MR * 4), (0, 4)] {
                        let size = k.div_ceil(4) * MR * 4;
                        let (mut want, mut got) = (vec![0x55u8; size], vec![0x55u8; size]);
                        let scale = quantize_row_scalar(&row, &mut want[offset..], quad_stride, shifted, fixed);
                        // SAFETY: is_supported checked AVX2 and FMA.
                        let scale2 = unsafe { quantize_avx2::quantize_row(&row, &mut got[offset..], quad_stride, shifted, fixed) };
                        assert_eq!(scale.to_bits(), scale2.to_bits(), "k {k} case {case}");
                        assert_eq!(want, got, "k {k} case {case} shifted {shifted} fixed {fixed:?} stride {quad_stride}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_kernel_is_bit_identical_to_the_reference() {
        let mut seed = 7;
        // With k a multiple of 64 and m from 4, AMX takes one A tile (m up to 16), two (17 to
        // 32) and groups of them.
        for &(m, n, k) in &[(1, 1, 1), (3, 5, 3), (8, 32, 4), (9, 33, 7), (37, 70, 131), (16, 64, 512), (5, 100, 2050), (4, 33, 128), (17, 40, 64), (75, 70, 256)] {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
            let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let expected = reference(&x, &w, &bias, m, n, k);
            let packed = PackedI8Matrix::quantize(&w, n, k);
            for isa in isa::available() {
                for threads in [1, 2] {
                    let mut y = vec![f32::NAN; m * n];
                    isa::with_isa(isa, || matmul_i8(&x, &packed, Some(&bias), &mut y, m, threads));
                    assert_eq!(y, expected, "{isa:?} {m}x{n}x{k} threads={threads}");
                }
            }
            // And close to the float product.
            for i in 0..m {
                for j in 0..n {
                    let f: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f32>() + bias[j];
                    // Each operand is off by at most half a step of its row's scale.
                    let xmax = x[i * k..(i + 1) * k].iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let wmax = w[j * k..(j + 1) * k].iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let tol = k as f32 * xmax * wmax / 127.0 + 1e-4;
                    assert!((expected[i * n + j] - f).abs() <= tol, "{m}x{n}x{k} [{i},{j}]");
                }
            }
        }
    }

    /// A row group without negative values (a ReLU's output) next to one with negative
    /// values, whatever stale rows a previous product left past `m` (the plans count only
    /// the live rows): exact on every ISA.
    #[test]
    fn nonnegative_row_groups_are_bit_identical_to_the_reference() {
        let mut seed = 5;
        let (m, n, k) = (11, 70, 96);
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let packed = PackedI8Matrix::quantize(&w, n, k);
        // The first group signed, the second (rows 8..11) nonnegative.
        let x: Vec<f32> = (0..m * k).map(|i| if i < MR * k { lcg(&mut seed) * 2.0 } else { lcg(&mut seed).max(0.0) }).collect();
        let expected = reference(&x, &w, &bias, m, n, k);
        let negative = vec![-1.0f32; 2 * MR * k];
        for isa in isa::available() {
            let mut y = vec![0.0; 2 * MR * n];
            isa::with_isa(isa, || {
                matmul_i8(&negative, &packed, None, &mut y, 2 * MR, 1);
                matmul_i8(&x, &packed, Some(&bias), &mut y, m, 1)
            });
            assert_eq!(y[..m * n], expected, "{isa:?}");
        }
    }

    /// Activations shaped like a Transformer's (mostly small, a few large channels, some
    /// rows all large): the plan sends k steps to each of its four kernels (shifted
    /// hexadecets, octets and quads, the sign trick), rows paired and odd, k with a tail
    /// step, and the AVX2 and AVX-512BW products stay bit-identical to the reference.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn planned_kernels_use_every_kind_and_stay_exact() {
        let planned: Vec<Isa> = [Isa::Avx2, Isa::Avx512Bw].into_iter().filter(|i| i.is_supported()).collect();
        if planned.is_empty() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut seed = 13;
        for &(m, n, k) in &[(13, 70, 516), (8, 64, 36), (3, 40, 2048), (1, 33, 12)] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| {
                    let (row, col) = (i / k, i % k);
                    let v = lcg(&mut seed) * 0.3;
                    if row % 5 == 4 || col % 37 == 0 {
                        v * 30.0
                    } else if col % 11 == 0 {
                        v * 6.0
                    } else {
                        v
                    }
                })
                .collect();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
            let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let packed = PackedI8Matrix::quantize(&w, n, k);
            let expected = reference(&x, &w, &bias, m, n, k);
            // The AVX2 kernel with and without hexadecets (octets by default, hexadecets on
            // request: plan::hexadecets_pay_off), then the AVX-512BW one.
            let runs = planned.iter().flat_map(|&i| if i == Isa::Avx2 { vec![(i, true), (i, false)] } else { vec![(i, true)] });
            for (isa, hexadecets) in runs {
                for threads in [1, 2] {
                    let mut y = vec![f32::NAN; m * n];
                    Switch::Int8Hexadecets.with(hexadecets, || isa::with_isa(isa, || matmul_i8(&x, &packed, Some(&bias), &mut y, m, threads)));
                    assert_eq!(y, expected, "{isa:?} {m}x{n}x{k} threads={threads} hexadecets={hexadecets}");
                }
                let shares = ACTIVATIONS.with(|a| a.borrow().plans.kernel_shares());
                assert_eq!(shares.iter().sum::<usize>(), m.div_ceil(2) * k.div_ceil(4) * 4, "{m}x{n}x{k}");
                if m > 2 && k > 100 {
                    assert_eq!(shares[0] > 0, hexadecets, "{isa:?} {m}x{n}x{k}: {shares:?}");
                    assert!(shares[1..].iter().all(|&v| v > 0), "{isa:?} {m}x{n}x{k}: {shares:?}");
                }
            }
        }
    }

    /// The panel-outer order (every row group of a pass takes a panel before the next
    /// panel, the first pass's tiles fetching shares of a later one) gives the reference's
    /// bits with the AVX2, AVX-VNNI and AVX-512 kernels, taken or not whatever the vendor:
    /// one pass or several (more rows than fit L1), ragged last groups, passes and panels,
    /// products shorter than the fetch distance, one and two threads.
    #[test]
    fn the_panel_outer_order_is_exact() {
        let kernels: Vec<Isa> = [Isa::Avx2, Isa::AvxVnni, Isa::Avx512Bw, Isa::Avx512Vnni].into_iter().filter(|i| i.is_supported()).collect();
        let Some(l1d) = isa::l1d_bytes().filter(|_| !kernels.is_empty()) else {
            eprintln!("skipped: no AVX2, or the CPU does not tell its L1d");
            return;
        };
        // Rows for two passes and a ragged third at k = 128, whatever this core's L1d.
        let many = 2 * (2 * l1d / 3 / 128 - NR) / MR * MR + 13;
        let mut seed = 17;
        for &(m, n, k) in &[(24, 200, 128), (17, 100, 260), (40, 330, 256), (9, 64, 64), (many, 70, 128)] {
            // Mostly small activations with a few large channels, so the AVX2 plan takes
            // several kinds of step.
            let x: Vec<f32> = (0..m * k).map(|i| lcg(&mut seed) * if i % k % 29 == 0 { 9.0 } else { 0.3 }).collect();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
            let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let packed = PackedI8Matrix::quantize(&w, n, k);
            let expected = reference(&x, &w, &bias, m, n, k);
            for &level in &kernels {
                for outer in [true, false] {
                    let groups = m.div_ceil(MR);
                    let pass = Switch::Int8PanelsOuter.with(outer, || outer_pass_groups(level, groups, MR, k.div_ceil(4) * 4));
                    let want = match outer {
                        false => 0..=0,
                        true if m == many => 2..=groups - 1,
                        true => groups..=groups,
                    };
                    assert!(want.contains(&pass), "{level:?} {m}x{n}x{k}: passes of {pass} groups, asked {outer}");
                    for threads in [1, 2] {
                        let mut y = vec![f32::NAN; m * n];
                        Switch::Int8PanelsOuter.with(outer, || isa::with_isa(level, || matmul_i8(&x, &packed, Some(&bias), &mut y, m, threads)));
                        assert_eq!(y, expected, "{level:?} {m}x{n}x{k} threads={threads} panel-outer={outer}");
                    }
                }
            }
        }
    }

    /// A product deeper than a plan can index takes the scalar kernel, exactly.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn products_too_deep_to_plan_stay_exact() {
        let (m, n, k) = (3, 2, 4 * (u16::MAX as usize + 1));
        assert!(!plan::fits(k));
        let mut seed = 11;
        let x: Vec<f32> = (0..m * k).map(|i| lcg(&mut seed) * if i % 97 == 0 { 8.0 } else { 0.2 }).collect();
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let bias = vec![0.5, -0.25];
        let packed = PackedI8Matrix::quantize(&w, n, k);
        let expected = reference(&x, &w, &bias, m, n, k);
        for level in isa::available() {
            let mut y = vec![f32::NAN; m * n];
            isa::with_isa(level, || matmul_i8(&x, &packed, Some(&bias), &mut y, m, 1));
            assert_eq!(y, expected, "{level:?}");
        }
    }

    #[test]
    fn fused_relu_equals_relu_after() {
        let mut seed = 3;
        let (m, n, k) = (11, 70, 40);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let packed = PackedI8Matrix::quantize(&w, n, k);
        let mut expected = vec![0.0; m * n];
        matmul_i8(&x, &packed, Some(&bias), &mut expected, m, 1);
        expected.iter_mut().for_each(|v| *v = v.max(0.0));
        for isa in isa::available() {
            let mut y = vec![f32::NAN; m * n];
            isa::with_isa(isa, || matmul_i8_relu(&x, &packed, Some(&bias), true, &mut y, m, 1));
            assert_eq!(y, expected, "{isa:?}");
        }
    }

    /// The best column of each row, found block by block, is the arg-max of the full
    /// product's row: across blocks and threads, with ties between blocks (the first wins),
    /// disabled columns (the best among them, every column) and at every level.
    #[test]
    fn best_columns_are_the_arg_max_of_the_product() {
        let mut seed = 11;
        let (m, n, k) = (9, 3000, 512);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let mut w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let mut bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        // Column 2500 repeats column 700, and a large bias makes them every row's largest:
        // equal logits two blocks apart.
        w.copy_within(700 * k..701 * k, 2500 * k);
        (bias[700], bias[2500]) = (50.0, 50.0);
        let packed = PackedI8Matrix::quantize(&w, n, k);
        let mut y = vec![0.0; m * n];
        matmul_i8(&x, &packed, Some(&bias), &mut y, m, 1);
        let every: Vec<u32> = (0..n as u32).collect();
        let mut disabled: Vec<Vec<u32>> = vec![Vec::new(); m];
        disabled[1] = vec![700, 2500, 5, 2999];
        disabled[2] = every.clone();
        disabled[3] = vec![700];
        let masks: Vec<&[u32]> = disabled.iter().map(|d| &d[..]).collect();
        let expected: Vec<(usize, f32)> = y
            .chunks_exact(n)
            .zip(&masks)
            .map(|(row, off)| {
                let mut row = row.to_vec();
                for &id in off.iter() {
                    row[id as usize] = f32::MIN;
                }
                ops::argmax(&row)
            })
            .collect();
        assert_eq!((expected[0].0, expected[3].0, expected[2]), (700, 2500, (0, f32::MIN)));
        assert!(![700, 2500].contains(&expected[1].0));
        for isa in isa::available() {
            for threads in [1, 2, 3] {
                let got = isa::with_isa(isa, || best_columns_i8(&x, &packed, Some(&bias), m, threads, &masks));
                assert_eq!(got, expected, "{isa:?} threads={threads}");
            }
        }
        assert!(best_columns_i8(&[], &packed, Some(&bias), 0, 1, &[]).is_empty());
    }

    #[test]
    fn extreme_values_do_not_saturate() {
        // All activations at +-127 and weights at +-127 with matching signs: the largest
        // pair sums vpmaddubsw can see; results must stay exact on every path.
        let (m, n, k) = (3, 40, 256);
        let x: Vec<f32> = (0..m * k).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let w: Vec<f32> = (0..n * k).map(|i| if (i % k) % 3 == 0 { -2.0 } else { 2.0 }).collect();
        let packed = PackedI8Matrix::quantize(&w, n, k);
        let expected = reference(&x, &w, &vec![0.0; n], m, n, k);
        for isa in isa::available() {
            let mut y = vec![0.0; m * n];
            isa::with_isa(isa, || matmul_i8(&x, &packed, None, &mut y, m, 1));
            assert_eq!(y, expected, "{isa:?}");
            assert!((y[0] - 2.0 * k as f32).abs() < 1e-3);
        }
    }

    /// A shortlisted output layer: the gathered matrix multiplies exactly as the rows
    /// packed anew would, in both modes (per-row activations and intgemm emulation), on
    /// every ISA.
    #[test]
    fn gathered_rows_multiply_like_the_rows_packed_anew() {
        let (n, k, m) = (77, 40, 3);
        let mut seed = 7;
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let ids: Vec<u32> = vec![0, 3, 4, 31, 32, 33, 50, 76];
        let (q, scales) = quantize_rows(&w, n, k);
        for intgemm in [false, true] {
            let full = PackedI8Matrix::from_quantized(&q, scales.clone(), n, k)
                .with_activation_scale(intgemm.then_some(20.0))
                .with_intgemm_emulation(intgemm);
            let gathered = full.gather_rows(&ids);
            let rows: Vec<i8> = ids.iter().flat_map(|&i| q[i as usize * k..(i as usize + 1) * k].iter().copied()).collect();
            let anew = PackedI8Matrix::from_quantized(&rows, ids.iter().map(|&i| scales[i as usize]).collect(), ids.len(), k)
                .with_activation_scale(intgemm.then_some(20.0))
                .with_intgemm_emulation(intgemm);
            let sub_bias: Vec<f32> = ids.iter().map(|&i| bias[i as usize]).collect();
            for level in isa::available() {
                let run = |w: &PackedI8Matrix| {
                    let mut y = vec![0.0f32; m * ids.len()];
                    isa::with_isa(level, || matmul_i8(&x, w, Some(&sub_bias), &mut y, m, 1));
                    y
                };
                let (a, b) = (run(&gathered), run(&anew));
                assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?} intgemm {intgemm}");
            }
        }
    }

    /// intgemm's shifted product: `u = clamp(rne(x * sx), ±127) + 127`, pairs of `u * w`
    /// saturated to int16, `acc * (1 / (sx * sw)) + bias - Σw * (127/sx * 127/sw) / 127`;
    /// large inputs make the saturation happen. Every ISA equals this formula bit for bit.
    #[test]
    fn intgemm_emulation_saturates_pairs_like_vpmaddubsw_on_every_isa() {
        let (n, k, m) = (40, 64, 5);
        let mut seed = 11;
        let q: Vec<i8> = (0..n * k).map(|_| (lcg(&mut seed) * 127.0).round() as i8).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 12.0).collect();
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let (sx, sw) = (15.0f32, 100.0f32);
        let w = PackedI8Matrix::from_quantized(&q, vec![sw; n], n, k).with_activation_scale(Some(sx)).with_intgemm_emulation(true);
        let mut saturated = 0;
        let mut expected = vec![0.0f32; m * n];
        for r in 0..m {
            let u: Vec<i32> = x[r * k..(r + 1) * k].iter().map(|&v| (v * sx).round_ties_even().clamp(-127.0, 127.0) as i32 + 127).collect();
            for c in 0..n {
                let wq = &q[c * k..(c + 1) * k];
                let mut acc = 0i32;
                for p in (0..k).step_by(2) {
                    let pair = u[p] * wq[p] as i32 + u[p + 1] * wq[p + 1] as i32;
                    saturated += (pair != pair.clamp(-32768, 32767)) as usize;
                    acc += pair.clamp(-32768, 32767);
                }
                let colsum: i32 = wq.iter().map(|&v| v as i32).sum();
                let corrected = bias[c] + colsum as f32 * -((127.0 / sx) * (127.0 / sw) / 127.0);
                expected[r * n + c] = acc as f32 * (1.0 / (sx * sw)) + corrected;
            }
        }
        assert!(saturated > 0, "the data must exercise the saturation");
        for level in isa::available() {
            let mut y = vec![0.0f32; m * n];
            isa::with_isa(level, || matmul_i8(&x, &w, Some(&bias), &mut y, m, 1));
            assert!(y.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?}");
        }
    }

    /// Packing and weight quantization (compiled per ISA) give every level the same
    /// bytes: halfway values, NaN, infinities, -128, any k and a last partial panel.
    #[test]
    fn packing_and_quantizing_are_the_same_on_every_isa() {
        let mut seed = 3;
        for (n, k) in [(1, 1), (33, 7), (70, 131), (64, 512), (5, 2050)] {
            let q: Vec<i8> = (0..n * k).map(|i| if i % 11 == 0 { -128 } else { (lcg(&mut seed) * 127.0) as i8 }).collect();
            // Every third row has 127 as its largest magnitude (scale 1: halves land half-way),
            // the next holds NaN and infinities, the next random values.
            let specials = [f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-40, 0.0];
            let w: Vec<f32> = (0..n * k)
                .map(|i| match (i / k.max(1)) % 3 {
                    0 if i % k == 0 => 127.0,
                    0 => (i % 9) as f32 * 0.5 - 2.0,
                    1 if i % 13 == 5 => specials[i % specials.len()],
                    _ => lcg(&mut seed) * 4.0,
                })
                .collect();
            let mut row = vec![0i8; k];
            for isa in isa::available() {
                let (packed, (wq, scales)) = isa::with_isa(isa, || (PackedI8Matrix::from_quantized(&q, vec![1.0; n], n, k), quantize_rows(&w, n, k)));
                for c in 0..n {
                    packed.quantized_row(c, &mut row);
                    let want: Vec<i8> = q[c * k..(c + 1) * k].iter().map(|&v| v.max(-127)).collect();
                    assert_eq!(row, want, "{isa:?} {n}x{k} row {c}");
                    let sum: i32 = want.iter().map(|&v| v as i32).sum();
                    assert_eq!(packed.compensation[c], SHIFT * sum, "{isa:?} {n}x{k} row {c}");
                    let s = row_scale(&w[c * k..(c + 1) * k]);
                    assert_eq!(scales[c].to_bits(), s.to_bits(), "{isa:?} {n}x{k} row {c}");
                    let want: Vec<i8> = w[c * k..(c + 1) * k].iter().map(|&v| quantize_value(v, s)).collect();
                    assert_eq!(&wq[c * k..(c + 1) * k], &want[..], "{isa:?} {n}x{k} row {c}");
                }
                // Padding: zero weights past k and past n.
                assert!(packed.compensation[n..].iter().all(|&c| c == 0));
                let last = (n - 1) / NR;
                for (g, group) in packed.panel(last).chunks_exact(NR * 4).enumerate() {
                    for (i, &byte) in group.iter().enumerate() {
                        let (c, kk) = (last * NR + i / 4, g * 4 + i % 4);
                        assert!(c < n && kk < k || weight(byte) == 0, "{isa:?} {n}x{k} pad of row {c} at {kk}");
                    }
                }
            }
        }
    }

    #[test]
    fn quantization_matches_ct2_rules() {
        let (q, s) = quantize_rows(&[0.5, -1.0, 0.25, 0.0, 0.0, 0.0], 2, 3);
        assert_eq!(s, vec![127.0, 1.0]);
        // 0.5 * 127 = 63.5 rounds to even; 0.25 * 127 = 31.75.
        assert_eq!(q, vec![64, -127, 32, 0, 0, 0]);
        let packed = PackedI8Matrix::from_quantized(&[1, -128, 3, 4, 5, 6], vec![2.0, 4.0], 2, 3);
        let mut row = [0i8; 3];
        packed.quantized_row(0, &mut row);
        assert_eq!(row, [1, -127, 3]);
        let mut f = [0.0f32; 3];
        packed.copy_row(1, &mut f);
        assert_eq!(f, [1.0, 1.25, 1.5]);
        assert_eq!(packed.scales(), &[2.0, 4.0]);
    }
}
