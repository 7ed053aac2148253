/*
 * A progress callback for the C API tests that records what it saw and checks every call
 * against the contract: on the thread that made the translation call, done non-decreasing
 * and at most total, total fixed. Shared by api_test.c (tokens) and text_test.c (text).
 */
#ifndef TOLK_FFI_PROGRESS_H
#define TOLK_FFI_PROGRESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define MAX_CALLS 256
typedef struct ProgressLog {
    pthread_t thread; /* the calling thread */
    size_t cancel_at; /* return false on this call (1 = the first); 0 = never */
    size_t calls;
    size_t done[MAX_CALLS];
    size_t total;
    int violations; /* wrong thread, done decreasing or past total, total changing */
} ProgressLog;

static ProgressLog progress_log(size_t cancel_at) {
    ProgressLog log;
    memset(&log, 0, sizeof log);
    log.thread = pthread_self();
    log.cancel_at = cancel_at;
    return log;
}

static bool on_progress(void *user_data, size_t done, size_t total) {
    ProgressLog *log = user_data;
    if (!pthread_equal(pthread_self(), log->thread)) log->violations++;
    if (done > total || (log->calls > 0 && (done < log->done[(log->calls - 1) % MAX_CALLS] || total != log->total)))
        log->violations++;
    log->done[log->calls % MAX_CALLS] = done;
    log->total = total;
    log->calls++;
    return log->cancel_at == 0 || log->calls < log->cancel_at;
}

/* The `done` of the last call (0 before any). */
static size_t last_done(const ProgressLog *log) {
    return log->calls ? log->done[(log->calls - 1) % MAX_CALLS] : 0;
}

#endif
