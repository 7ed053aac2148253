/*
 * C API contract tests: the happy path, NULL pointers, bad options, load errors, out of
 * range reads, ABI versioning of the options structs, object lifetimes, concurrent use
 * of one translator, and the progress callback (reports, cancellation, old struct sizes,
 * threads). Built against include/tolk.h and run by tests/ffi.rs (also under
 * valgrind when it is installed, so every path must free what it allocates).
 *
 *   api_test MODEL_DIR      (MODEL_DIR: ffi-tests/fixtures/tiny)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "progress.h"

static const char *MODEL_DIR;

/* A small batch used throughout: plain, non-ASCII, unknown token, empty. */
static const char *S0[] = {"a", "b", "c"};
static const char *S1[] = {"\xe2\x96\x81\xc3\xa9", "q", "x"}; /* "▁é q x" */
static const char *S2[] = {"m", "not-in-vocabulary", "n"};
static const char *const *BATCH[] = {S0, S1, S2, NULL};
static const size_t LENGTHS[] = {3, 3, 3, 0};
#define BATCH_SIZE 4

/* Joins hypothesis `rank` of `example` as "score|tok tok ..." for comparisons. */
static void describe(const TolkResult *r, size_t example, size_t rank, char *buf, size_t cap) {
    const char *const *tokens = NULL;
    size_t n = 0;
    float score = NAN;
    buf[0] = '\0';
    if (tolk_result_hypothesis(r, example, rank, &tokens, &n, &score) != TOLK_OK) {
        snprintf(buf, cap, "error: %s", tolk_last_error());
        return;
    }
    size_t used = (size_t)snprintf(buf, cap, "%.6f|", score);
    for (size_t t = 0; t < n && used < cap; t++) used += (size_t)snprintf(buf + used, cap - used, t ? " %s" : "%s", tokens[t]);
}

static TolkTranslator *new_translator(const TolkModel *model, uint32_t threads) {
    TolkTranslatorOptions topts = tolk_translator_options_default();
    topts.intra_threads = threads;
    TolkTranslator *translator = NULL;
    CHECK_STATUS(tolk_translator_new(model, &topts, &translator), TOLK_OK);
    return translator;
}

static void test_versions(void) {
    CHECK(tolk_abi_version() == TOLK_ABI_VERSION);
    CHECK(tolk_version() != NULL && strlen(tolk_version()) > 0);
    const char *isa = tolk_cpu_isa();
    CHECK(!strcmp(isa, "scalar") || !strcmp(isa, "avx2") || !strcmp(isa, "avxvnni") || !strcmp(isa, "avx512bw") || !strcmp(isa, "avx512vnni") || !strcmp(isa, "amx"));
    CHECK(strcmp(tolk_status_string(TOLK_OK), "ok") == 0);
    for (int s = TOLK_OK; s <= TOLK_ERROR_CANCELLED; s++) CHECK(strlen(tolk_status_string(s)) > 0);
    CHECK(TOLK_ERROR_CANCELLED == 8 && strcmp(tolk_status_string(TOLK_ERROR_CANCELLED), "cancelled") == 0);
    CHECK(strcmp(tolk_status_string(-1), "unknown status") == 0); /* any int is safe */
    CHECK(strcmp(tolk_status_string(1000), "unknown status") == 0);
}

