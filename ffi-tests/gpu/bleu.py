#!/usr/bin/env python3
"""Corpus BLEU of HYP against REF (one sentence per line), with sacrebleu when it is
installed, else a plain BLEU-4 (13a-like tokenization, brevity penalty): the GPU machine
may have no pip packages, and gpu.sh compares BLEU figures of one run with each other.
usage: bleu.py HYP REF"""
import math
import re
import sys
from collections import Counter


def tokenize(line):
    line = re.sub(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])", r" \1 ", line)
    line = re.sub(r"([^0-9])([\.,])", r"\1 \2 ", line)
    line = re.sub(r"([\.,])([^0-9])", r" \1 \2", line)
    line = re.sub(r"([0-9])(-)", r"\1 \2 ", line)
    return line.split()


def plain_bleu(hyps, refs):
    matches, totals = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        h, r = tokenize(h), tokenize(r)
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(4):
            hc = Counter(tuple(h[i:i + n + 1]) for i in range(len(h) - n))
            rc = Counter(tuple(r[i:i + n + 1]) for i in range(len(r) - n))
            matches[n] += sum(min(c, rc[g]) for g, c in hc.items())
            totals[n] += max(len(h) - n, 0)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    brevity = min(0.0, 1 - ref_len / max(hyp_len, 1))
    return 100 * math.exp(log_precision + brevity)


def main():
    hyps = open(sys.argv[1], encoding="utf-8").read().splitlines()
    refs = open(sys.argv[2], encoding="utf-8").read().splitlines()[: len(hyps)]
    try:
        import sacrebleu

        print("%.2f" % sacrebleu.corpus_bleu(hyps, [refs]).score)
    except ImportError:
        print("%.2f" % plain_bleu(hyps, refs))


if __name__ == "__main__":
    main()
