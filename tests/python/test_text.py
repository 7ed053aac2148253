"""Text API (tolk_translate_text / tolk_translate_text_batch) through the ctypes binding.

Text in / text out on the real zh-en model must be exactly token mode on the python
``sentencepiece`` tokenization of the same sentences, detokenized by the rule the shared
models README gives for that model (its ``sentencepiece.model`` is source-only):
``"".join(pieces).replace("▁", " ").strip()``.

- split="lines" on the 500 dev verses == token mode (int8 as saved, greedy), and on the
  first N_BEAM verses with beam 4 (scores too); float32 greedy on the first N_CT2 verses
  == CTranslate2 float32 on the same tokens.
- split="sentences" (default): the sentence spans cut the source and the translation
  consistently, and the translation is the per-sentence token-mode translations put back
  between the source's gaps.
- Text structure (blank lines, CRLF, leading/trailing spaces, empty and whitespace-only
  texts, invisible and wide blanks between sentences), a 2000-sentence document, wrapping
  of long sentences (balanced parts naming their source sentence), errors, the versioned
  TolkSentenceInfo, and tokenizer discovery (Argos parent directory, broken files found in
  a package, a found target.spm kept beside a named source tokenizer) / explicit
  tokenizer paths.
- The progress callback: sentences done after each batch on the calling thread, up to
  their total; cancelling raises TolkCancelled; an exception in the callback propagates;
  translations are the same with and without a callback.

Environment: TOLK_MODELS (folder with zh-en-ct2/ and en-pt-bergamot/), TOLK_DATA (folder
with dev-matthew.zh); how many verses each comparison uses: TOLK_TEXT_LINES (greedy
lines, default 500), TOLK_TEXT_SENTENCE_LINES (sentences, 200), TOLK_TEXT_BEAM_LINES
(beam 4, 100), TOLK_TEXT_CT2_LINES (float32 vs CTranslate2, 100).
"""

import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import threading
import time

import pytest

from conftest import REPO_ROOT, report

N_LINES = int(os.environ.get("TOLK_TEXT_LINES", "500"))
N_SENT = int(os.environ.get("TOLK_TEXT_SENTENCE_LINES", "200"))
N_BEAM = int(os.environ.get("TOLK_TEXT_BEAM_LINES", "100"))
N_CT2 = int(os.environ.get("TOLK_TEXT_CT2_LINES", "100"))
TINY_FIXTURE = os.path.join(REPO_ROOT, "ffi-tests", "fixtures", "tiny")
TINY_MODEL_FILES = ("config.json", "model.bin", "shared_vocabulary.json")
# The file names tokenizer discovery looks for (src/text/tokenizer.rs).
TOKENIZER_NAMES = ("source.spm", "target.spm", "sentencepiece.model", "spm.model",
                   "sentencepiece.bpe.model")
TOKENIZER_PATTERNS = ("srcvocab.*.spm", "trgvocab.*.spm", "vocab.*.spm")


def detok(pieces):
    """The zh-en model's detokenization (its SentencePiece model does not know the
    English pieces): pieces joined, "▁" as a space, no leading/trailing space."""
    return "".join(pieces).replace("\u2581", " ").strip()


# The gap rules of text mode (src/text/translate.rs adapt_gap), written from their spec.
def _unspaced(c):
    o = ord(c)
    return (0x3000 <= o <= 0x303F or 0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF
            or 0x4E00 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF
            or 0x20000 <= o <= 0x3FFFF)


# Unicode White_Space (Rust's char::is_whitespace; str.isspace() differs).
_WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}
_LINE_BREAKS = set("\n\r\x0b\x0c\x85\u2028\u2029")
# Invisible characters a gap may hold: ZWSP, ZWNJ, ZWJ, word joiner, BOM.
_INVISIBLE = set("\u200b\u200c\u200d\u2060\ufeff")


def _blank(c):
    return (c in _WHITE_SPACE and c not in _LINE_BREAKS) or c in _INVISIBLE


def _adapt_gap(gap, done, nxt):
    """A gap with a line break is kept as it is (so is the text's head). Between two CJK
    translations a blank gap vanishes; between others an empty gap becomes " ", ASCII
    spaces and tabs stay, other blanks (NBSP, U+3000, ZWSP, BOM, ...) become " "."""
    if not done or not nxt:
        return gap
    before, after = done[-1], nxt[0]
    if before in _WHITE_SPACE or not all(_blank(c) for c in gap):
        return gap
    if _unspaced(before) and _unspaced(after):
        return ""
    if gap and all(c in " \t" for c in gap):
        return gap
    return " "


def reassemble(source, spans, translations):
    """The expected text: each translation put at its sentence's place, the source
    between sentences kept (with the gap rules), the source's head and tail kept.
    Returns (text, target spans)."""
    out, end, targets = "", 0, []
    for (s0, s1), tr in zip(spans, translations):
        out += _adapt_gap(source[end:s0], out, tr)
        targets.append((len(out), len(out) + len(tr)))
        out += tr
        end = s1
    return out + source[end:], targets


# ------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def spm():
    return pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def sp(spm, zh_en_model):
    path = os.path.join(zh_en_model, "sentencepiece.model")
    if not os.path.isfile(path):
        pytest.skip("%s not found" % path)
    return spm.SentencePieceProcessor(model_file=path)


@pytest.fixture(scope="module")
def verses(data_root):
    path = os.environ.get("TOLK_DEV_ZH") or os.path.join(data_root, "dev-matthew.zh")
    if not os.path.isfile(path):
        pytest.skip("dev data not found at %s (set TOLK_DATA or TOLK_DEV_ZH)" % path)
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    assert all(lines), "blank verse in %s" % path
    return lines


@pytest.fixture(scope="module")
def zh(tolk, zh_en_model):
    """The zh-en translator with the weights as saved (int8)."""
    t0 = time.perf_counter()
    translator = tolk.Translator(zh_en_model, intra_threads=1)
    report("text: zh-en %s load (SentencePiece found in the package) %.2f s"
           % (translator.model.compute_type, time.perf_counter() - t0))
    yield translator
    translator.close()
    translator.model.close()


def token_mode(translator, pieces, **kwargs):
    """Token-mode results for `pieces` in the order text mode translates its sentences
    (text order, batches of 32 sorted by length): the same batches, hence the same int8
    results (Tolk's int8 results may change with a sentence's batch companions)."""
    t0 = time.perf_counter()
    results = translator.translate_batch(pieces, max_batch_size=32, **kwargs)
    return results, time.perf_counter() - t0


def _join_lines(lines):
    return "\n".join(lines)


# ------------------------------------------------------------ lines == token mode


