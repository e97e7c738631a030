"""farm-correlate: leaderboard correlations (hand-computed and the published Arena vs AlpacaEval 2
figure), annotation statistics (hand-computed, the 4-seed GPT-4 judge's variance, PandaLM's three
humans), input options, plot and errors."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import shared_data
from farmkit.tools.farm_correlate import cli, main

from farmkit.evaluate.correlate import agreement, cohen_kappa


def run_main(capfd, *args):
    """The console entry point in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    captured = capfd.readouterr()
    return exit_info.value.code, captured.out, captured.err


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def records_of(result):
    assert result.exit_code == 0, result.output
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def board(path, scores, field="win_rate"):
    return write_jsonl(path, [{"generator": name, field: score} for name, score in scores.items()])


def test_two_leaderboards_by_hand(tmp_path):
    # ranks 1..5 against 1,3,2,5,4: two adjacent swaps
    x = board(tmp_path / "x.jsonl", {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "only_x": 9})
    y = board(tmp_path / "y.jsonl", {"a": 10, "b": 30, "c": 20, "d": 50, "e": 40, "only_y": 1})
    (row,) = records_of(CliRunner().invoke(cli, [str(x), str(y)]))
    assert row["x"] == "x.jsonl:win_rate" and row["y"] == "y.jsonl:win_rate" and row["n"] == 5
    assert row["spearman"] == pytest.approx(0.8)
    assert row["kendall"] == pytest.approx(0.6)
    assert row["pearson"] == pytest.approx(0.8)
    assert row["r2"] == pytest.approx(0.64)
    assert row["missing_from_x"] == ["only_y"] and row["missing_from_y"] == ["only_x"]
    assert 0 < row["spearman_p"] < 1


def test_three_boards_give_every_pair(tmp_path):
    boards = [
        board(tmp_path / f"{i}.jsonl", {"a": i, "b": 2 * i + 1, "c": 5 - i, "d": 7})
        for i in range(3)
    ]
    rows = records_of(CliRunner().invoke(cli, [str(b) for b in boards]))
    assert [(r["x"], r["y"]) for r in rows] == [
        ("0.jsonl:win_rate", "1.jsonl:win_rate"),
        ("0.jsonl:win_rate", "2.jsonl:win_rate"),
        ("1.jsonl:win_rate", "2.jsonl:win_rate"),
    ]


