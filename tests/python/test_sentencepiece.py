"""Identity of Tolk's pure-Rust SentencePiece with the reference `sentencepiece` package.

For each shared model (zh-en `sentencepiece.model`, en-pt `vocab.enpt.spm`) the reference
encodes every dev line (zh, en, pt) and a generated corpus of tricky strings; the
expectations (pieces, ids, decoded text, and each piece's `begin`/`end` byte offsets in
the input from the reference's `SentencePieceText`) go to a file that the ignored Rust test
`compare_with_reference` (tests/sentencepiece.rs) checks, token for token, in a release
build. The same is done for the 128 small models that fuzz/src/lib.rs generates (unigram
and BPE, byte fallback, every whitespace flag, a charsmap whose rules expand, delete and
produce spaces), written by the ignored Rust test `write_generated_models`. Speed of both
is measured on the dev lines and reported.

Environment: TOLK_MODELS / TOLK_DATA as in conftest.py; TOLK_SPM_BENCH_REPEATS (default 20).
"""

import os
import random
import re
import subprocess
import time

import pytest

from conftest import report

spm = pytest.importorskip("sentencepiece")

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = {
    "zh-en": os.path.join("zh-en-ct2", "sentencepiece.model"),
    "en-pt": os.path.join("en-pt-bergamot", "vocab.enpt.spm"),
}
DEV_FILES = ["dev-matthew.zh", "dev-matthew.en", "dev-matthew.pt"]


