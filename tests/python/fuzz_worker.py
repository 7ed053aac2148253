#!/usr/bin/env python3
"""Subprocess worker for test_fuzz_model.py: loads mutated model files with Tolk.

Run in a child process (with an address-space limit set by the parent) so that
a crash - a signal, an abort on a failed huge allocation - shows up as an exit
status instead of killing pytest.  Before each attempt the mutation is written
to ``<work>/current.json`` (flushed), so the parent can name the input that
crashed; the mutated model.bin stays in ``<work>/model/``.

Modes:
  mutate  MODEL_DIR WORK_DIR SEED COUNT [memory]
                                          mutate model.bin COUNT times; with ``memory``
                                          each mutation is also loaded from memory
                                          (Model.from_files) and must fare the same
  dirs    DIR...                          load (and if it loads, translate) each dir
  diff    SOURCES_JSON DIR...             translate with CTranslate2 and Tolk, print both

Each attempt must load or raise TolkError; a model that loads is also asked to
translate two short sentences (ok or TolkError).  Output: one line per
``--progress`` attempts, then ``DONE ok=N err=M``.
"""

import json
import os
import random
import shutil
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples-c", "python"))

import tolk  # noqa: E402

HUGE_U32 = [0xFFFFFFFF, 0xFFFFFFFE, 0x80000000, 0x7FFFFFFF, 0x40000000, 0x10000000,
            0x01000000, 0x00100001, 0, 1, 2, 3]


def parse_fields(data: bytes):
    """Offsets of the structural fields of a CT2 model.bin (format v6):
    list of (offset, size, label)."""
    fields = []
    pos = 0

    def u32(label):
        nonlocal pos
        fields.append((pos, 4, label))
        v = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        return v

    def u8(label):
        nonlocal pos
        fields.append((pos, 1, label))
        v = data[pos]
        pos += 1
        return v

    def string(label):
        nonlocal pos
        fields.append((pos, 2, label + ".len"))
        n = struct.unpack_from("<H", data, pos)[0]
        pos += 2
        s = data[pos:pos + n]
        pos += n
        return s

    try:
        u32("binary_version")
        string("spec_name")
        u32("spec_revision")
        nvars = u32("num_variables")
        for i in range(nvars):
            name = string("var%d.name" % i).rstrip(b"\0").decode("utf-8", "replace")
            rank = u8("%s.rank" % name)
            for r in range(rank):
                u32("%s.dim%d" % (name, r))
            u8("%s.dtype" % name)
            nbytes = u32("%s.num_bytes" % name)
            pos += nbytes
        naliases = u32("num_aliases")
        for i in range(naliases):
            string("alias%d.name" % i)
            string("alias%d.target" % i)
    except (struct.error, IndexError):
        pass
    return fields


DTYPE_SIZES = {0: 4, 1: 1, 2: 2, 3: 4, 4: 2, 5: 2}


def parse_model(data: bytes):
    """Full parse of a valid model.bin: (version, spec_name, revision, variables,
    aliases) with variables = [[name, dims, dtype, raw_bytes]]."""
    pos = 0

    def u32():
        nonlocal pos
        v = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        return v

    def string():
        nonlocal pos
        n = struct.unpack_from("<H", data, pos)[0]
        pos += 2
        s = data[pos:pos + n - 1].decode("utf-8")
        pos += n
        return s

    version = u32()
    spec = string()
    revision = u32()
    variables = []
    for _ in range(u32()):
        name = string()
        rank = data[pos]
        pos += 1
        dims = [u32() for _ in range(rank)]
        dtype = data[pos]
        pos += 1
        nbytes = u32()
        variables.append([name, dims, dtype, data[pos:pos + nbytes]])
        pos += nbytes
    aliases = [[string(), string()] for _ in range(u32())]
    return version, spec, revision, variables, aliases


def serialize_model(version, spec, revision, variables, aliases) -> bytes:
    out = bytearray()

    def string(s):
        b = s.encode("utf-8")
        out.extend(struct.pack("<H", len(b) + 1) + b + b"\0")

    out.extend(struct.pack("<I", version))
    string(spec)
    out.extend(struct.pack("<I", revision))
    out.extend(struct.pack("<I", len(variables)))
    for name, dims, dtype, raw in variables:
        string(name)
        out.extend(struct.pack("<B", len(dims)))
        for d in dims:
            out.extend(struct.pack("<I", d))
        out.extend(struct.pack("<BI", dtype, len(raw)))
        out.extend(raw)
    out.extend(struct.pack("<I", len(aliases)))
    for a, t in aliases:
        string(a)
        string(t)
    return bytes(out)


