//! Requests in flight: a submitted batch of sentences cut into batches that the workers
//! translate, its results kept in input order, and the handle the caller waits on, polls
//! or cancels.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::workers::{Task, Worker};
use super::{PreparedBatch, TokenCallback, TokenEvent, TranslateOptions, TranslationResult};
use crate::backend::Ctx;
use crate::decode::beam::beam_continuous;
use crate::decode::greedy::greedy_continuous;
use crate::decode::{ContinuousSearch, DecoderSession, Hypotheses, SearchObserver, SearchParams, StartTokens};
use crate::error::{Error, Result};
use crate::model::TranslationModel;

/// Turns the translations of all sentences, in input order, into a job's output.
pub(crate) type Finish<T> = Box<dyn FnOnce(Vec<TranslationResult>) -> Result<T> + Send>;
/// Called once when a job ends, with its error if it failed or was cancelled.
pub type CompletionCallback = Box<dyn FnOnce(Option<&Error>) + Send>;

/// What a submitted request holds: its input, options and results.
pub(crate) struct Request<T> {
    pub model: Arc<dyn TranslationModel>,
    /// The translator's workers (`Workers::id`): a wait on one of them would wait for itself.
    pool: usize,
    pub source: Vec<Vec<String>>,
    pub target_prefix: Option<Vec<Vec<String>>>,
    pub options: TranslateOptions,
    pub on_token: Option<TokenCallback>,
    /// Original indices of the sentences of each batch.
    pub batches: Vec<Vec<usize>>,
    /// Batches a worker has taken (each runs once: by its own task, or taken into another
    /// batch's search by continuous batching).
    claimed: Vec<AtomicBool>,
    cancelled: AtomicBool,
    state: Mutex<State<T>>,
    changed: Condvar,
    /// The CPU kernel level forced on the submitting thread (`isa::with_isa`, tests and
    /// benchmarks), which the workers then run this request's batches at.
    isa: Option<crate::backend::cpu::isa::Isa>,
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Arc<dyn TranslationModel>,
        pool: usize,
        source: Vec<Vec<String>>,
        target_prefix: Option<Vec<Vec<String>>>,
        mut options: TranslateOptions,
        on_token: Option<TokenCallback>,
        finish: Finish<T>,
        on_complete: Option<CompletionCallback>,
    ) -> Arc<Request<T>> {
        // One seed for the whole call (each example's stream derives from it).
        if options.sampling_seed.is_none() {
            use std::hash::BuildHasher;
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            options.sampling_seed = Some(std::collections::hash_map::RandomState::new().hash_one(nanos));
        }
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
        let claimed = batches.iter().map(|_| AtomicBool::new(false)).collect();
        let request = Arc::new(Request {
            claimed,
            model,
            pool,
            source,
            target_prefix,
            options,
            on_token,
            batches,
            cancelled: AtomicBool::new(false),
            state: Mutex::new(state),
            changed: Condvar::new(),
            isa: crate::backend::cpu::isa::forced_here(),
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

    /// Takes batch `batch` for the caller to run: false when a worker already has.
    fn claim(&self, batch: usize) -> bool {
        !self.claimed[batch].swap(true, Ordering::SeqCst)
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
        if !request.claim(self.batch) {
            return; // Already decoded with an earlier batch (continuous batching).
        }
        if request.is_stopped(worker) {
            request.finish_batch(self.batch, None);
            return;
        }
        crate::backend::cpu::isa::with_forced(request.isa, || run_continuous(request, self.batch, worker));
    }

    fn abandon(self: Box<Self>) {
        self.request.cancel();
        if self.request.claim(self.batch) {
            self.request.finish_batch(self.batch, None);
        }
    }
}

impl<T: Send + 'static> Request<T> {
    /// Cancelled, or the worker's translator is shutting down: searches stop.
    fn is_stopped(&self, worker: &Worker) -> bool {
        self.is_cancelled() || worker.shutting_down.load(Ordering::SeqCst)
    }

    /// Batch `batch` ready to decode; `None` when none of its sources needs decoding (the
    /// batch is then finished here).
    fn prepare(&self, batch: usize) -> Result<Option<PreparedBatch>> {
        let indices = &self.batches[batch];
        let sources: Vec<&[String]> = indices.iter().map(|&i| self.source[i].as_slice()).collect();
        let prefixes: Vec<&[String]> =
            indices.iter().map(|&i| self.target_prefix.as_ref().map_or(&[][..], |p| p[i].as_slice())).collect();
        let prepared = PreparedBatch::new(self.model.as_ref(), indices, &sources, &prefixes, &self.options)?;
        if prepared.to_run.is_empty() {
            self.finish_batch(batch, Some(Ok(prepared.results)));
            return Ok(None);
        }
        Ok(Some(prepared))
    }
}

/// Greedy or beam search over `batch` that takes in the request's next batches while it
/// runs (continuous batching): the rows that finish early are replaced instead of the last
/// long hypotheses stepping through the whole model a few rows at a time. Each example is
/// decoded exactly as in its own batch.
fn run_continuous<T: Send + 'static>(request: &Arc<Request<T>>, batch: usize, worker: &Worker) {
    let mut feed = Feed { request, worker, batches: Vec::new(), groups: Vec::new(), examples: Vec::new(), next: batch + 1, refill_below: 0, admission: None };
    let outcome = catch(|| {
        worker.install(|| {
            let Some(prepared) = request.prepare(batch)? else { return Ok(()) };
            // A batch's output restriction (shortlist, vocabulary map) is its own: such
            // batches are decoded alone, as are those of models that cannot take rows in.
            // By default beam search takes no batch in: on the CPU its tails are short (the
            // last steps still have 4+ rows) and joins gained 0-1% on zh-en beam 4 for 14%
            // more peak memory. Worth trying where steps have a large fixed cost (a GPU).
            let joins = request.options.join_batches.unwrap_or(request.options.beam_size == 1)
                && prepared.output_ids.is_none()
                && request.model.takes_rows_in()
                && request.batches.len() > batch + 1;
            if joins {
                feed.admission = Admission::new(request);
                // Without a state budget: refill once a quarter of a batch's rows is left
                // (beam search: `beam` rows per example): most of the gain (the long
                // tails), with at most 1.25 batches of rows at once.
                feed.refill_below = (request.batches[batch].len() * request.options.beam_size / 4).max(1);
            }
            let fed = feed.take(batch, prepared);
            let part = feed.part_of(fed, &[]);
            let prepared = feed.batches[fed].prepared.as_ref().expect("just taken");
            let mut session = request.model.start(&worker.ctx, prepared.sources(part.clone()), prepared.output_ids.clone(), request.options.kv_cache_type)?;
            if prepared.params.return_attention && !session.keep_attention() {
                return Err(Error::unsupported("return_attention and replace_unknowns are supported on the CPU only"));
            }
            let (starts, params) = feed.start_part(fed, part);
            if params.beam_size == 1 {
                greedy_continuous(&worker.ctx, session.as_mut(), &mut feed, starts, params);
            } else {
                beam_continuous(&worker.ctx, session.as_mut(), &mut feed, starts, params);
            }
            Ok(())
        })
    });
    // A batch still held here did not run to its end: the search failed or was cancelled
    // before all of its examples were decoded.
    let mut error = outcome.err();
    let unfinished: Vec<usize> = feed.batches.iter().filter(|b| b.prepared.is_some()).map(|b| b.batch).collect();
    let unfinished = if feed.batches.is_empty() && error.is_some() { vec![batch] } else { unfinished };
    for b in unfinished {
        // The error goes to the first such batch; the others end with nothing.
        request.finish_batch(b, error.take().map(Err));
    }
}

