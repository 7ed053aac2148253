/*
 * tolk_model_load_from_memory: a package's files read into malloc'd buffers, loaded from
 * memory, the buffers scribbled over and freed, then translated (tokens and text, and with
 * translators of other compute types, which load the weights again from the model's own
 * copy) exactly as the same package loaded from its directory; NULL and invalid arguments;
 * broken file sets. Built against include/tolk.h and run by tests/ffi.rs (also under
 * valgrind when it is installed, so every path must free what it allocates).
 *
 *   memory_test TINY_DIR [ZH_EN_DIR [EN_PT_DIR]]   (TINY_DIR: ffi-tests/fixtures/tiny;
 *                                                  "-" skips a model)
 *
 * TOLK_FFI_VALGRIND=1 (set by tests/ffi.rs under valgrind): the real models translate one
 * sentence instead of two; every check still runs.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "check.h"

static bool under_valgrind;

/* The regular files of a directory, each read into its own malloc'd buffer. */
typedef struct {
    TolkModelFile *files;
    size_t count;
} Package;

static void package_free(Package *p) {
    for (size_t i = 0; i < p->count; i++) {
        free((void *)p->files[i].name);
        free((void *)p->files[i].data);
    }
    free(p->files);
    p->files = NULL;
    p->count = 0;
}

/* Scribbles over the buffers, then frees them: a model must not have kept pointers into them. */
static void package_scribble_and_free(Package *p) {
    for (size_t i = 0; i < p->count; i++) memset((void *)p->files[i].data, 0xA5, p->files[i].size);
    package_free(p);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    snprintf(path, n, "%s/%s", dir, name);
    return path;
}

static char *copy_string(const char *s) {
    char *c = malloc(strlen(s) + 1);
    strcpy(c, s);
    return c;
}

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(n > 0 ? (size_t)n : 1);
    *size = fread(data, 1, (size_t)n, f);
    fclose(f);
    return data;
}

static Package package_read(const char *dir) {
    Package p = {NULL, 0};
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return p;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *path = path_join(dir, e->d_name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            p.files = realloc(p.files, (p.count + 1) * sizeof *p.files);
            TolkModelFile *f = &p.files[p.count++];
            f->name = copy_string(e->d_name);
            f->data = read_file(path, &f->size);
            CHECK(f->data != NULL && f->size == (size_t)st.st_size);
        }
        free(path);
    }
    closedir(d);
    return p;
}

static TolkModelFile *find(Package *p, const char *name) {
    for (size_t i = 0; i < p->count; i++)
        if (!strcmp(p->files[i].name, name)) return &p->files[i];
    return NULL;
}

/* A model loaded from memory with the package's buffers freed right after the call. */
static TolkModel *load_from_memory(const char *dir, const TolkModelOptions *options) {
    Package p = package_read(dir);
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load_from_memory(p.files, p.count, options, &model), TOLK_OK);
    package_scribble_and_free(&p);
    return model;
}

static TolkModel *load_dir(const char *dir) {
    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(dir, &model), TOLK_OK);
    return model;
}

static TolkTranslator *translator(const TolkModel *model, const char *compute_type) {
    TolkTranslatorOptions o = tolk_translator_options_default();
    o.compute_type = compute_type;
    TolkTranslator *t = NULL;
    CHECK_STATUS(tolk_translator_new(model, &o, &t), TOLK_OK);
    return t;
}

/* Translates `batch` (beam 2, scores) with both models as `compute_type` and checks that
 * every token and score agree. */
static void same_tokens(const TolkModel *a, const TolkModel *b, const char *compute_type,
                        const char *const *const *batch, const size_t *lengths, size_t n) {
    TolkTranslator *ta = translator(a, compute_type), *tb = translator(b, compute_type);
    TolkTranslateOptions o = tolk_translate_options_default();
    o.return_scores = true;
    o.max_decoding_length = 32;
    TolkResult *ra = NULL, *rb = NULL;
    CHECK_STATUS(tolk_translate_batch(ta, batch, lengths, n, NULL, NULL, &o, &ra), TOLK_OK);
    CHECK_STATUS(tolk_translate_batch(tb, batch, lengths, n, NULL, NULL, &o, &rb), TOLK_OK);
    CHECK(tolk_result_batch_size(ra) == n && tolk_result_batch_size(rb) == n);
    for (size_t i = 0; ra && rb && i < n; i++) {
        const char *const *xa = NULL, *const *xb = NULL;
        size_t la = 0, lb = 0;
        float sa = 0, sb = 1;
        CHECK_STATUS(tolk_result_hypothesis(ra, i, 0, &xa, &la, &sa), TOLK_OK);
        CHECK_STATUS(tolk_result_hypothesis(rb, i, 0, &xb, &lb, &sb), TOLK_OK);
        CHECK(la == lb && sa == sb);
        for (size_t t = 0; la == lb && t < la; t++) CHECK(!strcmp(xa[t], xb[t]));
    }
    tolk_result_free(ra);
    tolk_result_free(rb);
    tolk_translator_free(ta);
    tolk_translator_free(tb);
}

