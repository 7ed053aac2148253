"""Parity with CTranslate2 on the real zh-en model (int8 weights).

The first N lines (default 200, env TOLK_ZH_EN_LINES) of dev-matthew.zh are
tokenized with the model's SentencePiece model and translated greedy and with
beam 4 (max_batch_size 32) by CTranslate2 and by Tolk with the same compute type.
float32: at least 98% of the sentences must be token-identical.  int8: decoding with
quantized activations flips on the last bit of any float operation (CTranslate2
itself agrees with its own AVX-512 build on ~60% of sentences), so the bar is a high
agreement and a BLEU within 0.3 of CTranslate2's. Where this process's CTranslate2 does
not multiply int8 exactly (no VNNI: see ct2_oracle.py), the agreement is measured against
CTranslate2 with MKL in a subprocess on the first TOLK_ZH_EN_ORACLE_LINES (default 64)
lines, and on all lines Tolk's int8 must agree with CTranslate2's float32 at least as often
as the process's own int8 does.

Environment: TOLK_MODELS (folder with zh-en-ct2/), TOLK_DATA (folder with
dev-matthew.zh), TOLK_DEV_ZH (explicit path of the Chinese dev file).
"""

import hashlib
import json
import os
import time

import pytest

import ct2_oracle
from conftest import compare_results, report

N_LINES = int(os.environ.get("TOLK_ZH_EN_LINES", "200"))
# Lines compared with the subprocess oracle (MKL off Intel takes ~1.6 s a verse).
N_ORACLE_LINES = int(os.environ.get("TOLK_ZH_EN_ORACLE_LINES", "64"))


# Share of sentences token-identical to the oracle, by (compute type, beam size): float32
# measured 100%; int8: see ct2_oracle.int8_min_identical.
MIN_IDENTICAL = {("float32", 1): 0.98, ("float32", 4): 0.98}
MIN_IDENTICAL.update({("int8", beam): bar for beam, bar in ct2_oracle.int8_min_identical().items()})


@pytest.fixture(scope="module")
def zh_source(zh_en_model, data_root):
    spm = pytest.importorskip("sentencepiece")
    path = os.environ.get("TOLK_DEV_ZH") or os.path.join(data_root, "dev-matthew.zh")
    if not os.path.isfile(path):
        pytest.skip("dev data not found at %s (set TOLK_DATA or TOLK_DEV_ZH)" % path)
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f][:N_LINES]
    sp = spm.SentencePieceProcessor(model_file=os.path.join(zh_en_model, "sentencepiece.model"))
    return [sp.encode(line, out_type=str) for line in lines]


@pytest.fixture(scope="module")
def zh_references(data_root):
    path = os.path.join(data_root, "dev-matthew.en")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f][:N_LINES]


@pytest.fixture(scope="module", params=["float32", "int8"])
def compute_type(request):
    return request.param


@pytest.fixture(scope="module")
def zh_ct2(zh_en_model, ctranslate2, compute_type):
    return ctranslate2.Translator(zh_en_model, device="cpu", compute_type=compute_type, intra_threads=1)


@pytest.fixture(scope="module")
def zh_tolk(zh_en_model, tolk, compute_type):
    t0 = time.perf_counter()
    translator = tolk.Translator(zh_en_model, compute_type=compute_type, intra_threads=1)
    report("zh-en: tolk %s load %.2f s" % (compute_type, time.perf_counter() - t0))
    yield translator
    translator.close()
    translator.model.close()


def _detok(tokens):
    return "".join(tokens).replace("\u2581", " ").strip()