/* Every entry point rejects NULL where it needs a pointer, and resets its out pointer. */
static void test_null_pointers(TolkModel *model) {
    TolkModel *m = (TolkModel *)&m; /* garbage that a failed call must reset to NULL */
    CHECK_STATUS(tolk_model_load(NULL, &m), TOLK_ERROR_NULL_POINTER);
    CHECK(m == NULL);
    CHECK_STATUS(tolk_model_load(MODEL_DIR, NULL), TOLK_ERROR_NULL_POINTER);

    TolkTranslator *t = (TolkTranslator *)&t;
    CHECK_STATUS(tolk_translator_new(NULL, NULL, &t), TOLK_ERROR_NULL_POINTER);
    CHECK(t == NULL);
    CHECK_STATUS(tolk_translator_new(model, NULL, NULL), TOLK_ERROR_NULL_POINTER);

    TolkTranslator *translator = new_translator(model, 1);
    TolkResult *r = (TolkResult *)&r;
    CHECK_STATUS(tolk_translate_batch(NULL, BATCH, LENGTHS, 1, NULL, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    CHECK(r == NULL);
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, 1, NULL, NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translate_batch(translator, NULL, LENGTHS, 1, NULL, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, NULL, 1, NULL, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    const char *const *prefix[] = {S0};
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, 1, prefix, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    /* A NULL sentence with tokens, or a NULL token, is an invalid argument. */
    const char *const *null_sentence[] = {NULL};
    CHECK_STATUS(tolk_translate_batch(translator, null_sentence, LENGTHS, 1, NULL, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    const char *null_token[] = {"a", NULL};
    const char *const *with_null_token[] = {null_token};
    size_t two[] = {2};
    CHECK_STATUS(tolk_translate_batch(translator, with_null_token, two, 1, NULL, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(r == NULL);

    const char *const *tokens = NULL;
    size_t n = 0;
    float score = 0;
    CHECK_STATUS(tolk_result_hypothesis(NULL, 0, 0, &tokens, &n, &score), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, 1, NULL, NULL, NULL, &r), TOLK_OK);
    CHECK_STATUS(tolk_result_hypothesis(r, 0, 0, NULL, &n, &score), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_result_hypothesis(r, 0, 0, &tokens, NULL, &score), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_result_hypothesis(r, 0, 0, &tokens, &n, NULL), TOLK_OK); /* the score is optional */
    tolk_result_free(r);
    tolk_translator_free(translator);

    CHECK(tolk_result_batch_size(NULL) == 0);
    CHECK(tolk_result_num_hypotheses(NULL, 0) == 0);
    tolk_model_free(NULL); /* no-ops */
    tolk_translator_free(NULL);
    tolk_result_free(NULL);
}

/* Copies `name` from the fixture into `dir`, keeping only the first `keep` bytes (or all). */
static void copy_file(const char *dir, const char *name, long keep) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", MODEL_DIR, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    CHECK(in != NULL && out != NULL);
    if (in != NULL && out != NULL) {
        int c;
        for (long i = 0; (keep < 0 || i < keep) && (c = getc(in)) != EOF; i++) putc(c, out);
    }
    if (in) fclose(in);
    if (out) fclose(out);
}

static void remove_file(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void test_load_errors(void) {
    TolkModel *model = (TolkModel *)&model;
    CHECK_STATUS(tolk_model_load("/nonexistent/tolk/model", &model), TOLK_ERROR_IO);
    CHECK(model == NULL);
    CHECK(strstr(tolk_last_error(), "/nonexistent/tolk/model") != NULL);

    /* A directory without model.bin, then one with a truncated model.bin. */
    char dir[] = "/tmp/tolk-api-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    copy_file(dir, "config.json", -1);
    copy_file(dir, "shared_vocabulary.json", -1);
    CHECK_STATUS(tolk_model_load(dir, &model), TOLK_ERROR_IO);
    copy_file(dir, "model.bin", 1000);
    CHECK_STATUS(tolk_model_load(dir, &model), TOLK_ERROR_INVALID_MODEL);
    CHECK(model == NULL);
    remove_file(dir, "model.bin");
    remove_file(dir, "config.json");
    remove_file(dir, "shared_vocabulary.json");
    rmdir(dir);

    /* A directory whose name is not UTF-8 (legal on Linux) loads, its tokenizer named by
       such a path too. */
    char odd[64];
    snprintf(odd, sizeof odd, "/tmp/tolk-api-test-\xff\xfe-%d", (int)getpid());
    CHECK(mkdir(odd, 0700) == 0);
    copy_file(odd, "config.json", -1);
    copy_file(odd, "shared_vocabulary.json", -1);
    copy_file(odd, "model.bin", -1);
    copy_file(odd, "sentencepiece.model", -1);
    char spm[128];
    snprintf(spm, sizeof spm, "%s/sentencepiece.model", odd);
    TolkModelOptions mo = tolk_model_options_default();
    mo.source_tokenizer = spm;
    CHECK_STATUS(tolk_model_load_with_options(odd, &mo, &model), TOLK_OK);
    tolk_model_free(model);
    remove_file(odd, "model.bin");
    remove_file(odd, "config.json");
    remove_file(odd, "shared_vocabulary.json");
    remove_file(odd, "sentencepiece.model");
    rmdir(odd);
}

/* Clearly invalid options are errors with a message, never crashes. */
static void test_bad_options(TolkModel *model) {
    TolkTranslator *translator = (TolkTranslator *)&translator;
    TolkTranslatorOptions t_bad = tolk_translator_options_default();
    t_bad.compute_type = "int3";
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(translator == NULL);
    t_bad = tolk_translator_options_default();
    t_bad.device = "tpu";
    TolkStatus s = tolk_translator_new(model, &t_bad, &translator);
    CHECK(s == TOLK_ERROR_INVALID_ARGUMENT || s == TOLK_ERROR_UNSUPPORTED);
    CHECK(strlen(tolk_last_error()) > 0 && translator == NULL);
    t_bad = tolk_translator_options_default();
    t_bad.kv_cache_type = "float8";
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(tolk_last_error(), "kv_cache_type") != NULL && translator == NULL);
    t_bad = tolk_translator_options_default();
    t_bad.struct_size = 0;
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);
    t_bad = tolk_translator_options_default();
    t_bad.struct_size += 64; /* from a newer header than the library */
    CHECK_STATUS(tolk_translator_new(model, &t_bad, &translator), TOLK_ERROR_INVALID_ARGUMENT);

    translator = new_translator(model, 1);
    TolkResult *result = (TolkResult *)&result;
    TolkTranslateOptions bad = tolk_translate_options_default();
    bad.beam_size = 0;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(result == NULL);
    bad = tolk_translate_options_default();
    bad.num_hypotheses = 0;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.num_hypotheses = bad.beam_size + 1; /* more hypotheses than the beam holds */
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.max_decoding_length = 0;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.struct_size = 0;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.struct_size = (uint32_t)offsetof(TolkTranslateOptions, beam_size) + 2; /* ends inside beam_size */
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.struct_size = (uint32_t)offsetof(TolkTranslateOptions, max_input_length); /* an older header: fine */
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_OK);
    tolk_result_free(result);
    result = NULL;
    bad = tolk_translate_options_default();
    bad.batch_type = 7;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.end_token = "never-seen-token";
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_translate_options_default();
    bad.kv_cache_type = "float8";
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &bad, &result), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(tolk_last_error(), "kv_cache_type") != NULL);
    const char *invalid_utf8[] = {"\xff\xfe"};
    const char *const *bad_batch[] = {invalid_utf8};
    size_t one[] = {1};
    CHECK_STATUS(tolk_translate_batch(translator, bad_batch, one, 1, NULL, NULL, NULL, &result), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(result == NULL);
    tolk_translator_free(translator);
}

/* The happy path: beam search with n-best and scores, read back, out of range reads. */
static void test_translate(TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    TolkTranslateOptions opts = tolk_translate_options_default();
    opts.beam_size = 3;
    opts.num_hypotheses = 2;
    opts.return_scores = true;
    opts.max_decoding_length = 12;
    TolkResult *result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_OK);
    CHECK(tolk_result_batch_size(result) == BATCH_SIZE);
    for (size_t i = 0; i < BATCH_SIZE; i++) {
        CHECK(tolk_result_num_hypotheses(result, i) == 2);
        float previous = INFINITY;
        for (size_t h = 0; h < 2; h++) {
            const char *const *tokens = NULL;
            size_t n = 99;
            float score = NAN;
            CHECK_STATUS(tolk_result_hypothesis(result, i, h, &tokens, &n, &score), TOLK_OK);
            CHECK(n <= 12);
            CHECK(!isnan(score) && score <= 0 && score <= previous); /* best first */
            previous = score;
            for (size_t t = 0; t < n; t++) CHECK(tokens[t] != NULL && strlen(tokens[t]) > 0);
        }
    }
    /* Non-empty sources give non-empty translations (the fixture never ends at once)... */
    const char *const *tokens = NULL;
    size_t n = 0;
    float score = 1;
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, &score), TOLK_OK);
    CHECK(n > 0);
    /* ...and the empty source an empty hypothesis with score 0, as in CTranslate2. */
    CHECK_STATUS(tolk_result_hypothesis(result, 3, 0, &tokens, &n, &score), TOLK_OK);
    CHECK(n == 0 && score == 0.0f);
    CHECK(tolk_result_num_hypotheses(result, BATCH_SIZE) == 0);
    CHECK_STATUS(tolk_result_hypothesis(result, BATCH_SIZE, 0, &tokens, &n, NULL), TOLK_ERROR_OUT_OF_RANGE);
    CHECK_STATUS(tolk_result_hypothesis(result, (size_t)-1, 0, &tokens, &n, NULL), TOLK_ERROR_OUT_OF_RANGE);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 2, &tokens, &n, NULL), TOLK_ERROR_OUT_OF_RANGE);
    tolk_result_free(result);

    /* A bool holding another byte than 0 or 1 (memset, a cast) reads as C reads it: true. */
    TolkTranslateOptions odd = tolk_translate_options_default();
    odd.max_decoding_length = 12;
    memset(&odd.return_scores, 2, sizeof odd.return_scores);
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &odd, &result), TOLK_OK);
    score = NAN;
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, &score), TOLK_OK);
    CHECK(!isnan(score) && score <= 0);
    tolk_result_free(result);

    /* Keys/values kept compactly: the same shape of results, scores close to float32's. */
    const char *kv_types[] = {"bfloat16", "int8"};
    for (size_t k = 0; k < 2; k++) {
        opts.kv_cache_type = kv_types[k];
        result = NULL;
        CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_OK);
        CHECK(tolk_result_batch_size(result) == BATCH_SIZE);
        CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, &score), TOLK_OK);
        CHECK(n > 0 && n <= 12 && !isnan(score) && score <= 0);
        tolk_result_free(result);
    }
    opts.kv_cache_type = NULL;

    /* NULL options are the defaults; scores are NaN when not requested. */
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, 1, NULL, NULL, NULL, &result), TOLK_OK);
    CHECK(tolk_result_num_hypotheses(result, 0) == 1);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, &score), TOLK_OK);
    CHECK(isnan(score));
    tolk_result_free(result);

    /* An empty batch works, with or without arrays. */
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, NULL, NULL, 0, NULL, NULL, NULL, &result), TOLK_OK);
    CHECK(result != NULL && tolk_result_batch_size(result) == 0);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, NULL), TOLK_ERROR_OUT_OF_RANGE);
    tolk_result_free(result);

    /* A batch of only empty sentences. */
    const char *const *empties[] = {NULL, NULL};
    size_t zeros[] = {0, 0};
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, empties, zeros, 2, NULL, NULL, &opts, &result), TOLK_OK);
    CHECK(tolk_result_batch_size(result) == 2);
    CHECK_STATUS(tolk_result_hypothesis(result, 1, 1, &tokens, &n, &score), TOLK_OK);
    CHECK(n == 0);
    tolk_result_free(result);

    /* A target prefix starts every hypothesis. */
    const char *p0[] = {"q", "r"};
    const char *const *prefix[] = {p0, NULL, NULL, NULL};
    size_t prefix_lengths[] = {2, 0, 0, 0};
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, prefix, prefix_lengths, &opts, &result), TOLK_OK);
    for (size_t h = 0; h < 2; h++) {
        CHECK_STATUS(tolk_result_hypothesis(result, 0, h, &tokens, &n, NULL), TOLK_OK);
        CHECK(n >= 2 && strcmp(tokens[0], "q") == 0 && strcmp(tokens[1], "r") == 0);
    }
    tolk_result_free(result);
    tolk_translator_free(translator);
}

