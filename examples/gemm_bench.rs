//! Micro-benchmark of the packed matrix kernels: `cargo run --release --example gemm_bench`.
//! Prints GOP/s per ISA and weight type for decoder-like shapes (few rows, large weights).
use std::time::Instant;
use tolk::backend::cpu::{int8, isa, packed};

fn main() {
    for &(m, n, k) in &[(1, 65000, 512), (32, 65000, 512), (128, 65000, 512), (128, 2048, 512), (1024, 2048, 512)] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
        let p = packed::PackedMatrix::pack(&w, n, k);
        let q = int8::PackedI8Matrix::quantize(&w, n, k);
        let mut y = vec![0.0f32; m * n];
        for isa in isa::available() {
            let reps = (2e9 / (2.0 * (m * n * k) as f64)).ceil() as usize;
            let time = |f: &mut dyn FnMut()| {
                let t = Instant::now();
                isa::with_isa(isa, || (0..reps).for_each(|_| f()));
                2.0 * (m * n * k * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
            };
            let f32_rate = time(&mut || packed::matmul_packed(&x, &p, None, &mut y, m, 1));
            let i8_rate = time(&mut || int8::matmul_i8(&x, &q, None, &mut y, m, 1));
            println!("{:>10} m={m:<5} n={n:<6} k={k:<5} f32 {f32_rate:7.1}  int8 {i8_rate:7.1} GOP/s", isa.name());
        }
    }
}
