//! The probes' clock: a chain of dependent scalar adds runs one a cycle, so timing it
//! counts cycles without hardware counters (shared by `cpu_probe` and `int8_probe`).
use std::arch::asm;

/// `n` turns of 4 dependent adds (4n cycles).
/// Register adds: Intel cores since Golden Cove fold a chain of `add reg, imm` at rename
/// (several a cycle), which had the Xeon with AMX read "clock ~ 15 GHz".
pub fn add_chain(n: usize) -> u64 {
    let mut a: u64 = 1;
    // SAFETY: register arithmetic only.
    unsafe { asm!("2:", "add {a}, {one}", "add {a}, {one}", "add {a}, {one}", "add {a}, {one}", "dec {n}", "jnz 2b", a = inout(reg) a, one = in(reg) 1u64, n = inout(reg) n => _) };
    a
}
