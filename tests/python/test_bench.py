"""The README's benchmark command runs: bench/bench.py on a few verses, both engines, two
alternating rounds, writes a table whose rows carry each round's time and keep the best;
bench/paired.py, which times both engines in turns inside one process; bench/load_bench.py,
which times their model loads."""
import json
import os
import subprocess
import sys

import pytest

from conftest import data_root_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_data():
    """The folder of the dev verses, or a skip when they or the benchmarks' packages are missing."""
    pytest.importorskip("sentencepiece")
    pytest.importorskip("sacrebleu")
    data = data_root_path()
    if not os.path.exists(os.path.join(data, "dev-matthew.zh")):
        pytest.skip("no dev-matthew data")
    return data


def test_bench_alternates_rounds_and_keeps_each_engines_best(tmp_path, tolk, ctranslate2, zh_en_model):
    data = bench_data()
    out = tmp_path / "bench.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "bench.py"), "--limit", "4", "--beams", "1",
           "--compute-types", "int8", "--rounds", "2", "--models", os.path.dirname(zh_en_model), "--data", data,
           "--json", str(out)]
    env = dict(os.environ, TOLK_LIB=tolk.library_path())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Engines alternate: Tolk, CTranslate2, Tolk, CTranslate2.
    order = [line.split(" int8")[0] for line in proc.stderr.splitlines() if line.startswith("running ")]
    assert order == ["running Tolk", "running CTranslate2"] * 2, order
    doc = json.loads(out.read_text())
    assert doc["meta"]["rounds"] == 2
    rows = {r["engine"]: r for r in doc["rows"]}
    assert set(rows) == {"tolk", "ct2"}, doc["rows"]
    for r in rows.values():
        # The row is the fastest round's, its own timings included.
        assert len(r["round_seconds"]) == 2 and r["seconds"] == min(r["round_seconds"]) and r["times"] == [r["seconds"]], r
        assert r["tokens"] > 0 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
    assert rows["tolk"]["tolk_over_ct2"] == pytest.approx(rows["tolk"]["tokens_per_s"] / rows["ct2"]["tokens_per_s"])
    assert "in each of 2 alternating rounds" in proc.stdout


def test_paired_bench_times_both_engines_chunk_by_chunk(tmp_path, tolk, ctranslate2, zh_en_model):
    """bench/paired.py: both engines in one process, each engine's time the sum of each
    chunk's fastest turn, and the ratio and JSON consistent with it."""
    data = bench_data()
    out = tmp_path / "paired.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "paired.py"), "--limit", "6", "--chunk", "4", "--repeat", "2",
           "--compute-type", "int8", "--models", os.path.dirname(zh_en_model), "--data", data, "--json", str(out)]
    env = dict(os.environ, TOLK_LIB=tolk.library_path())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["verses"] == 6 and doc["meta"]["repeat"] == 2
    rows = doc["rows"]
    for r in rows.values():
        # Two chunks (4 + 2 verses); the total is the sum of each chunk's fastest turn.
        assert len(r["chunk_seconds"]) == 2 and r["seconds"] == pytest.approx(sum(r["chunk_seconds"]))
        assert r["tokens"] > 0 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
    assert doc["tolk_over_ct2"] == pytest.approx(rows["tolk"]["tokens_per_s"] / rows["ct2"]["tokens_per_s"])
    assert 0.0 <= doc["same_as_ct2"] <= 1.0
    assert f"Tolk/CT2 tokens/s: {doc['tolk_over_ct2']:.2f}x" in proc.stdout


def test_load_bench_times_both_engines_first_and_reloaded(tmp_path, tolk, ctranslate2, zh_en_model):
    """bench/load_bench.py: each engine's first load in fresh processes and its reloads, the
    rows and ratios in the JSON consistent with the table."""
    out = tmp_path / "load.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "load_bench.py"), "--compute-types", "int8", "--rounds", "2",
           "--reloads", "1", "--models", os.path.dirname(zh_en_model), "--json", str(out)]
    env = dict(os.environ, TOLK_LIB=tolk.library_path())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"tolk", "ct2"}, rows
    for r in rows.values():
        assert r["compute_type"] == "int8" and r["first_ms"] > 0 and r["reload_ms"] > 0, r
    tolk_row = rows["tolk"]
    assert tolk_row["reload_over_ct2"] == pytest.approx(tolk_row["reload_ms"] / rows["ct2"]["reload_ms"])
    assert f"| {tolk_row['first_over_ct2']:.2f}x | {tolk_row['reload_over_ct2']:.2f}x |" in proc.stdout


def test_ab_alternates_a_switch_in_one_process(zh_en_model):
    """examples/ab.rs (the in-process A/B of a tuning switch) runs both settings each round,
    prints the machine and the gains, and refuses an unknown switch by name."""
    data = data_root_path()
    if not os.path.exists(os.path.join(data, "dev-matthew.zh")):
        pytest.skip("no dev-matthew data")
    ab = os.path.join(ROOT, "target", "release", "examples", "ab")
    if not os.path.exists(ab):
        pytest.skip("examples not built (cargo build --release --examples)")
    cmd = [ab, "--switch", "attention-prefetch", "--verses", "3", "--rounds", "2", "--beam", "1", "--model", zh_en_model,
           "--source", os.path.join(data, "dev-matthew.zh")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "Tolk's ISA" in lines[0] and "greedy, 3 verses, 2 rounds; switch attention-prefetch" in lines[0], lines
    rounds = [l for l in lines if l.startswith("round ")]
    assert [r.split(":")[0] for r in rounds] == ["round 1", "round 2"], lines
    for r in rounds:
        off, on = (float(r.split(f"{k} ")[1].split()[0].rstrip(",")) for k in ("off", "on"))
        assert off > 0 and on > 0, r
    assert lines[-1].startswith("on against off: mean ") and lines[-1].endswith("of 2 rounds"), lines
    bad = subprocess.run([ab, "--switch", "no-such"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown switch \"no-such\"; one of int8-hexadecets, int8-panels-outer, attention-prefetch" in bad.stderr, bad.stderr
