"""Binding-level behaviour of the Tolk C API through the ctypes module."""

import ctypes
import math
import os
import shutil
import sys
import threading

import pytest

import make_random_models
from conftest import compare_results, scores_close

SINUSOID_MODEL = "prenorm_relu_shared_f32"
LEARNED_MODEL = "postnorm_gelu_sep_learned_f16"  # learned position table of 320
SEPARATE_VOCAB_MODEL = "postnorm_swish_int16_noscale"


@pytest.fixture(scope="module")
def sinusoid(random_models):
    return random_models[SINUSOID_MODEL]


def _load_error(tolk, path):
    with pytest.raises(tolk.TolkError) as ei:
        tolk.Model(path)
    err = ei.value
    assert err.status != tolk.Status.OK
    assert err.message, "TolkError without a message (tolk_last_error() was empty)"
    return err


# ----------------------------------------------------------------------- version


def test_version_and_abi(tolk):
    assert tolk.abi_version() == tolk.ABI_VERSION == 1
    v = tolk.version()
    assert v and v[0].isdigit(), v
    for status in range(8):
        assert tolk.status_string(status), status
    assert tolk.status_string(tolk.Status.OK) != tolk.status_string(tolk.Status.ERROR_IO)


# ------------------------------------------------------------------- load errors


def test_missing_directory(tolk, tmp_path):
    err = _load_error(tolk, str(tmp_path / "does-not-exist"))
    assert err.status in (tolk.Status.ERROR_IO, tolk.Status.ERROR_INVALID_MODEL,
                          tolk.Status.ERROR_INVALID_ARGUMENT)


def test_empty_directory(tolk, tmp_path):
    _load_error(tolk, str(tmp_path))


