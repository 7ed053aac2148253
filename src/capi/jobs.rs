//! Asynchronous translation in the C ABI: submit a batch (tokens or text) and get a job to
//! wait on, poll or cancel, and optionally a completion callback.
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::time::Duration;

use super::text::{read_text_options, read_texts, TolkTextOptions, TolkTextResult};
use super::{
    guard, non_null, read_sources, read_translate_options, status_of, Failure, TolkResult, TolkStatus,
    TolkTranslateOptions, TolkTranslator,
};
use crate::error::{Error, Result};
use crate::{BatchHooks, CompletionCallback, Job, TextHooks, TextTranslation, TranslationResult};

/// A translation in flight (opaque): see tolk_translate_batch_async.
pub struct TolkJob {
    job: JobKind,
}

enum JobKind {
    Tokens(Job<Vec<TranslationResult>>),
    Text(Job<Vec<TextTranslation>>),
}

impl JobKind {
    fn cancel(&self) {
        match self {
            JobKind::Tokens(j) => j.cancel(),
            JobKind::Text(j) => j.cancel(),
        }
    }
    fn is_done(&self) -> bool {
        match self {
            JobKind::Tokens(j) => j.is_done(),
            JobKind::Text(j) => j.is_done(),
        }
    }
    fn wait_for(&self, timeout: Duration) -> bool {
        match self {
            JobKind::Tokens(j) => j.wait_for(timeout),
            JobKind::Text(j) => j.wait_for(timeout),
        }
    }
    fn finished(&self) -> Result<()> {
        match self {
            JobKind::Tokens(j) => j.finished(),
            JobKind::Text(j) => j.finished(),
        }
    }
    fn progress(&self) -> (usize, usize) {
        match self {
            JobKind::Tokens(j) => j.progress(),
            JobKind::Text(j) => j.progress(),
        }
    }
}

/// Called once when a job ends, with TOLK_OK or the job's error status (the message is
/// tolk_job_wait's), from a translator thread, or from the thread that frees the translator
/// while the job is pending, or from the submitting call when there is nothing to translate.
/// Do not free the translator from it. The waits (tolk_job_wait, tolk_job_wait_for,
/// tolk_job_result) return once the job has ended, which may be while the callback still
/// runs: free what it uses after tolk_job_free, which waits for it to return. Inside it
/// (or an on_token callback), a blocking call on the same translator, or a wait for one of
/// its jobs that has not ended, fails with TOLK_ERROR_INVALID_ARGUMENT: it would wait for
/// the worker it runs on. Submitting async jobs from it is fine.
pub type TolkJobCallback = Option<unsafe extern "C" fn(user_data: *mut c_void, status: TolkStatus)>;

/// The caller's completion callback and its user data.
struct Completion {
    callback: TolkJobCallback,
    user_data: *mut c_void,
}

// SAFETY: tolk_translate_batch_async documents that the callback runs on another thread.
unsafe impl Send for Completion {}

impl Completion {
    fn into_callback(self) -> Option<CompletionCallback> {
        self.callback?;
        Some(Box::new(move |error: Option<&Error>| self.call(error.map_or(TolkStatus::TolkOk, |e| status_of(e.kind)))))
    }

    fn call(&self, status: TolkStatus) {
        if let Some(f) = self.callback {
            // SAFETY: the caller vouches for its callback and user data.
            unsafe { f(self.user_data, status) }
        }
    }
}

