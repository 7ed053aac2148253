"""Vocabulary maps: CTranslate2's ``vmap.txt`` with ``use_vmap=True``, Tolk against
CTranslate2 token for token.

Real model: a copy of zh-en-ct2 (its files linked) with a ``vmap.txt`` learned here
from the co-occurrence of source 1- to 3-grams with the target tokens of CTranslate2's
own translations of the 500 verses (the best few targets of each n-gram by Dice
coefficient, and the most frequent targets on the empty n-gram's line). The first N
verses (TOLK_VMAP_LINES, default 100) are translated with batches of 32, greedy and
beam 4, float32 (all token-identical) and int8 (the bars of test_parity_zh_en.py).
A deliberately tiny map must change the output, the same way in both engines.

Random-weight models: every model of make_random_models.py with a map of random rules
(1- to 3-grams, unknown source and target tokens, malformed lines) must give the same
tokens and scores in float32.

CTranslate2 (4.8) keeps the target id -> output column map of every earlier vmap batch
of a translator (Decoder::update_output_layer adds to it without clearing it; only a
batch over the whole vocabulary after a smaller one clears it): the start, end, prefix
and disabled ids of a later batch resolve to the columns they had then, which gives other
tokens, or an exception, when such an id moved. Tolk maps every batch afresh. So every
CTranslate2 call with the map here runs on a new translator, and calls of several batches
are compared only where those ids keep their columns: the special tokens at the lowest
ids and no target prefix (zh-en, some random models).
"""

import collections
import hashlib
import json
import os
import time

import numpy as np
import pytest

import make_random_models
import ct2_oracle
from conftest import compare_results, report

N_LINES = int(os.environ.get("TOLK_VMAP_LINES", "100"))
MAX_NGRAM = 3
# Same bars as test_parity_zh_en.py (int8 decoding flips on the last bit of a float).
MIN_IDENTICAL = {("float32", 1): 1.0, ("float32", 4): 1.0}
MIN_IDENTICAL.update({("int8", beam): bar for beam, bar in ct2_oracle.int8_min_identical().items()})


def make_vmap(sources, targets, per_ngram=(8, 4, 3), always=30):
    """vmap.txt text: for each source n-gram (n <= 3) its targets with the best Dice
    coefficient over sentence co-occurrence; the `always` most frequent targets on the
    empty n-gram's line."""
    c_src, c_tgt, c_pair = collections.Counter(), collections.Counter(), collections.Counter()
    for src, tgt in zip(sources, targets):
        grams = {" ".join(src[i:i + n]) for n in range(1, MAX_NGRAM + 1) for i in range(len(src) - n + 1)}
        toks = set(tgt)
        c_src.update(grams)
        c_tgt.update(toks)
        c_pair.update((g, t) for g in grams for t in toks)
    best = collections.defaultdict(list)
    for (g, t), c in c_pair.items():
        best[g].append((-2.0 * c / (c_src[g] + c_tgt[t]), t))
    lines = ["\t" + " ".join(t for t, _ in c_tgt.most_common(always))]
    for g in sorted(best):
        lines.append(g + "\t" + " ".join(t for _, t in sorted(best[g])[:per_ngram[g.count(" ")]]))
    return "\n".join(lines) + "\n"


def ct2_vmap(ctranslate2, model, compute_type, source, **kwargs):
    """CTranslate2's translate_batch with use_vmap=True on a new translator (see above)."""
    ct2 = ctranslate2.Translator(model, device="cpu", compute_type=compute_type, intra_threads=1)
    return ct2.translate_batch(source, use_vmap=True, **kwargs)


def model_with_vmap(model_dir, out_dir, vmap):
    """`out_dir`: links to the files of `model_dir` and `vmap` (str or bytes) as vmap.txt."""
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(model_dir):
        if name != "vmap.txt":
            os.symlink(os.path.join(model_dir, name), os.path.join(out_dir, name))
    with open(os.path.join(out_dir, "vmap.txt"), "wb") as f:
        f.write(vmap.encode("utf-8") if isinstance(vmap, str) else vmap)
    return out_dir


# ----------------------------------------------------------------- the real zh-en model


@pytest.fixture(scope="module")
def zh_all(zh_en_model, data_root):
    spm = pytest.importorskip("sentencepiece")
    path = os.path.join(data_root, "dev-matthew.zh")
    if not os.path.isfile(path):
        pytest.skip("dev data not found at %s (set TOLK_DATA)" % path)
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    sp = spm.SentencePieceProcessor(model_file=os.path.join(zh_en_model, "sentencepiece.model"))
    return [sp.encode(line, out_type=str) for line in lines]


