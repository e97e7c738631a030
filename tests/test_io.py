"""farmkit.core.io and farmkit.core.validate: JSONL / JSON array / gzip reading with line numbers, chunked
reading that agrees with it, schema messages, the fast checks agreeing with the full one, and
output files that appear whole or not at all."""

from __future__ import annotations

import gzip
import os

import pytest

from farmkit.core.io import (
    FarmError,
    RecordError,
    RecordWriter,
    atomic_path,
    iter_json,
    iter_json_chunks,
    read_records,
)
from farmkit.core.validate import first_invalid, problems

LINES = b'\n{"a": 1}\n\n  \n{"a": 2}\n{"a": 3}\n'  # blank lines are skipped but counted


@pytest.mark.parametrize("compress", [False, True])
def test_jsonl_line_numbers_count_blank_lines(tmp_path, compress):
    path = tmp_path / "x.jsonl"
    path.write_bytes(gzip.compress(LINES) if compress else LINES)
    assert list(iter_json(path)) == [(2, {"a": 1}), (5, {"a": 2}), (6, {"a": 3})]
    for size in (1, 2, 100):
        chunks = list(iter_json_chunks(path, size))
        assert [n for numbers, _ in chunks for n in numbers] == [2, 5, 6]
        assert [v for _, values in chunks for v in values] == [{"a": 1}, {"a": 2}, {"a": 3}]
        assert all(len(values) <= size for _, values in chunks)


def test_json_array_items_are_numbered_from_one(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'\n\n  [{"a": 1},\n {"a": 2}, {"a": 3}]')
    assert list(iter_json(path)) == [(1, {"a": 1}), (2, {"a": 2}), (3, {"a": 3})]
    assert list(iter_json_chunks(path, 2)) == [([1, 2], [{"a": 1}, {"a": 2}]), ([3], [{"a": 3}])]


@pytest.mark.parametrize(
    "reader", [lambda p: list(iter_json(p)), lambda p: list(iter_json_chunks(p, 2))]
)
def test_bad_json_names_the_line(tmp_path, reader):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": \n')
    with pytest.raises(RecordError) as error:
        reader(path)
    assert (
        str(error.value)
        == f"""{path}:4: not valid JSON ('{{"a":'); expected one JSON object per line"""
    )


def test_broken_array_and_missing_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'[{"a": 1},')
    with pytest.raises(
        RecordError, match=r"x.json: invalid JSON array .*; expected a JSON array or JSON Lines"
    ):
        list(iter_json(path))
    with pytest.raises(FarmError, match="nope.jsonl: cannot open"):
        list(iter_json(tmp_path / "nope.jsonl"))


def test_read_records_checks_the_schema(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"instruction": "a", "output": "b", "generator": "g"}\n[1, 2]\n')
    records = read_records(path, "output")
    assert next(records) == {"instruction": "a", "output": "b", "generator": "g"}
    with pytest.raises(RecordError) as error:
        next(records)
    assert (
        str(error.value)
        == f"{path}:2: a list is not a record; expected a JSON object (output record)"
    )


CASES = [
    ({"instruction": "a", "output": "b", "generator": "g"}, "output", None),
    (
        {"instruction": "a", "output": "b"},
        "output",
        "missing field 'generator'; expected an output record with fields instruction, output, generator",
    ),
    (
        {"instruction": "a", "output": "b", "generator": "g", "sample_index": -1},
        "output",
        "field 'sample_index' is -1; expected an integer >= 0",
    ),
    (
        {"instruction": "a", "output": "b", "generator": "g", "sample_index": True},
        "output",
        "field 'sample_index' is true; expected an integer >= 0",
    ),
    (
        {"instruction": "a", "output": "b", "generator": "g", "sample_index": 1.0},
        "output",
        "field 'sample_index' is 1.0; expected an integer >= 0",
    ),
    (
        {"preference": 2.5},
        "preference",
        "field 'preference' is 2.5; expected a number or null >= 0 and <= 2",
    ),
    ({"preference": None, "input": None, "output_1": None}, "preference", None),
    (
        {"preference": 1, "generator_2": 7},
        "preference",
        "field 'generator_2' is 7; expected a string",
    ),
    ({"preference": 1, "unknown": [1, {"x": 2}]}, "preference", None),
    (
        {"instruction": "a", "id": 3.5},
        "instruction",
        "field 'id' is 3.5; expected a string or an integer",
    ),
]