/// Queues the translation of a batch of tokenized sentences and returns at once with a job
/// in `*out_job` (free it with tolk_job_free). Arguments are those of tolk_translate_batch
/// and are copied before the call returns; `options->progress` is not called (see
/// tolk_job_progress), `options->on_token` is. `on_complete` (may be NULL) is called once
/// when the job ends (see TolkJobCallback); then tolk_job_result gives the results, in
/// input order. Many jobs may be in flight on one translator, from any threads: their
/// batches run in submission order on the translator's inter_threads workers.
///
/// # Safety
/// As tolk_translate_batch; `on_complete` and `user_data` must be usable from any thread.
#[no_mangle]
pub unsafe extern "C" fn tolk_translate_batch_async(
    translator: *const TolkTranslator,
    source: *const *const *const c_char,
    source_lengths: *const usize,
    batch_size: usize,
    target_prefix: *const *const *const c_char,
    target_prefix_lengths: *const usize,
    options: *const TolkTranslateOptions,
    on_complete: TolkJobCallback,
    user_data: *mut c_void,
    out_job: *mut *mut TolkJob,
) -> TolkStatus {
    guard("tolk_translate_batch_async", || {
        let out = clear(out_job)?;
        let translator = &*non_null(translator, "translator")?;
        let (opts, _progress, tokens) = read_translate_options(translator, options)?;
        let (source, prefix) = read_sources(source, source_lengths, batch_size, target_prefix, target_prefix_lengths)?;
        let on_complete = Completion { callback: on_complete, user_data }.into_callback();
        let hooks = BatchHooks { on_token: tokens.batch_callback(), on_complete };
        let job = translator.translator.submit_batch(source, prefix, &opts, hooks)?;
        *out = Box::into_raw(Box::new(TolkJob { job: JobKind::Tokens(job) }));
        Ok(())
    })
}

/// Queues the translation of `count` texts (as tolk_translate_text_batch) and returns at
/// once with a job in `*out_job`; the texts are split and tokenized before the call
/// returns. See tolk_translate_batch_async for the rest; tolk_job_text_result gives the
/// translations.
///
/// # Safety
/// As tolk_translate_text_batch; `on_complete` and `user_data` must be usable from any thread.
#[no_mangle]
pub unsafe extern "C" fn tolk_translate_text_async(
    translator: *const TolkTranslator,
    texts: *const *const c_char,
    text_lengths: *const usize,
    count: usize,
    options: *const TolkTranslateOptions,
    text_options: *const TolkTextOptions,
    on_complete: TolkJobCallback,
    user_data: *mut c_void,
    out_job: *mut *mut TolkJob,
) -> TolkStatus {
    guard("tolk_translate_text_async", || {
        let out = clear(out_job)?;
        let translator = &*non_null(translator, "translator")?;
        let batch = read_texts(texts, text_lengths, count)?;
        let (opts, _progress, tokens) = read_translate_options(translator, options)?;
        let text_options = read_text_options(text_options)?;
        let on_complete = Completion { callback: on_complete, user_data }.into_callback();
        let hooks = TextHooks { on_token: tokens.text_callback(), on_complete };
        let job = translator.translator.submit_text(&batch, &opts, &text_options, hooks)?;
        *out = Box::into_raw(Box::new(TolkJob { job: JobKind::Text(job) }));
        Ok(())
    })
}

/// Checks `out_job` and sets it to NULL (a failed call leaves NULL there).
unsafe fn clear(out_job: *mut *mut TolkJob) -> std::result::Result<*mut *mut TolkJob, Failure> {
    let out = non_null(out_job as *const *mut TolkJob, "out_job")? as *mut *mut TolkJob;
    *out = ptr::null_mut();
    Ok(out)
}

/// Whether the job has ended (translated, failed or cancelled); false for NULL. Never blocks.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_is_done(job: *const TolkJob) -> bool {
    !job.is_null() && catch_unwind(AssertUnwindSafe(|| (*job).job.is_done())).unwrap_or(false)
}

/// Blocks until the job ends, at most `timeout_ms` milliseconds (a negative value: no
/// limit). Returns whether it has ended (its on_complete may still be running).
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_wait_for(job: *const TolkJob, timeout_ms: i64) -> bool {
    if job.is_null() {
        return false;
    }
    catch_unwind(AssertUnwindSafe(|| {
        let job = &(*job).job;
        if timeout_ms < 0 {
            // Whether it failed or was refused (inside one of the translator's callbacks).
            let _ = job.finished();
            job.is_done()
        } else {
            job.wait_for(Duration::from_millis(timeout_ms as u64))
        }
    }))
    .unwrap_or(false)
}

