#!/usr/bin/env bash
# The test command: installs what the tests need (pip, npm), then Rust unit tests (the CUDA
# kernels compiled by NVRTC included; the GPU checks are ffi-tests/gpu.sh), C tests
# against include/tolk.h (under valgrind when available), the C example, and the Python
# tests against the oracles (CTranslate2, the Bergamot engine, numpy references).
# Models: $TOLK_MODELS (default models/, filled by scripts/fetch_models.sh, or ../shared/models).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TOLK_MODELS:-}" ]; then
    if [ -d models/zh-en-ct2 ]; then export TOLK_MODELS="$PWD/models";
    elif [ -d ../shared/models/zh-en-ct2 ]; then export TOLK_MODELS="$(cd ../shared/models && pwd)"; fi
fi
if [ -z "${TOLK_DATA:-}" ]; then
    if [ -d data ] && [ -f data/dev-matthew.zh ]; then export TOLK_DATA="$PWD/data";
    elif [ -d ../shared/data ]; then export TOLK_DATA="$(cd ../shared/data && pwd)"; fi
fi

echo "== test dependencies: Python packages (the CTranslate2 oracle, BLEU, numpy references), the Bergamot engine (npm)"
python3 -m pip install -q --disable-pip-version-check "ctranslate2==4.8.5" sentencepiece sacrebleu pytest numpy
if command -v npm >/dev/null 2>&1; then
    npm install --silent --no-audit --no-fund --prefix .cache/bergamot-node "@browsermt/bergamot-translator@0.4.9"
else
    echo "npm not found: the Bergamot oracle test will be skipped" >&2
fi

echo "== NVRTC (pip), so that a test compiles the CUDA kernels even where there is no GPU"
if python3 -m pip install -q --disable-pip-version-check nvidia-cuda-nvrtc-cu12; then
    NVRTC_LIB="$(python3 -c 'import nvidia.cuda_nvrtc as m; print(m.__path__[0])')/lib"
    export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    echo "nvidia-cuda-nvrtc-cu12 not installed: the CUDA kernel compilation test will say so and pass" >&2
fi

# The tests compare CPU results with CPU oracles: "auto" must not pick a GPU where there is
# one (ffi-tests/gpu.sh checks the GPU).
export TOLK_DEVICE=cpu

echo "== cargo build (release library, examples)"
cargo build --release --lib --examples

echo "== C example"
make -C examples-c

echo "== Rust unit tests and C API tests (cargo test)"
cargo test --release

echo "== Python parity tests against CTranslate2 (pytest)"
python3 -m pytest -q tests/python