def _ct2_reference(request, zh_en_model, translate, ctranslate2, source, kwargs, compute_type, env=None):
    """CTranslate2 output (`translate(source, **kwargs)`), cached in pytest's cache
    (.pytest_cache) keyed by the CT2 version, the model file, the inputs and the oracle's
    environment `env`: reruns skip the slow reference."""
    st = os.stat(os.path.join(zh_en_model, "model.bin"))
    key = hashlib.sha256(
        json.dumps([ctranslate2.__version__, st.st_size, int(st.st_mtime), source, compute_type,
                    os.environ.get("CT2_USE_MKL"), os.environ.get("CT2_FORCE_CPU_ISA"),
                    os.environ.get("ONEDNN_MAX_CPU_ISA"), os.environ.get("MKL_ENABLE_INSTRUCTIONS"),
                    env, sorted(kwargs.items())], ensure_ascii=False).encode("utf-8")
    ).hexdigest()[:24]
    cache_key = "tolk/zh_en_ct2/" + key
    cached = request.config.cache.get(cache_key, None) if request.config.cache else None
    if cached is not None and os.environ.get("TOLK_NO_CACHE") != "1":
        return [ct2_oracle.Result(h, s) for h, s in cached["results"]], cached["seconds"], True
    t0 = time.perf_counter()
    res = translate(source, **kwargs)
    seconds = time.perf_counter() - t0
    if request.config.cache:
        request.config.cache.set(
            cache_key, {"results": [[r.hypotheses, r.scores] for r in res], "seconds": seconds}
        )
    return res, seconds, False


@pytest.mark.parametrize("beam_size", [1, 4])
def test_zh_en_parity(beam_size, request, zh_en_model, zh_source, zh_references, zh_ct2,
                      zh_tolk, ctranslate2, compute_type):
    kwargs = dict(beam_size=beam_size, max_batch_size=32, return_scores=True)

    expected, t_ct2, from_cache = _ct2_reference(
        request, zh_en_model, zh_ct2.translate_batch, ctranslate2, zh_source, kwargs, compute_type
    )
    t0 = time.perf_counter()
    got = zh_tolk.translate_batch(zh_source, **kwargs)
    t_tolk = time.perf_counter() - t0

    tie_info = {
        "ct2_scores": [r.scores for r in expected],
        "tolk_scores": [r.scores for r in got],
    }
    same, total, msgs = compare_results(zh_source, None, expected, got, check_scores=False,
                                        tie_info=tie_info)
    tokens_identical = sum(1 for e, g in zip(expected, got) if e.hypotheses == g.hypotheses)
    score_ok = sum(
        1 for e, g in zip(expected, got)
        if e.hypotheses == g.hypotheses and all(abs(a - b) <= 1e-3 for a, b in zip(e.scores, g.scores))
    )
    n_tok_ct2 = sum(len(r.hypotheses[0]) for r in expected)
    n_tok_tolk = sum(len(r.hypotheses[0]) for r in got)
    line = (
        "zh-en %s beam %d, %d sentences: %d/%d token-identical (%.1f%%), %d near-ties, "
        "scores within 1e-3 on %d identical; ct2 %.1f s%s (%.0f tok/s), "
        "tolk %.1f s (%.0f tok/s)"
        % (compute_type, beam_size, total, tokens_identical, total, 100.0 * tokens_identical / total,
           len(tie_info["ties"]), score_ok, t_ct2, " (cached)" if from_cache else "",
           n_tok_ct2 / t_ct2, t_tolk,
           n_tok_tolk / max(t_tolk, 1e-9))
    )
    bleu = None
    if zh_references:
        try:
            import sacrebleu

            refs = zh_references[: len(expected)]
            bleu_ct2 = sacrebleu.corpus_bleu([_detok(r.hypotheses[0]) for r in expected], [refs]).score
            bleu_tolk = sacrebleu.corpus_bleu([_detok(r.hypotheses[0]) for r in got], [refs]).score
            line += "; BLEU ct2 %.2f tolk %.2f" % (bleu_ct2, bleu_tolk)
            bleu = (bleu_ct2, bleu_tolk)
        except ImportError:
            pass
    report(line)
    if compute_type == "float32":
        for m in msgs[:3]:
            report("  " + m.replace("\n", "\n  "))
    bar = MIN_IDENTICAL[(compute_type, beam_size)]
    env = ct2_oracle.oracle_env(compute_type)
    if env is None:
        assert tokens_identical >= bar * total, line
    else:
        # The exact oracle on the first lines (the in-process comparison above is reported).
        n = min(N_ORACLE_LINES, total)
        oracle, t_oracle, _ = _ct2_reference(
            request, zh_en_model,
            lambda src, **kw: ct2_oracle.translate_in_subprocess(env, zh_en_model, compute_type, src, **kw),
            ctranslate2, zh_source[:n], kwargs, compute_type, env)
        same_oracle = sum(1 for e, g in zip(oracle, got) if e.hypotheses == g.hypotheses)
        # No further from the float32 model than the process's own int8.
        f32, _, _ = _ct2_reference(
            request, zh_en_model,
            lambda src, **kw: ctranslate2.Translator(zh_en_model, device="cpu", compute_type="float32",
                                                     intra_threads=1).translate_batch(src, **kw),
            ctranslate2, zh_source, kwargs, "float32")
        tolk_as_f32 = sum(1 for e, g in zip(f32, got) if e.hypotheses == g.hypotheses)
        ct2_as_f32 = sum(1 for e, g in zip(f32, expected) if e.hypotheses == g.hypotheses)
        oracle_line = ("zh-en %s beam %d against %s: %d/%d token-identical on the first %d lines (%.0f s); "
                       "the same as CTranslate2 float32: tolk %d/%d, CTranslate2 in process %d/%d"
                       % (compute_type, beam_size, ct2_oracle.describe(compute_type), same_oracle, n, n,
                          t_oracle, tolk_as_f32, total, ct2_as_f32, total))
        report(oracle_line)
        assert same_oracle >= bar * n, oracle_line
        assert tolk_as_f32 >= ct2_as_f32, oracle_line
    if bleu is not None and compute_type != "float32":
        assert abs(bleu[1] - bleu[0]) <= 0.3 + 30.0 / total, line