@pytest.fixture(scope="module")
def zh_vmap_model(request, zh_en_model, zh_all, ctranslate2, tmp_path_factory):
    """The zh-en model with a vmap.txt learned from CTranslate2's translations (cached in
    pytest's cache, keyed by the CT2 version, the model file and the sources)."""
    st = os.stat(os.path.join(zh_en_model, "model.bin"))
    key = hashlib.sha256(
        json.dumps([ctranslate2.__version__, st.st_size, int(st.st_mtime), zh_all]).encode("utf-8")
    ).hexdigest()[:24]
    cache_key = "tolk/vmap_targets/" + key
    targets = request.config.cache.get(cache_key, None) if request.config.cache else None
    if targets is None:
        ct2 = ctranslate2.Translator(zh_en_model, device="cpu", compute_type="int8", intra_threads=2)
        targets = [r.hypotheses[0] for r in ct2.translate_batch(zh_all, beam_size=1, max_batch_size=32)]
        if request.config.cache:
            request.config.cache.set(cache_key, targets)
    text = make_vmap(zh_all, targets)
    return model_with_vmap(zh_en_model, str(tmp_path_factory.mktemp("zh_en_vmap")), text)


@pytest.fixture(scope="module", params=["float32", "int8"])
def compute_type(request):
    return request.param


@pytest.fixture(scope="module")
def engines(zh_vmap_model, ctranslate2, tolk, compute_type):
    ct2 = ctranslate2.Translator(zh_vmap_model, device="cpu", compute_type=compute_type, intra_threads=1)
    tr = tolk.Translator(zh_vmap_model, compute_type=compute_type, intra_threads=1)
    yield ct2, tr
    tr.close()
    tr.model.close()


@pytest.mark.parametrize("beam_size", [1, 4])
def zh_bleu(data_root, expected, got):
    """(CT2's, Tolk's) corpus BLEU against dev-matthew.en, or None without sacrebleu."""
    path = os.path.join(data_root, "dev-matthew.en")
    try:
        import sacrebleu
    except ImportError:
        return None
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        refs = [line.strip() for line in f][:len(expected)]

    def detok(results):
        return ["".join(r.hypotheses[0]).replace("\u2581", " ").strip() for r in results]

    return tuple(sacrebleu.corpus_bleu(detok(r), [refs]).score for r in (expected, got))


@pytest.mark.parametrize("beam_size", [1, 4])
def test_zh_en_vmap_parity(beam_size, engines, zh_all, zh_vmap_model, data_root, ctranslate2, compute_type):
    ct2, tr = engines
    source = zh_all[:N_LINES]
    # Batches of 32: which sources share a batch (and so its candidates) must match too.
    kwargs = dict(beam_size=beam_size, max_batch_size=32, return_scores=True)
    # On a new translator (see above); where this process's CTranslate2 is not exact for the
    # compute type, CTranslate2 with MKL in a subprocess (ct2_oracle.py).
    env = ct2_oracle.oracle_env(compute_type)
    t0 = time.perf_counter()
    if env is None:
        expected = ct2_vmap(ctranslate2, zh_vmap_model, compute_type, source, **kwargs)
    else:
        expected = ct2_oracle.translate_in_subprocess(env, zh_vmap_model, compute_type, source,
                                                      use_vmap=True, **kwargs)
    t_ct2 = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = tr.translate_batch(source, use_vmap=True, **kwargs)
    t_tolk = time.perf_counter() - t0
    # What the map changes, within one engine: the in-process CTranslate2 is that engine
    # only where it is the oracle (the subprocess one would take minutes more).
    if env is None:
        unrestricted, restricted, changed_in = ct2.translate_batch(source, **kwargs), expected, "CT2's"
    else:
        unrestricted, restricted, changed_in = tr.translate_batch(source, **kwargs), got, "Tolk's"
    changed = sum(1 for r, u in zip(restricted, unrestricted) if r.hypotheses != u.hypotheses)

    tie_info = {"ct2_scores": [r.scores for r in expected], "tolk_scores": [r.scores for r in got]}
    same, total, msgs = compare_results(source, None, expected, got, check_scores=False, tie_info=tie_info)
    line = ("zh-en vmap %s beam %d: %d/%d token-identical (%d near-ties) to %s, the map changed %d of "
            "%s translations; ct2 %.1f s, tolk %.1f s"
            % (compute_type, beam_size, same, total, len(tie_info["ties"]), ct2_oracle.describe(compute_type),
               changed, changed_in, t_ct2, t_tolk))
    bleu = zh_bleu(data_root, expected, got)
    if bleu is not None:
        line += "; BLEU ct2 %.2f tolk %.2f" % bleu
    report(line)
    assert same >= MIN_IDENTICAL[(compute_type, beam_size)] * total, line + "\n" + "\n".join(msgs)
    if bleu is not None and compute_type != "float32":
        assert abs(bleu[1] - bleu[0]) <= ct2_oracle.int8_bleu_tolerance(total), line
    assert changed > 0, "the map restricts nothing: the test proves little"


