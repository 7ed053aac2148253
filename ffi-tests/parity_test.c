/*
 * Parity with CTranslate2 through the C API: translates the sources of MODEL_DIR/expected.json
 * (written by ffi-tests/fixtures/make_tiny.py with ctranslate2) with each recorded option
 * set and compares every hypothesis token for token, scores within 1e-4. Each run is also
 * repeated with the library's internal batching (one sentence per batch, token batches) and
 * with 3 threads per translation, which must not change the results.
 *
 *   parity_test MODEL_DIR      (MODEL_DIR: ffi-tests/fixtures/tiny)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "check.h"

#define SCORE_TOLERANCE 1e-4

/* ---- A minimal JSON reader: enough for expected.json (UTF-8 text, \uXXXX escapes). ---- */

typedef enum { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT } JsonType;

typedef struct Json {
    JsonType type;
    double number;       /* J_NUMBER, J_BOOL (0 or 1) */
    char *string;        /* J_STRING */
    char *key;           /* set on the members of a J_OBJECT */
    struct Json *items;  /* J_ARRAY elements, J_OBJECT members */
    size_t count;
} Json;

typedef struct {
    const char *p;
    bool ok;
} Parser;

static void json_free(Json *j) {
    for (size_t i = 0; i < j->count; i++) json_free(&j->items[i]);
    free(j->items);
    free(j->string);
    free(j->key);
}

static void skip_space(Parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t') ps->p++;
}

static bool expect(Parser *ps, char c) {
    skip_space(ps);
    if (*ps->p != c) return ps->ok = false;
    ps->p++;
    return true;
}

/* Appends the UTF-8 encoding of a BMP code point. */
static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

static char *parse_string(Parser *ps) {
    if (!expect(ps, '"')) return NULL;
    const char *end = ps->p;
    while (*end && *end != '"') end += (*end == '\\' && end[1]) ? 2 : 1;
    char *out = malloc((size_t)(end - ps->p) + 1); /* escapes never grow the text */
    size_t n = 0;
    while (out && ps->ok && ps->p < end) {
        char c = *ps->p++;
        if (c != '\\') {
            out[n++] = c;
            continue;
        }
        c = ps->p < end ? *ps->p++ : '\0';
        const char *simple = c ? strchr("\"\\/bfnrt", c) : NULL;
        if (simple != NULL) {
            out[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
        } else if (c == 'u' && end - ps->p >= 4) {
            unsigned cp = 0;
            for (int i = 0; i < 4; i++) {
                char h = (char)(*ps->p++ | 0x20); /* lower case */
                if (h >= '0' && h <= '9') cp = cp * 16 + (unsigned)(h - '0');
                else if (h >= 'a' && h <= 'f') cp = cp * 16 + (unsigned)(h - 'a' + 10);
                else ps->ok = false;
            }
            n += put_utf8(out + n, cp); /* surrogate pairs are not needed here */
        } else {
            ps->ok = false;
        }
    }
    if (out == NULL || !ps->ok || *ps->p != '"') {
        free(out);
        ps->ok = false;
        return NULL;
    }
    ps->p++;
    out[n] = '\0';
    return out;
}

static bool parse_value(Parser *ps, Json *out, int depth);

/* Parses the items of an array or object after its opening bracket. */
static bool parse_items(Parser *ps, Json *out, char close, int depth) {
    size_t cap = 0;
    skip_space(ps);
    if (*ps->p == close) return ps->p++, true;
    do {
        if (out->count == cap) {
            cap = cap ? 2 * cap : 4;
            Json *grown = realloc(out->items, cap * sizeof *grown);
            if (grown == NULL) return ps->ok = false;
            out->items = grown;
        }
        Json *item = &out->items[out->count];
        memset(item, 0, sizeof *item);
        out->count++;
        if (close == '}' && ((item->key = parse_string(ps)) == NULL || !expect(ps, ':'))) return false;
        if (!parse_value(ps, item, depth + 1)) return false;
        skip_space(ps);
    } while (*ps->p == ',' && ps->p++);
    return expect(ps, close);
}

static bool parse_value(Parser *ps, Json *out, int depth) {
    skip_space(ps);
    if (depth > 32) return ps->ok = false;
    char c = *ps->p;
    if (c == '{' || c == '[') {
        ps->p++;
        out->type = c == '{' ? J_OBJECT : J_ARRAY;
        return parse_items(ps, out, c == '{' ? '}' : ']', depth);
    }
    if (c == '"') {
        out->type = J_STRING;
        return (out->string = parse_string(ps)) != NULL;
    }
    static const struct { const char *word; JsonType type; double value; } literals[] = {
        {"true", J_BOOL, 1}, {"false", J_BOOL, 0}, {"null", J_NULL, 0}};
    for (size_t i = 0; i < 3; i++) {
        size_t len = strlen(literals[i].word);
        if (!strncmp(ps->p, literals[i].word, len)) {
            ps->p += len;
            out->type = literals[i].type;
            out->number = literals[i].value;
            return true;
        }
    }
    char *end = NULL;
    out->type = J_NUMBER;
    out->number = strtod(ps->p, &end);
    if (end == ps->p) return ps->ok = false;
    ps->p = end;
    return true;
}

/* Reads and parses a whole file; false (with a message) on failure. */
static bool json_load(const char *path, Json *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "cannot open %s\n", path);
        return false;
    }
    size_t len = 0, cap = 1 << 16, got;
    char *text = malloc(cap);
    while (text != NULL && (got = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            char *grown = realloc(text, cap *= 2);
            if (grown == NULL) free(text);
            text = grown;
        }
    }
    fclose(f);
    if (text == NULL) return false;
    text[len] = '\0';
    Parser ps = {text, true};
    bool ok = parse_value(&ps, out, 0) && ps.ok;
    skip_space(&ps);
    ok = ok && *ps.p == '\0';
    if (!ok) fprintf(stderr, "%s: JSON syntax error at byte %ld\n", path, (long)(ps.p - text));
    free(text);
    return ok;
}

