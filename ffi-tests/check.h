/*
 * Check macros shared by the C API tests: a failed check prints where and why (with
 * tolk_last_error()) and counts, so that one run reports every failure.
 */
#ifndef TOLK_FFI_CHECK_H
#define TOLK_FFI_CHECK_H

#include <stdio.h>
#include <string.h>

#include "tolk.h"

static int failures = 0;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__,     \
                    __LINE__, #cond, tolk_last_error());                                \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* Checks a status; every failing call must also leave a message in tolk_last_error(). */
#define CHECK_STATUS(expr, expected)                                                    \
    do {                                                                                \
        TolkStatus s_ = (expr);                                                         \
        if (s_ != (expected)) {                                                         \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s); last error: %s\n", \
                    __FILE__, __LINE__, #expr, (int)s_, tolk_status_string(s_),         \
                    (int)(expected), tolk_status_string(expected), tolk_last_error());  \
            failures++;                                                                 \
        } else if (s_ != TOLK_OK && tolk_last_error()[0] == '\0') {                     \
            fprintf(stderr, "%s:%d: %s failed without a last error message\n",         \
                    __FILE__, __LINE__, #expr);                                         \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* Ends main: the exit status the Rust test runner asserts. */
static int finish(const char *name) {
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

#endif
