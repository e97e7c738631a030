"""The board formats (farmkit.evaluate.boards): one registry of --format names shared by farm-winrate,
farm-eval and farm-correlate, and one writer (stdout, or a file whole or not at all)."""

from __future__ import annotations

import gzip

import click
import orjson
import pytest
from farmkit.tools import farm_correlate, farm_eval, farm_winrate

from farmkit.evaluate import boards

ROWS = [
    {"generator": "a", "reference": "r", "win_rate": 61.25, "provenance": {"x": 1}},
    {"generator": "b", "reference": "r", "win_rate": 40.0, "provenance": {"x": 1}},
]


@pytest.mark.parametrize("module", [farm_winrate, farm_eval, farm_correlate])
def test_every_board_tool_offers_the_registry_formats(module):
    (option,) = [param for param in module.cli.params if param.name == "fmt"]
    assert isinstance(option.type, click.Choice)
    assert tuple(option.type.choices) == tuple(boards.BOARD_FORMATS)
    assert option.default == "jsonl"


def test_the_registry_names_every_format_once():
    assert tuple(boards.BOARD_FORMATS) == ("jsonl", "table", "csv", "markdown", "alpaca-eval")


@pytest.mark.parametrize("fmt", list(boards.BOARD_FORMATS))
def test_a_board_goes_to_stdout_and_to_a_file_alike(fmt, tmp_path, capsysbinary):
    boards.write_board(ROWS, fmt, "-", ("generator", "win_rate"))
    shown = capsysbinary.readouterr().out
    boards.write_board(ROWS, fmt, str(tmp_path / "board"), ("generator", "win_rate"))
    assert (tmp_path / "board").read_bytes() == shown
    assert shown.endswith(b"\n")
    assert list(tmp_path.iterdir()) == [tmp_path / "board"]  # no temporary file left


def test_jsonl_boards_are_records_and_gz_compresses(tmp_path):
    path = tmp_path / "board.jsonl.gz"
    boards.write_board(ROWS, "jsonl", str(path))
    lines = gzip.decompress(path.read_bytes()).splitlines()
    assert [orjson.loads(line) for line in lines] == ROWS


def test_text_boards_leave_out_provenance_and_follow_the_columns():
    assert boards.BOARD_FORMATS["csv"](ROWS, ("win_rate", "generator")) == (
        "win_rate,generator\n61.25,a\n40.0,b\n"
    )
    assert boards.BOARD_FORMATS["table"](ROWS, None).splitlines()[0].split() == [
        "generator",
        "reference",
        "win_rate",
    ]
    assert boards.BOARD_FORMATS["alpaca-eval"](ROWS, None).startswith(",win_rate,standard_error")


def test_a_failed_board_leaves_the_old_file(tmp_path):
    """The write fails after the file is opened (a generator name that is no UTF-8: a lone
    surrogate), so only writing beside the file and renaming it keeps the old board."""
    path = tmp_path / "board.csv"
    path.write_text("old\n")
    rows = [{"generator": "model-\ud800", "win_rate": 50.0}]
    with pytest.raises(UnicodeEncodeError):
        boards.write_board(rows, "csv", str(path), ["generator", "win_rate"])
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["board.csv"]  # no temporary file left
