"""farm-winrate's length-controlled win rate against AlpacaEval's published one, on the real
annotations in ../shared/data that have a published LC column (every model whose annotations are
there): AlpacaEval 2's weighted gpt4_turbo judge against gpt4_1106_preview, and AlpacaEval 1's gpt4
judge against text_davinci_003.

Prints, for the length-controlled win rate and for the raw win rate, the Spearman correlation with
the published LC column, the mean and largest absolute difference, and the models prompted or built
to game length (concise, verbose, gamed) beside their published values. Instruction difficulties are
estimated from the annotations themselves (AlpacaEval downloads its own).

    python bench/lc_against_alpacaeval.py [--data ../shared/data] [--annotator NAME]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import time
from pathlib import Path

import numpy as np
import orjson
from scipy import stats

from farmkit.evaluate.winrate import WinrateTable

BOARDS = {  # annotator -> its published leaderboard
    "weighted_alpaca_eval_gpt4_turbo": "data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv",
    "alpaca_eval_gpt4": "data_AlpacaEval/alpaca_eval_gpt4_leaderboard.csv",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    parser.add_argument(
        "--annotator", choices=sorted(BOARDS), action="append", help="default: both"
    )
    args = parser.parse_args()
    for annotator in args.annotator or BOARDS:
        measure(args.data / "alpaca_eval", annotator)


def measure(folder: Path, annotator: str) -> None:
    published = {
        row[""]: row for row in csv.DictReader(open(folder / "leaderboards" / BOARDS[annotator]))
    }
    # the upstream data errors (data/README.md): keep rows that are what their folder says they are
    records = [
        r
        for r in map(orjson.loads, gzip.open(folder / "annotations" / f"{annotator}.jsonl.gz"))
        if r["generator_2"] == r["results_dir"] and r["annotator"] == annotator
    ]
    started = time.perf_counter()
    table = WinrateTable()
    table.add_records(records)
    rows = {row["generator"]: row for row in table.rows()}
    seconds = time.perf_counter() - started
    common = sorted(m for m in rows if published.get(m, {}).get("length_controlled_winrate"))
    theirs = np.array([float(published[m]["length_controlled_winrate"]) for m in common])
    print(
        f"{annotator}: {len(records)} verdicts, {len(rows)} models, {len(common)} with a published LC; {seconds:.1f} s; "
        f"difficulty {table.lc_notes[0]}"
    )
    for column in ("length_controlled_win_rate", "win_rate"):
        ours = np.array([rows[m][column] for m in common])
        gap = np.abs(ours - theirs)
        print(
            f"{column:27s} spearman {stats.spearmanr(ours, theirs)[0]:.3f}  mean |diff| {gap.mean():.2f}  "
            f"max |diff| {gap.max():.2f} ({common[int(gap.argmax())]})"
        )
    ranks = {  # 1 = best, among the models with a published LC
        column: {m: r for r, m in enumerate(sorted(common, key=lambda m: -values(m)), start=1)}
        for column, values in (
            ("ours", lambda m: rows[m]["length_controlled_win_rate"]),
            ("theirs", lambda m: float(published[m]["length_controlled_winrate"])),
        )
    }
    print(
        f"{'model':36s} {'raw':>6s} {'LC':>6s} {'published LC':>12s} {'rank':>5s} {'published rank':>14s}"
    )
    for name in common:
        if (
            any(word in name for word in ("concise", "verbose", "gamed"))
            or f"{name}_concise" in rows
        ):
            row = rows[name]
            print(
                f"{name:36s} {row['win_rate']:6.1f} {row['length_controlled_win_rate']:6.1f} "
                f"{float(published[name]['length_controlled_winrate']):12.1f} "
                f"{ranks['ours'][name]:5d} {ranks['theirs'][name]:14d}"
            )


if __name__ == "__main__":
    main()
