"""Which CTranslate2 is the oracle for a compute type on this machine.

CTranslate2 multiplies with MKL on Intel CPUs and with oneDNN elsewhere (CT2_USE_MKL
overrides). Its int8 products are exact integer sums only where the library reaches the
int32 sum directly, with VNNI (`vpdpbusd`). Without VNNI (AVX2, AVX-512 without VNNI)
oneDNN's u8 x s8 products go through `vpmaddubsw`, whose int16 pair sums saturate (oneDNN's
"Nuances of int8 Computations"), and CTranslate2's int8 output then drifts from the exact
product's. Measured on an AVX2-only AMD EPYC (Zen 3), 2026-11-27, oneDNN against MKL
(`CT2_USE_MKL=1`, which multiplies exactly there, if slowly):

- zh-en int8 greedy, 200 verses: oneDNN agreed with CTranslate2's own float32 on 84
  sentences, MKL on 100, Tolk on 99; Tolk agreed with oneDNN on 74 and with MKL on 171;
- the random models of make_random_models.py, int8 greedy, 50 sentences each: Tolk agreed
  with oneDNN on 2-10 and with MKL on 49-50; int16 (which oneDNN lacks) with MKL on 48-50.

So where the process's CTranslate2 is not exact for a compute type, the oracle is
CTranslate2 with MKL, run in a subprocess (CTranslate2 picks its backend once per process).

MKL is exact for int8 there only off Intel, where it takes its generic code. On an Intel
CPU without VNNI its optimized int8 kernels saturate like oneDNN's at every level it
offers. Measured on an Intel Xeon Skylake-SP (family 6 model 85, AVX-512BW, no VNNI),
2026-11-28, zh-en int8 greedy, the first 64 verses token-identical to Tolk:
- MKL as is: 20;
- with `MKL_ENABLE_INSTRUCTIONS=AVX2`: 20; `SSE4_2`: 21;
- with `MKL_CBWR=AVX`: 23; `SSE4_2`: 23;
- oneDNN as is: 20; with `ONEDNN_MAX_CPU_ISA=AVX`: 26; `SSE41`: 22;
- MKL with `MKL_CBWR=COMPATIBLE` (its SSE2 branch, which sums int8 exactly): 36-38
  (beam 4: 34-35), at 2.3-2.6 s (3.5 s) a verse.
The random models agree with that last one on 46-50 of 50 sentences, as with MKL on AMD.
So on Intel without VNNI the oracle is MKL's COMPATIBLE branch. Its float kernels sum in
other orders than the AVX-512 ones Tolk follows, so the real model's bar is lower there
(`int8_min_identical`).
"""

import functools
import json
import os
import subprocess
import sys

# oneDNN's and MKL's names of instruction sets that include VNNI (ONEDNN_MAX_CPU_ISA,
# MKL_ENABLE_INSTRUCTIONS): a cap naming none of these keeps the products off VNNI.
_VNNI_CAPS = ("VNNI", "AMX", "BF16", "FP16", "AVX512_E1", "AVX512_E2", "AVX512_E3",
              "AVX512_E4", "AVX512_E5", "AVX2_E1", "ALL", "DEFAULT")


@functools.lru_cache(maxsize=None)
def _cpuinfo():
    """/proc/cpuinfo, read once (every bar and oracle choice asks)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_is_intel():
    return "GenuineIntel" in _cpuinfo()


def ct2_uses_mkl():
    """CTranslate2 multiplies with MKL on Intel CPUs (CT2_USE_MKL overrides), with oneDNN
    elsewhere; Tolk reproduces MKL's summation orders."""
    if os.environ.get("CT2_USE_MKL") is not None:
        return os.environ["CT2_USE_MKL"] not in ("0", "false", "False")
    return cpu_is_intel()


def _cpu_has_vnni():
    flags = set()
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return "avx512_vnni" in flags or "avx_vnni" in flags


def _backend_reaches_vnni():
    """VNNI is on the CPU and not capped away from the process's CTranslate2 backend."""
    if not _cpu_has_vnni():
        return False
    cap = os.environ.get("MKL_ENABLE_INSTRUCTIONS" if ct2_uses_mkl() else "ONEDNN_MAX_CPU_ISA")
    return cap is None or any(name in cap.upper() for name in _VNNI_CAPS)


