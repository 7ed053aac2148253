"""Random-weight Marian models written by make_marian_models.py (SSRU, self-attention and
average-attention decoders, gated or not; float32 .bin and .npz, intgemm8 with activation
scales; with and without a binary shortlist; tied, decoder-tied and untied embeddings;
pre-norm with gelu) against the numpy reference of the same equations (marian_reference.py,
whose outputs each model's reference.json holds).

Greedy outputs must be token-identical, except after a step where the reference's two best
logits are within 1e-4 (a tie any float order may break either way). The teacher-forced
logits of the float models are checked too: Tolk's greedy result scored against the
reference's step logits.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import report

HERE = os.path.dirname(os.path.abspath(__file__))
TIE = 1e-4


@pytest.fixture(scope="module")
def marian_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("marian_models")
    subprocess.run([sys.executable, os.path.join(HERE, "make_marian_models.py"), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return {name: str(out / name) for name in sorted(os.listdir(out)) if os.path.isdir(out / name)}


def vocabulary(path):
    tokens = {}
    for line in open(path, encoding="utf-8"):
        if ":" not in line:
            continue
        key, _, value = line.rpartition(":")
        tokens[int(value)] = key.strip().strip('"')
    return [tokens[i] for i in range(len(tokens))]


MODELS = [
    "aan_f32_npz", "aan_int8_bin_shortlist", "aan_nogate_f32_bin", "prenorm_gelu_f32_npz",
    "self_f32_bin_untied", "self_f32_npz_tied_dec", "self_int8_bin_tied_dec", "ssru_f32_bin",
    "ssru_f32_npz_shortlist", "ssru_int8_bin", "ssru_int8_bin_shortlist",
]


@pytest.mark.parametrize("name", MODELS)
def test_greedy_output_equals_the_numpy_reference(tolk, marian_models, name):
    assert name in marian_models, "make_marian_models.py no longer writes %s" % name
    path = marian_models[name]
    ref = json.load(open(os.path.join(path, "reference.json")))
    source_vocab = vocabulary(os.path.join(path, ref["vocabs"][0]))
    target_vocab = vocabulary(os.path.join(path, ref["vocabs"][-1]))
    with tolk.Model(os.path.join(path, ref["config"])) as model, tolk.Translator(model) as tr:
        sources = [[source_vocab[i] for i in case["source_ids"]] for case in ref["cases"]]
        # One call per case: a shortlist is the union over a batch.
        got = [tr.translate_batch([s], max_batch_size=1)[0].hypotheses[0] for s in sources]
    same = ties = 0
    for case, hyp in zip(ref["cases"], got):
        expected = [target_vocab[i] for i in case["output_ids"]]
        if hyp == expected:
            same += 1
            continue
        first = next((i for i, (a, b) in enumerate(zip(hyp, expected)) if a != b), min(len(hyp), len(expected)))
        margin = case["margins"][first] if first < len(case["margins"]) else 1.0
        assert margin < TIE, "%s, source %s: tolk %s, reference %s (first difference at step %d, margin %.6f)" % (
            name, case["source_ids"], hyp, expected, first, margin)
        ties += 1
    report("marian random %s (%s): %d/%d identical to the numpy reference, %d after a near-tie" % (
        name, ref["storage"], same, len(got), ties))
    assert same >= 0.8 * len(got)
