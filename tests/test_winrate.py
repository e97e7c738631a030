"""farm-winrate: AlpacaEval's figures on hand-computed cases and on the published leaderboards, the
reference/swap handling, bootstrap, paired comparison, length control, formats, plot, errors, and
memory that does not grow with the number of records."""

from __future__ import annotations

import csv
import gzip
import math
import tracemalloc

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool, shared_data
from farmkit.tools.farm_winrate import cli
from scipy import stats

from farmkit import winrate
from farmkit.io import FarmError
from farmkit.winrate import WinrateTable, fit_length_model

PROVENANCE = {"farm-winrate": {"tool": "farm-winrate", "version": "0.1.0"}}


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def prefs(model, values, reference="ref", lengths=None):
    records = []
    for i, value in enumerate(values):
        record = {"instruction": f"task {i}", "generator_1": reference, "generator_2": model, "preference": value}
        if lengths is not None:
            record["len_1"], record["len_2"] = lengths[i]
        records.append(record)
    return records


def invoke(*args, input=None):
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    return result


def assert_row(row, expected):
    assert row.keys() == expected.keys()
    for key, value in expected.items():
        assert row[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key


def rows_of(result):
    return [orjson.loads(line) for line in result.stdout.splitlines()]


# x = [1, 1, 0, .5, .5] after dropping the null: mean .6, sd(ddof=1) = sqrt(.175)
EXPECTED_A = {
    "generator": "A", "reference": "ref", "win_rate": 60.0, "standard_error": 100 * math.sqrt(0.175 / 5),
    "n_wins": 2, "n_losses": 1, "n_draws": 2, "n_total": 5, "n_dropped": 1, "discrete_win_rate": 60.0,
    "avg_length": None, "length_controlled_win_rate": None, "lc_standard_error": None, "length_coefficient": None,
}


def test_alpacaeval_figures_by_hand(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [2, 2, 1, 1.5, 0, None]) + prefs("B", [1, 1, 2]))
    result = invoke(str(path), "--no-length-control")
    assert result.exit_code == 0, result.output
    rows = rows_of(result)
    assert [r["generator"] for r in rows] == ["A", "B"]  # best first
    expected_a = {k: v for k, v in EXPECTED_A.items() if "length_c" not in k and k != "lc_standard_error"}
    assert rows[0].pop("provenance") == PROVENANCE
    assert_row(rows[0], expected_a)
    assert rows[1]["win_rate"] == pytest.approx(100 / 3)
    assert rows[1]["standard_error"] == pytest.approx(100 * np.std([0, 0, 1], ddof=1) / math.sqrt(3))
    assert "1 null verdicts dropped" in result.stderr


def test_fractional_preferences_count_fractionally(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [1.25, 1.75, 2.0, 1.5]))
    (row,) = rows_of(invoke(str(path)))
    assert row["win_rate"] == pytest.approx(100 * (0.25 + 0.75 + 1 + 0.5) / 4)
    assert (row["n_wins"], row["n_losses"], row["n_draws"]) == (2, 1, 1)
    assert row["discrete_win_rate"] == pytest.approx(100 * 2.5 / 4)


def test_reference_in_position_2_is_swapped(tmp_path):
    straight = prefs("A", [2, 2, 1, 1.5, 0, None])
    swapped = [{**r, "generator_1": "A", "generator_2": "ref", "preference": None if r["preference"] is None else
                (r["preference"] if r["preference"] in (0, 1.5) else 3 - r["preference"])} for r in straight]
    mixed = write_jsonl(tmp_path / "mixed.jsonl", straight[:3] + swapped[3:] + prefs("X", [2], reference="other"))
    result = invoke(str(mixed), "--reference", "ref", "--no-length-control")
    (row,) = rows_of(result)
    assert row.pop("provenance") == {"farm-winrate": {**PROVENANCE["farm-winrate"], "reference": "ref"}}
    assert_row(row, {k: v for k, v in EXPECTED_A.items() if "length_c" not in k and k != "lc_standard_error"})
    assert "skipped 1 records that do not involve the reference 'ref'" in result.stderr
    all_swapped = write_jsonl(tmp_path / "swapped.jsonl", swapped)
    (row,) = rows_of(invoke(str(all_swapped), "--swap", "--no-length-control"))
    assert row["win_rate"] == 60.0 and row["generator"] == "A" and row["reference"] == "ref"
    assert invoke(str(all_swapped), "--swap", "--reference", "ref").exit_code == 2


