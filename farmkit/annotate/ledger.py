"""The cost ledger (farm-annotate --ledger FILE): one JSON line per run (date in UTC, pool, judges,
pairs, requests, cache hits, mode, tokens, price), and one per batch collected (`collected`: its id;
its tokens and price, booked the moment it is read, so a run that fails later loses no booking; not
counted as a run), and its totals by day and by judge
(farm-winrate --ledger FILE), rows that farm-plot curves draws against their `step` (the day's
number from the first).

A line is appended with one write(2) to a file opened with O_APPEND: the kernel moves to the end and
writes in one step, so runs that append at once (a nightly job and a manual run) never interleave
their lines, and a killed run leaves no half line.
"""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path
from typing import Any

import orjson

from farmkit.core.io import FarmError, iter_json

SUMMED = ("runs", "pairs", "requests", "cached", "prompt_tokens", "completion_tokens", "price")


def append(path: str | os.PathLike, entry: dict[str, Any]) -> None:
    """Append `entry` to the ledger at `path` as one line, in one write."""
    line = orjson.dumps(entry) + b"\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        written = os.write(descriptor, line)
    finally:
        os.close(descriptor)
    if written != len(line):  # a full disk: the line is cut, and the ledger says so at its end
        raise FarmError(f"{path}: the ledger line was cut after {written} of {len(line)} bytes")


def totals(path: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per day (UTC) of the ledger: the day's runs summed (`price`, `requests`, ...), its
    batch and direct spend apart, and each judge's spend as `price:MODEL` and `pairs:MODEL`;
    `step` numbers the days from the ledger's first (0), so farm-plot curves draws spend over time."""
    days: dict[str, dict[str, Any]] = {}
    for number, entry in iter_json(str(path)):
        if not isinstance(entry, dict) or not isinstance(entry.get("date"), str):
            raise FarmError(
                f"{path}:{number}: expected a farm-annotate --ledger line (an object with date)"
            )
        day = entry["date"][:10]
        try:
            date.fromisoformat(day)
        except ValueError:
            raise FarmError(f"{path}:{number}: date {entry['date']!r} is not an ISO date") from None
        row = days.setdefault(day, {"date": day, **dict.fromkeys(SUMMED, 0)})
        row["runs"] += "collected" not in entry  # a batch's booking, not a run of its own
        for name in SUMMED[1:]:
            row[name] += _number(entry.get(name), path, number, name)
        mode = "batch" if entry.get("mode") == "batch" else "direct"
        row[f"price_{mode}"] = row.get(f"price_{mode}", 0) + _number(
            entry.get("price"), path, number, "price"
        )
        for model, spent in (entry.get("judges") or {}).items():
            for name in ("price", "pairs"):
                row[f"{name}:{model}"] = row.get(f"{name}:{model}", 0) + _number(
                    spent.get(name), path, number, f"judges.{model}.{name}"
                )
    first = min(days, default=None)
    rows = []
    for day in sorted(days):
        row = days[day]
        row["step"] = (date.fromisoformat(day) - date.fromisoformat(first)).days
        rows.append({name: _rounded(value) for name, value in row.items()})
    return rows


def _number(value: Any, path: Any, number: int, name: str) -> float:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FarmError(f"{path}:{number}: {name} is {value!r}; expected a number")
    return value


def _rounded(value: Any) -> Any:
    return round(value, 8) if isinstance(value, float) else value
