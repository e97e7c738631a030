"""A win-rate history: the rows of every scheduled evaluation appended to one JSONL file, each stamped
with when it ran and what it read, so that a model's win rate can be followed over time."""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError, RecordError, atomic_path, display_name, dumps, iter_json
from farmkit.lm.models import file_sha256


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on `path`'s lock file (`.NAME.lock` beside it) for the block: the
    history is rewritten whole, so two runs appending at once would otherwise lose one's rows."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stamped(
    rows: Sequence[dict[str, Any]], inputs: Sequence[str], when: datetime | None = None
) -> list[dict[str, Any]]:
    """The rows as history entries: the run's time (UTC, ISO 8601), an id shared by the run's rows, and
    each input file with its SHA-256 (stdin cannot be hashed: `stdin`)."""
    moment = (when or datetime.now(UTC)).isoformat(timespec="seconds").replace("+00:00", "Z")
    run = {
        "evaluated_at": moment,
        "run_id": uuid.uuid4().hex[:12],
        "inputs": [{"path": str(path), "sha256": file_sha256(path)} for path in inputs],
    }
    return [{**run, **row} for row in rows]


def append(path: str | os.PathLike, entries: Sequence[dict[str, Any]]) -> int:
    """Add entries to the history file under its lock; the file is rewritten atomically (whole or
    not at all, never a half-written line). Returns the number of entries it then holds."""
    target = Path(path)
    with locked(target):
        previous = target.read_bytes() if target.exists() else b""
        if previous and not previous.endswith(b"\n"):
            raise FarmError(
                f"{target}: the last line is incomplete; expected a history written by farm-winrate --history"
            )
        with atomic_path(target) as tmp:
            tmp.write_bytes(previous + b"".join(dumps(entry) for entry in entries))
        return previous.count(b"\n") + len(entries)


def read(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every entry of a history file, checked: each needs evaluated_at, generator and win_rate."""
    entries = []
    for number, entry in list(
        iter_json(path)
    ):  # the whole file parsed first: a broken line is named before a wrong one
        missing = [
            name
            for name in ("evaluated_at", "generator", "win_rate")
            if not isinstance(entry, dict) or name not in entry
        ]
        if missing:
            raise RecordError(
                display_name(path),
                number,
                f"no {', '.join(missing)}; expected a row written by farm-winrate --history",
            )
        problem = _entry_problem(entry)
        if problem:
            raise RecordError(
                display_name(path),
                number,
                f"{problem}, as farm-winrate --history writes it",
            )
        entries.append(entry)
    return entries


def _entry_problem(entry: dict[str, Any]) -> str | None:
    """What is wrong with the types of a history entry's fields, or None."""
    if not isinstance(entry["generator"], str):
        return f"generator is {entry['generator']!r}; expected the model's name (a string)"
    for name in ("win_rate", "length_controlled_win_rate"):
        value = entry.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{name} is {value!r}; expected a number or null"
    when = entry["evaluated_at"]
    try:
        datetime.fromisoformat(when.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return f"evaluated_at is {when!r}; expected an ISO 8601 time (2026-01-31T09:00:00Z)"
    return None