def test_csv_columns_by_prefix_and_plot(tmp_path):
    csv_board = tmp_path / "board.csv"
    csv_board.write_text(',"Score\n[2024]",other\nm1,1.0,\nm2,2.0,5\nm3,3.5,\nm4,,1\n')
    jsonl = board(tmp_path / "b.jsonl", {"m1": 0.1, "m2": 0.3, "m3": 0.2, "m4": 0.9}, field="lc")
    plot = tmp_path / "scatter.png"
    (row,) = records_of(
        CliRunner().invoke(
            cli,
            [str(csv_board), str(jsonl), "--score", "score", "--score", "lc", "--plot", str(plot)],
        )
    )
    assert row["x"] == "board.csv:Score [2024]" and row["y"] == "b.jsonl:lc"
    assert row["n"] == 3 and row["missing_from_x"] == ["m4"]  # an empty score leaves the model out
    assert row["spearman"] == pytest.approx(0.5)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_format(tmp_path):
    x = board(tmp_path / "x.jsonl", {"a": 1, "b": 2, "c": 3})
    y = board(tmp_path / "y.jsonl", {"a": 1, "b": 3, "c": 2})
    text = CliRunner().invoke(cli, [str(x), str(y), "--format", "csv"]).stdout
    header, line = text.splitlines()
    assert (
        header
        == "x,y,n,spearman,spearman_p,kendall,kendall_p,pearson,pearson_p,r2,missing_from_x,missing_from_y"
    )
    assert line.startswith("x.jsonl:win_rate,y.jsonl:win_rate,3,0.5,")
    z = board(tmp_path / "z.jsonl", {"a": 1, "b": 3, "c": 2, **{f"m{i}": i for i in range(5)}})
    table = CliRunner().invoke(cli, [str(x), str(z), "--format", "table"]).stdout.splitlines()
    assert table[0].split() == [
        "x",
        "y",
        "n",
        "spearman",
        "spearman_p",
        "kendall",
        "kendall_p",
        "pearson",
        "pearson_p",
        "r2",
        "missing_from_x",
        "missing_from_y",
    ]
    assert table[1].split() == [
        "x.jsonl:win_rate",
        "z.jsonl:win_rate",
        "3",
        "0.50",
        "0.67",
        "0.33",
        "1.00",
        "0.50",
        "0.67",
        "0.25",
        "5:",
        "m0,m1,m2,...",
    ]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "bad.jsonl",
            b'{"generator": "a", "win_rate": 1}\n{"generator": "a", "win_rate": 2}\n',
            "2: model 'a' appears twice",
        ),
        (
            "bad.jsonl",
            b'{"generator": "a", "win_rate": 1}\n{"generator": "b", "win_rate": "high"}\n',
            "2: field 'win_rate' is \"high\"; expected a number or null",
        ),
        ("bad.csv", b"generator,win_rate\na,1\nb,high\n", "3: score 'high' of 'b' is not a number"),
        (
            "bad.jsonl",
            b'{"generator": "a", "win_rate": 1}\n{"win_rate": 2}\n',
            "2: missing field 'generator'",
        ),
    ],
)
def test_bad_boards(tmp_path, capfd, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    good = board(tmp_path / "good.jsonl", {"a": 1, "b": 2})
    code, out, err = run_main(capfd, str(good), str(path))
    assert code == 1 and out == ""
    assert err.startswith(f"farm-correlate: error: {path}:{message}")


def test_usage_errors(tmp_path, capfd):
    x = board(tmp_path / "x.jsonl", {"a": 1})
    code, _, err = run_main(capfd, str(x))
    assert code == 2 and "leaderboard mode needs two leaderboards or more" in err
    code, _, err = run_main(capfd, str(x), str(x), "--humans", str(x))
    assert code == 2 and "not both" in err
    code, _, err = run_main(capfd, str(x), str(x), "--score", "nope")
    assert (
        code == 1
        and "no columns match 'nope' for --score; expected one of 'generator', 'win_rate'" in err
    )


# ---------------------------------------------------------------- annotation mode


def test_agreement_and_kappa_helpers():
    assert agreement(1.0, [1.0, 2.0]) == 0.5  # a tied mode: one of the two at random
    assert agreement(2.0, [2.0, 2.0, 1.0]) == 1.0
    assert agreement(1.5, [1.0]) == 0.0
    # 2x2 table: agree on 3 of 4; marginals a: 1,1,2,2  b: 1,2,2,2 -> p_e = (2*1 + 2*3) / 16 = 0.5
    assert cohen_kappa([1, 1, 2, 2], [1, 2, 2, 2]) == pytest.approx((0.75 - 0.5) / 0.5)


def test_annotation_statistics_by_hand(tmp_path):
    # three pairs, three humans (long records with `annotator`), a judge run twice
    texts = {
        "p1": ("short", "a much longer answer"),
        "p2": ("- item\n- item", "plain"),
        "p3": ("same", "size"),
    }
    humans = {"p1": [2, 2, 1], "p2": [1, 1, 1], "p3": [1, 2, 0]}
    judge_runs = [{"p1": 2, "p2": 2, "p3": 1}, {"p1": 2, "p2": 1, "p3": 1}]
    human_records = [
        {
            "pair_id": key,
            "output_1": texts[key][0],
            "output_2": texts[key][1],
            "annotator": f"h{i}",
            "preference": label,
        }
        for key, labels in humans.items()
        for i, label in enumerate(labels)
    ]
    humans_path = write_jsonl(tmp_path / "humans.jsonl", human_records)
    run_paths = [
        write_jsonl(
            tmp_path / f"run{i}.jsonl",
            [{"pair_id": k, "preference": v, "annotator": "judge"} for k, v in run.items()],
        )
        for i, run in enumerate(judge_runs)
    ]
    args = [
        "--judge",
        str(run_paths[0]),
        "--judge",
        str(run_paths[1]),
        "--humans",
        str(humans_path),
    ]
    default_judge, *_ = records_of(CliRunner().invoke(cli, args))
    assert default_judge["p_prefers_longer"] is None  # no pair differs by more than 30 characters
    judge, *individuals, people = records_of(
        CliRunner().invoke(cli, [*args, "--min-length-difference", "0"])
    )
    assert [row["annotator"] for row in individuals] == ["h0", "h1", "h2"]
    # judge vs the other two humans, for each held-out human and each run:
    # p1 others {2,1},{2,1},{2,2}: run labels 2,2 -> (.5+.5+1) each; p2 others all 1: run 2 -> 0, run 1 -> 1;
    # p3 others {2,tie},{1,tie},{1,2}: run labels 1,1 -> (0+.5+.5) each
    expected_agreement = (2 * (0.5 + 0.5 + 1) + 3 * (0 + 1) + 2 * (0 + 0.5 + 0.5)) / 18
    assert judge["human_agreement"] == pytest.approx(expected_agreement)
    # bias: judge mode vs human mode: p1 {2} vs {2}: 0; p2 {2,1} vs {1}: 1 - 1/2; p3 {1} vs {1,2,tie}: 1 - 1/3
    assert judge["bias"] == pytest.approx((0 + 0.5 + 2 / 3) / 3)
    # variance: the two runs disagree on p2 only: each run disagrees with the other on 1 of 3 pairs
    assert judge["variance"] == pytest.approx(1 / 3)
    assert judge["n_runs"] == 2 and judge["n_pairs"] == 3 and judge["annotator"] == "judge"
    # judge labels that are not ties: 6; first position chosen: p2 run 2, p3 twice -> 3 of 6
    assert judge["p_prefers_first"] == pytest.approx(3 / 6)
    # lengths differ on p1 (2 longer) and p2 (1 longer) and p3 ("same" vs "size": equal, left out)
    assert judge["p_prefers_longer"] == pytest.approx((2 + 1) / 4)
    # only p2 has exactly one list (output_1): the judge chose it once of twice
    assert judge["p_prefers_lists"] == pytest.approx(1 / 2)
    assert people["annotator"] == "humans" and people["n_labels"] == 9
    assert people["majority_labels"] == {"2": 1, "1": 1, "none": 1}
    assert people["cohen_kappa"]["h0|h1"] == pytest.approx(cohen_kappa([2, 1, 1], [2, 1, 2]))


def test_one_human_label_per_pair_is_plain_agreement(tmp_path):
    humans = write_jsonl(
        tmp_path / "h.jsonl",
        [{"pair_id": i, "preference": v, "annotator": "h"} for i, v in enumerate([1, 2, 2, 1])],
    )
    judge = write_jsonl(
        tmp_path / "j.jsonl",
        [{"pair_id": i, "preference": v} for i, v in enumerate([1, 2, 1, "Tie"])],
    )
    judge_row, people = records_of(
        CliRunner().invoke(cli, ["--judge", str(judge), "--humans", str(humans)])
    )
    assert (
        judge_row["annotator"] == "j" and judge_row["n_runs"] == 1 and judge_row["variance"] is None
    )
    assert judge_row["human_agreement"] == pytest.approx(2 / 4) and judge_row[
        "bias"
    ] == pytest.approx(2 / 4)
    assert people["human_agreement"] is None and "cohen_kappa" not in people  # no overlap


def test_bad_label_names_file_and_line(tmp_path, capfd):
    path = write_jsonl(
        tmp_path / "j.jsonl", [{"pair_id": 1, "preference": 1}, {"pair_id": 2, "preference": 3}]
    )
    code, out, err = run_main(capfd, "--judge", str(path))
    assert (code, out) == (1, "")
    assert (
        err
        == f"farm-correlate: error: {path}:2: label 3 is outside [1, 2]; expected 1, 2, 1.5 or 0 (tie)\n"
    )


# ---------------------------------------------------------------- published figures


def test_arena_elo_against_length_controlled_alpacaeval_2():
    data = shared_data("alpaca_eval/leaderboards/historic/benchmarks_2024-03-16.csv")
    result = CliRunner().invoke(
        cli,
        [
            str(data),
            str(data),
            "--name",
            "Model",
            "--score",
            "Arena Elo",
            "--score",
            "LC AlpacaEval 2.0",
        ],
    )
    (row,) = records_of(result)
    assert row["n"] == 38
    assert round(row["spearman"], 4) == 0.9766


def test_variance_of_the_four_seed_gpt4_judge():
    runs = [
        str(shared_data(f"alpaca_eval/gpt4_b1_seeds/annotations_seed{i}.json")) for i in range(4)
    ]
    args = [a for run in runs for a in ("--judge", run)]
    (row,) = records_of(CliRunner().invoke(cli, args))
    assert row["annotator"] == "gpt4_b1" and row["n_pairs"] == 648 and row["n_runs"] == 4
    assert round(row["variance"], 4) == 0.1493
    # 445 of the 648 pairs differ by more than 30 characters (AlpacaEval's denominator); over the four
    # runs the judge chose the longer output 1079 times of 1780
    assert row["p_prefers_longer"] == pytest.approx(1079 / 1780)


def test_pandalm_human_annotators():
    humans = shared_data("human_prefs/pandalm_testset_v1.json")
    judge = shared_data("human_prefs/pandalm_gpt35_judgments_v1.json")
    result = CliRunner().invoke(
        cli,
        [
            "--humans",
            str(humans),
            "--key",
            "idx",
            "--outputs",
            "response1,response2",
            "--human-label",
            "annotator1,annotator2,annotator3",
            "--judge",
            str(judge),
            "--judge-label",
            "gpt_result",
        ],
    )
    judge_row, *_, people = records_of(result)
    kappas = {pair: round(value, 3) for pair, value in people["cohen_kappa"].items()}
    assert kappas == {
        "annotator1|annotator2": 0.852,
        "annotator1|annotator3": 0.879,
        "annotator2|annotator3": 0.862,
    }
    assert people["majority_labels"] == {"tie": 105, "1": 422, "2": 472}
    assert people["n_pairs"] == 999
    # the gpt-3.5 judge answered "garbage" 25 times: no verdict, reported, never counted as a side
    assert judge_row["n_pairs"] == 974
    assert "25 labels are no verdict" in result.stderr
    assert 0.5 < judge_row["human_agreement"] < people["human_agreement"]


@pytest.mark.heavy
def test_winrate_output_pipes_into_correlate(tmp_path):
    # two judges that rank four models alike (one harsher): Spearman 1 through a real pipe
    def prefs(path, wins):
        records = [
            {"generator_1": "ref", "generator_2": model, "preference": 2 if i < won else 1}
            for model, won in wins.items()
            for i in range(10)
        ]
        return write_jsonl(path, records)

    lenient = prefs(tmp_path / "lenient.jsonl", {"a": 9, "b": 7, "c": 5, "d": 2})
    harsh = prefs(tmp_path / "harsh.jsonl", {"a": 6, "b": 4, "c": 3, "d": 1})
    scripts = Path(sys.executable).parent
    subprocess.run(
        [
            str(scripts / "farm-winrate"),
            str(harsh),
            "-q",
            "-o",
            str(tmp_path / "harsh_board.jsonl"),
        ],
        check=True,
    )
    winrate = subprocess.Popen(
        [str(scripts / "farm-winrate"), str(lenient), "-q"], stdout=subprocess.PIPE
    )
    correlate = subprocess.run(
        [str(scripts / "farm-correlate"), "-", str(tmp_path / "harsh_board.jsonl")],
        stdin=winrate.stdout,
        capture_output=True,
        check=True,
    )
    winrate.wait()
    (row,) = [orjson.loads(line) for line in correlate.stdout.splitlines()]
    assert (row["x"], row["y"], row["n"]) == ("<stdin>:win_rate", "harsh_board.jsonl:win_rate", 4)
    assert row["spearman"] == pytest.approx(1.0) and row["kendall"] == pytest.approx(1.0)


# ---------------------------------------------------------------- readers


def test_a_leaderboard_with_a_byte_order_mark_is_read_as_json(tmp_path):
    x = board(tmp_path / "x.jsonl", {"a": 1, "b": 2, "c": 3})
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(
        b"\xef\xbb\xbf" + board(tmp_path / "y.jsonl", {"a": 10, "b": 30, "c": 20}).read_bytes()
    )
    (row,) = records_of(CliRunner().invoke(cli, [str(x), str(bom)]))
    assert (row["y"], row["n"], row["spearman"]) == ("bom.jsonl:win_rate", 3, pytest.approx(0.5))
    csv_bom = tmp_path / "bom.csv"
    csv_bom.write_bytes(b"\xef\xbb\xbfgenerator,win_rate\na,10\nb,30\nc,20\n")
    (row,) = records_of(CliRunner().invoke(cli, [str(x), str(csv_bom)]))
    assert (row["n"], row["spearman"]) == (3, pytest.approx(0.5))


def test_records_without_the_label_field_are_reported(tmp_path):
    judge = write_jsonl(
        tmp_path / "j.jsonl",
        [
            {"pair_id": 1, "preference": 1},
            {"pair_id": 2},
            {"pair_id": 3, "gpt_result": 2},
            {"pair_id": 4, "preference": None},
        ],
    )
    humans = write_jsonl(
        tmp_path / "h.jsonl",
        [{"pair_id": i, "a1": 1, "a2": 2} for i in range(1, 4)] + [{"pair_id": 4, "a1": 1}],
    )
    result = CliRunner().invoke(
        cli, ["--judge", str(judge), "--humans", str(humans), "--human-label", "a1,a2"]
    )
    judge_row, *_ = records_of(result)
    assert judge_row["n_pairs"] == 1
    assert (
        f"farm-correlate: 2 records have no 'preference' field and were left out (the first at {judge}:2)"
        in result.stderr
    )
    assert (
        f"farm-correlate: 1 records have no 'a2' field and were left out (the first at {humans}:4)"
        in result.stderr
    )


# ---------------------------------------------------------------- agreement definitions side by side


def test_agreement_definitions_side_by_side_on_pandalm():
    humans = shared_data("human_prefs/pandalm_testset_v1.json")
    judge = shared_data("human_prefs/pandalm_gpt35_judgments_v1.json")
    result = CliRunner().invoke(
        cli,
        [
            "--humans",
            str(humans),
            "--key",
            "idx",
            "--outputs",
            "response1,response2",
            "--human-label",
            "annotator1,annotator2,annotator3",
            "--judge",
            str(judge),
            "--judge-label",
            "gpt_result",
        ],
    )
    judge_row, *_, people = records_of(result)
    # AlpacaFarm's leave-one-out agreement with the mode of the other humans, ties count as a label
    assert round(judge_row["human_agreement"], 3) == 0.706
    # AlpacaEval's: with the mode of all three humans, a tie on either side scores half
    assert round(judge_row["human_agreement_alpacaeval"], 3) == 0.777
    assert judge_row["flip_rate"] is None  # one order only
    assert people["human_agreement_alpacaeval"] is None


def test_one_row_per_judge_with_the_flip_rate(tmp_path):
    pairs = [(f"task {i}", f"answer a{i}", f"answer b{i}") for i in range(4)]

    def record(i, label, swapped=False, annotator="j"):
        instruction, first, second = pairs[i]
        if swapped:
            first, second = second, first
        return {
            "instruction": instruction,
            "output_1": first,
            "output_2": second,
            "preference": label,
            "annotator": annotator,
        }

    humans = write_jsonl(
        tmp_path / "h.jsonl",
        [{**record(i, label), "annotator": "h"} for i, label in enumerate([2, 2, 1, 1])],
    )
    # judge "steady": both orders, same verdict each time (2 shown second = 1 shown first after the swap)
    steady = write_jsonl(
        tmp_path / "steady.jsonl",
        [record(i, 2, annotator="steady") for i in range(4)]
        + [record(i, 1, swapped=True, annotator="steady") for i in range(4)],
    )
    # judge "first": always picks the output shown first, so every swapped verdict flips; ties on pair 3
    first = write_jsonl(
        tmp_path / "first.jsonl",
        [record(i, 1, annotator="first") for i in range(3)]
        + [record(3, 1.5, annotator="first")]
        + [record(i, 1, swapped=True, annotator="first") for i in range(3)],
    )
    result = CliRunner().invoke(
        cli,
        [
            "--judge",
            str(steady),
            "--judge",
            str(first),
            "--humans",
            str(humans),
            "--format",
            "jsonl",
        ],
    )
    rows = records_of(result)
    assert [row["annotator"] for row in rows] == ["steady", "first", "humans"]
    steady_row, first_row = rows[0], rows[1]
    assert steady_row["flip_rate"] == 0.0 and first_row["flip_rate"] == 1.0
    # one order each against the single human: steady says 2 everywhere (agrees on pairs 0, 1);
    # first says 1, 1, 1, tie (agrees on 2; the tie on pair 3 scores half under AlpacaEval's rule only)
    assert steady_row["human_agreement"] == pytest.approx(2 / 4) and steady_row[
        "human_agreement_alpacaeval"
    ] == pytest.approx(2 / 4)
    assert first_row["human_agreement"] == pytest.approx(1 / 4)
    assert first_row["human_agreement_alpacaeval"] == pytest.approx(1.5 / 4)
    markdown = CliRunner().invoke(
        cli,
        [
            "--judge",
            str(steady),
            "--judge",
            str(first),
            "--humans",
            str(humans),
            "--format",
            "markdown",
        ],
    )
    assert markdown.stdout.splitlines()[0].startswith(
        "| annotator | n_pairs | n_runs | human_agreement | human_agreement_alpacaeval | flip_rate |"
    )
    judges = ["--judge", str(steady), "--judge", str(first), "--humans", str(humans)]
    table = CliRunner().invoke(cli, [*judges, "--format", "csv"])
    assert table.exit_code == 0, table.output
    parsed = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [row["annotator"] for row in parsed] == ["steady", "first", "humans"]
    assert list(parsed[0])[:6] == list(rows[0])[:6]  # the JSONL rows' columns, in their order
    assert float(parsed[1]["flip_rate"]) == 1.0
    assert float(parsed[1]["human_agreement_alpacaeval"]) == pytest.approx(1.5 / 4)


def test_price_and_seconds_per_1000_from_provenance(tmp_path):
    """farm-annotate's provenance price/time (and AlpacaEval's per-example fields) become a judge's
    price and seconds per 1,000 verdicts; a judge that records none gets null."""
    pairs = [(f"task {i}", f"answer a{i}", f"answer b{i}") for i in range(3)]

    def record(i, annotator, **extra):
        instruction, first, second = pairs[i]
        return {
            "instruction": instruction,
            "output_1": first,
            "output_2": second,
            "preference": 2,
            "annotator": annotator,
            **extra,
        }

    humans = write_jsonl(tmp_path / "h.jsonl", [record(i, "h") for i in range(3)])
    paid = write_jsonl(
        tmp_path / "paid.jsonl",
        [
            record(i, "paid", provenance={"farm-annotate": {"price": price, "time": seconds}})
            for i, (price, seconds) in enumerate([(0.001, 1.0), (0.002, 2.0), (0.003, 6.0)])
        ],
    )
    alpaca = write_jsonl(
        tmp_path / "alpaca.jsonl",
        [record(i, "alpaca", price_per_example=0.01, time_per_example=0.5) for i in range(3)],
    )
    free = write_jsonl(tmp_path / "free.jsonl", [record(i, "free") for i in range(3)])
    args = ["--judge", str(paid), "--judge", str(alpaca), "--judge", str(free)]
    rows = records_of(CliRunner().invoke(cli, [*args, "--humans", str(humans)]))
    by_name = {row["annotator"]: row for row in rows}
    assert by_name["paid"]["price_per_1000"] == pytest.approx(2.0)
    assert by_name["paid"]["seconds_per_1000"] == pytest.approx(3000.0)
    assert by_name["alpaca"]["price_per_1000"] == pytest.approx(10.0)
    assert by_name["alpaca"]["seconds_per_1000"] == pytest.approx(500.0)
    assert by_name["free"]["price_per_1000"] is None and by_name["free"]["seconds_per_1000"] is None


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_utf16_boards_with_a_byte_order_mark_are_read(tmp_path, encoding, kind):
    """Spreadsheets and PowerShell save UTF-16 with a byte order mark: such a board reads like UTF-8."""
    import codecs

    bom = {"utf-16": b"", "utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}
    if kind == "csv":
        text = "generator,win_rate\nalpha,10\nbéta,30\ngamma,20\n"
    else:
        text = "".join(
            orjson.dumps({"generator": g, "win_rate": s}).decode() + "\n"
            for g, s in (("alpha", 10), ("béta", 30), ("gamma", 20))
        )
    path = tmp_path / f"board.{kind}"
    path.write_bytes(bom[encoding] + text.encode(encoding))
    other = board(tmp_path / "other.jsonl", {"alpha": 1, "béta": 3, "gamma": 2})
    (row,) = records_of(CliRunner().invoke(cli, [str(path), str(other)]))
    assert row["n"] == 3 and row["spearman"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"generator,win_rate\na,1\nb\xff\xfe\x00,2\n", 3),  # Latin-1 / binary bytes in a CSV
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", 1),  # a picture, not a board
        (b"generator,win_rate\na,1\n" + b"\x00\x9f\x92\x96" * 4, 3),
    ],
)
def test_a_board_that_is_not_utf8_names_the_file_line_and_encoding(tmp_path, capfd, content, line):
    path = tmp_path / "board.csv"
    path.write_bytes(content)
    good = board(tmp_path / "good.jsonl", {"a": 1, "b": 2})
    code, out, err = run_main(capfd, str(good), str(path))
    assert code == 1 and out == ""
    assert err.startswith(f"farm-correlate: error: {path}:{line}: not UTF-8 text"), err
    assert "expected UTF-8 (or UTF-16 with a byte order mark)" in err
    assert "Traceback" not in err and "UnicodeDecodeError" not in err


def test_judge_files_with_no_usable_label_are_an_error(tmp_path, capfd):
    """Every record skipped (no label field, or no verdict) is not a result: exit 1, saying why."""
    judge = write_jsonl(
        tmp_path / "j.jsonl", [{"pair_id": i, "verdict": 2} for i in range(3)] + [{"pair_id": 9}]
    )
    humans = write_jsonl(tmp_path / "h.jsonl", [{"pair_id": i, "preference": 1} for i in range(3)])
    code, out, err = run_main(capfd, "--judge", str(judge), "--humans", str(humans))
    assert code == 1 and out == ""
    assert f"farm-correlate: error: no usable judge label in {judge}" in err
    assert "4 records read" in err and "--judge-label" in err

    nulls = write_jsonl(
        tmp_path / "n.jsonl", [{"pair_id": i, "preference": None} for i in range(3)]
    )
    code, out, err = run_main(capfd, "--judge", str(nulls))
    assert code == 1 and out == "" and "no usable judge label" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    code, out, err = run_main(capfd, "--judge", str(empty))
    assert code == 1 and out == "" and "0 records read" in err