def _scalar_bytes(dtype, value):
    if dtype in (1, 2, 3):
        if value != value or abs(value) > 2**31 - 1:
            value = -1
        fmt = {1: "<b", 2: "<h", 3: "<i"}[dtype]
        lo, hi = {1: (-128, 127), 2: (-32768, 32767), 3: (-2**31, 2**31 - 1)}[dtype]
        return struct.pack(fmt, max(lo, min(hi, int(value))))
    return struct.pack("<f", value)


def structured_mutate(parsed, rng: random.Random):
    """Mutations that keep the file well-formed but make the model inconsistent."""
    version, spec, revision, variables, aliases = parsed
    variables = [[n, list(d), t, r] for n, d, t, r in variables]  # never touch the pristine copy
    aliases = [list(a) for a in aliases]
    tensors = [v for v in variables if v[1]]
    scalars = [v for v in variables if not v[1]]
    kind = rng.choice(["shrink_dim", "shrink_dim", "swap_dims", "dtype_reinterpret",
                       "drop_var", "drop_var", "rename_var", "alias_missing", "alias_cycle",
                       "alias_to_scalar", "scalar_value", "scalar_value", "scalar_to_vector",
                       "rank_change"])
    info = {"kind": kind}
    if kind == "shrink_dim" and tensors:
        v = rng.choice(tensors)
        axis = rng.randrange(len(v[1]))
        old = v[1][axis]
        new = rng.choice([0, 1, max(0, old - 1), old // 2, rng.randrange(0, old + 1)])
        esize = DTYPE_SIZES.get(v[2], 4)
        import numpy as np

        arr = np.frombuffer(v[3], dtype=np.uint8).reshape(v[1] + [esize]) if old else None
        if arr is not None:
            sl = [slice(None)] * (len(v[1]) + 1)
            sl[axis] = slice(0, new)
            v[3] = arr[tuple(sl)].tobytes()
        v[1][axis] = new
        info.update(var=v[0], axis=axis, old=old, new=new)
    elif kind == "swap_dims" and tensors:
        v = rng.choice([t for t in tensors if len(t[1]) == 2] or tensors)
        v[1] = v[1][::-1]
        info.update(var=v[0], dims=v[1])
    elif kind == "dtype_reinterpret" and tensors:
        v = rng.choice(tensors)
        new = rng.choice([0, 1, 2, 3, 4, 5, 6, 200])
        old_size, new_size = DTYPE_SIZES.get(v[2], 4), DTYPE_SIZES.get(new, 4)
        total = len(v[3])
        # Keep the byte count consistent by adjusting the last dimension.
        if v[1] and total % new_size == 0:
            inner = 1
            for d in v[1][:-1]:
                inner *= d
            if inner and (total // new_size) % inner == 0:
                v[1][-1] = total // new_size // inner
        info.update(var=v[0], old_dtype=v[2], new_dtype=new)
        v[2] = new
    elif kind == "drop_var" and variables:
        v = rng.choice(variables)
        variables.remove(v)
        info.update(var=v[0])
    elif kind == "rename_var" and variables:
        v = rng.choice(variables)
        info.update(var=v[0])
        v[0] = v[0] + "_renamed"
        variables.sort(key=lambda x: x[0])
    elif kind == "alias_missing":
        if aliases:
            a = rng.choice(aliases)
            a[1] = "no/such/variable"
        else:
            aliases.append(["decoder/projection/weight_extra", "no/such/variable"])
        info.update(aliases=aliases)
    elif kind == "alias_cycle":
        if aliases:
            a = rng.choice(aliases)
            variables[:] = [v for v in variables if v[0] != a[1]]
            aliases.append([a[1], a[0]])
        else:
            v = rng.choice(tensors)
            variables.remove(v)
            aliases.append([v[0], v[0]])
        info.update(aliases=aliases)
    elif kind == "alias_to_scalar" and aliases and scalars:
        a = rng.choice(aliases)
        a[1] = rng.choice(scalars)[0]
        info.update(alias=a)
    elif kind == "scalar_value" and scalars:
        v = rng.choice(scalars)
        value = rng.choice([0, -1, 1, 2, 3, 5, 7, 99, 127, 1000, 1e30, float("nan")])
        v[3] = _scalar_bytes(v[2], value) if v[2] in (0, 1, 2, 3) else v[3]
        if len(v[3]) == 0:
            v[3] = _scalar_bytes(0, value)
        info.update(var=v[0], value=str(value))
    elif kind == "scalar_to_vector" and scalars:
        v = rng.choice(scalars)
        v[1] = [3]
        v[3] = v[3] * 3
        info.update(var=v[0])
    elif kind == "rank_change" and tensors:
        v = rng.choice(tensors)
        if len(v[1]) >= 2:
            prod = 1
            for d in v[1]:
                prod *= d
            v[1] = [prod]
        else:
            v[1] = [1] + v[1]
        info.update(var=v[0], dims=v[1])
    else:
        info["kind"] = kind + "(noop)"
    return serialize_model(version, spec, revision, variables, aliases), info


def mutate(data: bytes, fields, rng: random.Random, parsed=None):
    """Returns (mutated bytes, description)."""
    if parsed is not None and rng.random() < 0.35:
        return structured_mutate(parsed, rng)
    kind = rng.choice(["truncate", "truncate_header", "bitflip", "bitflip_header",
                       "field_u32", "field_u32", "field_any", "random_u32", "zero_block"])
    buf = bytearray(data)
    header_end = max(64, max((o + s for o, s, _ in fields if "num_bytes" in _ or "dim" in _),
                             default=64))
    if kind == "truncate":
        cut = rng.randrange(0, len(buf))
        return bytes(buf[:cut]), {"kind": kind, "offset": cut}
    if kind == "truncate_header":
        cut = rng.randrange(0, min(len(buf), 600))
        return bytes(buf[:cut]), {"kind": kind, "offset": cut}
    if kind in ("bitflip", "bitflip_header"):
        n = rng.randint(1, 8)
        limit = len(buf) if kind == "bitflip" else min(len(buf), header_end)
        flips = []
        for _ in range(n):
            o = rng.randrange(0, limit)
            b = rng.randrange(8)
            buf[o] ^= 1 << b
            flips.append((o, b))
        return bytes(buf), {"kind": kind, "flips": flips}
    if kind == "field_u32":
        cands = [f for f in fields if f[1] == 4]
        o, _, label = rng.choice(cands)
        v = rng.choice(HUGE_U32 + [rng.randrange(0, 2**32)])
        struct.pack_into("<I", buf, o, v)
        return bytes(buf), {"kind": kind, "field": label, "offset": o, "value": v}
    if kind == "field_any":
        o, size, label = rng.choice(fields)
        if size == 1:
            v = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 127, 128, 255])
            buf[o] = v
        elif size == 2:
            v = rng.choice([0, 1, 2, 0x7FFF, 0xFFFF, rng.randrange(0, 65536)])
            struct.pack_into("<H", buf, o, v)
        else:
            v = rng.choice(HUGE_U32)
            struct.pack_into("<I", buf, o, v)
        return bytes(buf), {"kind": kind, "field": label, "offset": o, "value": v}
    if kind == "random_u32":
        o = rng.randrange(0, max(1, len(buf) - 4))
        v = rng.choice(HUGE_U32)
        struct.pack_into("<I", buf, o, v)
        return bytes(buf), {"kind": kind, "offset": o, "value": v}
    # zero_block
    o = rng.randrange(0, len(buf))
    n = rng.randint(1, 256)
    buf[o:o + n] = bytes(len(buf[o:o + n]))
    return bytes(buf), {"kind": kind, "offset": o, "length": n}


def attempt(model_dir, sentences, files=None):
    """Returns 'ok', 'load_err' or 'translate_err'; with ``files`` the model is loaded from
    them in memory instead (``model_dir`` unused)."""
    try:
        model = tolk.Model.from_files(files) if files is not None else tolk.Model(model_dir)
    except tolk.TolkError as e:
        if not e.message:
            raise AssertionError("TolkError without message (status %d)" % e.status)
        return "load_err"
    try:
        with model, tolk.Translator(model, compute_type="float32") as tr:
            tr.translate_batch(sentences, beam_size=2, max_decoding_length=8,
                               return_scores=True)
    except tolk.TolkError as e:
        if not e.message:
            raise AssertionError("TolkError without message (status %d)" % e.status)
        return "translate_err"
    return "ok"


def write_current(work, info):
    path = os.path.join(work, "current.json")
    with open(path, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())


def run_mutate(model_dir, work, seed, count, progress, memory=False):
    rng = random.Random(seed)
    with open(os.path.join(model_dir, "model.bin"), "rb") as f:
        pristine = f.read()
    fields = parse_fields(pristine)
    parsed = parse_model(pristine)
    assert serialize_model(*parsed) == pristine, "model.bin round trip failed"
    target = os.path.join(work, "model")
    if os.path.exists(target):
        shutil.rmtree(target)
    shutil.copytree(model_dir, target)
    files = {name: open(os.path.join(model_dir, name), "rb").read() for name in os.listdir(model_dir)}
    sentences = [["w1", "w2", "w3"], ["s1", "t1", "<unk>", "zz"], []]
    stats = {"ok": 0, "load_err": 0, "translate_err": 0}
    per_kind = {}
    t0 = time.time()
    for i in range(count):
        data, info = mutate(pristine, fields, rng, parsed)
        info["iteration"] = i
        with open(os.path.join(target, "model.bin"), "wb") as f:
            f.write(data)
        write_current(work, info)
        outcome = attempt(target, sentences)
        if memory:
            files["model.bin"] = data
            from_memory = attempt(None, sentences, files=files)
            if from_memory != outcome:
                raise AssertionError("mutation %r: %s from the directory, %s from memory" % (info, outcome, from_memory))
        stats[outcome] += 1
        per_kind.setdefault(info["kind"], {}).setdefault(outcome, 0)
        per_kind[info["kind"]][outcome] += 1
        if progress and (i + 1) % progress == 0:
            print("progress %d/%d %s %.1fs" % (i + 1, count, stats, time.time() - t0), flush=True)
    print("KINDS %s" % json.dumps(per_kind, sort_keys=True), flush=True)
    print("DONE %s" % json.dumps(stats), flush=True)


def run_dirs(dirs):
    sentences = [["w1", "w2", "w3"], ["s1", "t1", "<unk>", "zz"], []]
    results = {}
    for d in dirs:
        print("TRY %s" % d, flush=True)
        results[os.path.basename(d)] = attempt(d, sentences)
        print("RESULT %s %s" % (os.path.basename(d), results[os.path.basename(d)]), flush=True)
    print("DONE %s" % json.dumps(results), flush=True)


def run_diff(src_json, dirs):
    """Differential mode: translate with CTranslate2 and Tolk, print both."""
    import ctranslate2

    sources = json.loads(src_json)
    for d in dirs:
        out = {"dir": os.path.basename(d)}
        try:
            tr = ctranslate2.Translator(d, device="cpu", compute_type="float32")
            res = tr.translate_batch(sources, beam_size=2, max_decoding_length=12,
                                     return_scores=True)
            out["ct2"] = [[r.hypotheses[0], round(r.scores[0], 4)] for r in res]
        except Exception as e:  # noqa: BLE001
            out["ct2"] = "ERR %s" % str(e)[:200]
        try:
            with tolk.Model(d) as model, tolk.Translator(model, compute_type="float32") as tr:
                res = tr.translate_batch(sources, beam_size=2, max_decoding_length=12,
                                         return_scores=True)
            out["tolk"] = [[r.hypotheses[0], round(r.scores[0], 4)] for r in res]
        except tolk.TolkError as e:
            out["tolk"] = "ERR %s" % e
        print("DIFF " + json.dumps(out, ensure_ascii=False), flush=True)
    print("DONE", flush=True)


def main(argv):
    if len(argv) >= 2 and argv[0] == "diff":
        run_diff(argv[1], argv[2:])
        return 0
    if len(argv) >= 1 and argv[0] == "mutate":
        model_dir, work, seed, count = argv[1], argv[2], int(argv[3]), int(argv[4])
        progress = int(os.environ.get("TOLK_FUZZ_PROGRESS", "250"))
        run_mutate(model_dir, work, seed, count, progress, memory=argv[5:6] == ["memory"])
        return 0
    if len(argv) >= 1 and argv[0] == "dirs":
        run_dirs(argv[1:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
