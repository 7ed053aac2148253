"""Shared fixtures for the Tolk Python test-suite (parity with CTranslate2).

Environment:
  TOLK_LIB         path of libtolk.so (default: target/release/libtolk.so)
  TOLK_MODELS      root of the real models (default: models/, then ../shared/models)
  TOLK_DATA        root of the test data (default: ../shared/data, then data/)
  TOLK_REQUIRE_LIB set to 1 to fail (instead of skip) when the library is missing
"""

import os
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BINDING_DIR = os.path.join(REPO_ROOT, "examples-c", "python")

for p in (HERE, BINDING_DIR):
    if p not in sys.path:
        sys.path.insert(0, p)

import make_random_models  # noqa: E402
from ct2_oracle import ct2_uses_mkl  # noqa: E402,F401  (the tests import it from here)

# Lines printed in the terminal summary (identical ratios, timings, ...).
SUMMARY = []
_summary_lock = threading.Lock()


def report(line: str):
    """Record a line for the end-of-run summary (and print it for -s runs)."""
    with _summary_lock:
        SUMMARY.append(line)
    print(line)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if SUMMARY:
        terminalreporter.section("tolk parity summary")
        for line in SUMMARY:
            terminalreporter.write_line(line)


def _first_existing(*paths):
    for p in paths:
        if p and os.path.isdir(p):
            return p
    return paths[0]


def models_root_path() -> str:
    env = os.environ.get("TOLK_MODELS")
    if env:
        return os.path.abspath(os.path.join(REPO_ROOT, env))
    return _first_existing(
        os.path.join(REPO_ROOT, "models"),
        os.path.abspath(os.path.join(REPO_ROOT, "..", "shared", "models")),
    )


def data_root_path() -> str:
    env = os.environ.get("TOLK_DATA")
    if env:
        return os.path.abspath(os.path.join(REPO_ROOT, env))
    return _first_existing(
        os.path.abspath(os.path.join(REPO_ROOT, "..", "shared", "data")),
        os.path.join(REPO_ROOT, "data"),
    )


@pytest.fixture(scope="session")
def models_root() -> str:
    return models_root_path()


@pytest.fixture(scope="session")
def data_root() -> str:
    return data_root_path()


def model_dir_or_skip(root: str, name: str) -> str:
    path = os.path.join(root, name)
    if not os.path.isdir(path) or not any(f.endswith((".bin", ".npz")) for f in os.listdir(path)):
        pytest.skip(
            "model %s not found at %s (set TOLK_MODELS to the folder holding it)" % (name, path)
        )
    return path


@pytest.fixture(scope="session")
def zh_en_model(models_root) -> str:
    return model_dir_or_skip(models_root, "zh-en-ct2")


@pytest.fixture(scope="session")
def tolk():
    """The ctypes binding module, with the library loaded (skips if missing)."""
    import tolk as tolk_module

    try:
        tolk_module.library_path()
    except OSError as e:
        if os.environ.get("TOLK_REQUIRE_LIB") == "1":
            raise
        pytest.skip("Tolk library not available: %s" % e)
    return tolk_module


@pytest.fixture(scope="session")
def ctranslate2():
    return pytest.importorskip("ctranslate2")


@pytest.fixture(scope="session")
def random_models(tmp_path_factory):
    """{name: ModelInfo} of the random-weight models, built once per session."""
    root = tmp_path_factory.mktemp("random_models")
    return make_random_models.build_all(str(root))


