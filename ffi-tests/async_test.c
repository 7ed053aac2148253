/*
 * Asynchronous C API and serving tests: jobs submitted from many threads to one translator
 * with inter_threads workers (results equal the blocking call, in input order), completion
 * callbacks called once, polling and progress, cancellation, tolk_job_free of a running
 * job, freeing a translator with jobs in flight (no hang, no leak: this runs under
 * valgrind too), token streaming (on_token) in token and text calls, text jobs, NULLs.
 *
 *   async_test MODEL_DIR      (MODEL_DIR: ffi-tests/fixtures/tiny)
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

#define SENTENCES 48
#define MAX_LEN 12
static const char *LETTERS[] = {"a", "b", "c", "d", "e", "h", "l", "m", "n", "o", "p", "q", "r", "s", "u", "v", "w", "x", "z"};
static const char *const *SOURCE[SENTENCES];
static size_t LENGTHS[SENTENCES];

/* Sentences of mixed lengths (0..MAX_LEN-1) made of the fixture's letters. */
static void make_source(void) {
    static const char *tokens[SENTENCES][MAX_LEN];
    for (size_t i = 0; i < SENTENCES; i++) {
        LENGTHS[i] = (i * 7) % MAX_LEN;
        for (size_t j = 0; j < LENGTHS[i]; j++) tokens[i][j] = LETTERS[(i * 5 + j * 3) % 19];
        SOURCE[i] = tokens[i];
    }
}

static TolkTranslateOptions options(uint32_t beam, uint32_t batch) {
    TolkTranslateOptions o = tolk_translate_options_default();
    o.beam_size = beam;
    o.max_batch_size = batch;
    o.max_decoding_length = 16;
    return o;
}

static TolkTranslator *new_translator(const TolkModel *model, uint32_t inter_threads) {
    TolkTranslatorOptions t = tolk_translator_options_default();
    t.inter_threads = inter_threads;
    TolkTranslator *translator = NULL;
    CHECK_STATUS(tolk_translator_new(model, &t, &translator), TOLK_OK);
    return translator;
}

/* Whether two results hold the same tokens. */
static int same_tokens(const TolkResult *a, const TolkResult *b) {
    if (tolk_result_batch_size(a) != tolk_result_batch_size(b)) return 0;
    for (size_t i = 0; i < tolk_result_batch_size(a); i++) {
        const char *const *ta, *const *tb;
        size_t na, nb;
        if (tolk_result_hypothesis(a, i, 0, &ta, &na, NULL) != TOLK_OK) return 0;
        if (tolk_result_hypothesis(b, i, 0, &tb, &nb, NULL) != TOLK_OK) return 0;
        if (na != nb) return 0;
        for (size_t k = 0; k < na; k++)
            if (strcmp(ta[k], tb[k]) != 0) return 0;
    }
    return 1;
}

typedef struct {
    atomic_int calls;
    atomic_int last_status;
} Completion;

static void on_complete(void *user_data, TolkStatus status) {
    Completion *c = user_data;
    atomic_store(&c->last_status, (int)status);
    atomic_fetch_add(&c->calls, 1);
}

typedef struct {
    const TolkTranslator *translator;
    const TolkResult *expected;
    int ok;
} Submitter;

/* Submits 6 jobs of the whole batch, then checks each result against the blocking call. */
static void *submit_thread(void *arg) {
    Submitter *s = arg;
    TolkTranslateOptions o = options(2, 5);
    TolkJob *jobs[6] = {NULL};
    Completion done[6];
    for (int j = 0; j < 6; j++) {
        atomic_init(&done[j].calls, 0);
        atomic_init(&done[j].last_status, -1);
        if (tolk_translate_batch_async(s->translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, on_complete, &done[j], &jobs[j]) != TOLK_OK) return NULL;
    }
    s->ok = 1;
    for (int j = 0; j < 6; j++) {
        TolkResult *r = NULL;
        if (tolk_job_result(jobs[j], &r) != TOLK_OK || !same_tokens(r, s->expected)) s->ok = 0;
        tolk_result_free(r);
        tolk_job_free(jobs[j]); /* after the job ended: its callback has returned */
        if (atomic_load(&done[j].calls) != 1 || atomic_load(&done[j].last_status) != TOLK_OK) s->ok = 0;
    }
    return NULL;
}

