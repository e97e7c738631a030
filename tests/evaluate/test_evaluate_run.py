"""farm-eval (issue 21, items 1 and 5): outputs (or a model) + a reference -> leaderboard rows with raw
and length-controlled win rates, placed on a published board; and, on AlpacaEval's published data,
the published AlpacaEval 2 rows reproduced from the outputs and the published verdicts."""

from __future__ import annotations

import gzip
import math

import orjson
import pytest
from conftest import SHARED_DATA, run_tool, shared_data

from farmkit.evaluate.run import place, read_board


def _jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def _rows(stdout: bytes) -> list[dict]:
    return [orjson.loads(line) for line in stdout.splitlines()]


INSTRUCTIONS = [f"Explain tides, case {i}" for i in range(6)]


def _outputs(generator, text):
    return [
        {"instruction": x, "output": f"{text} {i}", "generator": generator}
        for i, x in enumerate(INSTRUCTIONS)
    ]


def _labels(reference, outputs, preferences):
    """AlpacaEval-style annotations: the two texts, both generators, a (fractional) preference."""
    return [
        {
            "instruction": r["instruction"],
            "output_1": r["output"],
            "output_2": o["output"],
            "generator_1": r["generator"],
            "generator_2": o["generator"],
            "preference": p,
            "annotator": "weighted_alpaca_eval_gpt4_turbo",
        }
        for r, o, p in zip(reference, outputs, preferences, strict=True)
    ]


def test_labels_give_the_exact_fractional_win_rate_in_alpaca_eval_json(tmp_path):
    reference = _outputs("ref", "The moon pulls the sea.")
    model = _outputs(
        "mine", "Tides come from the moon's gravity and the earth's rotation, in detail"
    )
    preferences = [1.9, 1.25, 1.5, 2.0, 1.0, 1.733333]
    (tmp_path / "model.json").write_bytes(orjson.dumps(model))  # AlpacaEval's JSON list
    labels = _jsonl(tmp_path / "annotations.jsonl", _labels(reference, model, preferences))
    done = run_tool(
        "farm-eval",
        str(tmp_path / "model.json"),
        "--reference",
        _jsonl(tmp_path / "ref.jsonl", reference),
        "--labels",
        labels,
        "--no-cache",
        "--bootstrap",
        "200",
    )
    assert done.returncode == 0, done.stderr.decode()
    [row] = _rows(done.stdout)
    expected = 100 * sum(p - 1 for p in preferences) / len(preferences)
    assert row["generator"] == "mine" and row["reference"] == "ref"
    assert math.isclose(row["win_rate"], expected, abs_tol=1e-4), (row["win_rate"], expected)
    assert row["n_total"] == 6 and row["n_draws"] == 1
    assert row["ci_low"] <= row["win_rate"] <= row["ci_high"]
    assert row["length_controlled_win_rate"] is not None and row["standard_error"] > 0


def test_the_default_pool_is_the_weighted_judge(tmp_path):
    reference = _jsonl(tmp_path / "ref.jsonl", _outputs("ref", "a"))
    done = run_tool("farm-eval", reference, "--reference", reference, "--no-cache", "--help")
    assert "[default: weighted_gpt4_turbo]" in done.stdout.decode()
    assert "farm-annotate - --reference REF" in done.stdout.decode()  # the pipe it stands for


