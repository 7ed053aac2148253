/*
 * tolk-translate: translate stdin to stdout line by line with libtolk.
 *
 *   tolk-translate --model DIR [--beam N] < text > translation
 *   tolk-translate --model DIR --tokens [--beam N] [--n-best N] [--scores] < in > out
 *
 * Text mode (default): every input line is plain UTF-8 text, cut into sentences, tokenized
 * with the model package's SentencePiece model, translated and detokenized; each output
 * line is the translation of the input line (empty lines stay empty). A line ends at "\n"
 * (a "\r" before it is dropped too); anything else, a lone "\r" or a NUL byte included,
 * is part of the line's text.
 * With --tokens, input lines are space-separated tokens (e.g. SentencePiece pieces) and
 * output lines are space-separated target tokens; an empty line is an empty sentence.
 * All of stdin is translated in one call: the library sorts by length and splits into
 * batches of --max-batch-size itself. With --progress, the library's progress callback
 * prints "DONE/TOTAL" to stderr after each batch (sentences, and parts of wrapped ones, in
 * text mode; input lines with --tokens).
 *
 * Exit status: 0 on success, 1 when the library reports an error, 2 on bad usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "tolk.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: tolk-translate --model DIR [options] < input > output\n"
            "  --model PATH             model: a CTranslate2 directory, a Marian/Bergamot\n"
            "                           package directory or its YAML (required)\n"
            "  --tokens                 input/output lines are space-separated tokens\n"
            "                           (default: plain text lines)\n"
            "  --split MODE             text mode: sentences|lines, how a line is cut\n"
            "                           (default sentences; lines (or line) = the line is one\n"
            "                           sentence)\n"
            "  --max-sentence-tokens N  text mode: longer sentences are wrapped (default 128)\n"
            "  --source-spm FILE        text mode: source SentencePiece model (default: found\n"
            "                           in the model package)\n"
            "  --target-spm FILE        text mode: target SentencePiece model\n"
            "  --compute-type T         default|auto|float32|int8|int16 (default: as saved)\n"
            "  --device D               auto|cpu|cuda (default auto: a usable CUDA GPU,\n"
            "                           else the CPU)\n"
            "  --device-index N         which GPU (default 0)\n"
            "  --beam N                 beam size, 1 = greedy (default 2, or the package's)\n"
            "  --n-best N               hypotheses per sentence, one line each, best first\n"
            "                           (default 1; at most the beam size)\n"
            "  --max-batch-size N       sentences (or tokens) per batch, 0 = all (default 0,\n"
            "                           or the package's mini-batch)\n"
            "  --batch-type T           examples|tokens: unit of --max-batch-size\n"
            "  --intra-threads N        threads per translation (default 1)\n"
            "  --max-decoding-length N  most tokens generated per sentence (default 256)\n"
            "  --length-penalty F       scores are divided by length^F (default 1)\n"
            "  --no-shortlist           score the whole vocabulary even when the model\n"
            "                           package has a lexical shortlist\n"
            "  --scores                 prefix each line with its score and \" ||| \"\n"
            "                           (text mode: the sentence scores, comma-separated)\n"
            "  --progress               print \"DONE/TOTAL\" sentences to stderr after each batch\n"
            "  --verbose                print the library version, the model and the device\n"
            "  --help                   show this help\n");
}

/* Settings from the command line. */
typedef struct {
    const char *model_dir;
    bool tokens_mode, scores, verbose, progress, no_shortlist;
    /* Which translate options the command line set; the others take the model's defaults. */
    bool set_beam, set_batch, set_length_penalty;
    TolkModelOptions model;
    TolkTranslatorOptions translator;
    TolkTranslateOptions translate;
    TolkTextOptions text;
} Cli;

/* Parses a non-negative integer that fits the uint32_t option fields. strtoul alone would
 * accept "-1" (wrapping it) and trailing garbage, hence the extra checks. */
