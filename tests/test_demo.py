"""The laboratory end to end: examples/Makefile at SIZE=ci runs every step (split, SFT, pairs,
noisy annotation, reward model, the seven methods, evaluation with the simulated pool and the gold
annotator, leaderboards, correlation, plots) on the tiny model; a second make does nothing, and
re-annotating the same outputs is served from the cache. (The tiny model exercises the recipe, not
the methods: `make demo` itself is the run on the embedded model.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import ROOT

EXAMPLES = ROOT / "examples"
# the file each system's outputs are in, and its name on the leaderboards (SIZE=ci: best of 2)
SYSTEMS = {"sft": "sft", "feedme": "feedme", "rc": "rc", "expiter": "expiter", "dpo": "dpo", "ppo": "ppo",
           "quark": "quark", "bon": "sft-best-of-2"}
N_VAL = 6  # SIZE=ci's val split


def _make(*args: str, check: bool = True, timeout: float = 2400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["make", "-C", str(EXAMPLES), *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check:
        assert result.returncode == 0, f"make {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def _records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _assert_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pixels = imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0, f"{path} is blank"


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, tiny_model_path) -> tuple[list[str], Path]:
    out = tmp_path_factory.mktemp("demo-ci")
    # The evaluation pool is a local judge (the tiny model reading its answer log-probabilities):
    # oracle verdicts cost nothing and are never cached, a local judge's are.
    pool = out / "tiny_local.yaml"
    pool.write_text(
        "name: tiny_local\n"
        "description: the tiny test model as an in-process judge\n"
        "flip_rate: 0.0\n"
        f"judges:\n  - {{name: tiny-choice, backend: local, model: {tiny_model_path}, prompt: local_choice, temperature: 0.0}}\n"
    )
    variables = ["SIZE=ci", f"MODEL={tiny_model_path}", f"OUT={out}", f"EVAL_POOL={pool}"]
    result = _make("demo", *variables)
    (out / "stdout.txt").write_text(result.stdout)
    return variables, out


def _check_leaderboards(out: Path) -> None:
    for kind in ("sim", "gold"):
        rows = {row["generator"]: row for row in _records(out / f"leaderboard_{kind}.jsonl")}
        assert sorted(rows) == sorted(SYSTEMS.values()), kind
        for name, row in rows.items():
            assert 0 <= row["win_rate"] <= 100, (kind, name, row["win_rate"])
            assert row["n_total"] + row.get("n_dropped", 0) == N_VAL, (kind, name)
        _assert_png(out / f"leaderboard_{kind}.png")
    correlation = _records(out / "correlation.jsonl")
    assert correlation and correlation[0]["n"] == len(SYSTEMS)
    # undefined (null) only when one leaderboard is constant, which the tiny model can produce
    spearman = correlation[0]["spearman"]
    assert spearman is None or -1 <= spearman <= 1
    _assert_png(out / "sim_vs_gold.png")


def test_ci_pipeline_produces_both_leaderboards_correlation_and_plots(ci_run):
    _, out = ci_run
    _check_leaderboards(out)
    printed = (out / "stdout.txt").read_text()
    for name in SYSTEMS.values():
        assert f"\n{name} " in printed, f"{name} missing from the printed leaderboard"
    assert "Simulated vs gold leaderboard: n 8" in printed
    # the evaluation compares every system with the same reference outputs, on the val prompts
    reference = _records(out / "outputs" / "reference.jsonl")
    for kind in ("sim", "gold"):
        for file, name in SYSTEMS.items():
            verdicts = _records(out / "eval" / kind / f"{file}.jsonl")
            assert {v["generator_1"] for v in verdicts} == {"base"}
            assert {v["generator_2"] for v in verdicts} == {name}
            assert sorted(v["output_1"] for v in verdicts) == sorted(r["output"] for r in reference)


def test_second_make_does_nothing(ci_run):
    variables, _ = ci_run
    assert _make("-q", "results", *variables, check=False).returncode == 0, "targets are not up to date"
    planned = _make("-n", "results", *variables).stdout
    assert "farm-" not in planned, planned


def test_reannotation_is_served_from_the_cache(ci_run):
    variables, out = ci_run
    before = {path: path.read_bytes() for path in sorted((out / "eval").rglob("*.jsonl"))}
    (out / "eval" / "sim" / "dpo.jsonl").unlink()
    (out / "eval" / "gold" / "dpo.jsonl").unlink()
    planned = _make("-n", "results", *variables).stdout
    commands = [line.split()[0] for line in planned.splitlines() if line.startswith("farm-")]
    # only the two annotations, the two leaderboards and the correlation are redone
    assert sorted(commands) == ["farm-annotate", "farm-annotate", "farm-correlate", "farm-winrate", "farm-winrate"]
    command = [line for line in planned.splitlines() if line.startswith("farm-annotate") and "/sim/" in line][0]
    rerun = subprocess.run(command.replace(" -q", "").split(), capture_output=True, text=True,
                           env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert rerun.returncode == 0, rerun.stderr
    assert f"{N_VAL} cache hits" in rerun.stderr, rerun.stderr
    _make("results", *variables)
    after = {path: path.read_bytes() for path in sorted((out / "eval").rglob("*.jsonl"))}
    assert after == before
    _check_leaderboards(out)
