"""Audit of the demo report's significance (issue 23, item 4): fresh synthetic run folders, with
known true win rates, go through a checkout's examples/report.py; counted: the methods whose line
against SFT is printed, the verdicts that match the truth (a method whose true gold win rate differs
from SFT's by >= 15 points should be significant, one with the same true rate should not), and whether
the RM-vs-gold, paper-ranking and sim-vs-gold-interval lines are printed. Not part of the suite.

    python bench/audit_significance.py [CHECKOUT] [--cases N]

CHECKOUT defaults to this one; pass /work/main to audit the code before the change.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def make_case(folder: Path, seed: int) -> dict[str, float]:
    """A run folder whose systems have random true gold win rates: SFT's, some 15-30 points above,
    some equal to it. Returns the true rates."""
    rng = np.random.default_rng(10_000 + seed)
    n = int(rng.integers(200, 320))
    sft = float(rng.uniform(0.25, 0.45))
    truth = {"sft": sft}
    for name in ("ppo", "bon", "expiter", "dpo", "feedme", "quark", "rc"):
        truth[name] = sft + float(rng.uniform(0.15, 0.30)) if rng.random() < 0.5 else sft
    prompts = [f"case {seed} prompt {i}?" for i in range(n)]
    reference = [f"reference answer {i}" for i in range(n)]
    _write(
        folder / "scores" / "reference.jsonl",
        [
            {"instruction": p, "output": reference[i], "generator": "base", "reward": 0.0}
            for i, p in enumerate(prompts)
        ],
    )
    rows = []
    for name, rate in truth.items():
        wins = rng.random(n) < rate
        outputs = [f"{name} answer {i}" for i in range(n)]
        for kind, flip in (("gold", 0.0), ("sim", 0.15)):
            _write(
                folder / "eval" / kind / f"{name}.jsonl",
                [
                    {
                        "instruction": p,
                        "output_1": reference[i],
                        "output_2": outputs[i],
                        "generator_1": "base",
                        "generator_2": name,
                        "preference": 2 if wins[i] != (rng.random() < flip) else 1,
                    }
                    for i, p in enumerate(prompts)
                ],
            )
        agree = rng.random(n) < 0.7
        _write(
            folder / "scores" / f"{name}.jsonl",
            [
                {
                    "instruction": p,
                    "output": outputs[i],
                    "generator": name,
                    "reward": 1.0 if wins[i] == agree[i] else -1.0,
                }
                for i, p in enumerate(prompts)
            ],
        )
        rows.append(
            {
                "generator": name,
                "win_rate": float(100 * wins.mean()),
                "standard_error": 3.0,
                "n_total": n,
            }
        )
    for kind in ("sim", "gold"):
        _write(folder / f"leaderboard_{kind}.jsonl", rows)
    _write(folder / "correlation.jsonl", [{"n": len(rows), "spearman": 0.5}])
    return truth


def run_report(checkout: Path, folder: Path, truth: dict[str, float]) -> str:
    command = [sys.executable, str(checkout / "examples" / "report.py")]
    with_evals = [
        "--evals",
        str(folder / "eval"),
        "--reference-scores",
        str(folder / "scores" / "reference.jsonl"),
    ]
    files = [
        str(folder / f)
        for f in ("leaderboard_sim.jsonl", "leaderboard_gold.jsonl", "correlation.jsonl")
    ]
    files += [str(folder / "scores" / f"{name}.jsonl") for name in truth]
    result = subprocess.run(command + with_evals + files, capture_output=True, text=True)
    if (
        result.returncode != 0
    ):  # the report before the change takes no --evals: run it as the Makefile did
        result = subprocess.run(command + files, capture_output=True, text=True)
    return result.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkout", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--cases", type=int, default=12)
    arguments = parser.parse_args()
    checkout = Path(arguments.checkout)
    printed = correct = methods = false_positive = nulls = 0
    extra = {"rm": 0, "paper": 0, "interval": 0}
    for case in range(arguments.cases):
        with tempfile.TemporaryDirectory() as tmp:
            truth = make_case(Path(tmp), case)
            out = run_report(checkout, Path(tmp), truth)
        lines = {line.split()[0]: line for line in out.splitlines() if " vs sft: " in line}
        for name, rate in truth.items():
            if name == "sft":
                continue
            methods += 1
            if name in lines:
                printed += 1
                significant = lines[name].endswith(": significant at p<0.05")
                correct += significant == (rate > truth["sft"])
                false_positive += significant and rate == truth["sft"]
                nulls += rate == truth["sft"]
        extra["rm"] += "Reward model vs gold on held-out evaluation pairs" in out
        extra["paper"] += "Method ranking, AlpacaFarm paper" in out
        extra["interval"] += "95% bootstrap interval over" in out
    print(f"checkout: {checkout}")
    print(f"method-vs-SFT significance lines printed: {printed}/{methods}")
    print(
        f"verdicts matching the truth (15-30 points apart: significant; equal: not): {correct}/{methods}"
    )
    print(f"equal-rate methods called significant (expected about 5%): {false_positive}/{nulls}")
    print(
        f"cases printing RM-vs-gold accuracy with interval: {extra['rm']}/{arguments.cases}; "
        f"paper ranking: {extra['paper']}/{arguments.cases}; sim-vs-gold interval: {extra['interval']}/{arguments.cases}"
    )


if __name__ == "__main__":
    main()