@pytest.mark.parametrize(("record", "kind", "message"), CASES)
def test_problems_and_the_fast_list_check_agree(record, kind, message):
    assert problems(record, kind) == message
    valid = {
        "preference": {"preference": 1},
        "output": CASES[0][0],
        "instruction": {"instruction": "x"},
    }[kind]
    assert first_invalid([valid, valid, record, valid], kind) == (None if message is None else 2)


def test_record_writer_is_atomic(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), RecordWriter(target) as writer:
        writer.write({"a": 1})
        raise RuntimeError("killed half-way")
    assert list(tmp_path.iterdir()) == []
    with RecordWriter(tmp_path / "out.jsonl.gz") as writer:
        writer.write_all([{"a": 1}, {"b": "é"}])
    assert (
        gzip.decompress((tmp_path / "out.jsonl.gz").read_bytes()) == b'{"a":1}\n{"b":"\xc3\xa9"}\n'
    )


def test_atomic_path_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "model"
    target.write_text("old")
    with pytest.raises(ValueError), atomic_path(target) as tmp:
        tmp.write_text("new, half written")
        raise ValueError
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"


def test_a_killed_writers_temporary_files_are_swept_and_a_live_writers_are_kept(tmp_path):
    import subprocess
    import sys

    from farmkit.core import io as farm_io

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "out.jsonl"
    owner = farm_io._OWNER
    stale_file = tmp_path / f".out.jsonl.{owner}-{dead.pid}.abc123.tmp"
    stale_folder = tmp_path / f".out.jsonl.{owner}-{dead.pid}.def456.tmp"
    live = tmp_path / f".out.jsonl.{owner}-{os.getppid()}.ghi789.tmp"  # a writer still running
    other_host = (
        tmp_path / f".out.jsonl.elsewhere-{dead.pid}.jkl012.tmp"
    )  # another machine's, on a shared disk
    other_file = tmp_path / f".other.jsonl.{owner}-{dead.pid}.mno345.tmp"
    stale_file.write_bytes(b"")
    stale_folder.mkdir()
    (stale_folder / "weights").write_bytes(b"x")
    for path in (live, other_host, other_file):
        path.write_bytes(b"")
    with atomic_path(target) as tmp:
        tmp.write_text("done\n")
    assert target.read_text() == "done\n"
    assert not stale_file.exists() and not stale_folder.exists()
    assert live.exists() and other_host.exists() and other_file.exists()


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_written_files_and_folders_get_the_permissions_of_the_umask(tmp_path, mask):
    """Measured on main: outputs written with -o were 0600 whatever the umask."""
    previous = os.umask(mask)
    try:
        for name in ("out.jsonl", "out.jsonl.gz"):
            with RecordWriter(tmp_path / name) as writer:
                writer.write({"a": 1})
        with atomic_path(tmp_path / "plot.png", suffix=".png") as tmp:
            tmp.write_bytes(b"png")
        with atomic_path(tmp_path / "model") as tmp:  # how a model folder is written
            tmp.unlink()
            tmp.mkdir()
            (tmp / "meta.json").write_text("{}")
    finally:
        os.umask(previous)
    for name in ("out.jsonl", "out.jsonl.gz", "plot.png", "model/meta.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
    assert (tmp_path / "model").stat().st_mode & 0o777 == 0o777 & ~mask


@pytest.mark.parametrize(
    "reader",
    [
        lambda p: list(iter_json(p)),
        lambda p: list(iter_json_chunks(p, 2)),
        lambda p: list(read_records(p)),
    ],
)
@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_a_broken_gzip_file_is_named(tmp_path, reader, damage):
    """Measured on main: a corrupt .gz printed `Error -3 while decompressing data`, no file name."""
    path = tmp_path / "x.jsonl.gz"
    data = gzip.compress(b"".join(b'{"a": %d}\n' % i for i in range(2000)), mtime=0)
    if damage == "corrupt":
        data = data[:40] + bytes(b ^ 0xFF for b in data[40:80]) + data[80:]
    else:
        data = data[: len(data) // 2]
    path.write_bytes(data)
    with pytest.raises(FarmError) as error:
        reader(path)
    assert str(error.value).startswith(f"{path}:")
    assert "gzip" in str(error.value)
