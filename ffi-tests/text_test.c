/*
 * Text API tests (tolk_translate_text, tolk_translate_text_batch, TolkTextResult): one text
 * and batches, NUL-terminated and explicit lengths, empty and blank texts, the source's
 * spaces, blank lines and CRLF kept verbatim around the translations, sentence ranges and
 * scores, the versioned TolkSentenceInfo (older struct sizes, bad sizes), the source
 * sentence of each part of a wrapped sentence, the split modes, NULL pointers and bad
 * arguments, out of range reads, packages without a tokenizer or with a missing or broken
 * one, a 1 MB text, one translator shared by several threads, and the progress callback
 * (sentences and parts counted, cancellation, old struct sizes). Built against include/tolk.h and run by tests/ffi.rs (also under
 * valgrind when it is installed, so every path must free what it allocates).
 *
 *   text_test MODEL_DIR      (MODEL_DIR: ffi-tests/fixtures/tiny, with its
 *                             sentencepiece.model; the model has random weights, so the
 *                             translations are letter soup: the tests check structure and
 *                             consistency, never wording)
 *
 * TOLK_FFI_VALGRIND=1 (set by tests/ffi.rs under valgrind) shrinks the 1 MB text to 64 KB:
 * the same code paths, at a size memcheck runs in seconds.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "progress.h"

static const char *MODEL_DIR;

/* Reports a failed check with some context, like CHECK. */
#define CHECK_MSG(cond, ...)                                                            \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* Texts used throughout: several sentences, spaces and blank lines around them, CRLF line
 * ends, tabs, text the tokenizer does not know (Chinese, where the sentences touch), an
 * accent, blank and empty texts. */
static const char *const TEXTS[] = {
    "Hello world. How are you?",
    "  The cat sat on the mat.  And the dog sat on the log!\n\nWe love to read.\n",
    "Hello world.\r\n\r\nHow are you?\r\n\tZebra quilt vex jinx.\r\n",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82", /* 你好。世界。 */
    "Say \xc3\xa9 and \xc3\xa9 again.   \n   \n",                         /* é */
    "   \n\r\n\t  ",
    "",
};
#define NUM_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* Options for most calls: greedy and short translations keep the valgrind run fast (the
 * random model often decodes up to the limit). */
static TolkTranslateOptions quick_options(bool scores) {
    TolkTranslateOptions o = tolk_translate_options_default();
    o.beam_size = 1;
    o.max_decoding_length = 24;
    o.return_scores = scores;
    return o;
}

static bool is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Part `part` of text `index` of `r` into *info (a full struct, struct_size set): the
 * status of tolk_text_result_sentence. */
static TolkStatus get_part(const TolkTextResult *r, size_t index, size_t part, TolkSentenceInfo *info) {
    *info = tolk_sentence_info_default();
    return tolk_text_result_sentence(r, index, part, info);
}

/* The code point of the (valid UTF-8) character at `s`; *len receives its length. */
static uint32_t utf8_at(const char *s, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *len = 1;
        return u[0];
    }
    if ((u[0] & 0xE0) == 0xC0) {
        *len = 2;
        return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    }
    if ((u[0] & 0xF0) == 0xE0) {
        *len = 3;
        return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
           (u[3] & 0x3F);
}

/* The last character of the `len` bytes at `s` (len > 0). */
static uint32_t utf8_last(const char *s, size_t len) {
    size_t at = len - 1, n = 0;
    while (at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80) at--;
    return utf8_at(s + at, &n);
}

/* Unicode White_Space (Rust's char::is_whitespace). */
static bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* What a gap between sentences may hold without being kept as it is: white space that does
 * not break lines, and invisible characters (ZWSP, ZWNJ, ZWJ, word joiner, BOM). */
static bool is_blank(uint32_t c) {
    bool line_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x85 || c == 0x2028 || c == 0x2029;
    return (is_white_space(c) && !line_break) || (c >= 0x200B && c <= 0x200D) || c == 0x2060 || c == 0xFEFF;
}

/* Characters of scripts written without spaces (CJK). */
static bool is_unspaced(uint32_t c) {
    return (c >= 0x3000 && c <= 0x303F) || (c >= 0x3040 && c <= 0x30FF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0xFF00 && c <= 0xFFEF) ||
           (c >= 0x20000 && c <= 0x3FFFF);
}

/* The library's gap rule, from its documentation: the source gap `gap` (`gap_len` bytes)
 * put before translation `next` (`next_len` bytes) when the translated text so far is
 * `done` (`done_len` bytes). A gap with a line break (or anything not blank) is kept, as is
 * every gap at the start or before an empty translation; between two CJK translations a
 * blank gap vanishes; between others an empty gap becomes " ", ASCII spaces and tabs stay,
 * and other blanks (NBSP, U+3000, ZWSP, BOM, ...) become " ". */
static void expected_gap(const char *gap, size_t gap_len, const char *done, size_t done_len, const char *next,
                         size_t next_len, const char **want, size_t *want_len) {
    *want = gap;
    *want_len = gap_len;
    if (done_len == 0 || next_len == 0) return;
    uint32_t before = utf8_last(done, done_len), n = 0;
    size_t len = 0;
    uint32_t after = utf8_at(next, &len);
    if (is_white_space(before)) return;
    bool ascii_spaces = gap_len > 0;
    for (size_t at = 0; at < gap_len; at += len) {
        n = utf8_at(gap + at, &len);
        if (!is_blank(n)) return;
        ascii_spaces = ascii_spaces && (n == ' ' || n == '\t');
    }
    if (is_unspaced(before) && is_unspaced(after)) {
        *want = "";
        *want_len = 0;
    } else if (!ascii_spaces) {
        *want = " ";
        *want_len = 1;
    }
}

/* Checks translation `index` of `r` against its source (`src`, `src_len` bytes) and returns
 * its number of parts (sentences, and parts of wrapped ones):
 * - the text is NUL-terminated at the reported length;
 * - source and target ranges are in order, within bounds, non-overlapping, and start and
 *   end on content (no whitespace at their ends); source ranges are not empty;
 * - everything between target ranges is the source's gap between the source ranges as the
 *   library's gap rules adapt it (expected_gap: the tiny model writes Latin letters, so an
 *   empty gap, as between Chinese "。" sentences, becomes a space, and NBSP-like blanks one
 *   space; line breaks, spaces and tabs stay byte for byte), also before the first and
 *   after the last part (verbatim there). So the text is exactly gaps and translations, in
 *   order;
 * - parts name their source sentence: indices are non-decreasing, and the parts of one
 *   sentence are not separated by a line break;
 * - scores are finite and <= 0 with return_scores, NaN without. */