def tricky_corpus(seed=1234, n_random=600):
    """Strings that stress normalization, whitespace handling, unknowns and scripts."""
    fixed = [
        "", " ", "  ", "\t", "\n", " \t\n ", "a", " a", "a ", "  a  b   c  ",
        "Hello world", "Hello   world", "   leading", "trailing   ", "mid\u3000ideographic space",
        "ＡＢＣ　ｄｅｆ　１２３！？", "ｶﾀｶﾅ ﾊﾝｶｸ", "①②③ ⅫⅣ ㍻ ㌔ ﬁ ﬀ ﬃ", "x² H₂O ½ ¼",
        "e\u0301 a\u0300 n\u0303 o\u0308", "\u00e9 vs e\u0301", "\u1100\u1161\u11a8 한국어",
        "Å Å Å", "ﷺ ﷻ", "😀 👍🏽 👨‍👩‍👧 🇵🇹 🏳️‍🌈", "emoji😀inside", "\U0001F600\U0001F600\U0001F600",
        "\x00", "a\x00b", "\x01\x02\x03 \x7f", "tab\there", "line\nbreak\r\nwindows", "\x0b\x0c\x1c\x1d\x1e\x1f\x85",
        "\u200b\u200c\u200d\ufeff zero width", "\u00a0non\u00a0breaking\u00a0", "\u2028\u2029", "\u2002\u2003\u2009 en em thin",
        "我爱你", "我 爱 你", "你好，世界！", "「引号」《书名》", "中文English混合123", "１２３４５６７８９０",
        "Olá, coração! Ação, pão, avó.", "ÇÃÕÉÊÍÓÚÀ çãõéêíóúà", "Straße ß ẞ", "ǅ ǈ ǋ Ǆ",
        "Русский текст", "Ελληνικά", "עברית", "العربية", "हिन्दी", "ไทย", "日本語のテキスト", "カタカナ",
        "<unk>", "<s>", "</s>", "<pad>", "<0x41>", "▁", "▁▁", "▁a", "a▁b", "⁇",
        "....", "!!!???", "---", "'\"`", "(a) [b] {c}", "https://example.com/a?b=c&d=e", "user@example.com",
        "3.14159 1,000,000 -42 +7", "2024-01-01T12:00:00Z", "#hashtag @mention",
        "\ufffd", "\ud7ff\ue000", "\U0010ffff", "\U0001d400\U0001d401 math bold", "ꙮ", "𠀀𠀁 ext-b",
        "a" * 300, "我" * 200, " " * 100 + "x" + " " * 100, "ab " * 150, "😀" * 50,
    ]
    pools = [
        "abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 .,;:!?'\"-()",
        "我爱你中文世界的是不了人在有这个上们来到时大地为子中你说生国年着就那和要她出也得里后自以会家可下而过天去能对小多然于心学么之都好看起发当没成只如事把还用第样道想作种开美总从无情己面最女但现前些所同日手又行意动方期它头经长儿回位分爱老因很给名法间斯知世什两次使身者被高已亲其进此话常与活正感",
        "ＡＢＣｄｅｆ０１２３！＂＃＄％＆（）＊＋，－．／：；＜＝＞？＠［］＾＿｀｛｜｝～　ｶﾀｶﾅﾞﾟ",
        "\u0300\u0301\u0302\u0303\u0308\u030a\u0327\u0328 aeiouAEIOU ñçãõ",
        "😀😁😂🤣😃😄👍🏽👨\u200d👩\u200d👧🇵🇹🏳️\u200d🌈❤️✨🔥",
        "\x00\x01\x02\x07\x08\t\n\x0b\x0c\r\x1b\x7f\x80\x85\x9f \u00a0\u2000\u200b\u3000\ufeff",
        "Ελληνικά Русский עברית العربية हिन्दी ไทย 日本語 カタカナ 한국어 ß ẞ ﬁ ①② ㍻",
        "▁<unk><s></s>⁇\ufffd",
    ]
    rng = random.Random(seed)
    out = list(fixed)
    for _ in range(n_random):
        k = rng.randint(1, 3)
        chars = "".join(rng.choice(pools) for _ in range(k))
        n = rng.randint(0, 40)
        s = "".join(rng.choice(chars) for _ in range(n))
        if rng.random() < 0.3:
            s = " " * rng.randint(1, 6) + s + " " * rng.randint(0, 6)
        out.append(s)
    # Random code points over all of Unicode (the charsmap's rules cover many blocks),
    # mixed with spaces and ASCII.
    for _ in range(n_random * 3):
        n = rng.randint(1, 30)
        cps = []
        for _ in range(n):
            r = rng.random()
            if r < 0.15:
                cps.append(32)
            elif r < 0.3:
                cps.append(rng.randint(0x20, 0x7E))
            elif r < 0.8:
                cps.append(rng.randint(0x80, 0xFFFF))
            else:
                cps.append(rng.randint(0x10000, 0x10FFFF))
        out.append("".join(chr(c) for c in cps if not 0xD800 <= c <= 0xDFFF))
    # No lone surrogates: they are not valid UTF-8 (and not a `str` the Rust API can take).
    return [s for s in out if not re.search("[\ud800-\udfff]", s)]


def generated_corpus(seed=4321, n_random=160):
    """Strings for the generated models: their charsmap's keys, pieces, unknown
    characters and whitespace of every kind, mixed at random."""
    fixed = [
        "", " ", "  a  b  ", " \u00a0\u3000\t\n", "\u200b", "\u200b \u200ba\u200b ", "a\u200b",
        " \ufb01\u200b\u00a6ab\u3000\u3000\uff45\u0301x ", "\u337b\u216b", "a\u6210\U0001F600",
        " a  \u00a6 b ", "\u00a6", " \u00a6 ", "a\u00a6", "\u00a6\u00a6", "ab <sep>abb", "<sep>", "<unk>",
        "\u2581", "\u2581\u2581a \u2581", "the the  thethe", "\u00df\u00df", "e\u0301\uff45\u0301\uff45",
        "\uff21\uff22\uff23", "XII\u216b12 \u2460\u2460", "Hello\tworld  ", "\x00a\x00", "..!?",
    ]
    pool = (
        ["\uff21", "\uff22", "\uff45", "\uff45\u0301", "e\u0301", "\ufb01", "\u2460", "\u216b", "\u337b", "\u00df",
         "\u3000", "\u00a0", "\t", "\n", "\u200b", "\u00a6", " ", " ", " ", "  ", "<sep>", "abb", "\u2581",
         "\u6210", "\U0001F600", "\u00e9", "H", "\x00", "\u0301"]
        + list("abcdefghijklmnopqrstuvwxyzABCIX0123456789.,!?|-'")
        + ["the", "ab", "fi", "12", "XII", "ss"]
    )
    rng = random.Random(seed)
    out = list(fixed)
    for _ in range(n_random):
        out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 24))))
    return out


