"""The durable state of a labelling session: every answer and undo appended to a journal and fsync'd
before the page is answered, LABELS (and LABELS.checks.jsonl) rewritten whole from it, the links'
tokens kept, and one server at a time.

Why a journal: appending one line is the only write that is both cheap and made durable by one fsync,
and a crash can tear only its last line, which was never acknowledged (the reply waits for the fsync)
and is dropped, with a message, at the next start. LABELS itself cannot be appended to, since an undo
removes a record from it; it is a view of the journal, rewritten to a temporary file and renamed, so a
reader never sees half of it, and rebuilt from the journal at every start, so a crash between the two
writes loses nothing.

An answer is kept whole or not at all: a write cut short (a full disk) is continued, and one that
fails, or a LABELS that cannot be rewritten, takes the journal back to its last whole line and raises
NotSaved, which the page is told (it keeps the answer to send again).

Files beside LABELS: LABELS.journal.jsonl (the journal, locked while a server runs), LABELS.session.json
(the tokens, the port the links carried and what the assignment was made from, mode 0600) and LABELS.checks.jsonl (the answers to
--checks pairs, never mixed into LABELS).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import errno
import fcntl
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from farmkit.annotate.label.assign import (
    CHOICES,
    SKIP,
    Assignment,
    assign,
    check_id,
    pair_id,
    verdict,
)
from farmkit.core.io import FarmError, RecordError, atomic_path, display_name, dumps, read_numbered
from farmkit.core.provenance import provenance, stamp
from farmkit.core.seeds import stable_hash

log = logging.getLogger("farmkit")

TOOL = "farm-label"
KNOWN = (1, 2, 1.5)  # the answers a check may know
# what a verdict of someone else (farm-annotate's, or the known answer of a check) leaves on a pair
# that a human answer replaces
_VERDICT_FIELDS = (
    "preference",
    "preference_reason",
    "strength",
    "annotator",
    "shown",
    "seconds",
    "skipped",
    "flag",
    "comment",
)
# the reason a record without a label gives (its preference is null, as the record contract says)
_NO_LABEL = {
    SKIP: "skipped by the annotator (the pair comes back after the rest of their queue)",
    "cant_judge": "flagged by the annotator: cannot judge",
    "problem": "flagged by the annotator: a problem with the pair (see comment)",
}


def companion(output: Path, suffix: str) -> Path:
    """A file kept beside LABELS: LABELS.journal.jsonl, LABELS.session.json, LABELS.checks.jsonl."""
    return output.with_name(output.name + suffix)


class NotSaved(FarmError):
    """An answer or undo that could not be written (a full disk): nothing of it was kept."""

    def __init__(self, path: Path | str, what: str, error: OSError):
        self.reason = error.strerror or str(error)
        super().__init__(f"{path}: could not save {what}: {self.reason}; nothing of it was kept")


# the start of a journal line as dumps writes it: enough of a torn one to say whose it was
_EVENT_START = re.compile(
    rb'^\{"event":"(answer|undo)","annotator":"([^"\\]*)","item_id":"([^"\\]*)"'
)


@dataclass
class Answer:
    sequence: int  # the journal line that made it: LABELS keeps the order answers were given in
    item_id: str
    record: dict[str, Any]

    @property
    def skipped(self) -> bool:
        return self.record.get("skipped") is True


@dataclass
class Store:
    """A session's answers, per annotator a stack in the order given, each to the item that was
    current then: the queue's next one, where a skip moves its item behind the rest of the queue
    (an answer, a flag or a skip alike; undo pops the last, whatever it was)."""

    output: Path
    pairs: dict[str, dict[str, Any]]  # item id -> the pair record (checks included)
    checks: set[str]  # the item ids that are known-answer checks
    assignment: Assignment
    seed: int
    tokens: dict[str, str] = field(default_factory=dict)  # annotator -> token
    admin: str = ""
    port: int | None = None  # the port the links carried last (--port 0 takes it again)
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    min_check_score: float | None = None  # below it an annotator's labels are screened out
    _remaining: dict[str, collections.deque] = field(default_factory=dict)  # items still to answer
    _journal: int | None = None
    _sequence: int = 0
    _end: int = 0  # the journal's size up to its last whole line

    @property
    def journal_path(self) -> Path:
        return companion(self.output, ".journal.jsonl")

    @property
    def session_path(self) -> Path:
        return companion(self.output, ".session.json")

    @property
    def checks_path(self) -> Path:
        return companion(self.output, ".checks.jsonl")

    def open(self, made_from: dict[str, Any]) -> Store:
        """Take the lock, check that LABELS belongs to this session (`made_from`: what the
        assignment was drawn from), read the tokens (new ones for a new session) and replay the
        journal. Raises FarmError when another server holds LABELS or it was made otherwise."""
        self.output.parent.mkdir(parents=True, exist_ok=True)
        new = not self.journal_path.exists()
        journal = os.open(self.journal_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(journal, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(journal)
            raise FarmError(
                f"{self.output}: another farm-label server is using it (it holds the lock on "
                f"{self.journal_path}); stop that one first, or choose another -o"
            ) from None
        self._journal = journal
        try:
            self._session(made_from)
            self._replay()
            self._rewrite(checks=True)
        except BaseException:
            self.close()
            if new and not self.session_path.exists():  # refused before it began: leave no trace
                self.journal_path.unlink(missing_ok=True)
            raise
        return self

    def close(self) -> None:
        if self._journal is not None:
            os.close(self._journal)  # closing releases the lock
            self._journal = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _session(self, made_from: dict[str, Any]) -> None:
        if self.session_path.exists():
            session = orjson.loads(self.session_path.read_bytes())
            before = session["made_from"]
            changed = sorted(
                key
                for key in made_from.keys() | before.keys()
                if before.get(key) != made_from.get(key)
            )
            if changed:
                raise FarmError(
                    f"{self.output}: its labelling session was started with other "
                    f"{', '.join(changed)} (a different assignment); run the same command as before "
                    "to resume, or choose another -o for a new session"
                )
            self.tokens, self.admin = session["tokens"], session["admin"]
            self.port = session.get("port")
            return
        if self.output.exists() or self.checks_path.exists():
            raise FarmError(
                f"{self.output}: exists and is not a farm-label session (no {self.session_path.name} "
                "beside it); choose another -o"
            )
        self.tokens = {name: secrets.token_urlsafe(24) for name in self.assignment.queues}
        self.admin = secrets.token_urlsafe(24)
        self._write_session(made_from)

    def _write_session(self, made_from: dict[str, Any]) -> None:
        session = {"made_from": made_from, "tokens": self.tokens, "admin": self.admin}
        if self.port is not None:
            session["port"] = self.port
        _write_durably(self.session_path, orjson.dumps(session, option=orjson.OPT_INDENT_2), 0o600)

    def remember_port(self, port: int) -> None:
        """Keep the port the links carry beside the tokens, so that the next start with --port 0
        listens on it again and prints the same links."""
        if port == self.port:
            return
        self.port = port
        self._write_session(orjson.loads(self.session_path.read_bytes())["made_from"])

    def _replay(self) -> None:
        self.answers = {name: [] for name in self.assignment.queues}
        for name in self.assignment.queues:
            self._recount(name)
        data = self.journal_path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) < len(data):
            # a line cut short by a crash or a full disk: never acknowledged (the reply waits for
            # the whole line and its fsync)
            torn = data[len(complete) :]
            start = _EVENT_START.match(torn)
            what = (
                f"the start of {start[2].decode()}'s {start[1].decode()} "
                f"{'to' if start[1] == b'answer' else 'of'} {start[3].decode()}"
                if start
                else "not an event"
            )
            os.truncate(self.journal_path, len(complete))
            log.warning(
                "farm-label: %s:%d: dropped a torn last line (%d bytes, %s), written when the server "
                "stopped or the disk was full and never acknowledged: the page did not move on from "
                "that pair",
                self.journal_path,
                complete.count(b"\n") + 1,
                len(torn),
                what,
            )
        for number, line in enumerate(complete.splitlines(), 1):
            try:
                event = orjson.loads(line)
                self._apply(event, number)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise RecordError(
                    str(self.journal_path),
                    number,
                    f"not an event of this session ({exc}); expected the answers and undos "
                    "farm-label wrote",
                ) from None
        self._sequence = complete.count(b"\n")
        self._end = len(complete)

    def _apply(self, event: dict[str, Any], sequence: int) -> None:
        annotator, item_id = event["annotator"], event["item_id"]
        stack = self.answers[annotator]
        if event["event"] == "answer":
            if self.current(annotator) != item_id:
                raise ValueError(f"{annotator} answered {item_id} out of turn")
            answer = Answer(sequence, item_id, event["record"])
            stack.append(answer)
            remaining = self._remaining[annotator]
            remaining.popleft()
            if answer.skipped:
                remaining.append(item_id)
        elif event["event"] == "undo":
            if not stack or stack[-1].item_id != item_id:
                raise ValueError(f"{annotator} undid {item_id}, not their last answer")
            stack.pop()
            self._recount(annotator)
        else:
            raise ValueError(f"unknown event {event['event']!r}")

    def _recount(self, annotator: str) -> None:
        """The items this annotator has still to answer, in the order they come, from their answers."""
        remaining = collections.deque(self.assignment.queues[annotator])
        for answer in self.answers[annotator]:
            remaining.popleft()
            if answer.skipped:
                remaining.append(answer.item_id)
        self._remaining[annotator] = remaining

    def current(self, annotator: str) -> str | None:
        """The item this annotator is shown now (None: all answered)."""
        remaining = self._remaining[annotator]
        return remaining[0] if remaining else None

    def skipped_before(self, annotator: str, item_id: str) -> bool:
        """Whether this annotator skipped the item earlier (it is back after the rest)."""
        return any(
            answer.skipped and answer.item_id == item_id for answer in self.answers[annotator]
        )

    def item(self, annotator: str, item_id: str) -> dict[str, Any]:
        """The item as this annotator sees it: the two outputs in the order drawn for them."""
        pair = self.pairs[item_id]
        swapped = self.assignment.swapped(annotator, item_id)
        left, right = ("output_2", "output_1") if swapped else ("output_1", "output_2")
        return {
            "item_id": item_id,
            "instruction": pair["instruction"],
            "input": pair.get("input") or None,
            "left": pair[left],
            "right": pair[right],
        }

    def answer(
        self, annotator: str, item_id: str, choice: str, seconds: float, comment: str | None = None
    ) -> None:
        """Record an answer to the annotator's current item (a label, a skip or a flag: one of
        ACTIONS, with their comment), durably, then rewrite LABELS."""
        if self.current(annotator) != item_id:
            raise ValueError(f"{item_id} is not {annotator}'s current item")
        record = self._record(annotator, item_id, choice, seconds, comment)
        self._append(
            {"event": "answer", "annotator": annotator, "item_id": item_id, "record": record}
        )

    def undo(self, annotator: str) -> None:
        """Remove the annotator's last answer (ValueError when there is none)."""
        stack = self.answers[annotator]
        if not stack:
            raise ValueError(f"{annotator} has nothing to undo")
        self._append({"event": "undo", "annotator": annotator, "item_id": stack[-1].item_id})

    def _record(
        self, annotator: str, item_id: str, choice: str, seconds: float, comment: str | None
    ) -> dict[str, Any]:
        pair = self.pairs[item_id]
        swapped = self.assignment.swapped(annotator, item_id)
        record = {key: value for key, value in pair.items() if key not in _VERDICT_FIELDS}
        if item_id in self.checks:
            record["known_preference"] = pair["preference"]
        if choice in CHOICES:
            preference, strength = verdict(choice, swapped)
            record.update(preference=preference, strength=strength)
        else:  # no label: every estimate leaves a null preference out
            record.update(preference=None, preference_reason=_NO_LABEL[choice])
            record.update({"skipped": True} if choice == SKIP else {"flag": choice})
        if comment:
            record["comment"] = comment
        record.update(
            annotator=annotator,
            shown=["output_2", "output_1"] if swapped else ["output_1", "output_2"],
            seconds=float(seconds),
            time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )
        return stamp(record, TOOL, provenance(TOOL, self.seed, item_id=item_id))

    def _append(self, event: dict[str, Any]) -> None:
        """Write the event's line whole and fsync it, then rewrite LABELS; when either fails, take
        the journal back to its last whole line and raise NotSaved (the page may send it again)."""
        assert self._journal is not None, "the store is not open"
        annotator, item_id = event["annotator"], event["item_id"]
        what = (
            f"{annotator}'s answer to {item_id}"
            if event["event"] == "answer"
            else f"{annotator}'s undo of {item_id}"
        )
        stack, end = list(self.answers[annotator]), self._end
        try:
            self._write_line(dumps(event))
        except OSError as exc:
            self._take_back()
            raise NotSaved(self.journal_path, what, exc) from None
        self._sequence += 1
        self._apply(event, self._sequence)
        try:
            self._rewrite(checks=item_id in self.checks)
        except OSError as exc:  # LABELS stays as it was: so must the journal and the answers
            self.answers[annotator], self._end = stack, end
            self._recount(annotator)
            self._sequence -= 1
            self._take_back()
            raise NotSaved(exc.filename or self.output, what, exc) from None

    def _write_line(self, line: bytes) -> None:
        assert self._journal is not None
        if os.fstat(self._journal).st_size != self._end:  # a take-back that failed earlier
            os.ftruncate(self._journal, self._end)
        rest = memoryview(line)
        while rest:  # O_APPEND: at the end; a write cut short (a disk filling up) goes on
            written = os.write(self._journal, rest)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            rest = rest[written:]
        os.fsync(self._journal)
        self._end += len(line)

    def _take_back(self) -> None:
        """Cut the journal back to its last whole line (the next write checks it was)."""
        assert self._journal is not None
        with contextlib.suppress(OSError):
            os.ftruncate(self._journal, self._end)
            os.fsync(self._journal)

    def _rewrite(self, checks: bool) -> None:
        answers = sorted(
            (answer for stack in self.answers.values() for answer in stack),
            key=lambda answer: answer.sequence,
        )
        targets = [(self.output, False)] + (
            [(self.checks_path, True)] if checks and self.checks else []
        )
        screened = {name for name in self.answers if self.screened(name)}
        for path, of_checks in targets:
            data = b"".join(
                dumps(
                    {**answer.record, "screened_out": True}
                    if not of_checks and answer.record["annotator"] in screened
                    else answer.record
                )
                for answer in answers
                if (answer.item_id in self.checks) == of_checks
            )
            try:
                _write_durably(path, data)
            except OSError as exc:  # whole or not at all: the old file is left as it was
                raise OSError(exc.errno, exc.strerror, str(path)) from exc

    def progress(self, annotator: str) -> tuple[int, int]:
        """(items answered, labelled or flagged; items in the queue)."""
        stack = self.answers[annotator]
        return sum(not answer.skipped for answer in stack), len(self.assignment.queues[annotator])

    def counts(self, annotator: str) -> dict[str, int]:
        """This annotator's labels, flags, skipped items still to come back, and comments."""
        stack = self.answers[annotator]
        remaining = set(self._remaining[annotator])
        return {
            "labelled": sum(answer.record.get("preference") is not None for answer in stack),
            "flagged": sum("flag" in answer.record for answer in stack),
            "skipped": len({a.item_id for a in stack if a.skipped} & remaining),
            "comments": sum(bool(answer.record.get("comment")) for answer in stack),
        }

    def check_score(self, annotator: str) -> tuple[int, int]:
        """(answers that match the known answer, check answers) of this annotator (a flag or a
        skip is no answer)."""
        answered = [
            answer.record
            for answer in self.answers[annotator]
            if answer.item_id in self.checks and answer.record.get("preference") is not None
        ]
        return sum(record["preference"] == record["known_preference"] for record in answered), len(
            answered
        )

    def screened(self, annotator: str) -> bool:
        """Whether the annotator's labels are screened out: their share of checks answered right is
        below min_check_score (an annotator who has answered no check yet is not)."""
        right, answered = self.check_score(annotator)
        return (
            self.min_check_score is not None
            and answered > 0
            and (right / answered < self.min_check_score)
        )

    def complete(self) -> bool:
        """Whether every annotator has answered every item of their queue (LABELS is then whole)."""
        return all(done == total for done, total in map(self.progress, self.assignment.queues))


