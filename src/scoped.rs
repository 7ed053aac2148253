//! A thread-local setting held for the length of one call.
use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` with `key` set to `value` on this thread and puts the previous value back
/// afterwards, also when `f` unwinds (the thread may live on: a worker, a team's helper).
pub(crate) fn with_local<T: Copy + 'static, R>(key: &'static LocalKey<Cell<T>>, value: T, f: impl FnOnce() -> R) -> R {
    struct Restore<T: Copy + 'static>(&'static LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(key, key.with(|c| c.replace(value)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static SETTING: Cell<u32> = const { Cell::new(1) };
    }

    #[test]
    fn the_value_holds_for_the_call_and_the_previous_one_returns_after_it_or_its_panic() {
        assert_eq!(with_local(&SETTING, 2, || with_local(&SETTING, 3, || SETTING.get()) + SETTING.get()), 5);
        assert_eq!(SETTING.get(), 1);
        assert!(std::panic::catch_unwind(|| with_local(&SETTING, 4, || panic!("inside"))).is_err());
        assert_eq!(SETTING.get(), 1);
    }
}
