//! The int8 product on AMX tiles (Xeon Sapphire Rapids and later): `tdpbsud` multiplies a
//! tile of 16 activation rows x 64 signed bytes by a tile of 16 k-quads x 16 columns of
//! unsigned weight bytes into 16 x 16 int32 sums, 16384 products an instruction.
//!
//! The weights stay as packed for every other kernel: a panel's `[k/4][32][4]` bytes are
//! two B tiles side by side (columns 0-15 and 16-31, rows 128 bytes apart), each byte the
//! stored `w + 128`. So, as in the AVX-VNNI kernel, signed `x` meets unsigned `w + 128`
//! and each row's `128 Σ x` comes off before the epilogue: the same int32 sums, so the
//! same bits, as every other path. The activations are the one thing laid out apart: A
//! tiles want each row's bytes contiguous, so an AMX product quantizes its rows
//! row-major, `AMX_ROWS` (32) to a group (two A tiles), instead of interleaved by 8.
//!
//! A group of up to 32 rows takes a panel in four accumulator tiles (2 A x 2 B tiles,
//! the eight tile registers); up to 16 rows take two. Tile registers are not Rust's: the
//! compiler never allocates them, so each `asm!` block below may leave sums in them for
//! the next.

use super::x86::Prefetcher;
use super::{TileOut, AMX_ROWS as ROWS, K_STEP_AMX as K_STEP, NR};
use std::arch::asm;

/// The tile configuration `ldtilecfg` reads (palette 1): 16 rows of 64 bytes for all
/// eight tiles.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

/// The tiles configured on this thread for the products it runs; dropping it releases
/// them (`tilerelease`), so the thread's saved state shrinks back and the core leaves
/// AMX's power state.
pub(super) struct Tiles(());

impl Tiles {
    /// # Safety
    /// The CPU and OS run AMX for this process (`Isa::Amx` is supported).
    pub(super) unsafe fn configure() -> Tiles {
        let mut config = Config { palette: 1, start_row: 0, reserved: [0; 14], bytes_per_row: [0; 16], rows: [0; 16] };
        for t in 0..8 {
            config.bytes_per_row[t] = K_STEP as u16;
            config.rows[t] = 16;
        }
        // SAFETY: the caller's contract; `config` is a valid 64-byte palette-1 layout.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure` on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The 32 x 32 int32 sums of a tile, as the tiles store them.
#[repr(C, align(64))]
struct Sums([[i32; NR]; ROWS]);

/// The product of one row group (`a`: `AMX_ROWS` rows of `kp` signed bytes, row-major) with
/// one panel, through the tile's epilogue; `row_shifts` holds each row's `128 Σ x`.
///
/// # Safety
/// Tiles are configured on this thread ([`Tiles::configure`]); `kp` is a multiple of
/// `K_STEP_AMX`, `a` holds `AMX_ROWS * kp` bytes and `panel` `kp * NR`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn tile(a: &[u8], row_shifts: &[i32], panel: &[u8], kp: usize, t: &TileOut) {
    debug_assert!(kp.is_multiple_of(K_STEP) && a.len() >= ROWS * kp && panel.len() >= kp * NR && t.rows <= ROWS);
    let (a, w) = (a.as_ptr(), panel.as_ptr());
    let mut sums = Sums([[0; NR]; ROWS]);
    let out = sums.0.as_mut_ptr() as *mut u8;
    // Stride of the weights' k-quads and of the sums' rows, in bytes.
    let (ldw, lds) = (NR * 4, NR * 4);
    // SAFETY (every block): the loads read 16 rows of 64 bytes at the strides given,
    // inside `a` (rows 0..32 of kp bytes) and `panel` (k-quads 0..kp/4 of 128 bytes); the
    // stores write inside `sums`.
    // The lone row group of a small product fetches its next panel (see `run_panels`).
    let mut pf = Prefetcher::new(t.prefetch, kp / K_STEP);
    if t.rows > 16 {
        unsafe { asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)) };
        for s in 0..kp / K_STEP {
            unsafe { pf.step() };
            unsafe {
                asm!(
                    "tileloadd tmm4, [{a0} + {lda}*1]",
                    "tileloadd tmm5, [{a1} + {lda}*1]",
                    "tileloadd tmm6, [{w} + {ldw}*1]",
                    "tileloadd tmm7, [{w} + {ldw}*1 + 64]",
                    "tdpbsud tmm0, tmm4, tmm6",
                    "tdpbsud tmm1, tmm4, tmm7",
                    "tdpbsud tmm2, tmm5, tmm6",
                    "tdpbsud tmm3, tmm5, tmm7",
                    a0 = in(reg) a.add(s * K_STEP),
                    a1 = in(reg) a.add(16 * kp + s * K_STEP),
                    w = in(reg) w.add(s * 16 * ldw),
                    lda = in(reg) kp,
                    ldw = in(reg) ldw,
                    options(nostack, readonly),
                )
            };
        }
        unsafe {
            asm!(
                "tilestored [{o0} + {lds}*1], tmm0",
                "tilestored [{o0} + {lds}*1 + 64], tmm1",
                "tilestored [{o1} + {lds}*1], tmm2",
                "tilestored [{o1} + {lds}*1 + 64], tmm3",
                o0 = in(reg) out,
                o1 = in(reg) out.add(16 * lds),
                lds = in(reg) lds,
                options(nostack),
            )
        };
    } else {
        unsafe { asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem)) };
        for s in 0..kp / K_STEP {
            unsafe { pf.step() };
            unsafe {
                asm!(
                    "tileloadd tmm4, [{a0} + {lda}*1]",
                    "tileloadd tmm6, [{w} + {ldw}*1]",
                    "tileloadd tmm7, [{w} + {ldw}*1 + 64]",
                    "tdpbsud tmm0, tmm4, tmm6",
                    "tdpbsud tmm1, tmm4, tmm7",
                    a0 = in(reg) a.add(s * K_STEP),
                    w = in(reg) w.add(s * 16 * ldw),
                    lda = in(reg) kp,
                    ldw = in(reg) ldw,
                    options(nostack, readonly),
                )
            };
        }
        unsafe {
            asm!(
                "tilestored [{o0} + {lds}*1], tmm0",
                "tilestored [{o0} + {lds}*1 + 64], tmm1",
                o0 = in(reg) out,
                lds = in(reg) lds,
                options(nostack),
            )
        };
    }
    for (r, &shift) in row_shifts[..t.rows].iter().enumerate() {
        let mut acc = sums.0[r];
        for v in acc.iter_mut() {
            *v = v.wrapping_sub(shift);
        }
        t.store(r, &acc);
    }
}
