"""A seeded random sample of the pairs a simulated pool judged, as plain pairs for farm-label.

    python human_sample.py SIM_PREFS... --per-system N --seed S -o PAIRS

SIM_PREFS: preference records (farm-annotate's, every system against the reference). PAIRS keeps
what people need to see and what ties their answer back to the simulated verdict (id, instruction,
input, the two outputs and their generators); the pool's verdict and provenance stay out, so the
annotators' records carry none of them. Each distinct pair is drawn once, uniformly within its system
(generator_2): prediction-powered win rates (farm-winrate --humans) assume each system's labelled pairs
are a random sample of its judged ones, and need about 40 of them per system for their interval
(farm-winrate flags fewer as small_sample). `-n N` draws N in all instead, over every system.
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
    parser.add_argument("-n", type=int, help="how many pairs in all (all when fewer)")
    parser.add_argument(
        "--per-system", type=int, default=40, help="how many pairs of each system (all when fewer)"
    )
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
    draw = random.Random(args.seed)
    if args.n is not None:
        chosen = draw.sample(sorted(pairs), min(args.n, len(pairs)))
    else:
        systems: dict[str, list[tuple]] = {}
        for key in sorted(pairs):
            systems.setdefault(str(pairs[key].get("generator_2")), []).append(key)
        chosen = [
            key
            for name in sorted(systems)
            for key in draw.sample(systems[name], min(args.per_system, len(systems[name])))
        ]
    write_records((pairs[key] for key in chosen), args.output)
    print(f"human_sample.py: {len(chosen)} of {len(pairs)} pairs -> {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