/// The batches one continuous search decodes, and where their results go.
struct Feed<'a, T> {
    request: &'a Arc<Request<T>>,
    worker: &'a Worker,
    /// The batches taken, each prepared until its results are handed over.
    batches: Vec<FedBatch>,
    /// Each group of the search: a part of a taken batch (index in `batches`), its examples
    /// `to_run[range]`; the whole batch unless a state budget splits it.
    groups: Vec<(usize, std::ops::Range<usize>)>,
    /// Request index of each example of the search (in the order they joined).
    examples: Vec<usize>,
    /// The next batch to try to take.
    next: usize,
    /// Without a state budget: take in the next batch when fewer rows than this are left
    /// (0: never).
    refill_below: usize,
    /// With a state budget: how examples are let in.
    admission: Option<Admission>,
}

struct FedBatch {
    batch: usize,
    prepared: Option<PreparedBatch>,
    /// Examples (`to_run` indices) handed to the search so far.
    admitted: usize,
    /// Parts handed to the search and not done.
    running: usize,
    /// Each example's hypotheses, as its part ends (`to_run` order).
    hypotheses: Vec<Option<Hypotheses>>,
}

/// The least automatic budget of decoding state (half the model's weights): a small
/// model's half (a few KB for the test models) would decode a sentence at a time.
const AUTOMATIC_BUDGET_FLOOR: usize = 32 << 20;