/* return_attention: one row a token, one column a source token, each row a share of the
 * attention (the end token's position is not a column); replace_unknowns: the unknown
 * tokens a target prefix forces become source tokens. Repetition rules run through. */
static void test_attention(TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    TolkTranslateOptions opts = tolk_translate_options_default();
    opts.beam_size = 2;
    opts.num_hypotheses = 2;
    opts.max_decoding_length = 10;
    opts.return_attention = true;
    opts.repetition_penalty = 1.5f;
    opts.no_repeat_ngram_size = 2;
    TolkResult *result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_OK);
    for (size_t i = 0; i < BATCH_SIZE; i++) {
        for (size_t h = 0; h < 2; h++) {
            const char *const *tokens = NULL;
            const float *values = NULL;
            size_t n = 0, rows = 99, columns = 99;
            CHECK_STATUS(tolk_result_hypothesis(result, i, h, &tokens, &n, NULL), TOLK_OK);
            CHECK_STATUS(tolk_result_attention(result, i, h, &values, &rows, &columns), TOLK_OK);
            CHECK(rows == (LENGTHS[i] ? n : 0) && columns == (n ? LENGTHS[i] : 0));
            for (size_t t = 0; t < rows; t++) {
                float sum = 0;
                for (size_t j = 0; j < columns; j++) {
                    CHECK(values[t * columns + j] >= 0.0f);
                    sum += values[t * columns + j];
                }
                CHECK(sum <= 1.0001f);
            }
        }
    }
    const float *values = NULL;
    size_t rows = 0, columns = 0;
    CHECK_STATUS(tolk_result_attention(NULL, 0, 0, &values, &rows, &columns), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_result_attention(result, 0, 0, NULL, &rows, &columns), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_result_attention(result, 0, 0, &values, &rows, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_result_attention(result, BATCH_SIZE, 0, &values, &rows, &columns), TOLK_ERROR_OUT_OF_RANGE);
    CHECK_STATUS(tolk_result_attention(result, 0, 2, &values, &rows, &columns), TOLK_ERROR_OUT_OF_RANGE);
    tolk_result_free(result);

    /* Without return_attention: no attention. */
    opts.return_attention = false;
    opts.replace_unknowns = true;
    const char *p0[] = {"not-a-target-token"};
    const char *const *prefix[] = {p0, NULL, NULL, NULL};
    size_t prefix_lengths[] = {1, 0, 0, 0};
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, prefix, prefix_lengths, &opts, &result), TOLK_OK);
    const char *const *tokens = NULL;
    size_t n = 0;
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, NULL), TOLK_OK);
    CHECK(n >= 1 && (strcmp(tokens[0], "a") == 0 || strcmp(tokens[0], "b") == 0 || strcmp(tokens[0], "c") == 0));
    CHECK_STATUS(tolk_result_attention(result, 0, 0, &values, &rows, &columns), TOLK_OK);
    CHECK(values == NULL && rows == 0 && columns == 0);
    tolk_result_free(result);

    /* return_end_token: a finished hypothesis ends with the end token. */
    opts.replace_unknowns = false;
    opts.return_end_token = true;
    opts.max_decoding_length = 40;
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_OK);
    CHECK_STATUS(tolk_result_hypothesis(result, 0, 0, &tokens, &n, NULL), TOLK_OK);
    CHECK(n > 0 && (n == 40 || strcmp(tokens[n - 1], "</s>") == 0));
    tolk_result_free(result);
    opts.return_end_token = false;

    /* suppress_sequences: tokens must be in the target vocabulary; NULL arrays with a count
       are refused. */
    const char *bad_token[] = {"not-a-target-token"};
    const char *const *sequences[] = {bad_token};
    size_t sequence_lengths[] = {1};
    opts.suppress_sequences = sequences;
    opts.suppress_sequence_lengths = sequence_lengths;
    opts.num_suppress_sequences = 1;
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(result == NULL && strstr(tolk_last_error(), "suppress_sequences[0][0]: token \"not-a-target-token\" is not in the target vocabulary") != NULL);
    opts.suppress_sequences = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_ERROR_NULL_POINTER);
    opts.num_suppress_sequences = 0;
    opts.suppress_sequence_lengths = NULL;

    /* A repetition penalty must be > 0. */
    opts.repetition_penalty = 0.0f;
    result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(result == NULL && strstr(tolk_last_error(), "repetition penalty") != NULL);
    tolk_translator_free(translator);
}

