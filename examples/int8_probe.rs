//! How fast can this core run the AVX2 int8 kernel's steps? `cargo run --release --example
//! int8_probe`.
//!
//! Loops in assembly (operands in registers and L1, no plan, no compiler choice), timed
//! against a dependent chain of scalar adds (one a cycle, so cycles are counted without
//! hardware counters):
//! - 8 independent `vpmaddubsw` (the multiply ports' throughput),
//! - the same plus 8 `vpaddw` (whether the int16 adds take multiply slots),
//! - one octet step of a pair of rows as `int8/avx2.rs` runs it (4 broadcasts, 8 weight loads,
//!   16 `vpmaddubsw`, 8 `vpaddw`, 8 `vpmaddwd` by ones from memory, 8 `vpaddd`: 512 products),
//! - one hexadecet step of a pair (4 `vpmaddubsw` summed in int16 per `vpmaddwd`: 1024
//!   products; the broadcasts reused, so a bound the kernel's spills do not reach),
//! - one hexadecet step of a single row over the panel's 32 columns (16 registers suffice,
//!   but every weight is loaded for one row: 512 products).
//!
//! On the Zen 4 of 2026-11-29 (AMD EPYC, family 25 model 17, about 3.6 GHz): 8 `vpmaddubsw`
//! in 3.9 cycles, with the adds 4.7; octets 38.7-39.5 products a cycle, hexadecets 41.3-43,
//! a single row's hexadecets 42, against the whole kernel's 31.7 (gemm_bench 128x512x2048,
//! 229 GOP/s). The three steps take 13.2, 24.6 and 12.1 cycles for 40, 72 and 36 vector
//! integer instructions: about 3 a cycle whatever their kind, so the bound is the count of
//! instructions per product, not the multiply ports. x86_64 with AVX2 only.
#[cfg(target_arch = "x86_64")]
#[path = "common/clock.rs"]
mod clock;

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::asm;
    use std::time::Instant;

    pub use super::clock::add_chain;

    #[target_feature(enable = "avx2")]
    unsafe fn maddubs8(n: usize) {
        asm!("2:",
          "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddubsw ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddubsw ymm3, ymm14, ymm15",
          "vpmaddubsw ymm4, ymm14, ymm15", "vpmaddubsw ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddubsw ymm7, ymm14, ymm15",
          "dec {n}", "jnz 2b", n = inout(reg) n => _, out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _);
    }
    #[target_feature(enable = "avx2")]
    unsafe fn maddubs8_add8(n: usize) {
        asm!("2:",
          "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddubsw ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddubsw ymm3, ymm14, ymm15",
          "vpmaddubsw ymm4, ymm14, ymm15", "vpmaddubsw ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddubsw ymm7, ymm14, ymm15",
          "vpaddw ymm8, ymm8, ymm0", "vpaddw ymm9, ymm9, ymm1", "vpaddw ymm10, ymm10, ymm2", "vpaddw ymm11, ymm11, ymm3",
          "vpaddw ymm8, ymm8, ymm4", "vpaddw ymm9, ymm9, ymm5", "vpaddw ymm10, ymm10, ymm6", "vpaddw ymm11, ymm11, ymm7",
          "dec {n}", "jnz 2b", n = inout(reg) n => _, out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
          out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _);
    }
    // `reg` = the 32 weight bytes at `{w}+off`.
    macro_rules! load_weights {
        ($off:literal, $reg:literal) => {
            concat!("vmovdqu ", $reg, ", [{w}+", $off, "]\n")
        };
    }
    // `acc` += the int16 pair sums in `sum`, widened to int32 by `vpmaddwd` with the ones at {o}.
    macro_rules! widen_into {
        ($sum:literal, $acc:literal) => {
            concat!(
                "vpmaddwd ",
                $sum,
                ", ",
                $sum,
                ", [{o}]\n",
                "vpaddd ",
                $acc,
                ", ",
                $acc,
                ", ",
                $sum,
                "\n"
            )
        };
    }
    // One octet step of 2 rows x 32 columns: the rows' 8 bytes at {x} (row 0 at 0, row 1 at 8), the
    // panel's 2 x 128 bytes at {w}, the ones of `vpmaddwd` at {o}.
    macro_rules! octj {
        ($wa:literal, $wb:literal, $s0:literal, $s1:literal) => {
            concat!(
                load_weights!($wa, "ymm12"),
                load_weights!($wb, "ymm13"),
                "vpmaddubsw ymm14, ymm12, ymm8\n",
                "vpmaddubsw ymm15, ymm13, ymm9\n",
                "vpaddw ymm14, ymm14, ymm15\n",
                widen_into!("ymm14", $s0),
                "vpmaddubsw ymm14, ymm12, ymm10\n",
                "vpmaddubsw ymm15, ymm13, ymm11\n",
                "vpaddw ymm14, ymm14, ymm15\n",
                widen_into!("ymm14", $s1),
            )
        };
    }
    #[target_feature(enable = "avx2")]
    unsafe fn octets(n: usize, x: *const u8, w: *const u8, o: *const i16) {
        asm!("2:",
          "vpbroadcastd ymm8, [{x}]", "vpbroadcastd ymm9, [{x}+4]", "vpbroadcastd ymm10, [{x}+8]", "vpbroadcastd ymm11, [{x}+12]",
          octj!("0", "128", "ymm0", "ymm4"), octj!("32", "160", "ymm1", "ymm5"), octj!("64", "192", "ymm2", "ymm6"), octj!("96", "224", "ymm3", "ymm7"),
          "dec {n}", "jnz 2b", n = inout(reg) n => _, x = in(reg) x, w = in(reg) w, o = in(reg) o,
          out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
          out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _);
    }
    // One hexadecet column block (8 columns) of 2 rows: 4 `vpmaddubsw` a row summed in int16, then one
    // `vpmaddwd` and `vpaddd`.
    macro_rules! hexj {
        ($w0:literal, $w1:literal, $w2:literal, $w3:literal, $s0:literal, $s1:literal) => {
            concat!(
                load_weights!($w0, "ymm12"),
                "vpmaddubsw ymm14, ymm12, ymm8\n",
                "vpmaddubsw ymm15, ymm12, ymm10\n",
                load_weights!($w1, "ymm12"),
                "vpmaddubsw ymm13, ymm12, ymm9\n",
                "vpaddw ymm14, ymm14, ymm13\n",
                "vpmaddubsw ymm13, ymm12, ymm11\n",
                "vpaddw ymm15, ymm15, ymm13\n",
                load_weights!($w2, "ymm12"),
                "vpmaddubsw ymm13, ymm12, ymm8\n",
                "vpaddw ymm14, ymm14, ymm13\n",
                "vpmaddubsw ymm13, ymm12, ymm10\n",
                "vpaddw ymm15, ymm15, ymm13\n",
                load_weights!($w3, "ymm12"),
                "vpmaddubsw ymm13, ymm12, ymm9\n",
                "vpaddw ymm14, ymm14, ymm13\n",
                "vpmaddubsw ymm13, ymm12, ymm11\n",
                "vpaddw ymm15, ymm15, ymm13\n",
                widen_into!("ymm14", $s0),
                widen_into!("ymm15", $s1),
            )
        };
    }
    #[target_feature(enable = "avx2")]
    unsafe fn hexa(n: usize, x: *const u8, w: *const u8, o: *const i16) {
        // 2 rows x 32 columns x 16 k; the broadcasts of k 0..8 stand in for those of k 8..16 too
        // (the kernel reloads them; the values do not matter for timing).
        asm!("2:",
          "vpbroadcastd ymm8, [{x}]", "vpbroadcastd ymm9, [{x}+4]", "vpbroadcastd ymm10, [{x}+8]", "vpbroadcastd ymm11, [{x}+12]",
          hexj!("0", "128", "256", "384", "ymm0", "ymm4"), hexj!("32", "160", "288", "416", "ymm1", "ymm5"), hexj!("64", "192", "320", "448", "ymm2", "ymm6"), hexj!("96", "224", "352", "480", "ymm3", "ymm7"),
          "dec {n}", "jnz 2b", n = inout(reg) n => _, x = in(reg) x, w = in(reg) w, o = in(reg) o,
          out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
          out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _);
    }

    // One hexadecet column block (8 columns) of a single row: 4 `vpmaddubsw` summed in int16.
    macro_rules! hex1j {
        ($w0:literal, $w1:literal, $w2:literal, $w3:literal, $s0:literal) => {
            concat!(
                load_weights!($w0, "ymm12"),
                "vpmaddubsw ymm14, ymm12, ymm8\n",
                load_weights!($w1, "ymm12"),
                "vpmaddubsw ymm13, ymm12, ymm9\n",
                "vpaddw ymm14, ymm14, ymm13\n",
                load_weights!($w2, "ymm12"),
                "vpmaddubsw ymm13, ymm12, ymm10\n",
                "vpaddw ymm14, ymm14, ymm13\n",
                load_weights!($w3, "ymm12"),
                "vpmaddubsw ymm13, ymm12, ymm11\n",
                "vpaddw ymm14, ymm14, ymm13\n",
                widen_into!("ymm14", $s0),
            )
        };
    }
    #[target_feature(enable = "avx2")]
    unsafe fn hexa_one_row(n: usize, x: *const u8, w: *const u8, o: *const i16) {
        asm!("2:",
          "vpbroadcastd ymm8, [{x}]", "vpbroadcastd ymm9, [{x}+4]", "vpbroadcastd ymm10, [{x}+8]", "vpbroadcastd ymm11, [{x}+12]",
          hex1j!("0", "128", "256", "384", "ymm0"), hex1j!("32", "160", "288", "416", "ymm1"), hex1j!("64", "192", "320", "448", "ymm2"), hex1j!("96", "224", "352", "480", "ymm3"),
          "dec {n}", "jnz 2b", n = inout(reg) n => _, x = in(reg) x, w = in(reg) w, o = in(reg) o,
          out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
          out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _);
    }

    fn time<F: FnMut()>(mut f: F) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            f();
            best = best.min(t.elapsed().as_secs_f64());
        }
        best
    }

    pub fn run() {
        if !is_x86_feature_detected!("avx2") {
            eprintln!("this CPU has no AVX2");
            return;
        }
        let n = 2_000_000usize;
        // SAFETY (the asm loops below): AVX2 is checked above; they read only `x` (16 bytes),
        // `w` (512 bytes) and `o`, all inside these buffers.
        let x = [1u8; 64];
        let w = [3u8; 1024];
        let o = [1i16; 16];
        let clk = time(|| {
            std::hint::black_box(add_chain(n));
        }) / (4.0 * n as f64); // s per cycle
        println!("clock ~ {:.2} GHz", 1e-9 / clk);
        let c = |t: f64| t / clk / n as f64;
        let a = time(|| unsafe { maddubs8(n) });
        println!("8 maddubs: {:.2} cycles", c(a));
        let b = time(|| unsafe { maddubs8_add8(n) });
        println!("8 maddubs + 8 paddw: {:.2} cycles", c(b));
        let d = time(|| unsafe { octets(n, x.as_ptr(), w.as_ptr(), o.as_ptr()) });
        println!(
            "octet step (2 rows x 32 x 8k = 512 MACs): {:.2} cycles = {:.1} MACs/cycle",
            c(d),
            512.0 / c(d)
        );
        let e = time(|| unsafe { hexa(n, x.as_ptr(), w.as_ptr(), o.as_ptr()) });
        println!(
            "hexadecet step (2 rows x 32 x 16k = 1024 MACs): {:.2} cycles = {:.1} MACs/cycle",
            c(e),
            1024.0 / c(e)
        );
        let f = time(|| unsafe { hexa_one_row(n, x.as_ptr(), w.as_ptr(), o.as_ptr()) });
        println!(
            "hexadecet step of one row (1 row x 32 x 16k = 512 MACs): {:.2} cycles = {:.1} MACs/cycle",
            c(f),
            512.0 / c(f)
        );
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    probe::run();
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("x86_64 only");
}
