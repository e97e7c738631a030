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

from farmkit.core.io import FarmError
from farmkit.evaluate import length_control, winrate
from farmkit.evaluate.winrate import WinrateTable

PROVENANCE = {"farm-winrate": {"tool": "farm-winrate", "version": "0.1.0"}}


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def prefs(model, values, reference="ref", lengths=None):
    records = []
    for i, value in enumerate(values):
        record = {
            "instruction": f"task {i}",
            "generator_1": reference,
            "generator_2": model,
            "preference": value,
        }
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
        assert row[key] == (
            pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
        ), key


def rows_of(result):
    return [orjson.loads(line) for line in result.stdout.splitlines()]


# x = [1, 1, 0, .5, .5] after dropping the null: mean .6, sd(ddof=1) = sqrt(.175)
EXPECTED_A = {
    "generator": "A",
    "reference": "ref",
    "annotator": None,
    "win_rate": 60.0,
    "standard_error": 100 * math.sqrt(0.175 / 5),
    "n_wins": 2,
    "n_losses": 1,
    "n_draws": 2,
    "n_total": 5,
    "n_dropped": 1,
    "discrete_win_rate": 60.0,
    "avg_length": None,
    "length_controlled_win_rate": None,
    "lc_standard_error": None,
    "length_coefficient": None,
    "lc_difficulty": None,
    "lc_extreme_change": None,
}
WITHOUT_LC = {
    k: v for k, v in EXPECTED_A.items() if "length_c" not in k and not k.startswith("lc_")
}


def test_alpacaeval_figures_by_hand(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl", prefs("A", [2, 2, 1, 1.5, 0, None]) + prefs("B", [1, 1, 2])
    )
    result = invoke(str(path), "--no-length-control")
    assert result.exit_code == 0, result.output
    rows = rows_of(result)
    assert [r["generator"] for r in rows] == ["A", "B"]  # best first
    assert rows[0].pop("provenance") == PROVENANCE
    assert_row(rows[0], WITHOUT_LC)
    assert rows[1]["win_rate"] == pytest.approx(100 / 3)
    assert rows[1]["standard_error"] == pytest.approx(
        100 * np.std([0, 0, 1], ddof=1) / math.sqrt(3)
    )
    assert "1 null verdicts dropped" in result.stderr


def test_fractional_preferences_count_fractionally(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [1.25, 1.75, 2.0, 1.5]))
    (row,) = rows_of(invoke(str(path)))
    assert row["win_rate"] == pytest.approx(100 * (0.25 + 0.75 + 1 + 0.5) / 4)
    assert (row["n_wins"], row["n_losses"], row["n_draws"]) == (2, 1, 1)
    assert row["discrete_win_rate"] == pytest.approx(100 * 2.5 / 4)


def test_reference_in_position_2_is_swapped(tmp_path):
    straight = prefs("A", [2, 2, 1, 1.5, 0, None])
    swapped = [
        {
            **r,
            "generator_1": "A",
            "generator_2": "ref",
            "preference": None
            if r["preference"] is None
            else (r["preference"] if r["preference"] in (0, 1.5) else 3 - r["preference"]),
        }
        for r in straight
    ]
    mixed = write_jsonl(
        tmp_path / "mixed.jsonl", straight[:3] + swapped[3:] + prefs("X", [2], reference="other")
    )
    result = invoke(str(mixed), "--reference-generator", "ref", "--no-length-control")
    (row,) = rows_of(result)
    assert row.pop("provenance") == {
        "farm-winrate": {**PROVENANCE["farm-winrate"], "reference": "ref"}
    }
    assert_row(row, WITHOUT_LC)
    assert "skipped 1 records that do not involve the reference 'ref'" in result.stderr
    all_swapped = write_jsonl(tmp_path / "swapped.jsonl", swapped)
    (row,) = rows_of(invoke(str(all_swapped), "--swap", "--no-length-control"))
    assert row["win_rate"] == 60.0 and row["generator"] == "A" and row["reference"] == "ref"
    assert invoke(str(all_swapped), "--swap", "--reference-generator", "ref").exit_code == 2