/* A caller built against an older header passes a smaller struct_size: the fields it
 * does not know keep their defaults. */
static void test_struct_size_versioning(TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    TolkTranslateOptions old = tolk_translate_options_default();
    old.struct_size = (uint32_t)offsetof(TolkTranslateOptions, patience); /* struct_size + beam_size */
    old.beam_size = 1;
    old.return_scores = true; /* beyond struct_size: must be ignored */
    TolkTranslateOptions greedy = tolk_translate_options_default();
    greedy.beam_size = 1;
    TolkResult *a = NULL, *b = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &old, &a), TOLK_OK);
    CHECK_STATUS(tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &greedy, &b), TOLK_OK);
    for (size_t i = 0; a && b && i < BATCH_SIZE; i++) {
        char x[4096], y[4096];
        describe(a, i, 0, x, sizeof x);
        describe(b, i, 0, y, sizeof y);
        CHECK(strcmp(x, y) == 0); /* same tokens, and NaN scores in both */
    }
    tolk_result_free(a);
    tolk_result_free(b);
    tolk_translator_free(translator);
}

/* Results outlive their translator and model; translators outlive their model; several
 * translators share one model; intra_threads does not change the output. */
static void test_lifetimes(void) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(MODEL_DIR, &model), TOLK_OK);
    TolkTranslator *one = new_translator(model, 1), *four = new_translator(model, 4);
    tolk_model_free(model);
    TolkTranslateOptions opts = tolk_translate_options_default();
    opts.beam_size = 2;
    opts.return_scores = true;
    TolkResult *a = NULL, *b = NULL;
    CHECK_STATUS(tolk_translate_batch(one, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &a), TOLK_OK);
    CHECK_STATUS(tolk_translate_batch(four, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &b), TOLK_OK);
    tolk_translator_free(one);
    tolk_translator_free(four);
    for (size_t i = 0; a && b && i < BATCH_SIZE; i++) {
        char x[4096], y[4096];
        describe(a, i, 0, x, sizeof x);
        describe(b, i, 0, y, sizeof y);
        if (strcmp(x, y) != 0) fprintf(stderr, "intra_threads 1: %s\nintra_threads 4: %s\n", x, y);
        CHECK(strcmp(x, y) == 0);
    }
    tolk_result_free(a);
    tolk_result_free(b);
}

