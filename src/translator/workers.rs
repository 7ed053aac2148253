//! The threads of one translator: `inter_threads` workers taking batches from one queue,
//! each with its own pool of `intra_threads` for the matrix products. The model is shared
//! by reference; a worker holds only its decoding state.
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::backend::cpu::team::Team;
use crate::backend::Ctx;
use crate::error::{Error, Result};

/// A unit of work: one batch of one request.
pub(crate) trait Task: Send {
    /// Runs on a worker.
    fn run(self: Box<Self>, worker: &Worker);
    /// The translator shut down before the task ran.
    fn abandon(self: Box<Self>);
}

/// What a task sees of the worker running it.
pub(crate) struct Worker {
    pub ctx: Ctx,
    /// The translator is being freed: running tasks stop at their next step.
    pub shutting_down: Arc<AtomicBool>,
    /// The threads of its matrix products and attention beside its own (`intra_threads`).
    team: Option<Team>,
}

impl Worker {
    /// Runs `f` with this worker's threads available to the matrix products.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.team {
            Some(team) => team.install(f),
            None => f(),
        }
    }
}

struct Queue {
    tasks: VecDeque<Box<dyn Task>>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    available: Condvar,
}

thread_local! {
    /// On a worker thread, its translator's [`Workers::id`]; 0 elsewhere.
    static POOL: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is one of the workers of the pool `id` (a callback runs there).
pub(crate) fn on_worker_of(id: usize) -> bool {
    POOL.with(|p| p.get()) == id
}

/// Runs `f` with this thread counted among the workers of pool `id` ([`on_worker_of`]):
/// the callbacks of abandoned tasks run on the thread that abandons them, and a wait there
/// for another task abandoned after them would wait for that very thread.
fn as_worker_of<R>(id: usize, f: impl FnOnce() -> R) -> R {
    crate::scoped::with_local(&POOL, id, f)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic is caught around every task, so a poisoned lock holds consistent data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The workers of one translator. Dropping it abandons the queued tasks, stops the running
/// ones at their next step and joins every thread: a library that may be unloaded
/// (dlclose) must not leave threads running its code.
pub(crate) struct Workers {
    shared: Arc<Shared>,
    shutting_down: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    count: usize,
}

impl Workers {
    pub fn new(inter_threads: usize, intra_threads: usize) -> Result<Workers> {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue { tasks: VecDeque::new(), closed: false }), available: Condvar::new() });
        let shutting_down = Arc::new(AtomicBool::new(false));
        let mut workers =
            Workers { shared: Arc::clone(&shared), shutting_down: Arc::clone(&shutting_down), threads: Vec::new(), count: inter_threads };
        for i in 0..inter_threads {
            let team = match intra_threads {
                0 | 1 => None,
                n => Some(Team::new(n).map_err(|e| Error::invalid_argument(format!("cannot start {n} threads: {e}")))?),
            };
            let worker = Worker { ctx: Ctx { threads: intra_threads }, shutting_down: Arc::clone(&shutting_down), team };
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("tolk-worker-{i}"))
                .spawn(move || work(&shared, &worker))
                .map_err(|e| Error::invalid_argument(format!("cannot start {inter_threads} worker threads: {e}")))?;
            workers.threads.push(handle); // (On an error, dropping `workers` joins those started.)
        }
        Ok(workers)
    }

    /// What identifies this pool's workers to [`on_worker_of`] (never 0).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Number of workers (batches translated at once).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Queues tasks to run in order of submission (FIFO over all requests).
    pub fn submit(&self, tasks: impl IntoIterator<Item = Box<dyn Task>>) {
        let mut queue = lock(&self.shared.queue);
        if queue.closed {
            drop(queue);
            as_worker_of(self.id(), || tasks.into_iter().for_each(Task::abandon));
            return;
        }
        queue.tasks.extend(tasks);
        drop(queue);
        self.shared.available.notify_all();
    }
}

fn work(shared: &Shared, worker: &Worker) {
    POOL.with(|p| p.set(shared as *const Shared as usize));
    loop {
        let task = {
            let mut queue = lock(&shared.queue);
            loop {
                if let Some(task) = queue.tasks.pop_front() {
                    break task;
                }
                if queue.closed {
                    return;
                }
                queue = shared.available.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        // A task reports its own failures; this only keeps a bug from killing the worker.
        let _ = catch_unwind(AssertUnwindSafe(|| task.run(worker)));
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let abandoned: Vec<Box<dyn Task>> = {
            let mut queue = lock(&self.shared.queue);
            queue.closed = true;
            queue.tasks.drain(..).collect()
        };
        self.shared.available.notify_all();
        as_worker_of(self.id(), || abandoned.into_iter().for_each(Task::abandon));
        let me = std::thread::current().id();
        for handle in self.threads.drain(..) {
            // A completion callback may free the translator on a worker, which cannot join
            // itself; it exits as soon as its task returns (the queue is closed).
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}
