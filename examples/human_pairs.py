"""Split a human-labelled preference file into the pairs a judge sees and the humans' labels.

    python human_pairs.py HUMANS PAIRS_OUT LABELS_OUT [--n N] [--seed S]

HUMANS is either PandaLM's test set (a JSON list with response1, response2 and annotator1..k,
labels 0 tie, 1, 2) or farmkit preference records (JSON or JSONL, .gz allowed) with output_1,
output_2 and a human `preference`, one record per human label or several label fields
(annotator1..k). Each distinct pair gets a `pair_id`; PAIRS_OUT holds the pairs without any label
(for farm-annotate), LABELS_OUT one record per human label (pair_id, output_1, output_2,
preference, annotator) for farm-correlate --humans. With --n, a seeded sample of N pairs; with
--both-orders, each pair also with its outputs swapped (and its labels mirrored), so that
farm-correlate measures how often a judge's verdict flips with the order.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys

from farmkit.core.io import iter_json, write_records

_WIDE_LABEL = re.compile(r"^annotator\d+$")


def _label(value):
    """1, 2 or 1.5 (tie) from PandaLM's 0/1/2 or farmkit's 1/2/1.5; None when unusable."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if number == 0 or number == 1.5:
        return 1.5
    return number if number in (1.0, 2.0) else None


def read_pairs(path: str) -> dict[str, dict]:
    """pair_id -> {instruction, input, output_1, output_2, labels: [(annotator, label)]}."""
    pairs: dict[str, dict] = {}
    for _, record in iter_json(path):
        first = record.get("output_1", record.get("response1"))
        second = record.get("output_2", record.get("response2"))
        if not isinstance(first, str) or not isinstance(second, str):
            continue  # (PandaLM has a few non-text responses)
        instruction, extra = record.get("instruction", ""), record.get("input") or ""
        digest = hashlib.sha256(
            "\x00".join([instruction, extra, first, second]).encode()
        ).hexdigest()[:16]
        pair = pairs.setdefault(
            digest,
            {"instruction": instruction, "input": extra, "output_1": first, "output_2": second},
        )
        labels = pair.setdefault("labels", [])
        wide = sorted(k for k in record if _WIDE_LABEL.match(k))
        if wide:
            labels.extend((k, _label(record[k])) for k in wide)
        else:
            # an unnamed label is nobody else's: no Cohen's kappa between strangers
            who = record.get("annotator") or record.get("worker_id") or f"{digest}:{len(labels)}"
            labels.append((str(who), _label(record.get("preference"))))
        pair["labels"] = [(who, label) for who, label in labels if label is not None]
    return {k: v for k, v in pairs.items() if v["labels"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("humans")
    parser.add_argument("pairs_out")
    parser.add_argument("labels_out")
    parser.add_argument("--n", type=int, default=0, help="sample this many pairs (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--both-orders",
        action="store_true",
        help="also write each pair with its outputs swapped (labels mirrored), for the flip rate",
    )
    args = parser.parse_args(argv)
    pairs = read_pairs(args.humans)
    if not pairs:
        print(f"human_pairs.py: no labelled pairs in {args.humans}", file=sys.stderr)
        return 1
    ids = sorted(pairs)
    if 0 < args.n < len(ids):
        ids = sorted(random.Random(args.seed).sample(ids, args.n))
    n_pairs = len(ids)
    if args.both_orders:
        for i in list(ids):
            pair = pairs[i]
            pairs[f"{i}-swapped"] = {
                **pair,
                "output_1": pair["output_2"],
                "output_2": pair["output_1"],
                "labels": [(who, 3.0 - label) for who, label in pair["labels"]],
            }
            ids.append(f"{i}-swapped")
    text = ("instruction", "input", "output_1", "output_2")
    write_records(({"pair_id": i, **{k: pairs[i][k] for k in text}} for i in ids), args.pairs_out)
    write_records(
        (
            {"pair_id": i, **{k: pairs[i][k] for k in text}, "preference": label, "annotator": who}
            for i in ids
            for who, label in pairs[i]["labels"]
        ),
        args.labels_out,
    )
    orders = " (each in both orders)" if args.both_orders else ""
    print(f"human_pairs.py: {n_pairs} pairs{orders} from {args.humans}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