static bool parse_uint(const char *s, uint32_t *out) {
    char *end = NULL;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

/* Fills `cli`; returns -1 to go on, or the exit status to end with. */
static int parse_args(int argc, char **argv, Cli *cli) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tokens")) {
            cli->tokens_mode = true;
            continue;
        }
        if (!strcmp(a, "--scores")) {
            cli->scores = true;
            continue;
        }
        if (!strcmp(a, "--verbose")) {
            cli->verbose = true;
            continue;
        }
        if (!strcmp(a, "--progress")) {
            cli->progress = true;
            continue;
        }
        if (!strcmp(a, "--no-shortlist")) {
            cli->no_shortlist = true;
            continue;
        }
        cli->set_beam |= !strcmp(a, "--beam");
        cli->set_batch |= !strcmp(a, "--max-batch-size");
        cli->set_length_penalty |= !strcmp(a, "--length-penalty");
        /* Every other option takes a value. */
        uint32_t *number = NULL;
        if (!strcmp(a, "--beam")) number = &cli->translate.beam_size;
        else if (!strcmp(a, "--n-best")) number = &cli->translate.num_hypotheses;
        else if (!strcmp(a, "--max-batch-size")) number = &cli->translate.max_batch_size;
        else if (!strcmp(a, "--intra-threads")) number = &cli->translator.intra_threads;
        else if (!strcmp(a, "--max-decoding-length")) number = &cli->translate.max_decoding_length;
        else if (!strcmp(a, "--max-sentence-tokens")) number = &cli->text.max_sentence_tokens;
        else if (!strcmp(a, "--device-index")) number = &cli->model.device_index;
        else if (strcmp(a, "--model") && strcmp(a, "--compute-type") && strcmp(a, "--device") && strcmp(a, "--batch-type") &&
                 strcmp(a, "--length-penalty") && strcmp(a, "--split") && strcmp(a, "--source-spm") &&
                 strcmp(a, "--target-spm")) {
            fprintf(stderr, "tolk-translate: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (i + 1 == argc) {
            fprintf(stderr, "tolk-translate: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (number != NULL) {
            if (!parse_uint(v, number)) {
                fprintf(stderr, "tolk-translate: %s needs a non-negative integer, got \"%s\"\n", a, v);
                return 2;
            }
        } else if (!strcmp(a, "--model")) {
            cli->model_dir = v;
        } else if (!strcmp(a, "--compute-type")) {
            cli->model.compute_type = v; /* the library validates it */
        } else if (!strcmp(a, "--device")) {
            cli->model.device = v; /* the library validates it */
        } else if (!strcmp(a, "--source-spm")) {
            cli->model.source_tokenizer = v;
        } else if (!strcmp(a, "--target-spm")) {
            cli->model.target_tokenizer = v;
        } else if (!strcmp(a, "--split")) {
            if (!strcmp(v, "sentences")) cli->text.split_mode = TOLK_SPLIT_SENTENCES;
            else if (!strcmp(v, "lines") || !strcmp(v, "line")) cli->text.split_mode = TOLK_SPLIT_LINES;
            else {
                fprintf(stderr, "tolk-translate: --split must be sentences or lines, got \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--batch-type")) {
            if (!strcmp(v, "examples")) cli->translate.batch_type = TOLK_BATCH_EXAMPLES;
            else if (!strcmp(v, "tokens")) cli->translate.batch_type = TOLK_BATCH_TOKENS;
            else {
                fprintf(stderr, "tolk-translate: --batch-type must be examples or tokens, got \"%s\"\n", v);
                return 2;
            }
        } else { /* --length-penalty */
            char *end = NULL;
            cli->translate.length_penalty = strtof(v, &end);
            if (end == v || *end != '\0') {
                fprintf(stderr, "tolk-translate: --length-penalty needs a number, got \"%s\"\n", v);
                return 2;
            }
        }
    }
    if (cli->model_dir == NULL) {
        fprintf(stderr, "tolk-translate: --model DIR is required (see --help)\n");
        return 2;
    }
    if (!cli->tokens_mode && cli->translate.num_hypotheses > 1) {
        fprintf(stderr, "tolk-translate: --n-best needs --tokens (text mode returns one translation)\n");
        return 2;
    }
    return -1;
}

/* --progress: the library calls this on the translating thread (here the main one) after
 * each batch; returning false would cancel the translation (TOLK_ERROR_CANCELLED). */
static bool print_progress(void *user_data, size_t done, size_t total) {
    FILE *out = user_data;
    fprintf(out, "%zu/%zu\n", done, total);
    fflush(out);
    return true;
}

/* The input: every line of stdin split into tokens, which point into the line buffers.
 * Sentences record token offsets, not pointers, because the token array moves as it grows.
 * In text mode a line is kept whole with its length in bytes (it may hold NUL bytes). */
typedef struct {
    char *line;
    size_t bytes;         /* text mode: the line's length without its line break */
    size_t first, length; /* tokens[first .. first + length] */
} Sentence;

typedef struct {
    Sentence *sentences;
    size_t count, cap;
    const char **tokens;
    size_t num_tokens, tokens_cap;
} Input;

static void input_free(Input *in) {
    for (size_t i = 0; i < in->count; i++) free(in->sentences[i].line);
    free(in->sentences);
    free(in->tokens);
}

/* Grows an array to hold `need` elements (doubling); false when out of memory. */
static bool reserve(void **array, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *grown = realloc(*array, n * elem);
    if (grown == NULL) return false;
    *array = grown;
    *cap = n;
    return true;
}

/* Reads lines of any length (getline) until EOF, split into tokens when `tokenize`, else
 * kept whole without their line break ("\n", then one "\r" before it); false on a read
 * error or out of memory. */
static bool read_input(FILE *f, bool tokenize, Input *in) {
    char *line = NULL;
    size_t line_cap = 0;
    bool ok = true;
    ssize_t got;
    while (ok && (got = getline(&line, &line_cap, f)) != -1) {
        if (!reserve((void **)&in->sentences, &in->cap, in->count + 1, sizeof *in->sentences)) {
            ok = false;
            break;
        }
        Sentence *s = &in->sentences[in->count++];
        s->line = line; /* the input owns the buffer now */
        s->first = in->num_tokens;
        line = NULL;
        line_cap = 0;
        if (!tokenize) {
            /* getline's count, not strlen: a NUL byte is text like any other. Only the line
             * break goes: a lone "\r" inside the line is the library's to handle. */
            size_t n = (size_t)got;
            if (n > 0 && s->line[n - 1] == '\n') n--;
            if (n > 0 && s->line[n - 1] == '\r') n--;
            s->line[n] = '\0';
            s->bytes = n;
            s->length = 0;
            continue;
        }
        char *save = NULL;
        for (char *tok = strtok_r(s->line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
            if (!reserve((void **)&in->tokens, &in->tokens_cap, in->num_tokens + 1, sizeof *in->tokens)) {
                ok = false;
                break;
            }
            in->tokens[in->num_tokens++] = tok;
        }
        s->length = in->num_tokens - s->first;
    }
    free(line); /* getline allocates a buffer even when it returns -1 */
    return ok && !ferror(f);
}

static int print_result(const TolkResult *result, const Cli *cli) {
    for (size_t i = 0; i < tolk_result_batch_size(result); i++) {
        size_t n_hyp = tolk_result_num_hypotheses(result, i);
        for (size_t h = 0; h < n_hyp; h++) {
            const char *const *tokens = NULL;
            size_t n = 0;
            float score = 0;
            if (tolk_result_hypothesis(result, i, h, &tokens, &n, &score) != TOLK_OK) {
                fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
                return 1;
            }
            if (cli->scores) printf("%.6f ||| ", score);
            for (size_t t = 0; t < n; t++) printf(t ? " %s" : "%s", tokens[t]);
            putchar('\n');
        }
    }
    return 0;
}

/* Text mode: every line is one text; prints one translated line per input line. */
static int translate_lines(const TolkTranslator *translator, const Input *in, const Cli *cli) {
    const char **texts = malloc((in->count ? in->count : 1) * sizeof *texts);
    size_t *lengths = malloc((in->count ? in->count : 1) * sizeof *lengths);
    if (texts == NULL || lengths == NULL) {
        fprintf(stderr, "tolk-translate: out of memory\n");
        free(texts);
        free(lengths);
        return 1;
    }
    for (size_t i = 0; i < in->count; i++) {
        texts[i] = in->sentences[i].line;
        lengths[i] = in->sentences[i].bytes;
    }
    TolkTextResult *result = NULL;
    int status = 0;
    if (tolk_translate_text_batch(translator, texts, lengths, in->count, &cli->translate, &cli->text, &result) != TOLK_OK) {
        fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
        status = 1;
    }
    for (size_t i = 0; status == 0 && i < tolk_text_result_count(result); i++) {
        if (cli->scores) {
            /* One score per translated part (a long sentence wrapped into parts has one
             * for each). */
            size_t n = tolk_text_result_num_sentences(result, i);
            for (size_t j = 0; j < n; j++) {
                TolkSentenceInfo info = tolk_sentence_info_default();
                if (tolk_text_result_sentence(result, i, j, &info) != TOLK_OK) {
                    fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
                    status = 1;
                    break;
                }
                printf(j ? ",%.6f" : "%.6f", info.score);
            }
            if (status != 0) break;
            printf(" ||| ");
        }
        /* With its length: the translation keeps any NUL byte of the source's gaps. */
        size_t length = 0;
        const char *text = tolk_text_result_text(result, i, &length);
        fwrite(text, 1, length, stdout);
        putchar('\n');
    }
    tolk_text_result_free(result);
    free(texts);
    free(lengths);
    return status;
}

int main(int argc, char **argv) {
    Cli cli = {
        .model = tolk_model_options_default(),
        .translator = tolk_translator_options_default(),
        .translate = tolk_translate_options_default(),
        .text = tolk_text_options_default(),
    };
    int status = parse_args(argc, argv, &cli);
    if (status >= 0) return status;
    cli.translate.return_scores = cli.scores;
    if (cli.progress) {
        cli.translate.progress = print_progress;
        cli.translate.progress_user_data = stderr;
    }
    if (cli.verbose)
        fprintf(stderr, "tolk %s (ABI %u), CPU kernels: %s\n", tolk_version(), tolk_abi_version(), tolk_cpu_isa());

    /* Load first, so that a bad model or option fails before waiting for input. */
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
    TolkResult *result = NULL;
    Input in = {0};
    const char *const **batch = NULL;
    size_t *lengths = NULL;
    status = 1;
    /* The model is loaded for the compute type asked for, so no second copy is made. */
    if (tolk_model_load_with_options(cli.model_dir, &cli.model, &model) != TOLK_OK ||
        tolk_translator_new(model, &cli.translator, &translator) != TOLK_OK) {
        fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
        goto done;
    }
    if (cli.verbose)
        fprintf(stderr, "model: %s\ncompute type: %s\ndevice: %s\n", tolk_model_description(model),
                tolk_model_compute_type(model), tolk_model_device_name(model));
    /* The model package's decoding settings (a Marian package's beam size, length factor,
       mini-batch, ...), then what the command line set. */
    TolkTranslateOptions options = tolk_translate_options_default();
    if (tolk_translator_translate_options(translator, &options) != TOLK_OK) {
        fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
        goto done;
    }
    if (cli.set_beam) options.beam_size = cli.translate.beam_size;
    if (cli.set_batch) options.max_batch_size = cli.translate.max_batch_size;
    if (cli.set_length_penalty) options.length_penalty = cli.translate.length_penalty;
    if (cli.no_shortlist) options.use_shortlist = false;
    options.num_hypotheses = cli.translate.num_hypotheses;
    options.max_decoding_length = cli.translate.max_decoding_length;
    options.batch_type = cli.translate.batch_type;
    options.return_scores = cli.translate.return_scores;
    options.progress = cli.translate.progress;
    options.progress_user_data = cli.translate.progress_user_data;
    cli.translate = options;
    if (!read_input(stdin, cli.tokens_mode, &in)) {
        fprintf(stderr, "tolk-translate: cannot read the input: %s\n", strerror(errno));
        goto done;
    }
    if (!cli.tokens_mode) {
        status = translate_lines(translator, &in, &cli);
        goto flush;
    }
    batch = malloc((in.count ? in.count : 1) * sizeof *batch);
    lengths = malloc((in.count ? in.count : 1) * sizeof *lengths);
    if (batch == NULL || lengths == NULL) {
        fprintf(stderr, "tolk-translate: out of memory\n");
        goto done;
    }
    for (size_t i = 0; i < in.count; i++) {
        batch[i] = in.tokens + in.sentences[i].first;
        lengths[i] = in.sentences[i].length;
    }
    if (tolk_translate_batch(translator, batch, lengths, in.count, NULL, NULL, &cli.translate, &result) != TOLK_OK) {
        fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
        goto done;
    }
    status = print_result(result, &cli);
flush:
    if (fflush(stdout) != 0) {
        fprintf(stderr, "tolk-translate: cannot write the output: %s\n", strerror(errno));
        status = 1;
    }
done:
    tolk_result_free(result);
    tolk_translator_free(translator);
    tolk_model_free(model);
    free(batch);
    free(lengths);
    input_free(&in);
    return status;
}
