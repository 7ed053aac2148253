//! Row-wise and element-wise operations, written as plain loops the compiler vectorizes.
use super::isa::{self, dispatch_isa, FloatLevel};

pub use crate::backend::Activation;

impl Activation {
    pub fn apply(self, x: &mut [f32]) {
        // Compiled per ISA like the other row operations (the same arithmetic everywhere).
        let (activation, exp) = (self, expf_level());
        dispatch_isa!(apply_activation(activation: Activation, x: &mut [f32], exp: FloatLevel) -> ())
    }
}

#[inline(always)]
fn apply_activation(activation: Activation, x: &mut [f32], exp: FloatLevel) {
    {
        match activation {
            Activation::Relu => {
                for v in x.iter_mut() {
                    *v = v.max(0.0);
                }
            }
            Activation::GeluTanh => x.iter_mut().for_each(|v| {
                let u = *v;
                *v = 0.5 * u * (1.0 + (0.797_884_6 * (u + 0.044715 * u * u * u)).tanh());
            }),
            Activation::Swish => map_exp(x, exp, |v| -v, |v, e| v / (1.0 + e)),
            Activation::Gelu => x.iter_mut().for_each(|v| *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2))),
            Activation::GeluSigmoid => map_exp(x, exp, |v| -1.702 * v, |v, e| v / (1.0 + e)),
            Activation::Tanh => x.iter_mut().for_each(|v| *v = v.tanh()),
        }
    }
}

extern "C" {
    // The C library's erff (libm is always linked by std on the platforms we build for).
    fn erff(x: f32) -> f32;
}

pub fn erf(x: f32) -> f32 {
    // SAFETY: erff is a pure function of its argument.
    unsafe { erff(x) }
}

/// Layer normalization of each row of `x` (width `gamma.len()`), in place, with the exact
/// arithmetic of CTranslate2's AVX2 `layer_norm` kernel (as GCC compiled it with fast-math):
/// sums and sums of squares in 8 lanes (multiply then add), the lanes folded 4 + 4 then
/// pairwise, `variance = fma(sum_sq, 1/d, -mean²)`, `y = fma(x - mean, rstd * gamma, beta)`.
pub fn layer_norm(x: &mut [f32], gamma: &[f32], beta: &[f32], epsilon: f32) {
    dispatch_isa!(layer_norm_generic(x: &mut [f32], gamma: &[f32], beta: &[f32], epsilon: f32) -> ())
}

#[inline(always)]
fn layer_norm_generic(x: &mut [f32], gamma: &[f32], beta: &[f32], epsilon: f32) {
    let d = gamma.len();
    let inv_d = 1.0 / d as f32;
    for row in x.chunks_exact_mut(d) {
        let (sum, sum_sq) = layer_norm_sums(row);
        let mean = sum * inv_d;
        let variance = sum_sq.mul_add(inv_d, -(mean * mean)).max(0.0);
        let rstd = 1.0 / (variance + epsilon).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean).mul_add(rstd * g, *b);
        }
    }
}

/// `(sum(x), sum(x²))` in the order of CTranslate2's vectorized AVX2 loop: 8 lanes over the
/// full chunks (products rounded before the add), folded to 4 lanes (`lo + hi`), 4 more
/// elements (with FMA) if at least 4 remain, folded `(l0 + l2) + (l1 + l3)`, then the last
/// elements one by one (with FMA). Rows shorter than 8 start from the 4-lane step.
#[inline(always)]
fn layer_norm_sums(row: &[f32]) -> (f32, f32) {
    let d = row.len();
    let mut s4 = [0.0f32; 4];
    let mut q4 = [0.0f32; 4];
    let mut i = 0;
    if d >= 8 {
        let mut s8 = [0.0f32; 8];
        let mut q8 = [0.0f32; 8];
        let chunks = row.chunks_exact(8);
        for c in chunks {
            for l in 0..8 {
                s8[l] += c[l];
                q8[l] += c[l] * c[l];
            }
        }
        i = d / 8 * 8;
        for l in 0..4 {
            s4[l] = s8[l + 4] + s8[l];
            q4[l] = q8[l + 4] + q8[l];
        }
    }
    if d - i >= 4 {
        for l in 0..4 {
            let v = row[i + l];
            s4[l] += v;
            q4[l] = v.mul_add(v, q4[l]);
        }
        i += 4;
    }
    let mut sum = (s4[2] + s4[0]) + (s4[3] + s4[1]);
    let mut sum_sq = (q4[2] + q4[0]) + (q4[3] + q4[1]);
    for &v in &row[i..] {
        sum += v;
        sum_sq = v.mul_add(v, sum_sq);
    }
    (sum, sum_sq)
}

