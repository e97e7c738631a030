"""Carrying a board across a judge's retirement (farm-winrate NEW --old-judge SUBSET), checked on real
data: the AlpacaEval annotations in ../shared/data of two judges on the same pairs (the same
reference, gpt4_1106_preview, and the same generators' outputs): `alpaca_eval_cot_gpt4_turbo_fn`
plays the retired judge, `weighted_alpaca_eval_gpt4_turbo` the new one.

For every generator both judged (rows whose generator_2 is their results_dir; pairs joined on
instruction_index, their lengths checked equal), and each subset size n: R times, a uniformly random
subset of n of the generator's pairs gets the old judge's verdicts; the PPI++ estimate (the new
judge's verdicts on every pair, the old judge's on the subset; farmkit/evaluate/ppi.py, what
farm-winrate --old-judge computes) and its 95% interval are compared with the old judge's win rate
on every pair (the truth here). Prints one JSON line per n: coverage over all generators and draws,
the worst generator's coverage, the mean interval width, and the same for the old judge's subset
alone; then the --target-se check: from a pilot of 50, 100 or 200 old-judge verdicts per generator, the subset
size predicted for a standard error of 2 points, and the standard error that size then gives over
the draws.

    python bench/retirement_coverage.py [--data ../shared/data] [--draws 2000] [--seed 0] [-o FILE]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path

import numpy as np
import orjson

from farmkit.evaluate.ppi import labels_for_se, ppi_mean
from farmkit.evaluate.winrate import win_values

OLD, NEW = "alpaca_eval_cot_gpt4_turbo_fn", "weighted_alpaca_eval_gpt4_turbo"
SIZES = (25, 50, 100, 200, 400)


def load(folder: Path, annotator: str) -> dict[str, dict[int, tuple[float, int, int]]]:
    """generator -> instruction_index -> (x, len_1, len_2), rows in their own results folder only."""
    rows: dict[str, dict[int, tuple[float, int, int]]] = {}
    with gzip.open(folder / "annotations" / f"{annotator}.jsonl.gz") as handle:
        records = [orjson.loads(line) for line in handle]
    records = [r for r in records if r["generator_2"] == r["results_dir"]]
    x = win_values(records, range(1, len(records) + 1))
    for record, value in zip(records, x.tolist(), strict=True):
        if value == value:
            rows.setdefault(record["generator_2"], {})[record["instruction_index"]] = (
                value,
                record["len_1"],
                record["len_2"],
            )
    return rows


def paired(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """generator -> (old judge's x, new judge's x) on the pairs both judged, same outputs."""
    old, new = load(folder, OLD), load(folder, NEW)
    pairs = {}
    for generator in sorted(set(old) & set(new)):
        if all(old[generator][i][1] == old[generator][i][2] for i in list(old[generator])[:20]):
            continue  # the reference judged against itself (equal lengths): not ranked
        common = [
            i
            for i in sorted(set(old[generator]) & set(new[generator]))
            if old[generator][i][1:] == new[generator][i][1:]  # the same two outputs
        ]
        if len(common) >= 400:
            pairs[generator] = (
                np.array([old[generator][i][0] for i in common]),
                np.array([new[generator][i][0] for i in common]),
            )
    return pairs


def coverage(
    pairs: dict[str, tuple[np.ndarray, np.ndarray]], n: int, draws: int, rng: np.random.Generator
) -> dict:
    covered, widths, human_covered, human_widths, worst = [], [], [], [], 1.0
    for old, new in pairs.values():
        truth = old.mean()
        subsets = np.argsort(rng.random((draws, len(old))), axis=1)[:, :n]
        figures = ppi_mean(old[subsets], new[subsets], np.broadcast_to(new, (draws, len(new))))
        hit = (figures["low"] <= truth) & (truth <= figures["high"])
        covered.append(hit)
        worst = min(worst, float(hit.mean()))
        widths.append(figures["high"] - figures["low"])
        alone = old[subsets]
        se = alone.std(axis=1, ddof=1) / np.sqrt(n)
        human_covered.append(np.abs(alone.mean(axis=1) - truth) <= 1.959964 * se)
        human_widths.append(2 * 1.959964 * se)
    return {
        "n_old_judge": n,
        "generators": len(pairs),
        "draws_per_generator": draws,
        "ppi_coverage": float(np.mean(covered)),
        "ppi_worst_generator_coverage": worst,
        "ppi_mean_width_points": 100 * float(np.mean(widths)),
        "subset_alone_coverage": float(np.mean(human_covered)),
        "subset_alone_mean_width_points": 100 * float(np.mean(human_widths)),
    }


def target_se_check(
    pairs: dict[str, tuple[np.ndarray, np.ndarray]], target: float, pilot_size: int, draws: int, rng
) -> dict:
    predicted, achieved = [], []
    for old, new in pairs.values():
        pilot = rng.permutation(len(old))[:pilot_size]
        n = labels_for_se(old[pilot], new[pilot], new, target)
        if n is None:
            continue
        subsets = np.argsort(rng.random((draws, len(old))), axis=1)[:, :n]
        figures = ppi_mean(old[subsets], new[subsets], np.broadcast_to(new, (draws, len(new))))
        predicted.append(n)
        achieved.append(float(figures["estimate"].std()))
    return {
        "target_se_points": 100 * target,
        "pilot": pilot_size,
        "generators": len(predicted),
        "predicted_n_median": float(np.median(predicted)),
        "predicted_n_range": [int(min(predicted)), int(max(predicted))],
        "achieved_se_points_median": 100 * float(np.median(achieved)),
        "achieved_se_points_range": [100 * min(achieved), 100 * max(achieved)],
    }


def measure(folder: Path, draws: int, seed: int, sizes=SIZES) -> list[dict]:
    rng = np.random.default_rng(seed)
    pairs = paired(folder)
    rows = [coverage(pairs, n, draws, rng) for n in sizes]
    rows += [target_se_check(pairs, 0.02, pilot, draws, rng) for pilot in (50, 100, 200)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("FARMKIT_SHARED_DATA", shared))
    )
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    rows = measure(args.data / "alpaca_eval", args.draws, args.seed)
    text = "".join(json.dumps(row) + "\n" for row in rows)
    print(text, end="")
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
