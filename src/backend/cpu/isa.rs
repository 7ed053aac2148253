//! Run-time choice of the instruction set for the CPU kernels: detected with CPUID, or
//! forced lower with `TOLK_CPU_ISA=scalar|avx2|avx512` so every path can be tested on
//! one machine.
use std::cell::Cell;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512F.
    Avx512,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    fn parse(name: &str) -> Option<Isa> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "scalar" | "generic" => Isa::Scalar,
            "avx2" | "avxvnni" => Isa::Avx2,
            "avx512" | "avx512f" | "avx512bw" | "avx512vnni" => Isa::Avx512,
            _ => return None,
        })
    }
}

/// The best ISA this CPU supports.
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// Every ISA usable here, lowest first (what the kernel tests iterate over).
pub fn available() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= detected()).collect()
}

static SELECTED: OnceLock<Isa> = OnceLock::new();

thread_local! {
    static OVERRIDE: Cell<Option<Isa>> = const { Cell::new(None) };
}

/// The ISA kernels use: a test override, else `TOLK_CPU_ISA` (never above what the CPU
/// supports), else the detected one.
pub fn current() -> Isa {
    if let Some(isa) = OVERRIDE.with(Cell::get) {
        return isa;
    }
    *SELECTED.get_or_init(|| {
        let best = detected();
        match std::env::var("TOLK_CPU_ISA").ok().as_deref().and_then(Isa::parse) {
            Some(forced) => forced.min(best),
            None => best,
        }
    })
}

/// Runs `f` with kernels forced to `isa` on this thread (for tests and benchmarks).
pub fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    assert!(isa <= detected(), "{isa:?} is not supported by this CPU");
    let previous = OVERRIDE.with(|o| o.replace(Some(isa)));
    let r = f();
    OVERRIDE.with(|o| o.set(previous));
    r
}

/// Compiles `$generic` a second and third time with AVX-512 and AVX2 enabled (so the
/// compiler vectorizes it for them) and calls the version `isa::current()` selects.
macro_rules! dispatch_isa {
    ($generic:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {{
        #[cfg(target_arch = "x86_64")]
        {
            use $crate::backend::cpu::isa::{self, Isa};
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512($($arg: $ty),*) -> $ret {
                $generic($($arg),*)
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) -> $ret {
                $generic($($arg),*)
            }
            match isa::current() {
                // SAFETY: isa::current() never reports more than the CPU supports.
                Isa::Avx512 => return unsafe { avx512($($arg),*) },
                Isa::Avx2 => return unsafe { avx2($($arg),*) },
                Isa::Scalar => {}
            }
        }
        $generic($($arg),*)
    }};
}
pub(crate) use dispatch_isa;