/// Layer normalization of each row with sequential sums and no fused multiply-adds:
/// `mean = Σx / n`, `var = Σ(x - mean)² / n`, `gamma * ((x - mean) / sqrt(var + eps)) + beta`
/// (Marian's CPU kernel as its WASM build, Bergamot's, computes it).
pub fn layer_norm_sequential(x: &mut [f32], gamma: &[f32], beta: &[f32], epsilon: f32) {
    let n = gamma.len();
    for row in x.chunks_exact_mut(n) {
        let mean = row.iter().fold(0.0f32, |s, &v| s + v) / n as f32;
        let var = row.iter().fold(0.0f32, |s, &v| {
            let d = v - mean;
            s + d * d
        }) / n as f32;
        let sigma = (var + epsilon).sqrt();
        for ((v, &g), &b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = g * ((*v - mean) / sigma) + b;
        }
    }
}

/// Root-mean-square normalization of each row (a layer norm without a bias), in place.
pub fn rms_norm(x: &mut [f32], gamma: &[f32], epsilon: f32) {
    let d = gamma.len();
    for row in x.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let r = 1.0 / (ms + epsilon).sqrt();
        for (v, g) in row.iter_mut().zip(gamma) {
            *v = *v * r * g;
        }
    }
}

/// Adds `bias` to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

/// `dst += src`, element-wise.
pub fn add_assign(dst: &mut [f32], src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
}

/// Softmax of one row, in place, with the arithmetic of CTranslate2's AVX2 `softmax`
/// kernel: the polynomial exp of `x - max` for every element, summed as `reduce_sum` does,
/// then scaled by `1 / sum`.
pub fn softmax(x: &mut [f32]) {
    dispatch_isa!(softmax_generic(x: &mut [f32]) -> ())
}

