"""A board's statistics (farm-winrate --baseline, --adjust, --plan, --target-se, --old-judge): the
adjustments by hand, a board against a baseline as a user reads it, and planning predictions that a
seeded simulation confirms."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_winrate import cli
from test_winrate_ppi import pair, write_jsonl

from farmkit.evaluate.board_stats import adjust, separability
from farmkit.evaluate.ppi import labels_for_se, ppi_mean


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows_of(result):
    assert result.exit_code == 0, result.output
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def test_holm_and_benjamini_hochberg_by_hand():
    p = [0.01, 0.04, 0.03, 0.005, None]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04, kept monotone
    assert adjust(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    # BH: 4 p / rank = 0.02, 0.02, 0.04, 0.04, each the minimum of those at its rank and above
    assert adjust(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02, None])


def test_adjustments_agree_with_statsmodels():
    p = [0.01, 0.04, 0.03, 0.005, None]
    statsmodels = pytest.importorskip("statsmodels.stats.multitest")
    for method, theirs in (("holm", "holm"), ("bh", "fdr_bh")):
        expected = statsmodels.multipletests(p[:4], method=theirs)[1]
        assert adjust(p[:4], method) == pytest.approx(list(expected), rel=1e-12)


def test_separability_counts_pairs_whose_intervals_do_not_overlap():
    rows = [
        {"win_rate": 80.0, "ci_low": 75.0, "ci_high": 85.0},
        {"win_rate": 50.0, "ci_low": 45.0, "ci_high": 55.0},
        {"win_rate": 52.0, "ci_low": 47.0, "ci_high": 57.0},
    ]
    assert separability(rows, 0.95) == (pytest.approx(2 / 3), 3)


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """Four models and a baseline `base` against `ref` on 80 shared prompts (seeded): `strong` wins
    far more often than base, `twin` and `near` about as often."""
    rng = np.random.default_rng(7)
    shares = {"base": 0.5, "strong": 0.85, "twin": 0.5, "near": 0.55}
    records = [
        pair(model, i, 2 if rng.random() < share else 1)
        for model, share in shares.items()
        for i in range(80)
    ]
    return write_jsonl(tmp_path_factory.mktemp("board") / "board.jsonl", records)


@pytest.mark.parametrize("method", ["holm", "bh"])
def test_baseline_board_adjusts_across_the_models(board, method):
    result = invoke(str(board), "--baseline", "base", "--adjust", method, "--bootstrap", "200")
    rows = rows_of(result)
    assert [row["model_a"] for row in rows][0] == "strong"  # most significant first
    assert {row["model_b"] for row in rows} == {"base"} and len(rows) == 3
    raw = [row["p_value"] for row in rows]
    assert [row["p_adjusted"] for row in rows] == pytest.approx(adjust(raw, method))
    assert all(row["adjustment"] == method and row["n_items"] == 80 for row in rows)
    by_model = {row["model_a"]: row for row in rows}
    assert by_model["strong"]["significant"] and not by_model["twin"]["significant"]
    assert by_model["strong"]["p_adjusted"] >= by_model["strong"]["p_value"]
    assert "separability against ref: " in result.stderr
    assert "of the 6 model pairs have bootstrap 95% intervals" in result.stderr
    kind = "Holm" if method == "holm" else "Benjamini-Hochberg"
    assert f"1 of 3 models differ from base at 0.05 after {kind}" in result.stderr


def test_baseline_that_is_not_on_the_board_is_named(board, capfd):
    from farmkit.tools.farm_winrate import main

    with pytest.raises(SystemExit) as exit:  # the console script's main, in this process
        main([str(board), "--baseline", "nobody"])
    stderr = capfd.readouterr().err
    assert exit.value.code == 1
    assert "--baseline: no verdicts on 'nobody'" in stderr and "strong" in stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--baseline", "base", "--compare", "twin", "base"],
        ["--plan", "--compare", "twin", "base"],
        ["--baseline", "base", "--history", "h.jsonl"],
        ["--plan", "--plot", "board.png"],
        ["--target-se", "1"],
        ["--humans", "a.jsonl", "--old-judge", "b.jsonl"],
    ],
)
def test_conflicting_board_options_are_usage_errors(board, tmp_path, args):
    for name in ("a.jsonl", "b.jsonl"):
        write_jsonl(tmp_path / name, [pair("base", 0, 1)])
    args = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    result = invoke(str(board), *args)
    assert result.exit_code == 2, result.output


def _pilot(path, rng, n, shares):
    records = [
        pair(model, i, 2 if rng.random() < share else 1)
        for model, share in shares.items()
        for i in range(n)
    ]
    return write_jsonl(path, records)


def test_plan_predicts_the_prompts_a_simulation_needs(tmp_path):
    """The planning example of docs/evaluation.md: a pilot of 400 prompts where the model wins 60% and
    the baseline 50% against the reference; --plan --detect 10 --power 0.8 predicts n. Then 4,000
    seeded studies of n prompts with those true rates, each a two-sided paired test at 0.05, reject
    in 0.8 of them: the tolerance 0.03 is 4.7 standard errors of a 4,000-study share (0.0063), plus
    the pilot's sampling error in its standard deviation (about 2.5%, moving the power by about 1
    point); the seed makes it deterministic either way."""
    rng = np.random.default_rng(11)
    pilot = _pilot(tmp_path / "pilot.jsonl", rng, 400, {"base": 0.5, "model": 0.6})
    (row,) = rows_of(invoke(str(pilot), "--plan", "--baseline", "base", "--detect", "10"))
    assert row["generator"] == "model" and row["against"] == "base" and row["n_pilot"] == 400
    # true sd of the paired difference: sqrt(0.6 * 0.4 + 0.5 * 0.5) = 0.7, n about 385
    assert row["pilot_sd"] == pytest.approx(70, abs=3)
    n = row["n_prompts_needed"]
    assert 330 <= n <= 440
    studies = 4000
    model = rng.random((studies, n)) < 0.6
    base = rng.random((studies, n)) < 0.5
    differences = model.astype(float) - base
    t = differences.mean(axis=1) / (differences.std(axis=1, ddof=1) / np.sqrt(n))
    power = float(np.mean(np.abs(t) > NormalDist().inv_cdf(0.975)))
    assert power == pytest.approx(0.8, abs=0.03)


def test_labels_for_a_target_se_give_that_se_by_simulation():
    """labels_for_se from a pilot of 300 labels on 2,000 pairs, then 2,000 seeded draws of that many
    labels: the spread of the PPI++ estimate is the target within 10% (the sd of a 2,000-draw sd is
    1.6%; the pilot's variances add a few percent)."""
    rng = np.random.default_rng(5)
    total, target = 2000, 0.014

    def population(size=()):
        shape = (*size, total)
        truth = (rng.random(shape) < 0.4).astype(float)
        judge = np.where(rng.random(shape) < 0.75, truth, rng.random(shape) < 0.6).astype(float)
        return truth, judge

    truth, judge = population()
    n = labels_for_se(truth[:300], judge[:300], judge, target)
    assert n is not None and 300 < n < total
    truths, judges = population((2000,))
    figures = ppi_mean(truths[:, :n], judges[:, :n], judges)
    assert float(figures["estimate"].std()) == pytest.approx(target, rel=0.1)
    assert labels_for_se(truth[:300], judge[:300], judge[:400], 1e-4) is None  # unreachable


def test_old_judge_labels_its_columns_and_plans_its_subset(tmp_path):
    """--old-judge: the new judge's verdicts on every pair, the old judge's on a subset; the
    humans' columns are named for the old judge, and --target-se says the subset's size."""
    rng = np.random.default_rng(2)
    old = rng.random(200) < 0.7
    new = np.where(rng.random(200) < 0.8, old, rng.random(200) < 0.5)
    write_jsonl(tmp_path / "new.jsonl", [pair("m", i, 2 if new[i] else 1) for i in range(200)])
    write_jsonl(tmp_path / "old.jsonl", [pair("m", i, 2 if old[i] else 1) for i in range(60)])
    result = invoke(
        str(tmp_path / "new.jsonl"),
        "--old-judge",
        str(tmp_path / "old.jsonl"),
        "--target-se",
        "4",
        "--no-length-control",
    )
    (row,) = rows_of(result)
    assert row["n_old_judge"] == 60 and "n_human" not in row and "human_win_rate" not in row
    assert row["old_judge_win_rate"] == pytest.approx(100 * old[:60].mean())
    assert row["ppi_ci_low"] < row["ppi_win_rate"] < row["ppi_ci_high"]
    assert 2 <= row["ppi_labels_for_target_se"] < 200
    table = invoke(
        str(tmp_path / "new.jsonl"), "--old-judge", str(tmp_path / "old.jsonl"), "--format", "table"
    )
    assert "old_judge_win_rate" in table.stdout.splitlines()[0]
    planned = invoke(
        str(tmp_path / "new.jsonl"),
        "--old-judge",
        str(tmp_path / "old.jsonl"),
        "--plan",
        "--target-se",
        "4",
        "--no-length-control",
    )
    (plan,) = rows_of(planned)
    assert plan["n_prompts_needed"] >= 2 and plan["against"] == "50%"
    assert plan["ppi_labels_for_target_se"] == row["ppi_labels_for_target_se"]


@pytest.fixture(scope="module")
def retirement(tmp_path_factory):
    """Two models against `ref` on 400 prompts (seeded), judged by a retired judge on every pair and
    by its successor, which likes both models more (+1.2 on the logit) and length less; the old
    judge's verdicts kept on a random 150 of each model's pairs; instruction difficulties in a file."""
    folder = tmp_path_factory.mktemp("retirement")
    rng = np.random.default_rng(11)
    n = 400
    difficulty = rng.normal(0, 1, n)
    write_jsonl(
        folder / "difficulty.jsonl",
        [{"id": f"q{i}", "instruction_difficulty": float(d)} for i, d in enumerate(difficulty)],
    )
    new, old, subset = [], [], []
    for model, quality, length in (("long", -0.6, 900), ("short", 0.3, 300)):
        delta = rng.normal(length, 250, n).clip(10) - rng.normal(500, 150, n).clip(10)
        latent = quality + 0.8 * np.tanh(delta / delta.std(ddof=1)) - difficulty
        noise = rng.logistic(0, 1, n)
        old_wins = latent + noise > 0
        new_wins = latent - 0.5 * np.tanh(delta / delta.std(ddof=1)) + 1.2 + noise > 0
        chosen = set(rng.permutation(n)[:150].tolist())
        for i in range(n):
            lengths = {"len_1": 500, "len_2": int(500 + delta[i])}
            new.append({**pair(model, i, 2 if new_wins[i] else 1), **lengths})
            old.append({**pair(model, i, 2 if old_wins[i] else 1), **lengths})
            if i in chosen:
                subset.append(old[-1])
    for name, records in (("new", new), ("old", old), ("subset", subset)):
        write_jsonl(folder / f"{name}.jsonl", records)
    return folder


def test_old_judge_length_controlled_win_rate_is_carried_across(retirement):
    """ppi_lc_win_rate estimates the old judge's length-controlled win rate (its GLM on every pair,
    at the same instruction difficulties) from the new judge's verdicts and the old judge's on the
    subset, with an interval that covers it; the new judge's own length-controlled win rate is many
    standard errors away (without the correction the column would be it)."""
    difficulty = ("--instruction-difficulty", str(retirement / "difficulty.jsonl"))
    truth = {
        row["generator"]: row["length_controlled_win_rate"]
        for row in rows_of(invoke(str(retirement / "old.jsonl"), *difficulty))
    }
    result = invoke(
        str(retirement / "new.jsonl"), "--old-judge", str(retirement / "subset.jsonl"), *difficulty
    )
    for row in rows_of(result):
        model, se = row["generator"], row["ppi_lc_standard_error"]
        assert row["n_old_judge"] == 150 and 0 < se < 6
        assert row["ppi_lc_ci_low"] <= truth[model] <= row["ppi_lc_ci_high"]
        assert abs(row["ppi_lc_win_rate"] - truth[model]) < 2 * se
        assert abs(row["length_controlled_win_rate"] - truth[model]) > 4 * se
