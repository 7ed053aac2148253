/*
 * C API tests of tolk_translate_file: a file translated in chunks gives what the batch
 * calls give for the same lines (text and token modes), the progress callback counts lines
 * against a total counted beforehand and cancels, a failed call leaves no output file (an
 * existing one untouched), bad arguments and options, TolkStreamOptions versioning. Run by
 * tests/ffi.rs (also under valgrind).
 *
 *   file_test MODEL_DIR      (MODEL_DIR: ffi-tests/fixtures/tiny)
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "progress.h"

static char dir[64];

/* DIR/name in a static buffer (one at a time per slot). */
static const char *in_dir(const char *name, int slot) {
    static char paths[3][128];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", dir, name);
    return paths[slot];
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f == NULL) return;
    fputs(text, f);
    fclose(f);
}

/* The whole file, NUL-terminated (free it); NULL when it does not exist. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, n = 0;
    char *text = malloc(cap);
    size_t got;
    while (text != NULL && (got = fread(text + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *grown = realloc(text, cap * 2);
            if (grown == NULL) free(text);
            text = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (text != NULL) text[n] = '\0';
    return text;
}

/* Files in the test folder (temporary outputs must not stay behind). */
static int files_in_dir(void) {
    DIR *d = opendir(dir);
    int count = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) count += e->d_name[0] != '.' || strstr(e->d_name, ".tmp") != NULL;
    if (d != NULL) closedir(d);
    return count;
}

/* 20 lines: sentences, an empty and a blank line. */
static const char *LINES[] = {"Hello world. How are you?", "The cat sat on the mat.", "", "  ", "We love to read."};
#define NUM_LINES 20

static void input_text(char *buf, size_t cap) {
    size_t used = 0;
    for (int i = 0; i < NUM_LINES; i++) used += (size_t)snprintf(buf + used, cap - used, "%s\n", LINES[i % 5]);
}

static TolkTranslateOptions quick_options(void) {
    TolkTranslateOptions o = tolk_translate_options_default();
    o.beam_size = 1;
    o.max_decoding_length = 8;
    o.max_batch_size = 2;
    return o;
}

/* Text mode in chunks of 3 lines: tolk_translate_text_batch's translations, one per line. */
static void test_text(const TolkTranslator *translator) {
    char input[2048];
    input_text(input, sizeof input);
    write_file(in_dir("in.txt", 0), input);
    const char *texts[NUM_LINES];
    for (int i = 0; i < NUM_LINES; i++) texts[i] = LINES[i % 5];
    TolkTranslateOptions options = quick_options();
    TolkTextResult *result = NULL;
    CHECK_STATUS(tolk_translate_text_batch(translator, texts, NULL, NUM_LINES, &options, NULL, &result), TOLK_OK);
    char expected[8192];
    size_t used = 0;
    for (size_t i = 0; i < tolk_text_result_count(result); i++)
        used += (size_t)snprintf(expected + used, sizeof expected - used, "%s\n", tolk_text_result_text(result, i, NULL));
    tolk_text_result_free(result);

    ProgressLog log = progress_log(0);
    options.progress = on_progress;
    options.progress_user_data = &log;
    TolkStreamOptions stream = tolk_stream_options_default();
    CHECK(stream.struct_size == sizeof(TolkStreamOptions) && stream.read_batch_size == 0 && !stream.tokens);
    stream.read_batch_size = 3;
    CHECK_STATUS(tolk_translate_file(translator, in_dir("in.txt", 0), in_dir("out.txt", 1), &options, NULL, &stream), TOLK_OK);
    char *got = read_file(in_dir("out.txt", 1));
    CHECK(got != NULL && strcmp(got, expected) == 0);
    free(got);
    /* Lines, with the total counted beforehand: on this thread, never back, to the end. */
    CHECK(log.violations == 0 && log.total == NUM_LINES && last_done(&log) == NUM_LINES && log.calls >= NUM_LINES / 3);
    CHECK(files_in_dir() == 2);

    /* A last line without a line break and CRLF lines are lines like the others. */
    options.progress = NULL;
    write_file(in_dir("crlf.txt", 0), "Hello world. How are you?\r\nThe cat sat on the mat.");
    CHECK_STATUS(tolk_translate_file(translator, in_dir("crlf.txt", 0), in_dir("crlf.out", 1), &options, NULL, &stream), TOLK_OK);
    got = read_file(in_dir("crlf.out", 1));
    size_t first_two = strchr(strchr(expected, '\n') + 1, '\n') + 1 - expected;
    CHECK(got != NULL && strlen(got) == first_two && strncmp(got, expected, first_two) == 0);
    free(got);
    unlink(in_dir("crlf.txt", 0));
    unlink(in_dir("crlf.out", 0));
}

