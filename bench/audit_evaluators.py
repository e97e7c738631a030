"""farm-audit's figures against AlpacaEval's evaluators' leaderboard, on the shared data.

The leaderboard's columns Bias, Variance, Proba. prefer longer, Proba. prefer lists and Proba. prefer
1 are computed on the 648 pairs of AlpacaFarm's human cross-annotations, each judge asked 4 times. The
shared data hold those 648 pairs' texts (gpt4_b1_seeds: a GPT-4 judge's four runs, a judge the board
does not list) but not the human labels nor the listed judges' runs on them, so:
- `longest` (AlpacaEval's rule: output_1 when it is longer in characters, else output_2) is rebuilt
  on the 648 pairs, given in four runs: every column but Bias (which needs the humans) is compared;
- gpt4_b1's four runs are audited with the same code (no published row: its figures are given with
  farm-correlate's, whose definitions of the length and list preferences differ);
- the judges whose eval-set annotations are shared (805 instructions x their models, against a
  reference; lengths kept, texts removed) get P(prefers longer) on those pairs: other pairs than the
  board's, so the difference measures the pairs, not the definition.

    python bench/audit_evaluators.py [--data ../shared/data] [--out bench/results/audit-evaluators.md]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path

import orjson

from farmkit.annotate.pairs import Item
from farmkit.evaluate.audit import audit
from farmkit.evaluate.correlate import Annotations, alpaca_eval_preferences, judge_summary

COLUMNS = (
    ("Variance", "variance", 100),
    ("Proba. prefer longer", "p_prefers_longer", 1),
    ("Proba. prefer lists", "p_prefers_lists", 1),
    ("Proba. prefer 1", "p_prefers_1", 1),
)
EVAL_SET_JUDGES = {  # shared annotations -> the board's row of the same judge
    "alpaca_eval_gpt4": "alpaca_eval_gpt4",
    "alpaca_eval_gpt4_turbo_fn": "alpaca_eval_gpt4_turbo_fn",
    "alpaca_eval_cot_gpt4_turbo_fn": "alpaca_eval_cot_gpt4_turbo_fn",
    "weighted_alpaca_eval_gpt4_turbo": "weighted_alpaca_eval_gpt4_turbo",
}


def board(data: Path) -> dict[str, dict[str, str]]:
    path = data / "alpaca_eval/leaderboards/evaluators/evaluators_leaderboard.csv"
    with open(path, newline="") as handle:
        return {row[""]: row for row in csv.DictReader(handle)}


def cross_annotated(data: Path) -> tuple[list[Item], list[list[float]]]:
    """The 648 pairs (instruction with its input, as the runs give them) and gpt4_b1's four runs."""
    runs = [
        json.loads((data / f"alpaca_eval/gpt4_b1_seeds/annotations_seed{i}.json").read_text())
        for i in range(4)
    ]
    items = [
        Item({k: row[k] for k in ("instruction", "input", "output_1", "output_2")})
        for row in runs[0]
    ]
    return items, [[row["preference"] for row in run] for run in runs]


def audited(items: list[Item], runs: list[list[float]], name: str) -> dict[str, float | None]:
    """farm-audit's figures of a recorded judge: each run's verdicts as given, and the same verdict
    mirrored for the pair shown the other way (a recorded judge is consistent by construction), plus
    AlpacaEval's Proba. prefer 1 over the verdicts as given (farm-audit's shows every pair both ways)."""
    records = []
    for run in runs:
        given = [{"preference": p} for p in run]
        records.append(given + [{"preference": 3 - p} for p in run])
    result = audit(items, records, name, resamples=200)
    found = {f.figure: f.estimate for f in result.figures}
    firsts = [
        c
        for run in runs
        for *_, c in alpaca_eval_preferences(
            (i.output_1, i.output_2, p) for i, p in zip(items, run, strict=True)
        )
        if c is not None
    ]
    found["p_prefers_1"] = sum(firsts) / len(firsts)
    found["intervals"] = {f.figure: (f.ci_low, f.ci_high) for f in result.figures}
    return found


def correlate_figures(items: list[Item], runs: list[list[float]], name: str) -> dict:
    """farm-correlate's annotation-mode figures of the same runs (its own definitions)."""
    annotations = Annotations()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for k, run in enumerate(runs):
            path = Path(folder) / f"{name}.{k}.jsonl"
            path.write_bytes(
                b"".join(
                    orjson.dumps({**item.record, "annotator": name, "preference": p}) + b"\n"
                    for item, p in zip(items, run, strict=True)
                )
            )
            annotations.add_judge(str(path))
    return judge_summary(annotations, name) or {}