/* Translates `text` with both models and checks the texts agree; returns model a's
 * translation (malloc'd) for further checks. */
static char *same_text(const TolkModel *a, const TolkModel *b, const char *text) {
    TolkTranslator *ta = translator(a, NULL), *tb = translator(b, NULL);
    TolkTranslateOptions o = tolk_translate_options_default();
    CHECK_STATUS(tolk_translator_translate_options(ta, &o), TOLK_OK); /* a Marian package's own */
    o.max_decoding_length = 64;
    TolkTextResult *ra = NULL, *rb = NULL;
    CHECK_STATUS(tolk_translate_text(ta, text, &o, NULL, &ra), TOLK_OK);
    CHECK_STATUS(tolk_translate_text(tb, text, &o, NULL, &rb), TOLK_OK);
    const char *xa = tolk_text_result_text(ra, 0, NULL), *xb = tolk_text_result_text(rb, 0, NULL);
    CHECK(xa != NULL && xb != NULL && !strcmp(xa, xb));
    char *out = copy_string(xa ? xa : "");
    tolk_text_result_free(ra);
    tolk_text_result_free(rb);
    tolk_translator_free(ta);
    tolk_translator_free(tb);
    return out;
}

/* The fixture's tokens: plain, non-ASCII, an unknown token, empty. */
static const char *S0[] = {"a", "b", "c"};
static const char *S1[] = {"\xe2\x96\x81\xc3\xa9", "q", "x"};
static const char *S2[] = {"m", "not-in-vocabulary", "n"};
static const char *const *TINY_BATCH[] = {S0, S1, S2, NULL};
static const size_t TINY_LENGTHS[] = {3, 3, 3, 0};

static void test_tiny(const char *dir) {
    TolkModel *memory = load_from_memory(dir, NULL), *directory = load_dir(dir);
    CHECK(memory && directory);
    if (memory && directory) {
        CHECK(!strcmp(tolk_model_compute_type(memory), tolk_model_compute_type(directory)));
        CHECK(!strcmp(tolk_model_description(memory), tolk_model_description(directory)));
        /* NULL: the model's type; the others load the weights again from the model's copy. */
        const char *types[] = {NULL, "float32", "int8", "int16"};
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) same_tokens(memory, directory, types[i], TINY_BATCH, TINY_LENGTHS, 4);
        free(same_text(memory, directory, "Hello world. How are you?\nThe cat sat on the mat."));
    }
    /* A translator outlives the model it was made from, and the copy with it. */
    TolkTranslator *t = memory ? translator(memory, "float32") : NULL;
    tolk_model_free(memory);
    TolkResult *r = NULL;
    CHECK_STATUS(tolk_translate_batch(t, TINY_BATCH, TINY_LENGTHS, 4, NULL, NULL, NULL, &r), TOLK_OK);
    tolk_result_free(r);
    tolk_translator_free(t);

    /* The tokenizer named among the files (not a path); a name that is not there fails. */
    TolkModelOptions o = tolk_model_options_default();
    o.source_tokenizer = "sentencepiece.model";
    memory = load_from_memory(dir, &o);
    if (memory && directory) free(same_text(memory, directory, "Hello world."));
    tolk_model_free(memory);
    Package p = package_read(dir);
    o.source_tokenizer = "missing.model";
    memory = (TolkModel *)&memory;
    CHECK_STATUS(tolk_model_load_from_memory(p.files, p.count, &o, &memory), TOLK_ERROR_IO);
    CHECK(memory == NULL && strstr(tolk_last_error(), "missing.model"));
    /* An older, smaller options struct: the fields it has. */
    o = tolk_model_options_default();
    o.struct_size = (uint32_t)offsetof(TolkModelOptions, target_tokenizer);
    o.compute_type = "int16";
    CHECK_STATUS(tolk_model_load_from_memory(p.files, p.count, &o, &memory), TOLK_OK);
    CHECK(memory && !strcmp(tolk_model_compute_type(memory), "int16"));
    tolk_model_free(memory);
    package_free(&p);
    tolk_model_free(directory);
}