def test_path_is_a_file(tolk, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    _load_error(tolk, str(f))


def test_garbage_model_bin(tolk, sinusoid, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(sinusoid.path, d)
    (d / "model.bin").write_bytes(os.urandom(4096))
    err = _load_error(tolk, str(d))
    assert err.status in (tolk.Status.ERROR_INVALID_MODEL, tolk.Status.ERROR_IO,
                          tolk.Status.ERROR_UNSUPPORTED)


def test_empty_model_bin(tolk, sinusoid, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(sinusoid.path, d)
    (d / "model.bin").write_bytes(b"")
    _load_error(tolk, str(d))


@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.99])
def test_truncated_model_bin(tolk, sinusoid, tmp_path, fraction):
    d = tmp_path / "m"
    shutil.copytree(sinusoid.path, d)
    data = (d / "model.bin").read_bytes()
    (d / "model.bin").write_bytes(data[: int(len(data) * fraction)])
    _load_error(tolk, str(d))


def test_trailing_garbage_model_bin(tolk, ctranslate2, sinusoid, tmp_path):
    """Extra bytes after the aliases: CT2 ignores them; Tolk must not crash."""
    d = tmp_path / "m"
    shutil.copytree(sinusoid.path, d)
    with open(d / "model.bin", "ab") as f:
        f.write(b"\x00garbage" * 10)
    try:
        with tolk.Model(str(d)):
            pass
    except tolk.TolkError as e:
        assert e.message


def test_wrong_binary_version(tolk, sinusoid, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(sinusoid.path, d)
    data = bytearray((d / "model.bin").read_bytes())
    data[0:4] = (99).to_bytes(4, "little")
    (d / "model.bin").write_bytes(bytes(data))
    err = _load_error(tolk, str(d))
    assert err.status in (tolk.Status.ERROR_INVALID_MODEL, tolk.Status.ERROR_UNSUPPORTED)


def test_load_error_message_mentions_path(tolk, tmp_path):
    missing = str(tmp_path / "no-such-model-dir")
    err = _load_error(tolk, missing)
    assert "no-such-model-dir" in err.message or "model.bin" in err.message, err.message


def test_non_utf8_path(tolk, tmp_path):
    # Undecodable bytes in the path: must be an error status, not a crash.
    lib = tolk._get_lib()
    out = tolk._ModelP()
    status = lib.tolk_model_load(str(tmp_path).encode() + b"/\xff\xfe", ctypes.byref(out))
    assert status != tolk.Status.OK
    assert not out


def test_model_in_a_non_utf8_directory_loads(tolk, sinusoid, tmp_path):
    # Linux names are bytes: a directory named by undecodable bytes loads, given as the str
    # Python makes of it (surrogate escapes) or as bytes, and translates as the original.
    odd = os.path.join(os.fsencode(tmp_path), b"model-\xff\xfe")
    shutil.copytree(os.fsencode(sinusoid.path), odd)
    source = [sinusoid.source_vocab[4:9]]
    expected = tolk.Translator(sinusoid.path).translate_batch(source)[0].hypotheses
    for path in (os.fsdecode(odd), odd):
        assert tolk.Translator(path).translate_batch(source)[0].hypotheses == expected


# ----------------------------------------------------------------- raw C calls


def test_null_pointers(tolk, sinusoid):
    lib = tolk._get_lib()
    out = tolk._ModelP()
    assert lib.tolk_model_load(None, ctypes.byref(out)) == tolk.Status.ERROR_NULL_POINTER
    assert lib.tolk_last_error()
    assert lib.tolk_model_load(sinusoid.path.encode(), None) == tolk.Status.ERROR_NULL_POINTER
    lib.tolk_model_free(None)
    lib.tolk_translator_free(None)
    lib.tolk_result_free(None)
    assert lib.tolk_result_batch_size(None) == 0
    assert lib.tolk_result_num_hypotheses(None, 0) == 0
    tr = tolk._TranslatorP()
    assert lib.tolk_translator_new(None, None, ctypes.byref(tr)) == tolk.Status.ERROR_NULL_POINTER
    res = tolk._ResultP()
    status = lib.tolk_translate_batch(None, None, None, 0, None, None, None, ctypes.byref(res))
    assert status == tolk.Status.ERROR_NULL_POINTER
    toks = tolk._CharPP()
    n = ctypes.c_size_t()
    assert lib.tolk_result_hypothesis(None, 0, 0, ctypes.byref(toks), ctypes.byref(n), None) \
        == tolk.Status.ERROR_NULL_POINTER


def test_raw_translate_null_arguments(tolk, sinusoid):
    lib = tolk._get_lib()
    with tolk.Model(sinusoid.path) as model, tolk.Translator(model) as tr:
        res = tolk._ResultP()
        # batch_size 1 but NULL source arrays -> error, not a crash.
        status = lib.tolk_translate_batch(tr._ptr, None, None, 1, None, None, None,
                                          ctypes.byref(res))
        assert status == tolk.Status.ERROR_NULL_POINTER
        # NULL out_result.
        keep = []
        src, lens = tr._token_arrays([["w1"]], keep, allow_none=False)
        status = lib.tolk_translate_batch(tr._ptr, src, lens, 1, None, None, None, None)
        assert status == tolk.Status.ERROR_NULL_POINTER
        # A NULL token pointer inside a sentence.
        arr = (ctypes.c_char_p * 2)(b"w1", None)
        outer = (tolk._CharPP * 1)(ctypes.cast(arr, tolk._CharPP))
        lens2 = (ctypes.c_size_t * 1)(2)
        status = lib.tolk_translate_batch(
            tr._ptr, ctypes.cast(outer, tolk._CharPPP),
            ctypes.cast(lens2, ctypes.POINTER(ctypes.c_size_t)), 1, None, None, None,
            ctypes.byref(res))
        assert status != tolk.Status.OK
        if status == tolk.Status.OK:
            lib.tolk_result_free(res)


def test_raw_defaults_and_result_accessors(tolk, sinusoid):
    lib = tolk._get_lib()
    topts = lib.tolk_translator_options_default()
    assert topts.struct_size == ctypes.sizeof(tolk.TolkTranslatorOptions)
    o = lib.tolk_translate_options_default()
    assert o.struct_size == ctypes.sizeof(tolk.TolkTranslateOptions)
    assert (o.beam_size, o.num_hypotheses, o.max_input_length, o.max_decoding_length,
            o.min_decoding_length, o.max_batch_size, o.batch_type) == (2, 1, 1024, 256, 1, 0, 0)
    assert o.patience == 1.0 and o.length_penalty == 1.0
    assert not o.return_scores and not o.disable_unk and o.end_token is None
    assert o.repetition_penalty == 1.0 and o.no_repeat_ngram_size == 0

    with tolk.Model(sinusoid.path) as model, tolk.Translator(model) as tr:
        keep = []
        src, lens = tr._token_arrays([["w1", "w2"], ["w3"]], keep, allow_none=False)
        res = tolk._ResultP()
        # NULL options = defaults; NULL translator options too (tested in new()).
        assert lib.tolk_translate_batch(tr._ptr, src, lens, 2, None, None, None,
                                        ctypes.byref(res)) == tolk.Status.OK
        try:
            assert lib.tolk_result_batch_size(res) == 2
            assert lib.tolk_result_num_hypotheses(res, 0) == 1
            assert lib.tolk_result_num_hypotheses(res, 2) == 0
            toks = tolk._CharPP()
            n = ctypes.c_size_t()
            score = ctypes.c_float(0.0)
            assert lib.tolk_result_hypothesis(res, 0, 0, ctypes.byref(toks), ctypes.byref(n),
                                              ctypes.byref(score)) == tolk.Status.OK
            assert math.isnan(score.value), "scores must be NaN when return_scores is false"
            # out_score may be NULL.
            assert lib.tolk_result_hypothesis(res, 0, 0, ctypes.byref(toks), ctypes.byref(n),
                                              None) == tolk.Status.OK
            assert lib.tolk_result_hypothesis(res, 0, 1, ctypes.byref(toks), ctypes.byref(n),
                                              None) == tolk.Status.ERROR_OUT_OF_RANGE
            assert lib.tolk_result_hypothesis(res, 5, 0, ctypes.byref(toks), ctypes.byref(n),
                                              None) == tolk.Status.ERROR_OUT_OF_RANGE
            assert lib.tolk_last_error()
        finally:
            lib.tolk_result_free(res)

    out = tolk._TranslatorP()
    with tolk.Model(sinusoid.path) as model:
        assert lib.tolk_translator_new(model._ptr, None, ctypes.byref(out)) == tolk.Status.OK
        lib.tolk_translator_free(out)


# --------------------------------------------------------------- translator options


@pytest.mark.parametrize("compute_type", ["default", "auto", "float32", "float", "int8", "int8_float32", "int16"])
def test_compute_types_accepted(tolk, sinusoid, compute_type):
    with tolk.Model(sinusoid.path) as model, tolk.Translator(model, compute_type=compute_type) as tr:
        assert len(tr.translate_batch([["w1"]])) == 1
    # Loading the model for the type gives the same translations without a second copy.
    with tolk.Model(sinusoid.path, compute_type=compute_type) as model, tolk.Translator(model) as tr:
        expected = {"default": "float32", "auto": "int8_float32", "float32": "float32", "float": "float32",
                    "int8": "int8_float32", "int8_float32": "int8_float32", "int16": "int16"}[compute_type]
        if tolk.cpu_isa() == "scalar" and compute_type == "auto":
            expected = "float32"
        assert model.compute_type == expected
        assert len(tr.translate_batch([["w1"]])) == 1


@pytest.mark.parametrize("compute_type", ["float16", "bfloat16", "int8_float16", "int8_bfloat16"])
def test_half_compute_types_unsupported_on_cpu(tolk, sinusoid, compute_type):
    # CTranslate2 refuses them on CPU as well.
    with pytest.raises(tolk.TolkError) as ei:
        tolk.Model(sinusoid.path, compute_type=compute_type)
    assert ei.value.status == tolk.Status.ERROR_UNSUPPORTED


@pytest.mark.parametrize("compute_type", ["bogus", "", "float64"])
def test_bad_compute_type(tolk, sinusoid, compute_type):
    with tolk.Model(sinusoid.path) as model:
        with pytest.raises(tolk.TolkError) as ei:
            tolk.Translator(model, compute_type=compute_type)
        assert ei.value.message


def test_bad_device(tolk, sinusoid):
    with tolk.Model(sinusoid.path) as model:
        with pytest.raises(tolk.TolkError) as ei:
            tolk.Translator(model, device="tpu")
        assert ei.value.message


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(beam_size=0),
        dict(num_hypotheses=0),
        dict(beam_size=2, num_hypotheses=3),
        dict(beam_size=1, num_hypotheses=2),
        dict(patience=0.0),
        dict(max_decoding_length=0),
        dict(min_decoding_length=10, max_decoding_length=5),
        dict(end_token="NOT_IN_THE_VOCABULARY"),
        dict(repetition_penalty=0.0),
        dict(repetition_penalty=-1.0),
    ],
    ids=lambda kw: ",".join("%s=%s" % kv for kv in kw.items()),
)
def test_invalid_translate_options(tolk, ctranslate2, sinusoid, kwargs):
    """Options that CTranslate2 rejects must give a TolkError (not a crash or a
    silent result)."""
    src = [["w1", "w2"]]
    with pytest.raises(ValueError):
        ctranslate2.Translator(sinusoid.path).translate_batch(src, **kwargs)
    with tolk.Model(sinusoid.path) as model, tolk.Translator(model) as tr:
        with pytest.raises(tolk.TolkError) as ei:
            tr.translate_batch(src, **kwargs)
        assert ei.value.status == tolk.Status.ERROR_INVALID_ARGUMENT, ei.value
        assert ei.value.message


