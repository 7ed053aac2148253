//! Float32 matrix products on top of the `gemm` crate, which picks its AVX2/AVX-512
//! micro-kernels at run time. Everything here is row-major.
use super::Ctx;

fn parallelism(ctx: &Ctx, flops: usize) -> gemm::Parallelism {
    // Splitting tiny products across threads costs more than it saves.
    if ctx.threads > 1 && flops >= 1 << 18 {
        gemm::Parallelism::Rayon(ctx.threads)
    } else {
        gemm::Parallelism::None
    }
}

/// `c[m,n] (+)= a[m,k] · b[n,k]^T`: a Linear layer, whose weight is stored [out, in].
/// With `accumulate` the product is added to `c`, otherwise `c` is overwritten.
pub fn matmul_bt(ctx: &Ctx, a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize, accumulate: bool) {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n, "matmul_bt: buffer too small");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    // SAFETY: the asserts above bound every index the strides below can reach.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(ctx, m * n * k),
        )
    }
}

/// `c[m,n] = a[m,k] · b[k,n]`, with explicit row strides so that callers can multiply
/// views into larger buffers (e.g. one attention head of a [t, d] matrix).
#[allow(clippy::too_many_arguments)]
pub fn matmul_strided(
    ctx: &Ctx,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    c: &mut [f32],
    c_rs: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, rs: usize, cols: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(k == 0 || (a.len() > last(m, a_rs, k, a_cs) && b.len() > last(k, b_rs, n, b_cs)));
    assert!(c.len() > last(m, c_rs, n, 1), "matmul_strided: output too small");
    if k == 0 {
        for i in 0..m {
            c[i * c_rs..i * c_rs + n].fill(0.0);
        }
        return;
    }
    // SAFETY: the asserts above bound every index the strides can reach.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            false,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(ctx, m * n * k),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
            }
        }
        c
    }

    #[test]
    fn matmul_bt_matches_reference_on_odd_shapes() {
        let ctx = Ctx::default();
        for &(m, n, k) in &[(1, 1, 1), (3, 17, 5), (7, 33, 64), (16, 9, 130)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let b: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let mut c = vec![0.0; m * n];
            matmul_bt(&ctx, &a, &b, &mut c, m, n, k, false);
            let r = reference(&a, &b, m, n, k);
            for (x, y) in c.iter().zip(&r) {
                assert!((x - y).abs() < 1e-3, "{m}x{n}x{k}: {x} vs {y}");
            }
            matmul_bt(&ctx, &a, &b, &mut c, m, n, k, true);
            for (x, y) in c.iter().zip(&r) {
                assert!((x - 2.0 * y).abs() < 2e-3);
            }
        }
    }
}