static void test_jobs_from_many_threads(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 2);
    if (!translator) return;
    TolkTranslateOptions o = options(2, 5);
    TolkResult *expected = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, &expected), TOLK_OK);
    Submitter subs[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        subs[i] = (Submitter){translator, expected, 0};
        CHECK(pthread_create(&threads[i], NULL, submit_thread, &subs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        CHECK(subs[i].ok);
    }
    tolk_result_free(expected);
    tolk_translator_free(translator);
}

static void test_polling_and_cancel(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    if (!translator) return;
    TolkTranslateOptions o = options(1, 4);
    Completion c;
    atomic_init(&c.calls, 0);
    atomic_init(&c.last_status, -1);
    TolkJob *job = NULL;
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, on_complete, &c, &job), TOLK_OK);
    CHECK(tolk_job_wait_for(job, -1));
    CHECK(tolk_job_is_done(job));
    size_t done = 0, total = 0;
    CHECK_STATUS(tolk_job_progress(job, &done, &total), TOLK_OK);
    CHECK(done == SENTENCES && total == SENTENCES);
    CHECK_STATUS(tolk_job_wait(job), TOLK_OK);
    TolkTextResult *wrong = NULL;
    CHECK_STATUS(tolk_job_text_result(job, &wrong), TOLK_ERROR_INVALID_ARGUMENT); /* a token job */
    TolkResult *r = NULL;
    CHECK_STATUS(tolk_job_result(job, &r), TOLK_OK);
    CHECK(tolk_result_batch_size(r) == SENTENCES);
    tolk_result_free(r);
    CHECK_STATUS(tolk_job_result(job, &r), TOLK_ERROR_INVALID_ARGUMENT); /* taken once */
    CHECK(r == NULL);
    tolk_job_free(job);
    CHECK(atomic_load(&c.calls) == 1 && atomic_load(&c.last_status) == TOLK_OK);

    /* A long job cancelled: it ends with CANCELLED, its callback says so. */
    TolkTranslateOptions slow = options(4, 2);
    slow.max_decoding_length = 250;
    slow.min_decoding_length = 200;
    atomic_store(&c.calls, 0);
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &slow, on_complete, &c, &job), TOLK_OK);
    tolk_job_cancel(job);
    CHECK_STATUS(tolk_job_wait(job), TOLK_ERROR_CANCELLED);
    CHECK_STATUS(tolk_job_result(job, &r), TOLK_ERROR_CANCELLED);
    /* Taking the result leaves the error: the job still says how it ended. */
    CHECK_STATUS(tolk_job_wait(job), TOLK_ERROR_CANCELLED);
    CHECK_STATUS(tolk_job_result(job, &r), TOLK_ERROR_CANCELLED);
    tolk_job_free(job);
    CHECK(atomic_load(&c.calls) == 1 && atomic_load(&c.last_status) == TOLK_ERROR_CANCELLED);

    /* A job that fails on its worker (an end token the vocabulary lacks), its result asked
       for before any wait: the error comes back from both, in either order. */
    TolkTranslateOptions failing = options(1, 4);
    failing.end_token = "no-such-token";
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &failing, NULL, NULL, &job), TOLK_OK);
    CHECK_STATUS(tolk_job_result(job, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(r == NULL);
    CHECK_STATUS(tolk_job_wait(job), TOLK_ERROR_INVALID_ARGUMENT);
    tolk_job_free(job);

    /* Freeing a running job cancels it; its callback has run once when free returns. */
    atomic_store(&c.calls, 0);
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &slow, on_complete, &c, &job), TOLK_OK);
    tolk_job_free(job);
    CHECK(atomic_load(&c.calls) == 1);
    tolk_translator_free(translator);
}