def _write_durably(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write a whole file through a temporary one, fsync'd before the rename and the folder after it."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
            os.fsync(folder)
    finally:
        os.close(folder)


def remembered_port(output: str) -> int | None:
    """The port LABELS' last server listened on (from LABELS.session.json, read without its lock),
    or None: a new session, or one from before ports were kept."""
    try:
        port = orjson.loads(companion(Path(output), ".session.json").read_bytes()).get("port")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return (
        port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None
    )


def read_checks(path: str) -> list[dict[str, Any]]:
    """The known-answer pairs of --checks: preference records whose preference is 1, 2 or 1.5."""
    checks = []
    for where, record in read_numbered(path, "pair"):
        if record.get("preference") not in KNOWN:
            raise FarmError(
                f"{where}: preference is {record.get('preference')!r}; expected a check's known "
                "answer, 1 (output_1 better), 2 (output_2 better) or 1.5 (a tie)"
            )
        checks.append(record)
    if not checks:
        raise FarmError(
            f"{display_name(path)}: no checks; expected preference records with a known answer"
        )
    return checks


def open_store(
    output: str,
    pairs: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    annotators: tuple[str, ...],
    overlap: float,
    seed: int,
    ordered: bool = False,
    min_check_score: float | None = None,
) -> Store:
    """The store of the session that labels `pairs` (with `checks` mixed in), opened: locked, its
    tokens read or made, its journal replayed (see Store.open)."""
    items = {pair_id(index): pair for index, pair in enumerate(pairs)}
    items.update({check_id(index): check for index, check in enumerate(checks)})
    made_from = {
        "pairs": stable_hash(pairs),
        "checks": stable_hash(checks) if checks else None,
        "annotators": list(annotators),
        "overlap": overlap,
        "seed": seed,
    }
    if ordered:  # farm-label --judge (left out otherwise: sessions before it resume as they were)
        made_from["ordered"] = True
    store = Store(
        Path(output),
        items,
        {check_id(index) for index in range(len(checks))},
        assign(len(pairs), len(checks), annotators, overlap, seed, ordered),
        seed,
        min_check_score=min_check_score,
    )
    return store.open(made_from)