def test_lines_greedy_equals_token_mode(zh, sp, verses):
    """All 500 verses (N_LINES) as one document, split="lines", greedy int8: every output
    line is the token-mode translation of the verse's python-sentencepiece pieces."""
    verses = verses[:N_LINES]
    pieces = [sp.encode(v, out_type=str) for v in verses]
    results, t_tokens = token_mode(zh, pieces, beam_size=1)
    expected = [detok(r.hypotheses[0]) for r in results]

    t0 = time.perf_counter()
    doc = zh.translate_text(_join_lines(verses), beam_size=1, split="lines", return_sentences=True)
    t_text = time.perf_counter() - t0

    got = doc.text.split("\n")
    assert len(got) == len(verses), "the translation has %d lines for %d verses" % (len(got), len(verses))
    assert len(doc.sentences) == len(verses)
    for i, s in enumerate(doc.sentences):
        assert s.source == verses[i], i
        assert s.target == got[i], i
    mismatches = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    report("text: split=lines greedy int8, %d verses: %d/%d identical to token mode; "
           "token mode %.1f s (python spm + translate_batch), text mode %.1f s"
           % (len(verses), len(verses) - len(mismatches), len(verses), t_tokens, t_text))
    assert not mismatches, "\n".join(
        "verse %d %r:\n  text  %r\n  token %r" % (i, verses[i], got[i], expected[i])
        for i in mismatches[:5])
    assert all("\u2581" not in line for line in got)


def test_lines_beam4_batch_equals_token_mode(zh, sp, verses):
    """The first N_BEAM verses as a list of texts (one tolk_translate_text_batch call),
    beam 4 with scores: texts and scores equal token mode's."""
    subset = verses[:N_BEAM]
    pieces = [sp.encode(v, out_type=str) for v in subset]
    expected, t_tokens = token_mode(zh, pieces, beam_size=4, return_scores=True)
    t0 = time.perf_counter()
    docs = zh.translate_text(subset, beam_size=4, split="lines", return_scores=True,
                             return_sentences=True)
    t_text = time.perf_counter() - t0
    assert isinstance(docs, list) and len(docs) == len(subset)
    same_text = same_score = 0
    problems = []
    for i, (doc, exp) in enumerate(zip(docs, expected)):
        assert len(doc.sentences) == 1, (i, doc)
        s = doc.sentences[0]
        assert s.source_span == (0, len(subset[i])) and s.target_span == (0, len(doc.text))
        want = detok(exp.hypotheses[0])
        if doc.text == want:
            same_text += 1
        else:
            problems.append("verse %d: text %r token %r" % (i, doc.text, want))
        if s.score is not None and abs(s.score - exp.scores[0]) <= 1e-6:
            same_score += 1
        else:
            problems.append("verse %d: score %r token mode %r" % (i, s.score, exp.scores[0]))
    report("text: split=lines beam 4 int8, %d texts in one batch call: %d identical texts, "
           "%d identical scores (1e-6); token mode %.1f s, text mode %.1f s"
           % (len(subset), same_text, same_score, t_tokens, t_text))
    assert not problems, "\n".join(problems[:5])


def _ct2_cached(request, ctranslate2, model_dir, translator, source, kwargs):
    st = os.stat(os.path.join(model_dir, "model.bin"))
    key = hashlib.sha256(json.dumps(
        [ctranslate2.__version__, st.st_size, int(st.st_mtime), source, "float32",
         os.environ.get("CT2_USE_MKL"), os.environ.get("CT2_FORCE_CPU_ISA"),
         sorted(kwargs.items())], ensure_ascii=False).encode("utf-8")).hexdigest()[:24]
    cache_key = "tolk/text_ct2/" + key
    cache = request.config.cache
    cached = cache.get(cache_key, None) if cache else None
    if cached is not None and os.environ.get("TOLK_NO_CACHE") != "1":
        return cached["hypotheses"], cached["seconds"], True
    t0 = time.perf_counter()
    hyps = [r.hypotheses[0] for r in translator().translate_batch(source, **kwargs)]
    seconds = time.perf_counter() - t0
    if cache:
        cache.set(cache_key, {"hypotheses": hyps, "seconds": seconds})
    return hyps, seconds, False


def test_lines_float32_equals_ctranslate2(request, tolk, ctranslate2, zh_en_model, sp, verses):
    """float32 text mode == CTranslate2 float32 token mode on the same pieces."""
    subset = verses[:N_CT2]
    pieces = [sp.encode(v, out_type=str) for v in subset]
    kwargs = dict(beam_size=1, max_batch_size=32)
    ct2 = lambda: ctranslate2.Translator(zh_en_model, device="cpu", compute_type="float32",
                                         intra_threads=1)
    hyps, t_ct2, cached = _ct2_cached(request, ctranslate2, zh_en_model, ct2, pieces, kwargs)
    expected = [detok(h) for h in hyps]
    with tolk.Translator(zh_en_model, compute_type="float32") as tr:
        assert tr.model.compute_type == "float32"
        t0 = time.perf_counter()
        got = tr.translate_text(_join_lines(subset), beam_size=1, split="lines").split("\n")
        t_text = time.perf_counter() - t0
        tr.model.close()
    assert len(got) == len(subset)
    mismatches = [i for i in range(len(subset)) if got[i] != expected[i]]
    report("text: split=lines greedy float32, %d verses: %d/%d identical to CTranslate2 %s "
           "(%.1f s%s); tolk text mode %.1f s"
           % (len(subset), len(subset) - len(mismatches), len(subset), ctranslate2.__version__,
              t_ct2, ", cached" if cached else "", t_text))
    assert not mismatches, "\n".join(
        "verse %d %r:\n  tolk %r\n  ct2  %r" % (i, subset[i], got[i], expected[i])
        for i in mismatches[:5])


# ------------------------------------------------------------ sentence splitting


def test_sentences_reassemble_token_mode(zh, sp, verses):
    """Default split on the first N_SENT verses (a list of texts): the source spans
    cover every non-space character of each verse, each sentence's translation is token
    mode on its own pieces, and the translation is those put back between the source's
    gaps."""
    verses = verses[:N_SENT]
    t0 = time.perf_counter()
    docs = zh.translate_text(verses, beam_size=1, return_sentences=True)
    t_text = time.perf_counter() - t0
    sentences = [[s.source for s in d.sentences] for d in docs]
    flat = [s for ss in sentences for s in ss]
    results, t_tokens = token_mode(zh, [sp.encode(s, out_type=str) for s in flat], beam_size=1)
    translations = iter(detok(r.hypotheses[0]) for r in results)

    multi = 0
    problems = []
    for i, (verse, doc) in enumerate(zip(verses, docs)):
        spans = [s.source_span for s in doc.sentences]
        assert spans, "verse %d gave no sentence" % i
        multi += len(spans) > 1
        covered = [False] * len(verse)
        last = 0
        for s in doc.sentences:
            a, b = s.source_span
            assert last <= a < b, (i, spans)
            assert s.source == verse[a:b] and s.source == s.source.strip(), (i, s)
            covered[a:b] = [True] * (b - a)
            last = b
        uncovered = [c for c, cov in zip(verse, covered) if not cov and not c.isspace()]
        assert not uncovered, "verse %d: %r outside every sentence (%r)" % (i, uncovered, spans)
        want = [next(translations) for _ in spans]
        text, targets = reassemble(verse, spans, want)
        got_targets = [s.target_span for s in doc.sentences]
        if doc.text != text or got_targets != targets:
            problems.append("verse %d %r: sentences %r\n  got      %r %r\n  expected %r %r"
                            % (i, verse, [s.source for s in doc.sentences], doc.text,
                               got_targets, text, targets))
            continue
        for (t0_, t1_), w in zip(got_targets, want):
            assert doc.text[t0_:t1_] == w
        # Between translations: only the source's whitespace (or one inserted space).
        gaps = [doc.text[:got_targets[0][0]]] + [
            doc.text[a[1]:b[0]] for a, b in zip(got_targets, got_targets[1:])
        ] + [doc.text[got_targets[-1][1]:]]
        assert all(g.strip() == "" for g in gaps), (i, gaps)
    report("text: split=sentences greedy int8, %d verses -> %d sentences, %d verses split "
           "into >1 sentence; text mode %.1f s, token mode %.1f s"
           % (len(verses), len(flat), multi, t_text, t_tokens))
    assert not problems, "%d verses differ:\n%s" % (len(problems), "\n".join(problems[:5]))
    assert multi > 0


