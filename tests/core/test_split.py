"""farm-split: sizes (scaled, exact, capped, fractions), disjointness, stability when records are
appended, duplicates, determinism under --seed, atomic -o, and errors naming FILE:LINE."""

from __future__ import annotations

import json
import math
from collections import Counter

import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool, shared_data
from farmkit.tools import farm_split
from farmkit.tools.farm_split import cli

from farmkit.core import split as split_module
from farmkit.core.split import assign, parse_sizes


def instructions(n, start=0):
    return [
        {"instruction": f"Write item number {i}.", "input": "", "output": f"answer {i}"}
        for i in range(start, start + n)
    ]


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def tagged(result):
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def test_default_sizes_scale_proportionally_for_a_small_input(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", instructions(2100))
    result = CliRunner().invoke(cli, [str(path), "--tag"])
    assert result.exit_code == 0
    records = tagged(result)
    assert [r["instruction"] for r in records] == [
        r["instruction"] for r in instructions(2100)
    ]  # order kept
    counts = Counter(r["split"] for r in records)
    assert sum(counts.values()) == 2100 and None not in counts  # a small input is used whole
    # AlpacaFarm's 10k / 10k / 20k / 2k scaled to 2100 records: 500 / 500 / 1000 / 100 in expectation
    for split, expected in {"sft": 500, "pref": 500, "unlabeled": 1000, "val": 100}.items():
        sd = math.sqrt(2100 * expected / 2100 * (1 - expected / 2100))
        assert abs(counts[split] - expected) < 4 * sd, (split, counts[split])
    assert records[0]["provenance"]["farm-split"] == {
        "tool": "farm-split",
        "version": "0.1.0",
        "seed": 0,
        "sizes": "sft=10000,pref=10000,unlabeled=20000,val=2000",
    }
    assert "2100 records: sft" in result.stderr


def test_exact_sizes_and_fractions(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", instructions(420))
    exact = Counter(
        r["split"] for r in tagged(CliRunner().invoke(cli, [str(path), "--tag", "--exact"]))
    )
    assert exact == {"sft": 100, "pref": 100, "unlabeled": 200, "val": 20}
    fractions = Counter(
        r["split"]
        for r in tagged(
            CliRunner().invoke(
                cli, [str(path), "--tag", "--exact", "--sizes", "train=0.5,test=0.25"]
            )
        )
    )
    assert fractions == {"train": 210, "test": 105, None: 105}


def test_absolute_sizes_cap_a_larger_input():
    result = assign(instructions(300), parse_sizes("a=10,b=20"), seed=0)
    assert result.counts == {"a": 10, "b": 20}
    assert result.assignment.count(None) == 270


def test_appending_records_never_moves_the_others():
    sizes = parse_sizes("sft=10000,pref=10000,unlabeled=20000,val=2000")
    before = assign(instructions(500), sizes, seed=7).assignment
    after = assign(instructions(500) + instructions(300, start=500), sizes, seed=7).assignment
    assert after[:500] == before
    # and with caps reached: a record can only leave a full split, never go to another one
    capped = parse_sizes("a=40,b=80")
    before = assign(instructions(400), capped, seed=1).assignment
    after = assign(instructions(400) + instructions(200, start=400), capped, seed=1).assignment
    assert all(new is None or new == old for old, new in zip(before, after[:400], strict=True))
    assert (
        sum(old != new for old, new in zip(before, after[:400], strict=True)) > 0
    )  # some did drop out


def test_duplicates_share_a_split_and_are_reported(tmp_path):
    records = instructions(200)
    records.insert(
        3, {"instruction": "Write  item number 150. ", "input": None, "output": "another answer"}
    )
    path = write_jsonl(tmp_path / "in.jsonl", records)
    result = CliRunner().invoke(cli, [str(path), "--tag"])
    out = tagged(result)
    assert out[3]["split"] == out[151]["split"] and out[3]["split"] is not None
    assert (
        f"farm-split: {path}: record 152 repeats record 4 (same instruction and input); kept in one split"
        in result.stderr
    )


def test_seed_decides_and_repeats(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", instructions(300))
    first = CliRunner().invoke(cli, [str(path), "--tag", "--seed", "5"]).stdout
    again = CliRunner().invoke(cli, [str(path), "--tag", "--seed", "5"]).stdout
    other = CliRunner().invoke(cli, [str(path), "--tag", "--seed", "6"]).stdout
    assert first == again
    assert [r["split"] for r in map(json.loads, first.splitlines())] != [
        r["split"] for r in map(json.loads, other.splitlines())
    ]


def test_output_dir_files_are_disjoint_and_complete(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", instructions(420))
    result = run_tool("farm-split", str(path), "-o", str(tmp_path / "splits"), "--exact", "-q")
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b""
    files = {
        p.name: [json.loads(line)["instruction"] for line in p.read_text().splitlines()]
        for p in (tmp_path / "splits").iterdir()
    }
    assert {name: len(v) for name, v in files.items()} == {
        "sft.jsonl": 100,
        "pref.jsonl": 100,
        "unlabeled.jsonl": 200,
        "val.jsonl": 20,
    }
    seen = [i for v in files.values() for i in v]
    assert sorted(seen) == sorted(
        r["instruction"] for r in instructions(420)
    )  # disjoint and complete


def test_output_dir_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "in.jsonl", instructions(100))
    calls = []

    def failing_stamp(record, tool, info):
        calls.append(1)
        if len(calls) == 60:
            raise OSError("disk full")
        return record

    monkeypatch.setattr(farm_split, "stamp", failing_stamp)
    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "splits")])
    assert isinstance(result.exception, OSError)
    assert list((tmp_path / "splits").iterdir()) == []  # no split file, no temporary file left


