/*
 * desktop: the way a desktop translator embeds Tolk, reduced to a terminal program.
 *
 *   desktop [--batch-size N] [--cancel-after N] MODEL_DIR [FILE]
 *                                 (translates FILE, or stdin without one)
 *
 * It prints the translation, then the aligned source/target sentence pairs; its status bar
 * ("translating... 32/120 sentences") goes to stderr. --batch-size sets max_batch_size
 * (sentences per batch, hence per progress step; default 32). --cancel-after N presses the
 * Stop button once the status bar shows N or more sentences done. An app would do the same
 * with widgets:
 *
 * 1. Load the model once at startup; when that fails, show tolk_last_error() in a dialog.
 * 2. Translate on a worker thread so the UI thread never blocks: the UI posts requests to
 *    a small queue (mutex + condition variable) and keeps running its event loop; the
 *    worker translates and marks the request done.
 * 3. Translate whole documents with tolk_translate_text_batch (one text, with its length:
 *    a document may hold NUL bytes): the library cuts them into sentences, keeps
 *    paragraphs, blank lines and spacing, and returns every sentence's byte ranges in the
 *    source and in the translation: what hover highlighting needs. A sentence too long for
 *    the model is translated in several parts that name the same source sentence; the
 *    app highlights them together.
 * 4. Show progress and offer a Stop button: the library calls a progress callback on the
 *    worker thread after each batch. The callback posts the count to the UI state (under
 *    the queue's mutex, waking the UI) and returns whether to go on: false once the UI
 *    has set the request's cancel flag, and the call then ends with TOLK_ERROR_CANCELLED
 *    and no result, which the UI shows as "stopped", not as an error. The callback must be
 *    quick and must not call back into the UI toolkit from the worker thread.
 * 5. Free everything on exit.
 *
 * Exit status: 0 when translated or stopped, 1 on errors (shown as dialogs), 2 on bad usage.
 *
 * Build: make -C examples-c (after cargo build --release).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tolk.h"

/* A translation request: filled in by the UI, completed by the worker. */
typedef struct Request {
    char *text;             /* UTF-8 source, owned by the request */
    size_t length;          /* its length in bytes */
    uint32_t batch_size;    /* max_batch_size (0: the library's default) */
    TolkTextResult *result; /* set by the worker on success */
    char error[512];        /* set by the worker on failure */
    bool done;
    bool cancelled;         /* set by the worker: stopped by the cancel flag */
    /* Progress, posted by the worker's callback; the cancel flag, set by the UI. */
    size_t sentences_done, sentences_total;
    size_t sentences_shown; /* what the UI last painted (--cancel-after handshake) */
    bool cancel;
    struct Request *next;   /* queue link */
} Request;

/* The worker's queue. One mutex guards every field and each request's `done`, progress and
 * cancel flag. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;    /* worker: a request arrived, or stop */
    pthread_cond_t changed; /* UI: a request progressed or is done; worker: the UI painted */
    Request *head, *tail;
    bool stop;
    /* Demo only (--cancel-after): the worker waits for the UI to paint each progress step,
     * so that the Stop button is pressed at a reproducible point. An app never waits. */
    bool paint_every_step;
    const TolkTranslator *translator;
} Worker;

/* What the progress callback needs: the user data of one translation call. */
typedef struct {
    Worker *worker;
    Request *request;
} ProgressTarget;

/* The progress callback: runs on the worker thread, inside tolk_translate_text_batch,
 * after each batch. It posts the count to the UI state and answers the Stop button. */