#[inline(always)]
fn softmax_generic(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = max_generic(x);
    for v in x.iter_mut() {
        let (y, pow2n) = exp_parts(*v - max);
        *v = y * pow2n;
    }
    let sum = reduce_sum_generic(x);
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// CTranslate2's `reduce_sum` over AVX2 vectors: sequential for 8 elements or fewer, else
/// 8 lanes over the full chunks, folded as `reduce_m256` does, plus the tail one by one.
#[inline(always)]
fn reduce_sum_generic(x: &[f32]) -> f32 {
    if x.len() <= 8 {
        return x.iter().fold(0.0, |s, &v| s + v);
    }
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    rest.iter().fold(fold8(&acc), |s, &v| s + v)
}

/// `reduce_m256`: swap the 128-bit halves and add, then 64-bit pairs, then neighbours.
#[inline(always)]
fn fold8(v: &[f32; 8]) -> f32 {
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

/// `max(x) + ln(sum(exp(x - max)))`: what log-softmax subtracts from every element, with
/// CTranslate2's arithmetic (`x + (-max - ln(sum))` is the same number as `x - this`).
pub fn log_sum_exp(x: &[f32]) -> f32 {
    log_sum_exp_with_max(x, max_value(x))
}

/// `log_sum_exp` of a row whose largest element (`max_value`) is already known.
pub fn log_sum_exp_with_max(x: &[f32], max: f32) -> f32 {
    log_sum_exp_then(x, max, std::ptr::null())
}

/// `log_sum_exp_with_max`, asking meanwhile for the `x.len()` floats at `next` (the row
/// to be read after this one, or null) to be fetched into L2. `next` is never read: a
/// prefetch is a hint.
pub fn log_sum_exp_then(x: &[f32], max: f32, next: *const f32) -> f32 {
    if !max.is_finite() {
        return max;
    }
    max + sum_exp_shifted(x, max, next).ln()
}

/// Log-softmax of one row, in place.
pub fn log_softmax(x: &mut [f32]) {
    let shift = log_sum_exp(x);
    x.iter_mut().for_each(|v| *v -= shift);
}

/// The largest element (-inf for an empty slice; NaNs are ignored).
pub fn max_value(x: &[f32]) -> f32 {
    dispatch_isa!(max_generic(x: &[f32]) -> f32)
}

#[inline(always)]
fn max_generic(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..16 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    rest.iter().chain(acc.iter()).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// `sum(exp(x - shift))` as CTranslate2's log-softmax computes it: for more than 8
/// elements, 8 lanes of the polynomial exp whose final `y * 2^n` is fused into the
/// accumulation (GCC contracted it into an FMA), folded as `reduce_m256`, then the tail with
/// the C library's `expf`; 8 elements or fewer all with `expf`.
fn sum_exp_shifted(x: &[f32], shift: f32, next: *const f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa::current().float_level() != FloatLevel::Scalar {
        // SAFETY: both vector levels have AVX2 and FMA (isa::current never reports more
        // than the CPU supports); `next` is only prefetched.
        return unsafe { x86::sum_exp_avx2(x, shift, next) };
    }
    let _ = next;
    sum_exp_generic(x, shift)
}

#[inline(always)]
fn sum_exp_generic(x: &[f32], shift: f32) -> f32 {
    if x.len() <= 8 {
        return x.iter().fold(0.0, |s, &v| s + (v - shift).exp());
    }
    let mut acc = [0.0f32; 8];
    // The exponentials of 32 elements are computed side by side (full-width vectors),
    // then accumulated 8 lanes at a time in CTranslate2's order.
    let blocks = x.chunks_exact(32);
    let rest = blocks.remainder();
    for b in blocks {
        let (mut y, mut pow2n) = ([0.0f32; 32], [0.0f32; 32]);
        for i in 0..32 {
            (y[i], pow2n[i]) = exp_parts(b[i] - shift);
        }
        for g in 0..4 {
            for l in 0..8 {
                acc[l] = y[g * 8 + l].mul_add(pow2n[g * 8 + l], acc[l]);
            }
        }
    }
    let chunks = rest.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            let (y, pow2n) = exp_parts(c[l] - shift);
            acc[l] = y.mul_add(pow2n, acc[l]);
        }
    }
    rest.iter().fold(fold8(&acc), |s, &v| s + (v - shift).exp())
}

const EXP_HI: f32 = 88.376_26;
const EXP_LO: f32 = -88.376_26;
// Cephes' constants bit for bit (not std's LOG2_E): the exp must round as CTranslate2's.
#[allow(clippy::approx_constant)]
const LOG2EF: f32 = 1.442_695;
const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `exp(x)` as `(y, 2^n)` with `exp(x) = y * 2^n`: Cephes' `exp256_ps` (avx_mathfun.h) as
/// CTranslate2 4.8's AVX2 kernels run it, i.e. with the multiply-adds GCC contracted into
/// FMAs (`fx = fma(x, log2e, 0.5)`, `x -= fx * C1` and `x -= fx * C2` fused, the Horner steps
/// fused, `y = fma(y, x², x) + 1`). Inputs are clamped to ±88.376; below about -87.3
/// `2^n` is 0 and so is the result.
#[inline(always)]
fn exp_parts(x: f32) -> (f32, f32) {
    // Not `clamp`: a NaN comes out as EXP_HI, as from the kernels' `vminps`/`vmaxps`.
    #[allow(clippy::manual_clamp)]
    let x = x.min(EXP_HI).max(EXP_LO);
    let fx = x.mul_add(LOG2EF, 0.5).floor();
    let x = (-fx).mul_add(EXP_C1, x);
    let x = (-fx).mul_add(EXP_C2, x);
    let z = x * x;
    let mut y = x.mul_add(EXP_P[0], EXP_P[1]);
    y = y.mul_add(x, EXP_P[2]);
    y = y.mul_add(x, EXP_P[3]);
    y = y.mul_add(x, EXP_P[4]);
    y = y.mul_add(x, EXP_P[5]);
    y = y.mul_add(z, x) + 1.0;
    // fx is an integer in [-127, 128]: adding 1.5 * 2^23 puts it in the low mantissa bits
    // (a conversion that vectorizes, unlike the saturating `as i32`).
    let n = (fx + 12_582_912.0).to_bits() as i32 - 0x4B40_0000;
    (y, f32::from_bits(((n + 127) as u32) << 23))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// `sum_exp_generic` with explicit AVX2 vectors, the same operations in the same order
    /// (the compiler split the portable version's accumulation into 2- and 4-wide pieces
    /// and spilled its constants; this is 2x faster).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum_exp_avx2(x: &[f32], shift: f32, next: *const f32) -> f32 {
        if x.len() <= 8 {
            return x.iter().fold(0.0, |s, &v| s + (v - shift).exp());
        }
        let shift_v = _mm256_set1_ps(shift);
        let mut acc = _mm256_setzero_ps();
        let chunks = x.chunks_exact(8);
        let rest = chunks.remainder();
        for (i, c) in chunks.enumerate() {
            if !next.is_null() && i % 2 == 0 {
                // One line of the next row per line of this one (prefetches never fault).
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(8 * i) as *const i8);
            }
            let (y, pow2n) = exp_parts8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), shift_v));
            acc = _mm256_fmadd_ps(y, pow2n, acc);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        rest.iter().fold(fold8(&lanes), |s, &v| s + (v - shift).exp())
    }

    /// `exp_parts` of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_parts8(x: __m256) -> (__m256, __m256) {
        let set = _mm256_set1_ps;
        // min/max return their second operand when the first is NaN, as f32::min/max do.
        let x = _mm256_max_ps(_mm256_min_ps(x, set(EXP_HI)), set(EXP_LO));
        let fx = _mm256_floor_ps(_mm256_fmadd_ps(x, set(LOG2EF), set(0.5)));
        let x = _mm256_fnmadd_ps(fx, set(EXP_C1), x);
        let x = _mm256_fnmadd_ps(fx, set(EXP_C2), x);
        let z = _mm256_mul_ps(x, x);
        let mut y = _mm256_fmadd_ps(x, set(EXP_P[0]), set(EXP_P[1]));
        for p in &EXP_P[2..] {
            y = _mm256_fmadd_ps(y, x, set(*p));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), set(1.0));
        let n = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(fx, set(12_582_912.0))), _mm256_set1_epi32(0x4B40_0000));
        let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127))));
        (y, pow2n)
    }
}