/* Models loaded for a compute type: NULL options and "default" keep the saved type, the
 * quantized types translate, bad names and struct sizes fail cleanly, and a translator
 * asking for the model's type shares its weights (same output as the default). */
static void test_model_options(void) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, NULL, &model), TOLK_OK);
    CHECK(model && strcmp(tolk_model_compute_type(model), "float32") == 0);
    tolk_model_free(model);
    CHECK(tolk_model_compute_type(NULL) == NULL);

    static const char *const TYPES[][2] = {
        {"default", "float32"}, {"float32", "float32"}, {"int8", "int8_float32"},
        {"int8_float32", "int8_float32"}, {"int16", "int16"},
    };
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        TolkModelOptions mo = tolk_model_options_default();
        mo.compute_type = TYPES[t][0];
        model = NULL;
        CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &mo, &model), TOLK_OK);
        if (!model) continue;
        CHECK(strcmp(tolk_model_compute_type(model), TYPES[t][1]) == 0);
        TolkTranslatorOptions to = tolk_translator_options_default();
        to.compute_type = TYPES[t][0];
        TolkTranslator *same = NULL, *dflt = NULL;
        CHECK_STATUS(tolk_translator_new(model, &to, &same), TOLK_OK);
        CHECK_STATUS(tolk_translator_new(model, NULL, &dflt), TOLK_OK);
        TolkTranslateOptions opts = tolk_translate_options_default();
        opts.return_scores = true;
        TolkResult *a = NULL, *b = NULL;
        CHECK_STATUS(tolk_translate_batch(same, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &a), TOLK_OK);
        CHECK_STATUS(tolk_translate_batch(dflt, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &b), TOLK_OK);
        for (size_t i = 0; a && b && i < BATCH_SIZE; i++) {
            char x[4096], y[4096];
            describe(a, i, 0, x, sizeof x);
            describe(b, i, 0, y, sizeof y);
            CHECK(strcmp(x, y) == 0);
        }
        tolk_result_free(a);
        tolk_result_free(b);
        tolk_translator_free(same);
        tolk_translator_free(dflt);
        tolk_model_free(model);
    }

    TolkModelOptions bad = tolk_model_options_default();
    bad.compute_type = "int4";
    model = (TolkModel *)&bad; /* must be reset to NULL on failure */
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &bad, &model), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(model == NULL);
    CHECK(strstr(tolk_last_error(), "int4") != NULL);
    bad.compute_type = "float16"; /* refused on CPU, as by CTranslate2 */
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &bad, &model), TOLK_ERROR_UNSUPPORTED);
    bad = tolk_model_options_default();
    bad.struct_size = 1;
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &bad, &model), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(tolk_model_load_with_options(NULL, NULL, &model), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, NULL, NULL), TOLK_ERROR_NULL_POINTER);
}