/// Continuous batching under a budget of decoding state (`TranslateOptions::
/// max_decoding_memory_mb`): an example starts when the state the rows hold and are
/// expected to hold, plus its own, fits. Each row is expected to grow to its source length
/// plus a target as long as the source (or as long as it already is), that is, as if
/// every row lived to its end at once; rows end at different steps, so the state stays
/// under the budget. A batch may start in parts (each encoded as within the whole batch,
/// so results are unchanged), and the longest batch no longer sets the peak: zh-en int8
/// greedy over 500 verses at AVX2 peaks at 142 MB with the default budget (39 MB) instead
/// of 169 MB without one, about 4% slower (2-3% natively: the first, longest sentences
/// decode fewer rows a step).
struct Admission {
    /// Bytes of state to plan for.
    budget: usize,
    /// At most this many rows at once (a batch's).
    rows: usize,
    /// Examples are let in once this many rows are free (fewer, larger parts).
    free_rows: usize,
    /// Bytes a position of a row takes (`TranslationModel::position_bytes`).
    position_bytes: usize,
}

impl Admission {
    fn new<T>(request: &Request<T>) -> Option<Admission> {
        let budget = match request.options.max_decoding_memory_mb {
            None => (request.model.weight_bytes() / 2).max(AUTOMATIC_BUDGET_FLOOR),
            Some(0) => return None,
            Some(mb) => mb.saturating_mul(1 << 20),
        };
        let beam = request.options.beam_size;
        let rows = request.batches.iter().map(Vec::len).max().unwrap_or(1).max(1) * beam;
        let position_bytes = request.model.position_bytes(request.options.kv_cache_type);
        Some(Admission { budget, rows, free_rows: (rows / 8).max(beam), position_bytes })
    }

    /// Positions a row of source length `source` is expected to hold once `steps` are done.
    fn expected(source: usize, steps: usize) -> usize {
        source + source.max(steps + 1)
    }
}

impl<T: Send + 'static> Feed<'_, T> {
    /// Holds batch `batch` (prepared) for the search to take its examples from.
    fn take(&mut self, batch: usize, prepared: PreparedBatch) -> usize {
        let n = prepared.to_run.len();
        self.batches.push(FedBatch { batch, prepared: Some(prepared), admitted: 0, running: 0, hypotheses: (0..n).map(|_| None).collect() });
        self.batches.len() - 1
    }

    /// The examples of held batch `fed` to let in now (a range of its `to_run`), given the
    /// rows decoding (`rows`: each one's source length and steps done): all that are left
    /// without a state budget, else as many as fit (always one when no row decodes).
    fn part_of(&self, fed: usize, rows: &[(usize, usize)]) -> std::ops::Range<usize> {
        let held = &self.batches[fed];
        let prepared = held.prepared.as_ref().expect("a held batch is prepared");
        let (first, total) = (held.admitted, prepared.to_run.len());
        let Some(admission) = &self.admission else { return first..total };
        let (beam, position_bytes) = (self.request.options.beam_size, admission.position_bytes);
        let mut planned: usize = rows.iter().map(|&(source, steps)| Admission::expected(source, steps)).sum::<usize>() * position_bytes;
        let mut live = rows.len();
        let mut end = first;
        while end < total && live + beam <= admission.rows {
            let need = Admission::expected(prepared.source_ids[end].len(), 0) * beam * position_bytes;
            if live > 0 && planned + need > admission.budget {
                break;
            }
            (planned, live, end) = (planned + need, live + beam, end + 1);
        }
        first..end
    }

