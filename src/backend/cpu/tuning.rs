//! Choices of the CPU kernels that were measured to go one way on some cores and the
//! other way on others, each with a default per vendor (or none), which the environment
//! (`VAR=1` / `VAR=0`) or, within one process, [`Switch::set`] overrides: to measure a
//! choice on a new core without a rebuild. Every setting computes the same bits; only speed
//! changes. `examples/ab.rs` alternates a switch's settings in one process, which sees
//! through a shared VM's drift where runs in separate processes do not.
use super::isa;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A kernel choice that can be switched (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// The AVX2 int8 kernel takes hexadecets (16-k steps summed in int16) where the plan
    /// allows, not only octets (`int8::plan::hexadecets_pay_off`). Default off.
    Int8Hexadecets,
    /// The int8 products without AMX take a panel at a time across the row groups
    /// whose activations fit L1 (a pass), fetching the weights two panels ahead
    /// (`int8::outer_pass_groups`). Default on Intel's cores.
    Int8PanelsOuter,
    /// A decoder step's keys and values are asked for ahead in a burst
    /// (`attention::kv_view::prefetch_rows`). Default off on Intel's cores.
    AttentionPrefetch,
}

/// 0: no override; 1: on; 2: off. One per switch, process-wide.
static OVERRIDES: [AtomicU8; 3] = [AtomicU8::new(0), AtomicU8::new(0), AtomicU8::new(0)];

#[cfg(test)]
thread_local! {
    /// A test's settings on its own thread ([`Switch::with`]), before the process-wide
    /// ones: tests run side by side in one process.
    static ON_THIS_THREAD: std::cell::Cell<[Option<bool>; 3]> = const { std::cell::Cell::new([None; 3]) };
}

impl Switch {
    pub const ALL: [Switch; 3] = [Switch::Int8Hexadecets, Switch::Int8PanelsOuter, Switch::AttentionPrefetch];

    /// The name `examples/ab.rs` takes, e.g. `int8-panels-outer`.
    pub fn name(self) -> &'static str {
        match self {
            Switch::Int8Hexadecets => "int8-hexadecets",
            Switch::Int8PanelsOuter => "int8-panels-outer",
            Switch::AttentionPrefetch => "attention-prefetch",
        }
    }

    pub fn parse(name: &str) -> Option<Switch> {
        Switch::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The environment variable that sets it for a process.
    pub fn env_var(self) -> &'static str {
        match self {
            Switch::Int8Hexadecets => "TOLK_INT8_HEXADECETS",
            Switch::Int8PanelsOuter => "TOLK_INT8_PANELS_OUTER",
            Switch::AttentionPrefetch => "TOLK_ATTENTION_PREFETCH",
        }
    }

    /// The setting measured best on this CPU (see each choice's doc for the figures).
    fn measured_default(self) -> bool {
        match self {
            Switch::Int8Hexadecets => false,
            Switch::Int8PanelsOuter => isa::is_intel(),
            Switch::AttentionPrefetch => !isa::is_intel(),
        }
    }

    /// Whether the choice is taken: [`Switch::set`]'s override, else the environment's,
    /// else the measured default.
    pub fn is_on(self) -> bool {
        #[cfg(test)]
        if let Some(on) = ON_THIS_THREAD.with(std::cell::Cell::get)[self as usize] {
            return on;
        }
        static FROM_ENV: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        match OVERRIDES[self as usize].load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => *FROM_ENV[self as usize].get_or_init(|| match std::env::var(self.env_var()).as_deref() {
                Ok("1") => true,
                Ok("0") => false,
                _ => self.measured_default(),
            }),
        }
    }

    /// Overrides the choice for the whole process from now on (`None`: back to the
    /// environment's or the default). Products already running finish as they started.
    pub fn set(self, on: Option<bool>) {
        OVERRIDES[self as usize].store(on.map_or(0, |on| if on { 1 } else { 2 }), Ordering::Relaxed);
    }

    /// Runs `f` with the choice set to `on` on this thread only (tests: products decide on
    /// the calling thread).
    #[cfg(test)]
    pub(crate) fn with<R>(self, on: bool, f: impl FnOnce() -> R) -> R {
        let mut settings = ON_THIS_THREAD.with(std::cell::Cell::get);
        settings[self as usize] = Some(on);
        crate::scoped::with_local(&ON_THIS_THREAD, settings, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_set_overrides_until_cleared() {
        for s in Switch::ALL {
            assert_eq!(Switch::parse(s.name()), Some(s));
            assert!(s.env_var().starts_with("TOLK_"));
        }
        assert_eq!(Switch::parse("no-such-switch"), None);
        // Only this test sets the attention switch process-wide (the others' tests set
        // theirs per thread).
        let s = Switch::AttentionPrefetch;
        let before = s.is_on();
        for on in [true, false] {
            s.set(Some(on));
            assert_eq!(s.is_on(), on);
        }
        s.set(None);
        assert_eq!(s.is_on(), before);
    }
}
