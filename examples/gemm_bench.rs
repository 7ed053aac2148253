//! Micro-benchmark of the packed matrix kernels against the core's peak:
//! `cargo run --release --example gemm_bench [-- --isa avx512vnni --shape 128,65000,512 --cold]`.
//!
//! For every ISA level this CPU supports, it first measures the peak of the level's
//! multiply-accumulate instruction (independent accumulators in registers: FMA for float32,
//! `vpdpbusd` or `vpmaddubsw`+`vpmaddwd` for int8, `vpmaddwd`/`vpdpwssd` for int16), then
//! the products `y = x · Wᵀ` of decoder-like shapes, whole (quantization of `x` and
//! dequantization of `y` included), in GOP/s and as a share of that peak.
//!
//! `--cold` adds a second line per shape with the weights read from memory, as a decoding
//! step finds them (the step's 55 MB of int8 weights outgrow the caches): each product
//! takes the next of enough copies of the weights to fill 256 MiB, more than any L3.
use std::time::Instant;
use tolk::backend::cpu::isa::{self, Isa};
use tolk::backend::cpu::{int16, int8, packed};

const SHAPES: [(usize, usize, usize); 6] =
    [(1, 65000, 512), (32, 65000, 512), (128, 65000, 512), (128, 2048, 512), (128, 512, 2048), (1024, 2048, 512)];

/// What the copies of a shape's weights fill with `--cold`, per kind.
const COLD_BYTES: usize = 256 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let isas: Vec<Isa> = match arg("--isa") {
        Some(name) => vec![Isa::parse(&name).filter(|i| i.is_supported()).expect("--isa: unknown or unsupported level")],
        None => isa::available(),
    };
    let shapes: Vec<(usize, usize, usize)> = match arg("--shape") {
        Some(s) => {
            let v: Vec<usize> = s.split(',').map(|x| x.parse().expect("--shape m,n,k")).collect();
            vec![(v[0], v[1], v[2])]
        }
        None => SHAPES.to_vec(),
    };
    let cold = args.iter().any(|a| a == "--cold");
    println!("{:>10}  {:>26}  {:>22}  {:>22}  {:>22}", "isa", "shape m x n x k", "float32 GOP/s (%peak)", "int8 GOP/s (%peak)", "int16 GOP/s (%peak)");
    for &level in &isas {
        let peak = peak::measure(level);
        if level != Isa::Scalar {
            println!(
                "{:>10}  peak (in-register MACs)      {:>14.0}          {:>14.0}          {:>14.0}",
                level.name(),
                peak.f32,
                peak.i8,
                peak.i16
            );
        }
        for &(m, n, k) in &shapes {
            // Shaped like a Transformer's activations: small values and one large channel
            // in 64, so a row's quantization scale leaves most values small (what the AVX2
            // kernel's plan relies on; uniform values would all take its exact path).
            let x: Vec<f32> = (0..m * k).map(|i| (((i * 7919) % 13) as f32 * 0.1 - 0.6) * if i % k % 64 == 7 { 4.0 } else { 1.0 }).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 11) as f32 * 0.05 - 0.25).collect();
            // Each kind's copies (one unless `--cold`), used in turn.
            let copies = |bytes: usize| if cold { (COLD_BYTES / (n * k * bytes).max(1)).max(2) } else { 1 };
            let pf: Vec<_> = (0..copies(4)).map(|_| packed::PackedMatrix::pack(&w, n, k)).collect();
            let p8: Vec<_> = (0..copies(1)).map(|_| int8::PackedI8Matrix::quantize(&w, n, k)).collect();
            let p16: Vec<_> = (0..copies(2)).map(|_| int16::PackedI16Matrix::quantize(&w, n, k)).collect();
            let mut y = vec![0.0f32; m * n];
            let ops = 2.0 * (m * n * k) as f64;
            let reps = (3e9 / ops).ceil() as usize;
            let rate = |f: &mut dyn FnMut()| {
                isa::with_isa(level, &mut *f); // warm up (page faults, caches)
                let t = Instant::now();
                isa::with_isa(level, || (0..reps).for_each(|_| f()));
                ops * reps as f64 / t.elapsed().as_secs_f64() / 1e9
            };
            let share = |rate: f64, peak: f64| if peak.is_nan() { "      ".to_string() } else { format!("({:>3.0}%)", 100.0 * rate / peak) };
            // Turn 0 multiplies the first copy again and again (in cache where it fits), turn 1
            // each copy after the other (`step`: how far each product moves on).
            for step in if cold { 0..2 } else { 0..1 } {
                let (mut a, mut b, mut c) = (0, 0, 0);
                let f = rate(&mut || {
                    a += step;
                    packed::matmul_packed(&x, &pf[a % pf.len()], None, &mut y, m, 1)
                });
                let q8 = rate(&mut || {
                    b += step;
                    int8::matmul_i8(&x, &p8[b % p8.len()], None, &mut y, m, 1)
                });
                let q16 = rate(&mut || {
                    c += step;
                    int16::matmul_i16(&x, &p16[c % p16.len()], None, &mut y, m, 1)
                });
                println!(
                    "{:>10}  {:>26}  {:>14.1} {}  {:>14.1} {}  {:>14.1} {}",
                    level.name(),
                    format!("{m} x {n} x {k}{}", if step == 1 { " cold" } else { "" }),
                    f,
                    share(f, peak.f32),
                    q8,
                    share(q8, peak.i8),
                    q16,
                    share(q16, peak.i16)
                );
            }
        }
    }
}

