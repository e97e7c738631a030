"""farm-label's durable store: the journal replayed at start (a torn last line dropped), LABELS
rebuilt from it, one server per LABELS, and a restart that would change the assignment refused."""

from __future__ import annotations

import json
import os
import stat

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


def test_a_torn_last_line_was_never_acknowledged_and_is_dropped(tmp_path):
    with opened(tmp_path) as store:
        answer_some(store, "alice", 2)
        journal = store.journal_path
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"event": "answer", "annotator": "alice", "item_id": "p')
    with opened(tmp_path) as again:
        assert again.progress("alice")[0] == 2
        assert journal.read_bytes() == whole
        answer_some(again, "alice", 1)
    assert len(journal.read_bytes().splitlines()) == 3


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