static bool on_progress(void *user_data, size_t done, size_t total) {
    ProgressTarget *target = user_data;
    Worker *w = target->worker;
    Request *req = target->request;
    pthread_mutex_lock(&w->lock);
    req->sentences_done = done;
    req->sentences_total = total;
    pthread_cond_broadcast(&w->changed); /* an app: g_idle_add / PostMessage / invokeMethod */
    while (w->paint_every_step && req->sentences_shown < done && !req->cancel)
        pthread_cond_wait(&w->changed, &w->lock);
    bool go_on = !req->cancel;
    pthread_mutex_unlock(&w->lock);
    return go_on;
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->head == NULL && !w->stop) pthread_cond_wait(&w->wake, &w->lock);
        if (w->head == NULL) break; /* stop, and nothing left to do */
        Request *req = w->head;
        w->head = req->next;
        if (w->head == NULL) w->tail = NULL;
        pthread_mutex_unlock(&w->lock); /* never translate while holding the lock */

        ProgressTarget target = {w, req};
        TolkTranslateOptions opts = tolk_translate_options_default(); /* beam 2 */
        opts.max_batch_size = req->batch_size;
        opts.progress = on_progress;
        opts.progress_user_data = &target;
        TolkTextOptions text_opts = tolk_text_options_default(); /* sentences */
        TolkTextResult *result = NULL;
        char error[sizeof req->error] = "";
        const char *texts[1] = {req->text};
        TolkStatus status = tolk_translate_text_batch(w->translator, texts, &req->length, 1, &opts, &text_opts, &result);
        if (status != TOLK_OK && status != TOLK_ERROR_CANCELLED)
            /* tolk_last_error() is per thread: copy it for the UI thread now. */
            snprintf(error, sizeof error, "%s", tolk_last_error());

        pthread_mutex_lock(&w->lock);
        req->result = result; /* NULL when cancelled */
        req->cancelled = status == TOLK_ERROR_CANCELLED;
        memcpy(req->error, error, sizeof error);
        req->done = true;
        pthread_cond_broadcast(&w->changed);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* UI side: queue a request (returns at once). */
static void submit(Worker *w, Request *req) {
    pthread_mutex_lock(&w->lock);
    req->next = NULL;
    if (w->tail) w->tail->next = req;
    else w->head = req;
    w->tail = req;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
}

/* What the UI paints: a snapshot of a request's state, taken under the lock. */
typedef struct {
    bool done;
    size_t sentences_done, sentences_total;
} View;

/* UI side: one turn of the event loop. Waits at most one frame (16 ms) for news of the
 * request (progress or done) and returns its state; a real app would instead get an event
 * posted by the worker (g_idle_add, PostMessage, QMetaObject::invokeMethod) and repaint,
 * handle input, animate a spinner meanwhile. */
static View poll_request(Worker *w, Request *req, size_t shown) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_nsec += 16 * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->lock);
    if (!req->done && req->sentences_done == shown) pthread_cond_timedwait(&w->changed, &w->lock, &deadline);
    View view = {req->done, req->sentences_done, req->sentences_total};
    pthread_mutex_unlock(&w->lock);
    return view;
}

/* UI side: the progress in the view is painted (acknowledged to a waiting worker). */
static void painted(Worker *w, Request *req, size_t sentences) {
    pthread_mutex_lock(&w->lock);
    req->sentences_shown = sentences;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

/* UI side: the Stop button. The worker's callback sees the flag after the batch it is
 * translating, and the call returns TOLK_ERROR_CANCELLED. */
static void press_stop(Worker *w, Request *req) {
    pthread_mutex_lock(&w->lock);
    req->cancel = true;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

/* Reads all of `f` into a buffer (NUL-terminated for convenience, but NUL bytes inside are
 * kept: *out_length is the length read). NULL on error. */
static char *read_all(FILE *f, size_t *out_length) {
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf != NULL) {
        len += fread(buf + len, 1, cap - len - 1, f);
        if (ferror(f)) break;
        if (feof(f)) {
            buf[len] = '\0';
            *out_length = len;
            return buf;
        }
        char *grown = len + 1 == cap ? realloc(buf, cap *= 2) : buf;
        if (grown == NULL) break;
        buf = grown;
    }
    free(buf);
    return NULL;
}

/* Part `part` of the translation (its ranges and source sentence). */
static TolkSentenceInfo part_info(const TolkTextResult *r, size_t part) {
    TolkSentenceInfo info = tolk_sentence_info_default();
    if (tolk_text_result_sentence(r, 0, part, &info) != TOLK_OK)
        fprintf(stderr, "desktop: part %zu: %s\n", part, tolk_last_error());
    return info;
}

/* The part whose target range holds byte `offset` of the translation: what a hover over the
 * translation looks up (binary search: the ranges are in order). */
static bool part_at(const TolkTextResult *r, size_t offset, size_t *found) {
    size_t lo = 0, hi = tolk_text_result_num_sentences(r, 0);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        TolkSentenceInfo info = part_info(r, mid);
        if (offset < info.target_begin) hi = mid;
        else if (offset >= info.target_end) lo = mid + 1;
        else {
            *found = mid;
            return true;
        }
    }
    return false; /* between sentences: spaces or line breaks */
}