/* Token mode with 2 hypotheses and scores: "SCORE ||| tokens", one line per hypothesis, as
 * tolk_translate_batch gives them. */
static void test_tokens(const TolkTranslator *translator) {
    write_file(in_dir("in.tok", 0), "a b c\nh e l l o\n\nz\nm n\t q\n");
    static const char *L0[] = {"a", "b", "c"}, *L1[] = {"h", "e", "l", "l", "o"}, *L3[] = {"z"}, *L4[] = {"m", "n", "q"};
    const char *const *batch[] = {L0, L1, NULL, L3, L4};
    size_t lengths[] = {3, 5, 0, 1, 3};
    TolkTranslateOptions options = quick_options();
    options.beam_size = 2;
    options.num_hypotheses = 2;
    options.return_scores = true;
    TolkResult *result = NULL;
    CHECK_STATUS(tolk_translate_batch(translator, batch, lengths, 5, NULL, NULL, &options, &result), TOLK_OK);
    char expected[4096];
    size_t used = 0;
    for (size_t i = 0; i < tolk_result_batch_size(result); i++) {
        for (size_t h = 0; h < tolk_result_num_hypotheses(result, i); h++) {
            const char *const *tokens = NULL;
            size_t n = 0;
            float score = 0;
            CHECK_STATUS(tolk_result_hypothesis(result, i, h, &tokens, &n, &score), TOLK_OK);
            used += (size_t)snprintf(expected + used, sizeof expected - used, "%.6f ||| ", score);
            for (size_t t = 0; t < n; t++) used += (size_t)snprintf(expected + used, sizeof expected - used, t ? " %s" : "%s", tokens[t]);
            used += (size_t)snprintf(expected + used, sizeof expected - used, "\n");
        }
    }
    tolk_result_free(result);
    TolkStreamOptions stream = tolk_stream_options_default();
    stream.tokens = true;
    stream.read_batch_size = 2;
    CHECK_STATUS(tolk_translate_file(translator, in_dir("in.tok", 0), in_dir("out.tok", 1), &options, NULL, &stream), TOLK_OK);
    char *got = read_file(in_dir("out.tok", 1));
    CHECK(got != NULL && strcmp(got, expected) == 0);
    free(got);
    unlink(in_dir("in.tok", 0));
    unlink(in_dir("out.tok", 0));
}

/* Failures leave no output: an existing file keeps its contents, a new one is not created,
 * no temporary file stays. */