/// `exp(x)` with CTranslate2's vectorized polynomial (see `exp_parts`).
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    let (y, pow2n) = exp_parts(x);
    y * pow2n
}

/// Index and value of the largest element (the first one on ties).
pub fn argmax(x: &[f32]) -> (usize, f32) {
    // Two vectorized passes (the maximum, then the chunk holding its first occurrence)
    // instead of one branchy scan: decoding takes the arg-max of 65k logits per row.
    let best = max_value(x);
    if best == f32::NEG_INFINITY || best.is_nan() {
        return argmax_scalar(x);
    }
    for (c, chunk) in x.chunks(64).enumerate() {
        if chunk.iter().fold(false, |found, &v| found | (v == best)) {
            let i = chunk.iter().position(|&v| v == best).unwrap_or(0);
            return (c * 64 + i, best);
        }
    }
    argmax_scalar(x)
}

/// The first index of the largest element, NaNs ignored; `(0, -inf)` when there is none.
fn argmax_scalar(x: &[f32]) -> (usize, f32) {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best
}

/// One SSRU step for every row: `f = sigmoid(forget)`, `c = f * c + (1 - f) * input`,
/// `out = relu(c)`; `cells` holds `c` and is updated in place.
pub fn ssru_update(cells: &mut [f32], input: &[f32], forget: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(&forget[..cells.len()]);
    sigmoid(out);
    for ((c, &x), o) in cells.iter_mut().zip(input).zip(out.iter_mut()) {
        let f = *o;
        *c = f * *c + (1.0 - f) * x;
        *o = c.max(0.0);
    }
}

