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

Then the length-controlled win rate across the retirement (farm-winrate --old-judge's ppi_lc_win_rate,
farmkit/evaluate/length_control.py ppi_length_controlled): for n in 50, 100, 200, 400 and each draw,
the prediction-powered GLM and the old judge's subset alone (the same GLM, lambda = 0), at the
instruction difficulties farm-winrate estimates from the new judge's whole board (56 models),
against the old judge's length-controlled win rate on every pair at the same difficulties.

    python bench/retirement_coverage.py [--data ../shared/data] [--draws 2000] [--lc-draws 500] [--seed 0] [-o FILE]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path

import numpy as np
import orjson

from farmkit.evaluate.length_control import (
    _scaled_length_difference,
    board_fits,
    estimate_difficulty,
    ppi_length_controlled,
)
from farmkit.evaluate.ppi import labels_for_se, ppi_mean
from farmkit.evaluate.winrate import win_values

OLD, NEW = "alpaca_eval_cot_gpt4_turbo_fn", "weighted_alpaca_eval_gpt4_turbo"
SIZES = (25, 50, 100, 200, 400)
LC_SIZES = (50, 100, 200, 400)


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


def paired(folder: Path, lengths: bool = False) -> dict[str, tuple[np.ndarray, ...]]:
    """generator -> (old judge's x, new judge's x) on the pairs both judged, same outputs; with
    lengths, also their instruction_index and len_2 - len_1."""
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
            if lengths:
                pairs[generator] += (
                    np.array(common),
                    np.array([old[generator][i][2] - old[generator][i][1] for i in common], float),
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


def board_difficulty(folder: Path) -> tuple[np.ndarray, dict[int, int]]:
    """The instruction difficulties farm-winrate estimates from the new judge's whole board (every
    generator against the reference, each in its own results folder, null verdicts left out), by item
    index, and the item index of each instruction_index."""
    rows = load(folder, NEW)
    index = {i: k for k, i in enumerate(sorted({i for by in rows.values() for i in by}))}
    items, scaled, x = [], [], []
    for by in rows.values():
        if all(length_1 == length_2 for _, length_1, length_2 in list(by.values())[:20]):
            continue  # the reference against itself
        items.append(np.array([index[i] for i in by]))
        scaled.append(
            _scaled_length_difference(np.array([b - a for _, a, b in by.values()], float))
        )
        x.append(np.array([value for value, _, _ in by.values()]))
    return estimate_difficulty(items, scaled, x, len(index)), index


def lc_coverage(
    pairs: dict[str, tuple[np.ndarray, ...]],
    difficulty: np.ndarray,
    index: dict[int, int],
    n: int,
    draws: int,
    rng: np.random.Generator,
) -> dict:
    """The length-controlled win rate across the retirement (what farm-winrate --old-judge prints as
    ppi_lc_win_rate): coverage of the old judge's length-controlled win rate on every pair (the GLM
    fitted to its verdicts on all of them, at the same instruction difficulties, the new judge's
    board's) by the 95% interval, over all generators and draws, and the mean width; the same for the
    old judge's subset alone (the same GLM and interval with lambda = 0)."""
    names = sorted(pairs)
    verdicts = [
        (np.array([index[int(i)] for i in pairs[g][2]]), pairs[g][3], pairs[g][1]) for g in names
    ]
    truth_fits = board_fits(
        "",
        [(i, d, pairs[g][0]) for (i, d, _), g in zip(verdicts, names, strict=True)],
        {},
        None,
        held=difficulty,
    )[0]
    truth = np.array([fit.figures()["length_controlled_win_rate"] for fit in truth_fits])
    # the penalties farm-winrate's own fit chooses on the new judge's verdicts, held in the PPI fit
    penalties = [fit.penalty for fit in board_fits("", verdicts, {}, None, held=difficulty)[0]]
    failed = 0
    hits = {"ppi": [], "alone": []}
    widths = {"ppi": [], "alone": []}
    for _ in range(draws):
        labels, alone = [], []
        for g in names:
            old, new = pairs[g][0], pairs[g][1]
            labelled = np.zeros(len(old), dtype=bool)
            labelled[rng.permutation(len(old))[:n]] = True
            lam = float(ppi_mean(old[labelled], new[labelled], new)["lambda"])
            labels.append((labelled, np.where(labelled, old, 0.0), lam))
            alone.append((labelled, np.where(labelled, old, 0.0), 0.0))
        for name, given in (("ppi", labels), ("alone", alone)):
            rows = ppi_length_controlled("", verdicts, given, difficulty, penalties)
            failed += sum(row is None for row in rows)  # counted as misses
            low = np.array([np.nan if row is None else row["ppi_lc_ci_low"] for row in rows])
            high = np.array([np.nan if row is None else row["ppi_lc_ci_high"] for row in rows])
            hits[name].append((low <= truth) & (truth <= high))
            widths[name].append(np.nan_to_num(high - low))
    ppi_hits = np.array(hits["ppi"])
    return {
        "lc": True,
        "n_old_judge": n,
        "generators": len(names),
        "draws_per_generator": draws,
        "old_judge_lc_win_rates": [round(float(t), 2) for t in truth],
        "ppi_lc_coverage": float(ppi_hits.mean()),
        "ppi_lc_worst_generator_coverage": float(ppi_hits.mean(axis=0).min()),
        "ppi_lc_mean_width_points": float(np.mean(widths["ppi"])),
        "subset_alone_lc_coverage": float(np.mean(hits["alone"])),
        "subset_alone_lc_mean_width_points": float(np.mean(widths["alone"])),
        "fits_not_converged": failed,
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


def measure_lc(folder: Path, draws: int, seed: int, sizes=LC_SIZES) -> list[dict]:
    """lc_coverage for each subset size (one GLM fit of each generator per draw and estimator)."""
    rng = np.random.default_rng(seed)
    difficulty, index = board_difficulty(folder)
    pairs = paired(folder, lengths=True)
    return [lc_coverage(pairs, difficulty, index, n, draws, rng) for n in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("FARMKIT_SHARED_DATA", shared))
    )
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument(
        "--lc-draws", type=int, default=500, help="draws of the length-controlled check (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    rows = measure(args.data / "alpaca_eval", args.draws, args.seed)
    if args.lc_draws:
        rows += measure_lc(args.data / "alpaca_eval", args.lc_draws, args.seed)
    text = "".join(json.dumps(row) + "\n" for row in rows)
    print(text, end="")
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