def test_models_against_several_references_get_one_row_each(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [2, 2]) + prefs("A", [1, 1], reference="other"))
    rows = rows_of(invoke(str(path)))
    assert [(r["generator"], r["reference"], r["win_rate"]) for r in rows] == [("A", "ref", 100.0), ("A", "other", 0.0)]


def test_bootstrap_is_seeded_and_brackets_the_win_rate(tmp_path):
    rng = np.random.default_rng(3)
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", rng.choice([1, 2, 1.5], size=300, p=[0.3, 0.6, 0.1]).tolist()))
    first = invoke(str(path), "--bootstrap", "500", "--seed", "1")
    again = invoke(str(path), "--bootstrap", "500", "--seed", "1")
    other = invoke(str(path), "--bootstrap", "500", "--seed", "2")
    assert first.stdout == again.stdout
    (row,) = rows_of(first)
    assert row["ci_low"] < row["win_rate"] < row["ci_high"]
    # a percentile interval of the mean is close to the normal one, +-1.96 standard errors
    assert row["ci_high"] - row["ci_low"] == pytest.approx(2 * 1.96 * row["standard_error"], rel=0.15)
    assert (row["ci_low"], row["ci_high"]) != (rows_of(other)[0]["ci_low"], rows_of(other)[0]["ci_high"])
    assert row["provenance"]["farm-winrate"]["seed"] == 1


def test_paired_comparison_matches_a_paired_t_test(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.choice([1, 2], size=80, p=[0.3, 0.7])
    b = np.where(rng.random(80) < 0.8, a, 3 - a)  # b mostly agrees with a item by item
    records = prefs("a", a.tolist()) + prefs("b", b.tolist()) + prefs("c", [2] * 10)
    path = write_jsonl(tmp_path / "p.jsonl", records)
    (row,) = rows_of(invoke(str(path), "--compare", "a", "b"))
    difference = (a - 1.0) - (b - 1.0)
    test = stats.ttest_rel(a - 1.0, b - 1.0)
    assert row["n_items"] == 80
    assert row["difference"] == pytest.approx(100 * difference.mean())
    assert row["standard_error"] == pytest.approx(100 * difference.std(ddof=1) / math.sqrt(80))
    assert row["p_value"] == pytest.approx(test.pvalue)
    assert row["win_rate_a"] == pytest.approx(100 * (a - 1).mean())
    with pytest.raises(FarmError, match="--compare: no verdicts on 'd' in the input; the models are a, b, c"):
        invoke(str(path), "--compare", "a", "d")


def test_length_control_removes_a_pure_length_preference(tmp_path):
    # the judge's verdict depends on the length ratio only: P(2 wins) = sigmoid(2 z), z = log ratio;
    # model A writes longer outputs, so its raw win rate is high but at equal length it is 50%
    records = []
    for i, z in enumerate(np.linspace(-0.5, 1.5, 101)):
        reference_length = 400
        model_length = round((reference_length + 1) * math.exp(z)) - 1
        z_exact = math.log((model_length + 1) / (reference_length + 1))
        preference = 1 + 1 / (1 + math.exp(-2 * z_exact))
        records.append({"instruction": f"t{i}", "generator_1": "ref", "generator_2": "A", "preference": preference,
                        "output_1": "r" * reference_length, "output_2": "a" * model_length})
    (row,) = rows_of(invoke(str(write_jsonl(tmp_path / "p.jsonl", records))))
    assert row["win_rate"] > 65
    assert row["length_controlled_win_rate"] == pytest.approx(50, abs=0.3)
    assert row["length_coefficient"] == pytest.approx(2, abs=0.05)
    assert row["avg_length"] == sum(len(r["output_2"]) for r in records) // len(records)


def test_length_model_recovers_known_parameters():
    z = np.linspace(-2, 2, 41)
    counts = np.full_like(z, 1000.0)
    targets = counts / (1 + np.exp(-(0.7 - 1.3 * z)))
    (alpha, beta), covariance = fit_length_model(counts, targets, z)
    assert (alpha, beta) == pytest.approx((0.7, -1.3), abs=1e-3)
    assert covariance[0, 0] > 0


def test_formats(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [2, 1]) + prefs("B", [1, 1]))
    csv_text = invoke(str(path), "--format", "csv", "--no-length-control").stdout
    assert csv_text == (
        "generator,reference,win_rate,standard_error,n_wins,n_losses,n_draws,n_total,n_dropped,avg_length\n"
        "A,ref,50.0,50.0,1,1,0,2,0,\n"
        "B,ref,0.0,0.0,0,2,0,2,0,\n"
    )
    table = invoke(str(path), "--format", "table", "--no-length-control").stdout
    assert table == (
        "generator  reference  win_rate  standard_error  n_wins  n_losses  n_draws  n_total  n_dropped  avg_length\n"
        "A          ref           50.00           50.00       1         1        0        2          0\n"
        "B          ref            0.00            0.00       0         2        0        2          0\n"
    )
    markdown = invoke(str(path), "--format", "markdown", "--no-length-control").stdout
    assert markdown.splitlines()[1] == "|---|---|---|---|---|---|---|---|---|---|"
    assert markdown.splitlines()[2] == "| A | ref | 50.00 | 50.00 | 1 | 1 | 0 | 2 | 0 |  |"


