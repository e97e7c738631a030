"""Print the table of `make methods-at-equal-budget`: one row per method, from what the methods
leave behind.

    python budget.py --run NAME=RUN --answers NAME=FILE ... [-o rows.jsonl]

RUN is a method's output folder (its meta.json `budget`, its metrics.jsonl) or farm-bon's --metrics
file; FILE its answers to the val prompts scored by the reward model (farm-sample | farm-score, or
farm-bon's output). Columns, per method at its last gold-judged checkpoint (best-of-n: its largest n):
- gold win rate: the gold annotator's win rate (%) against the SFT model's answers (--gold), and se
  its standard error (a 95% interval is about 2 se either side);
- surrogate: the mean reward-model score of its answers to the val prompts (best-of-n: of the best
  of its largest n);
- KL: to the SFT model, measured on the gold answers (best-of-n: log n - (n - 1) / n);
- length: the gold answers' mean length in tokens;
- labels, tokens sampled, wall s: the budget (farmkit.train.budget; best-of-n: its --metrics row).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

from farmkit.core.io import RecordWriter, read_records
from farmkit.core.runs import read_metrics
from farmkit.evaluate.boards import table_text

COLUMNS = [
    "method",
    "gold win rate",
    "se",
    "surrogate",
    "KL",
    "length",
    "labels",
    "tokens sampled",
    "wall s",
]


def pairs(values: list[str]) -> dict[str, str]:
    found = {}
    for value in values:
        name, _, path = value.partition("=")
        found[name] = path
    return found


def row(name: str, run: str, answers: str) -> dict[str, Any]:
    rows = read_metrics(run)
    judged = [r for r in rows if r.get("gold_win_rate") is not None]
    if not judged:
        raise SystemExit(f"{run}: no metrics row with gold figures (was it run with --gold?)")
    last = judged[-1]
    meta_path = Path(run) / "meta.json"
    budget = json.loads(meta_path.read_text())["budget"] if meta_path.is_file() else last
    records = list(read_records(answers))
    if "best_of" in (records[0] if records else {}):
        records = [r for r in records if r["best_of"] == last["n"]]
    return {
        "method": name if "n" not in last else f"{name} (n={last['n']})",
        "gold win rate": last["gold_win_rate"],
        "se": last.get("gold_win_rate_se"),
        "surrogate": fmean(float(r["reward"]) for r in records),
        "KL": last["gold_kl"],
        "length": last["gold_answer_length"],
        "labels": budget.get("labels_used"),
        "tokens sampled": budget.get("tokens_sampled"),
        "wall s": budget.get("wall_seconds", last.get("elapsed_s")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", default=[], metavar="NAME=RUN")
    parser.add_argument("--answers", action="append", default=[], metavar="NAME=FILE")
    parser.add_argument("-o", "--output", help="Also write the rows as JSONL here.")
    args = parser.parse_args()
    runs, answers = pairs(args.run), pairs(args.answers)
    table = [row(name, run, answers[name]) for name, run in runs.items()]
    if args.output:
        with RecordWriter(args.output) as writer:
            writer.write_all(table)
    sys.stdout.write(table_text(table, COLUMNS))


if __name__ == "__main__":
    main()