@pytest.mark.parametrize(
    "kwargs",
    [dict(beam_size=2 ** 32 + 1), dict(beam_size=-1), dict(no_repeat_ngram_size=2 ** 32), dict(max_batch_size=-1),
     dict(max_input_length=-1), dict(num_hypotheses=2 ** 40), dict(sampling_topk=-2)],
    ids=lambda kw: ",".join("%s=%s" % kv for kv in kw.items()),
)
def test_counts_out_of_range_are_refused_not_wrapped(tolk, sinusoid, kwargs):
    """A count a 32-bit C field cannot hold is a ValueError: ctypes would wrap it (2**32 + 1
    had run as greedy search, -1 as no limit), and CTranslate2 refuses it too."""
    with tolk.Model(sinusoid.path) as model, tolk.Translator(model) as tr:
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            tr.translate_batch([["w1", "w2"]], **kwargs)
    with pytest.raises(ValueError, match="intra_threads"):
        tolk.Translator(sinusoid.path, intra_threads=2 ** 32 + 2)


def test_binding_validates_batch_type(tolk, sinusoid):
    with tolk.Model(sinusoid.path) as model, tolk.Translator(model) as tr:
        with pytest.raises(ValueError):
            tr.translate_batch([["w1"]], batch_type="sentences")
        with pytest.raises(ValueError):
            tr.translate_batch([["w1"]], target_prefix=[["w2"], ["w3"]])
        with pytest.raises(TypeError):
            tr.translate_batch(["w1 w2"])


# ------------------------------------------------------------------- batches


def _both(ctranslate2_tr, tolk_tr, sources, **kwargs):
    return (ctranslate2_tr.translate_batch(sources, **kwargs),
            tolk_tr.translate_batch(sources, **kwargs))


def test_empty_batch(tolk, ctranslate2, sinusoid, ct2_translators, tolk_translators):
    assert ct2_translators(SINUSOID_MODEL).translate_batch([]) == []
    assert tolk_translators(SINUSOID_MODEL).translate_batch([]) == []
    assert tolk_translators(SINUSOID_MODEL).translate_batch([], beam_size=4, num_hypotheses=2,
                                                           return_scores=True) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(beam_size=1, return_scores=True),
        dict(beam_size=4, num_hypotheses=3, return_scores=True),
        dict(beam_size=2),
        dict(beam_size=1, min_decoding_length=5, return_scores=True),
    ],
    ids=["greedy", "beam4_nbest3", "beam2", "greedy_min5"],
)
@pytest.mark.parametrize("model_name", [SINUSOID_MODEL, LEARNED_MODEL, "prenorm_gelutanh_int8_marian"])
def test_empty_sentence(model_name, kwargs, random_models, ct2_translators, tolk_translators):
    """An empty source (alone, and inside a batch) gives what CTranslate2 gives
    (an empty hypothesis with score 0 for models without source eos/bos)."""
    ct2 = ct2_translators(model_name)
    tk = tolk_translators(model_name)
    for sources in ([[]], [[], random_models[model_name].source_vocab[5:9], []]):
        exp, got = _both(ct2, tk, sources, **kwargs)
        same, total, msgs = compare_results(sources, None, exp, got,
                                            check_scores=kwargs.get("return_scores", False))
        assert same == total, "\n".join(msgs)