    /// Hands part `part` of held batch `fed` to the search as a new group.
    fn start_part(&mut self, fed: usize, part: std::ops::Range<usize>) -> (Vec<StartTokens>, SearchParams) {
        let held = &mut self.batches[fed];
        let prepared = held.prepared.as_ref().expect("a held batch is prepared");
        let indices = &self.request.batches[held.batch];
        self.examples.extend(prepared.to_run[part.clone()].iter().map(|&i| indices[i]));
        let group = (prepared.starts[part.clone()].to_vec(), prepared.params.clone());
        held.admitted = part.end;
        held.running += 1;
        self.groups.push((fed, part));
        group
    }

    /// The held batch with examples still to let in, taking the request's next batch when
    /// none is; `None` when there is none left.
    fn batch_to_admit(&mut self) -> Result<Option<usize>> {
        if let Some(fed) = self.batches.iter().position(|b| b.prepared.as_ref().is_some_and(|p| b.admitted < p.to_run.len())) {
            return Ok(Some(fed));
        }
        let request = self.request;
        while self.next < request.batches.len() {
            let batch = self.next;
            self.next += 1;
            if !request.claim(batch) {
                continue;
            }
            match request.prepare(batch) {
                Ok(Some(prepared)) => return Ok(Some(self.take(batch, prepared))),
                Ok(None) => continue,
                Err(e) => {
                    request.finish_batch(batch, Some(Err(e)));
                    return Err(Error::internal("a batch could not be prepared"));
                }
            }
        }
        Ok(None)
    }
}

impl<T: Send + 'static> SearchObserver for Feed<'_, T> {
    fn cancelled(&self) -> bool {
        self.request.is_stopped(self.worker)
    }

    fn token(&mut self, example: usize, step: usize, id: u32, is_last: bool) -> bool {
        let Some(callback) = &self.request.on_token else { return true };
        let token = self.request.model.target_vocabulary().token(id);
        callback(&TokenEvent { example: self.examples[example], step, id, token, is_last })
    }
}

impl<T: Send + 'static> ContinuousSearch for Feed<'_, T> {
    fn next_group(&mut self, ctx: &Ctx, decoder: &mut dyn DecoderSession, alive: usize) -> Option<(Vec<StartTokens>, SearchParams)> {
        if self.cancelled() {
            return None;
        }
        match &self.admission {
            Some(admission) if alive > 0 && alive + admission.free_rows > admission.rows => return None,
            None if alive >= self.refill_below => return None,
            _ => {}
        }
        let fed = self.batch_to_admit().ok()??;
        let part = self.part_of(fed, &decoder.row_lengths());
        if part.is_empty() {
            return None;
        }
        let held = &self.batches[fed];
        let prepared = held.prepared.as_ref().expect("a held batch is prepared");
        // Without a budget, a whole batch joins: its encoding's buffers would extend the heap
        // instead of reusing the finished rows' memory, scattered there, and the process
        // would grow by a batch's worth (zh-en int8 greedy, 500 verses: 185 MB instead of
        // 169). Under a budget parts are smaller and the state bounded: handing the pages
        // back, then faulting them in again, cost 2-4% for 1.6 MB (139 against 141 MB).
        let release_freed = self.admission.is_none();
        match decoder.append_sources(ctx, prepared.sources(part.clone()), release_freed) {
            Ok(true) => Some(self.start_part(fed, part)),
            outcome => {
                let e = outcome.err().unwrap_or_else(|| Error::internal("internal error: a decoding refused the rows it said it could take"));
                let batch = held.batch;
                // Its parts already decoding end with nothing (the batch has failed).
                self.batches[fed].prepared = None;
                self.request.finish_batch(batch, Some(Err(e)));
                None
            }
        }
    }