def test_bad_input_names_file_and_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"instruction": "a"}\n\n{"input": "no instruction"}\n')
    result = run_tool("farm-split", str(path), "--tag")
    assert result.returncode == 1
    assert result.stderr.decode() == (
        f"farm-split: error: {path}:3: missing field 'instruction'; expected an instruction record with fields instruction\n"
    )
    assert result.stdout == b""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", "--sizes", "sft=10,val=0.5"], "sizes mix counts and fractions"),
        (["--tag", "--sizes", "a=0.7,b=0.6"], "fractions add up to 1.3; expected at most 1"),
        (["--tag", "--sizes", "sft"], "'sft' is not NAME=SIZE"),
        ([], "give exactly one of -o DIR"),
    ],
)
def test_usage_errors(tmp_path, args, message):
    path = write_jsonl(tmp_path / "in.jsonl", instructions(3))
    result = run_tool("farm-split", str(path), *args)
    assert result.returncode == 2
    assert message in result.stderr.decode()


def test_real_alpaca_data():
    data = shared_data("alpaca/alpaca_cleaned_first1000.json")
    result = run_tool("farm-split", str(data), "--tag")
    assert result.returncode == 0
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 1000 and all(
        r["split"] in ("sft", "pref", "unlabeled", "val") for r in records
    )
    # the one repeated instruction of this file (records 39 and 52) lands once
    assert (
        records[38]["instruction"] == records[51]["instruction"]
        and records[38]["split"] == records[51]["split"]
    )
    assert "record 52 repeats record 39" in result.stderr.decode()


def test_fractions_adding_up_to_one_leave_nothing_out(monkeypatch):
    # 0.7 + 0.2 + 0.1 is 0.9999999999999999 in floating point: a record whose hash lands above that
    # (here every record, at the largest double below 1) still belongs to the last split
    monkeypatch.setattr(split_module, "position", lambda key, seed: 1 - 2**-53)
    result = assign(instructions(5), parse_sizes("a=0.7,b=0.2,c=0.1"), seed=3)
    assert result.assignment == ["c"] * 5


@pytest.mark.parametrize("size", ["nan", "inf", "-inf", "1e999", "0", "-3", "many"])
def test_a_size_that_is_not_a_positive_finite_number_is_a_usage_error(size):
    result = CliRunner().invoke(cli, ["--sizes", f"train=0.5,val={size}"], input="")
    assert result.exit_code == 2
    assert (
        f"Invalid value for '--sizes': size of 'val' is '{size}'; expected a positive count or "
        "fraction" in result.output
    )