def test_empty_sentence_with_prefix(random_models, ct2_translators, tolk_translators):
    info = random_models[SINUSOID_MODEL]
    prefix = [[info.target_vocab[10], info.target_vocab[11]]]
    for beam in (1, 4):
        exp, got = _both(ct2_translators(SINUSOID_MODEL), tolk_translators(SINUSOID_MODEL),
                         [[]], target_prefix=prefix, beam_size=beam, return_scores=True)
        assert got[0].hypotheses == exp[0].hypotheses
        assert all(scores_close(a, b) for a, b in zip(got[0].scores, exp[0].scores))


def _long_sentence(info, n=2000, seed=5):
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = info.source_vocab
    return [vocab[int(rng.integers(3, len(vocab)))] for _ in range(n)]


@pytest.mark.parametrize("max_input_length", [1024, 100, 0])
def test_very_long_input_sinusoid(max_input_length, random_models, ct2_translators,
                                  tolk_translators):
    """2000 tokens: truncated to max_input_length (0 = no truncation)."""
    info = random_models[SINUSOID_MODEL]
    src = [_long_sentence(info), info.source_vocab[10:20]]
    exp, got = _both(ct2_translators(SINUSOID_MODEL), tolk_translators(SINUSOID_MODEL), src,
                     beam_size=2, max_input_length=max_input_length, max_decoding_length=30,
                     return_scores=True)
    same, total, msgs = compare_results(src, None, exp, got)
    assert same == total, "\n".join(msgs)


def test_very_long_input_learned_positions(tolk, random_models, ct2_translators, tolk_translators):
    """The learned position table has 320 rows: 1024 positions are an error in
    CTranslate2; Tolk must report an error too (not read out of bounds)."""
    info = random_models[LEARNED_MODEL]
    src = [_long_sentence(info)]
    with pytest.raises(Exception):
        ct2_translators(LEARNED_MODEL).translate_batch(src, max_decoding_length=10)
    with pytest.raises(tolk.TolkError) as ei:
        tolk_translators(LEARNED_MODEL).translate_batch(src, max_decoding_length=10)
    assert ei.value.message
    # Within the table it works and matches.
    exp, got = _both(ct2_translators(LEARNED_MODEL), tolk_translators(LEARNED_MODEL), src,
                     max_input_length=300, max_decoding_length=10, return_scores=True)
    same, total, msgs = compare_results(src, None, exp, got)
    assert same == total, "\n".join(msgs)


def test_decoding_past_learned_positions(tolk, random_models, ct2_translators, tolk_translators):
    """max_decoding_length beyond the learned table: CT2 errors (or stops) -
    Tolk must do the same thing or raise a TolkError, never crash."""
    info = random_models[LEARNED_MODEL]
    src = [info.source_vocab[5:15]]
    kwargs = dict(beam_size=1, max_decoding_length=400, end_token=info.target_vocab[-1])
    try:
        exp = ct2_translators(LEARNED_MODEL).translate_batch(src, **kwargs)
    except Exception:
        exp = None
    try:
        got = tolk_translators(LEARNED_MODEL).translate_batch(src, **kwargs)
    except tolk.TolkError as e:
        assert e.message
        got = None
    if exp is not None and got is not None:
        assert [r.hypotheses for r in exp] == [r.hypotheses for r in got]


def test_unknown_tokens(random_models, ct2_translators, tolk_translators):
    info = random_models[SEPARATE_VOCAB_MODEL]
    src = [
        ["NOT_A_TOKEN"],
        ["NOT_A_TOKEN", "ALSO_NOT", "<unk>"],
        [info.source_vocab[5], "???", info.source_vocab[6], "\u00e9t\u00e9"],
        ["<s>", "</s>", "<unk>"],
        [" ", "\t"],
    ]
    for beam in (1, 4):
        exp, got = _both(ct2_translators(SEPARATE_VOCAB_MODEL),
                         tolk_translators(SEPARATE_VOCAB_MODEL), src, beam_size=beam,
                         return_scores=True)
        same, total, msgs = compare_results(src, None, exp, got)
        assert same == total, "\n".join(msgs)


def test_invalid_utf8_token(tolk, random_models):
    """Raw bytes that are not UTF-8: an error or an unknown token, not a crash."""
    info = random_models[SINUSOID_MODEL]
    with tolk.Model(info.path) as model, tolk.Translator(model) as tr:
        try:
            res = tr.translate_batch([[b"\xff\xfe", "w1"]])
            assert len(res) == 1
        except tolk.TolkError as e:
            assert e.message


def test_prefix_longer_than_max_decoding_length(random_models, ct2_translators, tolk_translators):
    info = random_models[SINUSOID_MODEL]
    prefix = [info.target_vocab[10:20]]
    src = [info.source_vocab[5:9]]
    kwargs = dict(beam_size=1, max_decoding_length=5, return_scores=True)
    try:
        exp = ct2_translators(SINUSOID_MODEL).translate_batch(src, target_prefix=prefix, **kwargs)
    except Exception as e:  # pragma: no cover - depends on the CT2 version
        pytest.skip("CTranslate2 rejects it: %s" % e)
    got = tolk_translators(SINUSOID_MODEL).translate_batch(src, target_prefix=prefix, **kwargs)
    assert [r.hypotheses for r in got] == [r.hypotheses for r in exp]


