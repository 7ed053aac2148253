/*
 * tolk-translate: translate one sentence per line from stdin to stdout with libtolk.
 *
 *   tolk-translate --model DIR --tokens [--beam N] [--n-best N] [--scores] < in > out
 *
 * With --tokens, input lines are space-separated tokens (e.g. SentencePiece pieces) and
 * output lines are space-separated target tokens. All of stdin is translated in one
 * tolk_translate_batch call: the library sorts by length and batches internally.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tolk.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: tolk-translate --model DIR --tokens [options] < input > output\n"
            "  --model DIR            CTranslate2 model directory (required)\n"
            "  --tokens               input/output are space-separated tokens\n"
            "  --compute-type T       default|auto|float32 (default: default)\n"
            "  --beam N               beam size, 1 = greedy (default 2)\n"
            "  --n-best N             hypotheses per sentence, one line each (default 1)\n"
            "  --max-batch-size N     sentences (or tokens) per batch, 0 = all (default 0)\n"
            "  --batch-type T         examples|tokens (default examples)\n"
            "  --intra-threads N      threads per translation (default 1)\n"
            "  --max-decoding-length N  (default 256)\n"
            "  --length-penalty F     (default 1.0)\n"
            "  --scores               prefix each line with its score and \" ||| \"\n"
            "  --verbose              print the library version and CPU kernel path to stderr\n");
}

static int fail(const char *what) {
    fprintf(stderr, "tolk-translate: %s\n", what);
    return 2;
}

/* Parses a non-negative integer option value; returns false on garbage. */
static bool parse_uint(const char *s, unsigned *out) {
    if (s == NULL || *s == '\0') return false;
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > 1000000000UL || s[0] == '-') return false;
    *out = (unsigned)v;
    return true;
}

/* One input sentence: its tokens point into a private copy of the line. */
typedef struct {
    char *line;
    const char **tokens;
    size_t length;
} Sentence;

static bool split_tokens(char *line, Sentence *s) {
    size_t cap = 16, n = 0;
    const char **tokens = malloc(cap * sizeof *tokens);
    if (tokens == NULL) return false;
    for (char *tok = strtok(line, " \t\r\n"); tok != NULL; tok = strtok(NULL, " \t\r\n")) {
        if (n == cap) {
            cap *= 2;
            const char **grown = realloc(tokens, cap * sizeof *tokens);
            if (grown == NULL) {
                free(tokens);
                return false;
            }
            tokens = grown;
        }
        tokens[n++] = tok;
    }
    s->line = line;
    s->tokens = tokens;
    s->length = n;
    return true;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *compute_type = NULL;
    bool tokens_mode = false, scores = false, verbose = false;
    unsigned n_best = 1, threads = 1;
    TolkTranslateOptions opts = tolk_translate_options_default();

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokens")) {
            tokens_mode = true;
        } else if (!strcmp(a, "--scores")) {
            scores = true;
        } else if (!strcmp(a, "--verbose")) {
            verbose = true;
        } else if (v == NULL) {
            fprintf(stderr, "tolk-translate: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--model")) {
            model_dir = v, i++;
        } else if (!strcmp(a, "--compute-type")) {
            compute_type = v, i++;
        } else if (!strcmp(a, "--batch-type")) {
            if (!strcmp(v, "examples")) opts.batch_type = TOLK_BATCH_EXAMPLES;
            else if (!strcmp(v, "tokens")) opts.batch_type = TOLK_BATCH_TOKENS;
            else return fail("--batch-type must be examples or tokens");
            i++;
        } else if (!strcmp(a, "--length-penalty")) {
            char *end = NULL;
            opts.length_penalty = strtof(v, &end);
            if (end == v || *end != '\0') return fail("--length-penalty needs a number");
            i++;
        } else if (parse_uint(v, &u)) {
            if (!strcmp(a, "--beam")) opts.beam_size = u;
            else if (!strcmp(a, "--n-best")) n_best = u;
            else if (!strcmp(a, "--max-batch-size")) opts.max_batch_size = u;
            else if (!strcmp(a, "--intra-threads")) threads = u;
            else if (!strcmp(a, "--max-decoding-length")) opts.max_decoding_length = u;
            else {
                fprintf(stderr, "tolk-translate: unknown option %s\n", a);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "tolk-translate: %s needs a non-negative integer, got \"%s\"\n", a, v);
            return 2;
        }
    }
    if (model_dir == NULL) {
        usage(stderr);
        return fail("--model DIR is required");
    }
    if (!tokens_mode) return fail("text mode needs the built-in tokenizer (not available yet); use --tokens");
    opts.num_hypotheses = n_best;
    opts.return_scores = scores;
    if (verbose) fprintf(stderr, "tolk %s (ABI %u), CPU kernels: %s\n", tolk_version(), tolk_abi_version(), tolk_cpu_isa());

    /* Read every line of stdin. */
    size_t count = 0, cap = 64;
    Sentence *sentences = malloc(cap * sizeof *sentences);
    if (sentences == NULL) return fail("out of memory");
    char *line = NULL;
    size_t line_cap = 0;
    while (getline(&line, &line_cap, stdin) != -1) {
        if (count == cap) {
            cap *= 2;
            Sentence *grown = realloc(sentences, cap * sizeof *sentences);
            if (grown == NULL) return fail("out of memory");
            sentences = grown;
        }
        if (!split_tokens(line, &sentences[count])) return fail("out of memory");
        count++;
        line = NULL; /* the sentence owns the buffer now */
        line_cap = 0;
    }
    free(line);

    int status = 0;
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
    TolkResult *result = NULL;
    const char *const **batch = malloc((count ? count : 1) * sizeof *batch);
    size_t *lengths = malloc((count ? count : 1) * sizeof *lengths);
    if (batch == NULL || lengths == NULL) return fail("out of memory");
    for (size_t i = 0; i < count; i++) {
        batch[i] = sentences[i].tokens;
        lengths[i] = sentences[i].length;
    }

    TolkTranslatorOptions topts = tolk_translator_options_default();
    topts.compute_type = compute_type;
    topts.intra_threads = threads;
    if (tolk_model_load(model_dir, &model) != TOLK_OK ||
        tolk_translator_new(model, &topts, &translator) != TOLK_OK ||
        tolk_translate_batch(translator, batch, lengths, count, NULL, NULL, &opts, &result) != TOLK_OK) {
        fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
        status = 1;
    } else {
        for (size_t i = 0; i < count; i++) {
            size_t nh = tolk_result_num_hypotheses(result, i);
            for (size_t h = 0; h < nh; h++) {
                const char *const *out;
                size_t n;
                float score;
                if (tolk_result_hypothesis(result, i, h, &out, &n, &score) != TOLK_OK) {
                    fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
                    status = 1;
                    break;
                }
                if (scores) printf("%.6f ||| ", score);
                for (size_t t = 0; t < n; t++) printf(t ? " %s" : "%s", out[t]);
                putchar('\n');
            }
        }
    }
    tolk_result_free(result);
    tolk_translator_free(translator);
    tolk_model_free(model);
    for (size_t i = 0; i < count; i++) {
        free(sentences[i].line);
        free(sentences[i].tokens);
    }
    free(sentences);
    free(batch);
    free(lengths);
    if (fflush(stdout) != 0) return fail("cannot write the output");
    return status;
}