# --------------------------------------------------------------- text structure


def _line_shape(text):
    """Per line (split at \\n): blank or not, leading whitespace, trailing whitespace
    (\\r included)."""
    shape = []
    for line in text.split("\n"):
        body = line.strip()
        if not body:
            shape.append(("blank", line))
        else:
            lead = line[: len(line) - len(line.lstrip())]
            trail = line[len(line.rstrip()):]
            shape.append(("text", lead, trail))
    return shape


def test_paragraph_structure_is_kept(zh):
    text = ("  耶稣看见这许多的人，就上了山。他既已坐下，门徒到他跟前来。  \r\n"
            "\r\n"
            "\t他就开口教训他们。\n"
            "\n"
            "   \n"
            "虚心的人有福了，因为天国是他们的。\r\n"
            "哀恸的人有福了！因为他们必得安慰。 \n\n")
    doc = zh.translate_text(text, beam_size=1, return_sentences=True)
    out = doc.text
    assert _line_shape(out) == _line_shape(text), "source %r\ntranslation %r" % (text, out)
    assert out.count("\r\n") == text.count("\r\n")
    assert len(doc.sentences) == 6, [s.source for s in doc.sentences]
    assert all(s.target for s in doc.sentences)
    assert "\u2581" not in out
    # Two sentences with no space between them in Chinese get one space in English.
    first_line = out.split("\n")[0]
    t_a, t_b = doc.sentences[0].target_span, doc.sentences[1].target_span
    assert out[t_a[1]:t_b[0]] == " ", repr(first_line)
    # The same through the lines mode: 4 non-blank lines, same shape.
    by_lines = zh.translate_text(text, beam_size=1, split="lines", return_sentences=True)
    assert len(by_lines.sentences) == 4
    assert _line_shape(by_lines.text) == _line_shape(text)
    # "whole": one unit, the text's head and tail kept.
    whole = zh.translate_text(text, beam_size=1, split="whole", return_sentences=True,
                              max_decoding_length=64)
    assert len(whole.sentences) == 1
    assert whole.text.startswith("  ") and whole.text.endswith(" \n\n")
    report("text: paragraph %r -> %r" % (text, out))


@pytest.mark.parametrize("split", ["sentences", "lines", "whole"])
def test_empty_and_whitespace_texts(zh, split):
    blank = ["", " ", "\n", "  \r\n\t \n\u3000\u00a0 ", "\n\n\n"]
    assert zh.translate_text("", split=split) == ""
    got = zh.translate_text(blank, split=split, return_sentences=True)
    assert [d.text for d in got] == blank
    assert all(d.sentences == [] for d in got)
    assert zh.translate_text([], split=split) == []
    # Mixed with real text in one batch: each text keeps its own result.
    mixed = zh.translate_text(["", "你好。", "   "], split=split, beam_size=1)
    assert mixed[0] == "" and mixed[2] == "   " and mixed[1].strip() and "\u2581" not in mixed[1]
    # Text that SentencePiece encodes to no piece at all (zero-width space) is kept too.
    assert zh.translate_text("\u200b", split=split) == "\u200b"


def test_two_thousand_sentences(zh):
    # Sentences with two-token translations ("Yes.", "Why?"): the test is about the
    # number of sentences, not their length.
    pool = ["是。", "好。", "不。", "你好。", "对。", "走！", "为什么？"]
    lines = []
    for i in range(200):
        lines.append("".join(pool[(i + k) % len(pool)] for k in range(10)))
    text = "\n".join(lines)
    t0 = time.perf_counter()
    doc = zh.translate_text(text, beam_size=1, max_decoding_length=16, return_sentences=True)
    seconds = time.perf_counter() - t0
    assert len(doc.sentences) == 2000
    out_lines = doc.text.split("\n")
    assert len(out_lines) == 200 and all(line.strip() for line in out_lines)
    assert all(s.target for s in doc.sentences)
    assert [s.source for s in doc.sentences[:7]] == pool
    # Equal sources translate equally wherever they are in the batch.
    by_source = {}
    for s in doc.sentences:
        by_source.setdefault(s.source, set()).add(s.target)
    assert all(len(v) == 1 for v in by_source.values()), by_source
    report("text: 2000 short sentences (200 lines) in %.1f s (default max_batch_size: batches "
           "of 32)" % seconds)


def _long_sentence(verses, n_chars=600):
    parts, total = [], 0
    for v in verses:
        clause = re.sub(r"[。！？：；“”\"「」‘’.!?;:\s]", "", v).strip("，")
        if not clause:
            continue
        parts.append(clause)
        total += len(clause) + 1
        if total >= n_chars:
            break
    return ("，".join(parts))[: n_chars - 1] + "。"


def _piece_counts(sp, sentence, parts):
    """How many of `sentence`'s python-sentencepiece pieces each part holds (the parts must
    partition them). The sentence has no spaces and its normalization maps each character
    to one character (checked), so the pieces' lengths give their character ranges."""
    pieces = sp.encode(sentence, out_type=str)
    assert "".join(pieces).lstrip("\u2581") and pieces[0].startswith("\u2581")
    assert sum(len(p) for p in pieces) - 1 == len(sentence), pieces
    all_pieces, at = [], 0
    for k, p in enumerate(pieces):
        n = len(p) - (1 if k == 0 else 0)
        all_pieces.append((at, at + n))
        at += n
    owner = []  # the part holding each piece (a lone leading "▁" is the first part's)
    for p0, p1 in all_pieces:
        k = [k for k, s in enumerate(parts) if s.source_span[0] <= p0 and p1 <= s.source_span[1]]
        assert k, "piece %r of the sentence is in no part (%r)" % ((p0, p1), [s.source_span for s in parts])
        owner.append(k[0])
    return len(all_pieces), [owner.count(k) for k in range(len(parts))]


