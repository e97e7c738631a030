"""examples/report.py's significance: the paired bootstrap of each method against SFT on gold win rate,
the reward model's accuracy against gold, the paper's ranking and the sim-vs-gold Spearman with its
interval, on synthetic evaluation folders (no model, no make)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import numpy as np
import orjson
import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("demo_report", ROOT / "examples" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_bootstrap_detects_a_real_difference(report):
    rng = np.random.default_rng(1)
    baseline = rng.binomial(1, 0.40, size=200).astype(float)
    # the method wins 20 points more often, on the same prompts
    better = np.where(rng.random(200) < 0.3, 1.0, baseline)
    result = report.paired_bootstrap(better, baseline, seed=0)
    assert result["difference"] == pytest.approx(better.mean() - baseline.mean())
    assert result["difference"] > 0.1
    assert 0 < result["low"] < result["difference"] < result["high"]
    assert result["p"] < 0.01


def test_paired_bootstrap_finds_no_difference_between_exchangeable_systems(report):
    rng = np.random.default_rng(2)
    p_values = []
    for trial in range(20):
        a = rng.binomial(1, 0.45, size=200).astype(float)
        b = rng.binomial(1, 0.45, size=200).astype(float)
        result = report.paired_bootstrap(a, b, resamples=1000, seed=trial)
        assert result["low"] <= result["difference"] <= result["high"]
        p_values.append(result["p"])
    # under the null about 5% of the tests reject at 0.05; 20 seeded trials: at most 3
    assert sum(p < 0.05 for p in p_values) <= 3, p_values
    assert np.median(p_values) > 0.2, p_values
    # and each p-value is the two-sided one: about what the normal approximation gives
    a = rng.binomial(1, 0.45, size=300).astype(float)
    b = rng.binomial(1, 0.45, size=300).astype(float)
    result = report.paired_bootstrap(a, b, resamples=4000, seed=0)
    difference = a - b
    z = abs(difference.mean()) / (difference.std() / np.sqrt(difference.size))
    assert result["p"] == pytest.approx(math.erfc(z / math.sqrt(2)), abs=0.04), (result, z)
    same = report.paired_bootstrap(np.ones(50), np.ones(50))
    assert same["p"] == 1.0 and same["difference"] == 0.0


def test_spearman_handles_ties_and_constants(report):
    assert report.spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1)
    assert report.spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1)
    assert report.spearman(np.array([1, 1, 2]), np.array([1, 2, 3])) == pytest.approx(
        0.866, abs=1e-3
    )
    assert report.spearman(np.array([1, 1, 1]), np.array([1, 2, 3])) is None


SYSTEMS = {"sft": 0.35, "ppo": 0.65, "bon": 0.60, "dpo": 0.36, "rc": 0.34}


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


@pytest.fixture
def run_folder(tmp_path):
    """An OUT folder as the demo leaves it: eval/{sim,gold}/SYSTEM.jsonl, scores/, leaderboards."""
    rng = np.random.default_rng(0)
    prompts = [f"prompt {i}" for i in range(240)]
    reference = [
        {"instruction": p, "output": f"ref {i}", "generator": "base"} for i, p in enumerate(prompts)
    ]
    _write(tmp_path / "scores" / "reference.jsonl", [{**r, "reward": 0.0} for r in reference])
    for file, rate in SYSTEMS.items():
        name = "sft-best-of-4" if file == "bon" else file
        wins = rng.random(len(prompts)) < rate
        outputs = [f"{file} {i}" for i in range(len(prompts))]
        for kind, flip in (("gold", 0.0), ("sim", 0.1)):
            verdicts = [
                {
                    "instruction": p,
                    "output_1": reference[i]["output"],
                    "output_2": outputs[i],
                    "generator_1": "base",
                    "generator_2": name,
                    "preference": 2 if wins[i] != (rng.random() < flip) else 1,
                }
                for i, p in enumerate(prompts)
            ]
            _write(tmp_path / "eval" / kind / f"{file}.jsonl", verdicts)
        # a reward model that agrees with gold on 80% of the pairs
        agree = rng.random(len(prompts)) < 0.8
        _write(
            tmp_path / "scores" / f"{file}.jsonl",
            [
                {
                    "instruction": p,
                    "output": outputs[i],
                    "generator": name,
                    "reward": (1.0 if wins[i] == agree[i] else -1.0),
                }
                for i, p in enumerate(prompts)
            ],
        )
    for kind in ("sim", "gold"):
        _write(
            tmp_path / f"leaderboard_{kind}.jsonl",
            [
                {
                    "generator": "sft-best-of-4" if f == "bon" else f,
                    "win_rate": 100 * r,
                    "standard_error": 3.0,
                    "n_total": 240,
                }
                for f, r in SYSTEMS.items()
            ],
        )
    _write(tmp_path / "correlation.jsonl", [{"n": 5, "spearman": 0.9}])
    return tmp_path


def test_the_papers_ranking_covers_dpo_and_ranks_its_tie_with_ppo_at_the_mean(report):
    """Table 2 of AlpacaFarm (v4) gives DPO and PPO the same simulated win rate, 46.8: the paper's
    side ranks them together, so a farmkit ranking that puts them 1 and 2 in either order agrees
    equally, and one that reverses the rest of the table disagrees."""
    files = {"ppo": "ppo", "dpo": "dpo", "bon": "sft-best-of-8", "sft": "sft", "rc": "rc"}

    def gold(order):  # win rates in farmkit's gold, highest first
        return {
            files[f]: {("p", ""): rate}
            for f, rate in zip(order, (0.5, 0.4, 0.3, 0.2, 0.1), strict=True)
        }

    def rho(lines):
        return float(lines[-1].rsplit(": ", 1)[1])

    as_paper = report.paper_lines(files, gold(["ppo", "dpo", "bon", "sft", "rc"]))
    swapped = report.paper_lines(files, gold(["dpo", "ppo", "bon", "sft", "rc"]))
    assert [line.split("|")[0].strip() for line in as_paper[1:3]] == ["1. PPO 46.8", "2. DPO 46.8"]
    assert "over these 5 methods" in as_paper[-1], as_paper
    # ranks 1.5, 1.5, 3, 4, 5 against 1..5 either way: the same, and below 1
    assert rho(as_paper) == pytest.approx(rho(swapped)) == pytest.approx(0.975, abs=1e-9)
    reversed_ = report.paper_lines(files, gold(["rc", "sft", "bon", "dpo", "ppo"]))
    assert rho(reversed_) < -0.9, reversed_


def test_report_prints_the_significance_lines(run_folder):
    out = run_folder
    scores = [str(out / "scores" / f"{file}.jsonl") for file in SYSTEMS]
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "report.py"),
            "--evals",
            str(out / "eval"),
            "--reference-scores",
            str(out / "scores" / "reference.jsonl"),
            str(out / "leaderboard_sim.jsonl"),
            str(out / "leaderboard_gold.jsonl"),
            str(out / "correlation.jsonl"),
            *scores,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    by_method = {line.split()[0]: line for line in lines if " vs sft: " in line}
    assert sorted(by_method) == ["dpo", "ppo", "rc", "sft-best-of-4"], result.stdout
    # 30 and 25 points better on 240 prompts: significant; 1 point either way: not
    for name in ("ppo", "sft-best-of-4"):
        assert by_method[name].endswith(": significant at p<0.05"), by_method[name]
        assert "n=240 prompts" in by_method[name]
    for name in ("dpo", "rc"):
        assert by_method[name].endswith("not significant at p<0.05"), by_method[name]
    assert any(line.startswith("Method ranking, AlpacaFarm paper") for line in lines)
    assert any("1. PPO 46.8" in line for line in lines), result.stdout
    correlation = [
        line for line in lines if line.startswith("Simulated vs gold Spearman over 5 systems")
    ]
    assert correlation and "95% bootstrap interval over 240 prompts" in correlation[0], (
        result.stdout
    )
    rm = [
        line
        for line in lines
        if line.startswith("Reward model vs gold on held-out evaluation pairs")
    ]
    assert rm and rm[0].endswith(": above chance"), result.stdout
    accuracy = float(rm[0].split("accuracy ")[1].split()[0])
    assert 0.75 < accuracy < 0.85, rm[0]


def test_a_bad_verdict_names_the_file_and_line(report, run_folder):
    path = run_folder / "eval" / "gold" / "dpo.jsonl"
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    records[2]["preference"] = 7
    _write(path, records)
    with pytest.raises(SystemExit, match=r"dpo\.jsonl:3: preference must be in \[1, 2\]"):
        report.significance(str(run_folder / "eval"), [])