def test_models_against_several_references_get_one_row_each(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl", prefs("A", [2, 2]) + prefs("A", [1, 1], reference="other")
    )
    rows = rows_of(invoke(str(path)))
    assert [(r["generator"], r["reference"], r["win_rate"]) for r in rows] == [
        ("A", "ref", 100.0),
        ("A", "other", 0.0),
    ]


def test_bootstrap_is_seeded_and_brackets_the_win_rate(tmp_path):
    rng = np.random.default_rng(3)
    path = write_jsonl(
        tmp_path / "p.jsonl",
        prefs("A", rng.choice([1, 2, 1.5], size=300, p=[0.3, 0.6, 0.1]).tolist()),
    )
    first = invoke(str(path), "--bootstrap", "500", "--seed", "1")
    again = invoke(str(path), "--bootstrap", "500", "--seed", "1")
    other = invoke(str(path), "--bootstrap", "500", "--seed", "2")
    assert first.stdout == again.stdout
    (row,) = rows_of(first)
    assert row["ci_low"] < row["win_rate"] < row["ci_high"]
    # a percentile interval of the mean is close to the normal one, +-1.96 standard errors
    assert row["ci_high"] - row["ci_low"] == pytest.approx(
        2 * 1.96 * row["standard_error"], rel=0.15
    )
    assert (row["ci_low"], row["ci_high"]) != (
        rows_of(other)[0]["ci_low"],
        rows_of(other)[0]["ci_high"],
    )
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
    with pytest.raises(
        FarmError, match="--compare: no verdicts on 'd' in the input; the models are a, b, c"
    ):
        invoke(str(path), "--compare", "a", "d")


def test_lengths_from_the_output_texts(tmp_path):
    # no len_1/len_2: the lengths come from the texts, for avg_length and the length term alike
    rng = np.random.default_rng(2)
    records = []
    for i in range(200):
        model_length, reference_length = int(rng.integers(50, 1500)), int(rng.integers(400, 600))
        wins = rng.random() < 1 / (
            1 + np.exp(-2 * np.tanh((model_length - reference_length) / 400))
        )
        records.append(
            {
                "instruction": f"t{i}",
                "generator_1": "ref",
                "generator_2": "A",
                "preference": 2 if wins else 1,
                "output_1": "r" * reference_length,
                "output_2": "a" * model_length,
            }
        )
    (row,) = rows_of(invoke(str(write_jsonl(tmp_path / "p.jsonl", records))))
    assert row["avg_length"] == sum(len(r["output_2"]) for r in records) // len(records)
    assert row["length_coefficient"] > 1
    assert abs(row["length_controlled_win_rate"] - 50) < 8


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
    result = invoke(
        str(path), "--plot", str(tmp_path / "board.png"), "-o", str(tmp_path / "board.jsonl")
    )
    assert result.exit_code == 0
    assert (tmp_path / "board.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [
        r["generator"]
        for r in map(orjson.loads, (tmp_path / "board.jsonl").read_bytes().splitlines())
    ] == ["A", "B"]
    bad = write_jsonl(tmp_path / "bad.jsonl", prefs("A", [2, 1]) + prefs("A", [0.5]))
    result = run_tool("farm-winrate", str(bad), "-o", str(tmp_path / "out.jsonl"))
    assert result.returncode == 1
    assert result.stderr.decode() == (
        f"farm-winrate: error: {bad}:3: preference 0.5 is outside [1, 2]; expected 1, 2, 1.5 (tie), "
        "a value in between, 0 (AlpacaEval's legacy tie) or null\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.jsonl",
        "board.jsonl",
        "board.png",
        "p.jsonl",
    ]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"generator_1": "ref", "preference": 2}, "no generator_2 to rank"),
        (
            {"generator_1": "ref", "generator_2": "A", "preference": "2"},
            "field 'preference' is \"2\"; expected a number or null",
        ),
        ({"generator_1": "ref", "generator_2": "A"}, "missing field 'preference'"),
    ],
)
def test_bad_records_name_file_and_line(tmp_path, record, message):
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(
        gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in [*prefs("A", [2, 1]), record]))
    )
    result = run_tool("farm-winrate", str(path))
    assert result.returncode == 1
    assert result.stderr.decode().startswith(f"farm-winrate: error: {path}:3: {message}")
    assert result.stdout == b""