def test_long_sentence_is_wrapped(zh, sp, verses):
    sentence = _long_sentence(verses)
    assert len(sentence) == 600
    doc = zh.translate_text(sentence, beam_size=1, max_sentence_tokens=32, return_sentences=True)
    parts = doc.sentences
    total, counts = _piece_counts(sp, sentence, parts)
    spm_on_span = [len(sp.encode(s.source, out_type=str)) for s in parts]
    for s in parts:
        assert s.target.strip() and "\u2581" not in s.target, s
    report("text: a 600-character sentence (%d pieces), max_sentence_tokens=32 -> %d parts of "
           "%s pieces (python spm on each part's text: %s)"
           % (total, len(parts), counts, spm_on_span))
    # 31 pieces + the end token per part, balanced.
    assert len(parts) >= math.ceil(total / 31) and len(parts) >= 3
    assert all(1 <= c <= 31 for c in counts), counts
    assert min(counts) >= max(counts) // 2, counts
    assert sum(counts) == total  # the parts partition the sentence's pieces
    # Re-tokenizing a part's text alone can add one piece: a part that starts inside a word
    # gets SentencePiece's dummy "▁" prefix as a piece of its own.
    assert all(n <= 32 for n in spm_on_span), spm_on_span
    # All parts belong to the text's one sentence.
    assert [s.sentence_index for s in parts] == [0] * len(parts)
    # Parts of one sentence are joined like sentences ("," + space in English).
    ends = [s.source_span for s in parts]
    assert ends[0][0] == 0 and ends[-1][1] == len(sentence)
    assert all(x[1] == y[0] for x, y in zip(ends, ends[1:]))
    # max_input_length bounds the parts like max_sentence_tokens: the same parts.
    bounded = zh.translate_text(sentence, beam_size=1, max_input_length=32, return_sentences=True)
    assert [s.source_span for s in bounded.sentences] == ends


def test_wrapping_uses_the_fewest_parts(zh, sp, verses):
    """k = ceil(n / max) parts of about n / k pieces: a cut chosen for a better place
    (after punctuation rather than inside a word) must not cost extra parts later."""
    sentence = _long_sentence(verses)
    doc = zh.translate_text(sentence, beam_size=1, max_sentence_tokens=32, max_decoding_length=4,
                            return_sentences=True)
    total, counts = _piece_counts(sp, sentence, doc.sentences)
    assert len(counts) == math.ceil(total / 31), (total, counts)


def _sentence_of_pieces(sp, verses, low, high):
    """A Chinese sentence without spaces whose python-sentencepiece encoding has between
    `low` and `high` pieces."""
    long = _long_sentence(verses, 2000)[:-1]
    lo, hi = 1, len(long)
    while lo < hi:  # the shortest prefix (+ "。") with at least `low` pieces
        mid = (lo + hi) // 2
        if len(sp.encode(long[:mid] + "。", out_type=str)) >= low:
            hi = mid
        else:
            lo = mid + 1
    sentence = long[:lo] + "。"
    n = len(sp.encode(sentence, out_type=str))
    assert low <= n <= high, (n, sentence)
    return sentence, n


def test_sentence_just_over_the_limit_is_halved(zh, sp, verses):
    """A sentence of 129-135 pieces with the default settings (128 tokens, the end token
    included): two parts of about half each, not 127 pieces and a tail of a few, whose
    translation would be made up."""
    sentence, n = _sentence_of_pieces(sp, verses, 129, 135)
    doc = zh.translate_text(sentence, beam_size=1, return_sentences=True)
    parts = doc.sentences
    total, counts = _piece_counts(sp, sentence, parts)
    report("text: a %d-piece sentence with the default max_sentence_tokens -> parts of %s pieces"
           % (total, counts))
    assert len(parts) == 2, counts
    assert min(counts) >= 0.5 * max(counts), counts
    assert all(c <= 127 for c in counts), counts
    assert [s.sentence_index for s in parts] == [0, 0]
    assert all(s.target.strip() for s in parts), parts
    # 127 pieces fit in one part.
    short, n = _sentence_of_pieces(sp, verses, 120, 127)
    assert len(zh.translate_text(short, beam_size=1, max_decoding_length=8,
                                 return_sentences=True).sentences) == 1, n


def test_parts_name_their_sentence(zh, sp, verses):
    """Sentence indices count the source sentences of each text: the parts of a wrapped
    sentence share one, the others have their own, across lines too."""
    long = _long_sentence(verses, 200)
    text = "你好。" + long + "谢谢！\n\n我很好。"
    doc = zh.translate_text(text, beam_size=1, max_sentence_tokens=24, max_decoding_length=48,
                            return_sentences=True)
    index = [s.sentence_index for s in doc.sentences]
    n_long = index.count(1)
    assert n_long >= 3 and index == [0] + [1] * n_long + [2, 3], index
    whole = zh.translate_text(text, beam_size=1, max_decoding_length=8, max_sentence_tokens=512,
                              return_sentences=True)
    assert [s.sentence_index for s in whole.sentences] == [0, 1, 2, 3]
    # Each sentence's parts cover exactly the unwrapped sentence.
    for k, unwrapped in enumerate(whole.sentences):
        mine = [s.source_span for s in doc.sentences if s.sentence_index == k]
        assert mine[0][0] == unwrapped.source_span[0] and mine[-1][1] == unwrapped.source_span[1]
    # Every text of a batch counts from 0.
    docs = zh.translate_text(["你好。谢谢。", "我很好。"], beam_size=1, max_decoding_length=8,
                             return_sentences=True)
    assert [[s.sentence_index for s in d.sentences] for d in docs] == [[0, 1], [0]]


@pytest.mark.parametrize("blank", ["\u200b", "\ufeff", "\u2060", "\u00a0", "\u3000",
                                   "\u200b \u200b", " ", "\t", ""])
def test_blank_gap_between_chinese_sentences(zh, blank):
    """Between two Chinese sentences translated into English, a gap of invisible or wide
    blanks becomes one space ("Hello. I love you."); ASCII spaces and tabs stay as they
    are; no gap becomes one space."""
    text = "你好。" + blank + "我爱你。"
    doc = zh.translate_text(text, beam_size=1, return_sentences=True)
    assert len(doc.sentences) == 2, doc
    a, b = doc.sentences
    gap = doc.text[a.target_span[1]:b.target_span[0]]
    want = blank if blank in (" ", "\t") else " "
    assert gap == want, (blank, doc.text)
    assert all(c not in doc.text for c in "\u200b\ufeff\u2060\u00a0\u3000"), doc.text
    assert doc.text == a.target + want + b.target
    assert [s.sentence_index for s in doc.sentences] == [0, 1]


@pytest.mark.parametrize("blank", ["\u200b", "\ufeff", "\u2060", "\u00a0", "\u3000", " ", ""])
def test_line_break_gap_is_kept(zh, blank):
    """A gap with a line break is kept exactly as it is, blanks around the break included;
    nothing is translated from the blanks (an invisible character alone on a line is no
    sentence), and sentence indices count the sentences there are."""
    text = "你好。" + blank + "\n" + blank + "我爱你。"
    doc = zh.translate_text(text, beam_size=1, return_sentences=True)
    assert [s.source for s in doc.sentences] == ["你好。", "我爱你。"], (blank, doc)
    a, b = doc.sentences
    source_gap = text[a.source_span[1]:b.source_span[0]]
    assert "\n" in source_gap and doc.text[a.target_span[1]:b.target_span[0]] == source_gap, \
        (blank, source_gap, doc.text)
    assert [s.sentence_index for s in doc.sentences] == [0, 1], (blank, doc)
    # A text starting with such a line: its first sentence is sentence 0.
    doc = zh.translate_text(blank + "\n你好。", beam_size=1, return_sentences=True)
    assert [s.sentence_index for s in doc.sentences] == [0], (blank, doc)


