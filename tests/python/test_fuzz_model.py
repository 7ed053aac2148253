"""Robustness of model loading against corrupted model directories.

A worker subprocess (fuzz_worker.py, address space limited to 4 GiB) loads a
few thousand mutated copies of random models' model.bin - truncations, bit
flips, structural u32/u16/u8 fields overwritten with huge or edge values - and
each must either load (and then translate or fail with TolkError) or fail with
TolkError.  A crash, an abort on a huge allocation or a hang fails the test and
names the mutation; the crashing model.bin is kept under the test's tmp dir.
The same mutations are also loaded from memory (``Model.from_files``): each must
load, fail to load or fail to translate exactly as it does from the directory.

Environment: TOLK_FUZZ_ITERS (per model, default 2500; from memory, where every
mutation is loaded twice, a fifth of it), TOLK_FUZZ_SEED.
"""

import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from conftest import report

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fuzz_worker.py")
ADDRESS_SPACE_LIMIT = 4 << 30
ITERATIONS = int(os.environ.get("TOLK_FUZZ_ITERS", "2500"))
SEED = int(os.environ.get("TOLK_FUZZ_SEED", "20240601"))
FUZZ_MODELS = ["postnorm_relu_int8_zhen_like_txt", "postnorm_gelu_sep_learned_f16",
               "postnorm_swish_int16_noscale"]


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def run_worker(args, timeout):
    env = dict(os.environ)
    env.setdefault("RUST_BACKTRACE", "0")
    try:
        proc = subprocess.run(
            [sys.executable, WORKER] + args,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
            timeout=timeout, preexec_fn=_limit_address_space, env=env,
        )
        return proc.returncode, proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err, True


def _describe_exit(rc, timed_out):
    if timed_out:
        return "timed out (hang?)"
    if rc < 0:
        import signal

        try:
            return "killed by signal %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit status %d" % rc


@pytest.mark.parametrize("model_name", FUZZ_MODELS)
@pytest.mark.parametrize("source", ["directory", "memory"])
def test_fuzz_model_bin(tolk, model_name, source, random_models, tmp_path):
    info = random_models[model_name]
    work = tmp_path / "work"
    work.mkdir()
    seed = SEED + FUZZ_MODELS.index(model_name) + (1000 if source == "memory" else 0)
    iterations = ITERATIONS if source == "directory" else max(1, ITERATIONS // 5)
    args = ["mutate", info.path, str(work), str(seed), str(iterations)]
    rc, out, err, timed_out = run_worker(args + (["memory"] if source == "memory" else []), timeout=300)
    last = [l for l in out.splitlines() if l.startswith(("progress", "DONE"))][-1:]
    if rc == 0 and not timed_out:
        report("fuzz %s (%s): %d mutations, %s" % (model_name, source, iterations,
                                                  last[0] if last else "(no output)"))
        return
    current = {}
    try:
        with open(work / "current.json") as f:
            current = json.load(f)
    except (OSError, ValueError):
        pass
    keep = tmp_path / "crash_model"
    if (work / "model").exists():
        shutil.copytree(work / "model", keep)
    msg = (
        "worker %s on %s (seed %d) during mutation %r\n"
        "crashing model dir kept at %s\nlast progress: %s\nstderr tail:\n%s"
        % (_describe_exit(rc, timed_out), model_name, seed, current, keep,
           last, err[-3000:])
    )
    report("FUZZ FAILURE " + msg.splitlines()[0])
    pytest.fail(msg)


# ------------------------------------------------------------ structured cases


def _vocab_files(d):
    return sorted(f for f in os.listdir(d) if "vocabulary" in f)


def _edit_json(path, fn):
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fn(obj), f)


def _edit_vocab(d, fn):
    """Applies fn(list_of_tokens) -> list_of_tokens to every vocabulary file."""
    for name in _vocab_files(d):
        path = os.path.join(d, name)
        if name.endswith(".json"):
            _edit_json(path, fn)
        else:
            with open(path, encoding="utf-8") as f:
                toks = f.read().split("\n")[:-1]
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(t + "\n" for t in fn(toks)))


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


