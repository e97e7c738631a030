"""farm-label's durable store: the journal replayed at start (a torn last line dropped, with a
message), LABELS rebuilt from it, an answer written whole or not at all on a full disk, one server per
LABELS, and a restart that would change the assignment refused."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys

import pytest

from farmkit.annotate.label.store import open_store, read_checks
from farmkit.core.io import FarmError

PAIRS = [
    {"instruction": f"task {index}", "input": "", "output_1": f"a{index}", "output_2": f"b{index}"}
    for index in range(8)
]
NAMES = ("alice", "bob")


def opened(tmp_path, pairs=PAIRS, names=NAMES, overlap=0.0, seed=0, checks=()):
    return open_store(
        str(tmp_path / "labels.jsonl"), list(pairs), list(checks), names, overlap, seed
    )


def answer_some(store, name: str, count: int) -> None:
    for _ in range(count):
        store.answer(name, store.current(name), "A_much", 1.0)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_restart_replays_the_journal_resumes_each_annotator_and_keeps_the_tokens(tmp_path):
    with opened(tmp_path) as store:
        answer_some(store, "alice", 3)
        answer_some(store, "bob", 2)
        store.undo("alice")
        before = lines(store.output)
        tokens, admin = dict(store.tokens), store.admin
        places = {name: store.current(name) for name in NAMES}
    assert len(before) == 4
    with opened(tmp_path) as again:
        assert (again.tokens, again.admin) == (tokens, admin)
        assert {name: again.current(name) for name in NAMES} == places
        assert again.progress("alice") == (2, 4)
        assert lines(again.output) == before
    mode = stat.S_IMODE(os.stat(tmp_path / "labels.jsonl.session.json").st_mode)
    assert mode == 0o600  # the tokens are the organiser's alone


def test_labels_is_rebuilt_from_the_journal_when_a_crash_came_between_the_two_writes(tmp_path):
    with opened(tmp_path) as store:
        answer_some(store, "alice", 2)
        expected = lines(store.output)
    (tmp_path / "labels.jsonl").write_text("")  # the rewrite of LABELS never happened
    with opened(tmp_path) as again:
        assert lines(again.output) == expected


def test_a_torn_last_line_was_never_acknowledged_and_is_dropped_with_a_message(tmp_path, caplog):
    with opened(tmp_path) as store:
        answer_some(store, "alice", 2)
        journal = store.journal_path
    whole = journal.read_bytes()
    torn = b'{"event":"answer","annotator":"alice","item_id":"p5","record":{"instr'
    journal.write_bytes(whole + torn)
    with caplog.at_level("WARNING", logger="farmkit"):
        again = opened(tmp_path)
    with again:
        assert again.progress("alice")[0] == 2
        assert journal.read_bytes() == whole
        answer_some(again, "alice", 1)
    assert len(journal.read_bytes().splitlines()) == 3
    assert (
        f"farm-label: {journal}:3: dropped a torn last line ({len(torn)} bytes, the start of "
        "alice's answer to p5), written when the server stopped or the disk was full and never "
        "acknowledged: the page did not move on from that pair"
    ) in caplog.text


# The store in a process of its own whose files may not grow past a size (RLIMIT_FSIZE, as a full
# disk: a write is cut short at the limit, the next fails with EFBIG), then may again.
FULL_DISK = r"""
import json, os, resource, signal, sys
from farmkit.annotate.label.store import open_store