static void test_invalid_arguments(const char *dir) {
    Package p = package_read(dir);
    TolkModel *m = (TolkModel *)&m; /* garbage that a failed call must reset to NULL */
    CHECK_STATUS(tolk_model_load_from_memory(NULL, 1, NULL, &m), TOLK_ERROR_NULL_POINTER);
    CHECK(m == NULL && strstr(tolk_last_error(), "files"));
    CHECK_STATUS(tolk_model_load_from_memory(p.files, p.count, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK_STATUS(tolk_model_load_from_memory(p.files, 0, NULL, &m), TOLK_ERROR_INVALID_ARGUMENT);
    TolkModelOptions bad = tolk_model_options_default();
    bad.struct_size = 3;
    CHECK_STATUS(tolk_model_load_from_memory(p.files, p.count, &bad, &m), TOLK_ERROR_INVALID_ARGUMENT);
    bad = tolk_model_options_default();
    bad.compute_type = "int3";
    CHECK_STATUS(tolk_model_load_from_memory(p.files, p.count, &bad, &m), TOLK_ERROR_INVALID_ARGUMENT);

    /* Each broken entry in turn, in a copy of the array (the buffers are shared). */
    TolkModelFile *files = malloc((p.count + 1) * sizeof *files);
    TolkModelFile *bin = find(&p, "model.bin");
    CHECK(bin != NULL);
    if (!bin) {
        free(files);
        package_free(&p);
        return;
    }
    size_t at = (size_t)(bin - p.files);
#define WITH(field, value, status, message)                                          \
    do {                                                                             \
        memcpy(files, p.files, p.count * sizeof *files);                             \
        files[at].field = value;                                                     \
        m = (TolkModel *)&m;                                                         \
        CHECK_STATUS(tolk_model_load_from_memory(files, p.count, NULL, &m), status); \
        CHECK(m == NULL && strstr(tolk_last_error(), message));                     \
    } while (0)
    WITH(name, NULL, TOLK_ERROR_INVALID_ARGUMENT, ".name is NULL");
    WITH(name, "\xff.bin", TOLK_ERROR_INVALID_ARGUMENT, "UTF-8");
    WITH(name, "../model.bin", TOLK_ERROR_INVALID_ARGUMENT, "../model.bin");
    WITH(name, "config.json", TOLK_ERROR_INVALID_ARGUMENT, "twice");
    WITH(data, NULL, TOLK_ERROR_INVALID_ARGUMENT, "NULL data");
    WITH(size, 0, TOLK_ERROR_INVALID_ARGUMENT, "\"model.bin\" is empty");
    WITH(size, bin->size / 2, TOLK_ERROR_INVALID_MODEL, "truncated");
    WITH(size, 5, TOLK_ERROR_INVALID_MODEL, "model.bin");
    WITH(name, "readme.txt", TOLK_ERROR_IO, "readme.txt"); /* no model among the names */
#undef WITH
    static const char garbage[] = "\x06\0\0\0 this is no model";
    memcpy(files, p.files, p.count * sizeof *files);
    files[at].data = garbage;
    files[at].size = sizeof garbage - 1;
    CHECK_STATUS(tolk_model_load_from_memory(files, p.count, NULL, &m), TOLK_ERROR_INVALID_MODEL);
    /* Without model.bin: the message lists the names given. */
    size_t n = 0;
    for (size_t i = 0; i < p.count; i++)
        if (i != at) files[n++] = p.files[i];
    CHECK_STATUS(tolk_model_load_from_memory(files, n, NULL, &m), TOLK_ERROR_IO);
    CHECK(strstr(tolk_last_error(), "config.json") && strstr(tolk_last_error(), "shared_vocabulary.json"));
    /* One file more than the package (an unrelated one) changes nothing. */
    memcpy(files, p.files, p.count * sizeof *files);
    files[p.count] = (TolkModelFile){"notes.txt", "hello", 5};
    CHECK_STATUS(tolk_model_load_from_memory(files, p.count + 1, NULL, &m), TOLK_OK);
    tolk_model_free(m);
    free(files);
    package_free(&p);
}

/* A real package: its text translation from memory is the directory's, and contains
 * `expect`. */
static void test_real(const char *dir, const char *text, const char *expect) {
    TolkModel *memory = load_from_memory(dir, NULL), *directory = load_dir(dir);
    CHECK(memory && directory);
    if (memory && directory) {
        CHECK(!strcmp(tolk_model_description(memory), tolk_model_description(directory)));
        char *out = same_text(memory, directory, text);
        CHECK(strstr(out, expect) != NULL);
        printf("%s -> %s\n", dir, out);
        free(out);
    }
    tolk_model_free(memory);
    tolk_model_free(directory);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s TINY_DIR [ZH_EN_DIR [EN_PT_DIR]]\n", argv[0]);
        return 2;
    }
    const char *valgrind = getenv("TOLK_FFI_VALGRIND");
    under_valgrind = valgrind != NULL && strcmp(valgrind, "1") == 0;
    test_tiny(argv[1]);
    test_invalid_arguments(argv[1]);
    if (argc > 2 && strcmp(argv[2], "-") != 0)
        test_real(argv[2], under_valgrind ? "你们要彼此相爱。" : "你们要彼此相爱。我是世界的光。", "love");
    if (argc > 3 && strcmp(argv[3], "-") != 0)
        test_real(argv[3], under_valgrind ? "Love your enemies." : "Love your enemies. I am the way, the truth, and the life.",
                  "Ame seus inimigos.");
    return finish("memory_test");
}