/* Shows the result: the translation, then each source sentence beside its translation. A
 * sentence wrapped into several parts is one pair: from its first part's start to its last
 * part's end, in the source and in the translation. */
static void show(const char *source, const TolkTextResult *r) {
    size_t length = 0;
    const char *target = tolk_text_result_text(r, 0, &length);
    fwrite(target, 1, length, stdout);
    if (length > 0 && target[length - 1] != '\n') putchar('\n');
    size_t parts = tolk_text_result_num_sentences(r, 0), sentences = 0;
    for (size_t i = 0; i < parts; i++)
        sentences += i == 0 || part_info(r, i).sentence != part_info(r, i - 1).sentence;
    printf("--- %zu aligned sentences ---\n", sentences);
    size_t number = 0;
    for (size_t first = 0, last; first < parts; first = last + 1) {
        TolkSentenceInfo a = part_info(r, first), z = a;
        for (last = first; last + 1 < parts && part_info(r, last + 1).sentence == a.sentence; last++)
            z = part_info(r, last + 1);
        size_t sb = a.source_begin, se = z.source_end, tb = a.target_begin, te = z.target_end;
        printf("%zu. source [%zu, %zu): ", ++number, sb, se);
        fwrite(source + sb, 1, se - sb, stdout);
        printf("\n   target [%zu, %zu): ", tb, te);
        fwrite(target + tb, 1, te - tb, stdout);
        putchar('\n');
        if (last > first) printf("   (a long sentence, translated in %zu parts)\n", last - first + 1);
        /* Hovering anywhere in a part's translation highlights its whole source sentence. */
        for (size_t p = first; p <= last; p++) {
            TolkSentenceInfo info = part_info(r, p);
            size_t hit = 0;
            if (info.target_end > info.target_begin &&
                (!part_at(r, info.target_begin + (info.target_end - info.target_begin) / 2, &hit) ||
                 part_info(r, hit).sentence != a.sentence))
                fprintf(stderr, "desktop: hover lookup failed for sentence %zu (part %zu)\n", number, p + 1);
        }
    }
}

/* Parses a non-negative integer option value. */
static bool parse_count(const char *s, unsigned long *out) {
    char *end = NULL;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    *out = strtoul(s, &end, 10);
    return errno == 0 && *end == '\0';
}