def test_stdin_and_several_files(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", prefs("A", [2, 2]))
    stdin = b"".join(orjson.dumps(r) + b"\n" for r in prefs("A", [1, 1]))
    (row,) = rows_of(invoke(str(first), "-", input=stdin))
    assert (row["win_rate"], row["n_total"]) == (50.0, 4)


def test_memory_does_not_grow_with_records_without_length_control(tmp_path, monkeypatch):
    monkeypatch.setattr(winrate, "CHUNK", 250)
    rng = np.random.default_rng(0)

    def peak(n):
        values = rng.choice([1, 2, 1.5], size=n).tolist()
        path = write_jsonl(
            tmp_path / f"{n}.jsonl",
            [
                {
                    "generator_1": "ref",
                    "generator_2": f"m{i % 5}",
                    "preference": v,
                    "len_1": 100 + i % 7,
                    "len_2": 90 + i % 11,
                }
                for i, v in enumerate(values)
            ],
        )
        table = WinrateTable(length_control=False)
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
    (
        "weighted_alpaca_eval_gpt4_turbo",
        "data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv",
    ),
    ("alpaca_eval_gpt4_turbo_fn", "data_AlpacaEval_2/alpaca_eval_gpt4_turbo_fn_leaderboard.csv"),
    (
        "alpaca_eval_cot_gpt4_turbo_fn",
        "data_AlpacaEval_2/alpaca_eval_cot_gpt4_turbo_fn_leaderboard.csv",
    ),
]


@pytest.mark.parametrize(("annotator", "board"), BOARDS)
@pytest.mark.heavy
def test_reproduces_alpacaeval_leaderboards(tmp_path, annotator, board):
    annotations = shared_data(f"alpaca_eval/annotations/{annotator}.jsonl.gz")
    published = {
        row[""]: row
        for row in csv.DictReader(open(shared_data(f"alpaca_eval/leaderboards/{board}")))
    }
    # the upstream data errors (data/README.md): a results_dir holding another model's annotations,
    # or another annotator's; keep the rows that are what their file says they are
    kept = [
        r
        for r in map(orjson.loads, gzip.open(annotations))
        if r["generator_2"] == r["results_dir"] and r["annotator"] == annotator
    ]
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
        assert row["standard_error"] == pytest.approx(
            float(expected["standard_error"]), abs=1e-6
        ), name
        for ours, theirs in (
            ("n_wins", "n_wins"),
            ("n_losses", "n_wins_base"),
            ("n_draws", "n_draws"),
            ("n_total", "n_total"),
        ):
            assert row[ours] == float(expected[theirs]), (name, ours)
        if expected.get("discrete_win_rate"):
            assert row["discrete_win_rate"] == pytest.approx(
                float(expected["discrete_win_rate"]), abs=1e-6
            ), name
        # avg_length is AlpacaEval's over all 805 outputs: comparable where no annotation row is missing
        if expected.get("avg_length") and records_per_model[name] == 805:
            assert row["avg_length"] == int(float(expected["avg_length"])), name


# -------------------------------------------------------------- AlpacaEval 2's length-controlled win rate


def weighted_annotations():
    """AlpacaEval 2's weighted gpt4_turbo annotations (the upstream data errors left out) and the
    published leaderboard they produce."""
    annotator = "weighted_alpaca_eval_gpt4_turbo"
    path = shared_data(f"alpaca_eval/annotations/{annotator}.jsonl.gz")
    published = {
        row[""]: row
        for row in csv.DictReader(
            open(
                shared_data(
                    f"alpaca_eval/leaderboards/data_AlpacaEval_2/{annotator}_leaderboard.csv"
                )
            )
        )
    }
    kept = [r for r in map(orjson.loads, gzip.open(path)) if r["generator_2"] == r["results_dir"]]
    return kept, published


