#!/usr/bin/env python3
"""Translate a short Chinese paragraph with Tolk's text API (text in, text out).

The library finds the SentencePiece model in the model package (for the zh-en model,
``sentencepiece.model`` beside ``model.bin``), cuts the text into sentences, translates
them and puts the translations back between the source's own line breaks.  Usage::

    cargo build --release
    python3 examples-c/python/translate_text.py [MODEL_DIR]

MODEL_DIR defaults to $TOLK_MODELS/zh-en-ct2, else ../shared/models/zh-en-ct2 relative
to the repository root.  Set TOLK_LIB to use a library other than
target/release/libtolk.so.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tolk  # noqa: E402

PARAGRAPH = "耶稣看见这许多的人，就上了山。他既已坐下，门徒到他跟前来。\n他就开口教训他们。"


def default_model_dir() -> str:
    repo = os.path.abspath(os.path.join(HERE, "..", ".."))
    models = os.environ.get("TOLK_MODELS")
    if models:
        return os.path.join(os.path.abspath(os.path.join(repo, models)), "zh-en-ct2")
    return os.path.abspath(os.path.join(repo, "..", "shared", "models", "zh-en-ct2"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    model_dir = argv[0] if argv else default_model_dir()
    try:
        with tolk.Translator(model_dir, compute_type="default") as translator:
            doc = translator.translate_text(PARAGRAPH, beam_size=4, return_sentences=True,
                                            return_scores=True)
    except tolk.TolkError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    print("source:\n%s\n" % PARAGRAPH)
    print("translation:\n%s\n" % doc.text)
    print("sentences (source span -> target span, score):")
    for s in doc.sentences:
        print("  %s %s\n    -> %s %s  (%.3f)" % (s.source_span, s.source, s.target_span, s.target,
                                                s.score))
    return 0


if __name__ == "__main__":
    sys.exit(main())