def test_sentence_spans_are_str_indices(tolk, zh):
    """The binding converts the C byte ranges into str indices: check them against the
    raw byte ranges on a text with 1-, 2-, 3- and 4-byte characters."""
    text = "é 𝄞 你好。Ça va? 我很好！\n😀 再见。"
    doc = zh.translate_text(text, beam_size=1, return_sentences=True)
    lib = tolk._get_lib()
    raw = tolk._TextResultP()
    data = text.encode("utf-8")
    opts = lib.tolk_translate_options_default()
    opts.beam_size = 1
    assert lib.tolk_translate_text(zh._ptr, data, ctypes.byref(opts), None, ctypes.byref(raw)) == 0
    try:
        n = lib.tolk_text_result_num_sentences(raw, 0)
        assert n == len(doc.sentences)
        length = ctypes.c_size_t()
        out = ctypes.string_at(lib.tolk_text_result_text(raw, 0, ctypes.byref(length)), length.value)
        for k in range(n):
            info = lib.tolk_sentence_info_default()
            info.score = 0.0
            assert lib.tolk_text_result_sentence(raw, 0, k, ctypes.byref(info)) == 0
            assert math.isnan(info.score)
            sb, se, tb, te = info.source_begin, info.source_end, info.target_begin, info.target_end
            s = doc.sentences[k]
            assert info.sentence == s.sentence_index == k
            assert data[sb:se].decode("utf-8") == s.source == text[slice(*s.source_span)]
            assert out[tb:te].decode("utf-8") == s.target == doc.text[slice(*s.target_span)]
            assert s.score is None
        assert out.decode("utf-8") == doc.text  # beam 1 both times: same text
        info = lib.tolk_sentence_info_default()
        assert lib.tolk_text_result_sentence(raw, 0, n, ctypes.byref(info)) == \
            tolk.Status.ERROR_OUT_OF_RANGE
        assert lib.tolk_text_result_sentence(raw, 0, 0, None) == tolk.Status.ERROR_NULL_POINTER
        assert lib.tolk_text_result_text(raw, 1, None) is None
    finally:
        lib.tolk_text_result_free(raw)


def test_sentence_info_struct_versions(tolk, zh):
    """TolkSentenceInfo from an older header (a smaller struct_size at a field boundary)
    gets only the fields that fit; the bytes after them and struct_size stay the
    caller's. Sizes inside a field or below 4 are invalid arguments."""
    lib = tolk._get_lib()
    info_t = tolk.TolkSentenceInfo
    assert lib.tolk_sentence_info_default().struct_size == ctypes.sizeof(info_t)
    raw = tolk._TextResultP()
    opts = lib.tolk_translate_options_default()
    opts.beam_size = 1
    opts.return_scores = True
    opts.max_decoding_length = 16
    assert lib.tolk_translate_text(zh._ptr, "你好。谢谢。".encode(), ctypes.byref(opts), None,
                                   ctypes.byref(raw)) == 0
    try:
        full = lib.tolk_sentence_info_default()
        assert lib.tolk_text_result_sentence(raw, 0, 1, ctypes.byref(full)) == 0
        assert (full.source_begin, full.source_end, full.sentence) == (9, 18, 1)
        assert math.isfinite(full.score) and full.score <= 0
        names = [f[0] for f in info_t._fields_]
        for k, name in enumerate(names):
            size = ctypes.sizeof(info_t) if k + 1 == len(names) else getattr(info_t, names[k + 1]).offset
            buf = (ctypes.c_ubyte * ctypes.sizeof(info_t))(*[0xA5] * ctypes.sizeof(info_t))
            old = info_t.from_buffer(buf)
            old.struct_size = size
            assert lib.tolk_text_result_sentence(raw, 0, 1, ctypes.byref(old)) == 0, \
                (size, tolk._last_error(lib))
            assert old.struct_size == size
            assert all(b == 0xA5 for b in bytes(buf)[size:]), (size, bytes(buf))
            for field in names[1:k + 1]:
                assert getattr(old, field) == getattr(full, field), (size, field)
        for size in (0, 2, 3, 6, info_t.source_begin.offset + 4, ctypes.sizeof(info_t) - 1):
            bad = lib.tolk_sentence_info_default()
            bad.struct_size = size
            bad.sentence = 77
            assert lib.tolk_text_result_sentence(raw, 0, 1, ctypes.byref(bad)) == \
                tolk.Status.ERROR_INVALID_ARGUMENT, size
            assert bad.sentence == 77 and bad.struct_size == size
    finally:
        lib.tolk_text_result_free(raw)


def test_nul_characters_are_text(zh):
    """Texts go to the library with their byte lengths: a NUL does not cut them."""
    doc = zh.translate_text("你好。\x00\n谢谢。", beam_size=1, return_sentences=True,
                            max_decoding_length=32)
    assert isinstance(doc.text, str)
    assert doc.sentences and doc.sentences[-1].source == "谢谢。", doc


# ----------------------------------------------------------------------- errors


def _raw_text_batch(tolk, translator, texts, lengths=None, options=None, text_options=None):
    lib = tolk._get_lib()
    n = len(texts)
    ptrs = (ctypes.c_char_p * max(n, 1))(*texts)
    lens = None if lengths is None else (ctypes.c_size_t * max(n, 1))(*lengths)
    out = tolk._TextResultP()
    status = lib.tolk_translate_text_batch(
        translator._ptr, ctypes.cast(ptrs, tolk._CharPP), lens, n,
        None if options is None else ctypes.byref(options),
        None if text_options is None else ctypes.byref(text_options), ctypes.byref(out))
    if out:
        lib.tolk_text_result_free(out)
    return status, bool(out), tolk._last_error(lib)


def test_invalid_utf8_is_an_invalid_argument(tolk, zh):
    for bad in (b"\xff\xfe", "你好".encode("utf-8")[:4], b"ok\xc3(", b"\xed\xa0\x80"):
        status, out, msg = _raw_text_batch(tolk, zh, [b"fine.", bad], [5, len(bad)])
        assert status == tolk.Status.ERROR_INVALID_ARGUMENT, (bad, status, msg)
        assert not out and "UTF-8" in msg and "texts[1]" in msg, msg
    # NUL-terminated (lengths NULL) and the one-text entry point.
    status, out, msg = _raw_text_batch(tolk, zh, [b"\xc3\x28"])
    assert status == tolk.Status.ERROR_INVALID_ARGUMENT and not out, msg
    lib = tolk._get_lib()
    res = tolk._TextResultP()
    assert lib.tolk_translate_text(zh._ptr, b"a\xff", None, None, ctypes.byref(res)) == \
        tolk.Status.ERROR_INVALID_ARGUMENT
    assert not res
    # Explicit lengths let a valid text hold NUL; a length of 0 with a NULL pointer is "".
    status, out, msg = _raw_text_batch(tolk, zh, [b"a\x00b", None], [3, 0])
    assert status == tolk.Status.OK, msg