@pytest.mark.heavy
def test_length_controlled_win_rate_follows_the_published_lc_and_resists_gaming(tmp_path):
    records, published = weighted_annotations()
    table = WinrateTable()
    table.add_records(records)
    rows = {row["generator"]: row for row in table.rows()}
    common = [m for m in rows if published.get(m, {}).get("length_controlled_winrate")]
    assert len(common) >= 50
    lc = {m: rows[m]["length_controlled_win_rate"] for m in common}
    published_lc = {m: float(published[m]["length_controlled_winrate"]) for m in common}
    ours, theirs = np.array(list(lc.values())), np.array(list(published_lc.values()))
    raw = np.array([rows[m]["win_rate"] for m in common])
    gap = np.abs(ours - theirs)
    # closer to AlpacaEval's LC than the raw win rate is (raw: 0.957, mean 4.77; ours: 0.988, 0.59, max
    # 3.3; the earlier, weaker pull towards the pooled length term, with the other models' terms free
    # and one stand-in verdict per instruction: 0.986, 0.97, max 8.9 for gpt4_gamed)
    assert stats.spearmanr(ours, theirs)[0] >= 0.985 > stats.spearmanr(raw, theirs)[0] + 0.02
    assert gap.mean() < 0.8 and gap.max() < 5, (gap.mean(), common[int(gap.argmax())])
    assert all(rows[m]["lc_difficulty"] == f"estimated from {len(rows)} models" for m in common)

    def rank(board, name):  # 1 = best
        return sorted(board.values(), reverse=True).index(board[name]) + 1

    # gaming by brevity is not rewarded: gpt4_gamed (68-character outputs, raw 3.7) lands near its
    # published place (12.2, rank 23), not among the strong models (the earlier pull gave it 21.1,
    # rank 14; measured now 12.9, rank 21)
    assert abs(lc["gpt4_gamed"] - published_lc["gpt4_gamed"]) < 3
    assert abs(rank(lc, "gpt4_gamed") - rank(published_lc, "gpt4_gamed")) <= 3
    # models prompted to be concise get their published LC back, not more (gpt4_0613_concise had +3.9)
    for name in (
        "gpt4_0613_concise",
        "Mixtral-8x7B-Instruct-v0.1_concise",
        "gpt-3.5-turbo-1106_concise",
        "claude-2.1_concise",
        "alpaca-7b_concise",
    ):
        assert abs(lc[name] - published_lc[name]) < 2, name
    # families prompted to be concise or verbose keep their published order, and verbosity that buys
    # 5 raw points buys less than 10 controlled ones (alpaca-7b's does not: its verbose variant gets
    # 5.0 against 6.8 published, below its plain 5.5)
    for family, variants in (
        ("gpt-3.5-turbo-1106", ("_concise", "", "_verbose")),
        ("claude-2.1", ("_concise", "")),
    ):
        names = [family + suffix for suffix in variants]
        assert sorted(names, key=published_lc.get) == names  # the published order
        assert sorted(names, key=lc.get) == names, [round(lc[n], 2) for n in names]
    assert (
        lc["gpt-3.5-turbo-1106_verbose"] - lc["gpt-3.5-turbo-1106_concise"] < 10
        and rows["gpt-3.5-turbo-1106_verbose"]["win_rate"]
        - rows["gpt-3.5-turbo-1106_concise"]["win_rate"]
        > 5
    )


def glm_records(rng, models, n_items=300, length_effect=1.0):
    """Verdicts drawn from AlpacaEval's GLM: logit = quality + length_effect * tanh(std length diff)
    + item ease; each model writes outputs of its own typical length."""
    ease = rng.normal(0, 1.0, n_items)
    records = []
    for model, (quality, typical_length) in models.items():
        model_lengths = rng.normal(typical_length, 300, n_items).clip(10)
        reference_lengths = rng.normal(500, 150, n_items).clip(10)
        delta = model_lengths - reference_lengths
        logit = quality + length_effect * np.tanh(delta / delta.std(ddof=1)) + ease
        wins = rng.random(n_items) < 1 / (1 + np.exp(-logit))
        for i in range(n_items):
            records.append(
                {
                    "instruction": f"task {i}",
                    "generator_1": "ref",
                    "generator_2": model,
                    "preference": 2 if wins[i] else 1,
                    "len_1": int(reference_lengths[i]),
                    "len_2": int(model_lengths[i]),
                }
            )
    return records, ease


