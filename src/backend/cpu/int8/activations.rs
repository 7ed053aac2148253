//! Activations quantized per row on the fly, in the layouts the kernels read: k-quads of
//! `MR` interleaved rows, or row-major groups for AMX; with their scales, the AVX-VNNI
//! kernels' row shifts and the AVX2 kernels' plans.
use super::super::isa::{self, Isa};
#[cfg(target_arch = "x86_64")]
use super::plan;
use super::{quantize_byte, row_scale, AMX_ROWS, MR, SHIFT};
use crate::backend::cpu::OutPtr;

/// Activations quantized per row, interleaved by groups of `MR` rows (`[k/4][MR][4]` bytes
/// per group), shifted to u8 for the AVX-512 VNNI kernel; or, for the AMX kernel, row-major
/// by groups of `AMX_ROWS` rows (`[AMX_ROWS][kp]`). Rows past `m` in the last group are stale
/// and never stored.
#[derive(Default)]
pub(super) struct QuantizedRows {
    pub(super) data: Vec<u8>,
    /// Each row's bytes contiguous (A tiles), `AMX_ROWS` rows a group, instead of
    /// interleaved by k-quads, `MR` rows a group.
    pub(super) row_major: bool,
    /// `1 / scale_x` per row.
    pub(super) inv_scales: Vec<f32>,
    /// `128 Σ x` per row, for the AVX-VNNI kernel (filled by `fill_row_shifts`), which
    /// multiplies the stored `w + 128` by signed `x`.
    pub(super) row_shifts: Vec<i32>,
    pub(super) kp: usize,
    /// Which kernel the AVX2 product runs on each k step (filled in `fill_companion`).
    #[cfg(target_arch = "x86_64")]
    pub(super) plans: plan::Plans,
}

impl QuantizedRows {
    /// Rows per group of the layout.
    pub(super) fn group_rows(&self) -> usize {
        if self.row_major {
            AMX_ROWS
        } else {
            MR
        }
    }

    pub(super) fn group(&self, g: usize) -> &[u8] {
        let bytes = self.kp * self.group_rows();
        &self.data[g * bytes..(g + 1) * bytes]
    }

    /// Quantizes the `m` rows of `x` (`k` values each), split by groups of rows across
    /// `threads` of the worker's team where that is worth it (each row's bytes depend on
    /// that row only).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fill(&mut self, x: &[f32], m: usize, k: usize, shifted: bool, fixed_scale: Option<f32>, intgemm: bool, row_major: bool, threads: usize) {
        self.kp = k.div_ceil(4) * 4;
        self.row_major = row_major;
        let (kp, gr) = (self.kp, self.group_rows());
        let groups = m.div_ceil(gr);
        // Grown, never shrunk: the buffer lives as long as the thread (see ACTIVATIONS).
        if self.data.len() < groups * kp * gr {
            self.data.resize(groups * kp * gr, 0);
        }
        if self.inv_scales.len() < groups * gr {
            self.inv_scales.resize(groups * gr, 1.0);
        }
        let data = OutPtr(self.data.as_mut_ptr());
        // Parts start at a group's first row, so no two threads write the same group. A
        // value costs about 2 multiply-adds (its row's maximum, then the rounding).
        super::super::split_rows(&mut self.inv_scales[..m], 1, threads, 2 * m * k, |r| r % gr == 0, |first, inv_scales| {
            for (r, inv_scale) in (first..).zip(inv_scales) {
                let (g, lane) = (r / gr, r % gr);
                // SAFETY: group g lies within `data` (resized above); the rows of one group
                // are in one part, so this thread alone writes it while the parts run.
                let group = unsafe { std::slice::from_raw_parts_mut(data.get().add(g * kp * gr), kp * gr) };
                // Row `lane`'s first byte and the distance between its k-quads.
                let (dst, quad_stride) = if row_major { (&mut group[lane * kp..], 4) } else { (&mut group[lane * 4..], MR * 4) };
                *inv_scale = match (intgemm, fixed_scale) {
                    (true, Some(scale)) => {
                        quantize_row_intgemm(&x[r * k..(r + 1) * k], dst, quad_stride, scale);
                        1.0 / scale
                    }
                    _ => 1.0 / quantize_row(&x[r * k..(r + 1) * k], dst, quad_stride, shifted, fixed_scale),
                };
            }
        });
    }

    /// `128 Σ x` of each row of the `m` rows' groups (signed bytes), into `row_shifts`.
    pub(super) fn fill_row_shifts(&mut self, m: usize) {
        let (gr, kp) = (self.group_rows(), self.kp);
        self.row_shifts.clear();
        self.row_shifts.resize(m.div_ceil(gr) * gr, 0);
        for (g, shifts) in self.row_shifts.chunks_exact_mut(gr).enumerate() {
            let group = &self.data[g * kp * gr..(g + 1) * kp * gr];
            let mut sums = [0i32; AMX_ROWS];
            if self.row_major {
                for (lane, sum) in sums[..gr].iter_mut().enumerate() {
                    *sum = group[lane * kp..(lane + 1) * kp].iter().map(|&v| v as i8 as i32).sum();
                }
            } else {
                for step in group.chunks_exact(4 * MR) {
                    for (sum, x) in sums.iter_mut().zip(step.chunks_exact(4)) {
                        *sum += x.iter().map(|&v| v as i8 as i32).sum::<i32>();
                    }
                }
            }
            // Wrapping, as the kernel's int32 sums do: the difference it takes is exact
            // modulo 2^32, and the true product fits.
            for (shift, sum) in shifts.iter_mut().zip(sums) {
                *shift = sum.wrapping_mul(SHIFT);
            }
        }
    }

    /// Plans the product of the `m` rows of `data` for `isa`'s kernel (`plan`): which
    /// kernel takes each k step.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn plan(&mut self, m: usize, isa: Isa) {
        self.plans.fill(&self.data, m, self.kp, isa)
    }
}