def test_null_arguments(tolk, zh):
    lib = tolk._get_lib()
    res = tolk._TextResultP()
    assert lib.tolk_translate_text(zh._ptr, None, None, None, ctypes.byref(res)) == \
        tolk.Status.ERROR_NULL_POINTER
    assert lib.tolk_translate_text(zh._ptr, b"x", None, None, None) == tolk.Status.ERROR_NULL_POINTER
    assert lib.tolk_translate_text(None, b"x", None, None, ctypes.byref(res)) == \
        tolk.Status.ERROR_NULL_POINTER
    assert lib.tolk_translate_text_batch(zh._ptr, None, None, 1, None, None, ctypes.byref(res)) == \
        tolk.Status.ERROR_NULL_POINTER
    status, _, msg = _raw_text_batch(tolk, zh, [None], None)
    assert status in (tolk.Status.ERROR_NULL_POINTER, tolk.Status.ERROR_INVALID_ARGUMENT), msg
    # count 0 with NULL arrays is an empty result.
    assert lib.tolk_translate_text_batch(zh._ptr, None, None, 0, None, None, ctypes.byref(res)) == 0
    assert lib.tolk_text_result_count(res) == 0
    lib.tolk_text_result_free(res)
    # Accessors accept NULL results.
    assert lib.tolk_text_result_count(None) == 0
    assert lib.tolk_text_result_num_sentences(None, 0) == 0
    assert lib.tolk_text_result_text(None, 0, None) is None
    info = lib.tolk_sentence_info_default()
    assert lib.tolk_text_result_sentence(None, 0, 0, ctypes.byref(info)) == \
        tolk.Status.ERROR_NULL_POINTER
    lib.tolk_text_result_free(None)


def test_binding_refusals(tolk, zh_en_model, tmp_path):
    d = _tiny_without_tokenizer(tmp_path)
    tr = tolk.Translator(str(d))
    with pytest.raises(UnicodeEncodeError):
        tr.translate_text("lone \ud800 surrogate")
    tr.close()
    tr.model.close()
    with pytest.raises(ValueError):
        tr.translate_text("closed")


def test_old_model_options_struct(tolk, tmp_path):
    """A caller built against the header without the tokenizer fields (struct_size ends
    after compute_type) still loads: the fields it does not know are the defaults."""
    d = _tiny_without_tokenizer(tmp_path)
    lib = tolk._get_lib()
    opts = lib.tolk_model_options_default()
    opts.struct_size = tolk.TolkModelOptions.source_tokenizer.offset
    missing = str(tmp_path / "missing.spm").encode()
    opts.source_tokenizer = missing  # beyond struct_size: ignored
    model = tolk._ModelP()
    assert lib.tolk_model_load_with_options(str(d).encode(), ctypes.byref(opts),
                                            ctypes.byref(model)) == 0, tolk._last_error(lib)
    lib.tolk_model_free(model)
    opts.struct_size = tolk.TolkModelOptions.source_tokenizer.offset + 4  # splits a field
    assert lib.tolk_model_load_with_options(str(d).encode(), ctypes.byref(opts),
                                            ctypes.byref(model)) == tolk.Status.ERROR_INVALID_ARGUMENT
    opts.struct_size = ctypes.sizeof(tolk.TolkModelOptions)
    assert lib.tolk_model_load_with_options(str(d).encode(), ctypes.byref(opts),
                                            ctypes.byref(model)) == tolk.Status.ERROR_IO


def test_num_hypotheses_must_be_one(tolk, zh):
    lib = tolk._get_lib()
    opts = lib.tolk_translate_options_default()
    opts.num_hypotheses = 2
    opts.beam_size = 2
    status, out, msg = _raw_text_batch(tolk, zh, [b"\xe4\xbd\xa0\xe5\xa5\xbd"], [6], options=opts)
    assert status == tolk.Status.ERROR_INVALID_ARGUMENT and not out
    assert "num_hypotheses" in msg, msg


def test_bad_text_options(tolk, zh):
    lib = tolk._get_lib()
    assert lib.tolk_model_options_default().struct_size == ctypes.sizeof(tolk.TolkModelOptions)
    text_opts = lib.tolk_text_options_default()
    assert (text_opts.split_mode, text_opts.max_sentence_tokens) == (0, 128)
    assert text_opts.struct_size == ctypes.sizeof(tolk.TolkTextOptions)
    text_opts.split_mode = 3
    status, _, msg = _raw_text_batch(tolk, zh, [b"x"], [1], text_options=text_opts)
    assert status == tolk.Status.ERROR_INVALID_ARGUMENT, msg
    with pytest.raises(tolk.TolkError) as ei:
        zh.translate_text("你好。", max_sentence_tokens=1)
    assert ei.value.status == tolk.Status.ERROR_INVALID_ARGUMENT
    with pytest.raises(ValueError):
        zh.translate_text("你好。", split="paragraphs")
    with pytest.raises(TypeError):
        zh.translate_text(b"bytes")
    with pytest.raises(TypeError):
        zh.translate_text(["ok", 3])


def _tiny_without_tokenizer(tmp_path):
    """A copy of the tiny CT2 fixture's model files in <tmp>/pkg/model, with no
    SentencePiece file in the directory nor its parent."""
    model_bin = os.path.join(TINY_FIXTURE, "model.bin")
    if not os.path.isfile(model_bin):
        pytest.skip("tiny fixture missing at %s" % TINY_FIXTURE)
    d = tmp_path / "pkg" / "model"
    d.mkdir(parents=True)
    for name in TINY_MODEL_FILES:
        shutil.copy(os.path.join(TINY_FIXTURE, name), d / name)
    for place in (d, d.parent):
        names = os.listdir(place)
        assert not [n for n in names if n in TOKENIZER_NAMES or n.endswith(".spm")], names
    return d


def test_model_without_tokenizer_is_unsupported(tolk, tmp_path):
    d = _tiny_without_tokenizer(tmp_path)
    with tolk.Translator(str(d)) as tr:
        # Token mode works as before.
        assert tr.translate_batch([["a", "b"]], beam_size=1)[0].hypotheses
        with pytest.raises(tolk.TolkError) as ei:
            tr.translate_text("abc")
        tr.model.close()
    err = ei.value
    assert err.status == tolk.Status.ERROR_UNSUPPORTED, err
    for name in TOKENIZER_NAMES + TOKENIZER_PATTERNS:
        assert name in err.message, (name, err.message)
    assert str(d) in err.message
    report("text: no tokenizer -> %s" % err)


def test_tokenizer_found_in_parent_directory(tolk, sp, tmp_path, zh_en_model):
    """Argos layout: package/model/ beside package/sentencepiece.model."""
    d = _tiny_without_tokenizer(tmp_path)
    shutil.copy(os.path.join(zh_en_model, "sentencepiece.model"), d.parent / "sentencepiece.model")
    with tolk.Translator(str(d)) as tr:
        out = tr.translate_text(["你好。", "  "], beam_size=1, max_decoding_length=8)
        tr.model.close()
    assert isinstance(out[0], str) and out[1] == "  "


def test_missing_tokenizer_path_is_io(tolk, tmp_path, zh_en_model):
    missing = str(tmp_path / "nope.spm")
    with pytest.raises(tolk.TolkError) as ei:
        tolk.Model(zh_en_model, source_tokenizer=missing)
    assert ei.value.status == tolk.Status.ERROR_IO, ei.value
    assert "nope.spm" in ei.value.message
    with pytest.raises(tolk.TolkError) as ei:
        tolk.Translator(zh_en_model, target_tokenizer=missing)
    assert ei.value.status == tolk.Status.ERROR_IO, ei.value
    # Tokenizers belong to the model: a Model object plus tokenizer paths is refused.
    d = _tiny_without_tokenizer(tmp_path)
    with tolk.Model(str(d)) as m:
        with pytest.raises(ValueError):
            tolk.Translator(m, source_tokenizer=missing)