def test_nostart_model_requires_prefix(tolk, random_models, ctranslate2):
    """decoder_start_token null: CTranslate2 fails without a start token in the
    prefix; Tolk must fail too (status, not crash)."""
    info = random_models["prenorm_gelu_nostart_int8f16"]
    with pytest.raises(Exception):
        ctranslate2.Translator(info.path).translate_batch([["w1"]])
    with tolk.Model(info.path) as model, tolk.Translator(model) as tr:
        with pytest.raises(tolk.TolkError) as ei:
            tr.translate_batch([["w1"]])
        assert ei.value.message
        with pytest.raises(tolk.TolkError):
            tr.translate_batch([["w1"]], target_prefix=[[]])


def test_results_are_independent_of_batch_order(random_models, tolk_translators):
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 20, seed=77)
    tr = tolk_translators(SINUSOID_MODEL)
    a = tr.translate_batch(sents, beam_size=1, max_batch_size=4)
    b = tr.translate_batch(sents[::-1], beam_size=1, max_batch_size=4)[::-1]
    assert [r.hypotheses for r in a] == [r.hypotheses for r in b]


# ------------------------------------------------------------ lifetime / threads


def test_translator_keeps_model_alive(tolk, random_models):
    info = random_models[SINUSOID_MODEL]
    model = tolk.Model(info.path)
    tr = tolk.Translator(model)
    expected = tr.translate_batch([["w1", "w2"]], beam_size=1)
    model.close()  # the C side keeps the model alive for the translator
    assert model.closed
    assert tr.translate_batch([["w1", "w2"]], beam_size=1) == expected
    tr.close()
    tr.close()  # idempotent
    with pytest.raises(ValueError):
        tr.translate_batch([["w1"]])


def test_many_translators_one_model(tolk, random_models):
    info = random_models[SINUSOID_MODEL]
    with tolk.Model(info.path) as model:
        trs = [tolk.Translator(model) for _ in range(4)]
        outs = [t.translate_batch([["w3", "w4"]], beam_size=1) for t in trs]
        assert all(o == outs[0] for o in outs)
        for t in trs:
            t.close()


def test_load_free_many_times(tolk, random_models):
    info = random_models[SEPARATE_VOCAB_MODEL]
    for _ in range(50):
        with tolk.Model(info.path) as model, tolk.Translator(model) as tr:
            tr.translate_batch([["s1"]], beam_size=1, max_decoding_length=3)


# ------------------------------------------------------------- loading from memory


def _files_of(path):
    return {name: open(os.path.join(path, name), "rb").read()
            for name in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, name))}


@pytest.mark.parametrize("model_name", [SINUSOID_MODEL, SEPARATE_VOCAB_MODEL, "postnorm_relu_int8_zhen_like_txt"])
def test_from_files_equals_directory_load(tolk, random_models, model_name):
    """Model.from_files gives the directory's translations, with every compute type (a
    type other than the model's loads the weights again from the model's copy)."""
    info = random_models[model_name]
    files = _files_of(info.path)
    sources = [info.source_vocab[5:12], info.source_vocab[20:23], []]
    kwargs = dict(beam_size=2, max_decoding_length=12, return_scores=True)
    with tolk.Model(info.path) as from_dir, tolk.Model.from_files(files) as from_memory:
        assert from_memory.compute_type == from_dir.compute_type
        assert from_memory.description == from_dir.description
        for compute_type in ("default", "float32", "int8", "int16"):
            with tolk.Translator(from_dir, compute_type=compute_type) as a, \
                    tolk.Translator(from_memory, compute_type=compute_type) as b:
                assert a.translate_batch(sources, **kwargs) == b.translate_batch(sources, **kwargs), compute_type
    # Pairs and other buffers; the buffers may change after the call.
    mutable = [(name, bytearray(data)) for name, data in files.items()]
    with tolk.Translator(model_name, files=mutable, compute_type="float32") as tr:
        for _, data in mutable:
            data[:] = b"\xa5" * len(data)
        with tolk.Translator(info.path, compute_type="float32") as ref:
            assert tr.translate_batch(sources, **kwargs) == ref.translate_batch(sources, **kwargs)
        assert repr(tr).startswith("tolk.Translator(%r" % model_name)
    views = {name: memoryview(data) for name, data in files.items()}
    with tolk.Model.from_files(views, compute_type="int8") as model:
        assert model.compute_type == "int8_float32"


def test_from_files_zh_en_text_and_tokens(tolk, zh_en_model):
    text = "耶稣基督是大卫的子孙，亚伯拉罕的后裔。\n你们要彼此相爱。"
    with tolk.Model(zh_en_model) as a, tolk.Model.from_files(_files_of(zh_en_model)) as b, \
            tolk.Translator(a) as ta, tolk.Translator(b) as tb:
        assert ta.translate_text(text, beam_size=2) == tb.translate_text(text, beam_size=2)
        tokens = [["▁你们", "要", "彼此", "相爱", "。"]]
        assert ta.translate_batch(tokens, return_scores=True) == tb.translate_batch(tokens, return_scores=True)


