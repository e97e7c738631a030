"""farm-correlate --humans: agreement as AlpacaFarm reports it, with bootstrap intervals (Fleiss'
kappa on Fleiss' own table, Cohen's kappa by hand, the alternative annotator test on cases built to
pass and to fail, and simulated annotators whose error rates are known)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_correlate import cli

from farmkit.core.io import dumps
from farmkit.evaluate.correlate import (
    alt_test,
    benjamini_yekutieli,
    cohen_kappa,
    fleiss_kappa,
    resample_weights,
)

# Fleiss (1971), as the Wikipedia article on Fleiss' kappa tabulates it: 10 subjects, 14 raters
# each, 5 categories; kappa 0.210
FLEISS_TABLE = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def write_jsonl(path, records):
    path.write_bytes(b"".join(map(dumps, records)))  # farmkit's own JSONL writer
    return path


def rows_of(result):
    assert result.exit_code == 0, result.output
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def test_fleiss_kappa_of_fleiss_1971():
    assert round(fleiss_kappa(FLEISS_TABLE), 3) == 0.210


def test_fleiss_kappa_with_varying_raters_by_hand():
    # item 1: 3 raters, all in category 0 -> 1; item 2: 2 raters split -> 0; observed = 1/2
    # shares over all 5 ratings: 4/5 and 1/5 -> expected = 16/25 + 1/25 = 17/25
    expected = 17 / 25
    assert fleiss_kappa([[3, 0], [1, 1]]) == pytest.approx((0.5 - expected) / (1 - expected))


def test_resampled_kappas_are_the_kappas_of_the_resampled_items():
    weights = resample_weights(len(FLEISS_TABLE), 5, seed=3)
    batch = fleiss_kappa(FLEISS_TABLE, weights)
    for row, value in zip(weights, batch, strict=True):
        repeated = [
            item for item, count in zip(FLEISS_TABLE, row, strict=True) for _ in range(count)
        ]
        assert value == pytest.approx(fleiss_kappa(repeated))
    first, second = [0, 0, 1, 2, 2, 1], [0, 1, 1, 2, 0, 1]
    weights = resample_weights(len(first), 4, seed=1)
    for row, value in zip(weights, cohen_kappa(first, second, weights), strict=True):
        a = [x for x, count in zip(first, row, strict=True) for _ in range(count)]
        b = [x for x, count in zip(second, row, strict=True) for _ in range(count)]
        assert value == pytest.approx(cohen_kappa(a, b), nan_ok=True)


def test_cohen_kappa_by_hand():
    # 3x3 table over 6 items: agree on 4 (p_o = 4/6); marginals first 2,2,2, second 1,3,2:
    # p_e = (2*1 + 2*3 + 2*2) / 36 = 12/36
    assert cohen_kappa([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]) == pytest.approx(
        (4 / 6 - 1 / 3) / (1 - 1 / 3)
    )


def _truth_and_humans(n_pairs=40, n_humans=4):
    """Binary truths; human k is wrong exactly on the pairs i with i % n_humans == k."""
    truth = [1.0 + (i % 3 == 0) for i in range(n_pairs)]
    humans = {
        f"h{k}": [3.0 - t if i % n_humans == k else t for i, t in enumerate(truth)]
        for k in range(n_humans)
    }
    return truth, humans


def test_alt_test_a_judge_that_knows_the_truth_passes():
    truth, humans = _truth_and_humans()
    result = alt_test(humans, [[t] for t in truth], epsilon=0.15)
    # held out, each human is beaten on its 10 wrong pairs and ties the judge on the other 30
    assert result["winning_rate"] == 1.0 and result["pass"] is True
    assert result["advantage"] == pytest.approx(1.0)
    assert result["humans"] == 4 and result["pairs"] == 40


def test_alt_test_a_judge_wrong_on_half_the_pairs_fails():
    truth, humans = _truth_and_humans()
    judge = [[3.0 - t if i < 20 else t] for i, t in enumerate(truth)]
    result = alt_test(humans, judge, epsilon=0.15)
    # for each held-out human: the judge loses 15 pairs, wins 5 and ties 20 (mean difference
    # 0.25 > epsilon), and is at least as good on 20 + 5 of the 40 pairs
    assert result["winning_rate"] == 0.0 and result["pass"] is False
    assert result["advantage"] == pytest.approx(25 / 40)


def test_alt_test_p_values_are_one_sided_t_tests_against_epsilon():
    from scipy import stats

    truth, humans = _truth_and_humans()
    judge = [[3.0 - t if i < 20 else t] for i, t in enumerate(truth)]
    result = alt_test(humans, judge, epsilon=0.15)
    # each held-out human: 15 pairs where only the human is as good (+1), 5 where only the judge
    # is (-1), 20 where both are (0); H1: the mean difference is below epsilon
    differences = [1] * 15 + [-1] * 5 + [0] * 20
    expected = stats.ttest_1samp(differences, 0.15, alternative="less").pvalue
    assert result["p_values"] == pytest.approx(dict.fromkeys(humans, expected))


def test_benjamini_yekutieli_by_hand():
    # four tests: BY's thresholds are k * 0.05 / (4 * (1 + 1/2 + 1/3 + 1/4)) = 0.006 k
    assert benjamini_yekutieli([0.5, 0.001, 0.017, 0.011], 0.05) == [1, 2, 3]
    # Benjamini-Hochberg (0.0125 k) would reject three of these; BY none
    assert benjamini_yekutieli([0.01, 0.02, 0.03, 0.5], 0.05) == []


def test_alt_test_needs_three_humans():
    truth, humans = _truth_and_humans(n_humans=2)
    result = alt_test(humans, [[t] for t in truth], epsilon=0.15)
    assert result["winning_rate"] is None and result["pass"] is None
    assert "three" in result["note"]


def _simulated_labels(tmp_path, flip_rates, n_pairs, seed=7):
    rng = np.random.default_rng(seed)
    truth = [float(t) for t in rng.integers(1, 3, n_pairs)]
    records = []
    for name, rate in flip_rates.items():
        flips = rng.random(n_pairs) < rate
        for i in range(n_pairs):
            label = 3.0 - truth[i] if flips[i] else truth[i]
            records.append(
                {
                    "instruction": f"task {i}",
                    "output_1": f"first answer {i}",
                    "output_2": f"second answer {i}",
                    "preference": label,
                    "annotator": name,
                }
            )
    return truth, write_jsonl(tmp_path / "humans.jsonl", records)


def test_simulated_annotators_agree_as_their_error_rates_say(tmp_path):
    rates = {"a": 0.10, "b": 0.20, "c": 0.35}
    _, humans = _simulated_labels(tmp_path, rates, 400)
    rows = rows_of(CliRunner().invoke(cli, ["--humans", str(humans), "--seed", "1"]))
    people = rows[-1]
    assert people["annotator"] == "humans"
    for first, second in (("a", "b"), ("a", "c"), ("b", "c")):
        x, y = rates[first], rates[second]
        expected = (1 - x) * (1 - y) + x * y
        name = f"{first}|{second}"
        low, high = people["annotator_pair_agreement_ci"][name]
        assert low <= people["annotator_pair_agreement"][name] <= high
        assert low <= expected <= high, (first, second, expected, low, high)
        assert high - low < 0.12  # 400 pairs: about +-0.04
    by_name = {row["annotator"]: row for row in rows[:-1]}
    assert [row["role"] for row in rows] == ["human"] * 3 + ["humans"]
    held_out = [by_name[name]["held_out_agreement"] for name in ("a", "b", "c")]
    assert held_out[0] > held_out[1] > held_out[2]  # fewer errors, more agreement
    for name, rate in rates.items():
        # against the mode of the two others: both right, both wrong (agree if also wrong), or
        # split (a tied mode: one half)
        x, y = (r for other, r in rates.items() if other != name)
        both_right, both_wrong = (1 - x) * (1 - y), x * y
        expected = both_right * (1 - rate) + both_wrong * rate + (1 - both_right - both_wrong) / 2
        low, high = by_name[name]["held_out_agreement_ci"]
        assert low <= expected <= high, (name, expected, low, high)
    assert by_name["a"]["n_pairs"] == 400
    low, high = people["fleiss_kappa_ci"]
    assert low <= people["fleiss_kappa"] <= high
    # the same seed gives the same bytes; another seed other intervals
    again = CliRunner().invoke(cli, ["--humans", str(humans), "--seed", "1"])
    other = CliRunner().invoke(cli, ["--humans", str(humans), "--seed", "2"])
    assert again.stdout == CliRunner().invoke(cli, ["--humans", str(humans), "--seed", "1"]).stdout
    assert other.stdout != again.stdout


def test_judges_against_the_humans_and_the_alt_test_from_the_command_line(tmp_path):
    truth, humans = _simulated_labels(tmp_path, {"a": 0.1, "b": 0.2, "c": 0.3}, 60)
    pair = {
        i: {
            "instruction": f"task {i}",
            "output_1": f"first answer {i}",
            "output_2": f"second answer {i}",
        }
        for i in range(60)
    }
    oracle = write_jsonl(
        tmp_path / "oracle.jsonl",
        [{**pair[i], "preference": t, "annotator": "oracle"} for i, t in enumerate(truth)],
    )
    contrary = write_jsonl(
        tmp_path / "contrary.jsonl",
        [{**pair[i], "preference": 3.0 - t, "annotator": "contrary"} for i, t in enumerate(truth)],
    )
    args = ["--judge", str(oracle), "--judge", str(contrary), "--humans", str(humans)]
    rows = rows_of(CliRunner().invoke(cli, [*args, "--bootstrap", "200"]))
    by_name = {row["annotator"]: row for row in rows}
    good, bad = by_name["oracle"], by_name["contrary"]
    assert good["role"] == "judge" and good["n_overlap"] == 60
    assert good["alt_test_pass"] is True and good["alt_test_winning_rate"] == 1.0
    assert bad["alt_test_pass"] is False and bad["alt_test_winning_rate"] == 0.0
    assert good["alt_test_epsilon"] == 0.15
    assert good["held_out_agreement"] > by_name["a"]["held_out_agreement"]
    low, high = good["held_out_agreement_ci"]
    assert low <= good["held_out_agreement"] <= high
    assert bad["held_out_agreement"] < 0.3
    markdown = CliRunner().invoke(cli, [*args, "--format", "markdown", "--bootstrap", "50"])
    assert markdown.exit_code == 0, markdown.output
    header = markdown.stdout.splitlines()[0]
    assert "| bias |" in header and "held_out_agreement" not in header  # the judges' own figures
    # the agreement table, as a paper prints it: each figure with its interval in brackets
    lines = markdown.stdout.splitlines()
    shown = next(
        r
        for r in rows_of(CliRunner().invoke(cli, [*args, "--bootstrap", "50"]))
        if r["annotator"] == "oracle"
    )
    value, (low, high) = shown["held_out_agreement"], shown["held_out_agreement_ci"]
    rho_low, rho_high = shown["alt_test_advantage_ci"]
    assert (
        f"| oracle | judge | 60 | {value:.2f} [{low:.2f}, {high:.2f}] | pass | 1.00 | "
        f"1.00 [{rho_low:.2f}, {rho_high:.2f}] |"
    ) in lines
    assert "| between the humans | value [95% CI] |" in lines
    assert any(line.startswith("| a, b: Cohen's kappa | ") for line in lines)


def test_fewer_than_three_humans_is_a_null_with_its_reason(tmp_path):
    truth, humans = _simulated_labels(tmp_path, {"a": 0.1, "b": 0.2}, 30)
    judge = write_jsonl(
        tmp_path / "judge.jsonl",
        [
            {
                "instruction": f"task {i}",
                "output_1": f"first answer {i}",
                "output_2": f"second answer {i}",
                "preference": t,
            }
            for i, t in enumerate(truth)
        ],
    )
    rows = rows_of(CliRunner().invoke(cli, ["--judge", str(judge), "--humans", str(humans)]))
    judge_row = rows[0]
    assert judge_row["alt_test_pass"] is None
    assert "three" in judge_row["alt_test_note"]
    assert judge_row["held_out_agreement"] is not None  # the held-out figure needs two humans only


def test_one_annotators_two_labels_of_one_pair_are_not_agreement(tmp_path):
    """PAIRS held the same pair twice, so alice labelled it twice: that is one human, not two who
    agree. Her second label is left out (with a warning), so the pair has no agreement to count."""
    pair = {"instruction": "task", "output_1": "first", "output_2": "second"}
    other = {"instruction": "other", "output_1": "one", "output_2": "two"}
    humans = write_jsonl(
        tmp_path / "humans.jsonl",
        [
            {**pair, "preference": 1, "annotator": "alice"},
            {**pair, "preference": 1, "annotator": "alice"},
            {**other, "preference": 1, "annotator": "alice"},
            {**other, "preference": 2, "annotator": "bob"},
        ],
    )
    result = CliRunner().invoke(cli, ["--humans", str(humans)])
    rows = rows_of(result)
    people = next(row for row in rows if row.get("pairwise_agreement") is not None)
    assert people["pairwise_agreement"] == 0  # only the pair alice and bob both labelled
    assert "alice labelled the same pair twice" in result.stderr


def test_a_screened_out_annotator_is_left_out_of_agreement_unless_asked_for(tmp_path):
    """farm-label --min-check-score marks the labels of an annotator who failed the checks
    screened_out: true. Alice and bob agree on both pairs; carol, screened out, disagrees on both:
    left out, the humans agree fully (said on stderr); with --include-screened, a third of the
    time."""
    pairs = [{"instruction": f"task {i}", "output_1": "one", "output_2": "two"} for i in range(2)]
    labels = [{**p, "preference": 1, "annotator": name} for p in pairs for name in ("alice", "bob")]
    labels += [{**p, "preference": 2, "annotator": "carol", "screened_out": True} for p in pairs]
    humans = write_jsonl(tmp_path / "humans.jsonl", labels)

    def agreement(*more):
        result = CliRunner().invoke(cli, ["--humans", str(humans), *more])
        people = next(row for row in rows_of(result) if row.get("pairwise_agreement") is not None)
        return people["pairwise_agreement"], result.stderr

    left_out, said = agreement()
    assert left_out == 1
    assert "carol was screened out by their check answers" in said
    assert "2 labels left out" in said
    kept, said = agreement("--include-screened")
    assert kept == pytest.approx(1 / 3)
    assert "screened out" not in said