/// `1 / (1 + exp(-x))` in place.
pub fn sigmoid(x: &mut [f32]) {
    let exp = expf_level();
    dispatch_isa!(sigmoid_generic(x: &mut [f32], exp: FloatLevel) -> ())
}

#[inline(always)]
fn sigmoid_generic(x: &mut [f32], exp: FloatLevel) {
    map_exp(x, exp, |v| -v, |_, e| 1.0 / (1.0 + e));
}

/// How `map_exp` computes `expf`: `Scalar` calls the C library; `Avx2`/`Avx512` use
/// `expf_fma16` (with that level's table lookup), only where it is what the C library's
/// `expf` is: glibc's `__expf_fma`, which glibc picks on CPUs with AVX2 and FMA (as the
/// vector levels require). Elsewhere (no FMA, other C libraries) `expf` rounds differently.
fn expf_level() -> FloatLevel {
    match cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")) {
        true => isa::current().float_level(),
        false => FloatLevel::Scalar,
    }
}

/// `x[i] = f(x[i], expf(arg(x[i])))`, 16 elements at a time so that the exponentials
/// vectorize; the tail is padded to 16. One loop per way of computing `expf` (a branch in
/// the loop made the AVX-512 one 3x slower).
#[inline(always)]
fn map_exp(x: &mut [f32], exp: FloatLevel, arg: impl Fn(f32) -> f32, f: impl Fn(f32, f32) -> f32) {
    match exp {
        FloatLevel::Scalar => map_exp_with::<LIBM>(x, &arg, &f),
        FloatLevel::Avx2 => map_exp_with::<LOADS>(x, &arg, &f),
        FloatLevel::Avx512 => map_exp_with::<PERMUTES>(x, &arg, &f),
    }
}

/// `map_exp_with`'s `expf`: the C library's, or `expf_fma16` with `expf_table`'s scalar
/// loads or AVX-512 permutes.
const LIBM: u8 = 0;
const LOADS: u8 = 1;
const PERMUTES: u8 = 2;

#[inline(always)]
fn map_exp_with<const EXP: u8>(x: &mut [f32], arg: &impl Fn(f32) -> f32, f: &impl Fn(f32, f32) -> f32) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        map_exp_block::<EXP>(c.try_into().unwrap(), arg, f);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut b = [0.0f32; 16];
        b[..rest.len()].copy_from_slice(rest);
        map_exp_block::<EXP>(&mut b, arg, f);
        rest.copy_from_slice(&b[..rest.len()]);
    }
}

// Not a closure: closures are not always inlined, and outside the per-ISA copies
// `mul_add` is a call to the C library's fma.
#[inline(always)]
fn map_exp_block<const EXP: u8>(b: &mut [f32; 16], arg: &impl Fn(f32) -> f32, f: &impl Fn(f32, f32) -> f32) {
    let mut e = [0.0f32; 16];
    for i in 0..16 {
        e[i] = arg(b[i]);
    }
    e = match EXP {
        LIBM => e.map(f32::exp),
        _ => expf_fma16(&e, EXP == PERMUTES),
    };
    for i in 0..16 {
        b[i] = f(b[i], e[i]);
    }
}

// glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, with __exp2f_data): exp(x) = 2^(k/32) *
// 2^(r/32) with k = round(x * 32/ln2), the second factor a cubic in r, all in double.
const EXPF_INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe); // 0x1.71547652b82fep+5 = 32/ln2
const EXPF_SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000); // 0x1.8p+52: rounds to an integer
const EXPF_C: [f64; 3] = [
    f64::from_bits(0x3ebc_6af8_4b91_2394), // 0x1.c6af84b912394p-20
    f64::from_bits(0x3f2e_bfce_50fa_c4f3), // 0x1.ebfce50fac4f3p-13
    f64::from_bits(0x3f96_2e42_ff0c_52d6), // 0x1.62e42ff0c52d6p-6
];
/// `asuint64(2^(i/32)) - (i << 47)`: adding `k << 47` gives `2^(k/32)` for `k % 32 == i`.
const EXPF_TAB: [u64; 32] = [
    0x3ff0_0000_0000_0000, 0x3fef_d9b0_d315_8574, 0x3fef_b558_6cf9_890f, 0x3fef_9301_d012_5b51,
    0x3fef_72b8_3c7d_517b, 0x3fef_5487_3168_b9aa, 0x3fef_387a_6e75_6238, 0x3fef_1e9d_f51f_dee1,
    0x3fef_06fe_0a31_b715, 0x3fee_f1a7_373a_a9cb, 0x3fee_dea6_4c12_3422, 0x3fee_ce08_6061_892d,
    0x3fee_bfda_d536_2a27, 0x3fee_b42b_569d_4f82, 0x3fee_ab07_dd48_5429, 0x3fee_a47e_b03a_5585,
    0x3fee_a09e_667f_3bcd, 0x3fee_9f75_e8ec_5f74, 0x3fee_a114_73eb_0187, 0x3fee_a589_994c_ce13,
    0x3fee_ace5_422a_a0db, 0x3fee_b737_b0cd_c5e5, 0x3fee_c491_82a3_f090, 0x3fee_d503_b23e_255d,
    0x3fee_e89f_995a_d3ad, 0x3fee_ff76_f2fb_5e47, 0x3fef_199b_dd85_529c, 0x3fef_3720_dcef_9069,
    0x3fef_5818_dcfb_a487, 0x3fef_7c97_337b_9b5f, 0x3fef_a4af_a2a4_90da, 0x3fef_d076_5b6e_4540,
];

/// glibc's `__expf_fma` bit for bit on 16 lanes, branch-free so it vectorizes. The
/// multiply-adds GCC fused are `mul_add` (as its disassembly shows, also k's rounding and
/// `r = x*32/ln2 - k`), and the special cases are selected instead of branched to: above
/// 0x1.62e42ep6 inf, below -0x1.9fe368p6 (-inf too) 0, NaN `x + x`; all else, |x| >= 88
/// included, takes the main formula as in glibc. Checked against `f32::exp` for all 2^32
/// inputs at both levels (test `expf_fma_exhaustive`).
#[inline(always)]
fn expf_fma16(x: &[f32; 16], permutes: bool) -> [f32; 16] {
    let (mut ki, mut y) = ([0u64; 16], [0.0f64; 16]);
    for i in 0..16 {
        let xd = x[i] as f64;
        let kd = xd.mul_add(EXPF_INV_LN2_N, EXPF_SHIFT);
        ki[i] = kd.to_bits();
        let kd = kd - EXPF_SHIFT;
        let r = xd.mul_add(EXPF_INV_LN2_N, -kd);
        let z = r.mul_add(EXPF_C[0], EXPF_C[1]);
        y[i] = z.mul_add(r * r, r.mul_add(EXPF_C[2], 1.0));
    }
    let t = expf_table(&ki, permutes);
    let mut e = [0.0f32; 16];
    for i in 0..16 {
        let s = f64::from_bits(t[i].wrapping_add(ki[i] << 47));
        e[i] = if x[i] > f32::from_bits(0x42b1_7217) {
            f32::INFINITY
        } else if x[i] < f32::from_bits(0xc2cf_f1b4) {
            0.0
        } else if x[i].is_nan() {
            x[i] + x[i]
        } else {
            (y[i] * s) as f32
        };
    }
    e
}

