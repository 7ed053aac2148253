//! What state is this (virtual) CPU in right now? `cargo run --release --example cpu_probe [-- SECONDS]`.
//!
//! Shared VMs change speed within seconds, and not every kind of code alike. For SECONDS
//! (default 20) three loops take turns, about a millisecond each, in alternating order:
//! - a dependent chain of scalar adds (one a cycle: it tracks the vCPU's share of the core
//!   and its clock),
//! - independent FMAs in registers (the float32 peak, no memory),
//! - the AVX2 float32 kernel's 3 x 32 tile (3 broadcasts, 4 loads and 12 FMAs a k step,
//!   k = 512, the 64 KiB panel read from L2), written in assembly so that no compiler
//!   choice is measured.
//!
//! The rounds are grouped by the add chain's speed against its best. On the Skylake-SP VM of
//! 2026-11-28, in the rounds where the chain ran at 90-100% of its best (the FMA loop near 95%),
//! the tile averaged 57-58 GFLOP/s against the FMA loop's 82 (70%), though its own best
//! round reached 77 (89%): the loads are what varies there, not the compiled kernel. x86_64
//! with AVX2 and FMA only.

#[cfg(target_arch = "x86_64")]
#[path = "common/clock.rs"]
mod clock;

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::asm;

    pub use super::clock::add_chain;

    /// `n` turns of 12 independent 8-wide FMAs (192 flops a turn).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma_peak(n: usize) {
        asm!(
            "vxorps ymm0,ymm0,ymm0", "vxorps ymm1,ymm1,ymm1", "vxorps ymm2,ymm2,ymm2", "vxorps ymm3,ymm3,ymm3",
            "vxorps ymm4,ymm4,ymm4", "vxorps ymm5,ymm5,ymm5", "vxorps ymm6,ymm6,ymm6", "vxorps ymm7,ymm7,ymm7",
            "vxorps ymm8,ymm8,ymm8", "vxorps ymm9,ymm9,ymm9", "vxorps ymm10,ymm10,ymm10", "vxorps ymm11,ymm11,ymm11",
            "vxorps ymm12,ymm12,ymm12", "vxorps ymm13,ymm13,ymm13",
            "2:",
            "vfmadd231ps ymm0,ymm12,ymm13", "vfmadd231ps ymm1,ymm12,ymm13", "vfmadd231ps ymm2,ymm12,ymm13", "vfmadd231ps ymm3,ymm12,ymm13",
            "vfmadd231ps ymm4,ymm12,ymm13", "vfmadd231ps ymm5,ymm12,ymm13", "vfmadd231ps ymm6,ymm12,ymm13", "vfmadd231ps ymm7,ymm12,ymm13",
            "vfmadd231ps ymm8,ymm12,ymm13", "vfmadd231ps ymm9,ymm12,ymm13", "vfmadd231ps ymm10,ymm12,ymm13", "vfmadd231ps ymm11,ymm12,ymm13",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _, out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _,
        );
    }

    /// One k step of the 3 x 32 tile: rows at `x0`, `x1`, `x2` (offset `i` bytes), the panel's
    /// 32 columns at `w + off` (128 bytes).
    macro_rules! tile_step {
        ($xoff:literal, $w0:literal, $w1:literal, $w2:literal, $w3:literal) => {
            concat!(
                "vbroadcastss ymm12, [{x0}+{i}+", $xoff, "]\n",
                "vbroadcastss ymm13, [{x1}+{i}+", $xoff, "]\n",
                "vbroadcastss ymm14, [{x2}+{i}+", $xoff, "]\n",
                "vmovups ymm15, [{w}+", $w0, "]\n",
                "vfmadd231ps ymm0, ymm12, ymm15\n", "vfmadd231ps ymm4, ymm13, ymm15\n", "vfmadd231ps ymm8, ymm14, ymm15\n",
                "vmovups ymm15, [{w}+", $w1, "]\n",
                "vfmadd231ps ymm1, ymm12, ymm15\n", "vfmadd231ps ymm5, ymm13, ymm15\n", "vfmadd231ps ymm9, ymm14, ymm15\n",
                "vmovups ymm15, [{w}+", $w2, "]\n",
                "vfmadd231ps ymm2, ymm12, ymm15\n", "vfmadd231ps ymm6, ymm13, ymm15\n", "vfmadd231ps ymm10, ymm14, ymm15\n",
                "vmovups ymm15, [{w}+", $w3, "]\n",
                "vfmadd231ps ymm3, ymm12, ymm15\n", "vfmadd231ps ymm7, ymm13, ymm15\n", "vfmadd231ps ymm11, ymm14, ymm15\n",
            )
        };
    }

    /// The tile over `steps` k steps (even): rows `x0..x2`, panel `w` (`[steps][32]`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile(x0: *const f32, x1: *const f32, x2: *const f32, w: *const f32, steps: usize) {
        asm!(
            "vxorps ymm0,ymm0,ymm0", "vxorps ymm1,ymm1,ymm1", "vxorps ymm2,ymm2,ymm2", "vxorps ymm3,ymm3,ymm3",
            "vxorps ymm4,ymm4,ymm4", "vxorps ymm5,ymm5,ymm5", "vxorps ymm6,ymm6,ymm6", "vxorps ymm7,ymm7,ymm7",
            "vxorps ymm8,ymm8,ymm8", "vxorps ymm9,ymm9,ymm9", "vxorps ymm10,ymm10,ymm10", "vxorps ymm11,ymm11,ymm11",
            "xor {i}, {i}",
            "2:",
            tile_step!("0", "0", "32", "64", "96"),
            tile_step!("4", "128", "160", "192", "224"),
            "add {w}, 256", "add {i}, 8", "cmp {i}, {end}", "jb 2b",
            x0 = in(reg) x0, x1 = in(reg) x1, x2 = in(reg) x2, w = inout(reg) w => _, end = in(reg) steps * 4, i = out(reg) _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
            out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
        );
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::time::Instant;
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        println!("cpu_probe needs AVX2 and FMA");
        return;
    }
    let seconds: f64 = std::env::args().nth(1).map_or(20.0, |s| s.parse().expect("cpu_probe [SECONDS]"));
    const K: usize = 512;
    const ROWS: usize = 126;
    let x = vec![0.001f32; ROWS * K];
    let panel = vec![0.001f32; K * 32 + 16];
    // 64-byte aligned, as Tolk's packed panels are.
    let w = panel[panel.as_ptr().align_offset(64)..].as_ptr();
    let names = ["add chain (G adds/s)", "FMA peak (GFLOP/s)", "3 x 32 tile (GFLOP/s)"];
    let run = |probe: usize| -> f64 {
        let t = Instant::now();
        let work = match probe {
            0 => {
                std::hint::black_box(probe::add_chain(600_000));
                2.4e6
            }
            // SAFETY: AVX2 and FMA checked above.
            1 => unsafe {
                probe::fma_peak(200_000);
                200_000.0 * 192.0
            },
            _ => {
                for r in (0..ROWS).step_by(3) {
                    // SAFETY: rows r..r + 3 hold K floats each and the panel K x 32.
                    unsafe { probe::tile(x[r * K..].as_ptr(), x[(r + 1) * K..].as_ptr(), x[(r + 2) * K..].as_ptr(), w, K) };
                }
                (ROWS * 32 * K * 2) as f64
            }
        };
        work / t.elapsed().as_secs_f64() / 1e9
    };
    let mut rounds: Vec<[f64; 3]> = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let mut r = [0.0; 3];
        // Alternate the order: in a fixed order one position read up to 10% faster.
        let order = if rounds.len().is_multiple_of(2) { [0, 1, 2] } else { [2, 1, 0] };
        for p in order {
            r[p] = run(p);
        }
        rounds.push(r);
    }
    let best: Vec<f64> = (0..3).map(|p| rounds.iter().map(|r| r[p]).fold(0.0, f64::max)).collect();
    println!("{} rounds in {seconds} s; best round: {}", rounds.len(), (0..3).map(|p| format!("{} {:.1}", names[p], best[p])).collect::<Vec<_>>().join(", "));
    for (low, high) in [(0.0, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.01)] {
        let sel: Vec<&[f64; 3]> = rounds.iter().filter(|r| (low..high).contains(&(r[0] / best[0]))).collect();
        if sel.is_empty() {
            continue;
        }
        let mean = |p: usize| sel.iter().map(|r| r[p]).sum::<f64>() / sel.len() as f64;
        println!(
            "add chain at {:>3.0}-{:>3.0}% of its best: {:>5} rounds, mean {}; tile / FMA peak {:.0}%",
            100.0 * low,
            100.0 * high.min(1.0),
            sel.len(),
            (0..3).map(|p| format!("{} {:.1}", names[p], mean(p))).collect::<Vec<_>>().join(", "),
            100.0 * mean(2) / mean(1)
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("cpu_probe measures x86_64 loops only");
}
