"""Audit of AlpacaEval-compatible files (issue 21, item 3, and --sort-by) on fresh cases, against any
checkout:

    PYTHONPATH=ROOT python bench/audit_alpaca_eval_files.py ROOT [SHARED_DATA]

Fresh cases, none used by the tests: boards of AlpacaEval 1's gpt4 annotations (other models than the
tests use) and of AlpacaEval 2's weighted annotations (other models again) written with `--format
alpaca-eval`, read with pandas by AlpacaEval's column names and compared cell by cell with the
published leaderboards; `--sort-by lc` on AlpacaEval 2's annotations of 12 models; and the evaluators
table of PandaLM's human labels and its gpt-3.5 judge, compared with the published evaluators header.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
from click.testing import CliRunner


def _tool(root: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"audit_{name}", root / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cli


def _header(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        return next(csv.reader(handle))


def _annotations(path: Path, models: tuple[str, ...]) -> list[dict]:
    return [
        r
        for r in map(json.loads, gzip.open(path))
        if r["generator_2"] == r["results_dir"] and r["generator_2"] in models
    ]


def board_case(
    winrate, data: Path, tmp: Path, annotator: str, folder: str, models, extra=()
) -> dict:
    published_path = data / f"alpaca_eval/leaderboards/{folder}/{annotator}_leaderboard.csv"
    records = _annotations(data / f"alpaca_eval/annotations/{annotator}.jsonl.gz", models)
    prefs = tmp / f"{annotator}.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp / f"{annotator}.csv"
    result = CliRunner().invoke(
        winrate, [str(prefs), "--format", "alpaca-eval", *extra, "-o", str(out)]
    )
    case = {"exit": result.exit_code}
    if result.exit_code:
        case["error"] = (result.stderr or str(result.exception)).strip().splitlines()[-1][:120]
        return case
    published = pd.read_csv(published_path, index_col=0)
    ours = pd.read_csv(out, index_col=0)
    reference_header = _header(
        data
        / "alpaca_eval/leaderboards/data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
    )
    case["header_is_alpaca_eval_2s"] = _header(out) == reference_header
    shared = [c for c in published.columns if c in ours.columns]
    case["published_columns_present"] = f"{len(shared)}/{len(published.columns)}"
    # the models the annotations hold (avg_length only with all 805 rows: the published one is
    # measured on the full outputs, and a few annotation files miss a row or two)
    counts = {m: sum(r["generator_2"] == m for r in records) for m in models}
    case["models_annotated"] = f"{sum(1 for n in counts.values() if n)}/{len(models)}"
    cells = right = 0
    for model in [m for m in models if counts[m]]:
        for column in (
            "win_rate",
            "standard_error",
            "n_wins",
            "n_wins_base",
            "n_draws",
            "n_total",
            "discrete_win_rate",
            "avg_length",
        ):
            if column == "avg_length" and counts[model] != 805:
                continue
            if column in published.columns and model in published.index:
                cells += 1
                theirs = published.loc[model, column]
                mine = (
                    ours.loc[model, column]
                    if model in ours.index and column in ours.columns
                    else None
                )
                right += mine is not None and abs(float(mine) - float(theirs)) <= 1e-9 * max(
                    1.0, abs(float(theirs))
                )
    case["raw_cells_equal"] = f"{right}/{cells}"
    return case


def sort_case(winrate, data: Path, tmp: Path) -> dict:
    models = (
        "gpt4_gamed", "alpaca-7b", "claude-2", "vicuna-7b", "phi-2", "Qwen-14B-Chat",
        "gpt-3.5-turbo-0301", "gpt4_0613_concise", "wizardlm-13b", "ultralm-13b", "minichat-3b", "gemma-7b-it",
    )  # fmt: skip
    records = _annotations(
        data / "alpaca_eval/annotations/weighted_alpaca_eval_gpt4_turbo.jsonl.gz", models
    )
    prefs = tmp / "sort.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = CliRunner().invoke(winrate, [str(prefs), "--sort-by", "lc"])
    if result.exit_code:
        return {
            "exit": result.exit_code,
            "error": (result.stderr or str(result.exception)).strip().splitlines()[-1][:120],
        }
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    lc = [r["length_controlled_win_rate"] for r in rows]
    raw_order = sorted(rows, key=lambda r: -r["win_rate"])
    return {
        "exit": 0,
        "ordered_by_lc": lc == sorted(lc, reverse=True),
        "differs_from_raw_order": [r["generator"] for r in rows]
        != [r["generator"] for r in raw_order],
    }


def evaluators_case(correlate, data: Path, tmp: Path) -> dict:
    humans = data / "human_prefs/pandalm_testset_v1.json"
    judge = data / "human_prefs/pandalm_gpt35_judgments_v1.json"
    out = tmp / "evaluators.csv"
    args = [
        "--humans", str(humans), "--key", "idx", "--outputs", "response1,response2",
        "--human-label", "annotator1,annotator2,annotator3", "--judge", str(judge), "--judge-label", "gpt_result",
    ]  # fmt: skip
    result = CliRunner().invoke(correlate, [*args, "--format", "alpaca-eval", "-o", str(out)])
    if result.exit_code:
        return {
            "exit": result.exit_code,
            "error": (result.stderr or str(result.exception)).strip().splitlines()[-1][:120],
        }
    published = data / "alpaca_eval/leaderboards/evaluators/evaluators_leaderboard.csv"
    frame = pd.read_csv(out, index_col=0)
    return {
        "exit": 0,
        "header_equals_published": _header(out) == _header(published),
        "rows": {
            name: {
                k: (round(v, 2) if isinstance(v, float) else v)
                for k, v in row.items()
                if k in ("Human agreement", "# parsed", "Proba. prefer 1")
            }
            for name, row in frame.iterrows()
        },
    }


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    data = Path(sys.argv[2] if len(sys.argv) > 2 else root.parent / "shared" / "data")
    winrate, correlate = _tool(root, "farm_winrate"), _tool(root, "farm_correlate")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        report = {
            "root": str(root),
            "alpaca_eval_1_gpt4_board": board_case(
                winrate,
                data,
                tmp,
                "alpaca_eval_gpt4",
                "data_AlpacaEval",
                (
                    "guanaco-65b",
                    "wizardlm-13b",
                    "Yi-34B-Chat",
                    "cohere",
                    "zephyr-7b-beta",
                    "tulu-2-dpo-70b",
                    "phi-2-dpo",
                ),
                ("--no-length-control",),
            ),  # fmt: skip
            "alpaca_eval_2_weighted_board": board_case(
                winrate,
                data,
                tmp,
                "weighted_alpaca_eval_gpt4_turbo",
                "data_AlpacaEval_2",
                ("claude-2", "alpaca-7b", "phi-2", "gemma-7b-it", "Qwen-14B-Chat", "ultralm-13b"),
                ("--no-length-control",),
            ),  # fmt: skip
            "sort_by_lc": sort_case(winrate, data, tmp),
            "evaluators_table": evaluators_case(correlate, data, tmp),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
