//! The intra-op threads of one worker: the worker's own thread plus `threads - 1` helpers
//! that run the parts of one operation at a time (`run_parts`, behind `split_panels` and
//! `split_rows`).
//!
//! Why not a general pool: a decoder step alternates parallel products (a few hundred
//! microseconds each) with serial work in between (norms, quantization, beam bookkeeping),
//! and a pool whose idle threads go to sleep after a few rounds pays a wake-up for almost
//! every product. Measured with rayon's pool (Zen 4 VM, int8 greedy zh-en, 2 threads,
//! 2026-11-29): a product's parts ended on average 56k cycles (21 us) after its longest part
//! did, 7% of the run. Here a helper keeps looking for the next part for `SPIN` before it
//! parks, so that decoding keeps it awake and an idle translator costs nothing.
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper looks for the next part before it parks: longer than the serial work
/// between two products of a decoder step (about 150 us on zh-en at 2 threads), short
/// enough that a translator with nothing to do gives its cores back at once.
const SPIN: Duration = Duration::from_millis(2);

/// The parts of the current operation, their lifetime erased (see `run_parts`).
type Parts = *const (dyn Fn(usize) + Sync + 'static);

struct Shared {
    /// `epoch << 8 | parts` of the latest operation: helper `i` runs part `i` when `i <
    /// parts`. Stored (Release) after `parts`.
    state: AtomicU64,
    /// The latest operation's parts; valid while its helpers run (`pending > 0`).
    parts: UnsafeCell<Option<Parts>>,
    /// Helpers still running a part of the latest operation.
    pending: AtomicUsize,
    /// A helper's part panicked (the caller then panics too).
    panicked: AtomicBool,
    /// Helpers started.
    helpers: AtomicUsize,
    /// Helpers parked on `wake`.
    parked: Mutex<usize>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// A thread is running an operation on this team (another one then runs alone).
    busy: AtomicBool,
}

// SAFETY: `parts` is written only by the thread holding `busy`, before the Release store of
// `state`; a helper reads it after the Acquire load that saw that state and uses it until
// it decrements `pending`, which the writer waits for before it returns. The parts are
// `Sync`, so calling them from any thread is sound.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The team `Team::install` made current on this thread (null: none).
    static CURRENT: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    /// This thread runs a part: an operation inside it runs all its parts here.
    static IN_PART: Cell<bool> = const { Cell::new(false) };
}

/// A worker's intra-op threads; dropping it stops and joins the helpers.
pub struct Team {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl Team {
    /// A team of `threads` in all: the thread calling `install` and `threads - 1` helpers
    /// (at most 254).
    pub fn new(threads: usize) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            parts: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            helpers: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        });
        let mut team = Team { shared, handles: Vec::new() };
        for index in 1..threads.clamp(1, 255) {
            let shared = Arc::clone(&team.shared);
            let handle = std::thread::Builder::new().name("tolk-intra".into()).spawn(move || helper(&shared, index))?;
            team.handles.push(handle); // (On an error, dropping `team` joins those started.)
            team.shared.helpers.store(index, Ordering::SeqCst);
        }
        Ok(team)
    }

    /// Runs `f` with this team serving `run_parts` on this thread.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::scoped::with_local(&CURRENT, Arc::as_ptr(&self.shared), f)
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Under the lock: a helper about to park sees `shutdown` or gets the notification.
        drop(lock(&self.shared.parked));
        self.shared.wake.notify_all();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// The team current on this thread, unless there is none or this thread runs a part.
fn current() -> Option<&'static Shared> {
    let shared = CURRENT.with(Cell::get);
    if shared.is_null() || IN_PART.with(Cell::get) {
        return None;
    }
    // SAFETY: the team outlives its `install` call, which is running on this thread
    // (`Restore` clears the pointer when it returns); the reference does not leave
    // `run_parts` and `available`.
    Some(unsafe { &*shared })
}

/// How many parts `run_parts` can run at once on this thread: the current team's threads,
/// else 1.
pub fn available() -> usize {
    current().map_or(1, |s| 1 + s.helpers.load(Ordering::SeqCst))
}