# CTranslate2's repetition rules on the real model, float32 (the compute type whose output
# is CTranslate2's sentence for sentence on every machine): (beam size, options).
REPETITION_CASES = [
    (1, dict(repetition_penalty=1.3)),
    (1, dict(no_repeat_ngram_size=2, return_scores=True)),
    (4, dict(repetition_penalty=1.2, no_repeat_ngram_size=3, return_scores=True)),
]


@pytest.mark.parametrize("beam_size,options", REPETITION_CASES)
def test_zh_en_repetition_rules(beam_size, options, request, zh_en_model, zh_source, zh_ct2, zh_tolk,
                                ctranslate2, compute_type):
    if compute_type != "float32":
        pytest.skip("checked in float32, whose output is CTranslate2's on every machine")
    source = zh_source[:48]
    kwargs = dict(beam_size=beam_size, max_batch_size=16, **options)
    expected, _, _ = _ct2_reference(request, zh_en_model, zh_ct2.translate_batch, ctranslate2, source, kwargs,
                                    compute_type)
    got = zh_tolk.translate_batch(source, **kwargs)
    plain = zh_tolk.translate_batch(source, beam_size=beam_size, max_batch_size=16)
    same = sum(1 for e, g in zip(expected, got) if e.hypotheses == g.hypotheses)
    changed = sum(1 for p, g in zip(plain, got) if p.hypotheses != g.hypotheses)
    line = ("zh-en float32 beam %d %r: %d/%d token-identical to CTranslate2, %d changed by the rules"
            % (beam_size, options, same, len(source), changed))
    report(line)
    assert same >= 0.98 * len(source), line
    assert changed >= 3, line  # the rules did something on these verses
    if options.get("return_scores"):
        for e, g in zip(expected, got):
            if e.hypotheses == g.hypotheses:
                assert all(abs(a - b) <= 1e-3 for a, b in zip(e.scores, g.scores)), (e.scores, g.scores)