static size_t check_text(const TolkTextResult *r, size_t index, const char *src, size_t src_len, bool scores) {
    size_t len = (size_t)-1;
    const char *text = tolk_text_result_text(r, index, &len);
    CHECK_MSG(text != NULL, "text %zu", index);
    if (text == NULL) return 0;
    CHECK_MSG(len != (size_t)-1 && text[len] == '\0', "text %zu: length %zu", index, len);
    size_t n = tolk_text_result_num_sentences(r, index);
    size_t src_prev = 0, tgt_prev = 0, sentence_prev = 0;
    for (size_t s = 0; s < n; s++) {
        TolkSentenceInfo p;
        p.score = 1.0f;
        CHECK_STATUS(get_part(r, index, s, &p), TOLK_OK);
        size_t sb = p.source_begin, se = p.source_end, tb = p.target_begin, te = p.target_end;
        bool in_bounds = src_prev <= sb && sb < se && se <= src_len && tgt_prev <= tb && tb <= te && te <= len;
        CHECK_MSG(in_bounds, "text %zu sentence %zu: source %zu..%zu (after %zu, of %zu), target %zu..%zu (after %zu, of %zu) in \"%.*s\"",
                  index, s, sb, se, src_prev, src_len, tb, te, tgt_prev, len, (int)(src_len < 80 ? src_len : 80), src);
        if (!in_bounds) return n;
        CHECK_MSG(!is_space((unsigned char)src[sb]) && !is_space((unsigned char)src[se - 1]),
                  "text %zu sentence %zu: source \"%.*s\" has spaces at its ends", index, s, (int)(se - sb), src + sb);
        CHECK_MSG(tb == te || (!is_space((unsigned char)text[tb]) && !is_space((unsigned char)text[te - 1])),
                  "text %zu sentence %zu: target \"%.*s\" has spaces at its ends", index, s, (int)(te - tb), text + tb);
        /* The gap before this part. */
        const char *want = NULL;
        size_t want_len = 0;
        expected_gap(src + src_prev, sb - src_prev, text, tgt_prev, text + tb, te - tb, &want, &want_len);
        CHECK_MSG(tb - tgt_prev == want_len && memcmp(text + tgt_prev, want, want_len) == 0,
                  "text %zu sentence %zu: gap \"%.*s\" in the translation, \"%.*s\" expected (source gap \"%.*s\")",
                  index, s, (int)(tb - tgt_prev), text + tgt_prev, (int)want_len, want, (int)(sb - src_prev),
                  src + src_prev);
        /* Its source sentence. */
        CHECK_MSG(s == 0 || p.sentence >= sentence_prev, "text %zu part %zu: sentence %zu after %zu", index, s,
                  p.sentence, sentence_prev);
        if (s > 0 && p.sentence == sentence_prev)
            CHECK_MSG(memchr(src + src_prev, '\n', sb - src_prev) == NULL,
                      "text %zu part %zu: a line break inside sentence %zu", index, s, p.sentence);
        if (scores)
            CHECK_MSG(isfinite(p.score) && p.score <= 0.0f, "text %zu sentence %zu: score %g", index, s, p.score);
        else
            CHECK_MSG(isnan(p.score), "text %zu sentence %zu: score %g without return_scores", index, s, p.score);
        src_prev = se;
        tgt_prev = te;
        sentence_prev = p.sentence;
    }
    /* The tail after the last sentence (the whole text when there is none). */
    CHECK_MSG(len - tgt_prev == src_len - src_prev && memcmp(text + tgt_prev, src + src_prev, len - tgt_prev) == 0,
              "text %zu: tail \"%s\" in the translation, \"%.*s\" expected", index, text + tgt_prev,
              (int)(src_len - src_prev), src + src_prev);
    return n;
}

/* Everything a result says about text `index` (text, ranges, scores, sentences) as one
 * malloc'ed string, to compare results. */
static char *describe(const TolkTextResult *r, size_t index) {
    size_t len = 0;
    const char *text = tolk_text_result_text(r, index, &len);
    if (text == NULL) {
        char *none = malloc(64);
        if (none) snprintf(none, 64, "(no text %zu)", index);
        return none;
    }
    size_t n = tolk_text_result_num_sentences(r, index);
    size_t cap = len + 1 + n * 128 + 32, used = 0;
    char *out = malloc(cap);
    if (out == NULL) return NULL;
    memcpy(out, text, len);
    used = len;
    used += (size_t)snprintf(out + used, cap - used, "|%zu", n);
    for (size_t s = 0; s < n; s++) {
        TolkSentenceInfo p;
        memset(&p, 0, sizeof p);
        get_part(r, index, s, &p);
        used += (size_t)snprintf(out + used, cap - used, "|%zu-%zu:%zu-%zu:%.9g:%zu", p.source_begin, p.source_end,
                                 p.target_begin, p.target_end, p.score, p.sentence);
    }
    return out;
}

/* Whether texts `i` of `a` and `j` of `b` are identical; prints both when not. */
static bool same_text(const TolkTextResult *a, size_t i, const TolkTextResult *b, size_t j) {
    char *x = describe(a, i), *y = describe(b, j);
    bool same = x && y && strcmp(x, y) == 0;
    if (!same) fprintf(stderr, "  differ:\n  %s\n  %s\n", x ? x : "(null)", y ? y : "(null)");
    free(x);
    free(y);
    return same;
}

/* The source text of sentence `s` of text `index`, for readable comparisons. */
static bool source_is(const TolkTextResult *r, size_t index, size_t s, const char *src, const char *want) {
    TolkSentenceInfo p;
    if (get_part(r, index, s, &p) != TOLK_OK) return false;
    size_t sb = p.source_begin, se = p.source_end;
    bool same = se - sb == strlen(want) && memcmp(src + sb, want, se - sb) == 0;
    if (!same) fprintf(stderr, "  sentence %zu is \"%.*s\", expected \"%s\"\n", s, (int)(se - sb), src + sb, want);
    return same;
}

static TolkTranslator *load_translator(const char *dir, const TolkModelOptions *mopts) {
    TolkModel *model = NULL;
    TolkTranslator *translator = NULL;
    CHECK_STATUS(tolk_model_load_with_options(dir, mopts, &model), TOLK_OK);
    if (model == NULL) return NULL;
    CHECK_STATUS(tolk_translator_new(model, NULL, &translator), TOLK_OK);
    tolk_model_free(model); /* the translator keeps what it needs */
    return translator;
}

/* One text: default and quick options, the sentences, text and length, NULL out_length. */
static void test_one_text(const TolkTranslator *t) {
    const char *src = TEXTS[0];
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, src, NULL, NULL, &r), TOLK_OK); /* library defaults */
    CHECK(r != NULL && tolk_text_result_count(r) == 1);
    CHECK(check_text(r, 0, src, strlen(src), false) == 2);
    CHECK(source_is(r, 0, 0, src, "Hello world.") && source_is(r, 0, 1, src, "How are you?"));
    size_t len = 0;
    const char *text = tolk_text_result_text(r, 0, &len);
    CHECK(text != NULL && text == tolk_text_result_text(r, 0, NULL) && strlen(text) == len && len > 0);
    CHECK(strstr(text, "\xe2\x96\x81") == NULL); /* no "▁" left */
    tolk_text_result_free(r);

    TolkTranslateOptions scored = quick_options(true);
    r = NULL;
    CHECK_STATUS(tolk_translate_text(t, src, &scored, NULL, &r), TOLK_OK);
    CHECK(check_text(r, 0, src, strlen(src), true) == 2);
    /* tolk_translate_text is the batch of one. */
    TolkTextResult *b = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, &src, NULL, 1, &scored, NULL, &b), TOLK_OK);
    CHECK(b != NULL && tolk_text_result_count(b) == 1 && same_text(r, 0, b, 0));
    tolk_text_result_free(b);
    tolk_text_result_free(r);
}

