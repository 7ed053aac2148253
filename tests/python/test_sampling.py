"""CTranslate2's random sampling (sampling_topk, sampling_topp, sampling_temperature).

Random numbers differ between the engines, so the checks are: the settings that do not
sample give greedy search's output exactly, as in CTranslate2; a seed makes a call's
samples repeatable however it is batched; the distribution of the first sampled token
is CTranslate2's (on its likeliest tokens, within the noise of 4000 draws); the errors are
CTranslate2's, and sampling with beam search or several hypotheses is refused by name.
"""

import collections

import pytest

import make_random_models

MODEL = "prenorm_relu_shared_f32"


@pytest.fixture(scope="module")
def setup(random_models, ct2_translators, tolk_translators):
    info = random_models[MODEL]
    sents = [s for s in make_random_models.random_sentences(info, 40, seed=77) if s]
    prefix = [[info.start_token] for _ in sents] if info.requires_prefix else None
    return info, sents, prefix, ct2_translators(MODEL), tolk_translators(MODEL)


def _hyps(results):
    return [r.hypotheses for r in results]


def test_settings_that_do_not_sample_are_greedy(setup):
    info, sents, prefix, ct2, tr = setup
    greedy = _hyps(tr.translate_batch(sents, target_prefix=prefix, beam_size=1))
    for kwargs in [dict(sampling_topk=1, sampling_temperature=0.3), dict(sampling_topk=0, sampling_temperature=0.0)]:
        assert _hyps(tr.translate_batch(sents, target_prefix=prefix, beam_size=1, **kwargs)) == greedy, kwargs
        assert _hyps(ct2.translate_batch(sents, target_prefix=prefix, beam_size=1, **kwargs)) == greedy, kwargs
    # A tiny nucleus keeps only the most probable token.
    assert _hyps(tr.translate_batch(sents, target_prefix=prefix, beam_size=1, sampling_topk=0,
                                    sampling_topp=1e-6)) == greedy


def test_a_seed_repeats_the_samples_however_the_call_is_batched(setup):
    info, sents, prefix, ct2, tr = setup
    kwargs = dict(beam_size=1, sampling_topk=0, sampling_temperature=1.5, return_scores=True)
    first = tr.translate_batch(sents, target_prefix=prefix, sampling_seed=11, **kwargs)
    again = tr.translate_batch(sents, target_prefix=prefix, sampling_seed=11, max_batch_size=7, **kwargs)
    other = tr.translate_batch(sents, target_prefix=prefix, sampling_seed=12, **kwargs)
    unseeded = [tr.translate_batch(sents, target_prefix=prefix, **kwargs) for _ in range(2)]
    greedy = _hyps(tr.translate_batch(sents, target_prefix=prefix, beam_size=1))
    assert first == again
    assert _hyps(first) != _hyps(other) and _hyps(unseeded[0]) != _hyps(unseeded[1])
    assert sum(a != b for a, b in zip(_hyps(first), greedy)) >= len(sents) // 2
    # Scores are log-probabilities of the sampled tokens under the whole distribution.
    assert all(s <= 0.0 for r in first for s in r.scores)


@pytest.mark.parametrize("kwargs", [dict(sampling_topk=0), dict(sampling_topk=4, sampling_temperature=2.0),
                                    dict(sampling_topk=0, sampling_topp=0.7)],
                         ids=lambda kw: ",".join("%s=%s" % kv for kv in kw.items()))
def test_first_token_distribution_is_ctranslate2s(setup, kwargs, ctranslate2):
    """The same source 4000 times, one token each: on the likeliest tokens the two
    engines' frequencies agree within 4.5 standard deviations of their difference."""
    info, sents, prefix, ct2, tr = setup
    n = 4000
    source = [sents[0]] * n
    pre = [prefix[0]] * n if prefix else None
    opts = dict(beam_size=1, max_decoding_length=1 + (1 if prefix else 0), **kwargs)
    ours = collections.Counter(r.hypotheses[0][-1] for r in tr.translate_batch(source, target_prefix=pre, sampling_seed=5, **opts))
    ctranslate2.set_random_seed(5)  # both engines seeded: the test gives the same verdict every run
    theirs = collections.Counter(r.hypotheses[0][-1] for r in ct2.translate_batch(source, target_prefix=pre, **opts))
    assert len(ours) >= 2, ours  # it does sample
    for token, _ in (ours + theirs).most_common(6):
        a, b = ours[token] / n, theirs[token] / n
        p = (a + b) / 2
        assert abs(a - b) <= 4.5 * (2 * p * (1 - p) / n) ** 0.5 + 1e-3, (token, a, b, ours.most_common(6), theirs.most_common(6))


def test_sampling_errors(setup, tolk, ctranslate2):
    info, sents, prefix, ct2, tr = setup
    for kwargs in [dict(sampling_topp=0.0), dict(sampling_topp=1.5), dict(sampling_topk=10 ** 6)]:
        with pytest.raises(ValueError):
            ct2.translate_batch(sents[:1], target_prefix=prefix[:1] if prefix else None, beam_size=1, **kwargs)
        with pytest.raises(tolk.TolkError) as e:
            tr.translate_batch(sents[:1], target_prefix=prefix[:1] if prefix else None, beam_size=1, **kwargs)
        assert e.value.status == tolk.Status.ERROR_INVALID_ARGUMENT, (kwargs, e.value)
    for kwargs in [dict(beam_size=2, sampling_topk=5), dict(beam_size=1, num_hypotheses=2, patience=2.0, sampling_topk=5)]:
        with pytest.raises(tolk.TolkError, match="sampling") as e:
            tr.translate_batch(sents[:1], target_prefix=prefix[:1] if prefix else None, **kwargs)
        assert e.value.status == tolk.Status.ERROR_UNSUPPORTED