def test_from_files_errors(tolk, sinusoid):
    files = _files_of(sinusoid.path)

    def load_error(files, status, fragment, **kwargs):
        with pytest.raises(tolk.TolkError) as ei:
            tolk.Model.from_files(files, **kwargs)
        assert ei.value.status == status, ei.value
        assert fragment in ei.value.message, ei.value.message

    without_bin = {k: v for k, v in files.items() if k != "model.bin"}
    load_error(without_bin, tolk.Status.ERROR_IO, "config.json")
    load_error({}, tolk.Status.ERROR_INVALID_ARGUMENT, "no files")
    load_error(dict(files, **{"model.bin": files["model.bin"][:100]}), tolk.Status.ERROR_INVALID_MODEL, "model.bin")
    load_error(dict(files, **{"model.bin": os.urandom(4096)}), tolk.Status.ERROR_INVALID_MODEL, "model.bin")
    load_error(dict(files, **{"config.json": b""}), tolk.Status.ERROR_INVALID_ARGUMENT, "empty")
    load_error(list(files.items()) + [("./config.json", b"{}")], tolk.Status.ERROR_INVALID_ARGUMENT, "twice")
    load_error(dict(files, **{"../x": b"x"}), tolk.Status.ERROR_INVALID_ARGUMENT, "../x")
    load_error(files, tolk.Status.ERROR_IO, "missing.model", source_tokenizer="missing.model")
    with pytest.raises(TypeError):
        tolk.Model.from_files({b"model.bin": files["model.bin"]})
    with pytest.raises(ValueError):
        tolk.Model.from_files({"model\0.bin": files["model.bin"]})
    with tolk.Model.from_files(files) as model, pytest.raises(ValueError):
        tolk.Translator(model, files=files)


def _run_threads(fn, n):
    errors = []

    def wrap(i):
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_concurrent_translators_share_model(tolk, random_models):
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 30, seed=3)
    with tolk.Model(info.path) as model:
        with tolk.Translator(model) as ref_tr:
            expected = ref_tr.translate_batch(sents, beam_size=2, return_scores=True)
        results = {}

        def work(i):
            with tolk.Translator(model) as tr:
                for _ in range(3):
                    results.setdefault(i, []).append(
                        tr.translate_batch(sents, beam_size=2, return_scores=True))

        _run_threads(work, 4)
    for outs in results.values():
        for out in outs:
            assert out == expected


def test_concurrent_calls_on_one_translator(tolk, random_models):
    """Calls on one translator are serialized internally: concurrent use is safe."""
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 10, seed=4)
    with tolk.Model(info.path) as model, tolk.Translator(model) as tr:
        expected = tr.translate_batch(sents, beam_size=1)
        outs = []
        _run_threads(lambda i: outs.append(tr.translate_batch(sents, beam_size=1)), 6)
        assert all(o == expected for o in outs)


def test_last_error_is_thread_local(tolk, tmp_path):
    lib = tolk._get_lib()
    with pytest.raises(tolk.TolkError):
        tolk.Model(str(tmp_path / "missing-main-thread"))
    main_msg = lib.tolk_last_error()
    seen = []

    def other(_):
        seen.append(lib.tolk_last_error())

    _run_threads(other, 1)
    assert main_msg
    assert seen[0] in (b"", None), seen[0]
    assert lib.tolk_last_error() == main_msg


# ------------------------------------------------------------ progress / cancellation


def test_progress_struct_fields(tolk):
    """The binding's TolkTranslateOptions has the progress callback and its user data
    after batch_type, then the fields added since, as the header's; the default has no
    callback."""
    lib = tolk._get_lib()
    o = lib.tolk_translate_options_default()
    assert o.struct_size == ctypes.sizeof(tolk.TolkTranslateOptions)
    names = [f[0] for f in tolk.TolkTranslateOptions._fields_]
    at = names.index("batch_type")
    assert names[at:] == ["batch_type", "progress", "progress_user_data", "max_length_factor", "use_shortlist",
                          "on_token", "on_token_user_data", "use_vmap", "kv_cache_type",
                          "max_decoding_memory_mb", "repetition_penalty", "no_repeat_ngram_size",
                          "return_attention", "replace_unknowns", "suppress_sequences", "suppress_sequence_lengths",
                          "num_suppress_sequences", "return_end_token", "sampling_topk", "sampling_topp",
                          "sampling_temperature", "sampling_seed", "end_tokens", "num_end_tokens"]
    assert not o.progress and o.progress_user_data is None and not o.use_vmap and o.kv_cache_type is None
    assert o.max_decoding_memory_mb == tolk.DECODING_MEMORY_AUTO == 0xFFFFFFFF  # the header's TOLK_DECODING_MEMORY_AUTO
    assert tolk.TolkTranslateOptions.progress.offset % ctypes.alignment(ctypes.c_void_p) == 0
    assert tolk.status_string(tolk.Status.ERROR_CANCELLED) == "cancelled"
    assert issubclass(tolk.TolkCancelled, tolk.TolkError)


def test_progress_token_mode(tolk, random_models, tolk_translators):
    """Batches of 4 over 11 sentences (one empty: it counts too): 4, 8, 11 of 11 on the
    calling thread; the results are those without a callback. No sentences, no call."""
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 11, seed=21)
    tr = tolk_translators(SINUSOID_MODEL)
    calls = []
    got = tr.translate_batch(sents, beam_size=2, max_batch_size=4, return_scores=True,
                             progress=lambda d, t: calls.append((d, t, threading.get_ident())))
    assert [(d, t) for d, t, _ in calls] == [(4, 11), (8, 11), (11, 11)]
    assert {th for _, _, th in calls} == {threading.get_ident()}
    assert got == tr.translate_batch(sents, beam_size=2, max_batch_size=4, return_scores=True)
    # One batch by default; batches of tokens grow done by whole sentences up to the total.
    calls = []
    tr.translate_batch(sents, beam_size=1, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(11, 11)]
    calls = []
    tr.translate_batch(sents, beam_size=1, max_batch_size=12, batch_type="tokens",
                       progress=lambda d, t: calls.append((d, t)))
    done = [d for d, _ in calls]
    assert len(calls) > 1 and done[-1] == 11 and done == sorted(set(done)), calls
    calls = []
    assert tr.translate_batch([], progress=lambda d, t: calls.append((d, t))) == []
    assert calls == []