#ifndef THREADS /* -DTHREADS=16 -DROUNDS=50 for a stress run */
#define THREADS 4
#endif
#ifndef ROUNDS
#define ROUNDS 3
#endif

typedef struct {
    const TolkTranslator *translator;
    char output[BATCH_SIZE][4096];
    int mismatches;
    char fresh_error[64]; /* tolk_last_error() of the new thread before any call */
} ThreadJob;

static void translate_all(const TolkTranslator *translator, char out[BATCH_SIZE][4096]) {
    TolkTranslateOptions opts = tolk_translate_options_default();
    opts.beam_size = 2;
    opts.return_scores = true;
    TolkResult *result = NULL;
    if (tolk_translate_batch(translator, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, &opts, &result) != TOLK_OK) {
        for (size_t i = 0; i < BATCH_SIZE; i++) snprintf(out[i], 4096, "error: %s", tolk_last_error());
        return;
    }
    for (size_t i = 0; i < BATCH_SIZE; i++) describe(result, i, 0, out[i], 4096);
    tolk_result_free(result);
}

static void *thread_main(void *arg) {
    ThreadJob *job = arg;
    snprintf(job->fresh_error, sizeof job->fresh_error, "%s", tolk_last_error());
    char first[BATCH_SIZE][4096];
    translate_all(job->translator, first);
    for (int round = 1; round < ROUNDS; round++) {
        translate_all(job->translator, job->output);
        for (size_t i = 0; i < BATCH_SIZE; i++) job->mismatches += strcmp(first[i], job->output[i]) != 0;
    }
    return NULL;
}

/* One translator used by 4 threads at once gives the single-threaded result everywhere,
 * also when each call itself runs on several threads; tolk_last_error() is per thread. */
static void test_threads(uint32_t intra_threads) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(MODEL_DIR, &model), TOLK_OK);
    TolkTranslator *translator = new_translator(model, intra_threads);
    tolk_model_free(model);
    if (translator == NULL) return;
    static char reference[BATCH_SIZE][4096];
    translate_all(translator, reference);
    CHECK(strncmp(reference[0], "error", 5) != 0);

    CHECK_STATUS(tolk_model_load(NULL, NULL), TOLK_ERROR_NULL_POINTER); /* main thread has an error now */
    static ThreadJob jobs[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].translator = translator;
        CHECK(pthread_create(&threads[i], NULL, thread_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK(jobs[i].fresh_error[0] == '\0');
        CHECK(jobs[i].mismatches == 0);
        for (size_t s = 0; s < BATCH_SIZE; s++) {
            if (strcmp(reference[s], jobs[i].output[s]) != 0)
                fprintf(stderr, "intra_threads %u, thread %d, sentence %zu: %s != %s\n", (unsigned)intra_threads, i, s,
                        jobs[i].output[s], reference[s]);
            CHECK(strcmp(reference[s], jobs[i].output[s]) == 0);
        }
    }
    tolk_translator_free(translator);
}

static TolkTranslateOptions progress_options(ProgressLog *log, uint32_t max_batch_size) {
    TolkTranslateOptions o = tolk_translate_options_default();
    o.beam_size = 1;
    o.max_decoding_length = 12;
    o.return_scores = true;
    o.max_batch_size = max_batch_size;
    o.progress = on_progress;
    o.progress_user_data = log;
    return o;
}

/* BATCH three times over with its empty sentence: 12 sentences. */
#define PBATCH_SIZE 12
static const char *const *PBATCH[PBATCH_SIZE] = {S0, S1, S2, NULL, S2, S0, NULL, S1, S1, S0, S2, NULL};
static const size_t PLENGTHS[PBATCH_SIZE] = {3, 3, 3, 0, 3, 3, 0, 3, 3, 3, 3, 0};

/* Whether results a and b hold the same best hypotheses and scores. */
static bool same_results(const TolkResult *a, const TolkResult *b, size_t n) {
    if (a == NULL || b == NULL || tolk_result_batch_size(a) != n || tolk_result_batch_size(b) != n) return false;
    for (size_t i = 0; i < n; i++) {
        char x[4096], y[4096];
        describe(a, i, 0, x, sizeof x);
        describe(b, i, 0, y, sizeof y);
        if (strcmp(x, y) != 0) return false;
    }
    return true;
}

/* The progress callback of tolk_translate_batch: one call per batch (empty sentences count),
 * done reaching the number of sentences; results as without a callback; cancelling after any
 * call returns TOLK_ERROR_CANCELLED and no result; a struct_size from before the callback
 * ignores it; a size cutting the callback pointer is refused. */
