//! Requests in flight: a submitted batch of sentences cut into batches that the workers
//! translate, its results kept in input order, and the handle the caller waits on, polls
//! or cancels.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::workers::{Task, Worker};
use super::{translate_examples, TokenCallback, TokenEvent, TranslateOptions, TranslationResult};
use crate::decode::SearchObserver;
use crate::error::{Error, Result};
use crate::model::TranslationModel;

/// Turns the translations of all sentences, in input order, into a job's output.
pub(crate) type Finish<T> = Box<dyn FnOnce(Vec<TranslationResult>) -> Result<T> + Send>;
/// Called once when a job ends, with its error if it failed or was cancelled.
pub type CompletionCallback = Box<dyn FnOnce(Option<&Error>) + Send>;

/// What a submitted request holds: its input, options and results.
pub(crate) struct Request<T> {
    pub model: Arc<dyn TranslationModel>,
    pub source: Vec<Vec<String>>,
    pub target_prefix: Option<Vec<Vec<String>>>,
    pub options: TranslateOptions,
    pub on_token: Option<TokenCallback>,
    /// Original indices of the sentences of each batch.
    pub batches: Vec<Vec<usize>>,
    cancelled: AtomicBool,
    state: Mutex<State<T>>,
    changed: Condvar,
}

struct State<T> {
    results: Vec<TranslationResult>,
    /// Batches not finished (translated, failed or skipped after a cancellation).
    pending: usize,
    /// Sentences translated so far.
    translated: usize,
    /// `translated` after each batch that ended translated, in the order they ended:
    /// what a waiter reports to its progress callback, one call per batch.
    milestones: Vec<usize>,
    error: Option<Error>,
    finish: Option<Finish<T>>,
    on_complete: Option<CompletionCallback>,
    /// Set once every batch is finished; taken by `wait`.
    outcome: Option<Result<T>>,
    /// The outcome is being made (the finishing step runs outside the lock).
    finishing: bool,
    /// The outcome is set.
    ended: bool,
    /// The completion callback has returned (or there was none).
    settled: bool,
    /// The thread running the completion callback, while it runs.
    callback_thread: Option<std::thread::ThreadId>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T: Send + 'static> Request<T> {
    pub fn new(
        model: Arc<dyn TranslationModel>,
        source: Vec<Vec<String>>,
        target_prefix: Option<Vec<Vec<String>>>,
        options: TranslateOptions,
        on_token: Option<TokenCallback>,
        finish: Finish<T>,
        on_complete: Option<CompletionCallback>,
    ) -> Arc<Request<T>> {
        let batches = super::rebatch(&source, options.max_batch_size, options.batch_type);
        let state = State {
            results: vec![TranslationResult::default(); source.len()],
            pending: batches.len(),
            translated: 0,
            milestones: Vec::new(),
            error: None,
            finish: Some(finish),
            on_complete,
            outcome: None,
            finishing: false,
            ended: false,
            settled: false,
            callback_thread: None,
        };
        let request = Arc::new(Request {
            model,
            source,
            target_prefix,
            options,
            on_token,
            batches,
            cancelled: AtomicBool::new(false),
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
        if request.batches.is_empty() {
            request.end_if_finished(lock(&request.state));
        }
        request
    }

    /// One task per batch, in the order the batches are to run (longest sources first).
    pub fn tasks(self: &Arc<Self>) -> Vec<Box<dyn Task>> {
        (0..self.batches.len()).map(|batch| Box::new(BatchTask { request: Arc::clone(self), batch }) as Box<dyn Task>).collect()
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Records a batch's end: its results, or why it has none.
    fn finish_batch(&self, batch: usize, outcome: Option<Result<Vec<TranslationResult>>>) {
        let mut state = lock(&self.state);
        match outcome {
            Some(Ok(results)) => {
                for (&i, r) in self.batches[batch].iter().zip(results) {
                    state.results[i] = r;
                }
                state.translated += self.batches[batch].len();
                let translated = state.translated;
                state.milestones.push(translated);
            }
            Some(Err(e)) => {
                // The first error is the job's; the other batches need not run.
                self.cancel();
                state.error.get_or_insert(e);
            }
            None => {}
        }
        state.pending -= 1;
        self.end_if_finished(state);
    }

    /// Once no batch is pending: sets the outcome, wakes the waiters, calls back.
    fn end_if_finished<'s>(&'s self, mut state: MutexGuard<'s, State<T>>) {
        if state.pending > 0 || state.finishing {
            self.changed.notify_all();
            return;
        }
        state.finishing = true;
        let outcome = if let Some(e) = state.error.take() {
            Err(e)
        } else if self.is_cancelled() {
            Err(Error::cancelled(format!(
                "the job was cancelled after {} of {} sentences",
                state.translated,
                self.source.len()
            )))
        } else {
            let results = std::mem::take(&mut state.results);
            let finish = state.finish.take().expect("a job finishes once");
            // The finishing step (detokenization) runs outside the lock: `progress` may look.
            drop(state);
            let outcome = catch(|| finish(results));
            state = lock(&self.state);
            outcome
        };
        let error = outcome.as_ref().err().cloned();
        // Only now: a waiter that saw `ended` before the finishing step returned would
        // find no outcome.
        state.outcome = Some(outcome);
        state.ended = true;
        let on_complete = state.on_complete.take();
        state.callback_thread = Some(std::thread::current().id());
        drop(state);
        self.changed.notify_all();
        if let Some(callback) = on_complete {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(error.as_ref())));
        }
        let mut state = lock(&self.state);
        state.settled = true;
        state.callback_thread = None;
        drop(state);
        self.changed.notify_all();
    }
}

/// Runs `f`, turning a panic into an internal error.
fn catch<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::internal(format!("internal error: {what}")))
    })
}