def test_tiny_vmap_restricts_both_engines(zh_en_model, zh_all, ctranslate2, tolk, tmp_path):
    """Few candidates: the empty n-gram's tokens, one 1-gram and one 2-gram rule. Both
    engines give the same (poor) translations from those tokens only; the start token,
    prefix tokens and special tokens are candidates; without use_vmap, or on a model
    without a map, use_vmap changes nothing."""
    source = zh_all[:24]
    first, second = source[0][0], source[0][1]
    always = ["▁the", "▁of", "▁and", "▁Jesus", ",", ".", "s"]
    vmap = "\t%s\n%s\t▁David ▁son\n%s %s\t▁Abraham ▁no_such_token\n" % (" ".join(always), first, first, second)
    model = model_with_vmap(zh_en_model, str(tmp_path / "tiny"), vmap)
    with tolk.Translator(model, compute_type="float32", intra_threads=1) as tr, \
            tolk.Translator(zh_en_model, compute_type="float32", intra_threads=1) as plain:
        for kwargs in (dict(beam_size=1), dict(beam_size=2, max_batch_size=5, return_scores=True)):
            expected = ct2_vmap(ctranslate2, model, "float32", source, **kwargs)
            got = tr.translate_batch(source, use_vmap=True, **kwargs)
            same, total, msgs = compare_results(source, None, expected, got,
                                                check_scores=kwargs.get("return_scores", False))
            assert same == total, "\n".join(msgs)
            allowed = set(always) | {"</s>", "<unk>", "▁David", "▁son", "▁Abraham"}
            assert all(set(r.hypotheses[0]) <= allowed for r in got)
            assert any("▁Abraham" in r.hypotheses[0] for r in got[:1]), "the 2-gram rule applies"
            off = tr.translate_batch(source, **kwargs)
            assert [r.hypotheses for r in off] == [r.hypotheses for r in plain.translate_batch(source, **kwargs)]
            assert [r.hypotheses for r in off] != [r.hypotheses for r in got]
            ignored = plain.translate_batch(source, use_vmap=True, **kwargs)
            assert [r.hypotheses for r in ignored] == [r.hypotheses for r in off], "no map: use_vmap ignored"

        # Target prefix tokens are candidates (of the whole batch: "▁he" can end the other
        # hypotheses too); a custom end token that is not a candidate never ends one.
        prefix = [["▁Then", "▁he"] if i % 2 == 0 else None for i in range(len(source))]
        for p, kwargs in ((prefix, dict(beam_size=1)), (prefix, dict(beam_size=3, end_token="▁he")),
                          (None, dict(beam_size=1, end_token="▁Mary"))):
            kwargs.update(max_decoding_length=12, return_scores=True)
            expected = ct2_vmap(ctranslate2, model, "float32", source, target_prefix=p, **kwargs)
            got = tr.translate_batch(source, target_prefix=p, use_vmap=True, **kwargs)
            same, total, msgs = compare_results(source, p, expected, got)
            assert same == total, "%r\n%s" % (kwargs, "\n".join(msgs))
            if p is prefix:
                assert all(r.hypotheses[0][:2] == ["▁Then", "▁he"] for r in got[::2])
        assert all(len(r.hypotheses[0]) == 12 for r in got), "▁Mary cannot end a hypothesis"


# ----------------------------------------------------------------- random-weight models