def _junk(path):
    path.write_bytes(b"\x0a\xff\xff\xff\x0fthis is not a sentencepiece model" + os.urandom(64))
    return path


def test_corrupt_tokenizer_named_fails_the_load(tolk, tmp_path):
    d = _tiny_without_tokenizer(tmp_path)
    bad = _junk(tmp_path / "sentencepiece.model")
    with pytest.raises(tolk.TolkError) as ei:
        tolk.Model(str(d), source_tokenizer=str(bad))
    assert ei.value.status == tolk.Status.ERROR_INVALID_MODEL, ei.value
    assert "sentencepiece.model" in ei.value.message


@pytest.mark.parametrize("name", ["sentencepiece.model", "spm.model", "vocab.xx.spm"])
def test_corrupt_tokenizer_found_in_package_is_unsupported_text(tolk, tmp_path, name):
    """A broken tokenizer file that the package happens to hold does not stop the model
    from loading: tokens translate, text fails with TOLK_ERROR_UNSUPPORTED and the load
    error (naming the file)."""
    d = _tiny_without_tokenizer(tmp_path)
    bad = _junk(d / name)
    with tolk.Translator(str(d)) as tr:
        assert tr.translate_batch([["a", "b"]], beam_size=1, max_decoding_length=4)[0].hypotheses
        with pytest.raises(tolk.TolkError) as ei:
            tr.translate_text("Hello.")
        tr.model.close()
    assert ei.value.status == tolk.Status.ERROR_UNSUPPORTED, ei.value
    assert str(bad) in ei.value.message, ei.value.message
    report("text: a junk %s in the package -> %s" % (name, ei.value))
    # A named tokenizer replaces it.
    spm_path = os.path.join(TINY_FIXTURE, "sentencepiece.model")
    with tolk.Translator(str(d), source_tokenizer=spm_path) as tr:
        assert tr.translate_text("Hello.", beam_size=1, max_decoding_length=4)
        tr.model.close()


def test_parent_directory_only_for_argos_packages(tolk, tmp_path):
    """The parent of the model directory is searched only in the Argos layout: the model
    directory is named "model", or the parent has metadata.json."""
    spm_path = os.path.join(TINY_FIXTURE, "sentencepiece.model")
    pkg = tmp_path / "pkg"
    other = pkg / "weights"
    other.mkdir(parents=True)
    for name in TINY_MODEL_FILES:
        shutil.copy(os.path.join(TINY_FIXTURE, name), other / name)
    shutil.copy(spm_path, pkg / "sentencepiece.model")
    with tolk.Translator(str(other)) as tr:  # not named "model", no metadata.json
        with pytest.raises(tolk.TolkError) as ei:
            tr.translate_text("Hello.")
        tr.model.close()
    assert ei.value.status == tolk.Status.ERROR_UNSUPPORTED, ei.value
    (pkg / "metadata.json").write_text('{"package_version": "1.0"}')
    with tolk.Translator(str(other)) as tr:
        assert tr.translate_text("Hello.", beam_size=1, max_decoding_length=4)
        tr.model.close()
    # Named "model": the parent is searched without metadata.json.
    (pkg / "metadata.json").unlink()
    other.rename(pkg / "model")
    with tolk.Translator(str(pkg / "model")) as tr:
        assert tr.translate_text("Hello.", beam_size=1, max_decoding_length=4)
        tr.model.close()


def _vowelless_spm(spm, path):
    """A SentencePiece model that knows every piece of the tiny fixture's vocabulary but
    decodes the vowels to nothing (they are control symbols): a target tokenizer whose use
    shows in the translation."""
    lines = ["hello world how are you", "the quick brown fox jumps over the lazy dog",
             "pack my box with five dozen liquor jugs", "zebra quilt vex jinx kept my box",
             "say \u00e9 and \u00e9 again"] * 3
    with open(path, "wb") as f:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=f, model_type="unigram", vocab_size=40,
            hard_vocab_limit=False, character_coverage=1.0,
            normalization_rule_name="identity", control_symbols=list("aeiou"),
            user_defined_symbols=["\u2581\u00e9"], minloglevel=2)
    return path


def test_named_source_tokenizer_keeps_found_target(tolk, spm, tmp_path):
    """Naming only the source tokenizer keeps the package's target.spm for decoding."""
    fixture_spm = os.path.join(TINY_FIXTURE, "sentencepiece.model")
    d = _tiny_without_tokenizer(tmp_path)
    shutil.copy(fixture_spm, d / "source.spm")
    target = _vowelless_spm(spm, d / "target.spm")
    text = "Hello world. How are you?\nThe cat sat on the mat. We love to read."
    kw = dict(beam_size=1, max_decoding_length=24)

    def translate(path, **tokenizers):
        with tolk.Translator(str(path), **tokenizers) as tr:
            out = tr.translate_text(text, **kw)
            tr.model.close()
        return out

    found = translate(d)  # source.spm + target.spm, both found
    both = translate(d, source_tokenizer=fixture_spm, target_tokenizer=str(target))
    source_only = translate(d, source_tokenizer=fixture_spm)
    bare = translate(_tiny_without_tokenizer(tmp_path / "bare"), source_tokenizer=fixture_spm)
    assert found == both == source_only, (found, both, source_only)
    assert not any(c in found for c in "aeiou"), found
    assert bare != found and any(c in bare for c in "aeiou"), bare  # the target.spm shows


def test_explicit_tokenizers_from_another_package(tolk, models_root, zh_en_model):
    """The en-pt Bergamot vocabulary as both tokenizers of the zh-en model: loads and
    runs (the translation is meaningless)."""
    vocab = os.path.join(models_root, "en-pt-bergamot", "vocab.enpt.spm")
    if not os.path.isfile(vocab):
        pytest.skip("%s not found" % vocab)
    with tolk.Translator(zh_en_model, source_tokenizer=vocab, target_tokenizer=vocab) as tr:
        assert tr.model.source_tokenizer == vocab
        doc = tr.translate_text("Hello world. How are you?\nFine.", beam_size=1,
                                max_decoding_length=16, return_sentences=True)
        tr.model.close()
    assert isinstance(doc.text, str) and doc.text.count("\n") == 1
    assert len(doc.sentences) == 3
    report("text: zh-en with the en-pt vocabulary: %r" % doc.text)


# ------------------------------------------------------------ progress / cancellation


def _recorder():
    """A progress callable recording (done, total, thread id) and going on."""
    calls = []

    def progress(done, total):
        calls.append((done, total, threading.get_ident()))

    return calls, progress


