"""Audit: farm-eval against AlpacaEval 2's published leaderboard (issue 21, items 1 and the done-when).

For every model of ../shared/data whose outputs and published weighted_alpaca_eval_gpt4_turbo
verdicts are both there, runs `farm-eval MODEL.json --reference gpt4_1106_preview --labels ...
--instruction-difficulty ... --leaderboard PUBLISHED.csv` (one model per run) with the commands of a
given bin folder, and compares its row with the published one: raw win rate (exact: < 1e-4 points),
LC (within 0.5 points), and the place on the board by raw win rate (the published one) and by LC.

    python bench/audit_eval.py --bin /work/main/.venv/bin
    python bench/audit_eval.py --bin .venv/bin [--models a,b,c]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import orjson

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca_eval"
JUDGE = "weighted_alpaca_eval_gpt4_turbo"
BOARD = DATA / "leaderboards" / "data_AlpacaEval_2" / f"{JUDGE}_leaderboard.csv"
REFERENCE = "gpt4_1106_preview"


def lines(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        return [orjson.loads(line) for line in stream if line.strip()]


def difficulties(published: list[dict], n_items: int) -> np.ndarray:
    """One joint fit over every published verdict of the judge (what AlpacaEval ships precomputed)."""
    from farmkit.evaluate.length_control import _scaled_length_difference, estimate_difficulty

    groups: dict[str, list[dict]] = {}
    for r in published:
        if r["preference"] is not None:
            groups.setdefault(r["generator_2"], []).append(r)
    items, lengths, targets = [], [], []
    for rows in groups.values():
        items.append(np.array([r["instruction_index"] for r in rows]))
        lengths.append(
            _scaled_length_difference(np.array([r["len_2"] - r["len_1"] for r in rows], float))
        )
        targets.append(
            np.array([0.5 if r["preference"] == 0 else r["preference"] - 1 for r in rows])
        )
    return estimate_difficulty(items, lengths, targets, n_items)


def ranks(board: list[dict], column: str) -> dict[str, int]:
    ordered = sorted(
        (r for r in board if isinstance(r.get(column), float)), key=lambda r: -r[column]
    )
    return {r["generator"]: i for i, r in enumerate(ordered, start=1)}


def published_board() -> list[dict]:
    rows = []
    for row in csv.DictReader(open(BOARD)):
        lc = row["length_controlled_winrate"]
        rows.append(
            {
                "generator": row[""],
                "win_rate": float(row["win_rate"]),
                "length_controlled_win_rate": float(lc) if lc else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", type=Path, required=True)
    parser.add_argument("--models", help="comma-separated; default: every model with data")
    parser.add_argument(
        "--context",
        action="store_true",
        help="fit the length control with every published verdict (farm-eval --context) instead of "
        "a difficulty file",
    )
    args = parser.parse_args()
    pipe = not (args.bin / "farm-eval").exists()
    if pipe:
        print(f"{args.bin}/farm-eval: no such command; running the pipe it stands for instead")
    eval_set = lines(DATA / "eval_set.jsonl")
    published = [
        r
        for r in lines(DATA / "annotations" / f"{JUDGE}.jsonl.gz")
        if r["generator_2"] == r["results_dir"]
    ]
    board = published_board()
    by_name = {r["generator"]: r for r in board}
    have = {p.name.split(".jsonl")[0] for p in (DATA / "model_outputs").iterdir()}
    models = sorted(
        {r["generator_2"] for r in published} & have & set(by_name) - {REFERENCE}
        if not args.models
        else set(args.models.split(","))
    )
    reference = {
        r["instruction"]: r for r in lines(DATA / "model_outputs" / f"{REFERENCE}.jsonl.gz")
    }
    raw_rank, lc_rank = ranks(board, "win_rate"), ranks(board, "length_controlled_win_rate")
    counts = {"ran": 0, "raw exact": 0, "LC within 0.5": 0, "raw place exact": 0}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "ref.json").write_bytes(orjson.dumps(list(reference.values())))
        difficulty = difficulties(published, len(eval_set))
        (folder / "difficulty.jsonl").write_bytes(
            b"".join(
                orjson.dumps({"instruction": x["instruction"], "instruction_difficulty": float(d)})
                + b"\n"
                for x, d in zip(eval_set, difficulty, strict=True)
            )
        )
        (folder / "context.jsonl").write_bytes(
            b"".join(
                orjson.dumps(
                    {
                        **{k: v for k, v in r.items() if k != "instruction_index"},
                        "instruction": eval_set[r["instruction_index"]]["instruction"],
                    }
                )
                + b"\n"
                for r in lines(DATA / "annotations" / f"{JUDGE}.jsonl.gz")
            )
        )
        length_control = (
            ["--context", str(folder / "context.jsonl")]
            if args.context
            else ["--instruction-difficulty", str(folder / "difficulty.jsonl")]
        )
        print(
            f"{'model':28} {'raw':>8} {'pub raw':>8} {'LC':>7} {'pub LC':>7} {'dLC':>6} {'raw place':>10} {'LC place':>9}"
        )
        for model in models:
            outputs = {
                r["instruction"]: r for r in lines(DATA / "model_outputs" / f"{model}.jsonl.gz")
            }
            annotations = []
            for r in published:
                if r["generator_2"] != model:
                    continue
                text = eval_set[r["instruction_index"]]["instruction"]
                if text in reference and text in outputs:
                    annotations.append(
                        {
                            "instruction": text,
                            "output_1": reference[text]["output"],
                            "output_2": outputs[text]["output"],
                            "generator_1": REFERENCE,
                            "generator_2": model,
                            "preference": r["preference"],
                        }
                    )
            (folder / "a.json").write_bytes(orjson.dumps(annotations))
            (folder / "m.json").write_bytes(orjson.dumps(list(outputs.values())))
            command = [
                str(args.bin / "farm-annotate"),
                str(folder / "m.json"),
                "--reference",
                str(folder / "ref.json"),
                "--labels",
                str(folder / "a.json"),
                "--no-cache",
                "-q",
            ]
            if pipe:  # main: farm-annotate --labels | farm-winrate, placed on the board here
                annotated = subprocess.run(
                    command, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
                )
                done = subprocess.run(
                    [
                        str(args.bin / "farm-winrate"),
                        "--instruction-difficulty",
                        str(folder / "difficulty.jsonl"),
                        "-q",
                    ],
                    input=annotated.stdout,
                    capture_output=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
                if annotated.returncode:
                    done = annotated
            else:
                done = subprocess.run(
                    [
                        str(args.bin / "farm-eval"),
                        str(folder / "m.json"),
                        "--reference",
                        str(folder / "ref.json"),
                        "--labels",
                        str(folder / "a.json"),
                        *length_control,
                        "--leaderboard",
                        str(BOARD),
                        "--sort-by",
                        "win_rate",
                        "--bootstrap",
                        "0",
                        "--no-cache",
                        "-q",
                    ],
                    capture_output=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
            if done.returncode != 0:
                print(
                    f"{model:28} FAILED: exit {done.returncode}: {done.stderr.decode().strip()[-150:]}"
                )
                continue
            counts["ran"] += 1
            rows = [orjson.loads(x) for x in done.stdout.splitlines()]
            if pipe:
                rows = [r for r in board if r["generator"] != model] + rows
                rows.sort(key=lambda r: -r["win_rate"])
                rows = [{**r, "rank": i} for i, r in enumerate(rows, start=1)]
            row = next(r for r in rows if r["generator"] == model)
            expected = by_name[model]
            d_raw = abs(row["win_rate"] - expected["win_rate"])
            d_lc = abs(row["length_controlled_win_rate"] - expected["length_controlled_win_rate"])
            new_lc_rank = ranks(rows, "length_controlled_win_rate")[model]
            counts["raw exact"] += d_raw < 1e-4
            counts["LC within 0.5"] += d_lc < 0.5
            counts["raw place exact"] += row["rank"] == raw_rank[model]
            print(
                f"{model:28} {row['win_rate']:8.3f} {expected['win_rate']:8.3f} "
                f"{row['length_controlled_win_rate']:7.2f} {expected['length_controlled_win_rate']:7.2f} "
                f"{d_lc:6.2f} {row['rank']:>4} ({raw_rank[model]:>3}) {new_lc_rank:>3} ({lc_rank[model]:>3})"
            )
    print(f"{len(models)} models: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