/// Blocks until the job ends (its on_complete may still be running: see TolkJobCallback)
/// and returns how it ended: TOLK_OK, or its error status with
/// the message in tolk_last_error (TOLK_ERROR_CANCELLED after tolk_job_cancel or when the
/// translator was freed first). The results stay in the job.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_wait(job: *const TolkJob) -> TolkStatus {
    guard("tolk_job_wait", || Ok((*non_null(job, "job")?).job.finished()?))
}

/// Sentences translated so far and their total (text jobs count sentences, and parts of
/// wrapped ones, of all texts). Either pointer may be NULL.
///
/// # Safety
/// `job` must be a live job; `done` and `total` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_progress(job: *const TolkJob, done: *mut usize, total: *mut usize) -> TolkStatus {
    guard("tolk_job_progress", || {
        let (d, t) = (*non_null(job, "job")?).job.progress();
        if !done.is_null() {
            *done = d;
        }
        if !total.is_null() {
            *total = t;
        }
        Ok(())
    })
}

/// Asks the job to stop: batches not started are skipped, running ones stop at their next
/// decoding step, and the job ends with TOLK_ERROR_CANCELLED (unless it had already
/// ended). Returns at once; NULL is ignored.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_cancel(job: *const TolkJob) {
    if !job.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| (*job).job.cancel()));
    }
}

/// Waits for a token job (tolk_translate_batch_async) and moves its results into
/// `*out_result` (release with tolk_result_free); a second call fails. Returns the job's
/// error when it failed.
///
/// # Safety
/// `job` must be a live job; `out_result` writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_result(job: *const TolkJob, out_result: *mut *mut TolkResult) -> TolkStatus {
    guard("tolk_job_result", || {
        let out = non_null(out_result as *const *mut TolkResult, "out_result")? as *mut *mut TolkResult;
        *out = ptr::null_mut();
        match &(*non_null(job, "job")?).job {
            JobKind::Tokens(j) => *out = Box::into_raw(Box::new(TolkResult::new(j.wait()?))),
            JobKind::Text(_) => return Err(Error::invalid_argument("this is a text job: use tolk_job_text_result").into()),
        }
        Ok(())
    })
}

/// Waits for a text job (tolk_translate_text_async) and moves its translations into
/// `*out_result` (release with tolk_text_result_free); a second call fails.
///
/// # Safety
/// `job` must be a live job; `out_result` writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_text_result(job: *const TolkJob, out_result: *mut *mut TolkTextResult) -> TolkStatus {
    guard("tolk_job_text_result", || {
        let out = non_null(out_result as *const *mut TolkTextResult, "out_result")? as *mut *mut TolkTextResult;
        *out = ptr::null_mut();
        match &(*non_null(job, "job")?).job {
            JobKind::Text(j) => *out = Box::into_raw(Box::new(TolkTextResult::new(j.wait()?))),
            JobKind::Tokens(_) => return Err(Error::invalid_argument("this is a token job: use tolk_job_result").into()),
        }
        Ok(())
    })
}

/// Releases a job handle. A job still running is cancelled (nobody could read its
/// results) and its completion callback is still called once; this call returns when the
/// job has ended and its callbacks have returned, so their user data may be released
/// afterwards. That takes at most one decoding step. Called from a callback of the same
/// translator (the job's on_token or completion callback, or another job's), it cannot
/// wait for the worker it runs on: it cancels the job and returns at once, and the job's
/// completion callback still comes once the running callback has returned (keep its user
/// data until then).
///
/// # Safety
/// `job` must be NULL or a job not yet freed, and no call may be using it.
#[no_mangle]
pub unsafe extern "C" fn tolk_job_free(job: *mut TolkJob) {
    if !job.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let job = Box::from_raw(job);
            match &job.job {
                JobKind::Tokens(j) => j.cancel_and_settle(),
                JobKind::Text(j) => j.cancel_and_settle(),
            }
        }));
    }
}