@pytest.fixture(scope="session")
def ct2_translators(random_models, ctranslate2):
    """Lazily created float32 CTranslate2 translators, keyed by model name."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = ctranslate2.Translator(
                random_models[name].path, device="cpu", compute_type="float32",
                intra_threads=1,
            )
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tolk_translators(random_models, tolk):
    """Lazily created float32 Tolk translators, keyed by model name."""
    cache = {}

    def get(name):
        if name not in cache:
            model = tolk.Model(random_models[name].path)
            cache[name] = tolk.Translator(model, compute_type="float32", intra_threads=1)
        return cache[name]

    yield get
    for tr in cache.values():
        tr.close()
        tr.model.close()


# ----------------------------------------------------------------- comparison helpers


def scores_close(a: float, b: float, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
    return abs(a - b) <= atol + rtol * abs(b)


def scores_all_close(a, b):
    return len(a) == len(b) and len(a) > 0 and all(scores_close(x, y) for x, y in zip(a, b))


def greedy_step_gap(ct2_tr, source, prefix, kwargs, hyp_a, hyp_b, start_token=None):
    """For two greedy hypotheses that diverge at step k, ask CTranslate2 for the
    log-probabilities of both choices at that step (return_alternatives after
    forcing the common prefix).  Returns |logp_a - logp_b| or None."""
    k = 0
    while k < len(hyp_a) and k < len(hyp_b) and hyp_a[k] == hyp_b[k]:
        k += 1
    user_prefix = list(prefix or [])
    if start_token is not None:
        user_prefix = user_prefix[1:]
    if k < len(user_prefix):
        return None  # diverged inside the forced prefix: not a tie
    forced = ([start_token] if start_token is not None else []) + list(hyp_a[:k])
    opts = dict(
        beam_size=8,
        num_hypotheses=8,
        return_alternatives=True,
        return_scores=True,
        length_penalty=0.0,
        max_decoding_length=k + 1,
        max_input_length=kwargs.get("max_input_length", 1024),
        disable_unk=kwargs.get("disable_unk", False),
    )
    if kwargs.get("end_token") is not None:
        opts["end_token"] = kwargs["end_token"]
    if kwargs.get("min_decoding_length", 1) > k:
        opts["min_decoding_length"] = kwargs["min_decoding_length"]
    try:
        res = ct2_tr.translate_batch([source], target_prefix=[forced], **opts)[0]
    except Exception:
        return None
    alt = {}
    for h, s in zip(res.hypotheses, res.scores):
        tok = h[k] if len(h) > k else "<END>"
        alt.setdefault(tok, s)
    a = hyp_a[k] if len(hyp_a) > k else "<END>"
    b = hyp_b[k] if len(hyp_b) > k else "<END>"
    if a not in alt or b not in alt:
        return None
    return abs(alt[a] - alt[b])


def compare_results(sources, prefixes, ct2_results, tolk_results, check_scores=True,
                    max_report=5, tie_info=None):
    """Returns (n_identical_examples, n_examples, mismatch descriptions).

    An example is identical when every hypothesis is the same token list (and,
    when scores were requested, every score is within tolerance).

    ``tie_info``: optional dict(ct2_scores=[...], tolk_scores=[...],
    greedy_gap=callable(i, hyp_ct2, hyp_tolk)) used to recognise floating-point
    near-ties: the tokens differ but CTranslate2 and Tolk reached equal scores,
    or (greedy) the two diverging choices had the same log-probability within
    1e-4.  Near-ties are counted as identical and listed in tie_info["ties"]."""
    msgs = []
    identical = 0
    if tie_info is not None:
        tie_info.setdefault("ties", [])
    if len(ct2_results) != len(tolk_results):
        return 0, len(ct2_results), [
            "batch size differs: ct2 %d vs tolk %d" % (len(ct2_results), len(tolk_results))
        ]
    for i, (c, t) in enumerate(zip(ct2_results, tolk_results)):
        problems = []
        if c.hypotheses != t.hypotheses:
            problems.append("tokens differ")
        if check_scores:
            if len(c.scores) != len(t.scores):
                problems.append("score count %d vs %d" % (len(c.scores), len(t.scores)))
            elif not all(scores_close(ts, cs) for cs, ts in zip(c.scores, t.scores)):
                problems.append("scores differ")
        if problems == ["tokens differ"] and tie_info is not None:
            cs = tie_info.get("ct2_scores")
            tsc = tie_info.get("tolk_scores")
            why = None
            if cs is not None and tsc is not None and scores_all_close(cs[i], tsc[i]):
                why = "equal scores %r vs %r" % (cs[i], tsc[i])
            elif tie_info.get("greedy_gap") is not None:
                gap = tie_info["greedy_gap"](i, c.hypotheses[0], t.hypotheses[0])
                if gap is not None and gap <= 1e-4:
                    why = "greedy step log-prob gap %.2e" % gap
            if why:
                tie_info["ties"].append("example %d: %s" % (i, why))
                identical += 1
                continue
        if problems:
            if len(msgs) < max_report:
                lines = ["example %d (%s): source=%r" % (i, ", ".join(problems), sources[i])]
                if prefixes is not None:
                    lines.append("  target_prefix=%r" % (prefixes[i],))
                for r in range(max(len(c.hypotheses), len(t.hypotheses))):
                    ch = c.hypotheses[r] if r < len(c.hypotheses) else None
                    th = t.hypotheses[r] if r < len(t.hypotheses) else None
                    cs = c.scores[r] if r < len(c.scores) else None
                    tsc = t.scores[r] if r < len(t.scores) else None
                    lines.append("  hyp %d ct2 =%r score=%r" % (r, ch, cs))
                    lines.append("  hyp %d tolk=%r score=%r" % (r, th, tsc))
                msgs.append("\n".join(lines))
        else:
            identical += 1
    return identical, len(ct2_results), msgs