static void test_failures(const TolkTranslator *translator) {
    const char *in = in_dir("in.txt", 0), *out = in_dir("out.txt", 1);
    write_file(out, "before\n");
    TolkTranslateOptions options = quick_options();
    ProgressLog log = progress_log(2);
    options.progress = on_progress;
    options.progress_user_data = &log;
    TolkStreamOptions stream = tolk_stream_options_default();
    stream.read_batch_size = 3;
    CHECK_STATUS(tolk_translate_file(translator, in, out, &options, NULL, &stream), TOLK_ERROR_CANCELLED);
    CHECK(log.calls == 2 && strstr(tolk_last_error(), "progress callback") != NULL);
    char *got = read_file(out);
    CHECK(got != NULL && strcmp(got, "before\n") == 0);
    free(got);
    CHECK(files_in_dir() == 2);

    /* Invalid UTF-8 on line 5: an error naming the line and the file. */
    write_file(in_dir("bad.txt", 2), "a\nb\nc\nd\n\xff\xfe\nf\n");
    CHECK_STATUS(tolk_translate_file(translator, in_dir("bad.txt", 2), in_dir("bad.out", 0), &options, NULL, &stream),
                 TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(tolk_last_error(), "line 5 of") != NULL && strstr(tolk_last_error(), "bad.txt") != NULL);
    CHECK(read_file(in_dir("bad.out", 0)) == NULL);
    unlink(in_dir("bad.txt", 2));

    /* A missing input: TOLK_ERROR_IO naming it; nothing created. */
    CHECK_STATUS(tolk_translate_file(translator, "/nonexistent/input.txt", in_dir("new.out", 0), NULL, NULL, NULL), TOLK_ERROR_IO);
    CHECK(strstr(tolk_last_error(), "/nonexistent/input.txt") != NULL);
    CHECK(read_file(in_dir("new.out", 0)) == NULL);
    CHECK(files_in_dir() == 2);
}

static bool on_token(void *user_data, const TolkTokenEvent *event) {
    (void)user_data;
    (void)event;
    return true;
}

static void test_bad_arguments(const TolkTranslator *translator) {
    const char *in = in_dir("in.txt", 0), *out = in_dir("out.txt", 1);
    CHECK_STATUS(tolk_translate_file(NULL, in, out, NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    TolkStreamOptions stream = tolk_stream_options_default();
    stream.struct_size = 2;
    CHECK_STATUS(tolk_translate_file(translator, in, out, NULL, NULL, &stream), TOLK_ERROR_INVALID_ARGUMENT);
    stream.struct_size = sizeof(TolkStreamOptions) + 8; /* a newer caller than this library */
    CHECK_STATUS(tolk_translate_file(translator, in, out, NULL, NULL, &stream), TOLK_ERROR_INVALID_ARGUMENT);
    TolkTranslateOptions options = quick_options();
    options.on_token = on_token;
    CHECK_STATUS(tolk_translate_file(translator, in, out, &options, NULL, NULL), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(tolk_last_error(), "on_token") != NULL);
    options = quick_options();
    options.num_hypotheses = 2; /* text mode: one translation per line */
    options.beam_size = 2;
    CHECK_STATUS(tolk_translate_file(translator, in, out, &options, NULL, NULL), TOLK_ERROR_INVALID_ARGUMENT);

    /* An older caller's struct without `tokens` reads it as false (text mode). */
    options = quick_options();
    stream = tolk_stream_options_default();
    stream.read_batch_size = 3;
    CHECK_STATUS(tolk_translate_file(translator, in, out, &options, NULL, &stream), TOLK_OK);
    stream.struct_size = (uint32_t)offsetof(TolkStreamOptions, tokens);
    stream.tokens = true; /* past the caller's struct: not read */
    CHECK_STATUS(tolk_translate_file(translator, in, in_dir("old.out", 2), &options, NULL, &stream), TOLK_OK);
    char *current = read_file(out), *old = read_file(in_dir("old.out", 2));
    CHECK(current != NULL && old != NULL && strcmp(current, old) == 0);
    free(current);
    free(old);
    unlink(in_dir("old.out", 2));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: file_test MODEL_DIR\n");
        return 2;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tolk-file-XXXXXX", tmp != NULL && strlen(tmp) < 40 ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
    TolkTranslatorOptions topts = tolk_translator_options_default();
    topts.inter_threads = 2;
    CHECK_STATUS(tolk_model_load(argv[1], &model), TOLK_OK);
    CHECK_STATUS(tolk_translator_new(model, &topts, &translator), TOLK_OK);
    if (translator != NULL) {
        test_text(translator);
        test_tokens(translator);
        test_failures(translator);
        test_bad_arguments(translator);
    }
    tolk_translator_free(translator);
    tolk_model_free(model);
    unlink(in_dir("in.txt", 0));
    unlink(in_dir("out.txt", 0));
    rmdir(dir);
    return finish("file_test");
}