def test_length_control_removes_a_length_preference_with_difficulties_estimated_jointly(tmp_path):
    rng = np.random.default_rng(0)
    models = {"long": (0.0, 800), "short": (0.0, 250), "good": (1.0, 500)}
    records, _ = glm_records(rng, models, n_items=800, length_effect=1.5)
    result = invoke(str(write_jsonl(tmp_path / "p.jsonl", records)))
    rows = {row["generator"]: row for row in rows_of(result)}
    assert rows["long"]["win_rate"] > 60 and rows["short"]["win_rate"] < 40
    # same quality: at equal length both are near the 50% of quality 0 (the ease averages out)
    for name in ("long", "short"):
        assert abs(rows[name]["length_controlled_win_rate"] - 50) < 8, rows[name]
        assert rows[name]["lc_difficulty"] == "estimated from 3 models"
    assert rows["long"]["length_coefficient"] > 0.5
    assert rows["good"]["length_controlled_win_rate"] > 60
    assert "instruction difficulty estimated from the 3 models against 'ref'" in result.stderr


def test_instruction_difficulty_from_a_file(tmp_path):
    rng = np.random.default_rng(1)
    records, ease = glm_records(rng, {"long": (0.0, 800)}, n_items=800, length_effect=1.5)
    path = write_jsonl(tmp_path / "p.jsonl", records)
    alone = rows_of(invoke(str(path)))[0]
    assert alone["lc_difficulty"] == "none"
    difficulty = tmp_path / "difficulty.csv"
    difficulty.write_text(
        "instruction,instruction_difficulty\n"
        + "".join(f"task {i},{-e}\n" for i, e in enumerate(ease))
    )
    result = invoke(str(path), "--instruction-difficulty", str(difficulty))
    (row,) = rows_of(result)
    assert row["lc_difficulty"] == f"file {difficulty}"
    assert (
        f"farm-winrate: instruction difficulty read from {difficulty} for the models against 'ref'"
        in result.stderr
    )
    assert abs(row["length_controlled_win_rate"] - 50) < 8
    as_jsonl = write_jsonl(
        tmp_path / "difficulty.jsonl",
        [
            {"instruction": f"task {i}", "instruction_difficulty": -float(e)}
            for i, e in enumerate(ease)
        ],
    )
    (again,) = rows_of(invoke(str(path), "--instruction-difficulty", str(as_jsonl)))
    assert again["length_controlled_win_rate"] == pytest.approx(row["length_controlled_win_rate"])


def test_a_drastic_change_by_length_control_is_warned(tmp_path):
    # every verdict follows the length: the model wins exactly when its output is longer
    records = []
    for i in range(200):
        model_length = 100 + 10 * i
        records.append(
            {
                "instruction": f"t{i}",
                "generator_1": "ref",
                "generator_2": "A",
                "len_1": 1000,
                "len_2": model_length,
                "preference": 2 if model_length > 1000 else 1,
            }
        )
    result = invoke(str(write_jsonl(tmp_path / "p.jsonl", records)))
    (row,) = rows_of(result)
    assert row["lc_extreme_change"] is (
        abs(row["length_controlled_win_rate"] - row["win_rate"]) > 10
    )
    extreme = length_control.is_extreme_change
    assert (
        extreme(20.0, 9.0)
        and not extreme(20.0, 11.0)
        and extreme(50.0, 63.0)
        and not extreme(50.0, 62.0)
    )
    records = [{**r, "len_2": 1000 + (i % 3)} for i, r in enumerate(records[:60])] + [
        {
            "instruction": f"u{i}",
            "generator_1": "ref",
            "generator_2": "A",
            "len_1": 1000,
            "len_2": 3000 + i,
            "preference": 2,
        }
        for i in range(140)
    ]
    result = invoke(str(write_jsonl(tmp_path / "q.jsonl", records)))
    (row,) = rows_of(result)
    assert row["lc_extreme_change"]
    assert (
        f"farm-winrate: A: the length-controlled win rate ({row['length_controlled_win_rate']:.1f}%) is very different "
        f"from the raw one ({row['win_rate']:.1f}%)" in result.stderr
    )


def test_l1_logistic_regression_recovers_known_parameters():
    rng = np.random.default_rng(0)
    features = np.column_stack([rng.normal(size=4000), rng.normal(size=4000), np.ones(4000)])
    targets = 1 / (1 + np.exp(-(features @ np.array([1.5, 0.0, -0.5]))))
    coefficients = length_control.l1_logistic(features, targets, np.ones(4000), c=100.0)
    assert coefficients == pytest.approx([1.5, 0.0, -0.5], abs=2e-3)
    # a strong penalty zeroes the coefficients
    assert np.all(length_control.l1_logistic(features, targets, np.ones(4000), c=1e-4) == 0)