/* A batch of all TEXTS: NUL-terminated or with explicit lengths, the same as one by one. */
static void test_batch(const TolkTranslator *t) {
    TolkTranslateOptions scored = quick_options(true);
    size_t lengths[NUM_TEXTS];
    for (size_t i = 0; i < NUM_TEXTS; i++) lengths[i] = strlen(TEXTS[i]);
    TolkTextResult *a = NULL, *b = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, TEXTS, NULL, NUM_TEXTS, &scored, NULL, &a), TOLK_OK);
    CHECK_STATUS(tolk_translate_text_batch(t, TEXTS, lengths, NUM_TEXTS, &scored, NULL, &b), TOLK_OK);
    if (a == NULL || b == NULL) goto done;
    CHECK(tolk_text_result_count(a) == NUM_TEXTS && tolk_text_result_count(b) == NUM_TEXTS);
    static const size_t SENTENCES[NUM_TEXTS] = {2, 3, 3, 2, 1, 0, 0};
    for (size_t i = 0; i < NUM_TEXTS; i++) {
        size_t n = check_text(a, i, TEXTS[i], lengths[i], true);
        CHECK_MSG(n == SENTENCES[i], "text %zu: %zu sentences, %zu expected", i, n, SENTENCES[i]);
        CHECK_MSG(same_text(a, i, b, i), "text %zu: explicit lengths differ from NUL-terminated", i);
        /* Each text alone: the same translation (texts are independent). */
        TolkTextResult *one = NULL;
        CHECK_STATUS(tolk_translate_text(t, TEXTS[i], &scored, NULL, &one), TOLK_OK);
        CHECK_MSG(one && same_text(a, i, one, 0), "text %zu: alone differs from in the batch", i);
        tolk_text_result_free(one);
    }
    /* The gaps, spelled out for the CRLF text. */
    const char *crlf = tolk_text_result_text(a, 2, NULL);
    TolkSentenceInfo p0, p1, p2;
    CHECK_STATUS(get_part(a, 2, 0, &p0), TOLK_OK);
    CHECK_STATUS(get_part(a, 2, 1, &p1), TOLK_OK);
    CHECK_STATUS(get_part(a, 2, 2, &p2), TOLK_OK);
    size_t e0 = p0.target_end, b1 = p1.target_begin, e1 = p1.target_end, b2 = p2.target_begin;
    CHECK(p0.sentence == 0 && p1.sentence == 1 && p2.sentence == 2);
    CHECK(crlf && b1 - e0 == 4 && memcmp(crlf + e0, "\r\n\r\n", 4) == 0);
    CHECK(crlf && b2 - e1 == 3 && memcmp(crlf + e1, "\r\n\t", 3) == 0);
    CHECK(crlf && strlen(crlf) >= 2 && strcmp(crlf + strlen(crlf) - 2, "\r\n") == 0);
    CHECK(source_is(a, 2, 2, TEXTS[2], "Zebra quilt vex jinx."));
    /* Blank and empty texts come back verbatim. */
    CHECK(strcmp(tolk_text_result_text(a, 5, NULL), TEXTS[5]) == 0);
    CHECK(strcmp(tolk_text_result_text(a, 6, NULL), "") == 0);
done:
    tolk_text_result_free(a);
    tolk_text_result_free(b);
}

/* Explicit lengths: shorter than the buffer, cutting a sentence, zero with a NULL pointer,
 * and a NUL byte inside the length. */
static void test_lengths(const TolkTranslator *t) {
    TolkTranslateOptions o = quick_options(false);
    const char *full = "Hello world. How are you?";
    const char *texts[] = {full, full, NULL, "ab\0cd. Ef."};
    size_t lengths[] = {12, 17, 0, 10}; /* "Hello world.", "Hello world. How", "", with a NUL */
    TolkTextResult *r = NULL, *alone = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, texts, lengths, 4, &o, NULL, &r), TOLK_OK);
    CHECK_STATUS(tolk_translate_text(t, "Hello world.", &o, NULL, &alone), TOLK_OK);
    if (r != NULL && alone != NULL) {
        CHECK(tolk_text_result_count(r) == 4);
        CHECK(check_text(r, 0, full, 12, false) == 1);
        CHECK(same_text(r, 0, alone, 0)); /* nothing after the length was read */
        CHECK(check_text(r, 1, full, 17, false) == 2);
        CHECK(source_is(r, 1, 1, full, "How"));
        size_t len = 99;
        CHECK(strcmp(tolk_text_result_text(r, 2, &len), "") == 0 && len == 0);
        CHECK(tolk_text_result_num_sentences(r, 2) == 0);
        /* The NUL is a character like any other: inside the first sentence. */
        len = 0;
        CHECK(tolk_text_result_text(r, 3, &len) != NULL);
        CHECK(check_text(r, 3, texts[3], 10, false) == 2);
    }
    tolk_text_result_free(r);
    tolk_text_result_free(alone);

    /* No texts at all: an empty result, with or without arrays. */
    r = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, NULL, NULL, 0, NULL, NULL, &r), TOLK_OK);
    CHECK(r != NULL && tolk_text_result_count(r) == 0 && tolk_text_result_text(r, 0, NULL) == NULL);
    tolk_text_result_free(r);
}

/* The empty text: "" back and no sentences, also with the default options. */
static void test_empty(const TolkTranslator *t) {
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, "", NULL, NULL, &r), TOLK_OK);
    size_t len = 99;
    const char *text = tolk_text_result_text(r, 0, &len);
    CHECK(text != NULL && text[0] == '\0' && len == 0);
    CHECK(tolk_text_result_count(r) == 1 && tolk_text_result_num_sentences(r, 0) == 0);
    TolkSentenceInfo p = tolk_sentence_info_default();
    CHECK_STATUS(tolk_text_result_sentence(r, 0, 0, &p), TOLK_ERROR_OUT_OF_RANGE);
    tolk_text_result_free(r);
}

/* Split modes and the wrapping of long sentences. */
static void test_split_modes(const TolkTranslator *t) {
    TolkTranslateOptions o = quick_options(true);
    const char *src = "  Hello world. How are you?\r\nZebra.\n\n  Say hello.  \n";
    size_t len = strlen(src);
    static const struct {
        uint32_t mode;
        size_t sentences;
        const char *first, *last;
    } CASES[] = {
        {TOLK_SPLIT_SENTENCES, 4, "Hello world.", "Say hello."},
        {TOLK_SPLIT_LINES, 3, "Hello world. How are you?", "Say hello."},
        {TOLK_SPLIT_WHOLE, 1, "Hello world. How are you?\r\nZebra.\n\n  Say hello.", NULL},
    };
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        TolkTextOptions to = tolk_text_options_default();
        to.split_mode = CASES[c].mode;
        TolkTextResult *r = NULL;
        CHECK_STATUS(tolk_translate_text(t, src, &o, &to, &r), TOLK_OK);
        if (r == NULL) continue;
        size_t n = check_text(r, 0, src, len, true);
        CHECK_MSG(n == CASES[c].sentences, "split mode %u: %zu sentences", (unsigned)CASES[c].mode, n);
        CHECK_MSG(source_is(r, 0, 0, src, CASES[c].first), "split mode %u", (unsigned)CASES[c].mode);
        if (CASES[c].last) CHECK_MSG(source_is(r, 0, n - 1, src, CASES[c].last), "split mode %u", (unsigned)CASES[c].mode);
        tolk_text_result_free(r);
    }
    /* NULL text options are the defaults (sentences). */
    TolkTextResult *dflt = NULL, *sentences = NULL;
    TolkTextOptions to = tolk_text_options_default();
    CHECK(to.struct_size == sizeof(TolkTextOptions) && to.split_mode == TOLK_SPLIT_SENTENCES && to.max_sentence_tokens > 0);
    CHECK_STATUS(tolk_translate_text(t, src, &o, NULL, &dflt), TOLK_OK);
    CHECK_STATUS(tolk_translate_text(t, src, &o, &to, &sentences), TOLK_OK);
    CHECK(dflt && sentences && same_text(dflt, 0, sentences, 0));
    tolk_text_result_free(dflt);
    tolk_text_result_free(sentences);

    /* A long sentence is wrapped into parts of at most max_sentence_tokens tokens: more
     * units, each a piece of the sentence, with single spaces between them. */
    const char *lng = "The cat sat on the mat and the dog sat on the log and we love to read small texts.";
    to = tolk_text_options_default();
    to.max_sentence_tokens = 6;
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, lng, &o, &to, &r), TOLK_OK);
    size_t n = r ? check_text(r, 0, lng, strlen(lng), true) : 0;
    CHECK_MSG(n >= 4, "%zu parts of a sentence of ~30 tokens wrapped at 6", n);
    tolk_text_result_free(r);
    /* The tiny model adds no end token to its sources (add_source_eos false), so a part may
     * have max_sentence_tokens pieces: "Hello world." is 4 pieces (▁H ello ▁world .). */
    to.max_sentence_tokens = 2;
    r = NULL;
    CHECK_STATUS(tolk_translate_text(t, "Hello world.", &o, &to, &r), TOLK_OK);
    CHECK(r && check_text(r, 0, "Hello world.", 12, true) == 2);
    tolk_text_result_free(r);
    to.max_sentence_tokens = 1; /* the smallest: one piece per part */
    r = NULL;
    CHECK_STATUS(tolk_translate_text(t, "Hello world.", &o, &to, &r), TOLK_OK);
    CHECK(r && check_text(r, 0, "Hello world.", 12, true) == 4);
    tolk_text_result_free(r);
    /* Whitespace that is a piece of its own (NBSP: the fixture's normalization is the
     * identity, so it stays an unknown piece) never becomes a part by itself: every part
     * has source text (check_text wants non-empty source ranges), nothing is translated
     * from blanks. */
    const char *nbsp = "x\xc2\xa0 y. Hello\xc2\xa0\xc2\xa0 \xc2\xa0 world.";
    to.max_sentence_tokens = 3;
    r = NULL;
    CHECK_STATUS(tolk_translate_text(t, nbsp, &o, &to, &r), TOLK_OK);
    CHECK(r && check_text(r, 0, nbsp, strlen(nbsp), true) >= 2);
    tolk_text_result_free(r);
    to.max_sentence_tokens = 0; /* 0 = the default */
    r = NULL;
    CHECK_STATUS(tolk_translate_text(t, lng, &o, &to, &r), TOLK_OK);
    CHECK(r && check_text(r, 0, lng, strlen(lng), true) == 1);
    tolk_text_result_free(r);
}

