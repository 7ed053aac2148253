"""kv_cache_type: attention keys/values kept in bfloat16 or int8 instead of float32.

The compact types round the keys/values once when they are stored, so results differ
from float32's (and CTranslate2's) in the last bits. With float32 compute that changes
few sentences (measured on 500 zh-en verses: 98% identical with bfloat16, 94% with int8,
BLEU +0.01 / +0.04). With int8 compute any changed bit can flip an activation's
quantization, so about half the sentences change while BLEU stays within noise (500
verses: -0.26 / -0.35 greedy, -0.01 / -0.16 beam 4). What the types are for is memory:
the peak of a decoding of long sentences must drop.

Environment: TOLK_MODELS (zh-en-ct2/, en-pt-bergamot/), TOLK_DATA (dev-matthew.*).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import BINDING_DIR, model_dir_or_skip, report

COMPACT = ["bfloat16", "int8"]


def _lines(data_root, name, n):
    path = os.path.join(data_root, name)
    if not os.path.isfile(path):
        pytest.skip("dev data not found at %s (set TOLK_DATA)" % path)
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f][:n]


@pytest.fixture(scope="module")
def zh_tokens(zh_en_model, data_root):
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(zh_en_model, "sentencepiece.model"))
    return [sp.encode(line, out_type=str) for line in _lines(data_root, "dev-matthew.zh", 500)]


def _detok(tokens):
    return "".join(tokens).replace("\u2581", " ").strip()


def _bleu(hypotheses, references):
    sacrebleu = pytest.importorskip("sacrebleu")
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def _translate(translator, source, kv, beam=1):
    results = translator.translate_batch(source, beam_size=beam, max_batch_size=32, kv_cache_type=kv, return_scores=True)
    return [list(r.hypotheses[0]) for r in results], [r.scores[0] for r in results]


@pytest.mark.parametrize("kv", COMPACT)
def test_float32_compute_keeps_nearly_every_sentence(tolk, zh_en_model, zh_tokens, kv):
    translator = tolk.Translator(zh_en_model, compute_type="float32")
    source = zh_tokens[:100]
    exact, exact_scores = _translate(translator, source, "float32")
    got, scores = _translate(translator, source, kv)
    same = [i for i in range(len(source)) if got[i] == exact[i]]
    report("kv_cache_type %s, float32 greedy: %d/%d sentences as with float32 keys/values" % (kv, len(same), len(source)))
    assert len(same) >= 0.9 * len(source)
    # The same words score nearly the same: the rounding is small.
    assert max(abs(scores[i] - exact_scores[i]) for i in same) < 0.02
    # And it is not float32 under another name: some score moved.
    assert any(scores[i] != exact_scores[i] for i in same)


@pytest.mark.parametrize("beam", [1, 4])
def test_int8_compute_keeps_bleu(tolk, zh_en_model, zh_tokens, data_root, beam):
    references = _lines(data_root, "dev-matthew.en", 200)
    translator = tolk.Translator(zh_en_model, compute_type="int8")
    source = zh_tokens[:200]
    exact, _ = _translate(translator, source, "float32", beam)
    baseline = _bleu([_detok(h) for h in exact], references)
    for kv in COMPACT:
        got, _ = _translate(translator, source, kv, beam)
        bleu = _bleu([_detok(h) for h in got], references)
        same = sum(a == b for a, b in zip(got, exact))
        report("kv_cache_type %s, int8 beam %d: BLEU %.2f vs %.2f with float32, %d/%d sentences the same"
               % (kv, beam, bleu, baseline, same, len(source)))
        # Measured on these 200 verses: -0.17 / -0.49 greedy, -0.44 / -0.36 beam 4.
        assert abs(bleu - baseline) <= 1.0
        assert same >= 0.3 * len(source)


def test_marian_cross_attention_keeps_its_translations(tolk, models_root, data_root):
    model = tolk.Model(model_dir_or_skip(models_root, "en-pt-bergamot"))
    translator = tolk.Translator(model)
    source = _lines(data_root, "dev-matthew.en", 100)
    references = _lines(data_root, "dev-matthew.pt", 100)
    exact = translator.translate_text(source, beam_size=1)
    baseline = _bleu(exact, references)
    for kv in COMPACT:
        got = translator.translate_text(source, beam_size=1, kv_cache_type=kv)
        bleu = _bleu(got, references)
        same = sum(a == b for a, b in zip(got, exact))
        report("kv_cache_type %s, en-pt greedy: BLEU %.2f vs %.2f, %d/%d sentences the same" % (kv, bleu, baseline, same, len(source)))
        assert abs(bleu - baseline) <= 1.5
        assert same >= 0.4 * len(source)


@pytest.mark.parametrize("kv", ["float32", "int8"])
def test_greedy_takes_the_same_words_without_scores(tolk, zh_en_model, zh_tokens, kv):
    # Without scores greedy search takes each row's best column from the int8 product
    # block by block; with scores, from the whole logits: the same words, masks included.
    translator = tolk.Translator(zh_en_model, compute_type="int8")
    options = dict(beam_size=1, max_batch_size=32, kv_cache_type=kv, min_decoding_length=8, disable_unk=True)
    source = zh_tokens[:100]
    with_scores = translator.translate_batch(source, return_scores=True, **options)
    without = translator.translate_batch(source, **options)
    assert [r.hypotheses for r in without] == [r.hypotheses for r in with_scores]
    assert all(len(r.hypotheses[0]) >= 8 for r in without)


def test_unknown_type_is_refused(tolk, zh_en_model, zh_tokens):
    translator = tolk.Translator(zh_en_model)
    with pytest.raises(tolk.TolkError, match="kv_cache_type"):
        translator.translate_batch(zh_tokens[:2], kv_cache_type="float8")
    with pytest.raises(tolk.TolkError, match="kv_cache_type"):
        tolk.Translator(zh_en_model, kv_cache_type="float8")


def test_negative_state_budget_is_refused(tolk, zh_en_model, zh_tokens):
    translator = tolk.Translator(zh_en_model)
    with pytest.raises(ValueError, match="max_decoding_memory_mb"):
        translator.translate_batch(zh_tokens[:2], max_decoding_memory_mb=-1)
    with pytest.raises(ValueError, match="max_decoding_memory_mb"):
        translator.translate_batch(zh_tokens[:2], max_decoding_memory_mb=tolk.DECODING_MEMORY_AUTO)


def test_a_translators_type_is_its_calls_default(tolk, zh_en_model, zh_tokens):
    source = zh_tokens[:40]
    plain = tolk.Translator(zh_en_model, compute_type="int8")
    compact = tolk.Translator(zh_en_model, compute_type="int8", kv_cache_type="int8")

    def run(translator, **kv):
        results = translator.translate_batch(source, beam_size=1, return_scores=True, **kv)
        return [(r.hypotheses, r.scores) for r in results]

    exact, rounded = run(plain), run(plain, kv_cache_type="int8")
    assert rounded != exact  # int8 compute: about half the sentences change
    assert run(compact) == rounded
    # A call's own type wins over the translator's.
    assert run(compact, kv_cache_type="float32") == exact


PEAK_WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tolk
source = json.load(open(sys.argv[3]))
budget = sys.argv[5] if len(sys.argv) > 5 else "0"
budget = None if budget == "auto" else int(budget)
translator = tolk.Translator(sys.argv[2], compute_type="int8")
results = translator.translate_batch(source, beam_size=1, max_batch_size=32, kv_cache_type=sys.argv[4],
                                     max_decoding_memory_mb=budget, return_scores=True)
print(json.dumps([[list(r.hypotheses[0]), r.scores[0]] for r in results]))
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (VmHWM)")
def test_compact_types_lower_the_peak(zh_en_model, zh_tokens, tmp_path):
    # The 64 longest verses: the batch whose keys/values make the peak.
    source = sorted(zh_tokens, key=len)[-64:]
    tokens = tmp_path / "source.json"
    tokens.write_text(json.dumps(source, ensure_ascii=False), encoding="utf-8")
    peak = {}
    for kv in ["float32"] + COMPACT:
        out = subprocess.run([sys.executable, "-c", PEAK_WORKER, BINDING_DIR, zh_en_model, str(tokens), kv],
                             capture_output=True, text=True, check=True)
        peak[kv] = float(out.stdout.split()[-1])
    report("peak RSS, int8 greedy over the 64 longest verses: " + ", ".join("%s %.0f MB" % kv for kv in peak.items()))
    # Measured on the 500 verses (bench/bench.py at AVX2): 181, 148 and 139 MB (the
    # keys/values of the 32 longest verses are 68 MB in float32).
    assert peak["bfloat16"] <= peak["float32"] - 15
    assert peak["int8"] <= peak["bfloat16"] - 5


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (VmHWM)")
def test_state_budget_lowers_the_peak_not_the_results(zh_en_model, zh_tokens, tmp_path):
    """max_decoding_memory_mb: examples start when their keys/values fit, batches in parts
    (each encoded as within its whole batch): a lower peak, the same tokens and scores. By
    default the budget is half the model's weights (39 MB for zh-en int8)."""
    # The 96 longest verses, 3 batches: the first one's keys/values (68 MB in float32 for
    # all 32 at once) make the peak without a budget.
    source = sorted(zh_tokens, key=len)[-96:]
    tokens = tmp_path / "source.json"
    tokens.write_text(json.dumps(source, ensure_ascii=False), encoding="utf-8")
    peak, outputs = {}, {}
    for budget in ["0", "auto", "16"]:
        out = subprocess.run([sys.executable, "-c", PEAK_WORKER, BINDING_DIR, zh_en_model, str(tokens), "float32", budget],
                             capture_output=True, text=True, check=True)
        lines = out.stdout.split("\n")
        outputs[budget], peak[budget] = json.loads(lines[0]), float(lines[1])
    report("peak RSS, int8 greedy over the 96 longest verses: no budget %.0f MB, the default (half the weights) %.0f MB, "
           "16 MB budget %.0f MB" % (peak["0"], peak["auto"], peak["16"]))
    assert outputs["16"] == outputs["0"]
    assert outputs["auto"] == outputs["0"]
    # Measured (Zen 4, 2026-11-29): 174, 143 and 120 MB.
    assert peak["16"] <= peak["0"] - 20
    assert peak["auto"] <= peak["0"] - 20
