/*
 * C API tests, compiled against include/tolk.h and run by tests/ffi.rs (under valgrind
 * when it is installed). Usage: api_test MODEL_DIR. Exits non-zero on the first failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tolk.h"

static int failures = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__,   \
                    __LINE__, #cond, tolk_last_error());                              \
            failures++;                                                               \
        }                                                                             \
    } while (0)

#define CHECK_STATUS(expr, expected)                                                  \
    do {                                                                              \
        TolkStatus s_ = (expr);                                                       \
        if (s_ != (expected)) {                                                       \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d; last error: %s\n", \
                    __FILE__, __LINE__, #expr, (int)s_, tolk_status_string(s_),       \
                    (int)(expected), tolk_last_error());                              \
            failures++;                                                               \
        }                                                                             \
    } while (0)

static const char *MODEL_DIR;

/* Joins the best hypothesis of example i into buf. */
static void best(const TolkResult *r, size_t i, char *buf, size_t cap) {
    const char *const *tokens = NULL;
    size_t n = 0;
    buf[0] = '\0';
    CHECK_STATUS(tolk_result_hypothesis(r, i, 0, &tokens, &n, NULL), TOLK_OK);
    for (size_t t = 0; t < n; t++) {
        strncat(buf, tokens[t], cap - strlen(buf) - 2);
        strncat(buf, " ", cap - strlen(buf) - 1);
    }
}

static void test_versions(void) {
    CHECK(tolk_abi_version() == TOLK_ABI_VERSION);
    CHECK(strlen(tolk_version()) > 0);
    CHECK(strcmp(tolk_status_string(TOLK_OK), "ok") == 0);
    const char *isa = tolk_cpu_isa();
    CHECK(!strcmp(isa, "scalar") || !strcmp(isa, "avx2") || !strcmp(isa, "avx512"));
}

static void test_null_pointers(void) {
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
    TolkResult *result = NULL;
    CHECK_STATUS(tolk_model_load(NULL, &model), TOLK_ERROR_NULL_POINTER);
    CHECK(strlen(tolk_last_error()) > 0);
    CHECK_STATUS(tolk_model_load(MODEL_DIR, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translator_new(NULL, NULL, &translator), TOLK_ERROR_NULL_POINTER);
    CHECK(translator == NULL);
    CHECK_STATUS(tolk_translate_batch(NULL, NULL, NULL, 0, NULL, NULL, NULL, &result), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_result_hypothesis(NULL, 0, 0, NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK(tolk_result_batch_size(NULL) == 0);
    CHECK(tolk_result_num_hypotheses(NULL, 3) == 0);
    /* Freeing NULL is a no-op. */
    tolk_model_free(NULL);
    tolk_translator_free(NULL);
    tolk_result_free(NULL);
}

static void test_load_errors(void) {
    TolkModel *model = (TolkModel *)0x1; /* must be reset to NULL on failure */
    CHECK_STATUS(tolk_model_load("/nonexistent/tolk/model", &model), TOLK_ERROR_IO);
    CHECK(model == NULL);
    CHECK(strstr(tolk_last_error(), "/nonexistent/tolk/model") != NULL);
}

static void test_translate(TolkModel *model) {
    TolkTranslatorOptions topts = tolk_translator_options_default();
    TolkTranslator *translator = NULL;
    CHECK_STATUS(tolk_translator_new(model, &topts, &translator), TOLK_OK);
    if (translator == NULL) return;

    const char *s0[] = {"w3", "w4", "w5"};
    const char *s1[] = {"w6", "not-in-vocabulary"};
    const char *const *batch[] = {s0, s1, NULL};
    size_t lengths[] = {3, 2, 0};
    TolkTranslateOptions opts = tolk_translate_options_default();
    opts.beam_size = 3;
    opts.num_hypotheses = 2;
    opts.return_scores = true;
    opts.max_decoding_length = 12;
    TolkResult *result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, NULL, NULL, &opts, &result), TOLK_OK);
    CHECK(tolk_result_batch_size(result) == 3);
    for (size_t i = 0; i < 3; i++) {
        CHECK(tolk_result_num_hypotheses(result, i) == 2);
        float previous = INFINITY;
        for (size_t h = 0; h < 2; h++) {
            const char *const *tokens = NULL;
            size_t n = 99;
            float score = NAN;
            CHECK_STATUS(tolk_result_hypothesis(result, i, h, &tokens, &n, &score), TOLK_OK);
            CHECK(n <= 12);
            CHECK(!isnan(score) && score <= previous);
            previous = score;
            for (size_t t = 0; t < n; t++) CHECK(tokens[t] != NULL && strlen(tokens[t]) > 0);
        }
    }
    /* The empty source translates to an empty hypothesis with score 0 (CTranslate2). */
    const char *const *tokens = NULL;
    size_t n = 1;
    float score = 1;
    CHECK_STATUS(tolk_result_hypothesis(result, 2, 0, &tokens, &n, &score), TOLK_OK);
    CHECK(n == 0 && score == 0.0f);
    CHECK_STATUS(tolk_result_hypothesis(result, 3, 0, &tokens, &n, NULL), TOLK_ERROR_OUT_OF_RANGE);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 2, &tokens, &n, NULL), TOLK_ERROR_OUT_OF_RANGE);
    tolk_result_free(result);

    /* Scores are NaN when not requested; NULL options mean defaults; empty batch works. */
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 1, NULL, NULL, NULL, &result), TOLK_OK);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, &score), TOLK_OK);
    CHECK(isnan(score));
    tolk_result_free(result);
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, NULL, NULL, 0, NULL, NULL, NULL, &result), TOLK_OK);
    CHECK(tolk_result_batch_size(result) == 0);
    tolk_result_free(result);

    /* A target prefix starts every hypothesis. */
    const char *p0[] = {"w7", "w8"};
    const char *const *prefix[] = {p0, NULL, NULL};
    size_t prefix_lengths[] = {2, 0, 0};
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, prefix, prefix_lengths, &opts, &result), TOLK_OK);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, NULL), TOLK_OK);
    CHECK(n >= 2 && strcmp(tokens[0], "w7") == 0 && strcmp(tokens[1], "w8") == 0);
    tolk_result_free(result);

    /* Bad options are errors, not crashes. */
    TolkTranslateOptions bad = tolk_translate_options_default();
    bad.beam_size = 0;
    result = (TolkResult *)0x1;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(result == NULL);
    bad = tolk_translate_options_default();
    bad.num_hypotheses = 5;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.struct_size = 0;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.batch_type = 7;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.end_token = "never-seen-token";
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 3, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    const char *const *null_sentence[] = {NULL};
    size_t nonzero[] = {2};
    CHECK_STATUS(tolk_translate_batch(translator, null_sentence, nonzero, 1, NULL, NULL, NULL, &result), TOLK_ERROR_INVALID_ARGUMENT);
    const char *invalid_utf8[] = {"\xff\xfe"};
    const char *const *bad_batch[] = {invalid_utf8};
    size_t one[] = {1};
    CHECK_STATUS(tolk_translate_batch(translator, bad_batch, one, 1, NULL, NULL, NULL, &result), TOLK_ERROR_INVALID_ARGUMENT);
    tolk_translator_free(translator);

    /* Bad translator options. */
    TolkTranslatorOptions t_bad = tolk_translator_options_default();
    t_bad.compute_type = "int3";
    translator = (TolkTranslator *)0x1;
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(translator == NULL);
    t_bad = tolk_translator_options_default();
    t_bad.device = "tpu";
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);
    t_bad = tolk_translator_options_default();
    t_bad.struct_size = 0;
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);
}

