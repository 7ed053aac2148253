//! Micro-benchmark of the packed float32 kernels: `cargo run --release --example gemm_bench`.
//! Prints GFLOP/s per ISA for decoder-like shapes (few rows, large weights).
use std::time::Instant;
use tolk::backend::cpu::{isa, packed};

fn main() {
    for &(m, n, k) in &[(1, 65000, 512), (8, 65000, 512), (32, 65000, 512), (128, 65000, 512), (128, 2048, 512), (32, 512, 2048), (1024, 2048, 512)] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1).collect();
        let p = packed::PackedMatrix::pack(&w, n, k);
        let mut y = vec![0.0f32; m * n];
        for isa in isa::available() {
            let reps = (2e9 / (2.0 * (m * n * k) as f64)).ceil() as usize;
            let t = Instant::now();
            isa::with_isa(isa, || {
                for _ in 0..reps {
                    packed::matmul_packed(&x, &p, None, &mut y, m, 1);
                }
            });
            let s = t.elapsed().as_secs_f64();
            println!("{:>7} m={m:<5} n={n:<6} k={k:<5} {:8.1} GFLOP/s", isa.name(), 2.0 * (m * n * k * reps) as f64 / s / 1e9);
        }
    }
}