/// One batch of one request.
struct BatchTask<T> {
    request: Arc<Request<T>>,
    batch: usize,
}

impl<T: Send + 'static> Task for BatchTask<T> {
    fn run(self: Box<Self>, worker: &Worker) {
        let request = &self.request;
        if request.is_cancelled() || worker.shutting_down.load(Ordering::SeqCst) {
            request.finish_batch(self.batch, None);
            return;
        }
        let indices = &request.batches[self.batch];
        let mut observer = RequestObserver { request, indices, shutting_down: &worker.shutting_down };
        let outcome = catch(|| {
            worker.install(|| {
                let sources: Vec<&[String]> = indices.iter().map(|&i| request.source[i].as_slice()).collect();
                let prefixes: Vec<&[String]> = indices
                    .iter()
                    .map(|&i| request.target_prefix.as_ref().map_or(&[][..], |p| p[i].as_slice()))
                    .collect();
                translate_examples(request.model.as_ref(), &worker.ctx, &sources, &prefixes, &request.options, &mut observer)
            })
        });
        // A batch stopped by a cancellation has incomplete hypotheses: they are dropped.
        let stopped = request.is_cancelled() || worker.shutting_down.load(Ordering::SeqCst);
        request.finish_batch(self.batch, if stopped && outcome.is_ok() { None } else { Some(outcome) });
    }

    fn abandon(self: Box<Self>) {
        self.request.cancel();
        self.request.finish_batch(self.batch, None);
    }
}

/// Connects a search to its request: cancellation and the token callback.
struct RequestObserver<'a, T> {
    request: &'a Request<T>,
    /// Request index of each example of the batch.
    indices: &'a [usize],
    shutting_down: &'a AtomicBool,
}

impl<T> SearchObserver for RequestObserver<'_, T> {
    fn cancelled(&self) -> bool {
        self.request.cancelled.load(Ordering::Relaxed) || self.shutting_down.load(Ordering::Relaxed)
    }

    fn token(&mut self, example: usize, step: usize, id: u32, is_last: bool) -> bool {
        let Some(callback) = &self.request.on_token else { return true };
        let token = self.request.model.target_vocabulary().token(id);
        callback(&TokenEvent { example: self.indices[example], step, id, token, is_last })
    }
}

/// A translation submitted with [`super::Translator::submit`]: wait for it, poll it or
/// cancel it. Dropping the handle does not cancel the work (call [`Job::cancel`]).
pub struct Job<T> {
    request: Arc<Request<T>>,
}

impl<T: Send + 'static> Job<T> {
    pub(crate) fn new(request: Arc<Request<T>>) -> Job<T> {
        Job { request }
    }

    /// Whether the job has ended (translated, failed or cancelled).
    pub fn is_done(&self) -> bool {
        lock(&self.request.state).ended
    }

    /// Sentences translated so far, and their total.
    pub fn progress(&self) -> (usize, usize) {
        (lock(&self.request.state).translated, self.request.source.len())
    }

    /// Stops the job: batches not started are skipped and running ones stop at their next
    /// decoding step; the job then ends with a `Cancelled` error.
    pub fn cancel(&self) {
        self.request.cancel();
    }

    /// Cancels the job unless it has ended, and waits until it has ended and its callbacks
    /// have returned: afterwards nothing of the job calls the caller's code. (Called from
    /// the job's own completion callback it does not wait for that callback; from its token
    /// callback it would wait forever.)
    pub fn cancel_and_settle(&self) {
        let mut state = lock(&self.request.state);
        if !state.ended {
            self.cancel();
        }
        let me = std::thread::current().id();
        while !state.settled && state.callback_thread != Some(me) {
            state = self.request.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until the job ends, or until `timeout` has passed (then false).
    pub fn wait_for(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.request.state);
        while !state.ended {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self.request.changed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Blocks until the job ends and says how: `Ok` when it translated everything (its
    /// output is then ready for [`Job::wait`]), else its error. The output stays in place.
    pub fn finished(&self) -> Result<()> {
        let mut state = lock(&self.request.state);
        while !state.ended {
            state = self.request.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        match &state.outcome {
            Some(Err(e)) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Blocks until the job ends and returns its output (an error once it was taken).
    pub fn wait(&self) -> Result<T> {
        self.wait_with_progress(&mut |_, _| true)
    }

    /// [`Job::wait`] that calls `progress(done, total)` on this thread once per translated
    /// batch (sentences translated so far, of all); returning false cancels the job, which
    /// then ends with a `Cancelled` error.
    pub fn wait_with_progress(&self, progress: &mut dyn FnMut(usize, usize) -> bool) -> Result<T> {
        let total = self.request.source.len();
        let mut reported = 0;
        let mut calls = 0;
        let mut refused = false;
        let mut state = lock(&self.request.state);
        loop {
            if calls < state.milestones.len() && !refused {
                reported = state.milestones[calls];
                calls += 1;
                drop(state);
                if !progress(reported, total) {
                    refused = true;
                    self.cancel();
                }
                state = lock(&self.request.state);
                continue;
            }
            if state.ended {
                break;
            }
            state = self.request.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        let outcome = state.outcome.take();
        drop(state);
        match outcome {
            Some(Err(e)) if refused && e.kind == crate::ErrorKind::Cancelled => Err(Error::cancelled(format!(
                "cancelled by the progress callback after {reported} of {total} sentences"
            ))),
            Some(outcome) if refused && outcome.is_ok() => {
                Err(Error::cancelled(format!("cancelled by the progress callback after {reported} of {total} sentences")))
            }
            Some(outcome) => outcome,
            None => Err(Error::invalid_argument("the job's output was already taken")),
        }
    }
}
