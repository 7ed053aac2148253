/*
 * desktop: the way a desktop translator embeds Tolk, reduced to a terminal program.
 *
 *   desktop MODEL_DIR [FILE]      (translates FILE, or stdin without one)
 *
 * It prints the translation, then the aligned source/target sentence pairs. An app would
 * do the same with widgets:
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
 * 4. Free everything on exit.
 *
 * Build: make -C examples-c (after cargo build --release).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tolk.h"

/* A translation request: filled in by the UI, completed by the worker. */
typedef struct Request {
    char *text;             /* UTF-8 source, owned by the request */
    size_t length;          /* its length in bytes */
    TolkTextResult *result; /* set by the worker on success */
    char error[512];        /* set by the worker on failure */
    bool done;
    struct Request *next;   /* queue link */
} Request;

/* The worker's queue. One mutex guards every field and each request's `done`. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;     /* worker: a request arrived, or stop */
    pthread_cond_t finished; /* UI: a request is done */
    Request *head, *tail;
    bool stop;
    const TolkTranslator *translator;
} Worker;

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

        TolkTranslateOptions opts = tolk_translate_options_default(); /* beam 2 */
        TolkTextOptions text_opts = tolk_text_options_default();     /* sentences */
        TolkTextResult *result = NULL;
        char error[sizeof req->error] = "";
        const char *texts[1] = {req->text};
        if (tolk_translate_text_batch(w->translator, texts, &req->length, 1, &opts, &text_opts, &result) != TOLK_OK)
            /* tolk_last_error() is per thread: copy it for the UI thread now. */
            snprintf(error, sizeof error, "%s", tolk_last_error());

        pthread_mutex_lock(&w->lock);
        req->result = result;
        memcpy(req->error, error, sizeof error);
        req->done = true;
        pthread_cond_broadcast(&w->finished);
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

/* UI side: one turn of the event loop. Waits at most one frame (16 ms) for the request;
 * a real app would instead get an event posted by the worker (g_idle_add, PostMessage,
 * QMetaObject::invokeMethod) and repaint, handle input, animate a spinner meanwhile. */
static bool poll_done(Worker *w, Request *req) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_nsec += 16 * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->lock);
    if (!req->done) pthread_cond_timedwait(&w->finished, &w->lock, &deadline);
    bool done = req->done;
    pthread_mutex_unlock(&w->lock);
    return done;
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

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: desktop MODEL_DIR [FILE]\n");
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

    Worker w = {.head = NULL, .tail = NULL, .stop = false, .translator = translator};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.wake, NULL);
    pthread_cond_init(&w.finished, NULL);
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, &w) != 0) {
        fprintf(stderr, "[error dialog] Cannot start the translation thread\n");
        free(text);
        tolk_translator_free(translator);
        return 1;
    }

    /* The user pressed "Translate": queue the document and keep the UI responsive. */
    Request req = {.text = text, .length = length};
    submit(&w, &req);
    unsigned frames = 0;
    while (!poll_done(&w, &req)) frames++; /* repaint, spinner, input... */

    int status = 0;
    if (req.result != NULL) {
        show(text, req.result);
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
    pthread_cond_destroy(&w.finished);
    pthread_cond_destroy(&w.wake);
    pthread_mutex_destroy(&w.lock);
    tolk_text_result_free(req.result);
    tolk_translator_free(translator);
    free(text);
    return status;
}
