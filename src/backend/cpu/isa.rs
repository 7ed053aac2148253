//! Run-time choice of the instruction set for the CPU kernels: detected with CPUID, or
//! forced lower with `TOLK_CPU_ISA=scalar|avx2|avxvnni|avx512bw|avx512vnni|amx` so every
//! path can be tested on one machine.
//!
//! The levels differ in what they bring: float32 kernels use AVX2+FMA or AVX-512F; int8
//! kernels use `vpmaddubsw` (AVX2, AVX-512BW), the VNNI dot product `vpdpbusd` (256-bit
//! AVX-VNNI, 512-bit AVX-512 VNNI) or AMX's tile products (Sapphire Rapids and later
//! Xeons), which Linux lends a process only once it asks (`arch_prctl`).
use std::cell::Cell;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust: the reference every other path is tested against.
    Scalar,
    /// AVX2 + FMA.
    Avx2,
    /// AVX2 + FMA + AVX-VNNI (256-bit `vpdpbusd`, e.g. Alder Lake, Zen 5).
    AvxVnni,
    /// AVX-512 F/BW/VL without VNNI (Skylake-X).
    Avx512Bw,
    /// AVX-512 F/BW/VL + AVX-512 VNNI (Ice Lake and later, Zen 4/5).
    Avx512Vnni,
    /// AVX-512 VNNI + AMX-TILE/AMX-INT8 (Xeon Sapphire Rapids and later): int8 products on
    /// AMX tiles, everything else as [`Isa::Avx512Vnni`].
    Amx,
}

/// The width of the float32 kernels an [`Isa`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatLevel {
    Scalar,
    Avx2,
    Avx512,
}

pub const ALL: [Isa; 6] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Bw, Isa::Avx512Vnni, Isa::Amx];

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Bw => "avx512bw",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
        }
    }

    pub fn parse(name: &str) -> Option<Isa> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "scalar" | "generic" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avxvnni" | "avx-vnni" | "avx_vnni" => Isa::AvxVnni,
            "avx512" | "avx512f" | "avx512bw" => Isa::Avx512Bw,
            "avx512vnni" | "avx512_vnni" => Isa::Avx512Vnni,
            "amx" | "amx_int8" | "amx-int8" => Isa::Amx,
            _ => return None,
        })
    }

    pub fn float_level(self) -> FloatLevel {
        match self {
            Isa::Scalar => FloatLevel::Scalar,
            Isa::Avx2 | Isa::AvxVnni => FloatLevel::Avx2,
            Isa::Avx512Bw | Isa::Avx512Vnni | Isa::Amx => FloatLevel::Avx512,
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = || is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            let avx512 = || {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && avx2()
            };
            match self {
                Isa::Scalar => true,
                Isa::Avx2 => avx2(),
                Isa::AvxVnni => avx2() && is_x86_feature_detected!("avxvnni"),
                Isa::Avx512Bw => avx512(),
                Isa::Avx512Vnni => avx512() && is_x86_feature_detected!("avx512vnni"),
                Isa::Amx => avx512() && is_x86_feature_detected!("avx512vnni") && amx_granted(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }
}

/// Whether this CPU has AMX-TILE and AMX-INT8, the OS saves their state (XCR0 bits 17 and
/// 18) and Linux granted this process the tile data (`ARCH_REQ_XCOMP_PERM`, asked once).
/// The grant is for the whole process; Linux refuses it (and Tolk then stays at AVX-512
/// VNNI) where a thread's signal stack is too small for the larger signal frame, or where
/// a seccomp filter forbids the call. Elsewhere than Linux: never.
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        use std::arch::x86_64::__cpuid_count;
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86_64 CPU; leaf 0 says whether leaf 7 does.
        let (highest, leaf7) = unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(7, 0)) };
        let (amx_tile, amx_int8) = (1 << 24, 1 << 25);
        if highest < 7 || leaf7.edx & (amx_tile | amx_int8) != amx_tile | amx_int8 || !is_x86_feature_detected!("xsave") {
            return false;
        }
        #[target_feature(enable = "xsave")]
        unsafe fn xcr0() -> u64 {
            std::arch::x86_64::_xgetbv(0)
        }
        // SAFETY: XSAVE (checked above) makes XGETBV available; OSXSAVE is implied by the
        // AVX-512 detection the caller did first.
        let tile_state = (1 << 17) | (1 << 18);
        if unsafe { xcr0() } & tile_state != tile_state {
            return false;
        }
        request_tile_data()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with two integer arguments; it changes only which
    // register state this process may use.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