    fn group_done(&mut self, group: usize, hypotheses: Vec<Hypotheses>) {
        let (fed, part) = self.groups[group].clone();
        let held = &mut self.batches[fed];
        held.running -= 1;
        for (slot, h) in held.hypotheses[part].iter_mut().zip(hypotheses) {
            *slot = Some(h);
        }
        let Some(prepared) = &held.prepared else { return };
        if held.running > 0 || held.admitted < prepared.to_run.len() || self.request.is_stopped(self.worker) {
            // More to come; or stopped: a batch stopped by a cancellation has incomplete
            // hypotheses, and is finished with nothing when the search returns.
            return;
        }
        let prepared = held.prepared.take().expect("checked above");
        let hypotheses = std::mem::take(&mut held.hypotheses).into_iter().map(Option::unwrap_or_default).collect();
        self.request.finish_batch(held.batch, Some(Ok(prepared.complete(self.request.model.as_ref(), hypotheses))));
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
    /// have returned: afterwards nothing of the job calls the caller's code. Called from a
    /// callback on one of the translator's workers (an on_token or completion callback of
    /// this job or another), it cancels and returns at once: the job may need the very
    /// worker that would wait (its token callback waiting for itself hung forever), so its
    /// completion callback may still come afterwards.
    pub fn cancel_and_settle(&self) {
        let mut state = lock(&self.request.state);
        if !state.ended {
            self.cancel();
        }
        if super::workers::on_worker_of(self.request.pool) {
            return;
        }
        let me = std::thread::current().id();
        while !state.settled && state.callback_thread != Some(me) {
            state = self.request.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until the job ends, or until `timeout` has passed (then false). Like every
    /// wait it returns once the output is set, which may be while the completion callback
    /// still runs: [`Job::cancel_and_settle`] waits for that too. (Waiting for it here made
    /// a callback that hands work to the waiting thread, a UI's event loop, a deadlock.)
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
        self.refuse_waiting_on_own_worker(state.ended)?;
        while !state.ended {
            state = self.request.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        match &state.outcome {
            Some(Err(e)) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// A wait from a callback running on one of the translator's workers (`on_token`,
    /// `on_complete`) for a job that has not ended: refused, as that worker cannot run the
    /// job's batches while it waits (with one worker, a wait forever).
    fn refuse_waiting_on_own_worker(&self, ended: bool) -> Result<()> {
        if !ended && super::workers::on_worker_of(self.request.pool) {
            return Err(Error::invalid_argument(
                "a translation was waited for inside a callback of the translator running it (on one of its \
                 workers, which would wait for itself): submit it as an async job without waiting, or use \
                 another translator",
            ));
        }
        Ok(())
    }

    /// [`Job::wait_with_progress`] for a job the caller submitted only to wait for it (a
    /// blocking call): refused inside a callback of the translator, it is cancelled, so
    /// that none of its callbacks runs after the call returned.
    pub(crate) fn wait_blocking(&self, progress: &mut dyn FnMut(usize, usize) -> bool) -> Result<T> {
        let result = self.wait_with_progress(progress);
        if result.is_err() && !self.is_done() {
            self.cancel();
        }
        result
    }

    /// Blocks until the job ends and returns its output (an error once it was taken), or
    /// its error (each time it is asked).
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
        self.refuse_waiting_on_own_worker(state.ended)?;
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
        let cancelled = || Error::cancelled(format!("cancelled by the progress callback after {reported} of {total} sentences"));
        let outcome = match state.outcome.take() {
            Some(Err(e)) if refused && e.kind == crate::ErrorKind::Cancelled => Err(cancelled()),
            Some(Ok(_)) if refused => Err(cancelled()),
            Some(outcome) => outcome,
            None => return Err(Error::invalid_argument("the job's output was already taken")),
        };
        // Only an output is taken: an error stays, so that `finished` (tolk_job_wait) and a
        // later wait still say how the job ended.
        if let Err(e) = &outcome {
            state.outcome = Some(Err(e.clone()));
        }
        outcome
    }
}