static const Json *json_get(const Json *object, const char *key) {
    for (size_t i = 0; object != NULL && object->type == J_OBJECT && i < object->count; i++)
        if (!strcmp(object->items[i].key, key)) return &object->items[i];
    return NULL;
}

/* The array `j` (or an empty one when `j` is missing or not an array). */
static size_t json_len(const Json *j) {
    return j != NULL && j->type == J_ARRAY ? j->count : 0;
}

/* ---- The test ---- */

/* One option set of expected.json as C API options. */
static TolkTranslateOptions options_of(const Json *o) {
    TolkTranslateOptions opts = tolk_translate_options_default();
    const Json *v;
    if ((v = json_get(o, "beam_size"))) opts.beam_size = (uint32_t)v->number;
    if ((v = json_get(o, "num_hypotheses"))) opts.num_hypotheses = (uint32_t)v->number;
    if ((v = json_get(o, "return_scores"))) opts.return_scores = v->number != 0;
    if ((v = json_get(o, "max_decoding_length"))) opts.max_decoding_length = (uint32_t)v->number;
    if ((v = json_get(o, "length_penalty"))) opts.length_penalty = (float)v->number;
    for (size_t i = 0; i < o->count; i++) {
        const char *k = o->items[i].key;
        if (strcmp(k, "beam_size") && strcmp(k, "num_hypotheses") && strcmp(k, "return_scores") &&
            strcmp(k, "max_decoding_length") && strcmp(k, "length_penalty")) {
            fprintf(stderr, "expected.json: option %s is not handled by parity_test.c\n", k);
            failures++;
        }
    }
    return opts;
}