/// The best ISA this CPU supports.
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(|| ALL.into_iter().rev().find(|i| i.is_supported()).unwrap_or(Isa::Scalar))
}

/// Every ISA usable here, lowest first (what the kernel tests iterate over).
pub fn available() -> Vec<Isa> {
    ALL.into_iter().filter(|i| i.is_supported()).collect()
}

static SELECTED: OnceLock<Isa> = OnceLock::new();

thread_local! {
    static OVERRIDE: Cell<Option<Isa>> = const { Cell::new(None) };
}

/// The ISA kernels use: a test override, else `TOLK_CPU_ISA` (the highest supported
/// level not above the one asked for), else the detected one.
pub fn current() -> Isa {
    if let Some(isa) = OVERRIDE.with(Cell::get) {
        return isa;
    }
    *SELECTED.get_or_init(|| match std::env::var("TOLK_CPU_ISA").ok().as_deref().and_then(Isa::parse) {
        Some(forced) => ALL.into_iter().rev().find(|i| *i <= forced && i.is_supported()).unwrap_or(Isa::Scalar),
        None => detected(),
    })
}

/// The level [`with_isa`] forces on this thread, if any.
pub fn forced_here() -> Option<Isa> {
    OVERRIDE.with(Cell::get)
}

/// Runs `f` at the level `forced` that [`forced_here`] gave on another thread (work handed
/// over to a worker), or unforced.
pub fn with_forced<R>(forced: Option<Isa>, f: impl FnOnce() -> R) -> R {
    match forced {
        Some(isa) => with_isa(isa, f),
        None => f(),
    }
}

/// Runs `f` with kernels forced to `isa` on this thread (for tests and benchmarks), and
/// on the translator workers that run the translations it submits.
pub fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    assert!(isa.is_supported(), "{isa:?} is not supported by this CPU");
    // The previous level comes back also when `f` unwinds (a worker thread lives on).
    crate::scoped::with_local(&OVERRIDE, Some(isa), f)
}

/// Compiles `$generic` a second and third time with AVX-512 and AVX2 enabled (so the
/// compiler vectorizes it for them) and calls the version `isa::current()` selects.
macro_rules! dispatch_isa {
    ($generic:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {{
        #[cfg(target_arch = "x86_64")]
        {
            use $crate::backend::cpu::isa::{self, FloatLevel};
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
            unsafe fn avx512($($arg: $ty),*) -> $ret {
                $generic($($arg),*)
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) -> $ret {
                $generic($($arg),*)
            }
            match isa::current().float_level() {
                // SAFETY: isa::current() never reports more than the CPU supports.
                FloatLevel::Avx512 => return unsafe { avx512($($arg),*) },
                FloatLevel::Avx2 => return unsafe { avx2($($arg),*) },
                FloatLevel::Scalar => {}
            }
        }
        $generic($($arg),*)
    }};
}
pub(crate) use dispatch_isa;

/// This core's L2 cache in bytes, from CPUID leaf 0x8000_0006 (AMD and Intel both report
/// it there), or `None` where the CPU does not say.
pub fn l2_bytes() -> Option<usize> {
    static L2: OnceLock<Option<usize>> = OnceLock::new();
    *L2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            // SAFETY: CPUID exists on every x86_64 CPU; leaf 0x8000_0000 says which extended
            // leaves do. (`__cpuid` is safe from Rust 1.94 on, unsafe before.)
            #[allow(unused_unsafe)]
            let highest = unsafe { __cpuid(0x8000_0000) }.eax;
            if highest >= 0x8000_0006 {
                #[allow(unused_unsafe)]
                let kib = (unsafe { __cpuid(0x8000_0006) }.ecx >> 16) as usize;
                return (kib > 0).then_some(kib * 1024);
            }
        }
        None
    })
}

