"""CTranslate2's return_attention and replace_unknowns, against CTranslate2 (float32).

The attention of a hypothesis is, per target token, the alignment attention of the step
that produced it over the source tokens as given (CTranslate2: the model's alignment
layer and heads, by default the last layer's first head). It must agree with
CTranslate2's within 1e-4 wherever the tokens agree, with one exception: CTranslate2
4.8's beam search over a batch of several sentences returns, for the first step, the
attention of another sentence of the batch (its first step runs one row per sentence and
gathers that step's attention with the beams' indices). There the first step is checked
against CTranslate2 translating the sentence alone, which it gets right.
"""

import os

import numpy as np
import pytest

import make_random_models
from conftest import report

MODEL_NAMES = [cfg.name for cfg in make_random_models.MODEL_CONFIGS]
TOLERANCE = 1e-4


def _prefixes(info, sents, unknown=False, seed=5):
    """Every other sentence a 1-2 token target prefix (unknown tokens when `unknown`);
    the start token first where the model needs it."""
    rng = np.random.default_rng(seed)
    vocab = [t for t in info.target_vocab if t not in make_random_models.SPECIALS]
    out = []
    for i in range(len(sents)):
        p = []
        if i % 2 == 0:
            p = ["UNKNOWN_%d" % i if unknown else vocab[int(rng.integers(0, len(vocab)))] for _ in range(1 + i % 3 // 2)]
        out.append(([info.start_token] if info.requires_prefix else []) + p)
    return out


def _max_error(a, b):
    a, b = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _check_attention(name, sents, expected, got, first_step_alone=None):
    """Same tokens and attention within TOLERANCE, example by example; the first step of
    beam search from `first_step_alone(i)` (CTranslate2 on sentence i alone) if given."""
    compared = 0
    for i, (e, g) in enumerate(zip(expected, got)):
        assert e.hypotheses == g.hypotheses, "%s example %d: %r != %r" % (name, i, e.hypotheses, g.hypotheses)
        assert len(g.attention) == len(g.hypotheses), (name, i)
        for k, (ea, ga) in enumerate(zip(e.attention, g.attention)):
            assert len(ga) == len(g.hypotheses[k]), (name, i, k)
            if not ga:
                continue
            assert all(len(v) == len(sents[i]) for v in ga), (name, i, k)
            start = 0
            if first_step_alone is not None:
                alone = first_step_alone(i)
                assert alone.hypotheses[k][:1] == g.hypotheses[k][:1]
                assert _max_error(alone.attention[k][:1], ga[:1]) <= TOLERANCE, (name, i, k, "first step")
                start = 1
            err = _max_error(ea[start:], ga[start:])
            assert err <= TOLERANCE, "%s example %d hypothesis %d: attention differs by %g" % (name, i, k, err)
            compared += len(ga)
    return compared


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_attention_is_ctranslate2s(model_name, random_models, ct2_translators, tolk_translators):
    info = random_models[model_name]
    sents = make_random_models.random_sentences(info, 30, seed=404)
    ct2, tr = ct2_translators(model_name), tolk_translators(model_name)
    prefix = _prefixes(info, sents)
    base = [[info.start_token]] * len(sents) if info.requires_prefix else None
    compared = 0
    for kwargs, target_prefix in [
        (dict(beam_size=1), base),
        (dict(beam_size=1, max_input_length=5), base),
        (dict(beam_size=1, max_batch_size=7), prefix),
    ]:
        kwargs.update(return_attention=True, max_decoding_length=40)
        expected = ct2.translate_batch(sents, target_prefix=target_prefix, **kwargs)
        got = tr.translate_batch(sents, target_prefix=target_prefix, **kwargs)
        compared += _check_attention(model_name, sents, expected, got)
    # Beam search in batches: CTranslate2's first step is checked alone (see the module doc).
    for kwargs, target_prefix in [(dict(beam_size=4, num_hypotheses=2), base), (dict(beam_size=3), prefix)]:
        kwargs.update(return_attention=True, max_decoding_length=40)
        expected = ct2.translate_batch(sents, target_prefix=target_prefix, **kwargs)
        got = tr.translate_batch(sents, target_prefix=target_prefix, **kwargs)

        def alone(i, kwargs=kwargs, target_prefix=target_prefix):
            return ct2.translate_batch([sents[i]], target_prefix=target_prefix[i:i + 1] if target_prefix else None,
                                       **kwargs)[0]

        compared += _check_attention(model_name, sents, expected, got, first_step_alone=alone)
    assert compared > 100, compared
    # Without return_attention there is none.
    assert all(r.attention == [] for r in tr.translate_batch(sents, target_prefix=base, beam_size=2))


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_replace_unknowns_is_ctranslate2s(model_name, random_models, ct2_translators, tolk_translators):
    """Unknown tokens (generated, or from target prefixes of unknown words) become the
    source token they attend to most, as in CTranslate2."""
    info = random_models[model_name]
    sents = make_random_models.random_sentences(info, 30, seed=505)
    ct2, tr = ct2_translators(model_name), tolk_translators(model_name)
    prefix = _prefixes(info, sents, unknown=True)
    replaced = 0
    for beam in [1, 2]:
        kwargs = dict(beam_size=beam, max_decoding_length=30, replace_unknowns=True)
        got = tr.translate_batch(sents, target_prefix=prefix, **kwargs)
        plain = tr.translate_batch(sents, target_prefix=prefix, beam_size=beam, max_decoding_length=30)
        if beam == 1:
            expected = ct2.translate_batch(sents, target_prefix=prefix, **kwargs)
        else:  # one sentence a call: CTranslate2's first beam step in a batch (module doc)
            expected = [ct2.translate_batch([s], target_prefix=[p], **kwargs)[0] for s, p in zip(sents, prefix)]
        for i, (e, g, p) in enumerate(zip(expected, got, plain)):
            assert e.hypotheses == g.hypotheses, "%s beam %d example %d: %r != %r" % (
                model_name, beam, i, e.hypotheses, g.hypotheses)
            assert all("<unk>" not in h for h in g.hypotheses) or not sents[i], (model_name, i, g.hypotheses)
            replaced += sum(a != b for a, b in zip(g.hypotheses[0], p.hypotheses[0]))
    assert replaced > 0, "no unknown token was replaced: the test proves little"


def test_attention_on_the_real_models(models_root, data_root, ctranslate2, tolk):
    """zh-en (CTranslate2): greedy attention within 1e-4 on 16 verses, replace_unknowns the
    same tokens; en-pt (Bergamot, no CTranslate2 oracle): one vector a token over the source
    tokens, each a probability distribution once the end token's share is added back."""
    spm = pytest.importorskip("sentencepiece")
    zh_en = os.path.join(models_root, "zh-en-ct2")
    if not os.path.isdir(zh_en):
        pytest.skip("zh-en model not found")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(zh_en, "sentencepiece.model"))
    with open(os.path.join(data_root, "dev-matthew.zh"), encoding="utf-8") as f:
        sents = [sp.encode(line.strip(), out_type=str) for line in f][:16]
    ct2 = ctranslate2.Translator(zh_en, device="cpu", compute_type="float32", intra_threads=1)
    with tolk.Translator(zh_en, compute_type="float32", intra_threads=1) as tr:
        kwargs = dict(beam_size=1, return_attention=True, replace_unknowns=True)
        compared = _check_attention("zh-en", sents, ct2.translate_batch(sents, **kwargs), tr.translate_batch(sents, **kwargs))
        report("zh-en float32 greedy: attention of %d tokens within %g of CTranslate2's" % (compared, TOLERANCE))
        # Keys kept compactly: the attention of the same hypotheses within their rounding.
        exact = tr.translate_batch(sents[:6], beam_size=2, return_attention=True)
        for kv in ["bfloat16", "int8"]:
            compact = tr.translate_batch(sents[:6], beam_size=2, return_attention=True, kv_cache_type=kv)
            same = [(e, c) for e, c in zip(exact, compact) if e.hypotheses == c.hypotheses]
            assert len(same) >= 3, kv
            assert max(_max_error(e.attention[0], c.attention[0]) for e, c in same) <= 0.02, kv
    en_pt = os.path.join(models_root, "en-pt-bergamot")
    if os.path.isdir(en_pt):
        with tolk.Translator(en_pt) as tr:
            for text in [["▁Love", "▁your", "▁enemies", "."], ["▁I", "▁am", "▁here"]]:
                r = tr.translate_batch([text], return_attention=True)[0]
                assert len(r.attention[0]) == len(r.hypotheses[0]) > 0
                for v in r.attention[0]:
                    assert len(v) == len(text) and min(v) >= 0.0 and sum(v) <= 1.0 + 1e-5
