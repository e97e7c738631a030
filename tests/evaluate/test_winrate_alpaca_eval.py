"""AlpacaEval-compatible files: farm-winrate --format alpaca-eval (the leaderboard CSV AlpacaEval
publishes, read back with pandas by AlpacaEval's own column names), --sort-by lc|win_rate, and
farm-correlate's evaluators table in AlpacaEval's form (percent, # parsed, Spearman and Pearson with a
human leaderboard), checked against the published files in ../shared/data where present."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import orjson
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import run_tool, shared_data
from farmkit.tools.farm_correlate import cli as correlate_cli
from farmkit.tools.farm_winrate import cli as winrate_cli
from scipy import stats

# AlpacaEval 2's leaderboard header (data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv),
# the model name being the unnamed first column
BOARD_COLUMNS = [
    "win_rate",
    "standard_error",
    "n_wins",
    "n_wins_base",
    "n_draws",
    "n_total",
    "discrete_win_rate",
    "mode",
    "avg_length",
    "length_controlled_winrate",
    "lc_standard_error",
]
# AlpacaEval's evaluators leaderboard header (evaluators/evaluators_leaderboard.csv)
EVALUATOR_COLUMNS = [
    "Human agreement",
    "Price [$/1000 examples]",
    "Time [seconds/1000 examples]",
    "Spearman corr.",
    "Pearson corr.",
    "Bias",
    "Variance",
    "Proba. prefer longer",
    "Proba. prefer lists",
    "Proba. prefer 1",
    "# parsed",
    "mode",
]


def _write(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def _glm(seed: int, models: dict[str, tuple[float, float]], n_items: int = 400) -> list[dict]:
    """Verdicts where the judge likes longer outputs: quality plus a length effect plus item ease."""
    rng = np.random.default_rng(seed)
    ease = rng.normal(0, 1.0, n_items)
    records = []
    for model, (quality, typical_length) in models.items():
        lengths = rng.normal(typical_length, 250, n_items).clip(10)
        reference = rng.normal(500, 150, n_items).clip(10)
        delta = lengths - reference
        logit = quality + 1.5 * np.tanh(delta / delta.std(ddof=1)) + ease
        wins = rng.random(n_items) < 1 / (1 + np.exp(-logit))
        for i in range(n_items):
            records.append(
                {
                    "instruction": f"task {i}",
                    "generator_1": "ref",
                    "generator_2": model,
                    "preference": 2 if wins[i] else (1.5 if i % 50 == 0 else 1),
                    "len_1": int(reference[i]),
                    "len_2": int(lengths[i]),
                }
            )
    return records


# "long" wins on raw win rate by length alone; "good" is better at equal length
MODELS = {"long": (-0.3, 900), "good": (0.6, 450), "short": (0.0, 200)}


def _winrate(*args: str):
    return CliRunner().invoke(winrate_cli, list(args), catch_exceptions=False)


def test_a_board_in_alpaca_eval_format_is_read_by_alpaca_evals_column_names(tmp_path):
    prefs = _write(tmp_path / "p.jsonl", _glm(0, MODELS))
    ours = {r["generator"]: r for r in map(orjson.loads, _winrate(prefs).stdout.splitlines())}
    board = tmp_path / "board.csv"
    result = _winrate(prefs, "--format", "alpaca-eval", "-o", str(board))
    assert result.exit_code == 0, result.stderr
    frame = pd.read_csv(board, index_col=0)  # as AlpacaEval reads its leaderboards
    assert list(frame.columns) == BOARD_COLUMNS
    assert sorted(frame.index) == sorted(MODELS)
    for model, row in ours.items():
        published = frame.loc[model]
        assert published["win_rate"] == pytest.approx(row["win_rate"])  # percent, as AlpacaEval's
        assert published["standard_error"] == pytest.approx(row["standard_error"])
        assert published["length_controlled_winrate"] == pytest.approx(
            row["length_controlled_win_rate"]
        )
        assert published["lc_standard_error"] == pytest.approx(row["lc_standard_error"])
        assert published["n_wins"] == row["n_wins"]
        assert published["n_wins_base"] == row["n_losses"]
        assert published["n_draws"] == row["n_draws"] > 0
        assert published["n_total"] == row["n_total"] == 400
        assert published["discrete_win_rate"] == pytest.approx(row["discrete_win_rate"])
        assert published["avg_length"] == row["avg_length"]
        assert published["mode"] == "community"
    assert 1 < frame["win_rate"].max() <= 100  # percent, not fractions
    # the header is AlpacaEval's byte for byte: an unnamed first column, then its names
    assert board.read_text().splitlines()[0] == "," + ",".join(BOARD_COLUMNS)


@pytest.mark.parametrize(
    ("sort_by", "column"), [("lc", "length_controlled_win_rate"), ("win_rate", "win_rate")]
)
def test_sort_by_orders_the_board(tmp_path, sort_by, column):
    prefs = _write(tmp_path / "p.jsonl", _glm(1, MODELS))
    rows = [
        orjson.loads(line) for line in _winrate(prefs, "--sort-by", sort_by).stdout.splitlines()
    ]
    values = [row[column] for row in rows]
    assert values == sorted(values, reverse=True)
    # the two orders differ on this board: length buys raw win rate, not the controlled one
    by_raw = [r["generator"] for r in sorted(rows, key=lambda r: -r["win_rate"])]
    by_lc = [r["generator"] for r in sorted(rows, key=lambda r: -r["length_controlled_win_rate"])]
    assert by_raw != by_lc
    board = tmp_path / "b.csv"
    _winrate(prefs, "--sort-by", sort_by, "--format", "alpaca-eval", "-o", str(board))
    assert list(pd.read_csv(board, index_col=0).index) == [r["generator"] for r in rows]


def test_win_rate_is_the_default_order(tmp_path):
    prefs = _write(tmp_path / "p.jsonl", _glm(1, MODELS))
    default = _winrate(prefs).stdout
    assert default == _winrate(prefs, "--sort-by", "win_rate").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sort-by", "lc", "--no-length-control"], "--sort-by lc"),
        (["--format", "alpaca-eval", "--compare", "good", "long"], "--compare"),
    ],
)
def test_options_that_cannot_go_together_are_usage_errors(tmp_path, args, message):
    prefs = _write(tmp_path / "p.jsonl", _glm(2, MODELS, n_items=50))
    result = _winrate(prefs, *args)
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""


def test_an_alpaca_eval_board_holds_one_reference(tmp_path):
    records = _glm(3, MODELS, n_items=60)
    records += [{**r, "generator_1": "other"} for r in _glm(4, {"good": (0.6, 450)}, n_items=60)]
    out = tmp_path / "b.csv"
    prefs = _write(tmp_path / "p.jsonl", records)
    result = run_tool("farm-winrate", prefs, "--format", "alpaca-eval", "-o", str(out))
    stderr = result.stderr.decode()
    assert (
        result.returncode == 1 and "one reference" in stderr and "--reference-generator" in stderr
    )
    assert not out.exists()  # nothing half-written
    chosen = run_tool(
        "farm-winrate", prefs, "--format", "alpaca-eval", "--reference-generator", "ref"
    )
    assert chosen.returncode == 0 and len(chosen.stdout.splitlines()) == 1 + len(MODELS)


def test_the_board_has_the_published_alpaca_eval_2_columns_and_figures(tmp_path):
    """The published AlpacaEval 2 board and its annotations: the same header, in the same order, and
    the same raw figures for the models written from the same verdicts."""
    name = "weighted_alpaca_eval_gpt4_turbo"
    published_path = shared_data(
        f"alpaca_eval/leaderboards/data_AlpacaEval_2/{name}_leaderboard.csv"
    )
    annotations = shared_data(f"alpaca_eval/annotations/{name}.jsonl.gz")
    with open(published_path, newline="") as handle:
        header = next(csv.reader(handle))
    assert header == ["", *BOARD_COLUMNS]
    models = ("claude-2.1", "vicuna-13b", "gpt-3.5-turbo-1106")
    kept = [
        r
        for r in map(orjson.loads, gzip.open(annotations))
        if r["generator_2"] == r["results_dir"] and r["generator_2"] in models
    ]
    board = tmp_path / "b.csv"
    result = _winrate(
        _write(tmp_path / "a.jsonl", kept),
        "--format",
        "alpaca-eval",
        "--no-length-control",
        "-o",
        str(board),
    )
    assert result.exit_code == 0, result.stderr
    with open(board, newline="") as handle:
        assert next(csv.reader(handle)) == header
    ours, published = pd.read_csv(board, index_col=0), pd.read_csv(published_path, index_col=0)
    assert sorted(ours.index) == sorted(models)
    for model in models:
        for column in ("win_rate", "standard_error", "discrete_win_rate"):
            assert ours.loc[model, column] == pytest.approx(published.loc[model, column], rel=1e-9)
        for column in ("n_wins", "n_wins_base", "n_draws", "n_total", "avg_length"):
            assert ours.loc[model, column] == published.loc[model, column], (model, column)


# -------------------------------------------------------------- the evaluators table


def _pairs(n: int) -> list[dict]:
    return [
        {
            "pair_id": i,
            "instruction": f"q{i}",
            "output_1": "short" if i % 3 else "a much longer answer, " * 3,
            "output_2": "a longer answer, with detail" if i % 3 else "brief",
        }
        for i in range(n)
    ]


def _judge_records(name: str, n: int, flip_every: int) -> list[dict]:
    records = []
    for pair in _pairs(n):
        truth = 2 if pair["pair_id"] % 3 else 1
        label = 3 - truth if pair["pair_id"] % flip_every == 0 else truth
        records.append({**pair, "annotator": name, "preference": label})
    return records


def test_the_evaluators_table_in_alpaca_eval_form(tmp_path):
    humans = [
        {**pair, "annotator": f"h{k}", "preference": 2 if pair["pair_id"] % 3 else 1}
        for pair in _pairs(60)
        for k in range(3)
    ]
    humans[0]["preference"] = 2  # one dissenting label
    judge_a = _write(tmp_path / "a.jsonl", _judge_records("judge_a", 60, 4))
    judge_b = _write(tmp_path / "b.jsonl", _judge_records("judge_b", 60, 7))
    humans_path = _write(tmp_path / "h.jsonl", humans)
    human_board = {"m1": 20.0, "m2": 35.0, "m3": 50.0, "m4": 60.0, "m5": 80.0}
    judge_boards = {
        "judge_a": {"m1": 25.0, "m2": 30.0, "m3": 55.0, "m4": 52.0, "m5": 70.0},
        "judge_b": {"m1": 10.0, "m2": 40.0, "m3": 45.0, "m4": 75.0, "m5": 90.0},
    }

    def board(path, scores, annotator=None):
        rows = [
            {"generator": m, "win_rate": s, **({"annotator": annotator} if annotator else {})}
            for m, s in scores.items()
        ]
        return _write(path, rows)

    human_board_path = board(tmp_path / "humans_board.jsonl", human_board)
    boards = [
        board(tmp_path / "judge_a_board.jsonl", judge_boards["judge_a"], "judge_a"),
        board(tmp_path / "judge_b.jsonl", judge_boards["judge_b"]),  # named by its file
    ]
    common = ["--judge", judge_a, "--judge", judge_b, "--humans", humans_path]
    plain = CliRunner().invoke(correlate_cli, common, catch_exceptions=False)
    rows = {r["annotator"]: r for r in map(orjson.loads, plain.stdout.splitlines())}
    out = tmp_path / "evaluators.csv"
    args = [
        *common,
        "--human-board",
        human_board_path,
        "--judge-board",
        boards[0],
        "--judge-board",
        boards[1],
    ]
    result = CliRunner().invoke(
        correlate_cli, [*args, "--format", "alpaca-eval", "-o", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    frame = pd.read_csv(out, index_col=0)
    assert list(frame.columns) == EVALUATOR_COLUMNS
    assert list(frame.index) == ["judge_a", "judge_b", "humans"]
    for name in ("judge_a", "judge_b"):
        row, ours = frame.loc[name], rows[name]
        assert row["Human agreement"] == pytest.approx(100 * ours["human_agreement_alpacaeval"])
        assert row["Bias"] == pytest.approx(100 * ours["bias"])
        assert row["Proba. prefer longer"] == pytest.approx(ours["p_prefers_longer"])
        assert row["Proba. prefer 1"] == pytest.approx(ours["p_prefers_first"])
        assert row["# parsed"] == 60
        x, y = list(judge_boards[name].values()), list(human_board.values())
        assert row["Spearman corr."] == pytest.approx(stats.spearmanr(x, y)[0])
        assert row["Pearson corr."] == pytest.approx(stats.pearsonr(x, y)[0])
    people = frame.loc["humans"]
    assert people["Human agreement"] == pytest.approx(100 * rows["humans"]["human_agreement"])
    assert people["# parsed"] == 180 and people["Spearman corr."] == 1.0
    assert 50 < frame.loc["judge_a", "Human agreement"] <= 100  # percent


def test_a_judge_board_that_names_no_judge_is_an_error(tmp_path):
    judge = _write(tmp_path / "a.jsonl", _judge_records("judge_a", 12, 4))
    stray = _write(
        tmp_path / "stray.jsonl",
        [{"generator": "m1", "win_rate": 10.0}, {"generator": "m2", "win_rate": 20.0}],
    )
    result = run_tool(
        "farm-correlate",
        *("--judge", judge, "--human-board", stray, "--judge-board", stray),
        *("--format", "alpaca-eval"),
    )
    stderr = result.stderr.decode()
    assert result.returncode == 1 and result.stdout == b""
    assert "'stray' is none of the judges read (judge_a)" in stderr


def test_the_evaluators_table_has_the_published_columns(tmp_path):
    published = shared_data("alpaca_eval/leaderboards/evaluators/evaluators_leaderboard.csv")
    with open(published, newline="") as handle:
        header = next(csv.reader(handle))
    assert header == ["", *EVALUATOR_COLUMNS]
    seeds = [shared_data(f"alpaca_eval/gpt4_b1_seeds/annotations_seed{i}.json") for i in range(2)]
    out = tmp_path / "e.csv"
    args = [a for seed in seeds for a in ("--judge", str(seed))]
    result = CliRunner().invoke(
        correlate_cli, [*args, "--format", "alpaca-eval", "-o", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    with open(out, newline="") as handle:
        assert next(csv.reader(handle)) == header
    frame = pd.read_csv(out, index_col=0)
    assert frame["# parsed"].iloc[0] == 2 * 648  # two runs of the 648 pairs


def test_the_evaluators_table_counts_lists_with_alpaca_evals_detector(tmp_path):
    """ "Proba. prefer lists" counts the pairs where exactly one output holds a list as AlpacaEval's
    contains_list sees it (loose: "Sure. Here" counts), not farm-correlate's line-based detector: two
    pairs with a bulleted list that the judge rejects (a list for both detectors), two where the
    judge prefers "Sure. Here it is" (a list for AlpacaEval's only). AlpacaEval: 2 of 4 prefer the
    list; the line-based detector would see 0 of 2."""
    records = [
        {"pair_id": 0, "output_1": "- one\n- two", "output_2": "plain words", "preference": 2},
        {"pair_id": 1, "output_1": "plain text", "output_2": "* first\n* second", "preference": 1},
        {"pair_id": 2, "output_1": "Sure. Here it is", "output_2": "nope", "preference": 1},
        {"pair_id": 3, "output_1": "fine", "output_2": "Okay. See below", "preference": 2},
    ]
    judge = _write(tmp_path / "j.jsonl", [{**r, "annotator": "j"} for r in records])
    out = tmp_path / "evaluators.csv"
    result = CliRunner().invoke(
        correlate_cli,
        ["--judge", judge, "--format", "alpaca-eval", "-o", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    assert pd.read_csv(out, index_col=0).loc["j", "Proba. prefer lists"] == pytest.approx(0.5)
    plain = CliRunner().invoke(correlate_cli, ["--judge", judge], catch_exceptions=False)
    (row,) = map(orjson.loads, plain.stdout.splitlines())
    assert row["p_prefers_lists"] == 0.0  # the JSONL rows keep the line-based detector
