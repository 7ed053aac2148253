#!/usr/bin/env python3
"""Translate tokenized lines from stdin with Tolk (through the ctypes binding).

Each input line is one sentence of space-separated tokens (for the zh-en model,
SentencePiece pieces); each output line is the translation's tokens, space
separated.  Example, from the repository root::

    python3 -c "import sentencepiece as s; \\
        sp = s.SentencePieceProcessor(model_file='models/zh-en-ct2/sentencepiece.model'); \\
        print(' '.join(sp.encode('你好，世界。', out_type=str)))" \\
      | python3 examples-c/python/translate_tokens.py --model models/zh-en-ct2 --beam 4 --detok

Set TOLK_LIB to use a library other than target/release/libtolk.so.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tolk  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="CTranslate2 model directory")
    ap.add_argument("--beam", type=int, default=2, help="beam size (1 = greedy), default 2")
    ap.add_argument("--compute-type", default="default",
                    help="default, auto, float32, int8, int8_float32, int16")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads")
    ap.add_argument("--batch", type=int, default=32, help="max_batch_size (examples)")
    ap.add_argument("--max-decoding-length", type=int, default=256)
    ap.add_argument("--scores", action="store_true", help="prefix each line with its score")
    ap.add_argument("--detok", action="store_true",
                    help="join SentencePiece pieces into text ('▁' -> space)")
    args = ap.parse_args(argv)

    lines = [line.split() for line in sys.stdin.read().splitlines()]
    start = time.perf_counter()
    try:
        with tolk.Model(args.model) as model, tolk.Translator(
            model, compute_type=args.compute_type, intra_threads=args.threads
        ) as translator:
            results = translator.translate_batch(
                lines,
                beam_size=args.beam,
                max_batch_size=args.batch,
                max_decoding_length=args.max_decoding_length,
                return_scores=args.scores,
            )
    except tolk.TolkError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start

    out_tokens = 0
    for res in results:
        toks = res.hypotheses[0] if res.hypotheses else []
        out_tokens += len(toks)
        text = "".join(toks).replace("\u2581", " ").strip() if args.detok else " ".join(toks)
        if args.scores:
            text = "%.4f\t%s" % (res.scores[0] if res.scores else float("nan"), text)
        print(text)
    print(
        "%d sentences, %d target tokens in %.2f s (tolk %s)"
        % (len(lines), out_tokens, elapsed, tolk.version()),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