output, pairs = sys.argv[1], json.loads(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
said = []
with open_store(output, pairs, [], ("alice", "bob"), 0.0, 0) as store:
    for _ in range(2):
        store.answer("alice", store.current("alice"), "A_much", 1.0)
    failing = store.current("alice")
    room = os.path.getsize(store.journal_path) + 40  # the next line is cut after 40 bytes
    resource.setrlimit(resource.RLIMIT_FSIZE, (room, hard))
    for attempt in range(2):
        try:
            store.answer("alice", failing, "B_much", 1.0)
            said.append("saved")
        except Exception as exc:
            said.append(f"{type(exc).__name__}: {exc}")
    said.append(store.current("alice") == failing)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space comes back
    store.answer("alice", failing, "B_slightly", 1.0)
    store.answer("bob", store.current("bob"), "tie", 1.0)
print(json.dumps({"said": said, "failing": failing}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as a full disk is Linux's")
def test_a_full_disk_fails_the_answer_whole_and_the_retry_is_a_whole_line(tmp_path):
    labels = tmp_path / "labels.jsonl"
    child = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(labels), json.dumps(PAIRS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout)
    journal = tmp_path / "labels.jsonl.journal.jsonl"
    refused = f"{journal}: could not save alice's answer to {report['failing']}: File too large"
    assert all(refused in said for said in report["said"][:2]), report
    assert report["said"][2] is True  # still the current pair: the page keeps it
    events = lines(journal)  # every line whole
    assert [(event["annotator"], event["record"]["strength"]) for event in events] == [
        ("alice", "much"),
        ("alice", "much"),
        ("alice", "slightly"),
        ("bob", None),
    ]
    assert events[2]["item_id"] == report["failing"]
    with opened(tmp_path) as again:  # a restart accepts the journal
        assert again.progress("alice")[0] == 3 and again.progress("bob")[0] == 1
        assert lines(again.output) == [event["record"] for event in events]


class _FullDiskFile:
    """A file whose writes stop after `room` bytes with ENOSPC, as on a full disk."""

    def __init__(self, stream, room: int):
        self.stream, self.room = stream, room

    def write(self, data: bytes) -> int:
        self.stream.write(data[: self.room])
        if len(data) > self.room:
            self.stream.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.close()


def fill_the_disk(monkeypatch, room: int = 100) -> None:
    """From now on each file the store writes whole (LABELS, through a temporary file) stops after
    `room` bytes with ENOSPC: a disk whose last free bytes took the journal's line, while a new file
    needs blocks of its own. monkeypatch.undo() frees space."""
    import builtins

    from farmkit.annotate.label import store

    def full_disk_open(path, mode="r", *args, **kwargs):
        stream = builtins.open(path, mode, *args, **kwargs)
        return _FullDiskFile(stream, room) if "w" in mode else stream

    monkeypatch.setattr(store, "open", full_disk_open, raising=False)


def test_labels_is_never_left_partial_and_an_answer_it_could_not_take_is_undone(
    tmp_path, monkeypatch
):
    """The journal line fits where LABELS' rewrite does not: the answer is taken back, LABELS stays
    as it was, and the same answer later is saved."""
    with opened(tmp_path) as store:
        answer_some(store, "alice", 2)
        labels, journal = store.output.read_bytes(), store.journal_path.read_bytes()
        item = store.current("alice")
        fill_the_disk(monkeypatch)
        with pytest.raises(FarmError, match=rf"{store.output}: could not save alice's answer to "):
            store.answer("alice", item, "B_much", 1.0)
        assert store.output.read_bytes() == labels  # the old LABELS, whole
        assert store.journal_path.read_bytes() == journal  # the answer taken back
        assert store.current("alice") == item and store.progress("alice")[0] == 2
        assert sorted(path.name for path in tmp_path.iterdir()) == [
            "labels.jsonl",
            "labels.jsonl.journal.jsonl",
            "labels.jsonl.session.json",
        ]
        monkeypatch.undo()  # space comes back
        store.answer("alice", item, "B_much", 1.0)
    with opened(tmp_path) as again:
        assert again.progress("alice")[0] == 3
        assert [record["preference"] for record in lines(again.output)][2] in (1, 2)
        assert len(lines(again.journal_path)) == 3


def test_a_damaged_journal_line_before_the_end_is_an_error_naming_it(tmp_path):
    with opened(tmp_path) as store:
        answer_some(store, "alice", 2)
        journal = store.journal_path
    first, second = journal.read_bytes().splitlines()
    journal.write_bytes(b"{oops\n" + second + b"\n")
    with pytest.raises(FarmError, match=rf"{journal}:1: not an event of this session"):
        opened(tmp_path)


def test_a_second_server_on_the_same_labels_is_refused(tmp_path):
    with opened(tmp_path):
        with pytest.raises(FarmError, match="another farm-label server is using it"):
            opened(tmp_path)
    opened(tmp_path).close()  # the lock goes with the first


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"pairs": PAIRS[:7]}, "pairs"),
        ({"names": ("alice", "carol")}, "annotators"),
        ({"overlap": 0.5}, "overlap"),
        ({"seed": 1}, "seed"),
        ({"checks": [{**PAIRS[0], "preference": 2}]}, "checks"),
    ],
)
def test_a_restart_with_another_assignment_is_refused(tmp_path, change, named):
    opened(tmp_path).close()
    with pytest.raises(FarmError, match=rf"started with other {named} \(a different assignment\)"):
        opened(tmp_path, **change)


def test_an_existing_file_that_is_not_a_session_is_left_alone(tmp_path):
    (tmp_path / "labels.jsonl").write_text('{"precious": true}\n')
    with pytest.raises(FarmError, match="exists and is not a farm-label session"):
        opened(tmp_path)
    assert (tmp_path / "labels.jsonl").read_text() == '{"precious": true}\n'
    assert sorted(path.name for path in tmp_path.iterdir()) == ["labels.jsonl"]


def test_checks_must_be_pairs_with_a_known_preference(tmp_path):
    good = {"instruction": "2+2?", "output_1": "4", "output_2": "5", "preference": 1}
    path = tmp_path / "checks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "preference": 1.25}) + "\n")
    with pytest.raises(FarmError, match=rf"{path}:2: preference is 1.25; expected a check's known"):
        read_checks(str(path))
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({"instruction": "x", "preference": 2}) + "\n"
    )
    with pytest.raises(FarmError, match=rf"{path}:2: missing field 'output_1'; expected"):
        read_checks(str(path))
    path.write_text("")
    with pytest.raises(FarmError, match=rf"{path}: no checks"):
        read_checks(str(path))