def test_plot_and_atomic_output(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [2, 1, 2]) + prefs("B", [1, 1, 2]))
    result = invoke(str(path), "--plot", str(tmp_path / "board.png"), "-o", str(tmp_path / "board.jsonl"))
    assert result.exit_code == 0
    assert (tmp_path / "board.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["generator"] for r in map(orjson.loads, (tmp_path / "board.jsonl").read_bytes().splitlines())] == ["A", "B"]
    bad = write_jsonl(tmp_path / "bad.jsonl", prefs("A", [2, 1]) + prefs("A", [0.5]))
    result = run_tool("farm-winrate", str(bad), "-o", str(tmp_path / "out.jsonl"))
    assert result.returncode == 1
    assert result.stderr.decode() == (
        f"farm-winrate: error: {bad}:3: preference 0.5 is outside [1, 2]; expected 1, 2, 1.5 (tie), "
        "a value in between, 0 (AlpacaEval's legacy tie) or null\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "board.jsonl", "board.png", "p.jsonl"]


@pytest.mark.parametrize(("record", "message"), [
    ({"generator_1": "ref", "preference": 2}, "no generator_2 to rank"),
    ({"generator_1": "ref", "generator_2": "A", "preference": "2"}, "field 'preference' is \"2\"; expected a number or null"),
    ({"generator_1": "ref", "generator_2": "A"}, "missing field 'preference'"),
])
def test_bad_records_name_file_and_line(tmp_path, record, message):
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in [*prefs("A", [2, 1]), record])))
    result = run_tool("farm-winrate", str(path))
    assert result.returncode == 1
    assert result.stderr.decode().startswith(f"farm-winrate: error: {path}:3: {message}")
    assert result.stdout == b""