int main(int argc, char **argv) {
    unsigned long batch_size = 0, cancel_after = 0;
    bool cancel_set = false;
    int arg = 1;
    for (; arg + 1 < argc && argv[arg][0] == '-' && argv[arg][1] == '-'; arg += 2) {
        unsigned long *value = !strcmp(argv[arg], "--batch-size")     ? &batch_size
                               : !strcmp(argv[arg], "--cancel-after") ? &cancel_after
                                                                      : NULL;
        if (value == NULL || !parse_count(argv[arg + 1], value) || *value > UINT32_MAX) {
            fprintf(stderr, "desktop: bad option %s %s\n", argv[arg], argv[arg + 1]);
            return 2;
        }
        cancel_set = cancel_set || value == &cancel_after;
    }
    argc -= arg - 1;
    argv += arg - 1;
    if (argc < 2 || argc > 3 || argv[1][0] == '-') {
        fprintf(stderr, "usage: desktop [--batch-size N] [--cancel-after N] MODEL_DIR [FILE]\n");
        return 2;
    }
    /* Startup: load the model once. It is immutable and may be shared by any number of
     * translators and threads; a translator may be used by several threads at once. */
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
    if (tolk_model_load(argv[1], &model) != TOLK_OK || tolk_translator_new(model, NULL, &translator) != TOLK_OK) {
        fprintf(stderr, "[error dialog] The translation model could not be loaded:\n%s\n", tolk_last_error());
        tolk_model_free(model);
        return 1;
    }
    tolk_model_free(model); /* the translator keeps what it needs */

    FILE *in = argc == 3 ? fopen(argv[2], "rb") : stdin;
    size_t length = 0;
    char *text = in ? read_all(in, &length) : NULL;
    int read_errno = errno;
    if (in && in != stdin) fclose(in);
    if (text == NULL) {
        fprintf(stderr, "[error dialog] Cannot read %s: %s\n", argc == 3 ? argv[2] : "stdin", strerror(read_errno));
        tolk_translator_free(translator);
        return 1;
    }

    Worker w = {.head = NULL, .tail = NULL, .stop = false, .paint_every_step = cancel_set, .translator = translator};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.wake, NULL);
    pthread_cond_init(&w.changed, NULL);
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, &w) != 0) {
        fprintf(stderr, "[error dialog] Cannot start the translation thread\n");
        free(text);
        tolk_translator_free(translator);
        return 1;
    }

    /* The user pressed "Translate": queue the document and keep the UI responsive. */
    Request req = {.text = text, .length = length, .batch_size = (uint32_t)batch_size};
    submit(&w, &req);
    unsigned frames = 0;
    size_t shown = 0;
    bool stop_pressed = false;
    for (;;) {
        View view = poll_request(&w, &req, shown);
        bool repaint = view.sentences_done != shown;
        if (repaint) { /* the status bar */
            shown = view.sentences_done;
            fprintf(stderr, "[status bar] translating... %zu/%zu sentences\n", shown, view.sentences_total);
        }
        if (!view.done && cancel_set && !stop_pressed && shown >= cancel_after) {
            fprintf(stderr, "[Stop pressed at %zu/%zu sentences]\n", shown, view.sentences_total);
            press_stop(&w, &req);
            stop_pressed = true;
        }
        if (repaint) painted(&w, &req, shown);
        if (view.done) break;
        frames++; /* spinner, input... */
    }

    int status = 0;
    if (req.result != NULL) {
        show(text, req.result); /* Stop may come too late: the translation is complete */
    } else if (req.cancelled) {
        /* Not an error: the user asked for it. Back to idle, nothing to show. */
        fprintf(stderr, "[status bar] Translation stopped at %zu/%zu sentences\n", req.sentences_done,
                req.sentences_total);
    } else {
        fprintf(stderr, "[error dialog] Translation failed:\n%s\n", req.error);
        status = 1;
    }
    fprintf(stderr, "desktop: the UI ran %u frames while the worker translated\n", frames);

    /* Shutdown: stop the worker after its queue, then free in any order. */
    pthread_mutex_lock(&w.lock);
    w.stop = true;
    pthread_cond_signal(&w.wake);
    pthread_mutex_unlock(&w.lock);
    pthread_join(worker, NULL);
    pthread_cond_destroy(&w.changed);
    pthread_cond_destroy(&w.wake);
    pthread_mutex_destroy(&w.lock);
    tolk_text_result_free(req.result);
    tolk_translator_free(translator);
    free(text);
    return status;
}