/* Compares one result with the expected hypotheses of each sentence. */
static void compare(const TolkResult *result, const Json *results, const Json *sources, const char *label) {
    CHECK(tolk_result_batch_size(result) == json_len(results));
    for (size_t i = 0; i < json_len(results) && i < tolk_result_batch_size(result); i++) {
        const Json *hyps = &results->items[i];
        size_t n_hyp = tolk_result_num_hypotheses(result, i);
        if (n_hyp != json_len(hyps)) {
            fprintf(stderr, "%s, sentence %zu: %zu hypotheses, CTranslate2 has %zu\n", label, i, n_hyp, json_len(hyps));
            failures++;
            continue;
        }
        for (size_t h = 0; h < n_hyp; h++) {
            const Json *want = json_get(&hyps->items[h], "tokens"), *want_score = json_get(&hyps->items[h], "score");
            const char *const *tokens = NULL;
            size_t n = 0;
            float score = NAN;
            CHECK_STATUS(tolk_result_hypothesis(result, i, h, &tokens, &n, &score), TOLK_OK);
            bool same = n == json_len(want);
            for (size_t t = 0; same && t < n; t++) same = !strcmp(tokens[t], want->items[t].string);
            bool close = want_score != NULL && fabs(score - want_score->number) <= SCORE_TOLERANCE;
            if (same && close) continue;
            failures++;
            fprintf(stderr, "%s, sentence %zu (", label, i);
            for (size_t t = 0; t < json_len(&sources->items[i]); t++) fprintf(stderr, t ? " %s" : "%s", sources->items[i].items[t].string);
            fprintf(stderr, "), hypothesis %zu:\n  tolk:        %.6f |", h, score);
            for (size_t t = 0; t < n; t++) fprintf(stderr, " %s", tokens[t]);
            fprintf(stderr, "\n  ctranslate2: %.6f |", want_score ? want_score->number : NAN);
            for (size_t t = 0; t < json_len(want); t++) fprintf(stderr, " %s", want->items[t].string);
            fprintf(stderr, "\n");
        }
    }
}

static void run_case(const TolkTranslator *translator, const Json *run, size_t index) {
    const Json *sources = json_get(run, "sources"), *results = json_get(run, "results");
    const Json *options = json_get(run, "options");
    size_t count = json_len(sources);
    if (options == NULL || results == NULL || count == 0) {
        fprintf(stderr, "expected.json: run %zu lacks options, sources or results\n", index);
        failures++;
        return;
    }
    /* The token arrays point at the strings of the parsed JSON. */
    const char ***batch = calloc(count, sizeof *batch);
    size_t *lengths = calloc(count, sizeof *lengths);
    for (size_t i = 0; batch && lengths && i < count; i++) {
        lengths[i] = json_len(&sources->items[i]);
        batch[i] = malloc((lengths[i] ? lengths[i] : 1) * sizeof **batch);
        for (size_t t = 0; batch[i] && t < lengths[i]; t++) batch[i][t] = sources->items[i].items[t].string;
    }
    /* The recorded options as one batch, then split by the library in two ways. */
    static const struct { const char *name; uint32_t max_batch_size; uint32_t batch_type; } splits[] = {
        {"one batch", 0, TOLK_BATCH_EXAMPLES},
        {"max_batch_size 1", 1, TOLK_BATCH_EXAMPLES},
        {"max_batch_size 12 tokens", 12, TOLK_BATCH_TOKENS},
    };
    for (size_t s = 0; s < sizeof splits / sizeof *splits; s++) {
        TolkTranslateOptions opts = options_of(options);
        opts.max_batch_size = splits[s].max_batch_size;
        opts.batch_type = splits[s].batch_type;
        char label[128];
        snprintf(label, sizeof label, "run %zu (beam %u, %u hypotheses), %s", index, (unsigned)opts.beam_size,
                 (unsigned)opts.num_hypotheses, splits[s].name);
        TolkResult *result = NULL;
        CHECK_STATUS(tolk_translate_batch(translator, (const char *const *const *)batch, lengths, count, NULL, NULL, &opts, &result), TOLK_OK);
        if (result != NULL) compare(result, results, sources, label);
        tolk_result_free(result);
    }
    for (size_t i = 0; batch && i < count; i++) free(batch[i]);
    free(batch);
    free(lengths);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: parity_test MODEL_DIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/expected.json", argv[1]);
    Json expected;
    if (!json_load(path, &expected)) {
        json_free(&expected);
        return 1;
    }
    const Json *runs = json_get(&expected, "runs");
    CHECK(json_len(runs) > 0);

    TolkModel *model = NULL;
    CHECK_STATUS(tolk_model_load(argv[1], &model), TOLK_OK);
    for (uint32_t threads = 1; model != NULL && threads <= 3; threads += 2) {
        TolkTranslatorOptions topts = tolk_translator_options_default();
        topts.compute_type = "float32"; /* expected.json was made with compute_type float32 */
        topts.intra_threads = threads;
        TolkTranslator *translator = NULL;
        CHECK_STATUS(tolk_translator_new(model, &topts, &translator), TOLK_OK);
        for (size_t r = 0; translator != NULL && r < json_len(runs); r++) run_case(translator, &runs->items[r], r);
        tolk_translator_free(translator);
    }
    tolk_model_free(model);
    json_free(&expected);
    return finish("parity_test");
}