/// This core's L1 data cache in bytes, from CPUID leaf 4 (Intel's deterministic cache
/// parameters) or else leaf 0x8000_0005 (AMD's, in KiB; Intel's cores leave it zero), or
/// `None` where the CPU says neither.
pub fn l1d_bytes() -> Option<usize> {
    static L1D: OnceLock<Option<usize>> = OnceLock::new();
    *L1D.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            // SAFETY: CPUID exists on every x86_64 CPU; leaf 0 says whether leaf 4 does.
            // (`__cpuid` is safe from Rust 1.94 on, unsafe before.)
            #[allow(unused_unsafe)]
            let highest = unsafe { __cpuid(0) }.eax;
            for sub in (0..8).take_while(|_| highest >= 4) {
                #[allow(unused_unsafe)]
                let r = unsafe { __cpuid_count(4, sub) };
                let (kind, level) = (r.eax & 0x1f, (r.eax >> 5) & 7);
                if kind == 0 {
                    break;
                }
                if kind == 1 && level == 1 {
                    let ways = (r.ebx >> 22) as usize + 1;
                    let partitions = ((r.ebx >> 12) & 0x3ff) as usize + 1;
                    let line = (r.ebx & 0xfff) as usize + 1;
                    return Some(ways * partitions * line * (r.ecx as usize + 1));
                }
            }
            #[allow(unused_unsafe)]
            if unsafe { __cpuid(0x8000_0000) }.eax >= 0x8000_0005 {
                #[allow(unused_unsafe)]
                let kib = (unsafe { __cpuid(0x8000_0005) }.ecx >> 24) as usize;
                return (kib > 0).then_some(kib * 1024);
            }
        }
        None
    })
}

/// Whether CPUID leaf 0 names the vendor "GenuineIntel" (for the few choices measured to
/// go one way on Intel's cores and the other on AMD's).
pub fn is_intel() -> bool {
    static INTEL: OnceLock<bool> = OnceLock::new();
    *INTEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            // SAFETY: CPUID leaf 0 exists on every x86_64 CPU. (`__cpuid` is safe from
            // Rust 1.94 on, unsafe before.)
            #[allow(unused_unsafe)]
            let leaf0 = unsafe { __cpuid(0) };
            // The vendor string is EBX, EDX, ECX: "Genu" "ineI" "ntel".
            return (leaf0.ebx, leaf0.edx, leaf0.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e);
        }
        #[allow(unreachable_code)]
        false
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vendor_agrees_with_proc_cpuinfo() {
        let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else { return };
        let Some(vendor) = cpuinfo.lines().find_map(|l| l.strip_prefix("vendor_id")) else { return };
        let vendor = vendor.trim_start_matches([' ', '\t', ':']).trim();
        assert_eq!(super::is_intel(), vendor == "GenuineIntel", "vendor_id {vendor:?}");
    }

    #[test]
    fn the_l2_size_is_absent_or_plausible() {
        if let Some(l2) = super::l2_bytes() {
            assert!((64 << 10..=64 << 20).contains(&l2), "L2 of {l2} bytes");
        }
    }

    #[test]
    fn the_l1d_size_is_absent_or_plausible() {
        if let Some(l1d) = super::l1d_bytes() {
            assert!((8 << 10..=1 << 20).contains(&l1d) && l1d % 1024 == 0, "L1d of {l1d} bytes");
        }
        if super::is_intel() {
            assert!(super::l1d_bytes().is_some(), "Intel's cores describe their L1d in CPUID leaf 4");
        }
    }
}