def test_stdin_and_several_files(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", prefs("A", [2, 2]))
    stdin = b"".join(orjson.dumps(r) + b"\n" for r in prefs("A", [1, 1]))
    (row,) = rows_of(invoke(str(first), "-", input=stdin))
    assert (row["win_rate"], row["n_total"]) == (50.0, 4)


def test_memory_does_not_grow_with_records(tmp_path, monkeypatch):
    monkeypatch.setattr(winrate, "CHUNK", 250)
    rng = np.random.default_rng(0)

    def peak(n):
        values = rng.choice([1, 2, 1.5], size=n).tolist()
        path = write_jsonl(tmp_path / f"{n}.jsonl", [
            {"generator_1": "ref", "generator_2": f"m{i % 5}", "preference": v, "len_1": 100 + i % 7, "len_2": 90 + i % 11}
            for i, v in enumerate(values)])
        table = WinrateTable()
        tracemalloc.start()
        table.add_file(str(path))
        table.rows()
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return size

    small, large = peak(1_000), peak(16_000)
    assert large < 1.5 * small, (small, large)  # 16x the records, nearly the same peak


# -------------------------------------------------------------- AlpacaEval's published leaderboards

BOARDS = [
    ("alpaca_eval_gpt4", "data_AlpacaEval/alpaca_eval_gpt4_leaderboard.csv"),
    ("weighted_alpaca_eval_gpt4_turbo", "data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"),
    ("alpaca_eval_gpt4_turbo_fn", "data_AlpacaEval_2/alpaca_eval_gpt4_turbo_fn_leaderboard.csv"),
    ("alpaca_eval_cot_gpt4_turbo_fn", "data_AlpacaEval_2/alpaca_eval_cot_gpt4_turbo_fn_leaderboard.csv"),
]


@pytest.mark.parametrize(("annotator", "board"), BOARDS)
def test_reproduces_alpacaeval_leaderboards(tmp_path, annotator, board):
    annotations = shared_data(f"alpaca_eval/annotations/{annotator}.jsonl.gz")
    published = {row[""]: row for row in csv.DictReader(open(shared_data(f"alpaca_eval/leaderboards/{board}")))}
    # the upstream data errors (data/README.md): a results_dir holding another model's annotations,
    # or another annotator's; keep the rows that are what their file says they are
    kept = [r for r in map(orjson.loads, gzip.open(annotations)) if r["generator_2"] == r["results_dir"] and r["annotator"] == annotator]
    records_per_model = {}
    for r in kept:
        records_per_model[r["generator_2"]] = records_per_model.get(r["generator_2"], 0) + 1
    path = tmp_path / "kept.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in kept)))
    result = invoke(str(path), "-q")
    assert result.exit_code == 0
    rows = {row["generator"]: row for row in rows_of(result)}
    compared = [name for name in rows if name in published]
    assert len(compared) >= 3
    for name in compared:
        row, expected = rows[name], published[name]
        assert row["win_rate"] == pytest.approx(float(expected["win_rate"]), abs=1e-6), name
        assert row["standard_error"] == pytest.approx(float(expected["standard_error"]), abs=1e-6), name
        for ours, theirs in (("n_wins", "n_wins"), ("n_losses", "n_wins_base"), ("n_draws", "n_draws"), ("n_total", "n_total")):
            assert row[ours] == float(expected[theirs]), (name, ours)
        if expected.get("discrete_win_rate"):
            assert row["discrete_win_rate"] == pytest.approx(float(expected["discrete_win_rate"]), abs=1e-6), name
        # avg_length is AlpacaEval's over all 805 outputs: comparable where no annotation row is missing
        if expected.get("avg_length") and records_per_model[name] == 805:
            assert row["avg_length"] == int(float(expected["avg_length"])), name


def test_line_plot_draws_each_series(tmp_path):
    from matplotlib.image import imread

    from farmkit.plots import line_plot

    path = line_plot(tmp_path / "curve.png", {"ppo": ([1, 4, 16], [0.4, 0.5, 0.45]), "bon": ([1, 4, 16], [0.4, 0.55, 0.6])},
                     xlabel="n", ylabel="win rate", log_x=True)
    pixels = imread(path)
    colors = {tuple(p) for p in (pixels[:, :, :3] * 255).round().astype(int).reshape(-1, 3)[::7]}
    # matplotlib's first two cycle colours (blue, orange) are both drawn
    assert any(abs(r - 31) < 20 and abs(g - 119) < 20 and abs(b - 180) < 20 for r, g, b in colors)
    assert any(abs(r - 255) < 20 and abs(g - 127) < 20 and abs(b - 14) < 20 for r, g, b in colors)
