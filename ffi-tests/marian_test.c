/*
 * Marian/Bergamot packages through the C API: the en-pt package loaded by its directory,
 * its YAML and its model file (the same translations); tolk_translator_translate_options
 * (the package's decoding settings, CTranslate2's defaults for a CTranslate2 model, the
 * struct_size of the struct it writes); NULL options are the translator's options; the
 * versioned TolkTranslateOptions (a caller built before max_length_factor/use_shortlist
 * gets the package's values for them); the shortlist turned off; bad length factors; load
 * errors (a folder of neither family, a truncated model file, a corrupted shortlist); one
 * model shared by translators on 4 threads. Built against include/tolk.h and run by
 * tests/ffi.rs (also under valgrind when it is installed, so every path must free what it
 * allocates).
 *
 *   marian_test TINY_DIR EN_PT_DIR   (TINY_DIR: ffi-tests/fixtures/tiny; EN_PT_DIR: the
 *                                     en-pt-bergamot package, found by tests/ffi.rs)
 *
 * TOLK_FFI_VALGRIND=1 (set by tests/ffi.rs under valgrind): one round per thread instead of
 * three; every check still runs.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static const char *TINY_DIR, *EN_PT_DIR;
static bool under_valgrind;

/* The en-pt package's files. */
#define YAML_FILE "config.intgemm8bitalpha.yml"
#define MODEL_FILE "model.enpt.intgemm.alphas.bin"
#define VOCAB_FILE "vocab.enpt.spm"
#define SHORTLIST_FILE "lex.50.50.enpt.s2t.bin"
static const char *const PACKAGE_FILES[] = {YAML_FILE, MODEL_FILE, VOCAB_FILE, SHORTLIST_FILE};
#define NUM_PACKAGE_FILES (sizeof PACKAGE_FILES / sizeof PACKAGE_FILES[0])

/* One sentence per line; its translation starts with "Ame seus inimigos.\n". */
static const char *const ENGLISH = "Love your enemies.\n"
                                   "The light shines in the darkness, and the darkness hasn't overcome it.\n"
                                   "Blessed are the poor in spirit, for theirs is the Kingdom of Heaven.\n"
                                   "I am the way, the truth, and the life.";
#define ENGLISH_LINES 4
#define LOVE_YOUR_ENEMIES "Ame seus inimigos."
/* SentencePiece's word start "▁" (U+2581). */
#define WORD_START "\xe2\x96\x81"
/* A source whose translation depends on the options: the package's greedy search and
 * CTranslate2's beam 2 differ on it, and so do the shortlist on and off. */
static const char *const DIGITS = "1234567890";