static void test_free_translator_with_jobs_in_flight(const TolkModel *model) {
    for (uint32_t workers = 1; workers <= 3; workers += 2) {
        TolkTranslator *translator = new_translator(model, workers);
        if (!translator) return;
        TolkTranslateOptions slow = options(4, 2);
        slow.max_decoding_length = 250;
        slow.min_decoding_length = 200;
        Completion c;
        atomic_init(&c.calls, 0);
        atomic_init(&c.last_status, -1);
        TolkJob *jobs[5] = {NULL};
        for (int j = 0; j < 5; j++)
            CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &slow, on_complete, &c, &jobs[j]), TOLK_OK);
        tolk_translator_free(translator); /* must neither hang nor leak */
        CHECK(atomic_load(&c.calls) == 5);
        for (int j = 0; j < 5; j++) {
            CHECK(tolk_job_is_done(jobs[j]));
            CHECK_STATUS(tolk_job_wait(jobs[j]), TOLK_ERROR_CANCELLED);
            tolk_job_free(jobs[j]);
        }
    }
}

/* Freeing the translator runs the pending jobs' completion callbacks on the freeing thread;
 * one that frees another pending job (whose own callback comes after it, on that same
 * thread) does not wait for it, and every callback still comes once. */
typedef struct {
    TolkJob *other;
    atomic_int calls;
} FreesOther;

static void free_other_on_complete(void *user_data, TolkStatus status) {
    FreesOther *f = user_data;
    (void)status;
    if (f->other != NULL) tolk_job_free(f->other);
    f->other = NULL;
    atomic_fetch_add(&f->calls, 1);
}

static void test_callback_frees_another_job_while_the_translator_is_freed(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    if (!translator) return;
    TolkTranslateOptions slow = options(4, 2);
    slow.max_decoding_length = 250;
    slow.min_decoding_length = 200;
    FreesOther first = {NULL, 0}, second = {NULL, 0};
    atomic_init(&first.calls, 0);
    atomic_init(&second.calls, 0);
    TolkJob *busy = NULL, *a = NULL, *b = NULL;
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &slow, NULL, NULL, &busy), TOLK_OK);
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &slow, free_other_on_complete, &first, &a), TOLK_OK);
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &slow, free_other_on_complete, &second, &b), TOLK_OK);
    first.other = b; /* the worker is busy with the first job: neither callback has run */
    tolk_translator_free(translator); /* hung when a's callback waited for b */
    CHECK(atomic_load(&first.calls) == 1 && atomic_load(&second.calls) == 1);
    CHECK_STATUS(tolk_job_wait(a), TOLK_ERROR_CANCELLED);
    tolk_job_free(a);
    tolk_job_free(busy);
}

typedef struct {
    size_t stop_after; /* the callback ends a sentence after this many tokens (0 = never) */
    int events, ends, order_errors;
    size_t next_step[SENTENCES];
    char text[256];
} TokenLog;

static bool on_token(void *user_data, const TolkTokenEvent *e) {
    TokenLog *log = user_data; /* inter_threads 1: one worker calls, no lock needed */
    log->events++;
    if (e->struct_size < sizeof(TolkTokenEvent) || e->token == NULL || e->index >= SENTENCES) {
        log->order_errors++;
        return true;
    }
    if (e->step != log->next_step[e->index]) log->order_errors++;
    log->next_step[e->index] = e->step + 1;
    bool go_on = log->stop_after == 0 || e->step + 1 < log->stop_after;
    if (e->is_last || !go_on) log->ends++;
    if (e->text != NULL && e->text_length < sizeof log->text) {
        memcpy(log->text, e->text, e->text_length);
        log->text[e->text_length] = '\0';
    }
    return go_on;
}