thread_local! {
    /// Per-thread activation buffer reused by every product (no allocation per call).
    pub(super) static ACTIVATIONS: std::cell::RefCell<QuantizedRows> = std::cell::RefCell::new(QuantizedRows::default());
}

/// Stores the quantized bytes of 64-value chunk `chunk` of a row (`len` of them) into the
/// row's k-quads, which start at `dst` and lie `quad_stride` bytes apart (interleaved rows
/// or row-major), whole 4-byte groups (a tail group carries the bytes of `q` past `len`,
/// against zero weights).
#[inline(always)]
fn store_groups(q: &[u8; 64], len: usize, chunk: usize, dst: &mut [u8], quad_stride: usize) {
    for i in 0..len.div_ceil(4) {
        let at = (chunk * 16 + i) * quad_stride;
        dst[at..at + 4].copy_from_slice(&q[i * 4..i * 4 + 4]);
    }
}

/// intgemm's `QuantizeU`: `rne(x * scale)` (the product rounded first) clamped to ±127,
/// plus 127, into the row's k-quads at `dst`, `quad_stride` bytes apart.
fn quantize_row_intgemm(row: &[f32], dst: &mut [u8], quad_stride: usize, scale: f32) {
    #[inline(always)]
    fn generic(row: &[f32], dst: &mut [u8], quad_stride: usize, scale: f32) {
        let mut q = [0u8; 64];
        for (c, chunk) in row.chunks(64).enumerate() {
            for (o, &v) in q.iter_mut().zip(chunk) {
                // NaN becomes -127 (`max` takes the number; `clamp` would keep the NaN),
                // like cvtps_epi32's INT_MIN after intgemm's clamp.
                #[allow(clippy::manual_clamp)]
                let y = (v * scale).max(-127.0).min(127.0);
                // 1.5 * 2^23 + y rounds y half to even into the low mantissa bits.
                *o = ((y + 12_582_912.0).to_bits() as u8).wrapping_add(127);
            }
            store_groups(&q, chunk.len(), c, dst, quad_stride);
        }
    }
    isa::dispatch_isa!(generic(row: &[f32], dst: &mut [u8], quad_stride: usize, scale: f32) -> ())
}

/// Quantizes one activation row into its k-quads, which start at `dst` and lie
/// `quad_stride` bytes apart; returns the scale: `fixed_scale`, or the row's own
/// (`127 / max|x|`).
pub(super) fn quantize_row(row: &[f32], dst: &mut [u8], quad_stride: usize, shifted: bool, fixed_scale: Option<f32>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa::current().float_level() != isa::FloatLevel::Scalar {
        // SAFETY: both vector levels have AVX2 and FMA, and isa::current() never reports
        // more than the CPU supports.
        return unsafe { super::quantize_avx2::quantize_row(row, dst, quad_stride, shifted, fixed_scale) };
    }
    quantize_row_scalar(row, dst, quad_stride, shifted, fixed_scale)
}

/// [`quantize_row`] without vector instructions, the reference of its AVX2 twin.
pub(super) fn quantize_row_scalar(row: &[f32], dst: &mut [u8], quad_stride: usize, shifted: bool, fixed_scale: Option<f32>) -> f32 {
    // A fixed scale may take values past ±127: they are clamped to ±127 (never -128,
    // which the sign trick of the AVX2 kernels cannot negate), as intgemm does.
    let (scale, low) = match fixed_scale {
        Some(scale) => (scale, 1.0f32),
        None => (row_scale(row), 0.0),
    };
    // Rounded after the +128 shift, fused, exactly as CTranslate2's AVX2/AVX-512 kernels
    // do (`vfmadd132ps` then `vroundps`); unshifted paths subtract the shift back.
    let flip = if shifted { 0 } else { 0x80u8 };
    let mut q = [0u8; 64];
    for (c, chunk) in row.chunks(64).enumerate() {
        q.fill(0);
        for (o, &v) in q.iter_mut().zip(chunk) {
            *o = quantize_byte(v, scale, low, flip);
        }
        store_groups(&q, chunk.len(), c, dst, quad_stride);
    }
    scale
}