static void test_progress(TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 1);
    TolkTranslateOptions plain = progress_options(NULL, 5);
    plain.progress = NULL;
    TolkResult *want = NULL, *got = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &plain, &want), TOLK_OK);

    /* Batches of 5 sentences: 5, 10, 12. */
    ProgressLog log = progress_log(0);
    TolkTranslateOptions o = progress_options(&log, 5);
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &got), TOLK_OK);
    CHECK(log.violations == 0 && log.calls == 3 && log.total == PBATCH_SIZE);
    /* Batches of 5, 5 and 2 sentences, counted as they finish: a later batch joins the
     * decoding of an earlier one (continuous batching) and may finish first. */
    CHECK((log.done[0] == 5 || log.done[0] == 2) && (log.done[1] == 10 || log.done[1] == 7) &&
          (log.done[1] - log.done[0] == 5 || log.done[1] - log.done[0] == 2) && log.done[2] == PBATCH_SIZE);
    CHECK(same_results(got, want, PBATCH_SIZE));
    tolk_result_free(got);
    got = NULL;

    /* One batch (max_batch_size 0): one call; batches of tokens: done reaches the total. */
    log = progress_log(0);
    o = progress_options(&log, 0);
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &got), TOLK_OK);
    CHECK(log.violations == 0 && log.calls == 1 && log.done[0] == PBATCH_SIZE && log.total == PBATCH_SIZE);
    tolk_result_free(got);
    got = NULL;
    log = progress_log(0);
    o = progress_options(&log, 8);
    o.batch_type = TOLK_BATCH_TOKENS;
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &got), TOLK_OK);
    CHECK(log.violations == 0 && log.calls >= 2 && log.calls <= PBATCH_SIZE && log.total == PBATCH_SIZE);
    CHECK(log.calls > 0 && last_done(&log) == PBATCH_SIZE);
    tolk_result_free(got);
    got = NULL;

    /* A target prefix changes nothing to the counting. */
    const char *p0[] = {"q"};
    const char *const *prefix[PBATCH_SIZE] = {p0};
    size_t prefix_lengths[PBATCH_SIZE] = {1};
    log = progress_log(0);
    o = progress_options(&log, 4);
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, prefix, prefix_lengths, &o, &got), TOLK_OK);
    CHECK(log.violations == 0 && log.calls == 3 && log.done[2] == PBATCH_SIZE);
    tolk_result_free(got);
    got = NULL;

    /* No sentences: no call. */
    log = progress_log(0);
    o = progress_options(&log, 2);
    CHECK_STATUS(tolk_translate_batch(translator, NULL, NULL, 0, NULL, NULL, &o, &got), TOLK_OK);
    CHECK(log.calls == 0 && got != NULL && tolk_result_batch_size(got) == 0);
    tolk_result_free(got);

    /* Cancelled after the first, the second and the last batch. */
    for (size_t cancel_at = 1; cancel_at <= 3; cancel_at++) {
        log = progress_log(cancel_at);
        o = progress_options(&log, 5);
        got = (TolkResult *)&got; /* garbage the call must reset */
        CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &got),
                     TOLK_ERROR_CANCELLED);
        CHECK(got == NULL);
        CHECK(log.violations == 0 && log.calls == cancel_at);
        CHECK(strstr(tolk_last_error(), "cancel") != NULL);
    }
    /* The translator works on after a cancelled call. */
    got = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &plain, &got), TOLK_OK);
    CHECK(same_results(got, want, PBATCH_SIZE));
    tolk_result_free(got);
    got = NULL;

    /* A caller built before the callback: its struct ends before `progress`, whatever lies
     * beyond (here a callback that would cancel) is ignored. */
    log = progress_log(1);
    o = progress_options(&log, 5);
    o.struct_size = (uint32_t)offsetof(TolkTranslateOptions, progress);
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &got), TOLK_OK);
    CHECK(log.calls == 0 && same_results(got, want, PBATCH_SIZE));
    tolk_result_free(got);
    got = NULL;
    /* A size ending inside the callback pointer is no version of the struct. */
    o.struct_size = (uint32_t)offsetof(TolkTranslateOptions, progress) + 4;
    CHECK_STATUS(tolk_translate_batch(translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &got),
                 TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(got == NULL && log.calls == 0);
    tolk_result_free(want);
    tolk_translator_free(translator);
}

typedef struct {
    const TolkTranslator *translator;
    ProgressLog log;
    TolkStatus status;
    size_t cancel_at;
} ProgressJob;

static void *progress_thread(void *arg) {
    ProgressJob *job = arg;
    job->log = progress_log(job->cancel_at); /* this thread */
    TolkTranslateOptions o = progress_options(&job->log, 3);
    TolkResult *r = NULL;
    job->status = tolk_translate_batch(job->translator, PBATCH, PLENGTHS, PBATCH_SIZE, NULL, NULL, &o, &r);
    tolk_result_free(r);
    return NULL;
}

/* Threads sharing a translator: each one's callback runs on that thread, with its data;
 * one cancelling does not stop the others. */
