/*
 * tolk-translate: translate a file or stdin line by line with libtolk.
 *
 *   tolk-translate --model DIR [--beam N] < text > translation
 *   tolk-translate --model DIR --input FILE --output FILE --progress --inter-threads 2
 *   tolk-translate --model DIR --tokens [--beam N] [--n-best N] [--scores] < in > out
 *
 * Text mode (default): every input line is plain UTF-8 text, cut into sentences, tokenized
 * with the model package's SentencePiece model, translated and detokenized; each output
 * line is the translation of the input line (empty lines stay empty). A line ends at "\n"
 * (a "\r" before it is dropped too); anything else, a lone "\r" or a NUL byte included,
 * is part of the line's text. A line that is not valid UTF-8 is an error naming it.
 * With --tokens, input lines are space-separated tokens (e.g. SentencePiece pieces) and
 * output lines are space-separated target tokens; an empty line is an empty sentence.
 *
 * The input streams through tolk_translate_file: chunks of --read-batch-size lines (default
 * 8 batches), each sorted by length and cut into batches of --max-batch-size by the library,
 * one chunk translated (by --inter-threads workers) while the next is read and the previous
 * written, so memory does not grow with the input and output appears chunk by chunk. An
 * --output file appears only once complete (it is written beside and renamed).
 * With --progress, stderr shows the lines done: a progress bar on a terminal, else
 * "DONE/TOTAL" lines ("DONE/?" while the total is unknown: stdin that is not a file,
 * before its end). Ctrl-C stops at the next batch and leaves no partial --output file.
 *
 * Exit status: 0 on success, 1 when the library reports an error, 2 on bad usage,
 * 130 when interrupted.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tolk.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: tolk-translate --model DIR [options] < input > output\n"
            "  --model PATH             model: a CTranslate2 directory, a Marian/Bergamot\n"
            "                           package directory or its YAML (required)\n"
            "  --input FILE             read FILE instead of stdin (\"-\" = stdin)\n"
            "  --output FILE            write FILE instead of stdout, replaced only once\n"
            "                           complete (\"-\" = stdout)\n"
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
            "  --kv-cache-type T        float32|bfloat16|int8: how decoding keeps attention\n"
            "                           keys/values (default float32; the others take 1/2\n"
            "                           and ~1/4 of that memory, results differ slightly)\n"
            "  --max-decoding-memory-mb N  greedy search over several batches: decoding state\n"
            "                           (keys/values) to plan for; sentences wait to start\n"
            "                           until theirs fits: lower peak memory, fewer rows a\n"
            "                           step, the same results (default: half the model's\n"
            "                           weights, at least 32; 0 = no bound)\n"
            "  --device D               auto|cpu|cuda (default auto: a usable CUDA GPU,\n"
            "                           else the CPU)\n"
            "  --device-index N         which GPU (default 0)\n"
            "  --beam N                 beam size, 1 = greedy (default 2, or the package's)\n"
            "  --n-best N               hypotheses per sentence, one line each, best first\n"
            "                           (default 1; at most the beam size)\n"
            "  --max-batch-size N       sentences (or tokens) per batch, 0 = 32 sentences\n"
            "                           (default 0, or the package's mini-batch)\n"
            "  --batch-type T           examples|tokens: unit of --max-batch-size\n"
            "  --read-batch-size N      lines read and translated as one chunk; memory grows\n"
            "                           with it, not with the input (default 0 = 8 batches)\n"
            "  --inter-threads N        batches translated at once, each by its own worker\n"
            "                           sharing the model (default 1)\n"
            "  --intra-threads N        threads per batch (default 1)\n"
            "  --max-decoding-length N  most tokens generated per sentence (default 256)\n"
            "  --length-penalty F       scores are divided by length^F (default 1)\n"
            "  --repetition-penalty F   logits of tokens a hypothesis already holds are\n"
            "                           divided by F (multiplied where negative): F > 1\n"
            "                           discourages repeats (default 1 = off)\n"
            "  --no-repeat-ngram-size N a hypothesis never repeats an N-gram (default 0 = off)\n"
            "  --sampling-topk N        random sampling: draw each token among the N best\n"
            "                           (0 = all; default 1 = the best, no sampling); greedy\n"
            "                           search only (implied when --beam is not given)\n"
            "  --sampling-topp F        ... among the most probable whose probabilities sum\n"
            "                           to F (default 1)\n"
            "  --sampling-temperature F softmax temperature of the draw (default 1)\n"
            "  --sampling-seed N        the same seed draws the same tokens (default 0 = a\n"
            "                           new seed each run)\n"
            "  --replace-unknowns       an unknown token in a translation becomes the source\n"
            "                           token it attends to most (CPU)\n"
            "  --no-shortlist           score the whole vocabulary even when the model\n"
            "                           package has a lexical shortlist\n"
            "  --scores                 prefix each line with its score and \" ||| \"\n"
            "                           (text mode: the sentence scores, comma-separated)\n"
            "  --progress               lines done on stderr: a progress bar on a terminal,\n"
            "                           else \"DONE/TOTAL\" lines (TOTAL \"?\" while unknown)\n"
            "  --verbose                print the library version, the model and the device\n"
            "  --help                   show this help\n");
}

/* Settings from the command line. */
typedef struct {
    const char *model_dir;
    const char *input, *output; /* "-" = stdin / stdout */
    bool tokens_mode, scores, verbose, progress, no_shortlist, replace_unknowns;
    /* Which translate options the command line set; the others take the model's defaults. */
    bool set_beam, set_batch, set_length_penalty;
    TolkModelOptions model;
    TolkTranslatorOptions translator;
    TolkTranslateOptions translate;
    TolkTextOptions text;
    TolkStreamOptions stream;
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
        if (!strcmp(a, "--replace-unknowns")) {
            cli->replace_unknowns = true;
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
        else if (!strcmp(a, "--max-decoding-memory-mb")) number = &cli->translate.max_decoding_memory_mb;
        else if (!strcmp(a, "--intra-threads")) number = &cli->translator.intra_threads;
        else if (!strcmp(a, "--inter-threads")) number = &cli->translator.inter_threads;
        else if (!strcmp(a, "--read-batch-size")) number = &cli->stream.read_batch_size;
        else if (!strcmp(a, "--max-decoding-length")) number = &cli->translate.max_decoding_length;
        else if (!strcmp(a, "--max-sentence-tokens")) number = &cli->text.max_sentence_tokens;
        else if (!strcmp(a, "--device-index")) number = &cli->model.device_index;
        else if (!strcmp(a, "--no-repeat-ngram-size")) number = &cli->translate.no_repeat_ngram_size;
        else if (!strcmp(a, "--sampling-topk")) number = &cli->translate.sampling_topk;
        else if (strcmp(a, "--model") && strcmp(a, "--compute-type") && strcmp(a, "--device") && strcmp(a, "--batch-type") &&
                 strcmp(a, "--length-penalty") && strcmp(a, "--repetition-penalty") && strcmp(a, "--sampling-topp") &&
                 strcmp(a, "--sampling-temperature") && strcmp(a, "--sampling-seed") && strcmp(a, "--split") && strcmp(a, "--source-spm") &&
                 strcmp(a, "--target-spm") && strcmp(a, "--input") && strcmp(a, "--output") && strcmp(a, "--kv-cache-type")) {
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
        } else if (!strcmp(a, "--input")) {
            cli->input = v;
        } else if (!strcmp(a, "--output")) {
            cli->output = v;
        } else if (!strcmp(a, "--compute-type")) {
            cli->model.compute_type = v; /* the library validates it */
        } else if (!strcmp(a, "--device")) {
            cli->model.device = v; /* the library validates it */
        } else if (!strcmp(a, "--kv-cache-type")) {
            cli->translate.kv_cache_type = v; /* the library validates it */
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
        } else if (!strcmp(a, "--sampling-seed")) {
            char *end = NULL;
            errno = 0;
            unsigned long long seed = strtoull(v, &end, 10);
            if (*v < '0' || *v > '9' || errno != 0 || *end != '\0') {
                fprintf(stderr, "tolk-translate: --sampling-seed needs a non-negative integer, got \"%s\"\n", v);
                return 2;
            }
            cli->translate.sampling_seed = seed;
        } else if (!strcmp(a, "--batch-type")) {
            if (!strcmp(v, "examples")) cli->translate.batch_type = TOLK_BATCH_EXAMPLES;
            else if (!strcmp(v, "tokens")) cli->translate.batch_type = TOLK_BATCH_TOKENS;
            else {
                fprintf(stderr, "tolk-translate: --batch-type must be examples or tokens, got \"%s\"\n", v);
                return 2;
            }
        } else { /* --length-penalty, --repetition-penalty, --sampling-topp, --sampling-temperature
                    (the library validates the values) */
            char *end = NULL;
            float value = strtof(v, &end);
            if (end == v || *end != '\0') {
                fprintf(stderr, "tolk-translate: %s needs a number, got \"%s\"\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--length-penalty")) cli->translate.length_penalty = value;
            else if (!strcmp(a, "--sampling-topp")) cli->translate.sampling_topp = value;
            else if (!strcmp(a, "--sampling-temperature")) cli->translate.sampling_temperature = value;
            else cli->translate.repetition_penalty = value;
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

/* Set by SIGINT: the progress callback then asks the library to stop, which cancels the
 * batches in flight and removes the unfinished --output file. A second Ctrl-C kills. */
static volatile sig_atomic_t interrupted = 0;

static void on_interrupt(int signal_number) {
    (void)signal_number;
    interrupted = 1;
}

static void catch_interrupt(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_interrupt;
    action.sa_flags = (int)SA_RESETHAND; /* the next Ctrl-C has the default effect */
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL);
}

/* What --progress shows and how. */
typedef struct {
    bool show;
    bool terminal; /* stderr is a terminal: one bar redrawn in place */
    bool drawn;    /* a bar is on the terminal's last line */
    struct timespec start;
} Progress;

static double seconds_since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* The progress bar: "[#####.....]  45%  1234/2700 lines  12.3 lines/s  ETA 0:01:59", or
 * without a total "1234 lines  12.3 lines/s". */
static void draw_bar(Progress *p, size_t done, size_t total) {
    double elapsed = seconds_since(&p->start);
    double rate = elapsed > 0 ? (double)done / elapsed : 0;
    fputs("\r", stderr);
    if (total > 0) {
        enum { WIDTH = 30 };
        size_t filled = done >= total ? WIDTH : (size_t)((double)done / (double)total * WIDTH);
        char bar[WIDTH + 1];
        for (size_t i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "[%s] %3d%%  %zu/%zu lines", bar, (int)(100.0 * (double)done / (double)total), done, total);
        if (rate > 0 && done < total) {
            long eta = (long)((double)(total - done) / rate + 0.5);
            fprintf(stderr, "  %.1f lines/s  ETA %ld:%02ld:%02ld", rate, eta / 3600, eta / 60 % 60, eta % 60);
        } else if (rate > 0) {
            fprintf(stderr, "  %.1f lines/s", rate);
        }
    } else {
        fprintf(stderr, "%zu lines  %.1f lines/s", done, rate);
    }
    fputs("\033[K", stderr); /* clear what a longer previous bar left */
    fflush(stderr);
    p->drawn = true;
}

/* The library calls this on the translating thread (here the main one) as batches end and
 * chunks are written, with the input lines done and their total (0 while unknown);
 * returning false cancels the translation (TOLK_ERROR_CANCELLED). */
static bool report_progress(void *user_data, size_t done, size_t total) {
    Progress *p = user_data;
    if (p->show && p->terminal) {
        draw_bar(p, done, total);
    } else if (p->show) {
        if (total > 0) fprintf(stderr, "%zu/%zu\n", done, total);
        else fprintf(stderr, "%zu/?\n", done);
        fflush(stderr);
    }
    return !interrupted;
}

int main(int argc, char **argv) {
    Cli cli = {
        .input = "-",
        .output = "-",
        .model = tolk_model_options_default(),
        .translator = tolk_translator_options_default(),
        .translate = tolk_translate_options_default(),
        .text = tolk_text_options_default(),
        .stream = tolk_stream_options_default(),
    };
    int status = parse_args(argc, argv, &cli);
    if (status >= 0) return status;
    if (cli.verbose)
        fprintf(stderr, "tolk %s (ABI %u), CPU kernels: %s\n", tolk_version(), tolk_abi_version(), tolk_cpu_isa());

    /* Load first, so that a bad model or option fails before waiting for input. */
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
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
    /* Sampling draws in greedy search only: without --beam, it implies beam 1. */
    else if (cli.translate.sampling_topk != 1) options.beam_size = 1;
    if (cli.set_batch) options.max_batch_size = cli.translate.max_batch_size;
    if (cli.set_length_penalty) options.length_penalty = cli.translate.length_penalty;
    if (cli.no_shortlist) options.use_shortlist = false;
    options.replace_unknowns = cli.replace_unknowns;
    if (cli.translate.kv_cache_type != NULL) options.kv_cache_type = cli.translate.kv_cache_type;
    options.num_hypotheses = cli.translate.num_hypotheses;
    options.repetition_penalty = cli.translate.repetition_penalty;
    options.no_repeat_ngram_size = cli.translate.no_repeat_ngram_size;
    options.sampling_topk = cli.translate.sampling_topk;
    options.sampling_topp = cli.translate.sampling_topp;
    options.sampling_temperature = cli.translate.sampling_temperature;
    options.sampling_seed = cli.translate.sampling_seed;
    options.max_decoding_memory_mb = cli.translate.max_decoding_memory_mb;
    options.max_decoding_length = cli.translate.max_decoding_length;
    options.batch_type = cli.translate.batch_type;
    options.return_scores = cli.scores;
    /* Always called, --progress or not: it is also how Ctrl-C stops the library. */
    Progress progress = {.show = cli.progress, .terminal = isatty(STDERR_FILENO) == 1};
    clock_gettime(CLOCK_MONOTONIC, &progress.start);
    options.progress = report_progress;
    options.progress_user_data = &progress;
    cli.stream.tokens = cli.tokens_mode;
    catch_interrupt();

    TolkStatus translated = tolk_translate_file(translator, cli.input, cli.output, &options, &cli.text, &cli.stream);
    if (progress.drawn) fputc('\n', stderr);
    if (translated == TOLK_OK) {
        status = 0;
    } else if (translated == TOLK_ERROR_CANCELLED && interrupted) {
        fprintf(stderr, "tolk-translate: interrupted\n");
        status = 130;
    } else {
        fprintf(stderr, "tolk-translate: %s\n", tolk_last_error());
    }
done:
    tolk_translator_free(translator);
    tolk_model_free(model);
    return status;
}