def random_vmap(info, sentences, seed):
    """A vmap.txt (bytes) of random rules over the model's vocabularies: 1-grams, 2- and
    3-grams cut from the test sentences, rules for unknown source tokens, unknown targets,
    the empty n-gram's line, and lines CTranslate2 reads in its own way (CRLF, no tab,
    several tabs, double spaces, invalid UTF-8, a rule given twice)."""
    rng = np.random.default_rng(seed)
    targets = [t for t in info.target_vocab if t not in make_random_models.SPECIALS]

    def pick(k):
        return " ".join(targets[int(i)] for i in rng.integers(0, len(targets), k))

    lines = []
    for tok in info.source_vocab:
        if rng.random() < 0.3:
            lines.append("%s\t%s" % (tok, pick(int(rng.integers(1, 3)))))
    for s in sentences:
        for n in (2, 3):
            if len(s) >= n and rng.random() < 0.5:
                i = int(rng.integers(0, len(s) - n + 1))
                lines.append("%s\t%s" % (" ".join(s[i:i + n]), pick(3)))
    lines += [
        "UNKNOWN_1\t%s no_such_target" % pick(2),
        "\t%s" % pick(4),
        "%s\t%s\r" % (info.source_vocab[3], pick(2)),
        targets[1],  # no tab: one always-candidate token
        "%s\t%s  %s " % (info.source_vocab[4], pick(1), pick(1)),
        "%s\t%s\t%s" % (info.source_vocab[5], pick(2), pick(2)),
        "%s\t%s" % (info.source_vocab[6], pick(1)),
        "%s\t%s" % (info.source_vocab[6], pick(2)),  # replaces the line before
    ]
    rng.shuffle(lines)
    text = "\n".join(lines).encode("utf-8")
    return text + b"\n\xff\xfe\t" + pick(2).encode("utf-8") + b"\n"


@pytest.mark.parametrize("model_name", [cfg.name for cfg in make_random_models.MODEL_CONFIGS])
def test_random_models_with_vmap(model_name, random_models, ctranslate2, tolk, tmp_path):
    info = random_models[model_name]
    sents = make_random_models.random_sentences(info, 60, seed=777)
    model = model_with_vmap(info.path, str(tmp_path / model_name), random_vmap(info, sents, seed=len(model_name)))
    ct2 = ctranslate2.Translator(model, device="cpu", compute_type="float32", intra_threads=1)
    prefix = [[info.start_token] for _ in sents] if info.requires_prefix else None
    options = [dict(beam_size=1), dict(beam_size=4, num_hypotheses=2), dict(beam_size=1, min_decoding_length=5),
               dict(beam_size=2, disable_unk=True),
               # Repetition rules index the restricted output's columns (the prefix included).
               dict(beam_size=4, repetition_penalty=1.4, no_repeat_ngram_size=2),
               dict(beam_size=1, no_repeat_ngram_size=1)]
    if info.config.tgt_special_offset == 0 and not info.requires_prefix:
        # Several batches: the special tokens keep their columns (see above).
        options += [dict(beam_size=2, max_batch_size=7), dict(beam_size=1, max_batch_size=40, batch_type="tokens")]
    changed = 0
    with tolk.Translator(model, compute_type="float32", intra_threads=1) as tr:
        for kwargs in options:
            kwargs.update(return_scores=True, max_decoding_length=40)
            expected = ct2_vmap(ctranslate2, model, "float32", sents, target_prefix=prefix, **kwargs)
            got = tr.translate_batch(sents, target_prefix=prefix, use_vmap=True, **kwargs)
            same, total, msgs = compare_results(sents, prefix, expected, got)
            assert same == total, "%s %r: %d of %d differ\n%s" % (model_name, kwargs, total - same, total, "\n".join(msgs))
            unrestricted = ct2.translate_batch(sents, target_prefix=prefix, **kwargs)
            changed += sum(1 for e, u in zip(expected, unrestricted) if e.hypotheses != u.hypotheses)
        # One sentence a call: a batch's candidates are fewer than the whole vocabulary of
        # these small models.
        for i in [i for i, s in enumerate(sents) if s][:12]:
            one, one_prefix = sents[i:i + 1], prefix[i:i + 1] if prefix else None
            kwargs = dict(beam_size=2, return_scores=True, max_decoding_length=40)
            expected = ct2_vmap(ctranslate2, model, "float32", one, target_prefix=one_prefix, **kwargs)
            got = tr.translate_batch(one, target_prefix=one_prefix, use_vmap=True, **kwargs)
            same, total, msgs = compare_results(one, one_prefix, expected, got)
            assert same == total, "%s sentence %d\n%s" % (model_name, i, "\n".join(msgs))
            unrestricted = ct2.translate_batch(one, target_prefix=one_prefix, **kwargs)
            changed += expected[0].hypotheses != unrestricted[0].hypotheses
    assert changed > 0, "the map restricts nothing: the test proves little"