/* Compares two strings (either may be NULL, which never matches), printing both. */
#define CHECK_SAME(got, want)                                                           \
    do {                                                                                \
        const char *g_ = (got), *w_ = (want);                                           \
        if (g_ == NULL || w_ == NULL || strcmp(g_, w_) != 0) {                          \
            fprintf(stderr, "%s:%d: check failed: %s == %s:\n  got  %s\n  want %s\n",   \
                    __FILE__, __LINE__, #got, #want, g_ ? g_ : "(null)", w_ ? w_ : "(null)"); \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* Checks that tolk_last_error() contains `needle`, printing it when not. */
#define CHECK_ERROR_MENTIONS(needle)                                                    \
    do {                                                                                \
        if (strstr(tolk_last_error(), (needle)) == NULL) {                              \
            fprintf(stderr, "%s:%d: last error does not mention \"%s\": %s\n", __FILE__, \
                    __LINE__, (needle), tolk_last_error());                             \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

static void join_path(char *out, size_t cap, const char *dir, const char *name) {
    CHECK((size_t)snprintf(out, cap, "%s/%s", dir, name) < cap);
}

/* A translator of the model at `path` (the model itself is released: the translator keeps
 * it); NULL after a failed check. */
static TolkTranslator *load_translator(const char *path) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(path, &model), TOLK_OK);
    if (model == NULL) return NULL;
    TolkTranslator *translator = NULL;
    CHECK_STATUS(tolk_translator_new(model, NULL, &translator), TOLK_OK);
    tolk_model_free(model);
    return translator;
}

static TolkTranslator *load_package_file(const char *name) {
    char path[4096];
    join_path(path, sizeof path, EN_PT_DIR, name);
    return load_translator(path);
}

/* The translator's own options (a full-size struct). */
static TolkTranslateOptions translator_options(const TolkTranslator *t) {
    TolkTranslateOptions o = tolk_translate_options_default();
    CHECK_STATUS(tolk_translator_translate_options(t, &o), TOLK_OK);
    return o;
}

/* The translation of `text` (malloc'ed), or NULL after a failed check. */
static char *translate(const TolkTranslator *t, const char *text, const TolkTranslateOptions *o) {
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, text, o, NULL, &r), TOLK_OK);
    char *out = r ? strdup(tolk_text_result_text(r, 0, NULL)) : NULL;
    tolk_text_result_free(r);
    return out;
}

/* Whether `text` has `lines` lines, none of them empty or with SentencePiece's "▁". */
static bool translated_lines(const char *text, int lines) {
    if (text == NULL || strstr(text, WORD_START) != NULL) return false;
    int n = 1;
    for (const char *p = text; *p; p++) {
        if (*p == '\n' && (p == text || p[-1] == '\n' || p[1] == '\0')) return false;
        n += *p == '\n';
    }
    return text[0] != '\0' && n == lines;
}

/* The first field where `a` and `b` differ (the leading struct_size aside), or NULL. */
static const char *options_differ(const TolkTranslateOptions *a, const TolkTranslateOptions *b) {
    if (a->beam_size != b->beam_size) return "beam_size";
    if (a->patience != b->patience) return "patience";
    if (a->length_penalty != b->length_penalty) return "length_penalty";
    if (a->num_hypotheses != b->num_hypotheses) return "num_hypotheses";
    if (a->return_scores != b->return_scores) return "return_scores";
    if (a->max_input_length != b->max_input_length) return "max_input_length";
    if (a->max_decoding_length != b->max_decoding_length) return "max_decoding_length";
    if (a->min_decoding_length != b->min_decoding_length) return "min_decoding_length";
    if (a->end_token != b->end_token) return "end_token";
    if (a->disable_unk != b->disable_unk) return "disable_unk";
    if (a->max_batch_size != b->max_batch_size) return "max_batch_size";
    if (a->batch_type != b->batch_type) return "batch_type";
    if (a->progress != b->progress) return "progress";
    if (a->progress_user_data != b->progress_user_data) return "progress_user_data";
    if (a->max_length_factor != b->max_length_factor) return "max_length_factor";
    if (a->use_shortlist != b->use_shortlist) return "use_shortlist";
    if (a->use_vmap != b->use_vmap) return "use_vmap";
    return NULL;
}

#define CHECK_SAME_OPTIONS(a, b)                                                        \
    do {                                                                                \
        const char *field_ = options_differ((a), (b));                                  \
        if (field_ != NULL) {                                                           \
            fprintf(stderr, "%s:%d: %s and %s differ in %s\n", __FILE__, __LINE__, #a, #b, field_); \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* ---- Loading ---- */

/* The directory, the YAML and the model file load the same package: the same options and
 * the same translations (NULL options) of ENGLISH, whose first line is known. */
static void test_load_paths(const TolkTranslator *by_dir) {
    char *want = translate(by_dir, ENGLISH, NULL);
    CHECK(translated_lines(want, ENGLISH_LINES));
    CHECK(want && strncmp(want, LOVE_YOUR_ENEMIES "\n", strlen(LOVE_YOUR_ENEMIES) + 1) == 0);
    TolkTranslateOptions dir_options = translator_options(by_dir);

    TolkTranslator *by_yaml = load_package_file(YAML_FILE);
    if (by_yaml != NULL) {
        TolkTranslateOptions yaml_options = translator_options(by_yaml);
        CHECK_SAME_OPTIONS(&yaml_options, &dir_options);
        char *got = translate(by_yaml, ENGLISH, NULL);
        CHECK_SAME(got, want);
        free(got);
        tolk_translator_free(by_yaml);
    }
    /* The bare model file: the vocabulary found beside it, but no YAML, so Marian's own
     * decoding defaults (beam 12, normalize 0, max-length-factor 3) and no shortlist;
     * decoded greedily as the package says, the same translations of these sentences. */
    TolkTranslator *by_model = load_package_file(MODEL_FILE);
    if (by_model != NULL) {
        TolkTranslateOptions model_options = translator_options(by_model);
        TolkTranslateOptions defaults = tolk_translate_options_default();
        CHECK(model_options.beam_size == 12 && model_options.max_batch_size == defaults.max_batch_size);
        CHECK(model_options.max_length_factor == 3.0f && model_options.length_penalty == 0.0f);
        model_options.beam_size = 1;
        model_options.length_penalty = 1.0f;
        model_options.max_length_factor = 2.5f;
        char *got = translate(by_model, ENGLISH, &model_options);
        CHECK_SAME(got, want);
        free(got);
        tolk_translator_free(by_model);
    }
    free(want);
}

/* ---- tolk_translator_translate_options ---- */

/* en-pt: config.intgemm8bitalpha.yml's beam-size 1, normalize 1, max-length-factor 2.5,
 * mini-batch 64, <unk> never generated, no minimum length (Marian has none), the
 * shortlist on; CTranslate2's defaults elsewhere. The tiny CTranslate2 model: CTranslate2's defaults, no length factor. */
static void test_translator_options(const TolkTranslator *en_pt, const TolkTranslator *tiny) {
    TolkTranslateOptions defaults = tolk_translate_options_default();
    CHECK(defaults.struct_size == sizeof defaults);
    CHECK(defaults.max_length_factor == 0.0f && defaults.use_shortlist && !defaults.use_vmap);

    TolkTranslateOptions o = translator_options(en_pt);
    CHECK(o.struct_size == sizeof o);
    CHECK(o.beam_size == 1 && o.length_penalty == 1.0f && o.max_length_factor == 2.5f);
    CHECK(o.max_batch_size == 64 && o.disable_unk && o.use_shortlist && o.min_decoding_length == 0);
    TolkTranslateOptions expected = defaults;
    expected.min_decoding_length = 0;
    expected.beam_size = 1;
    expected.length_penalty = 1.0f;
    expected.max_length_factor = 2.5f;
    expected.max_batch_size = 64;
    expected.disable_unk = true;
    CHECK_SAME_OPTIONS(&o, &expected);

    TolkTranslateOptions t = translator_options(tiny);
    CHECK_SAME_OPTIONS(&t, &defaults);
    CHECK(t.max_length_factor == 0.0f && t.use_shortlist);

    /* struct_size 0: this version's struct is written. */
    TolkTranslateOptions zero;
    memset(&zero, 0, sizeof zero);
    CHECK_STATUS(tolk_translator_translate_options(en_pt, &zero), TOLK_OK);
    CHECK(zero.beam_size == 1 && zero.max_length_factor == 2.5f && zero.use_shortlist);

    /* A caller built against the header before max_length_factor: its fields are written,
     * the bytes past its struct_size are not, struct_size stays. */
    TolkTranslateOptions old;
    memset(&old, 0xAB, sizeof old);
    old.struct_size = (uint32_t)offsetof(TolkTranslateOptions, max_length_factor);
    TolkTranslateOptions untouched = old;
    CHECK_STATUS(tolk_translator_translate_options(en_pt, &old), TOLK_OK);
    CHECK(old.struct_size == offsetof(TolkTranslateOptions, max_length_factor));
    CHECK(old.beam_size == 1 && old.max_batch_size == 64 && old.progress == NULL && old.progress_user_data == NULL);
    CHECK(memcmp((char *)&old + old.struct_size, (char *)&untouched + old.struct_size, sizeof old - old.struct_size) == 0);

    /* A newer caller's bigger struct: the fields this library knows, the rest left alone. */
    struct {
        TolkTranslateOptions options;
        unsigned char newer[16];
    } big;
    memset(&big, 0xCD, sizeof big);
    big.options.struct_size = sizeof big;
    CHECK_STATUS(tolk_translator_translate_options(en_pt, &big.options), TOLK_OK);
    CHECK(big.options.struct_size == sizeof big && big.options.max_length_factor == 2.5f && big.options.use_shortlist);
    for (size_t i = 0; i < sizeof big.newer; i++) CHECK(big.newer[i] == 0xCD);

    /* Sizes no version of the struct has: too small, ending inside max_length_factor. */
    TolkTranslateOptions bad = defaults;
    bad.struct_size = 2;
    CHECK_STATUS(tolk_translator_translate_options(en_pt, &bad), TOLK_ERROR_INVALID_ARGUMENT);
    bad.struct_size = (uint32_t)offsetof(TolkTranslateOptions, max_length_factor) + 2;
    CHECK_STATUS(tolk_translator_translate_options(en_pt, &bad), TOLK_ERROR_INVALID_ARGUMENT);
    TolkTextResult *r = (TolkTextResult *)&r;
    CHECK_STATUS(tolk_translate_text(en_pt, "Hello.", &bad, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(r == NULL);
    if (r != (TolkTextResult *)&r) tolk_text_result_free(r); /* (a wrongly accepted call's result) */

    /* NULL pointers. */
    CHECK_STATUS(tolk_translator_translate_options(NULL, &o), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translator_translate_options(en_pt, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_translator_translate_options(NULL, NULL), TOLK_ERROR_NULL_POINTER);
}

/* ---- Translation options ---- */

/* NULL options are the translator's options, not CTranslate2's defaults (which differ on
 * DIGITS for en-pt); for a CTranslate2 model the two are the same. */
static void test_null_options(const TolkTranslator *en_pt, const TolkTranslator *tiny) {
    TolkTranslateOptions own = translator_options(en_pt);
    TolkTranslateOptions defaults = tolk_translate_options_default();
    const char *sources[] = {ENGLISH, DIGITS};
    for (size_t i = 0; i < 2; i++) {
        char *by_null = translate(en_pt, sources[i], NULL);
        char *by_own = translate(en_pt, sources[i], &own);
        CHECK_SAME(by_null, by_own);
        free(by_null);
        free(by_own);
    }
    char *by_null = translate(en_pt, DIGITS, NULL);
    char *by_defaults = translate(en_pt, DIGITS, &defaults);
    CHECK(by_null && by_defaults && strcmp(by_null, by_defaults) != 0);
    free(by_null);
    free(by_defaults);

    const char *text = "Hello world. How are you?";
    TolkTranslateOptions tiny_own = translator_options(tiny);
    char *tiny_null = translate(tiny, text, NULL);
    char *tiny_by_own = translate(tiny, text, &tiny_own);
    char *tiny_by_defaults = translate(tiny, text, &defaults);
    CHECK_SAME(tiny_null, tiny_by_own);
    CHECK_SAME(tiny_null, tiny_by_defaults);
    free(tiny_null);
    free(tiny_by_own);
    free(tiny_by_defaults);
}

/* The translation of "Love your enemies." when the end token is not allowed before 40
 * tokens: as long as the length factor lets it be (4 source pieces + </s> times 2.5), or
 * 40 tokens and more without a factor. */
static char *forced_long(const TolkTranslator *t, TolkTranslateOptions o) {
    o.min_decoding_length = 40;
    return translate(t, "Love your enemies.", &o);
}

/* A caller built against the header before max_length_factor and use_shortlist: what its
 * struct holds past struct_size (here an invalid factor and the shortlist off) is not read;
 * the package's values (factor 2.5, shortlist on) apply. */
static void test_old_struct_size(const TolkTranslator *en_pt) {
    TolkTranslateOptions full = translator_options(en_pt);
    TolkTranslateOptions old = full;
    old.struct_size = (uint32_t)offsetof(TolkTranslateOptions, max_length_factor);
    old.max_length_factor = -1.0f;
    old.use_shortlist = false;

    /* The factor: bounded as with 2.5, not as with none. */
    char *bounded = forced_long(en_pt, full);
    TolkTranslateOptions unbounded_options = full;
    unbounded_options.max_length_factor = 0.0f;
    char *unbounded = forced_long(en_pt, unbounded_options);
    char *by_old = forced_long(en_pt, old);
    CHECK(bounded && unbounded && strlen(bounded) < strlen(unbounded));
    CHECK(bounded && strncmp(bounded, LOVE_YOUR_ENEMIES, strlen(LOVE_YOUR_ENEMIES)) == 0);
    CHECK_SAME(by_old, bounded);
    free(bounded);
    free(unbounded);
    free(by_old);

    /* The shortlist: on, as the package has it. */
    TolkTranslateOptions off = full;
    off.use_shortlist = false;
    char *with_shortlist = translate(en_pt, DIGITS, &full);
    char *without_shortlist = translate(en_pt, DIGITS, &off);
    by_old = translate(en_pt, DIGITS, &old);
    CHECK_SAME(by_old, with_shortlist);
    CHECK(with_shortlist && without_shortlist && strcmp(with_shortlist, without_shortlist) != 0);
    free(with_shortlist);
    free(without_shortlist);
    free(by_old);

    /* Both calls of the text API and the token API accept it. */
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text_batch(en_pt, &ENGLISH, NULL, 1, &old, NULL, &r), TOLK_OK);
    tolk_text_result_free(r);
    const char *tokens[] = {WORD_START "Love", WORD_START "your", WORD_START "enemies", "."};
    const char *const *batch[] = {tokens};
    size_t length = 4;
    TolkResult *tr = NULL;
    CHECK_STATUS(tolk_translate_batch(en_pt, batch, &length, 1, NULL, NULL, &old, &tr), TOLK_OK);
    CHECK(tolk_result_batch_size(tr) == 1);
    tolk_result_free(tr);
}

/* Without the shortlist the whole output layer is scored: the same translation here. */
static void test_shortlist_off(const TolkTranslator *en_pt) {
    TolkTranslateOptions o = translator_options(en_pt);
    o.use_shortlist = false;
    char *got = translate(en_pt, ENGLISH, &o);
    CHECK(translated_lines(got, ENGLISH_LINES));
    CHECK(got && strncmp(got, LOVE_YOUR_ENEMIES "\n", strlen(LOVE_YOUR_ENEMIES) + 1) == 0);
    free(got);
}

/* A negative, NaN or infinite length factor is an invalid argument, with a message. */
static void test_bad_length_factor(const TolkTranslator *en_pt) {
    const float factors[] = {-1.0f, -0.001f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++) {
        TolkTranslateOptions o = translator_options(en_pt);
        o.max_length_factor = factors[i];
        TolkTextResult *r = (TolkTextResult *)&r;
        CHECK_STATUS(tolk_translate_text(en_pt, "Love your enemies.", &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
        CHECK(r == NULL);
        CHECK_ERROR_MENTIONS("length factor");
        const char *tokens[] = {WORD_START "Love"};
        const char *const *batch[] = {tokens};
        size_t length = 1;
        TolkResult *tr = (TolkResult *)&tr;
        CHECK_STATUS(tolk_translate_batch(en_pt, batch, &length, 1, NULL, NULL, &o, &tr), TOLK_ERROR_INVALID_ARGUMENT);
        CHECK(tr == NULL);
        CHECK_ERROR_MENTIONS("length factor");
    }
}

/* ---- Broken packages ---- */

/* Copies at most `limit` bytes of `src` to `dst`. */
static void copy_file(const char *src, const char *dst, long limit) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    CHECK(in != NULL && out != NULL);
    if (in != NULL && out != NULL) {
        static char buf[1 << 16];
        size_t n;
        long left = limit;
        while (left > 0 && (n = fread(buf, 1, (size_t)left < sizeof buf ? (size_t)left : sizeof buf, in)) > 0) {
            CHECK(fwrite(buf, 1, n, out) == n);
            left -= (long)n;
        }
    }
    if (in) fclose(in);
    if (out) CHECK(fclose(out) == 0);
}

static long file_size(const char *path) {
    struct stat st;
    CHECK(stat(path, &st) == 0);
    return (long)st.st_size;
}

/* A copy of the package in the new folder `dir`, every file whole. */
static void copy_package(const char *dir) {
    CHECK(mkdir(dir, 0700) == 0);
    for (size_t i = 0; i < NUM_PACKAGE_FILES; i++) {
        char src[4096], dst[4096];
        join_path(src, sizeof src, EN_PT_DIR, PACKAGE_FILES[i]);
        join_path(dst, sizeof dst, dir, PACKAGE_FILES[i]);
        copy_file(src, dst, LONG_MAX);
    }
}

/* Removes `dir` and the package files (and the stray file) it may hold. */
static void remove_package(const char *dir) {
    char path[4096];
    for (size_t i = 0; i < NUM_PACKAGE_FILES; i++) {
        join_path(path, sizeof path, dir, PACKAGE_FILES[i]);
        unlink(path);
    }
    join_path(path, sizeof path, dir, "notes.txt");
    unlink(path);
    CHECK(rmdir(dir) == 0);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f != NULL) {
        fputs(text, f);
        CHECK(fclose(f) == 0);
    }
}

/* Flips the lowest bit of the byte at `offset` of `path`. */
static void flip_bit(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (f == NULL) return;
    CHECK(fseek(f, offset, SEEK_SET) == 0);
    int c = getc(f);
    CHECK(c != EOF);
    CHECK(fseek(f, offset, SEEK_SET) == 0);
    putc(c ^ 1, f);
    CHECK(fclose(f) == 0);
}

/* Loading `path` fails with `status`, a message naming `needle`, and no model. */
static void check_load_fails(const char *path, TolkStatus status, const char *needle) {
    TolkModel *model = (TolkModel *)&model; /* garbage the failed call must reset */
    CHECK_STATUS(tolk_model_load(path, &model), status);
    CHECK(model == NULL);
    if (model == NULL && needle != NULL) CHECK_ERROR_MENTIONS(needle);
    if (model != NULL && model != (TolkModel *)&model) tolk_model_free(model);
}

/* A folder with a stray file is neither a CTranslate2 model nor a Marian package: the
 * message says what was looked for. */
static void test_neither_family(const char *root) {
    char dir[4096], stray[4096];
    join_path(dir, sizeof dir, root, "neither");
    CHECK(mkdir(dir, 0700) == 0);
    join_path(stray, sizeof stray, dir, "notes.txt");
    write_file(stray, "nothing to translate with\n");
    check_load_fails(dir, TOLK_ERROR_IO, "model.bin + config.json");
    CHECK_ERROR_MENTIONS("Marian");
    remove_package(dir);
}

/* The model file cut to 1000 bytes, to half its size and to nothing: a clean error, by the
 * directory and by the model file. */
static void test_truncated_model(const char *root) {
    char dir[4096], src[4096], model[4096];
    join_path(dir, sizeof dir, root, "truncated");
    join_path(src, sizeof src, EN_PT_DIR, MODEL_FILE);
    join_path(model, sizeof model, dir, MODEL_FILE);
    copy_package(dir);
    const long sizes[] = {1000, file_size(src) / 2, 0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        copy_file(src, model, sizes[i]);
        CHECK(file_size(model) == sizes[i]);
        check_load_fails(dir, TOLK_ERROR_INVALID_MODEL, MODEL_FILE);
        check_load_fails(model, TOLK_ERROR_INVALID_MODEL, MODEL_FILE);
    }
    remove_package(dir);
}

/* One flipped bit in the shortlist's lists: the load fails naming the checksum (Tolk
 * verifies it although the shipped YAML says `shortlist: [file, false]`, and Bergamot never
 * checks it), by the directory and by the YAML. */
static void test_corrupted_shortlist(const char *root) {
    char dir[4096], shortlist[4096], yaml[4096];
    join_path(dir, sizeof dir, root, "shortlist");
    join_path(shortlist, sizeof shortlist, dir, SHORTLIST_FILE);
    join_path(yaml, sizeof yaml, dir, YAML_FILE);
    copy_package(dir);
    flip_bit(shortlist, file_size(shortlist) / 2 / 4 * 4); /* the low byte of a target id */
    check_load_fails(dir, TOLK_ERROR_INVALID_MODEL, "checksum");
    CHECK_ERROR_MENTIONS(SHORTLIST_FILE);
    check_load_fails(yaml, TOLK_ERROR_INVALID_MODEL, "checksum");
    remove_package(dir);
}

static void test_broken_packages(void) {
    char root[] = "/tmp/tolk-marian-test-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_neither_family(root);
    test_truncated_model(root);
    test_corrupted_shortlist(root);
    CHECK(rmdir(root) == 0);
}

/* ---- Threads ---- */

#define THREADS 4

typedef struct {
    const TolkModel *model;
    int rounds;
    char *output; /* the first round's translation */
    int mismatches;
    int failures;
} ThreadJob;

/* ENGLISH and DIGITS translated in one call (one batch: the shortlist is the batch's, so a
 * sentence's translation may depend on the others), as "english|digits" (malloc'ed), or
 * NULL on failure. */
static char *translate_pair(const TolkTranslator *t) {
    const char *texts[] = {ENGLISH, DIGITS};
    TolkTextResult *r = NULL;
    if (tolk_translate_text_batch(t, texts, NULL, 2, NULL, NULL, &r) != TOLK_OK) return NULL;
    size_t a = 0, b = 0;
    const char *first = tolk_text_result_text(r, 0, &a), *second = tolk_text_result_text(r, 1, &b);
    char *out = malloc(a + b + 2);
    if (out != NULL) snprintf(out, a + b + 2, "%s|%s", first, second);
    tolk_text_result_free(r);
    return out;
}

/* Each thread makes its own translator of the shared model and translates `rounds` times. */
static void *thread_main(void *arg) {
    ThreadJob *job = arg;
    TolkTranslator *t = NULL;
    if (tolk_translator_new(job->model, NULL, &t) != TOLK_OK) {
        job->failures++;
        return NULL;
    }
    for (int round = 0; round < job->rounds; round++) {
        char *out = translate_pair(t);
        if (out == NULL) {
            job->failures++;
        } else if (job->output == NULL) {
            job->output = out;
        } else {
            job->mismatches += strcmp(out, job->output) != 0;
            free(out);
        }
    }
    tolk_translator_free(t);
    return NULL;
}

/* 4 threads, each making its own translator of one shared model, translate at once: the
 * same as one translator alone. */
static void test_threads(void) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(EN_PT_DIR, &model), TOLK_OK);
    if (model == NULL) return;
    TolkTranslator *alone = NULL;
    CHECK_STATUS(tolk_translator_new(model, NULL, &alone), TOLK_OK);
    char *reference = alone ? translate_pair(alone) : NULL;
    CHECK(reference != NULL && strncmp(reference, LOVE_YOUR_ENEMIES, strlen(LOVE_YOUR_ENEMIES)) == 0);
    tolk_translator_free(alone);

    static ThreadJob jobs[THREADS];
    pthread_t threads[THREADS];
    bool started[THREADS] = {false};
    for (int i = 0; i < THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].model = model;
        jobs[i].rounds = under_valgrind ? 1 : 3;
        started[i] = pthread_create(&threads[i], NULL, thread_main, &jobs[i]) == 0;
        CHECK(started[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        if (started[i]) pthread_join(threads[i], NULL);
    }
    tolk_model_free(model);
    for (int i = 0; i < THREADS; i++) {
        if (!started[i]) continue;
        CHECK(jobs[i].failures == 0 && jobs[i].mismatches == 0);
        CHECK_SAME(jobs[i].output, reference);
        free(jobs[i].output);
    }
    free(reference);
}

/* tolk_model_description names the family and what the Marian package brings. */
static void test_descriptions(void) {
    CHECK(tolk_model_description(NULL) == NULL);
    const char *dirs[2] = {EN_PT_DIR, TINY_DIR};
    const char *expected[2][3] = {{"Marian", "SSRU", "shortlist"}, {"CTranslate2", "Transformer", "Transformer"}};
    for (int i = 0; i < 2; i++) {
        TolkModel *model = NULL;
        CHECK_STATUS(tolk_model_load(dirs[i], &model), TOLK_OK);
        if (model == NULL) continue;
        const char *d = tolk_model_description(model);
        CHECK(d != NULL);
        for (int j = 0; d != NULL && j < 3; j++) CHECK(strstr(d, expected[i][j]) != NULL);
        tolk_model_free(model);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: marian_test TINY_DIR EN_PT_DIR\n");
        return 2;
    }
    TINY_DIR = argv[1];
    EN_PT_DIR = argv[2];
    const char *valgrind = getenv("TOLK_FFI_VALGRIND");
    under_valgrind = valgrind != NULL && strcmp(valgrind, "1") == 0;

    TolkTranslator *en_pt = load_translator(EN_PT_DIR);
    TolkTranslator *tiny = load_translator(TINY_DIR);
    if (en_pt == NULL || tiny == NULL) {
        tolk_translator_free(en_pt);
        tolk_translator_free(tiny);
        return finish("marian_test");
    }
    test_descriptions();
    test_load_paths(en_pt);
    test_translator_options(en_pt, tiny);
    test_null_options(en_pt, tiny);
    test_old_struct_size(en_pt);
    test_shortlist_off(en_pt);
    test_bad_length_factor(en_pt);
    tolk_translator_free(en_pt);
    tolk_translator_free(tiny);
    test_broken_packages();
    test_threads();
    return finish("marian_test");
}