/// `EXPF_TAB[ki % 32]` for 16 lanes. The compiler makes scalar loads of the indexed
/// entries (AVX2's vpgatherqq is no faster here); with AVX-512 two-table permutes of the
/// table held in 4 registers make the whole activation 1.6x faster.
#[inline(always)]
fn expf_table(ki: &[u64; 16], permutes: bool) -> [u64; 16] {
    #[cfg(target_arch = "x86_64")]
    if permutes {
        use std::arch::x86_64::*;
        let mut t = [0u64; 16];
        // SAFETY: permutes are only asked for at the Avx512 level, i.e. where the CPU has
        // AVX-512F; the loads and stores are within the arrays (32 entries, 16 lanes).
        unsafe {
            let tab = |i: usize| _mm512_loadu_si512(EXPF_TAB.as_ptr().add(8 * i).cast());
            for g in 0..2 {
                let k = _mm512_loadu_si512(ki.as_ptr().add(8 * g).cast());
                let lo = _mm512_permutex2var_epi64(tab(0), k, tab(1)); // entries 0-15 (bits 0-3)
                let hi = _mm512_permutex2var_epi64(tab(2), k, tab(3)); // entries 16-31
                let t16 = _mm512_test_epi64_mask(k, _mm512_set1_epi64(16));
                _mm512_storeu_si512(t.as_mut_ptr().add(8 * g).cast(), _mm512_mask_blend_epi64(t16, lo, hi));
            }
        }
        return t;
    }
    let _ = permutes;
    ki.map(|k| EXPF_TAB[(k % 32) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The explicit AVX2 sum of exponentials is the portable one bit for bit (blocks,
    /// 8-lane rest, libm tail; clamped, NaN and infinite inputs).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn explicit_avx2_sum_exp_is_bit_identical_to_the_portable_one() {
        if !isa::Isa::Avx2.is_supported() {
            return;
        }
        let mut seed = 7u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed >> 8) as f32 / (1 << 24) as f32
        };
        for len in (0..80).chain([1000, 65_001]) {
            for spread in [1.0f32, 30.0, 300.0] {
                let mut x: Vec<f32> = (0..len).map(|_| (next() - 0.7) * spread).collect();
                if len > 40 && spread > 100.0 {
                    x[3] = f32::NEG_INFINITY;
                    x[17] = f32::NAN;
                    x[21] = f32::INFINITY;
                }
                let shift = x.iter().copied().fold(f32::NEG_INFINITY, f32::max).max(0.0);
                // SAFETY: AVX2 and FMA are supported (checked above).
                let fast = unsafe { x86::sum_exp_avx2(&x, shift, x.as_ptr()) };
                let portable = sum_exp_generic(&x, shift);
                assert_eq!(fast.to_bits(), portable.to_bits(), "len {len} spread {spread}: {fast} vs {portable}");
            }
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        let mut x = vec![0.5f32; 1000];
        x[700] = 3.0;
        x[900] = 3.0;
        x[10] = f32::NAN;
        assert_eq!(argmax(&x), (700, 3.0));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), (0, f32::NEG_INFINITY));
        assert_eq!(argmax(&[]), (0, f32::NEG_INFINITY));
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1.0]), (1, -1.0));
        for n in [1, 63, 64, 65, 200] {
            let v: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32).collect();
            assert_eq!(argmax(&v), argmax_scalar(&v), "n={n}");
        }
    }

    #[test]
    fn softmax_and_log_softmax_agree() {
        let mut a = vec![1.0, 2.0, 3.0, -1.0];
        let mut b = a.clone();
        softmax(&mut a);
        log_softmax(&mut b);
        assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for (p, l) in a.iter().zip(&b) {
            assert!((p.ln() - l).abs() < 1e-5);
        }
    }

    #[test]
    fn polynomial_exp_matches_libm() {
        let mut worst: f32 = 0.0;
        for i in 0..200_000 {
            let x = -(i as f32) * 87.0 / 200_000.0;
            let (a, b) = (exp_approx(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        let v: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 10.0).collect();
        let max = v.iter().copied().fold(f32::MIN, f32::max);
        let exact = max + v.iter().map(|x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32;
        assert!((log_sum_exp(&v) - exact).abs() < 1e-5);
    }

    /// `exp` of every element as the activations compute it.
    fn exp_in_place(x: &mut [f32]) {
        let exp = expf_level();
        dispatch_isa!(exp_generic(x: &mut [f32], exp: FloatLevel) -> ())
    }

    #[inline(always)]
    fn exp_generic(x: &mut [f32], exp: FloatLevel) {
        map_exp(x, exp, |v| v, |_, e| e);
    }

    /// Compares `exp_in_place` with `f32::exp` (glibc's `expf`) bit for bit at every level.
    fn check_exp(x: &[f32]) {
        let want: Vec<f32> = x.iter().map(|v| v.exp()).collect();
        let mut levels = isa::available();
        levels.dedup_by_key(|l| l.float_level());
        for level in levels {
            let mut y = x.to_vec();
            isa::with_isa(level, || exp_in_place(&mut y));
            for ((&v, &e), &w) in x.iter().zip(&y).zip(&want) {
                assert_eq!(e.to_bits(), w.to_bits(), "exp({v:e}) = {e:e} at {level:?}, not {w:e}");
            }
        }
    }

    #[test]
    fn expf_table() {
        for (i, &t) in EXPF_TAB.iter().enumerate() {
            assert_eq!(t, (i as f64 / 32.0).exp2().to_bits() - ((i as u64) << 47), "{i}");
        }
    }

    #[test]
    fn exp_matches_libm() {
        // The thresholds, ±inf, NaNs, and the only two inputs (found exhaustively) whose
        // result changes if `r` is not fused (`x*32/ln2 - k` rounded twice).
        let specials = [0x42b1_7217, 0xc2cf_f1b4, 0x42b0_0000, 0xc2b0_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0xffc0_1234, 0x7f80_0001, 0x7f7f_ffff, 0x4202_422f, 0xc27c_65d9];
        let mut x: Vec<f32> = specials.iter().flat_map(|&b: &u32| [b - 1, b, b + 1]).map(f32::from_bits).collect();
        x.extend([0.0, -0.0, 1e-45, -1e-45, 1e-30, -1e-30]);
        // 4M bit patterns spread over all of f32, then 3M values in the range that is neither 0 nor inf.
        x.extend((0..1u32 << 22).map(|i| f32::from_bits(i.wrapping_mul(1021))));
        x.extend((0..3_000_000).map(|i| -104.0 + i as f32 * (194.0 / 3_000_000.0)));
        check_exp(&x);
        check_exp(&x[..21]); // a partial tail block only
    }

    /// Every f32, 2^32 inputs per level (about 80 s in all): bit-identical to glibc 2.36's
    /// `expf` (`__expf_fma`) at avx2 and avx512, NaNs included, on an AMD EPYC (Zen 5).
    #[test]
    #[ignore]
    fn expf_fma_exhaustive() {
        for start in (0..1u64 << 32).step_by(1 << 24) {
            let x: Vec<f32> = (start..start + (1 << 24)).map(|b| f32::from_bits(b as u32)).collect();
            check_exp(&x);
        }
    }

    /// `cargo test --release --lib activation_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn activation_speed() {
        let x: Vec<f32> = (0..1 << 20).map(|i| ((i as f32) * 0.001).sin() * 8.0).collect();
        for level in isa::available() {
            let time = |f: &dyn Fn(&mut [f32])| {
                let mut y = x.clone();
                let t = std::time::Instant::now();
                for _ in 0..20 {
                    y.copy_from_slice(&x);
                    f(&mut y);
                }
                (t.elapsed().as_secs_f64() / 20.0 * 1e3, y)
            };
            let (old, a) = time(&|y| y.iter_mut().for_each(|v| *v /= 1.0 + (-*v).exp()));
            let (new, b) = isa::with_isa(level, || time(&|y| Activation::Swish.apply(y)));
            assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
            println!("{level:?}: swish over 1M floats {old:.3} ms with expf calls, {new:.3} ms now");
        }
    }

    #[test]
    fn layer_norm_normalizes() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut x, &[1.0; 4], &[0.0; 4], 1e-5);
        assert!(x.iter().sum::<f32>().abs() < 1e-5);
        assert!((x.iter().map(|v| v * v).sum::<f32>() / 4.0 - 1.0).abs() < 1e-3);
    }

    #[test]
    fn activations() {
        let mut x = vec![-1.0, 0.0, 2.0];
        Activation::Relu.apply(&mut x);
        assert_eq!(x, vec![0.0, 0.0, 2.0]);
        let mut g = vec![1.0];
        Activation::Gelu.apply(&mut g);
        assert!((g[0] - 0.841_344_7).abs() < 1e-5);
        assert!((erf(0.5) - 0.520_499_9).abs() < 1e-6);
    }
}