static void test_token_streaming(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    if (!translator) return;
    TokenLog log;
    memset(&log, 0, sizeof log);
    log.stop_after = 3;
    TolkTranslateOptions o = options(1, 8);
    o.on_token = on_token;
    o.on_token_user_data = &log;
    TolkResult *r = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, &r), TOLK_OK);
    int nonempty = 0;
    for (size_t i = 0; i < SENTENCES; i++) {
        const char *const *tokens;
        size_t n = 0;
        CHECK_STATUS(tolk_result_hypothesis(r, i, 0, &tokens, &n, NULL), TOLK_OK);
        if (LENGTHS[i] > 0) {
            nonempty++;
            CHECK(n <= 3); /* the callback ended it (the end token is not in the result) */
        }
    }
    CHECK(log.order_errors == 0 && log.ends == nonempty && log.events >= nonempty);
    tolk_result_free(r);

    o.beam_size = 2; /* streaming needs greedy search */
    CHECK_STATUS(tolk_translate_batch(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, &r), TOLK_ERROR_INVALID_ARGUMENT);

    /* Text calls: the event carries the sentence's text so far. */
    memset(&log, 0, sizeof log);
    o.beam_size = 1;
    const char *texts[] = {"Hello world.", "The cat sat on the mat."};
    TolkJob *job = NULL;
    CHECK_STATUS(tolk_translate_text_async(translator, texts, NULL, 2, &o, NULL, NULL, NULL, &job), TOLK_OK);
    TolkTextResult *tr = NULL;
    CHECK_STATUS(tolk_job_text_result(job, &tr), TOLK_OK);
    CHECK(tolk_text_result_count(tr) == 2);
    CHECK(log.events > 0 && log.order_errors == 0 && log.ends == 2 && strlen(log.text) > 0);
    tolk_text_result_free(tr);
    tolk_job_free(job);
    tolk_translator_free(translator);
}

static void test_text_job_equals_blocking_call(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 2);
    if (!translator) return;
    const char *texts[] = {"Hello world. How are you?", "", "A quick brown fox.\nThe dog sat on the log!"};
    TolkTextResult *expected = NULL, *got = NULL;
    CHECK_STATUS(tolk_translate_text_batch(translator, texts, NULL, 3, NULL, NULL, &expected), TOLK_OK);
    TolkJob *job = NULL;
    CHECK_STATUS(tolk_translate_text_async(translator, texts, NULL, 3, NULL, NULL, NULL, NULL, &job), TOLK_OK);
    CHECK_STATUS(tolk_job_wait(job), TOLK_OK);
    TolkResult *wrong = NULL;
    CHECK_STATUS(tolk_job_result(job, &wrong), TOLK_ERROR_INVALID_ARGUMENT); /* a text job */
    CHECK_STATUS(tolk_job_text_result(job, &got), TOLK_OK);
    for (size_t i = 0; expected && got && i < 3; i++)
        CHECK(strcmp(tolk_text_result_text(expected, i, NULL), tolk_text_result_text(got, i, NULL)) == 0);
    tolk_text_result_free(expected);
    tolk_text_result_free(got);
    tolk_job_free(job);
    tolk_translator_free(translator);
}

/* A blocking call on the translator from its own on_complete is refused (it would wait for
 * the worker it runs on); tolk_job_free returns after on_complete has returned. */
typedef struct {
    const TolkTranslator *translator;
    atomic_int nested_status;
    atomic_int returned;
} Reentrant;

static void reentrant_on_complete(void *user_data, TolkStatus status) {
    Reentrant *r = user_data;
    (void)status;
    TolkTranslateOptions o = options(1, 5);
    TolkResult *nested = NULL;
    TolkStatus s = tolk_translate_batch(r->translator, SOURCE, LENGTHS, 2, NULL, NULL, &o, &nested);
    if (s == TOLK_OK) tolk_result_free(nested);
    atomic_store(&r->nested_status, (int)s);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    atomic_store(&r->returned, 1);
}

static void test_blocking_calls_from_callbacks(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    if (!translator) return;
    TolkTranslateOptions o = options(1, 5);
    for (int round = 0; round < 3; round++) {
        Reentrant r = {translator, -1, 0};
        atomic_init(&r.nested_status, -1);
        atomic_init(&r.returned, 0);
        TolkJob *job = NULL;
        CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, reentrant_on_complete, &r, &job), TOLK_OK);
        CHECK_STATUS(tolk_job_wait(job), TOLK_OK);
        tolk_job_free(job);
        CHECK(atomic_load(&r.returned) == 1);
        CHECK(atomic_load(&r.nested_status) == TOLK_ERROR_INVALID_ARGUMENT);
    }
    tolk_translator_free(translator);
}

/* tolk_job_free from the job's own on_token callback cancels it and returns at once
 * (waiting there for the job to end would wait for itself); the completion callback still
 * comes, once. */