/// Runs `part(i)` for every `i < count`: part 0 on this thread, the others on the current
/// team's helpers (at most `available()` parts; more, or no team: all here, in order).
/// Returns when all have; a panic in any part panics here.
pub fn run_parts(count: usize, part: &(dyn Fn(usize) + Sync)) {
    let team = match current() {
        Some(team) if count > 1 && count <= available() => team,
        _ => return (0..count).for_each(part),
    };
    if team.busy.swap(true, Ordering::Acquire) {
        // Another thread runs an operation on this team.
        return (0..count).for_each(part);
    }
    struct Release<'a>(&'a Shared);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0.busy.store(false, Ordering::Release);
        }
    }
    let _release = Release(team);
    // SAFETY: the helpers use `erased` only until they decrement `pending`, and this
    // function waits for that (below) before `part` can go out of scope.
    let erased: Parts = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Parts>(part) };
    unsafe { *team.parts.get() = Some(erased) };
    team.pending.store(count - 1, Ordering::Relaxed);
    let epoch = (team.state.load(Ordering::Relaxed) >> 8) + 1;
    team.state.store(epoch << 8 | count as u64, Ordering::Release);
    if *lock(&team.parked) > 0 {
        team.wake.notify_all();
    }
    let own = catch_unwind(AssertUnwindSafe(|| in_part(|| part(0))));
    let mut waited = Waiter::new();
    while team.pending.load(Ordering::Acquire) > 0 {
        waited.pause();
    }
    unsafe { *team.parts.get() = None };
    if let Err(panic) = own {
        resume_unwind(panic);
    }
    if team.panicked.swap(false, Ordering::SeqCst) {
        panic!("a thread of a parallel operation panicked");
    }
}

fn in_part<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_PART.with(|c| c.set(false));
        }
    }
    IN_PART.with(|c| c.set(true));
    let _leave = Leave;
    f()
}

/// Busy waiting that gives the core away now and then (on a machine with fewer free cores
/// than threads, the thread waited for may need this one's).
struct Waiter {
    rounds: u32,
}

impl Waiter {
    fn new() -> Waiter {
        Waiter { rounds: 0 }
    }

    fn pause(&mut self) {
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Helper `index`: runs its part of each operation, looking for the next one for `SPIN`,
/// then parked until woken.
fn helper(shared: &Shared, index: usize) {
    // Epochs start at 1: a helper started after the first operation still runs its part.
    let mut seen = 0;
    loop {
        let Some(state) = next_operation(shared, seen) else { return };
        seen = state >> 8;
        if index < (state & 0xff) as usize {
            // SAFETY: see `Shared`: the operation's caller waits for `pending`.
            let parts = unsafe { (*shared.parts.get()).expect("an operation's parts are set before its state") };
            let ran = catch_unwind(AssertUnwindSafe(|| in_part(|| unsafe { (*parts)(index) })));
            if ran.is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
            shared.pending.fetch_sub(1, Ordering::Release);
        }
    }
}

/// The state of the first operation after epoch `seen`, or `None` once the team stops.
fn next_operation(shared: &Shared, seen: u64) -> Option<u64> {
    let changed = || {
        let state = shared.state.load(Ordering::Acquire);
        (state >> 8 != seen).then_some(state)
    };
    let start = Instant::now();
    let mut waiter = Waiter::new();
    loop {
        if let Some(state) = changed() {
            return Some(state);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return None;
        }
        if waiter.rounds % 256 == 255 && start.elapsed() > SPIN {
            break;
        }
        waiter.pause();
    }
    let mut parked = lock(&shared.parked);
    *parked += 1;
    loop {
        // Checked under the lock, which `run_parts` takes after storing the state.
        if let Some(state) = changed() {
            *parked -= 1;
            return Some(state);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            *parked -= 1;
            return None;
        }
        parked = shared.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_part_runs_once_on_its_own_thread() {
        let team = Team::new(3).unwrap();
        team.install(|| {
            assert_eq!(available(), 3);
            for round in 0..2000 {
                let hits: Vec<AtomicU32> = (0..3).map(|_| AtomicU32::new(0)).collect();
                let threads = Mutex::new(Vec::new());
                run_parts(3, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    lock(&threads).push(std::thread::current().id());
                    // Nested operations run on the thread of the part.
                    assert_eq!(available(), 1);
                    run_parts(2, &|_| assert_eq!(available(), 1));
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "round {round}");
                let mut threads = threads.into_inner().unwrap();
                threads.sort_by_key(|t| format!("{t:?}"));
                threads.dedup();
                assert_eq!(threads.len(), 3, "round {round}");
                if round % 500 == 0 {
                    // Long enough for the helpers to park: they must wake up.
                    std::thread::sleep(SPIN * 3);
                }
            }
        });
        // Outside `install`, and with more parts than threads, everything runs here.
        assert_eq!(available(), 1);
        let here = std::thread::current().id();
        team.install(|| run_parts(5, &|_| assert_eq!(std::thread::current().id(), here)));
    }

    #[test]
    fn a_panic_in_a_helper_reaches_the_caller_and_the_team_still_works() {
        let team = Team::new(2).unwrap();
        let caught = team.install(|| std::panic::catch_unwind(|| run_parts(2, &|i| assert!(i == 0, "part {i} fails"))));
        assert!(caught.is_err());
        let sum = AtomicU32::new(0);
        team.install(|| run_parts(2, &|i| {
            sum.fetch_add(i as u32 + 1, Ordering::Relaxed);
        }));
        assert_eq!(sum.load(Ordering::Relaxed), 3);
    }
}