def test_progress_counts_sentences_by_batch(zh, verses):
    """20 verses, split="lines", batches of 4: called with 4, 8, ..., 20 of 20, on the
    calling thread, and the translation is the one without a callback."""
    subset = verses[:20]
    calls, progress = _recorder()
    docs = zh.translate_text(subset, beam_size=1, split="lines", max_batch_size=4,
                             return_sentences=True, progress=progress)
    assert sum(len(d.sentences) for d in docs) == 20  # no verse is wrapped
    assert [(d, t) for d, t, _ in calls] == [(4 * k, 20) for k in range(1, 6)]
    assert {th for _, _, th in calls} == {threading.get_ident()}
    plain = zh.translate_text(subset, beam_size=1, split="lines", max_batch_size=4,
                              return_sentences=True)
    assert docs == plain
    # A callback returning True goes on too; one text (a str) is the batch of one.
    text = "\n".join(subset[:6])
    calls = []
    assert zh.translate_text(text, beam_size=1, split="lines", max_batch_size=4,
                             progress=lambda d, t: calls.append((d, t)) or True) \
        == zh.translate_text(text, beam_size=1, split="lines", max_batch_size=4)
    assert calls == [(4, 6), (6, 6)]


def test_progress_counts_parts_of_sentences(zh, verses):
    """split="sentences" and a wrapped sentence: the total is the number of parts (the
    result's Sentence entries), done grows by at most max_batch_size and ends there; the
    default batching (32 sentences in text mode) and batch_type="tokens" report too."""
    texts = verses[20:40] + [_long_sentence(verses)]
    for kwargs in ({"max_batch_size": 5}, {}, {"max_batch_size": 300, "batch_type": "tokens"}):
        calls, progress = _recorder()
        docs = zh.translate_text(texts, beam_size=1, return_sentences=True, progress=progress,
                                 **kwargs)
        parts = sum(len(d.sentences) for d in docs)
        assert parts > len(texts) + 1, "sentences were split and the long one wrapped"
        done = [d for d, _, _ in calls]
        assert done and done[-1] == parts, (kwargs, calls)
        assert all(t == parts for _, t, _ in calls), calls
        assert all(0 < b - a for a, b in zip([0] + done, done)), calls
        if "max_batch_size" not in kwargs:
            assert done == sorted({min(parts, k) for k in range(32, parts + 32, 32)}), calls
        elif kwargs.get("batch_type") != "tokens":
            assert all(b - a <= 5 for a, b in zip([0] + done, done)), calls
        if kwargs == {"max_batch_size": 5}:
            assert docs == zh.translate_text(texts, beam_size=1, return_sentences=True, **kwargs)


def test_progress_without_sentences_is_not_called(zh):
    calls, progress = _recorder()
    assert zh.translate_text(["", "  \n\t", "\r\n"], progress=progress) == ["", "  \n\t", "\r\n"]
    assert zh.translate_text([], progress=progress) == []
    assert calls == []


def test_progress_cancels(tolk, zh, verses):
    """Returning False after the first batch: TolkCancelled (a TolkError with status
    TOLK_ERROR_CANCELLED) and no more batches; the translator works on afterwards."""
    subset = verses[:20]
    calls = []

    def stop(done, total):
        calls.append(done)
        return False

    with pytest.raises(tolk.TolkCancelled) as ei:
        zh.translate_text(subset, beam_size=1, split="lines", max_batch_size=4, progress=stop)
    assert calls == [4]
    err = ei.value
    assert isinstance(err, tolk.TolkError)
    assert err.status == tolk.Status.ERROR_CANCELLED == 8
    assert tolk.Status.NAMES[8] == "TOLK_ERROR_CANCELLED"
    assert tolk.status_string(tolk.Status.ERROR_CANCELLED) == "cancelled"
    assert "cancel" in err.message and "4 of 20" in err.message, err.message

    # Cancelling later, at the last batch, and with a false value other than False.
    for stop_at, answer in ((12, False), (20, False), (8, 0)):
        calls = []

        def stop_late(done, total):
            calls.append(done)
            return answer if done >= stop_at else None

        with pytest.raises(tolk.TolkCancelled):
            zh.translate_text(subset, beam_size=1, split="lines", max_batch_size=4,
                              progress=stop_late)
        assert calls == list(range(4, stop_at + 1, 4))
    assert zh.translate_text(subset[0], beam_size=1) == zh.translate_text(subset[0], beam_size=1,
                                                                           progress=lambda d, t: True)


def test_exit_with_streaming_jobs_in_flight_is_clean(tolk, zh_en_model, verses):
    """A script that ends while async jobs stream tokens to a Python callback: the jobs
    are cancelled at exit while the interpreter runs (a worker calling the callback during
    finalization had aborted the process)."""
    import subprocess
    import sys

    script = (
        "import sys, time, tolk\n"
        "t = tolk.Translator(sys.argv[1], inter_threads=2)\n"
        "lines = sys.argv[2:]\n"
        "seen = []\n"
        "a = t.translate_text_async(lines, beam_size=1, on_token=seen.append)\n"
        "b = t.translate_text_async(lines[::-1], beam_size=1, on_token=seen.append)\n"
        "time.sleep(0.3)\n"
        "print(len(seen))\n"
    )
    binding = os.path.dirname(tolk.__file__)
    env = dict(os.environ, PYTHONPATH=binding + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", script, zh_en_model] + verses[:150],
                             env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        assert int(run.stdout.split()[-1]) > 0


def test_ctrl_c_during_a_call_with_progress_is_a_keyboard_interrupt(tolk, zh, verses):
    """A SIGINT while the call runs ends it with KeyboardInterrupt at its next progress
    report. (Raised by Python on entering the callback, before any guard, ctypes had
    swallowed it and handed the library an undefined value: the call went on, or ended as
    TolkCancelled.)"""
    import signal

    # Python's own SIGINT handler, as at an interactive prompt: a process started in the
    # background by a shell (as CI may run the tests) inherits SIGINT ignored.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    calls = []
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            zh.translate_text(verses[:200], beam_size=1, split="lines", max_batch_size=1,
                              progress=lambda done, total: calls.append(done))
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    assert 0 < len(calls) < 200
    # A callable that declines is still a cancellation.
    with pytest.raises(tolk.TolkCancelled):
        zh.translate_text(verses[:8], beam_size=1, split="lines", max_batch_size=4, progress=lambda d, t: False)


def test_progress_exception_propagates(tolk, zh, verses):
    """An exception in the callback stops the translation (nothing crosses into C) and is
    raised as itself from translate_text, with the callback's frame in its traceback."""
    class Stop(Exception):
        pass

    calls = []

    def fail(done, total):
        calls.append(done)
        if done >= 8:
            raise Stop("at %d of %d" % (done, total))

    with pytest.raises(Stop, match="at 8 of 20") as ei:
        zh.translate_text(verses[:20], beam_size=1, split="lines", max_batch_size=4, progress=fail)
    assert calls == [4, 8]
    assert not isinstance(ei.value, tolk.TolkError)
    assert any(entry.name == "fail" for entry in ei.traceback)
    # BaseExceptions too (Ctrl-C while translating on the main thread).
    def interrupt(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        zh.translate_text(verses[:3], beam_size=1, progress=interrupt)
    # Not a callable: refused before translating.
    with pytest.raises(TypeError):
        zh.translate_text("你好。", progress=42)
    assert zh.translate_text(verses[0], beam_size=1, split="lines") == \
        zh.translate_text(verses[0], beam_size=1, split="lines", progress=lambda d, t: None)