typedef struct {
    _Atomic(TolkJob *) job;
    atomic_int freed;
    Completion done;
} SelfFreeing;

static bool free_on_token(void *user_data, const TolkTokenEvent *e) {
    SelfFreeing *s = user_data;
    (void)e;
    if (atomic_load(&s->freed)) return true; /* the step's other sentences */
    /* The submit call stores the handle once it returns: wait for it (bounded). */
    struct timespec pause = {0, 1000 * 1000};
    for (int i = 0; i < 5000 && atomic_load(&s->job) == NULL; i++) nanosleep(&pause, NULL);
    TolkJob *job = atomic_exchange(&s->job, NULL);
    if (job != NULL) {
        tolk_job_free(job);
        atomic_store(&s->freed, 1);
    }
    return true;
}

static void test_free_from_on_token(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    if (!translator) return;
    for (int round = 0; round < 3; round++) {
        SelfFreeing s;
        atomic_init(&s.job, NULL);
        atomic_init(&s.freed, 0);
        atomic_init(&s.done.calls, 0);
        atomic_init(&s.done.last_status, -1);
        TolkTranslateOptions o = options(1, 5);
        o.on_token = free_on_token;
        o.on_token_user_data = &s;
        TolkJob *job = NULL;
        CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, SENTENCES, NULL, NULL, &o, on_complete, &s.done, &job), TOLK_OK);
        atomic_store(&s.job, job);
        struct timespec pause = {0, 5 * 1000 * 1000};
        for (int i = 0; i < 2000 && atomic_load(&s.done.calls) == 0; i++) nanosleep(&pause, NULL);
        CHECK(atomic_load(&s.freed) == 1);
        CHECK(atomic_load(&s.done.calls) == 1);
        CHECK(atomic_load(&s.done.last_status) == TOLK_ERROR_CANCELLED);
        /* The translator still works, and frees with nothing pending. */
        TolkResult *r = NULL;
        TolkTranslateOptions plain = options(1, 5);
        CHECK_STATUS(tolk_translate_batch(translator, SOURCE, LENGTHS, 2, NULL, NULL, &plain, &r), TOLK_OK);
        tolk_result_free(r);
    }
    tolk_translator_free(translator);
}

static void test_null_pointers(const TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    TolkJob *job = (TolkJob *)1;
    CHECK_STATUS(tolk_translate_batch_async(NULL, SOURCE, LENGTHS, 1, NULL, NULL, NULL, NULL, NULL, &job), TOLK_ERROR_NULL_POINTER);
    CHECK(job == NULL);
    CHECK_STATUS(tolk_translate_batch_async(translator, SOURCE, LENGTHS, 1, NULL, NULL, NULL, NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translate_text_async(translator, NULL, NULL, 1, NULL, NULL, NULL, NULL, &job), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_job_wait(NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_job_progress(NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_job_result(NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK(!tolk_job_is_done(NULL) && !tolk_job_wait_for(NULL, 0));
    tolk_job_cancel(NULL);
    tolk_job_free(NULL);
    /* An empty batch ends at once; its callback runs before the submit returns. */
    Completion c;
    atomic_init(&c.calls, 0);
    atomic_init(&c.last_status, -1);
    CHECK_STATUS(tolk_translate_batch_async(translator, NULL, NULL, 0, NULL, NULL, NULL, on_complete, &c, &job), TOLK_OK);
    CHECK(tolk_job_is_done(job) && atomic_load(&c.calls) == 1);
    tolk_job_free(job);
    tolk_translator_free(translator);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: async_test MODEL_DIR\n");
        return 2;
    }
    make_source();
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(argv[1], &model), TOLK_OK);
    if (model == NULL) return finish("async_test");
    test_jobs_from_many_threads(model);
    test_polling_and_cancel(model);
    test_free_translator_with_jobs_in_flight(model);
    test_token_streaming(model);
    test_text_job_equals_blocking_call(model);
    test_blocking_calls_from_callbacks(model);
    test_free_from_on_token(model);
    test_callback_frees_another_job_while_the_translator_is_freed(model);
    test_null_pointers(model);
    tolk_model_free(model);
    return finish("async_test");
}