def eval_set_longer(data: Path, annotator: str) -> tuple[float, int]:
    """AlpacaEval's P(prefers longer) on a judge's shared eval-set annotations (first verdict of
    each instruction and model; rows whose generator_2 is not their results_dir left out)."""
    seen, longer = set(), []
    path = data / f"alpaca_eval/annotations/{annotator}.jsonl.gz"
    with gzip.open(path, "rb") as handle:
        for line in handle:
            row = orjson.loads(line)
            key = (row["instruction_index"], row["generator_2"])
            if row["generator_2"] != row["results_dir"] or key in seen:
                continue
            seen.add(key)
            first, second = "x" * row["len_1"], "x" * row["len_2"]
            (verdict,) = alpaca_eval_preferences([(first, second, row["preference"])])
            if verdict[0] is not None:
                longer.append(verdict[0])
    return sum(longer) / len(longer), len(longer)


def number(value) -> str:
    return "" if value is None or value == "" else f"{float(value):.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    published = board(args.data)
    items, b1_runs = cross_annotated(args.data)
    longest_run = [1.0 if len(i.output_1) > len(i.output_2) else 2.0 for i in items]
    lines = [
        "# farm-audit against AlpacaEval's evaluators' leaderboard",
        "",
        "Made by `python bench/audit_evaluators.py` from ../shared/data "
        "(alpaca_eval/leaderboards/evaluators/evaluators_leaderboard.csv, gpt4_b1_seeds, annotations).",
        "",
        "## The 648 cross-annotated pairs",
        "",
        "| judge | column | published | farm-audit | difference | farm-correlate |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in (("longest", [longest_run] * 4), ("gpt4_b1", b1_runs)):
        ours = audited(items, runs, name)
        theirs = correlate_figures(items, runs, name)
        row = published.get(name, {})
        for column, field, factor in COLUMNS:
            value = ours.get(field)
            value = None if value is None else value * factor
            given = row.get(column)
            difference = (
                f"{value - float(given):+.2e}"
                if value is not None and given
                else "not on the board"
            )
            other = theirs.get(field if field != "p_prefers_1" else "p_prefers_first")
            other = None if other is None else other * factor
            lines.append(
                f"| {name} | {column} | {number(given)} | {number(value)} | {difference} | {number(other)} |"
            )
        lines.append(
            f"| {name} | Bias | {number(row.get('Bias'))} | n/a: needs the human cross-annotations "
            "(not in the shared data) | | |"
        )
    lines += [
        "",
        "## P(prefers longer) on the shared eval-set annotations (other pairs than the board's)",
        "",
        "| judge | published (648 cross-annotated pairs) | farm-audit's definition on the eval set | pairs | difference |",
        "|---|---|---|---|---|",
    ]
    for annotator, row_name in EVAL_SET_JUDGES.items():
        value, count = eval_set_longer(args.data, annotator)
        given = float(published[row_name]["Proba. prefer longer"])
        lines.append(
            f"| {annotator} | {given:.4f} | {value:.4f} | {count} | {value - given:+.4f} |"
        )
    lines += [
        "",
        "Notes. On the rebuilt `longest` judge every column the shared data allow (all but Bias) is",
        "the published value exactly: P(prefers lists) counts the same 111 pairs (98 prefer the list),",
        "P(prefers longer) the same 445. farm-correlate's own definitions differ where the table says:",
        "its list detector (a list line: a bullet or a number at the start of a line) finds 46 pairs",
        "with one list where AlpacaEval's loose detector finds 111 (0.674 against 0.883 on `longest`),",
        "and its P(prefers longer) counts every run's verdicts (1,780 on gpt4_b1) where AlpacaEval keeps",
        "the first verdict of each pair (445): 0.606 against 0.600. Variance and P(prefers 1) agree.",
        "The eval-set figures are on other pairs (each model against a reference, where the better",
        "model is often the longer one): their differences from the board are the pairs', not the",
        "definition's; Bias and the listed judges' Variance need the human cross-annotations and the",
        "judges' four runs on the 648 pairs, which the shared data do not hold.",
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