# name -> (model, mutation, must_fail_to_load)
CASES = {
    "no_vocabulary": ("prenorm_relu_shared_f32",
                      lambda d: [os.remove(os.path.join(d, f)) for f in _vocab_files(d)], True),
    "no_source_vocabulary": ("postnorm_swish_int16_noscale",
                             lambda d: os.remove(os.path.join(d, "source_vocabulary.json")), False),
    "garbage_json_vocabulary": ("prenorm_relu_shared_f32",
                                lambda d: _write(os.path.join(d, "shared_vocabulary.json"),
                                                 b"\x00\xff garbage ["), True),
    "garbage_txt_vocabulary": ("prenorm_relu_bf16_learned_txt",
                               lambda d: _write(os.path.join(d, "shared_vocabulary.txt"),
                                                os.urandom(3000)), False),
    "nonstring_vocabulary": ("prenorm_relu_shared_f32",
                             lambda d: _write(os.path.join(d, "shared_vocabulary.json"),
                                              b"[1, 2, null, {}]"), True),
    "vocabulary_is_a_directory": ("prenorm_relu_shared_f32",
                                  lambda d: (os.remove(os.path.join(d, "shared_vocabulary.json")),
                                             os.mkdir(os.path.join(d, "shared_vocabulary.json"))),
                                  True),
    "empty_vocabulary": ("prenorm_relu_shared_f32",
                         lambda d: _write(os.path.join(d, "shared_vocabulary.json"), b"[]"), False),
    "vocabulary_smaller_than_embeddings": ("prenorm_relu_shared_f32",
                                           lambda d: _edit_vocab(d, lambda t: t[:-5]), False),
    "vocabulary_larger_than_embeddings": ("postnorm_swish_int16_noscale",
                                          lambda d: _edit_vocab(d, lambda t: t + ["x1", "x2"]), False),
    "txt_vocabulary_smaller": ("postnorm_relu_int8_zhen_like_txt",
                               lambda d: _edit_vocab(d, lambda t: t[: len(t) // 2]), False),
    "vocabulary_without_eos": ("prenorm_relu_shared_f32",
                               lambda d: _edit_vocab(d, lambda t: ["zz" if x == "</s>" else x for x in t]),
                               False),
    "vocabulary_without_unk": ("prenorm_relu_shared_f32",
                               lambda d: _edit_vocab(d, lambda t: ["zz" if x == "<unk>" else x for x in t]),
                               False),
    "duplicate_tokens": ("prenorm_relu_shared_f32",
                         lambda d: _edit_vocab(d, lambda t: ["w6" if x == "w5" else x for x in t]),
                         False),
    "garbage_config": ("prenorm_relu_shared_f32",
                       lambda d: _write(os.path.join(d, "config.json"), b"{not json"), True),
    "binary_config": ("prenorm_relu_shared_f32",
                      lambda d: _write(os.path.join(d, "config.json"), os.urandom(200)), True),
    "array_config": ("prenorm_relu_shared_f32",
                     lambda d: _write(os.path.join(d, "config.json"), b"[1, 2]"), True),
    "bad_types_config": ("prenorm_relu_shared_f32",
                         lambda d: _write(os.path.join(d, "config.json"),
                                          json.dumps({"add_source_eos": "yes", "eos_token": 5}).encode()),
                         True),
    "empty_object_config": ("prenorm_relu_shared_f32",
                            lambda d: _write(os.path.join(d, "config.json"), b"{}"), False),
    "no_config": ("prenorm_relu_shared_f32",
                  lambda d: os.remove(os.path.join(d, "config.json")), True),
    "config_is_a_directory": ("prenorm_relu_shared_f32",
                              lambda d: (os.remove(os.path.join(d, "config.json")),
                                         os.mkdir(os.path.join(d, "config.json"))), True),
    "config_unknown_eos": ("prenorm_relu_shared_f32",
                           lambda d: _edit_json(os.path.join(d, "config.json"),
                                                lambda c: dict(c, eos_token="NOPE", bos_token="NOPE2")),
                           False),
    "config_unknown_decoder_start": ("prenorm_relu_shared_f32",
                                     lambda d: _edit_json(os.path.join(d, "config.json"),
                                                          lambda c: dict(c, decoder_start_token="NOPE")),
                                     False),
    "config_huge_epsilon": ("postnorm_gelu_sep_learned_f16",
                            lambda d: _edit_json(os.path.join(d, "config.json"),
                                                 lambda c: dict(c, layer_norm_epsilon=1e30)), False),
    "no_model_bin": ("prenorm_relu_shared_f32",
                     lambda d: os.remove(os.path.join(d, "model.bin")), True),
    "model_bin_is_a_directory": ("prenorm_relu_shared_f32",
                                 lambda d: (os.remove(os.path.join(d, "model.bin")),
                                            os.mkdir(os.path.join(d, "model.bin"))), True),
}


def test_broken_model_directories(tolk, random_models, tmp_path):
    dirs = []
    for name, (model_name, fn, _) in CASES.items():
        d = tmp_path / name
        shutil.copytree(random_models[model_name].path, d)
        fn(str(d))
        dirs.append(str(d))
    rc, out, err, timed_out = run_worker(["dirs"] + dirs, timeout=120)
    results = {}
    last_try = None
    for line in out.splitlines():
        if line.startswith("TRY "):
            last_try = os.path.basename(line[4:])
        elif line.startswith("RESULT "):
            _, name, outcome = line.split(" ", 2)
            results[name] = outcome
    if rc != 0 or timed_out:
        pytest.fail("worker %s while loading case %r\nstderr tail:\n%s"
                    % (_describe_exit(rc, timed_out), last_try, err[-3000:]))
    report("broken model dirs: " + ", ".join("%s=%s" % kv for kv in sorted(results.items())))
    wrong = [name for name, (_, _, must_fail) in CASES.items()
             if must_fail and results.get(name) != "load_err"]
    assert not wrong, "these broken models should fail to load: %s" % {
        n: results.get(n) for n in wrong}


# ------------------------------------------------------- differential mutations


def test_differential_dropped_variables(tolk, ctranslate2, random_models, tmp_path):
    """Each variable of a model dropped in turn (and scales reshaped): when
    CTranslate2 still loads the model (optional weights, attributes with
    defaults, missing layer-norm beta = RMS norm, ...) Tolk must give the same
    translations; when CTranslate2 rejects it Tolk must reject it too."""
    import fuzz_worker

    results = []
    for model_name in ("postnorm_relu_int8_zhen_like_txt", "prenorm_gelutanh_int8_marian"):
        info = random_models[model_name]
        with open(os.path.join(info.path, "model.bin"), "rb") as f:
            version, spec, revision, variables, aliases = fuzz_worker.parse_model(f.read())
        mutations = {}
        for i, v in enumerate(variables):
            rest = variables[:i] + variables[i + 1:]
            mutations["drop:" + v[0]] = (rest, aliases)
            if v[0].endswith("_scale") and len(v[1]) == 1:
                reshaped = [list(x) for x in variables]
                reshaped[i] = [v[0], [1, v[1][0]], v[2], v[3]]
                mutations["rank2:" + v[0]] = (reshaped, aliases)
        for j, a in enumerate(aliases):
            mutations["drop-alias:" + a[0]] = (variables, aliases[:j] + aliases[j + 1:])
        dirs = []
        for k, (name, (vs, als)) in enumerate(mutations.items()):
            d = tmp_path / ("%s_%03d" % (model_name, k))
            shutil.copytree(info.path, d)
            with open(d / "model.bin", "wb") as f:
                f.write(fuzz_worker.serialize_model(version, spec, revision, vs, als))
            dirs.append((name, str(d)))
        sources = [info.source_vocab[5:12], info.source_vocab[20:23], []]
        rc, out, err, timed_out = run_worker(
            ["diff", json.dumps(sources)] + [d for _, d in dirs], timeout=300)
        by_dir = {}
        for line in out.splitlines():
            if line.startswith("DIFF "):
                obj = json.loads(line[5:])
                by_dir[obj["dir"]] = obj
        if rc != 0 or timed_out:
            done = len(by_dir)
            pytest.fail("diff worker %s at mutation %r\n%s" % (
                _describe_exit(rc, timed_out), dirs[done][0] if done < len(dirs) else None,
                err[-2000:]))
        for name, d in dirs:
            obj = by_dir[os.path.basename(d)]
            results.append((model_name, name, obj["ct2"], obj["tolk"]))

    bad = []
    n_loaded = 0
    for model_name, name, c, t in results:
        c_err = isinstance(c, str)
        t_err = isinstance(t, str)
        if c_err and t_err:
            continue
        if not c_err:
            n_loaded += 1
        if c_err != t_err:
            bad.append("%s %s: ct2=%s tolk=%s" % (model_name, name, str(c)[:150], str(t)[:150]))
            continue
        toks_c = [h for h, _ in c]
        toks_t = [h for h, _ in t]
        close = all(abs(a[1] - b[1]) <= 1e-3 for a, b in zip(c, t))
        if toks_c != toks_t or not close:
            bad.append("%s %s: outputs differ\n   ct2 =%s\n   tolk=%s" % (model_name, name, c, t))
    report("differential mutations: %d mutated models, %d loaded by CT2, %d disagreements"
           % (len(results), n_loaded, len(bad)))
    for b in bad[:20]:
        report("  " + b)
    assert not bad, "\n".join(bad)
