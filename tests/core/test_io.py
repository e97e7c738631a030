"""farmkit.core.io and farmkit.core.validate: JSONL / JSON array / gzip reading with line numbers, chunked
reading that agrees with it, schema messages, the fast checks agreeing with the full one, and
output files that appear whole or not at all."""

from __future__ import annotations

import gzip
import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson
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


def _fifo_reader(fifo) -> subprocess.Popen:
    """A reader of a FIFO in a process of its own, so that a writer that replaces the FIFO instead of
    writing to it (which leaves the reader waiting forever) cannot hang the suite: it is killed."""
    return subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)


def _received(reader: subprocess.Popen) -> bytes:
    try:
        return reader.communicate(timeout=10)[0]
    except subprocess.TimeoutExpired:
        reader.kill()
        reader.communicate()
        return b"(the reader got nothing and was killed)"


def test_a_fifo_target_is_written_to_not_replaced(tmp_path):
    """Measured before: -o FIFO renamed a regular file over the FIFO, and its reader hung."""
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    reader = _fifo_reader(fifo)
    with RecordWriter(fifo) as writer:
        writer.write_all([{"a": 1}, {"b": 2}])
    assert _received(reader) == b'{"a":1}\n{"b":2}\n'
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(tmp_path.iterdir()) == [fifo]


def test_a_symlink_target_writes_the_file_it_names_and_stays_a_link(tmp_path):
    """Measured before: the link was replaced by a regular file and its target left untouched."""
    real = tmp_path / "data" / "board.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "board.jsonl"
    link.symlink_to(real)
    dangling = tmp_path / "new.jsonl"  # a link to a file not written yet: the file is created
    dangling.symlink_to(tmp_path / "data" / "new.jsonl")
    with atomic_path(link) as tmp:
        assert tmp.parent == real.parent  # renamed beside the real file: same file system
        tmp.write_text("new\n")
    with RecordWriter(dangling) as writer:
        writer.write({"a": 1})
    assert link.is_symlink() and real.read_text() == "new\n"
    assert dangling.is_symlink() and (tmp_path / "data" / "new.jsonl").read_text() == '{"a":1}\n'
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["board.jsonl", "new.jsonl"]


def test_a_character_device_target_stays_a_device(tmp_path):
    """-o /dev/null run as root replaced the system's device node with a regular file. Checked on a
    node of its own (the same device, made with mknod), so that a regression cannot break the
    machine's /dev/null."""
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    with RecordWriter(null) as writer:
        writer.write({"a": 1})
    with atomic_path(null, suffix=".png") as tmp:
        tmp.write_bytes(b"png")
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(tmp_path.iterdir()) == [null]


def _preferences(path: Path) -> Path:
    path.write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "instruction": f"task {i}",
                    "output_1": "a",
                    "output_2": "b",
                    "generator_1": "ref",
                    "generator_2": "model",
                    "preference": 2,
                }
            )
            + b"\n"
            for i in range(4)
        )
    )
    return path


def _farm_winrate(*args: str) -> subprocess.CompletedProcess:
    argv = [str(Path(sys.executable).parent / "farm-winrate"), "-q", *args]
    return subprocess.run(argv, capture_output=True, timeout=60)


def test_a_tool_streams_its_output_into_a_fifo(tmp_path):
    """farm-winrate -o FIFO, end to end, in a real process."""
    fifo = tmp_path / "board.fifo"
    os.mkfifo(fifo)
    prefs = _preferences(tmp_path / "prefs.jsonl")
    reader = _fifo_reader(fifo)
    done = _farm_winrate(str(prefs), "-o", str(fifo))
    received = _received(reader)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""
    (row,) = [orjson.loads(line) for line in received.splitlines()]
    assert row["generator"] == "model" and row["win_rate"] == 100.0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_tool_given_dev_stdout_writes_its_stdout(tmp_path, fmt):
    """While a tool runs, file descriptor 1 carries stderr (so that libraries cannot print into the
    records): -o /dev/stdout must still reach the tool's stdout, here a pipe."""
    done = _farm_winrate(
        str(_preferences(tmp_path / "prefs.jsonl")), "-o", "/dev/stdout", "--format", fmt
    )
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert b"model" in done.stdout and b"100.0" in done.stdout