typedef struct {
    TolkTranslator *translator;
    char output[4096];
} ThreadJob;

static void *translate_in_thread(void *arg) {
    ThreadJob *job = arg;
    const char *s0[] = {"w3", "w9", "w10", "w4"};
    const char *const *batch[] = {s0};
    size_t lengths[] = {4};
    TolkTranslateOptions opts = tolk_translate_options_default();
    opts.beam_size = 2;
    for (int round = 0; round < 5; round++) {
        TolkResult *result = NULL;
        if (tolk_translate_batch(job->translator, batch, lengths, 1, NULL, NULL, &opts, &result) != TOLK_OK) {
            snprintf(job->output, sizeof job->output, "error: %s", tolk_last_error());
            return NULL;
        }
        best(result, 0, job->output, sizeof job->output);
        tolk_result_free(result);
    }
    return NULL;
}

/* One translator used by 4 threads at once gives the same result everywhere; the model
 * may be freed while a translator still uses it. */
static void test_threads_and_lifetimes(void) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(MODEL_DIR, &model), TOLK_OK);
    TolkTranslator *translator = NULL;
    CHECK_STATUS(tolk_translator_new(model, NULL, &translator), TOLK_OK);
    tolk_model_free(model);
    if (translator == NULL) return;
    ThreadJob jobs[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].translator = translator;
        jobs[i].output[0] = '\0';
        pthread_create(&threads[i], NULL, translate_in_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    for (int i = 1; i < 4; i++) CHECK(strcmp(jobs[0].output, jobs[i].output) == 0);
    CHECK(strncmp(jobs[0].output, "error", 5) != 0);
    tolk_translator_free(translator);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: api_test MODEL_DIR\n");
        return 2;
    }
    MODEL_DIR = argv[1];
    test_versions();
    test_null_pointers();
    test_load_errors();
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(MODEL_DIR, &model), TOLK_OK);
    if (model != NULL) test_translate(model);
    tolk_model_free(model);
    test_threads_and_lifetimes();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("api_test: all checks passed\n");
    return 0;
}