def test_an_offline_pool_ranks_several_models(tmp_path):
    reference = _jsonl(tmp_path / "ref.jsonl", _outputs("ref", "Tides are explained by the moon."))
    good = _jsonl(
        tmp_path / "good.jsonl",
        _outputs("good", "Tides rise and fall because the moon's gravity pulls the oceans"),
    )
    bad = _jsonl(tmp_path / "bad.jsonl", _outputs("bad", "no"))
    done = run_tool(
        "farm-eval",
        good,
        bad,
        "--reference",
        reference,
        "--pool",
        "sim_eval_offline",
        "--no-cache",
        "--format",
        "table",
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["rank", "generator", "length_controlled_win_rate"]
    assert [line.split()[:2] for line in lines[1:]] == [["1", "good"], ["2", "bad"]]


BOARD = """,win_rate,standard_error,n_wins,n_wins_base,n_draws,n_total,discrete_win_rate,mode,avg_length,length_controlled_winrate,lc_standard_error
big,40.0,1.5,300,500,5,805,40.0,verified,2000,35.0,0.7
small,10.0,1.0,80,720,5,805,10.0,community,900,20.0,0.6
mine,99.0,0.1,800,5,0,805,99.0,community,100,99.0,0.1
nolc,30.0,1.4,240,560,5,805,30.0,minimal,1500,,
"""


def test_a_published_board_takes_the_new_rows_in_order(tmp_path, caplog):
    board = tmp_path / "board.csv"
    board.write_text(BOARD)
    rows = read_board(str(board))
    assert rows[0]["generator"] == "big" and rows[0]["length_controlled_win_rate"] == 35.0
    assert rows[0]["n_losses"] == 500 and rows[3]["length_controlled_win_rate"] == ""
    new = [{"generator": "mine", "win_rate": 25.0, "length_controlled_win_rate": 30.0}]
    by_lc = place(rows, new, "lc")
    assert [(r["rank"], r["generator"], r["source"]) for r in by_lc] == [
        (1, "big", "published"),
        (2, "mine", "farm-eval"),
        (3, "small", "published"),
        (4, "nolc", "published"),
    ]
    assert (
        "mine is on the board already" in caplog.text
    )  # the published row of the same name is replaced
    by_raw = place(rows, new, "win_rate")
    assert [r["generator"] for r in by_raw] == ["big", "nolc", "mine", "small"]
    # rows that carry a rank already (a board farm-eval wrote) are ranked again
    again = place(by_lc, [{**by_lc[1], "win_rate": 5.0}], "win_rate")
    assert [(r["rank"], r["generator"]) for r in again][-1] == (4, "mine")


def test_farm_eval_prints_the_merged_board(tmp_path):
    reference = _outputs("ref", "The moon pulls the sea.")
    model = _outputs("mine", "Tides come from the moon")
    labels = _jsonl(tmp_path / "a.jsonl", _labels(reference, model, [1.25] * 6))
    board = tmp_path / "board.csv"
    board.write_text(BOARD)
    done = run_tool(
        "farm-eval",
        _jsonl(tmp_path / "m.jsonl", model),
        "--reference",
        _jsonl(tmp_path / "r.jsonl", reference),
        "--labels",
        labels,
        "--no-cache",
        "--leaderboard",
        str(board),
        "--sort-by",
        "win_rate",
    )
    assert done.returncode == 0, done.stderr.decode()
    rows = _rows(done.stdout)
    assert [r["generator"] for r in rows] == ["big", "nolc", "mine", "small"]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert (
        math.isclose(rows[2]["win_rate"], 25.0, abs_tol=1e-4) and rows[2]["source"] == "farm-eval"
    )


def _merge_with_board(tmp_path, preference: float, *options: str):
    """farm-eval on one model ("mine", six verdicts of `preference` against "ref"), merged into the
    published board BOARD, with options (the format and the output)."""
    reference = _outputs("ref", "The moon pulls the sea.")
    model = _outputs("mine", "Tides come from the moon")
    labels = _jsonl(tmp_path / "a.jsonl", _labels(reference, model, [preference] * 6))
    board = tmp_path / "board.csv"
    board.write_text(BOARD)
    return run_tool(
        "farm-eval",
        _jsonl(tmp_path / "m.jsonl", model),
        *("--reference", _jsonl(tmp_path / "r.jsonl", reference)),
        *("--labels", labels, "--no-cache", "--leaderboard", str(board)),
        *options,
    )


def test_farm_eval_writes_the_merged_board_as_alpaca_eval_publishes_it(tmp_path):
    """--format alpaca-eval: the merged board in AlpacaEval's leaderboard CSV, read back by pandas with
    AlpacaEval's own column names; the published rows keep their figures and mode."""
    pandas = pytest.importorskip("pandas")
    from farmkit.evaluate.boards import ALPACA_EVAL_BOARD

    written = tmp_path / "merged.csv"
    done = _merge_with_board(
        tmp_path, 1.25, "--sort-by", "win_rate", "--format", "alpaca-eval", "-o", str(written)
    )
    assert done.returncode == 0, done.stderr.decode()
    frame = pandas.read_csv(written, index_col=0)
    assert list(frame.columns) == [name for name, _ in ALPACA_EVAL_BOARD]
    assert list(frame.index) == ["big", "nolc", "mine", "small"]
    assert math.isclose(frame.loc["mine", "win_rate"], 25.0, abs_tol=1e-9)
    assert frame.loc["big", "length_controlled_winrate"] == 35.0
    assert frame.loc["big", "n_wins_base"] == 500 and frame.loc["big", "mode"] == "verified"
    assert frame.loc["mine", "mode"] == "community"


def test_a_bad_board_names_file_and_line(tmp_path):
    board = tmp_path / "board.csv"
    board.write_text(BOARD.replace("small,10.0,", "small,"))
    with pytest.raises(Exception, match=rf"{board}:3: 11 cells; expected 12"):
        read_board(str(board))


@pytest.mark.model
def test_a_model_folder_is_sampled_on_the_reference_first(tmp_path, tiny_model_path):
    reference = _jsonl(tmp_path / "ref.jsonl", _outputs("ref", "moon")[:2])
    done = run_tool(
        "farm-eval",
        str(tiny_model_path),
        "--reference",
        reference,
        "--pool",
        "sim_eval_offline",
        "--no-cache",
        "--max-new-tokens",
        "4",
        "--bootstrap",
        "0",
    )
    assert done.returncode == 0, done.stderr.decode()
    [row] = _rows(done.stdout)
    assert row["reference"] == "ref" and row["n_total"] == 2 and row["generator"] != "ref"


# -- AlpacaEval 2, from the published data -------------------------------------------------------

BOARD_CSV = (
    "alpaca_eval/leaderboards/data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
)
REFERENCE = "gpt4_1106_preview"
REPRODUCED = ("vicuna-13b", "wizardlm-13b", "falcon-40b-instruct")


def _read(path):
    return [orjson.loads(line) for line in gzip.open(path)]


def alpaca_eval_inputs(folder, models, out):
    """From ../shared/data: the reference's outputs, the models' outputs, full-text AlpacaEval
    annotations (the compact published rows joined with the eval set and the outputs, as AlpacaEval's
    own annotations.json files hold them) and instruction difficulties estimated from every published
    verdict of the judge (AlpacaEval ships its own; they are not in the data)."""
    import numpy as np

    from farmkit.evaluate.length_control import _scaled_length_difference, estimate_difficulty

    eval_set = [orjson.loads(line) for line in open(folder / "eval_set.jsonl", "rb")]
    outputs = {
        name: {r["instruction"]: r for r in _read(folder / "model_outputs" / f"{name}.jsonl.gz")}
        for name in (REFERENCE, *models)
    }
    # the upstream data errors (shared/data/README.md): keep rows that are what their folder says
    published = [
        r
        for r in _read(folder / "annotations" / "weighted_alpaca_eval_gpt4_turbo.jsonl.gz")
        if r["generator_2"] == r["results_dir"]
    ]
    annotations = []
    for r in published:
        if r["generator_2"] not in models:
            continue
        instruction = eval_set[r["instruction_index"]]["instruction"]
        first, second = (
            outputs[REFERENCE].get(instruction),
            outputs[r["generator_2"]].get(instruction),
        )
        if first is None or second is None:
            continue
        annotations.append(
            {
                "instruction": instruction,
                "output_1": first["output"],
                "output_2": second["output"],
                "generator_1": r["generator_1"],
                "generator_2": r["generator_2"],
                "preference": r["preference"],
            }
        )
    by_model: dict[str, list] = {}
    for r in published:
        if r["preference"] is not None:
            by_model.setdefault(r["generator_2"], []).append(r)
    groups = list(by_model.values())
    difficulty = estimate_difficulty(
        [np.array([r["instruction_index"] for r in g]) for g in groups],
        [
            _scaled_length_difference(np.array([r["len_2"] - r["len_1"] for r in g], dtype=float))
            for g in groups
        ],
        [
            np.array([(r["preference"] or 1.5) - 1 if r["preference"] != 0 else 0.5 for r in g])
            for g in groups
        ],
        len(eval_set),
    )
    context = [  # every published verdict, with its instruction's text (AlpacaEval's annotations)
        {
            **{k: v for k, v in r.items() if k != "instruction_index"},
            "instruction": eval_set[r["instruction_index"]]["instruction"],
        }
        for r in _read(folder / "annotations" / "weighted_alpaca_eval_gpt4_turbo.jsonl.gz")
    ]
    paths = {
        "context": _jsonl(out / "context.jsonl", context),
        "reference": _jsonl(out / "reference.jsonl", list(outputs[REFERENCE].values())),
        "labels": _jsonl(out / "annotations.jsonl", annotations),
        "difficulty": _jsonl(
            out / "difficulty.jsonl",
            [
                {"instruction": x["instruction"], "instruction_difficulty": float(d)}
                for x, d in zip(eval_set, difficulty, strict=True)
            ],
        ),
    }
    for name in models:  # AlpacaEval's model_outputs.json: a JSON list
        (out / f"{name}.json").write_bytes(orjson.dumps(list(outputs[name].values())))
        paths[name] = str(out / f"{name}.json")
    return paths


def test_farm_eval_reproduces_published_alpaca_eval_2_rows(tmp_path):
    board_path = shared_data(BOARD_CSV)
    folder = SHARED_DATA / "alpaca_eval"
    paths = alpaca_eval_inputs(folder, REPRODUCED, tmp_path)
    done = run_tool(
        "farm-eval",
        *(paths[m] for m in REPRODUCED),
        "--reference",
        paths["reference"],
        "--labels",
        paths["labels"],
        "--instruction-difficulty",
        paths["difficulty"],
        "--no-cache",
        "--leaderboard",
        str(board_path),
        "--bootstrap",
        "0",
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    board = {r["generator"]: r for r in _rows(done.stdout)}
    published = read_board(str(board_path))
    by_name = {r["generator"]: r for r in published}
    lc_rank = {r["generator"]: r["rank"] for r in place(published, [], "lc")}
    raw_rank = {r["generator"]: r["rank"] for r in place(published, [], "win_rate")}
    new_rows = [board[m] for m in REPRODUCED]
    new_raw_rank = {r["generator"]: r["rank"] for r in place(published, new_rows, "win_rate")}
    for model in REPRODUCED:
        row, expected = board[model], by_name[model]
        assert row["source"] == "farm-eval" and row["n_total"] == expected["n_total"]
        assert abs(row["win_rate"] - expected["win_rate"]) < 1e-9, (
            model,
            row["win_rate"],
            expected["win_rate"],
        )
        lc, published_lc = row["length_controlled_win_rate"], expected["length_controlled_win_rate"]
        assert abs(lc - published_lc) < 0.5, (model, lc, published_lc)
        # by raw win rate, exactly the published place; by LC, off by no more than the published rows
        # whose LC lies between the published figure and ours
        assert new_raw_rank[model] == raw_rank[model], model
        between = sum(
            min(lc, published_lc) <= r["length_controlled_win_rate"] <= max(lc, published_lc)
            for r in published
            if r["generator"] != model and isinstance(r["length_controlled_win_rate"], float)
        )
        assert abs(row["rank"] - lc_rank[model]) <= between, (
            model,
            row["rank"],
            lc_rank[model],
            between,
        )
    assert len(board) == len(published)


def test_farm_eval_fits_length_control_with_other_models_verdicts(tmp_path):
    """--context: the published verdicts of the other models (and an upstream copy among them, left
    out) fit the length control jointly, as farm-winrate does over the whole board: LC within 0.5
    points without a difficulty file."""
    shared_data(BOARD_CSV)
    paths = alpaca_eval_inputs(SHARED_DATA / "alpaca_eval", REPRODUCED, tmp_path)
    done = run_tool(
        "farm-eval",
        *(paths[m] for m in REPRODUCED),
        "--reference",
        paths["reference"],
        "--labels",
        paths["labels"],
        "--context",
        paths["context"],
        "--no-cache",
        "--bootstrap",
        "0",
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = {r["generator"]: r for r in _rows(done.stdout)}
    assert set(rows) == set(REPRODUCED)  # the context's models are fitted, not printed
    assert "upstream copy" in done.stderr.decode()
    published = {r["generator"]: r for r in read_board(str(SHARED_DATA / BOARD_CSV))}
    for model in REPRODUCED:
        assert abs(rows[model]["win_rate"] - published[model]["win_rate"]) < 1e-9, model
        lc = rows[model]["length_controlled_win_rate"]
        assert abs(lc - published[model]["length_controlled_win_rate"]) < 0.5, (model, lc)
        assert rows[model]["lc_difficulty"].startswith("estimated from"), rows[model][
            "lc_difficulty"
        ]


def test_a_board_goes_to_a_file_as_csv(tmp_path):
    out = tmp_path / "merged.csv"
    done = _merge_with_board(tmp_path, 1.5, "--format", "csv", "-o", str(out))
    assert done.returncode == 0 and done.stdout == b"", done.stderr.decode()
    lines = out.read_text().splitlines()
    assert lines[0].startswith("rank,generator,length_controlled_win_rate,")
    assert len(lines) == 5 and any(",mine," in line and "farm-eval" in line for line in lines)


def test_labels_that_miss_most_pairs_are_an_error_not_a_row(tmp_path):
    """Verdicts for 1 of 6 pairs made a row (win rate on n_total 1) with stderr saying the replies
    could not be parsed and that a rerun would ask again: the run now stops, saying why."""
    reference = _outputs("ref", "The moon pulls the sea.")
    model = _outputs("mine", "Tides come from the moon")
    labels = _jsonl(tmp_path / "a.jsonl", _labels(reference[:1], model[:1], [2.0]))
    args = [
        _jsonl(tmp_path / "m.jsonl", model),
        "--reference",
        _jsonl(tmp_path / "r.jsonl", reference),
    ]
    args += ["--labels", labels, "--no-cache", "--bootstrap", "0"]
    done = run_tool("farm-eval", *args)
    stderr = done.stderr.decode()
    assert done.returncode == 1 and done.stdout == b"", stderr
    assert stderr.splitlines()[-1] == (
        f"farm-eval: error: mine: 5 of 6 pairs have no verdict (no label for this pair in {labels}: "
        "5); a win rate on the other 1 would not stand for the model. Give verdicts that cover its "
        "outputs, or --min-verdicts 0.17 to accept it (now 0.9)"
    )
    assert (
        f"farm-annotate: 5 of 6 pair(s) have no verdict (preference null): no label for this pair in {labels}"
        in stderr
    )
    assert "could not be parsed" not in stderr and "rerun" not in stderr
    accepted = run_tool("farm-eval", *args, "--min-verdicts", "0.1")
    assert accepted.returncode == 0, accepted.stderr.decode()
    [row] = _rows(accepted.stdout)
    assert row["n_total"] == 1 and row["win_rate"] == 100.0


def test_the_sampling_options_reach_farm_sample(tmp_path, tiny_model_path, monkeypatch):
    """--device, --template and the decoding options are farm-sample's own (the same bundles),
    passed through to the sampling of a model folder (a spy stands in for farm-sample), and
    --device to the judges too."""
    from farmkit.tools import farm_sample
    from farmkit.tools.farm_eval import main as eval_main

    from farmkit.annotate import run as annotate_run

    reference = _outputs("ref", "moon")[:2]
    seen: list[list[str]] = []

    def spy(args, standalone_mode):
        seen.append(args)
        answers = [{**record, "output": "tides", "generator": "spy"} for record in reference]
        _jsonl(tmp_path / args[args.index("-o") + 1], answers)

    monkeypatch.setattr(farm_sample.cli, "main", spy)
    judged_on: list[str] = []  # --device is also the local judges' (as farm-annotate's)
    start_run = annotate_run.Run.__init__

    def run_on(self, *args, **kwargs):
        judged_on.append(kwargs.get("device"))
        start_run(self, *args, **kwargs)

    monkeypatch.setattr(annotate_run.Run, "__init__", run_on)
    argv = [str(tiny_model_path), "--reference", _jsonl(tmp_path / "ref.jsonl", reference)]
    argv += ["--pool", "gold", "--no-cache", "--bootstrap", "0", "--device", "cpu"]
    argv += ["--template", "alpaca", "--temperature", "0", "--top-p", "0.9"]
    argv += ["--max-new-tokens", "7", "--generation-batch-size", "3", "-q"]
    with pytest.raises(SystemExit) as exit_info:
        eval_main(argv)
    assert exit_info.value.code == 0
    [args] = seen
    assert args[:4] == [str(tiny_model_path), str(tmp_path / "ref.jsonl"), "-n", "1"]
    given = {
        "--template": "alpaca",
        "--device": "cpu",
        "--temperature": "0.0",
        "--top-p": "0.9",
        "--max-new-tokens": "7",
        "--generation-batch-size": "3",
    }
    assert {flag: args[args.index(flag) + 1] for flag in given} == given
    assert judged_on == ["cpu"]


def test_one_models_lc_standard_error_is_blank_not_rounding_noise(tmp_path):
    """Without instruction difficulties (one model) the controlled win rate is the same on every
    instruction: its standard error is not estimable, blank as AlpacaEval leaves it, not 1e-17."""
    written = tmp_path / "board.csv"
    done = _merge_with_board(tmp_path, 1.25, "--format", "alpaca-eval", "-o", str(written))
    assert done.returncode == 0, done.stderr.decode()
    [mine] = [line for line in written.read_text().splitlines() if line.startswith("mine,")]
    *_, lc, lc_standard_error = mine.split(",")
    assert float(lc) > 0 and lc_standard_error == "", mine
    rows = _rows(_merge_with_board(tmp_path, 1.25).stdout)
    [row] = [row for row in rows if row["generator"] == "mine"]
    assert row["length_controlled_win_rate"] == pytest.approx(float(lc))
    assert row["lc_standard_error"] is None


@pytest.mark.parametrize("missing", ["outputs", "reference", "leaderboard", "labels"])
def test_a_missing_input_file_is_a_usage_error_whichever_it_is(tmp_path, missing):
    """A missing --leaderboard was exit 2 (click), a missing OUTPUTS exit 1: the same mistake, the
    same exit code (2) and a message naming the path."""
    reference = _outputs("ref", "The moon pulls the sea.")
    model = _outputs("mine", "Tides come from the moon")
    files = {
        "outputs": _jsonl(tmp_path / "m.jsonl", model),
        "reference": _jsonl(tmp_path / "r.jsonl", reference),
        "leaderboard": str(tmp_path / "board.csv"),
        "labels": _jsonl(tmp_path / "a.jsonl", _labels(reference, model, [2.0] * 6)),
    }
    (tmp_path / "board.csv").write_text(BOARD)
    gone = tmp_path / f"no-{missing}.jsonl"
    files[missing] = str(gone)
    done = run_tool(
        "farm-eval",
        files["outputs"],
        *("--reference", files["reference"], "--labels", files["labels"]),
        *("--leaderboard", files["leaderboard"], "--no-cache", "--bootstrap", "0"),
    )
    stderr = done.stderr.decode()
    assert done.returncode == 2 and done.stdout == b"", stderr
    assert str(gone) in stderr and "Traceback" not in stderr


def test_a_missing_input_file_exits_2_in_the_other_tools_too(tmp_path):
    gone = str(tmp_path / "gone.jsonl")
    for argv in (["farm-winrate", gone], ["farm-annotate", "--pool", "gold", gone]):
        done = run_tool(*argv)
        assert done.returncode == 2, done.stderr.decode()
        assert (
            done.stderr.decode()
            == f"{argv[0]}: error: {gone}: cannot open: No such file or directory\n"
        )


def test_empty_input_is_said_on_stderr(tmp_path):
    reference = _jsonl(tmp_path / "r.jsonl", _outputs("ref", "The moon pulls the sea."))
    done = run_tool(
        "farm-eval", "--reference", reference, "--pool", "gold", "--no-cache", input=b""
    )
    assert done.returncode == 0 and done.stdout == b""  # the contract of every tool's empty input
    assert "farm-eval: no output records in <stdin>; nothing to evaluate" in done.stderr.decode()
