"""bench/retirement_coverage.py on the shared AlpacaEval annotations (skipped when absent): the old
judge's (alpaca_eval_cot_gpt4_turbo_fn) win rates estimated from the new judge's
(weighted_alpaca_eval_gpt4_turbo) verdicts on every pair plus the old judge's on a random subset
cover the old judge's full-data win rates, and farm-winrate --old-judge prints the same estimate as
the benchmark computes; the length-controlled ones too (slow)."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from conftest import shared_data
from farmkit.tools.farm_winrate import cli

from farmkit.evaluate.ppi import ppi_mean

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    path = ROOT / "bench" / "retirement_coverage.py"
    spec = importlib.util.spec_from_file_location("retirement_coverage", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = load_bench()


@pytest.fixture(scope="module")
def folder():
    shared_data(f"alpaca_eval/annotations/{bench.OLD}.jsonl.gz")
    return shared_data(f"alpaca_eval/annotations/{bench.NEW}.jsonl.gz").parents[1]


def test_the_old_judges_board_is_covered_with_200_verdicts(folder):
    """3 generators x 200 seeded draws of 200 pairs: coverage of the nominal 95% interval at least
    0.9 (the full run measures 0.96; the standard error of a share of 600 draws is 0.008, so 0.9 is
    seven of them below)."""
    (row,) = bench.measure(folder, draws=200, seed=1, sizes=(200,))[:1]
    assert row["generators"] == 3
    assert row["ppi_coverage"] >= 0.9
    assert row["ppi_mean_width_points"] < row["subset_alone_mean_width_points"]


def test_farm_winrate_old_judge_gives_the_benchmarks_estimate(folder, tmp_path):
    def rows(annotator):
        with gzip.open(folder / "annotations" / f"{annotator}.jsonl.gz") as handle:
            return [
                record
                for record in map(orjson.loads, handle)
                if record["generator_2"] == "claude-2.1" == record["results_dir"]
            ]

    new, old = rows(bench.NEW), rows(bench.OLD)
    subset = np.random.default_rng(0).permutation(len(old))[:150]
    (tmp_path / "new.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in new))
    (tmp_path / "old.jsonl").write_bytes(b"".join(orjson.dumps(old[i]) + b"\n" for i in subset))
    result = CliRunner().invoke(
        cli,
        [str(tmp_path / "new.jsonl"), "--old-judge", str(tmp_path / "old.jsonl"), "-q"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (row,) = [orjson.loads(line) for line in result.stdout.splitlines()]
    pairs = bench.paired(folder)["claude-2.1"]
    index = {r["instruction_index"]: i for i, r in enumerate(new)}
    new_x = bench.win_values(new, range(1, len(new) + 1))
    chosen = [index[old[i]["instruction_index"]] for i in subset]
    old_x = bench.win_values([old[i] for i in subset], range(1, len(subset) + 1))
    figures = ppi_mean(old_x, new_x[chosen], new_x)
    assert row["n_old_judge"] == 150 and len(pairs[0]) == 805
    assert row["ppi_win_rate"] == pytest.approx(100 * float(figures["estimate"]), rel=1e-9)
    assert row["ppi_ci_low"] == pytest.approx(100 * float(figures["low"]), rel=1e-9)
    assert row["length_controlled_win_rate"] is not None  # the new judge's own, as before
    # and the old judge's, carried across: one model, so no difficulty term
    assert row["ppi_lc_ci_low"] < row["ppi_lc_win_rate"] < row["ppi_lc_ci_high"]


@pytest.mark.slow
def test_the_old_judges_length_controlled_board_is_covered(folder):
    """The old judge's length-controlled win rates (its GLM on all 805 pairs of each of the 3
    generators, at the new judge's board's instruction difficulties) covered by farm-winrate
    --old-judge's ppi_lc interval from 200 of its verdicts: 300 seeded draws, coverage of the nominal
    95% interval at least 0.88 (the full run, 2,000 draws, measures 0.928; the standard error of a
    share of 900 draws near 0.95 is 0.007, so 0.88 is ten of them below), and the interval narrower
    on average than the old judge's subset alone (the same GLM with lambda = 0)."""
    (row,) = bench.measure_lc(folder, draws=300, seed=1, sizes=(200,))
    assert row["generators"] == 3 and row["fits_not_converged"] == 0
    assert row["ppi_lc_coverage"] >= 0.88
    assert row["ppi_lc_mean_width_points"] < row["subset_alone_lc_mean_width_points"]