def _hex(s: str) -> str:
    return s.encode("utf-8").hex() or "-"


def _models(models_root):
    found = {}
    for name, rel in MODELS.items():
        path = os.path.join(models_root, rel)
        if os.path.isfile(path):
            found[name] = path
    if not found:
        pytest.skip("no SentencePiece model under %s (set TOLK_MODELS)" % models_root)
    return found


def _corpora(data_root):
    corpora = {}
    for f in DEV_FILES:
        path = os.path.join(data_root, f)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                corpora[f] = fh.read().split("\n")[:500]
    corpora["tricky"] = tricky_corpus()
    return corpora


def _varint(buf, i):
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf):
    """(field number, value) of a serialized protobuf message (wire types 0, 1, 2, 5)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value = buf[i:i + n]
            i += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value = buf[i:i + n]
            i += n
        else:
            raise ValueError("wire type %d" % wire)
        yield key >> 3, value


def encode_with_offsets(sp, text):
    """The reference's pieces as (piece, id, begin, end), read from the serialized
    `SentencePieceText` (no protobuf package needed): `pieces` is field 2, and in each
    piece `piece` 1, `id` 2, `begin` 4, `end` 5."""
    ser = sp.encode(text, out_type="serialized_proto")
    out = []
    for field, value in _fields(ser):
        if field == 2:
            p = {1: b"", 2: 0, 4: 0, 5: 0}
            for f, v in _fields(value):
                if f in p:
                    p[f] = v
            out.append((p[1].decode("utf-8"), p[2], p[4], p[5]))
    return out


def _write_reference(path, models, corpora):
    """One block per (model, corpus): `#case <model> <corpus> <spm path>`, then per input
    `input_hex TAB pieces_hex... TAB ids... TAB decoded_hex TAB begin:end...`."""
    with open(path, "w", encoding="ascii") as out:
        for name, model_path in models.items():
            sp = spm.SentencePieceProcessor(model_file=model_path)
            for cname, lines in corpora.items():
                out.write("#case %s %s %s\n" % (name, cname, model_path.encode("utf-8").hex()))
                for line in lines:
                    pieces = sp.encode(line, out_type=str)
                    ids = sp.encode(line)
                    decoded = sp.decode(ids)
                    with_offsets = encode_with_offsets(sp, line)
                    assert [(p, i) for p, i, _, _ in with_offsets] == list(zip(pieces, ids)), line
                    out.write(
                        "%s\t%s\t%s\t%s\t%s\n"
                        % (
                            _hex(line),
                            " ".join(_hex(p) for p in pieces) or "-",
                            " ".join(map(str, ids)) or "-",
                            _hex(decoded),
                            " ".join("%d:%d" % (b, e) for _, _, b, e in with_offsets) or "-",
                        )
                    )


def _generated_models(tmp_path):
    """The generated models of fuzz/src/lib.rs, written by the Rust side: {name: path}."""
    out_dir = tmp_path / "generated_models"
    proc = _cargo_test("write_generated_models", {"TOLK_SPM_GENERATED_DIR": str(out_dir)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        "gen-" + os.path.splitext(f)[0]: str(out_dir / f)
        for f in sorted(os.listdir(out_dir))
        if f.endswith(".model")
    }


def _cargo_test(test_name, env_extra, timeout=1200):
    env = dict(os.environ)
    env.update(env_extra)
    cmd = ["cargo", "test", "--release", "--test", "sentencepiece", "--", "--ignored", "--exact", test_name, "--nocapture"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


def test_identity_with_reference(models_root, data_root, tmp_path):
    models = _models(models_root)
    corpora = _corpora(data_root)
    ref = tmp_path / "spm_reference.tsv"
    _write_reference(str(ref), models, corpora)
    proc = _cargo_test("compare_with_reference", {"TOLK_SPM_REFERENCE": str(ref)})
    for line in proc.stdout.splitlines():
        if line.startswith("spm-identity"):
            report(line)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "spm-identity" in proc.stdout, proc.stdout[-3000:]


def test_identity_with_reference_on_generated_models(tmp_path):
    """Pieces, ids, decoding and offsets of the 128 generated models (every combination
    of model type, byte fallback, whitespace flags and charsmap) on their own corpus."""
    models = _generated_models(tmp_path)
    assert len(models) == 128, sorted(models)
    ref = tmp_path / "spm_reference_generated.tsv"
    _write_reference(str(ref), models, {"generated": generated_corpus()})
    proc = _cargo_test("compare_with_reference", {"TOLK_SPM_REFERENCE": str(ref)})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("spm-identity")]
    total = same = same_offsets = 0
    for line in lines:
        m = re.search(r": (\d+)/(\d+) identical \(pieces, ids and decoding\), (\d+)/\d+ identical offsets", line)
        assert m, line
        same += int(m.group(1))
        total += int(m.group(2))
        same_offsets += int(m.group(3))
    report(
        "spm-identity generated models (%d): %d/%d identical (pieces, ids and decoding), %d/%d identical offsets"
        % (len(lines), same, total, same_offsets, total)
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert len(lines) == 128, proc.stdout[-3000:]


def test_speed_against_reference(models_root, data_root, tmp_path):
    models = _models(models_root)
    corpora = {k: v for k, v in _corpora(data_root).items() if k != "tricky"}
    if not corpora:
        pytest.skip("no dev data under %s (set TOLK_DATA)" % data_root)
    repeats = int(os.environ.get("TOLK_SPM_BENCH_REPEATS", "20"))
    for name, model_path in models.items():
        sp = spm.SentencePieceProcessor(model_file=model_path)
        for cname, lines in corpora.items():
            sp.encode(lines)  # warm up
            t0 = time.perf_counter()
            for _ in range(repeats):
                for line in lines:
                    sp.encode(line)
            py_s = time.perf_counter() - t0
            # The whole list in one call on one C++ thread: less Python overhead per line.
            try:
                t0 = time.perf_counter()
                for _ in range(repeats):
                    sp.encode(lines, num_threads=1)
                py_batch_s = time.perf_counter() - t0
            except TypeError:
                py_batch_s = float("nan")
            data = tmp_path / ("%s-%s.txt" % (name, cname))
            data.write_text("\n".join(lines), encoding="utf-8")
            proc = _cargo_test(
                "bench_encode",
                {"TOLK_SPM_BENCH_MODEL": model_path, "TOLK_SPM_BENCH_DATA": str(data), "TOLK_SPM_BENCH_REPEATS": str(repeats)},
            )
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            m = re.search(r"spm-bench seconds=([0-9.e+-]+)", proc.stdout)
            assert m, proc.stdout[-3000:]
            rust_s = float(m.group(1))
            n = len(lines) * repeats
            report(
                "spm-speed %s %s: sentencepiece (C++) %.0f lines/s per call, %.0f lines/s batched (1 thread); "
                "tolk %.0f lines/s (x%.2f, x%.2f)"
                % (name, cname, n / py_s, n / py_batch_s, n / rust_s, py_s / rust_s, py_batch_s / rust_s)
            )