def in_process_is_exact(compute_type):
    """Whether this process's CTranslate2 computes `compute_type` as the exact integer
    products Tolk computes (float32: always; int16: only MKL has it)."""
    if compute_type.startswith("int8"):
        return _backend_reaches_vnni()
    if compute_type == "int16":
        return ct2_uses_mkl()
    return True


def oracle_env(compute_type):
    """None: the in-process CTranslate2 is the oracle; else the environment of the
    subprocess that is (MKL)."""
    if in_process_is_exact(compute_type):
        return None
    if compute_type.startswith("int8") and _int8_oracle_is_mkl_compatible():
        return {"CT2_USE_MKL": "1", "MKL_CBWR": "COMPATIBLE"}
    return {"CT2_USE_MKL": "1"}


def _int8_oracle_is_mkl_compatible():
    """The int8 oracle is MKL's COMPATIBLE branch: on Intel, where no VNNI is reached."""
    return cpu_is_intel() and not in_process_is_exact("int8")


def describe(compute_type):
    """A few words on the oracle, for reports."""
    env = oracle_env(compute_type)
    if env is None:
        return "CTranslate2 (%s, in process)" % ("MKL" if ct2_uses_mkl() else "oneDNN")
    env = ",".join("%s=%s" % kv for kv in sorted(env.items()))
    return "CTranslate2 with MKL (%s, subprocess; %s in process is not exact for %s here)" % (
        env, "MKL" if ct2_uses_mkl() else "oneDNN", compute_type)


def int8_min_identical():
    """Share of sentences token-identical to the int8 oracle, by beam size. int8 decoding
    flips on the last bit of any float operation, and Tolk follows MKL's summation orders
    on Intel: 96-98% against MKL on Intel; 83% / 73% against oneDNN with VNNI (AMD Zen 5);
    84% / 77% (first 64 verses) against MKL on an AMD CPU, whose float kernels sum in
    other orders (Zen 3); 56-59% / 53-55% against MKL's COMPATIBLE branch (Intel without VNNI)."""
    if ct2_uses_mkl() and cpu_is_intel() and in_process_is_exact("int8"):
        return {1: 0.92, 4: 0.92}
    if _int8_oracle_is_mkl_compatible():
        # Measured 56-59% / 53-55% (first 64 verses, Skylake-SP): exact int8, other float orders.
        return {1: 0.5, 4: 0.45}
    return {1: 0.75, 4: 0.65}


def int8_bleu_tolerance(total):
    """How far Tolk's int8 BLEU may be from the int8 oracle's on `total` verses. Where the
    oracle agrees on most sentences, 0.3 + 30 / total. Against MKL's COMPATIBLE branch
    about 40% of the sentences differ, and BLEU moves by more: the vmap test's 100 verses
    gave +0.76 greedy and -0.76 beam 4 (Skylake-SP, 2026-11-28)."""
    if _int8_oracle_is_mkl_compatible():
        return 0.3 + 70.0 / total
    return 0.3 + 30.0 / total


class Result:
    """What translate() returns per example: CTranslate2's fields that the tests read."""

    def __init__(self, hypotheses, scores):
        self.hypotheses = hypotheses
        self.scores = scores


_SCRIPT = r"""
import json, sys
import ctranslate2
job = json.load(sys.stdin)
translator = ctranslate2.Translator(job["model"], device="cpu", compute_type=job["compute_type"],
                                    intra_threads=1)
results = translator.translate_batch(job["source"], **job["kwargs"])
json.dump([[r.hypotheses, r.scores] for r in results], sys.stdout)
"""


def translate_in_subprocess(env, model, compute_type, source, **kwargs):
    """CTranslate2's translate_batch on a new translator in a new process with `env` added."""
    job = {"model": model, "compute_type": compute_type, "source": source, "kwargs": kwargs}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], input=json.dumps(job), capture_output=True,
                          text=True, env=dict(os.environ, **env), timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError("CTranslate2 oracle (%s) failed: %s" % (env, proc.stderr[-2000:]))
    return [Result(h, s) for h, s in json.loads(proc.stdout)]