# -------------------------------------------------------------- guards: duplicates, references, self-judging


def test_duplicate_items_are_reported_and_deduped(tmp_path):
    records = prefs("A", [2, 2, 1]) + prefs("A", [1, 1]) + prefs("B", [2, 1])
    path = write_jsonl(tmp_path / "p.jsonl", records)
    result = invoke(str(path), "--no-length-control")
    rows = {row["generator"]: row for row in rows_of(result)}
    assert rows["A"]["n_total"] == 5
    assert (
        f"farm-winrate: A: 2 verdicts repeat an instruction already judged (the first at {path}:4); "
        "--dedupe keeps the first of each" in result.stderr
    )
    deduped = invoke(str(path), "--no-length-control", "--dedupe")
    rows = {row["generator"]: row for row in rows_of(deduped)}
    assert (rows["A"]["n_total"], rows["A"]["win_rate"]) == (3, pytest.approx(200 / 3))
    assert rows["B"]["n_total"] == 2
    assert "2 repeated verdicts left out (--dedupe)" in deduped.stderr


def test_falcon_duplicates_in_alpacaeval_files(tmp_path):
    # falcon-7b-instruct's folder under alpaca_eval_gpt4 holds falcon-40b-instruct's annotations again
    annotations = shared_data("alpaca_eval/annotations/alpaca_eval_gpt4.jsonl.gz")
    published = {
        row[""]: row
        for row in csv.DictReader(
            open(
                shared_data(
                    "alpaca_eval/leaderboards/data_AlpacaEval/alpaca_eval_gpt4_leaderboard.csv"
                )
            )
        )
    }
    records = [
        r
        for r in map(orjson.loads, gzip.open(annotations))
        if r["generator_2"] == "falcon-40b-instruct"
    ]
    path = write_jsonl(tmp_path / "falcon.jsonl", records)
    result = invoke(str(path), "--no-length-control")
    assert rows_of(result)[0]["n_total"] == 1610
    assert "falcon-40b-instruct: 805 verdicts repeat an instruction already judged" in result.stderr
    (row,) = rows_of(invoke(str(path), "--no-length-control", "--dedupe"))
    assert row["n_total"] == 805
    assert row["win_rate"] == pytest.approx(
        float(published["falcon-40b-instruct"]["win_rate"]), abs=1e-6
    )
    assert row["standard_error"] == pytest.approx(
        float(published["falcon-40b-instruct"]["standard_error"]), abs=1e-6
    )


def test_rows_against_different_references_are_grouped_and_said(tmp_path):
    records = prefs("A", [2, 1]) + prefs("B", [1, 1]) + prefs("C", [2, 2, 2], reference="other")
    result = invoke(str(write_jsonl(tmp_path / "p.jsonl", records)), "--no-length-control")
    assert [(r["reference"], r["generator"]) for r in rows_of(result)] == [
        ("ref", "A"),
        ("ref", "B"),
        ("other", "C"),
    ]
    assert (
        "farm-winrate: the rows are against 2 references (ref: 2 models, other: 1 model); "
        "each reference's rows are ranked apart, one group after the other" in result.stderr
    )


def test_a_model_judged_against_itself_is_reported_not_ranked(tmp_path):
    records = prefs("A", [2, 1, 2]) + prefs("ref", [2, 2, 1, 1.5])
    result = invoke(str(write_jsonl(tmp_path / "p.jsonl", records)))
    assert [r["generator"] for r in rows_of(result)] == ["A"]
    assert (
        "farm-winrate: 4 verdicts judge ref against itself (position 2 preferred in 62.5%); not ranked"
        in result.stderr
    )


