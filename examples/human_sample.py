"""A seeded random sample of the pairs a simulated pool judged, as plain pairs for farm-label.

    python human_sample.py SIM_PREFS... -n N --seed S -o PAIRS

SIM_PREFS: preference records (farm-annotate's, every system against the reference). PAIRS keeps
what people need to see and what ties their answer back to the simulated verdict (id, instruction,
input, the two outputs and their generators); the pool's verdict and provenance stay out, so the
annotators' records carry none of them. Each distinct pair is drawn once, uniformly: prediction-powered
win rates (farm-winrate --humans) assume the humans' pairs are a random sample of the judged ones.
"""

from __future__ import annotations

import argparse
import random
import sys

from farmkit.core.io import iter_json, write_records

PAIR_FIELDS = ("id", "instruction", "input", "output_1", "output_2", "generator_1", "generator_2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sim_prefs", nargs="+")
    parser.add_argument("-n", type=int, default=40, help="how many pairs (all when fewer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    pairs: dict[tuple, dict] = {}
    for path in args.sim_prefs:
        for _, record in iter_json(path):
            pair = {field: record[field] for field in PAIR_FIELDS if field in record}
            key = tuple(
                pair.get(field) or "" for field in ("instruction", "input", "output_1", "output_2")
            )
            pairs.setdefault(key, pair)
    chosen = random.Random(args.seed).sample(sorted(pairs), min(args.n, len(pairs)))
    write_records((pairs[key] for key in chosen), args.output)
    print(f"human_sample.py: {len(chosen)} of {len(pairs)} pairs -> {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