/// In-register throughput of each level's multiply-accumulate instructions, in GOP/s (a
/// multiply and an add count as two operations).
mod peak {
    use super::Isa;
    use std::time::Instant;

    pub struct Peak {
        pub f32: f64,
        pub i8: f64,
        pub i16: f64,
    }

    pub fn measure(level: Isa) -> Peak {
        const ITERS: usize = 20_000_000;
        let time = |f: &dyn Fn(usize) -> i64, ops_per_iter: f64| {
            std::hint::black_box(f(ITERS / 10));
            let t = Instant::now();
            std::hint::black_box(f(std::hint::black_box(ITERS)));
            ops_per_iter * ITERS as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: each loop runs only on a level that supports its instructions.
        unsafe {
            use x86::*;
            match level {
                // AMX: int8 from four accumulator tiles (16 x 16 x 64 products each).
                Isa::Amx => Peak { f32: time(&|n| fma512(n), 12.0 * 32.0), i8: time(&|n| amx_int8(n / 16), 4.0 * 16384.0 * 2.0 / 16.0), i16: time(&|n| vnni512_i16(n), 12.0 * 64.0) },
                Isa::Avx512Vnni => Peak { f32: time(&|n| fma512(n), 12.0 * 32.0), i8: time(&|n| vnni512(n), 12.0 * 128.0), i16: time(&|n| vnni512_i16(n), 12.0 * 64.0) },
                Isa::Avx512Bw => Peak { f32: time(&|n| fma512(n), 12.0 * 32.0), i8: time(&|n| maddubs512(n), 12.0 * 128.0), i16: time(&|n| madd512(n), 12.0 * 64.0) },
                Isa::AvxVnni => Peak { f32: time(&|n| fma256(n), 12.0 * 16.0), i8: time(&|n| vnni256(n), 12.0 * 64.0), i16: time(&|n| vnni256_i16(n), 12.0 * 32.0) },
                Isa::Avx2 => Peak { f32: time(&|n| fma256(n), 12.0 * 16.0), i8: time(&|n| maddubs256(n), 12.0 * 64.0), i16: time(&|n| madd256(n), 12.0 * 32.0) },
                Isa::Scalar => Peak { f32: f64::NAN, i8: f64::NAN, i16: f64::NAN },
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (level, time); // no in-register peak loops off x86-64
            Peak { f32: f64::NAN, i8: f64::NAN, i16: f64::NAN }
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;
        use std::hint::black_box;

        /// 12 independent accumulators updated by `$op` each iteration, inputs opaque to the
        /// compiler so nothing is folded away.
        macro_rules! peak_loop {
            ($name:ident, $feat:literal, $vec:ty, $class:ident, $zero:expr, $a:expr, $b:expr, |$acc:ident, $x:ident, $y:ident| $op:expr, |$s:ident| $sum:expr) => {
                #[target_feature(enable = $feat)]
                pub unsafe fn $name(iters: usize) -> i64 {
                    let x: $vec = black_box($a);
                    let $y: $vec = black_box($b);
                    let mut accs = [$zero; 12];
                    for _ in 0..iters {
                        for $acc in accs.iter_mut() {
                            // Opaque for every accumulator, in a register (`black_box` would
                            // go through memory): where `$op` multiplies `x` and `y` apart from
                            // the accumulator (`vpmaddubsw` + `vpmaddwd`, then `vpaddd`), the
                            // product would otherwise be computed once and shared by all 12,
                            // and the loop would time the additions alone.
                            let mut $x = x;
                            std::arch::asm!("/* {0} */", inout($class) $x, options(nomem, nostack, preserves_flags));
                            *$acc = $op;
                        }
                    }
                    let mut total = 0i64;
                    for $s in accs {
                        total += $sum;
                    }
                    total
                }
            };
        }

        /// `iters` x 4 independent `tdpbsud` (Isa::Amx's support check asked Linux for the
        /// tile data).
        pub unsafe fn amx_int8(iters: usize) -> i64 {
            #[repr(C, align(64))]
            struct Config([u8; 64]);
            let mut c = Config([0; 64]);
            c.0[0] = 1;
            for t in 0..8 {
                c.0[16 + 2 * t] = 64;
                c.0[48 + t] = 16;
            }
            std::arch::asm!("ldtilecfg [{}]", "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", "tilezero tmm4", "tilezero tmm5", in(reg) &c, options(nostack));
            for _ in 0..iters {
                std::arch::asm!("tdpbsud tmm0, tmm4, tmm5", "tdpbsud tmm1, tmm4, tmm5", "tdpbsud tmm2, tmm4, tmm5", "tdpbsud tmm3, tmm4, tmm5", options(nostack, nomem));
            }
            std::arch::asm!("tilerelease", options(nostack, nomem));
            iters as i64
        }

        peak_loop!(fma512, "avx512f", __m512, zmm_reg, _mm512_set1_ps(1.0), _mm512_set1_ps(0.999), _mm512_set1_ps(1e-3),
            |acc, x, y| _mm512_fmadd_ps(*acc, x, y), |s| _mm512_reduce_add_ps(s) as i64);
        peak_loop!(fma256, "avx2,fma", __m256, ymm_reg, _mm256_set1_ps(1.0), _mm256_set1_ps(0.999), _mm256_set1_ps(1e-3),
            |acc, x, y| _mm256_fmadd_ps(*acc, x, y), |s| _mm256_cvtss_f32(s) as i64);
        peak_loop!(vnni512, "avx512f,avx512bw,avx512vnni", __m512i, zmm_reg, _mm512_setzero_si512(), _mm512_set1_epi8(3), _mm512_set1_epi8(-2),
            |acc, x, y| _mm512_dpbusd_epi32(*acc, x, y), |s| _mm512_reduce_add_epi32(s) as i64);
        peak_loop!(vnni512_i16, "avx512f,avx512bw,avx512vnni", __m512i, zmm_reg, _mm512_setzero_si512(), _mm512_set1_epi16(3), _mm512_set1_epi16(-2),
            |acc, x, y| _mm512_dpwssd_epi32(*acc, x, y), |s| _mm512_reduce_add_epi32(s) as i64);
        peak_loop!(maddubs512, "avx512f,avx512bw", __m512i, zmm_reg, _mm512_setzero_si512(), _mm512_set1_epi8(3), _mm512_set1_epi8(-2),
            |acc, x, y| _mm512_add_epi32(*acc, _mm512_madd_epi16(_mm512_maddubs_epi16(x, y), _mm512_set1_epi16(1))), |s| _mm512_reduce_add_epi32(s) as i64);
        peak_loop!(madd512, "avx512f,avx512bw", __m512i, zmm_reg, _mm512_setzero_si512(), _mm512_set1_epi16(3), _mm512_set1_epi16(-2),
            |acc, x, y| _mm512_add_epi32(*acc, _mm512_madd_epi16(x, y)), |s| _mm512_reduce_add_epi32(s) as i64);
        peak_loop!(vnni256, "avx2,fma,avxvnni", __m256i, ymm_reg, _mm256_setzero_si256(), _mm256_set1_epi8(3), _mm256_set1_epi8(-2),
            |acc, x, y| _mm256_dpbusd_avx_epi32(*acc, x, y), |s| _mm256_extract_epi32::<0>(s) as i64);
        peak_loop!(vnni256_i16, "avx2,fma,avxvnni", __m256i, ymm_reg, _mm256_setzero_si256(), _mm256_set1_epi16(3), _mm256_set1_epi16(-2),
            |acc, x, y| _mm256_dpwssd_avx_epi32(*acc, x, y), |s| _mm256_extract_epi32::<0>(s) as i64);
        peak_loop!(maddubs256, "avx2,fma", __m256i, ymm_reg, _mm256_setzero_si256(), _mm256_set1_epi8(3), _mm256_set1_epi8(-2),
            |acc, x, y| _mm256_add_epi32(*acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))), |s| _mm256_extract_epi32::<0>(s) as i64);
        peak_loop!(madd256, "avx2,fma", __m256i, ymm_reg, _mm256_setzero_si256(), _mm256_set1_epi16(3), _mm256_set1_epi16(-2),
            |acc, x, y| _mm256_add_epi32(*acc, _mm256_madd_epi16(x, y)), |s| _mm256_extract_epi32::<0>(s) as i64);
    }
}