def test_progress_token_mode_cancel_and_exception(tolk, random_models, tolk_translators):
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 12, seed=22)
    tr = tolk_translators(SINUSOID_MODEL)
    calls = []
    with pytest.raises(tolk.TolkCancelled) as ei:
        tr.translate_batch(sents, beam_size=1, max_batch_size=4,
                           progress=lambda d, t: calls.append(d) or False)
    assert calls == [4]
    assert ei.value.status == tolk.Status.ERROR_CANCELLED and "cancel" in ei.value.message

    calls = []

    def fail(done, total):
        calls.append(done)
        if done == 8:
            raise ZeroDivisionError("progress failed at %d" % done)
        return True

    with pytest.raises(ZeroDivisionError, match="at 8"):
        tr.translate_batch(sents, beam_size=1, max_batch_size=4, progress=fail)
    assert calls == [4, 8]
    # The translator is fine afterwards, and the last error says what happened.
    assert b"cancel" in tolk._get_lib().tolk_last_error()
    assert tr.translate_batch(sents, beam_size=1, max_batch_size=4) == \
        tr.translate_batch(sents, beam_size=1, max_batch_size=4, progress=lambda d, t: True)
    with pytest.raises(TypeError):
        tr.translate_batch(sents, progress="not callable")


@pytest.mark.parametrize("intra_threads", [1, 3])
def test_progress_callback_may_translate(tolk, random_models, intra_threads):
    """The callback runs outside the library's thread pool and holds no lock: it may use
    the same translator (nested calls, each with its own callback)."""
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 9, seed=25)
    with tolk.Model(info.path) as model, tolk.Translator(model, intra_threads=intra_threads) as tr:
        alone = tr.translate_batch(sents[:2], beam_size=1)
        nested = []

        def translate_more(done, total):
            nested.append(tr.translate_batch(sents[:2], beam_size=1, progress=lambda d, t: True))

        got = tr.translate_batch(sents, beam_size=1, max_batch_size=3, progress=translate_more)
        assert got == tr.translate_batch(sents, beam_size=1, max_batch_size=3)
    assert nested == [alone] * 3


def test_progress_old_struct_size_ignores_the_callback(tolk, random_models):
    """A caller built against the header before the callback (struct_size ends at
    batch_type) gets no call, even with a callback set beyond its size."""
    info = random_models[SINUSOID_MODEL]
    lib = tolk._get_lib()
    calls = []
    callback = tolk.TolkProgressCallback(lambda user, d, t: calls.append((d, t)) or False)
    with tolk.Model(info.path) as model, tolk.Translator(model) as tr:
        keep = []
        sents = make_random_models.random_sentences(info, 6, seed=23)
        src, lens = tr._token_arrays(sents, keep, allow_none=False)
        results = []
        for size in (tolk.TolkTranslateOptions.progress.offset, ctypes.sizeof(tolk.TolkTranslateOptions)):
            o = lib.tolk_translate_options_default()
            o.struct_size = size
            o.beam_size = 1
            o.max_batch_size = 2
            o.progress = callback
            res = tolk._ResultP()
            results.append(lib.tolk_translate_batch(tr._ptr, src, lens, len(sents), None, None,
                                                    ctypes.byref(o), ctypes.byref(res)))
            if results[-1] == tolk.Status.OK:
                assert lib.tolk_result_batch_size(res) == len(sents)
            else:
                assert not res, "a cancelled call returns no result"
            lib.tolk_result_free(res)
        assert results == [tolk.Status.OK, tolk.Status.ERROR_CANCELLED]
        assert calls == [(2, 6)]


def test_progress_user_data_and_threads(tolk, random_models):
    """Each thread's calls come on that thread, with the user data it passed."""
    info = random_models[SINUSOID_MODEL]
    sents = make_random_models.random_sentences(info, 9, seed=24)
    lib = tolk._get_lib()
    seen = {}
    lock = threading.Lock()

    def record(user, done, total):
        with lock:
            seen.setdefault(user, []).append((done, total, threading.get_ident()))
        return True

    callback = tolk.TolkProgressCallback(record)
    threads = {}
    with tolk.Model(info.path) as model, tolk.Translator(model) as tr:
        def work(i):
            threads[i + 1] = threading.get_ident()
            keep = []
            src, lens = tr._token_arrays(sents, keep, allow_none=False)
            o = lib.tolk_translate_options_default()
            o.beam_size = 1
            o.max_batch_size = 3
            o.progress = callback
            o.progress_user_data = i + 1
            res = tolk._ResultP()
            assert lib.tolk_translate_batch(tr._ptr, src, lens, len(sents), None, None,
                                            ctypes.byref(o), ctypes.byref(res)) == tolk.Status.OK
            lib.tolk_result_free(res)

        _run_threads(work, 4)
    assert sorted(seen) == [1, 2, 3, 4]
    for user, calls in seen.items():
        assert [(d, t) for d, t, _ in calls] == [(3, 9), (6, 9), (9, 9)]
        assert {th for _, _, th in calls} == {threads[user]}


# ------------------------------------------------------------------ the example