/* Every NULL argument is TOLK_ERROR_NULL_POINTER with a message, and a failed call leaves
 * NULL in *out_result; the result getters accept NULL. */
static void test_null_pointers(const TolkTranslator *t) {
    TolkTextResult *r = (TolkTextResult *)&r; /* garbage that a failed call must reset to NULL */
    CHECK_STATUS(tolk_translate_text(NULL, "Hello.", NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    CHECK(r == NULL);
    CHECK(strstr(tolk_last_error(), "translator") != NULL);
    r = (TolkTextResult *)&r;
    CHECK_STATUS(tolk_translate_text(t, NULL, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    CHECK_MSG(r == NULL, "tolk_translate_text(text NULL) left *out_result unchanged");
    CHECK(strstr(tolk_last_error(), "text") != NULL);
    CHECK_STATUS(tolk_translate_text(t, "Hello.", NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK(strstr(tolk_last_error(), "out_result") != NULL);

    const char *texts[] = {"Hello.", NULL};
    r = (TolkTextResult *)&r;
    CHECK_STATUS(tolk_translate_text_batch(NULL, texts, NULL, 1, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    CHECK(r == NULL);
    r = (TolkTextResult *)&r;
    CHECK_STATUS(tolk_translate_text_batch(t, NULL, NULL, 1, NULL, NULL, &r), TOLK_ERROR_NULL_POINTER);
    CHECK_MSG(r == NULL, "tolk_translate_text_batch(texts NULL) left *out_result unchanged");
    CHECK(strstr(tolk_last_error(), "texts") != NULL);
    CHECK_STATUS(tolk_translate_text_batch(t, texts, NULL, 1, NULL, NULL, NULL), TOLK_ERROR_NULL_POINTER);
    /* A NULL text inside the array is an invalid argument naming it, as a NULL sentence is
     * for tolk_translate_batch. */
    r = (TolkTextResult *)&r;
    CHECK_STATUS(tolk_translate_text_batch(t, texts, NULL, 2, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK_MSG(r == NULL, "tolk_translate_text_batch(texts[1] NULL) left *out_result unchanged");
    CHECK(strstr(tolk_last_error(), "texts[1]") != NULL);
    size_t lengths[] = {6, 3};
    CHECK_STATUS(tolk_translate_text_batch(t, texts, lengths, 2, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);

    TolkSentenceInfo info = tolk_sentence_info_default();
    CHECK_STATUS(tolk_text_result_sentence(NULL, 0, 0, &info), TOLK_ERROR_NULL_POINTER);
    CHECK(tolk_text_result_count(NULL) == 0);
    size_t len = 77;
    CHECK(tolk_text_result_text(NULL, 0, &len) == NULL && len == 77);
    CHECK(tolk_text_result_num_sentences(NULL, 0) == 0);
    tolk_text_result_free(NULL); /* a no-op */

    /* The out struct is required. */
    r = NULL;
    TolkTranslateOptions o = quick_options(true);
    CHECK_STATUS(tolk_translate_text(t, "Hello world.", &o, NULL, &r), TOLK_OK);
    CHECK_STATUS(tolk_text_result_sentence(r, 0, 0, NULL), TOLK_ERROR_NULL_POINTER);
    CHECK(strstr(tolk_last_error(), "out") != NULL);
    CHECK_STATUS(tolk_text_result_sentence(r, 0, 0, &info), TOLK_OK);
    CHECK(info.source_begin == 0 && info.source_end == 12 && info.target_begin == 0 && info.target_end > 0);
    CHECK(info.sentence == 0 && isfinite(info.score));
    tolk_text_result_free(r);
}

/* TolkSentenceInfo is versioned like the option structs, the other way round: the library
 * fills only the fields that fit in out->struct_size (a caller built against an older,
 * smaller struct), leaves the rest and struct_size itself alone, and refuses sizes that
 * end inside a field or cannot hold struct_size. */
static void test_sentence_info(const TolkTranslator *t) {
    TolkSentenceInfo d = tolk_sentence_info_default();
    CHECK(d.struct_size == sizeof(TolkSentenceInfo));
    CHECK(isnan(d.score));
    TolkTranslateOptions o = quick_options(true);
    const char *src = "Hello world. How are you?";
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, src, &o, NULL, &r), TOLK_OK);
    if (r == NULL) return;
    TolkSentenceInfo full;
    CHECK_STATUS(get_part(r, 0, 1, &full), TOLK_OK);
    CHECK(full.struct_size == sizeof(TolkSentenceInfo));
    CHECK(full.source_begin == 13 && full.source_end == strlen(src) && full.sentence == 1);
    CHECK(full.target_begin < full.target_end && isfinite(full.score) && full.score <= 0.0f);

    /* Older headers: each field boundary as struct_size. Bytes past the size keep the
     * caller's 0xA5 pattern; the fields before it are the full struct's. */
    static const size_t SIZES[] = {
        sizeof(uint32_t),                            /* struct_size alone: nothing to fill */
        offsetof(TolkSentenceInfo, source_begin),    /* struct_size + score */
        offsetof(TolkSentenceInfo, target_begin),    /* ... + the source range */
        offsetof(TolkSentenceInfo, sentence),        /* everything but the sentence */
        sizeof(TolkSentenceInfo),
    };
    for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++) {
        size_t size = SIZES[k];
        unsigned char buf[sizeof(TolkSentenceInfo)];
        memset(buf, 0xA5, sizeof buf);
        TolkSentenceInfo *old = (TolkSentenceInfo *)buf;
        old->struct_size = (uint32_t)size;
        CHECK_STATUS(tolk_text_result_sentence(r, 0, 1, old), TOLK_OK);
        CHECK_MSG(old->struct_size == size, "size %zu: struct_size became %u", size, (unsigned)old->struct_size);
        bool untouched = true;
        for (size_t b = size; b < sizeof buf; b++) untouched = untouched && buf[b] == 0xA5;
        CHECK_MSG(untouched, "size %zu: bytes past struct_size were written", size);
        /* The fields inside the size (padding excepted) are the full struct's. */
        TolkSentenceInfo want = full;
        want.struct_size = (uint32_t)size;
        if (size > offsetof(TolkSentenceInfo, score))
            CHECK_MSG(old->score == want.score, "size %zu: score %g", size, old->score);
        if (size > offsetof(TolkSentenceInfo, source_begin))
            CHECK_MSG(old->source_begin == want.source_begin && old->source_end == want.source_end, "size %zu", size);
        if (size > offsetof(TolkSentenceInfo, target_begin))
            CHECK_MSG(old->target_begin == want.target_begin && old->target_end == want.target_end, "size %zu", size);
        if (size > offsetof(TolkSentenceInfo, sentence)) CHECK_MSG(old->sentence == want.sentence, "size %zu", size);
    }

    /* Sizes that cannot be a struct: too small for struct_size, or ending inside a field.
     * Nothing is written. */
    static const size_t BAD[] = {
        0, 2, 3, 6,
        offsetof(TolkSentenceInfo, source_begin) + sizeof(size_t) / 2,
        offsetof(TolkSentenceInfo, sentence) + 1,
        sizeof(TolkSentenceInfo) - 1,
    };
    for (size_t k = 0; k < sizeof BAD / sizeof BAD[0]; k++) {
        unsigned char buf[sizeof(TolkSentenceInfo)];
        memset(buf, 0xA5, sizeof buf);
        TolkSentenceInfo *bad = (TolkSentenceInfo *)buf;
        bad->struct_size = (uint32_t)BAD[k];
        CHECK_STATUS(tolk_text_result_sentence(r, 0, 0, bad), TOLK_ERROR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(tolk_last_error(), "struct_size") != NULL, "size %zu: %s", BAD[k], tolk_last_error());
        bool untouched = bad->struct_size == BAD[k];
        for (size_t b = sizeof(uint32_t); b < sizeof buf; b++) untouched = untouched && buf[b] == 0xA5;
        CHECK_MSG(untouched, "size %zu: a refused call wrote into the struct", BAD[k]);
    }
    tolk_text_result_free(r);
}

/* Every part names its source sentence: the parts of a wrapped sentence share its index,
 * indices start at 0 and never decrease, and each sentence's parts lie inside the range
 * the unwrapped sentence has. max_input_length bounds the parts like max_sentence_tokens. */
static void test_sentence_indices(const TolkTranslator *t) {
    const char *src = "Hello world. The cat sat on the mat and the dog sat on the log and we love to read small texts. "
                      "Zebra.\n\nHow are you?";
    size_t len = strlen(src);
    TolkTranslateOptions o = quick_options(true);
    o.max_decoding_length = 8;
    TolkTextOptions to = tolk_text_options_default();
    TolkTextResult *whole = NULL, *wrapped = NULL, *bounded = NULL;
    CHECK_STATUS(tolk_translate_text(t, src, &o, &to, &whole), TOLK_OK);
    to.max_sentence_tokens = 7;
    CHECK_STATUS(tolk_translate_text(t, src, &o, &to, &wrapped), TOLK_OK);
    /* The same limit through max_input_length: the same parts, the same translations. */
    TolkTranslateOptions oi = o;
    oi.max_input_length = 7;
    CHECK_STATUS(tolk_translate_text(t, src, &oi, NULL, &bounded), TOLK_OK);
    if (whole == NULL || wrapped == NULL || bounded == NULL) goto done;
    size_t n = check_text(whole, 0, src, len, true);
    CHECK_MSG(n == 4, "%zu sentences", n);
    for (size_t s = 0; s < n; s++) {
        TolkSentenceInfo p;
        CHECK_STATUS(get_part(whole, 0, s, &p), TOLK_OK);
        CHECK_MSG(p.sentence == s, "unwrapped part %zu is sentence %zu", s, p.sentence);
    }
    size_t parts = check_text(wrapped, 0, src, len, true);
    CHECK_MSG(parts >= n + 6, "%zu parts of %zu sentences wrapped at 7 tokens", parts, n);
    size_t per_sentence[4] = {0};
    for (size_t k = 0; k < parts; k++) {
        TolkSentenceInfo p, s;
        CHECK_STATUS(get_part(wrapped, 0, k, &p), TOLK_OK);
        CHECK_MSG(k > 0 || p.sentence == 0, "the first part is sentence %zu", p.sentence);
        if (p.sentence >= n) {
            CHECK_MSG(false, "part %zu: sentence %zu of %zu", k, p.sentence, n);
            continue;
        }
        per_sentence[p.sentence]++;
        CHECK_STATUS(get_part(whole, 0, p.sentence, &s), TOLK_OK);
        CHECK_MSG(s.source_begin <= p.source_begin && p.source_end <= s.source_end,
                  "part %zu [%zu, %zu) is outside its sentence %zu [%zu, %zu)", k, p.source_begin, p.source_end,
                  p.sentence, s.source_begin, s.source_end);
    }
    for (size_t s = 0; s < n; s++) CHECK_MSG(per_sentence[s] >= 1, "sentence %zu has no part", s);
    CHECK_MSG(per_sentence[0] == 1 && per_sentence[1] >= 6, "parts per sentence: %zu %zu %zu %zu", per_sentence[0],
              per_sentence[1], per_sentence[2], per_sentence[3]);
    /* The parts of a sentence start and end where it does. */
    for (size_t s = 0; s < n; s++) {
        TolkSentenceInfo first, last, unwrapped;
        size_t a = 0;
        for (size_t k = 0; k < s; k++) a += per_sentence[k];
        get_part(wrapped, 0, a, &first);
        get_part(wrapped, 0, a + per_sentence[s] - 1, &last);
        get_part(whole, 0, s, &unwrapped);
        CHECK_MSG(first.source_begin == unwrapped.source_begin && last.source_end == unwrapped.source_end,
                  "sentence %zu: parts cover [%zu, %zu), the sentence is [%zu, %zu)", s, first.source_begin,
                  last.source_end, unwrapped.source_begin, unwrapped.source_end);
    }
    CHECK_MSG(same_text(wrapped, 0, bounded, 0), "max_input_length 7 wraps like max_sentence_tokens 7");
done:
    tolk_text_result_free(whole);
    tolk_text_result_free(wrapped);
    tolk_text_result_free(bounded);
}

/* Invalid UTF-8, bad options and out of range reads: errors with messages, no crash. */
static void test_bad_arguments(const TolkTranslator *t) {
    static const char *const INVALID[] = {
        "\xff", "Hello \xc3", "\xc0\xaf", "\xed\xa0\x80 surrogate", "ok. \xe4\xbd ok.", "\xf4\x90\x80\x80",
    };
    for (size_t i = 0; i < sizeof INVALID / sizeof INVALID[0]; i++) {
        TolkTextResult *r = (TolkTextResult *)&r;
        CHECK_STATUS(tolk_translate_text(t, INVALID[i], NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
        CHECK_MSG(r == NULL, "invalid UTF-8 %zu left *out_result unchanged", i);
        CHECK_MSG(strstr(tolk_last_error(), "UTF-8") != NULL, "%s", tolk_last_error());
        const char *batch[] = {"Fine.", INVALID[i]};
        CHECK_STATUS(tolk_translate_text_batch(t, batch, NULL, 2, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(tolk_last_error(), "texts[1]") != NULL, "%s", tolk_last_error());
    }
    /* A length that cuts "é" in half. */
    const char *accent = "\xc3\xa9";
    size_t half = 1;
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, &accent, &half, 1, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(r == NULL);
    /* A length no buffer has (SIZE_MAX, which some APIs take for "NUL-terminated") is
       refused before a byte is read. */
    size_t impossible = SIZE_MAX;
    CHECK_STATUS(tolk_translate_text_batch(t, &accent, &impossible, 1, NULL, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(tolk_last_error(), "impossible length") != NULL, "%s", tolk_last_error());
    CHECK(r == NULL);

    /* One translation per text: num_hypotheses must be 1. */
    TolkTranslateOptions o = tolk_translate_options_default();
    o.beam_size = 2;
    o.num_hypotheses = 2;
    CHECK_STATUS(tolk_translate_text(t, "Hello.", &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(tolk_last_error(), "num_hypotheses") != NULL);
    CHECK_STATUS(tolk_translate_text_batch(t, &accent, NULL, 1, &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    /* ... also for an empty text or none: the options are checked first. */
    CHECK_STATUS(tolk_translate_text(t, "", &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(tolk_translate_text_batch(t, NULL, NULL, 0, &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    o = tolk_translate_options_default();
    o.beam_size = 0;
    CHECK_STATUS(tolk_translate_text(t, "Hello.", &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);
    o = tolk_translate_options_default();
    o.struct_size = 0;
    CHECK_STATUS(tolk_translate_text(t, "Hello.", &o, NULL, &r), TOLK_ERROR_INVALID_ARGUMENT);

    TolkTextOptions to = tolk_text_options_default();
    to.split_mode = 3;
    CHECK_STATUS(tolk_translate_text(t, "Hello.", NULL, &to, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(tolk_last_error(), "split_mode") != NULL);
    to.split_mode = UINT32_MAX;
    CHECK_STATUS(tolk_translate_text(t, "Hello.", NULL, &to, &r), TOLK_ERROR_INVALID_ARGUMENT);
    /* (A max_sentence_tokens with no room for a piece beside the model's special tokens is
     * refused: the tiny model has none, so tests/python/test_text.py checks that on zh-en.) */
    to = tolk_text_options_default();
    to.struct_size = 0;
    CHECK_STATUS(tolk_translate_text(t, "Hello.", NULL, &to, &r), TOLK_ERROR_INVALID_ARGUMENT);
    to.struct_size = 2; /* ends inside split_mode */
    CHECK_STATUS(tolk_translate_text(t, "Hello.", NULL, &to, &r), TOLK_ERROR_INVALID_ARGUMENT);
    to = tolk_text_options_default();
    to.struct_size += 64; /* from a newer header than the library */
    CHECK_STATUS(tolk_translate_text(t, "Hello.", NULL, &to, &r), TOLK_ERROR_INVALID_ARGUMENT);
    CHECK(r == NULL);
    /* An older header without max_sentence_tokens: it keeps its default. */
    TolkTranslateOptions q = quick_options(false);
    to = tolk_text_options_default();
    to.struct_size = (uint32_t)offsetof(TolkTextOptions, max_sentence_tokens);
    to.split_mode = TOLK_SPLIT_LINES;
    to.max_sentence_tokens = 1; /* beyond struct_size: ignored */
    CHECK_STATUS(tolk_translate_text(t, "Hello. World.", &q, &to, &r), TOLK_OK);
    CHECK(r && tolk_text_result_num_sentences(r, 0) == 1);
    tolk_text_result_free(r);

    /* Out of range reads. */
    r = NULL;
    const char *two[] = {"Hello world.", "Zebra."};
    CHECK_STATUS(tolk_translate_text_batch(t, two, NULL, 2, &q, NULL, &r), TOLK_OK);
    if (r == NULL) return;
    size_t len = 77;
    CHECK(tolk_text_result_text(r, 2, &len) == NULL && len == 77);
    CHECK(tolk_text_result_text(r, (size_t)-1, NULL) == NULL);
    CHECK(tolk_text_result_num_sentences(r, 2) == 0);
    TolkSentenceInfo info = tolk_sentence_info_default();
    info.source_begin = 77;
    CHECK_STATUS(tolk_text_result_sentence(r, 2, 0, &info), TOLK_ERROR_OUT_OF_RANGE);
    CHECK(strstr(tolk_last_error(), "out of range") != NULL);
    CHECK_STATUS(tolk_text_result_sentence(r, (size_t)-1, 0, &info), TOLK_ERROR_OUT_OF_RANGE);
    CHECK_STATUS(tolk_text_result_sentence(r, 1, 1, &info), TOLK_ERROR_OUT_OF_RANGE);
    CHECK_STATUS(tolk_text_result_sentence(r, 1, (size_t)-1, &info), TOLK_ERROR_OUT_OF_RANGE);
    CHECK(info.source_begin == 77); /* untouched */
    CHECK_STATUS(tolk_text_result_sentence(r, 1, 0, &info), TOLK_OK);
    CHECK(info.source_begin == 0 && info.source_end == 6);
    tolk_text_result_free(r);
}

/* Copies `name` from the fixture into `dir`. */
static void copy_file(const char *dir, const char *name) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", MODEL_DIR, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    CHECK(in != NULL && out != NULL);
    if (in != NULL && out != NULL) {
        int c;
        while ((c = getc(in)) != EOF) putc(c, out);
    }
    if (in) fclose(in);
    if (out) fclose(out);
}

static void remove_file(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

/* A translator loaded from `dir` with `mopts` translates `src` as `want`. */
static void check_text_like(const char *dir, const TolkModelOptions *mopts, const char *src,
                            const TolkTranslateOptions *o, const TolkTextResult *want) {
    TolkTranslator *t = load_translator(dir, mopts);
    if (t == NULL) return;
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, src, o, NULL, &r), TOLK_OK);
    CHECK(r && want && same_text(r, 0, want, 0));
    tolk_text_result_free(r);
    tolk_translator_free(t);
}

/* Token translation works (whatever the tokenizer's state). */
static void check_tokens_translate(const TolkTranslator *t) {
    const char *tokens[] = {"a", "b"};
    const char *const *batch[] = {tokens};
    size_t n = 2;
    TolkResult *tr = NULL;
    CHECK_STATUS(tolk_translate_batch(t, batch, &n, 1, NULL, NULL, NULL, &tr), TOLK_OK);
    tolk_result_free(tr);
}

/* Tokenizers: a package without one (text is UNSUPPORTED, tokens still work), one named in
 * the options, missing files, a file that is not a SentencePiece model, older options. */
static void test_tokenizers(const TolkTranslator *fixture) {
    /* ROOT/model holds the model without sentencepiece.model; ROOT (its parent, also
     * searched) has none either. */
    char root[] = "/tmp/tolk-text-test-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char dir[64];
    snprintf(dir, sizeof dir, "%s/model", root);
    CHECK(mkdir(dir, 0700) == 0);
    static const char *const FILES[] = {"model.bin", "config.json", "shared_vocabulary.json"};
    for (size_t i = 0; i < 3; i++) copy_file(dir, FILES[i]);
    char spm[4096], missing[4096], not_spm[4096];
    snprintf(spm, sizeof spm, "%s/sentencepiece.model", MODEL_DIR);
    snprintf(missing, sizeof missing, "%s/no-such.spm", root);
    snprintf(not_spm, sizeof not_spm, "%s/config.json", dir);

    TolkTranslateOptions o = quick_options(true);
    const char *src = TEXTS[2];
    TolkTextResult *want = NULL;
    CHECK_STATUS(tolk_translate_text(fixture, src, &o, NULL, &want), TOLK_OK);

    /* No tokenizer: the model loads and translates tokens; text is unsupported. */
    TolkTranslator *t = load_translator(dir, NULL);
    if (t != NULL) {
        TolkTextResult *r = (TolkTextResult *)&r;
        CHECK_STATUS(tolk_translate_text(t, src, &o, NULL, &r), TOLK_ERROR_UNSUPPORTED);
        CHECK(r == NULL);
        CHECK(strstr(tolk_last_error(), "SentencePiece") != NULL);
        CHECK_STATUS(tolk_translate_text_batch(t, &src, NULL, 1, &o, NULL, &r), TOLK_ERROR_UNSUPPORTED);
        check_tokens_translate(t);
        tolk_translator_free(t);
    }
    /* A tokenizer found in the package that does not load (a junk spm.model): the model
     * still loads and translates tokens; text is unsupported, with the load error. */
    char junk[4096];
    snprintf(junk, sizeof junk, "%s/spm.model", dir);
    FILE *f = fopen(junk, "wb");
    CHECK(f != NULL);
    if (f != NULL) {
        fputs("\x0a\xff\xff\xff\x0fthis is not a SentencePiece model", f);
        fclose(f);
    }
    t = load_translator(dir, NULL);
    if (t != NULL) {
        TolkTextResult *r = (TolkTextResult *)&r;
        CHECK_STATUS(tolk_translate_text(t, src, &o, NULL, &r), TOLK_ERROR_UNSUPPORTED);
        CHECK(r == NULL);
        CHECK_MSG(strstr(tolk_last_error(), junk) != NULL, "%s", tolk_last_error());
        check_tokens_translate(t);
        tolk_translator_free(t);
    }
    /* Named in the options, the same file fails the load. */
    TolkModel *junk_model = (TolkModel *)&junk_model;
    TolkModelOptions jo = tolk_model_options_default();
    jo.source_tokenizer = junk;
    TolkStatus js = tolk_model_load_with_options(dir, &jo, &junk_model);
    CHECK_MSG(js == TOLK_ERROR_INVALID_MODEL || js == TOLK_ERROR_INVALID_ARGUMENT, "status %d: %s", (int)js, tolk_last_error());
    CHECK(junk_model == NULL && strstr(tolk_last_error(), "spm.model") != NULL);
    /* An explicit tokenizer replaces the broken one found in the package. */
    jo.source_tokenizer = spm;
    check_text_like(dir, &jo, src, &o, want);
    remove_file(dir, "spm.model");

    /* The fixture's tokenizer named in the options: the fixture's translation. */
    TolkModelOptions mo = tolk_model_options_default();
    CHECK(mo.source_tokenizer == NULL && mo.target_tokenizer == NULL);
    mo.source_tokenizer = spm;
    check_text_like(dir, &mo, src, &o, want);
    mo.target_tokenizer = spm; /* both sides named: the same model */
    check_text_like(dir, &mo, src, &o, want);
    /* Missing files fail at load with TOLK_ERROR_IO naming them. */
    TolkModel *m = (TolkModel *)&m;
    mo = tolk_model_options_default();
    mo.source_tokenizer = missing;
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &mo, &m), TOLK_ERROR_IO);
    CHECK(m == NULL);
    CHECK(strstr(tolk_last_error(), "no-such.spm") != NULL);
    mo = tolk_model_options_default();
    mo.target_tokenizer = missing; /* with the package's source tokenizer */
    CHECK_STATUS(tolk_model_load_with_options(MODEL_DIR, &mo, &m), TOLK_ERROR_IO);
    CHECK(strstr(tolk_last_error(), "no-such.spm") != NULL);
    /* A target tokenizer without any source one. */
    mo = tolk_model_options_default();
    mo.target_tokenizer = spm;
    CHECK_STATUS(tolk_model_load_with_options(dir, &mo, &m), TOLK_ERROR_INVALID_ARGUMENT);
    /* A file that is not a SentencePiece model. */
    mo = tolk_model_options_default();
    mo.source_tokenizer = not_spm;
    TolkStatus s = tolk_model_load_with_options(dir, &mo, &m);
    CHECK_MSG(s == TOLK_ERROR_INVALID_MODEL || s == TOLK_ERROR_INVALID_ARGUMENT, "status %d: %s", (int)s, tolk_last_error());
    CHECK(m == NULL && strstr(tolk_last_error(), "config.json") != NULL);
    /* A path need not be UTF-8 (it is bytes on Linux): this one is simply not there. */
    mo.source_tokenizer = "\xff.spm";
    CHECK_STATUS(tolk_model_load_with_options(dir, &mo, &m), TOLK_ERROR_IO);
    CHECK(m == NULL && strstr(tolk_last_error(), "cannot read") != NULL);
    /* Options from a header before the tokenizer fields: found in the package as before. */
    mo = tolk_model_options_default();
    mo.struct_size = (uint32_t)offsetof(TolkModelOptions, source_tokenizer);
    mo.source_tokenizer = missing; /* beyond struct_size: ignored */
    check_text_like(MODEL_DIR, &mo, src, &o, want);
    tolk_text_result_free(want);
    for (size_t i = 0; i < 3; i++) remove_file(dir, FILES[i]);
    rmdir(dir);
    rmdir(root);
}

static ProgressLog *new_progress_log(void);
static bool progress_log_ends_at(const ProgressLog *log, size_t calls, size_t total);

/* A big text: paragraphs of the test texts repeated up to `size` bytes (1 MB natively).
 * Checked like every other text, and every copy of a sentence has the same translation;
 * the progress callback counts its batches of 32 sentences (the default of text mode). */
static void test_huge(const TolkTranslator *t, size_t size) {
    const char *para = "Hello world. How are you?\r\n  The cat sat on the mat.  And the dog sat on the log!\n\n"
                       "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82 Zebra quilt vex jinx.\n\t\n";
    const size_t per_para = 7; /* sentences in one paragraph */
    size_t plen = strlen(para), copies = size / plen;
    char *big = malloc(copies * plen + 1);
    CHECK(big != NULL);
    if (big == NULL) return;
    for (size_t i = 0; i < copies; i++) memcpy(big + i * plen, para, plen);
    big[copies * plen] = '\0';
    TolkTranslateOptions o = quick_options(true);
    o.max_decoding_length = 4;
    ProgressLog *log = new_progress_log();
    o.progress = on_progress;
    o.progress_user_data = log;
    TolkTextResult *r = NULL;
    CHECK_STATUS(tolk_translate_text(t, big, &o, NULL, &r), TOLK_OK);
    if (r != NULL) {
        size_t n = check_text(r, 0, big, copies * plen, true);
        CHECK_MSG(n == copies * per_para, "%zu sentences in %zu paragraphs", n, copies);
        CHECK_MSG(progress_log_ends_at(log, (n + 31) / 32, n), "progress of %zu sentences in batches of 32", n);
        const char *text = tolk_text_result_text(r, 0, NULL);
        size_t mismatches = 0;
        for (size_t s = per_para; s < n; s++) {
            TolkSentenceInfo p, f;
            get_part(r, 0, s, &p);
            get_part(r, 0, s % per_para, &f);
            size_t tb = p.target_begin, te = p.target_end, fb = f.target_begin, fe = f.target_end;
            mismatches += p.sentence != s;
            mismatches += te - tb != fe - fb || memcmp(text + tb, text + fb, te - tb) != 0;
        }
        CHECK_MSG(mismatches == 0, "%zu copies of sentences translated differently", mismatches);
    }
    tolk_text_result_free(r);
    free(log);
    free(big);
}

#define THREADS 4
#define ROUNDS 2

typedef struct {
    const TolkTranslator *translator;
    char *output[NUM_TEXTS];
    int mismatches;
    int failures;
} ThreadJob;

/* Translates TEXTS with scores; describe()s the results into `out` (NULL on failure). */
static bool translate_all(const TolkTranslator *t, char *out[NUM_TEXTS]) {
    TolkTranslateOptions o = quick_options(true);
    o.beam_size = 2; /* beam search too */
    TolkTextResult *r = NULL;
    if (tolk_translate_text_batch(t, TEXTS, NULL, NUM_TEXTS, &o, NULL, &r) != TOLK_OK) return false;
    for (size_t i = 0; i < NUM_TEXTS; i++) out[i] = describe(r, i);
    tolk_text_result_free(r);
    return true;
}

static void *thread_main(void *arg) {
    ThreadJob *job = arg;
    for (int round = 0; round < ROUNDS; round++) {
        char *out[NUM_TEXTS] = {NULL};
        if (!translate_all(job->translator, out)) {
            job->failures++;
            continue;
        }
        for (size_t i = 0; i < NUM_TEXTS; i++) {
            if (round == 0) {
                job->output[i] = out[i];
            } else {
                job->mismatches += !out[i] || !job->output[i] || strcmp(out[i], job->output[i]) != 0;
                free(out[i]);
            }
        }
    }
    return NULL;
}

/* Threads translating text with one translator at once get the single-threaded result. */
static void test_threads(const TolkTranslator *t) {
    char *reference[NUM_TEXTS] = {NULL};
    CHECK(translate_all(t, reference));
    static ThreadJob jobs[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].translator = t;
        CHECK(pthread_create(&threads[i], NULL, thread_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK(jobs[i].failures == 0 && jobs[i].mismatches == 0);
        for (size_t s = 0; s < NUM_TEXTS; s++) {
            bool same = reference[s] && jobs[i].output[s] && strcmp(reference[s], jobs[i].output[s]) == 0;
            CHECK_MSG(same, "thread %d, text %zu: %s != %s", i, s, jobs[i].output[s] ? jobs[i].output[s] : "(null)",
                      reference[s] ? reference[s] : "(null)");
            free(jobs[i].output[s]);
        }
    }
    for (size_t s = 0; s < NUM_TEXTS; s++) free(reference[s]);
}

static ProgressLog *new_progress_log(void) {
    ProgressLog *log = malloc(sizeof *log);
    if (log) *log = progress_log(0);
    return log;
}

/* Whether the log is clean and has `calls` calls, the last one `total` of `total`. */
static bool progress_log_ends_at(const ProgressLog *log, size_t calls, size_t total) {
    if (log == NULL) return false;
    bool ok = log->violations == 0 && log->calls == calls && last_done(log) == total && log->total == total;
    if (!ok)
        fprintf(stderr, "  progress: %d violations, %zu calls (%zu expected), done %zu of %zu (%zu expected)\n",
                log->violations, log->calls, calls, last_done(log), log->total, total);
    return ok;
}

/* All parts (sentences, and parts of wrapped ones) of the texts of r. */
static size_t total_parts(const TolkTextResult *r) {
    size_t n = 0;
    for (size_t i = 0; i < tolk_text_result_count(r); i++) n += tolk_text_result_num_sentences(r, i);
    return n;
}

/* The progress callback of the text API: total = the parts of all texts (wrapped sentences
 * count each part), done grows by at most max_batch_size per call up to it, on the calling
 * thread; results as without a callback; blank texts make no call; cancelling returns
 * TOLK_ERROR_CANCELLED and no result; an old struct size ignores the callback. */
static void test_progress(const TolkTranslator *t) {
    TolkTranslateOptions plain = quick_options(true);
    plain.max_batch_size = 3;
    TolkTextResult *want = NULL, *got = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, TEXTS, NULL, NUM_TEXTS, &plain, NULL, &want), TOLK_OK);
    if (want == NULL) return;
    size_t parts = total_parts(want);
    CHECK_MSG(parts == 11, "%zu sentences in TEXTS", parts);

    ProgressLog log = progress_log(0);
    TolkTranslateOptions o = plain;
    o.progress = on_progress;
    o.progress_user_data = &log;
    CHECK_STATUS(tolk_translate_text_batch(t, TEXTS, NULL, NUM_TEXTS, &o, NULL, &got), TOLK_OK);
    CHECK_MSG(log.violations == 0 && log.total == parts && log.calls == (parts + 2) / 3,
              "%d violations, %zu calls, total %zu", log.violations, log.calls, log.total);
    for (size_t c = 0; c < log.calls && c < MAX_CALLS; c++)
        CHECK_MSG(log.done[c] == (3 * (c + 1) < parts ? 3 * (c + 1) : parts), "call %zu: done %zu", c, log.done[c]);
    for (size_t i = 0; got && i < NUM_TEXTS; i++) CHECK_MSG(same_text(got, i, want, i), "text %zu", i);
    tolk_text_result_free(got);
    got = NULL;

    /* Wrapped sentences: each part counts (default batching: one call here). */
    const char *lng = "The cat sat on the mat and the dog sat on the log and we love to read small texts. Zebra.";
    TolkTextOptions to = tolk_text_options_default();
    to.max_sentence_tokens = 6;
    log = progress_log(0);
    o = quick_options(false);
    o.progress = on_progress;
    o.progress_user_data = &log;
    CHECK_STATUS(tolk_translate_text(t, lng, &o, &to, &got), TOLK_OK);
    size_t wrapped = got ? total_parts(got) : 0;
    CHECK_MSG(wrapped >= 5 && log.violations == 0 && log.calls == 1 && last_done(&log) == wrapped && log.total == wrapped,
              "%zu parts, %zu calls, done %zu of %zu", wrapped, log.calls, last_done(&log), log.total);
    tolk_text_result_free(got);
    got = NULL;
    log = progress_log(0);
    o.max_batch_size = 2;
    CHECK_STATUS(tolk_translate_text(t, lng, &o, &to, &got), TOLK_OK);
    CHECK_MSG(log.violations == 0 && log.calls == (wrapped + 1) / 2 && last_done(&log) == wrapped,
              "%zu calls for %zu parts in batches of 2", log.calls, wrapped);
    tolk_text_result_free(got);
    got = NULL;
    /* Batches of tokens. */
    log = progress_log(0);
    o.max_batch_size = 10;
    o.batch_type = TOLK_BATCH_TOKENS;
    CHECK_STATUS(tolk_translate_text(t, lng, &o, &to, &got), TOLK_OK);
    CHECK_MSG(log.violations == 0 && log.calls >= 2 && last_done(&log) == wrapped && log.total == wrapped,
              "%zu calls, done %zu of %zu", log.calls, last_done(&log), wrapped);
    tolk_text_result_free(got);
    got = NULL;

    /* Texts without sentences: no call, an empty result per text. */
    static const char *const BLANK[] = {"", "   \n\r\n\t  ", "\n"};
    log = progress_log(0);
    o = plain;
    o.progress = on_progress;
    o.progress_user_data = &log;
    CHECK_STATUS(tolk_translate_text_batch(t, BLANK, NULL, 3, &o, NULL, &got), TOLK_OK);
    CHECK(got != NULL && tolk_text_result_count(got) == 3 && log.calls == 0);
    tolk_text_result_free(got);
    got = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, NULL, NULL, 0, &o, NULL, &got), TOLK_OK);
    CHECK(got != NULL && log.calls == 0);
    tolk_text_result_free(got);

    /* Cancelled after the first, the second and the last call, batch and single text. */
    size_t calls = (parts + 2) / 3;
    size_t at[] = {1, 2, calls};
    for (size_t k = 0; k < 3; k++) {
        log = progress_log(at[k]);
        got = (TolkTextResult *)&got; /* garbage the call must reset */
        CHECK_STATUS(tolk_translate_text_batch(t, TEXTS, NULL, NUM_TEXTS, &o, NULL, &got), TOLK_ERROR_CANCELLED);
        CHECK(got == NULL && log.violations == 0 && log.calls == at[k]);
        CHECK(strstr(tolk_last_error(), "cancel") != NULL);
    }
    log = progress_log(1);
    got = (TolkTextResult *)&got;
    CHECK_STATUS(tolk_translate_text(t, TEXTS[1], &o, NULL, &got), TOLK_ERROR_CANCELLED);
    CHECK(got == NULL && log.calls == 1);
    CHECK(strstr(tolk_last_error(), "cancel") != NULL);

    /* A caller built before the callback: a struct ending before `progress` ignores the
     * (cancelling) callback beyond it. */
    log = progress_log(1);
    o.struct_size = (uint32_t)offsetof(TolkTranslateOptions, progress);
    got = NULL;
    CHECK_STATUS(tolk_translate_text_batch(t, TEXTS, NULL, NUM_TEXTS, &o, NULL, &got), TOLK_OK);
    CHECK(log.calls == 0);
    for (size_t i = 0; got && i < NUM_TEXTS; i++) CHECK_MSG(same_text(got, i, want, i), "old struct size: text %zu", i);
    tolk_text_result_free(got);
    tolk_text_result_free(want);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: text_test MODEL_DIR\n");
        return 2;
    }
    MODEL_DIR = argv[1];
    const char *valgrind = getenv("TOLK_FFI_VALGRIND");
    bool under_valgrind = valgrind != NULL && strcmp(valgrind, "1") == 0;
    TolkTranslator *t = load_translator(MODEL_DIR, NULL);
    if (t == NULL) return finish("text_test");
    test_one_text(t);
    test_batch(t);
    test_lengths(t);
    test_empty(t);
    test_split_modes(t);
    test_null_pointers(t);
    test_sentence_info(t);
    test_sentence_indices(t);
    test_bad_arguments(t);
    test_tokenizers(t);
    test_huge(t, under_valgrind ? 64 * 1024 : 1024 * 1024);
    test_threads(t);
    test_progress(t);
    tolk_translator_free(t);
    return finish("text_test");
}