def test_rows_filed_under_another_systems_folder_are_reported(tmp_path):
    # AlpacaEval's annotation files say which results folder each row came from: NullModel's folder
    # in weighted_alpaca_eval_gpt4_turbo holds rows whose generator is "example", ranked first
    filed = [dict(r, results_dir="A") for r in prefs("A", [2, 1, 2])]
    misfiled = [dict(r, results_dir="NullModel") for r in prefs("example", [2, 2, 2, 2])]
    path = write_jsonl(tmp_path / "p.jsonl", filed + misfiled)
    result = invoke(str(path))
    assert [r["generator"] for r in rows_of(result)] == ["example", "A"]  # still ranked, but said
    assert (
        f"farm-winrate: 4 verdicts from results_dir 'NullModel' are generator 'example''s "
        f"(the first at {path}:4)" in result.stderr
    )
    assert "results_dir 'A'" not in result.stderr
    assert "results_dir" not in invoke(str(write_jsonl(tmp_path / "q.jsonl", filed))).stderr


def test_a_bad_record_after_a_dropped_repeat_is_named_by_its_line(tmp_path):
    records = (
        prefs("A", [2, 1])
        + prefs("A", [2])
        + [{"instruction": "task 9", "generator_1": "ref", "generator_2": "A", "preference": 0.5}]
    )
    path = write_jsonl(tmp_path / "p.jsonl", records)
    result = run_tool("farm-winrate", str(path), "--dedupe")
    assert result.returncode == 1
    assert result.stderr.decode().startswith(
        f"farm-winrate: error: {path}:4: preference 0.5 is outside [1, 2]"
    )


def test_bad_instruction_difficulty_files(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prefs("A", [2, 1]))
    no_column = tmp_path / "d.csv"
    no_column.write_text("instruction,difficulty\ntask 0,1\n")
    result = run_tool("farm-winrate", str(path), "--instruction-difficulty", str(no_column))
    assert result.returncode == 1
    assert result.stderr.decode() == (
        f"farm-winrate: error: {no_column}: expected a column instruction_difficulty and one of "
        "'id', 'instruction_index', 'index', '', 'instruction'; found 'instruction', 'difficulty'\n"
    )
    bad_value = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"instruction_index": 0, "instruction_difficulty": 0.5},
            {"instruction_index": 1, "instruction_difficulty": "hard"},
        ],
    )
    result = run_tool("farm-winrate", str(path), "--instruction-difficulty", str(bad_value))
    assert (
        result.returncode == 1
        and f"{bad_value}:2: expected an instruction" in result.stderr.decode()
    )
    result = run_tool(
        "farm-winrate", str(path), "--instruction-difficulty", str(bad_value), "--no-length-control"
    )
    assert result.returncode == 2


@pytest.mark.heavy
def test_length_controlled_win_rate_follows_alpacaeval_1s_published_lc():
    annotator = "alpaca_eval_gpt4"
    path = shared_data(f"alpaca_eval/annotations/{annotator}.jsonl.gz")
    published = {
        row[""]: row
        for row in csv.DictReader(
            open(
                shared_data(f"alpaca_eval/leaderboards/data_AlpacaEval/{annotator}_leaderboard.csv")
            )
        )
    }
    table = WinrateTable()
    table.add_records(
        [
            r
            for r in map(orjson.loads, gzip.open(path))
            if r["generator_2"] == r["results_dir"] and r["annotator"] == annotator
        ]
    )
    rows = {row["generator"]: row for row in table.rows()}
    common = [m for m in rows if published.get(m, {}).get("length_controlled_winrate")]
    theirs = [float(published[m]["length_controlled_winrate"]) for m in common]
    # measured: 0.979 against the raw win rate's 0.911 (the previous one-logistic method: 0.706)
    assert (
        stats.spearmanr([rows[m]["length_controlled_win_rate"] for m in common], theirs)[0] > 0.95
    )
    assert stats.spearmanr([rows[m]["win_rate"] for m in common], theirs)[0] < 0.93


def test_rows_name_their_judges(tmp_path):
    records = [
        {**r, "annotator": name}
        for r, name in zip(prefs("A", [2, 1, 2]), ["gpt4", "claude", "gpt4"], strict=True)
    ]
    records += prefs("B", [2])
    rows = rows_of(invoke(str(write_jsonl(tmp_path / "p.jsonl", records)), "--no-length-control"))
    assert [(row["generator"], row["annotator"]) for row in rows] == [
        ("B", None),
        ("A", "claude, gpt4"),
    ]