def test_translate_tokens_example(tolk, random_models, tolk_translators):
    import subprocess
    import sys

    from conftest import BINDING_DIR

    info = random_models[SEPARATE_VOCAB_MODEL]
    sents = [info.source_vocab[5:10], [], info.source_vocab[30:33] + ["UNKNOWN"]]
    stdin = "".join(" ".join(s) + "\n" for s in sents)
    proc = subprocess.run(
        [sys.executable, os.path.join(BINDING_DIR, "translate_tokens.py"),
         "--model", info.path, "--beam", "3"],
        input=stdin, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    expected = tolk_translators(SEPARATE_VOCAB_MODEL).translate_batch(sents, beam_size=3,
                                                                      max_batch_size=32)
    assert proc.stdout.splitlines() == [" ".join(r.hypotheses[0]) for r in expected]
    assert "sentences" in proc.stderr

    bad = subprocess.run(
        [sys.executable, os.path.join(BINDING_DIR, "translate_tokens.py"),
         "--model", info.path + "-missing"],
        input="a b\n", capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 1 and "error:" in bad.stderr


def test_devices(tolk, sinusoid):
    """"cpu" runs on the CPU; "auto" (the default) takes a usable GPU, else the CPU with the
    same output; "cuda" without a usable GPU is a clear error, never a crash."""
    source = [["a", "b", "c"], ["m", "n"]]
    with tolk.Model(sinusoid.path, device="cpu") as cpu:
        assert cpu.device == "cpu" and cpu.device_name.startswith("cpu (")
        with tolk.Translator(cpu) as t:
            expected = [r.hypotheses[0] for r in t.translate_batch(source)]
    with tolk.Model(sinusoid.path) as auto:
        assert auto.device in ("cpu", "cuda")
        if auto.device == "cpu":
            with tolk.Translator(auto) as t:
                assert [r.hypotheses[0] for r in t.translate_batch(source)] == expected
    try:
        gpu = tolk.Model(sinusoid.path, device="cuda")
    except tolk.TolkError as e:
        print("no GPU:", e.message)
        assert e.status == tolk.Status.ERROR_UNSUPPORTED and "cuda" in e.message
    else:
        with gpu:
            assert gpu.device == "cuda" and gpu.device_name.startswith("cuda:")
    with pytest.raises(tolk.TolkError):
        tolk.Model(sinusoid.path, device="tpu")


FAKE_DRIVER = r"""
int cuInit(unsigned flags) { (void)flags; return 100; /* CUDA_ERROR_NO_DEVICE */ }
int cuDeviceGetCount(int *count) { *count = 0; return 0; }
"""


def test_a_driver_without_a_usable_gpu_is_a_clean_error(tolk, sinusoid, tmp_path):
    """A host whose libcuda.so cannot run anything (here a stub without the driver API's
    symbols, as an old or broken driver): "cuda" is an error naming the problem, "auto"
    runs on the CPU, and nothing is printed (no panic message leaks to the host's stderr)."""
    import shutil
    import subprocess
    import textwrap

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "fake.c").write_text(FAKE_DRIVER)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so"), str(tmp_path / "fake.c")], check=True)
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        import tolk
        try:
            tolk.Model(%r, device="cuda")
            print("loaded on cuda")
        except tolk.TolkError as e:
            print("error", e.status, e.message)
        with tolk.Model(%r) as m:
            print("auto", m.device)
    """) % (os.path.dirname(tolk.__file__), sinusoid.path, sinusoid.path)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), RUST_BACKTRACE="1")
    env.pop("TOLK_DEVICE", None)  # "auto" must probe the driver here
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("error %d" % tolk.Status.ERROR_UNSUPPORTED) and "cuda" in lines[0], lines
    assert lines[1] == "auto cpu", lines
    assert "panicked" not in run.stderr and run.stderr.strip() == "", run.stderr


def test_translate_file(tolk, tmp_path):
    """Translator.translate_file streams a file in chunks: each line's translation as
    translate_text / translate_batch give it, progress in lines against the counted total,
    and a cancelled call leaves no output file."""
    fixture = os.path.join(os.path.dirname(__file__), "..", "..", "ffi-tests", "fixtures", "tiny")
    tr = tolk.Translator(fixture)
    lines = ["Hello world. How are you?", "", "The cat sat on the mat.", "  ", "z"] * 8
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    calls = []
    tr.translate_file(src, out, beam_size=1, max_decoding_length=8, max_batch_size=2, read_batch_size=6,
                      progress=lambda d, t: calls.append((d, t)))
    expected = tr.translate_text(lines, beam_size=1, max_decoding_length=8, max_batch_size=2)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert calls[-1] == (40, 40) and all(t == 40 for _, t in calls) and len(calls) >= 40 // 6
    # The memory options reach the file's calls: the same lines under a state budget.
    tr.translate_file(src, out, beam_size=1, max_decoding_length=8, max_batch_size=2, read_batch_size=6,
                      kv_cache_type="float32", max_decoding_memory_mb=1)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected

    src.write_text("a b c\n\nz\n", encoding="utf-8")
    tr.translate_file(str(src), str(out), tokens=True, beam_size=2, num_hypotheses=2, return_scores=True)
    results = tr.translate_batch([["a", "b", "c"], [], ["z"]], beam_size=2, num_hypotheses=2, return_scores=True)
    expected = ["%.6f ||| %s" % (s, " ".join(h)) for r in results for h, s in zip(r.hypotheses, r.scores)]
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected

    out.unlink()
    src.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    with pytest.raises(tolk.TolkCancelled):
        tr.translate_file(src, out, read_batch_size=6, max_batch_size=2, progress=lambda d, t: d < 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    with pytest.raises(tolk.TolkError, match="nonexistent"):
        tr.translate_file(tmp_path / "nonexistent.txt", out)
    tr.close()