static void test_progress_threads(TolkModel *model) {
    TolkTranslator *translator = new_translator(model, 2);
    if (translator == NULL) return;
    static ProgressJob jobs[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].translator = translator;
        jobs[i].cancel_at = i == 3 ? 2 : 0;
        CHECK(pthread_create(&threads[i], NULL, progress_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < 4; i++) {
        ProgressLog *log = &jobs[i].log;
        CHECK(log->violations == 0);
        if (i < 3) {
            CHECK(jobs[i].status == TOLK_OK && log->calls == 4 && log->done[3] == PBATCH_SIZE);
        } else {
            CHECK(jobs[i].status == TOLK_ERROR_CANCELLED && log->calls == 2);
        }
    }
    tolk_translator_free(translator);
}

/* Devices: "cpu" runs on the CPU; "auto" takes a usable GPU or the CPU and says which,
   with the CPU's exact output; "cuda" without a usable GPU is a clean error. */
static void test_devices(void) {
    TolkModelOptions mo = tolk_model_options_default();
    mo.device = "cpu";
    TolkModel *cpu = NULL;
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &mo, &cpu), TOLK_OK);
    CHECK(!strcmp(tolk_model_device(cpu), "cpu"));
    CHECK(!strncmp(tolk_model_device_name(cpu), "cpu (", 5));
    CHECK(tolk_model_device(NULL) == NULL && tolk_model_device_name(NULL) == NULL);

    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, NULL, &model), TOLK_OK); /* auto */
    const char *device = tolk_model_device(model);
    CHECK(!strcmp(device, "cpu") || !strcmp(device, "cuda"));
    if (!strcmp(device, "cpu")) {
        TolkTranslator *a = new_translator(cpu, 1), *b = new_translator(model, 1);
        TolkResult *ra = NULL, *rb = NULL;
        CHECK_STATUS(tolk_translate_batch(a, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, NULL, &ra), TOLK_OK);
        CHECK_STATUS(tolk_translate_batch(b, BATCH, LENGTHS, BATCH_SIZE, NULL, NULL, NULL, &rb), TOLK_OK);
        for (size_t i = 0; i < BATCH_SIZE; i++) {
            char x[512], y[512];
            describe(ra, i, 0, x, sizeof x);
            describe(rb, i, 0, y, sizeof y);
            CHECK(!strcmp(x, y));
        }
        tolk_result_free(ra);
        tolk_result_free(rb);
        tolk_translator_free(a);
        tolk_translator_free(b);
    }
    tolk_model_free(model);

    mo.device = "cuda";
    model = (TolkModel *)&model;
    TolkStatus s = tolk_model_load_with_options(MODEL_DIR, &mo, &model);
    if (s == TOLK_OK) {
        CHECK(!strcmp(tolk_model_device(model), "cuda"));
        tolk_model_free(model);
    } else {
        printf("no GPU: device \"cuda\" refused: %s\n", tolk_last_error());
        CHECK(s == TOLK_ERROR_UNSUPPORTED && model == NULL);
        CHECK(strstr(tolk_last_error(), "cuda") != NULL);
        /* A translator asking for the GPU on a CPU model is refused the same way. */
        TolkTranslatorOptions to = tolk_translator_options_default();
        to.device = "cuda";
        TolkTranslator *t = (TolkTranslator *)&t;
        CHECK_STATUS(tolk_translator_new(cpu, &to, &t), TOLK_ERROR_UNSUPPORTED);
        CHECK(t == NULL);
    }
    mo.device = "tpu";
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &mo, &model), TOLK_ERROR_INVALID_ARGUMENT);
    tolk_model_free(cpu);
}

/* Calls from a thread's exit (a pthread key destructor, after the library's own per-thread
 * storage may be gone) still return a status and a message pointer; none aborts. */
static pthread_key_t exit_key;
static TolkStatus status_at_exit = TOLK_OK;
static int error_at_exit_readable = 0;

static void call_at_exit(void *unused) {
    (void)unused;
    TolkModel *m = NULL;
    status_at_exit = tolk_model_load(NULL, &m);
    const char *message = tolk_last_error();
    error_at_exit_readable = message != NULL && strlen(message) < 4096;
}

static void *fail_then_exit(void *unused) {
    (void)unused;
    TolkModel *m = NULL;
    tolk_model_load(NULL, &m); /* this thread's last error now exists */
    pthread_setspecific(exit_key, &exit_key);
    return NULL;
}

static void test_calls_at_thread_exit(void) {
    CHECK(pthread_key_create(&exit_key, call_at_exit) == 0);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, fail_then_exit, NULL) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(status_at_exit == TOLK_ERROR_NULL_POINTER);
    CHECK(error_at_exit_readable);
    pthread_key_delete(exit_key);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: api_test MODEL_DIR\n");
        return 2;
    }
    MODEL_DIR = argv[1];
    CHECK(tolk_last_error() != NULL && tolk_last_error()[0] == '\0'); /* no failure yet */
    test_versions();
    test_load_errors();
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(MODEL_DIR, &model), TOLK_OK);
    if (model == NULL) return finish("api_test");
    test_null_pointers(model);
    test_bad_options(model);
    test_devices();
    test_translate(model);
    test_attention(model);
    test_struct_size_versioning(model);
    test_progress(model);
    test_progress_threads(model);
    tolk_model_free(model);
    test_lifetimes();
    test_model_options();
    test_threads(1);
    test_threads(3);
    test_calls_at_thread_exit();
    return finish("api_test");
}
