//! Row-wise and element-wise operations, written as plain loops the compiler vectorizes.
use super::isa::dispatch_isa;

/// Feed-forward activations, numbered as CTranslate2 stores them (`*/activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    GeluTanh,
    Swish,
    Gelu,
    GeluSigmoid,
    Tanh,
}

impl Activation {
    pub fn from_ct2_id(id: i64) -> Option<Activation> {
        Some(match id {
            0 => Activation::Relu,
            1 => Activation::GeluTanh,
            2 => Activation::Swish,
            3 => Activation::Gelu,
            4 => Activation::GeluSigmoid,
            5 => Activation::Tanh,
            _ => return None,
        })
    }

    pub fn apply(self, x: &mut [f32]) {
        match self {
            Activation::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
            Activation::GeluTanh => x.iter_mut().for_each(|v| {
                let u = *v;
                *v = 0.5 * u * (1.0 + (0.797_884_6 * (u + 0.044715 * u * u * u)).tanh());
            }),
            Activation::Swish => x.iter_mut().for_each(|v| *v /= 1.0 + (-*v).exp()),
            Activation::Gelu => x.iter_mut().for_each(|v| *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2))),
            Activation::GeluSigmoid => x.iter_mut().for_each(|v| *v /= 1.0 + (-1.702 * *v).exp()),
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

/// Layer normalization of each row of `x` (width `gamma.len()`), in place.
pub fn layer_norm(x: &mut [f32], gamma: &[f32], beta: &[f32], epsilon: f32) {
    let d = gamma.len();
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let rstd = 1.0 / (var + epsilon).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * rstd * g + b;
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

/// Softmax of one row, in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `max(x) + ln(sum(exp(x - max)))`: what log-softmax subtracts from every element.
pub fn log_sum_exp(x: &[f32]) -> f32 {
    let max = max_value(x);
    if !max.is_finite() {
        return max;
    }
    max + sum_exp_shifted(x, max).ln()
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

/// `sum(exp(x - shift))`, with a polynomial exp the compiler vectorizes (the libm call
/// per element cost as much as a decoder layer over a 65k vocabulary).
fn sum_exp_shifted(x: &[f32], shift: f32) -> f32 {
    dispatch_isa!(sum_exp_generic(x: &[f32], shift: f32) -> f32)
}

#[inline(always)]
fn sum_exp_generic(x: &[f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..16 {
            acc[l] += exp_approx(c[l] - shift);
        }
    }
    let tail: f32 = rest.iter().map(|&v| exp_approx(v - shift)).sum();
    acc.iter().sum::<f32>() + tail
}

/// `exp(x)` for x <= 0 within 2 ulp: range reduction by ln 2 and a degree-6 polynomial
/// (Cephes' expf coefficients); inputs below -87 give 0.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5.000_000_1e-1;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Index and value of the largest element (the first one on ties).
pub fn argmax(x: &[f32]) -> (usize, f32) {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

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
