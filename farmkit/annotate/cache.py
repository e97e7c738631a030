"""The persistent verdict cache: SQLite in WAL mode, one row per (judge configuration, pair as shown,
seed), written as soon as a request's verdicts are in, so a killed run loses nothing it paid for and
concurrent runs can share the file. Only verdicts are stored: failures are never cached.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from farmkit.io import FarmError

SCHEMA_VERSION = 1


def cache_key(parts: dict[str, Any]) -> str:
    """A stable hash of everything that can change a verdict."""
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


class VerdictCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we commit explicitly, one short transaction per request
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=60000")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, value BLOB NOT NULL, created REAL NOT NULL)"
            )
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as exc:
            raise FarmError(f"{self.path}: cannot open the annotation cache ({exc}); pass --cache PATH or --no-cache") from None

    def get_many(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(keys), 900):  # SQLite's bound-parameter limit
            chunk = keys[start : start + 900]
            marks = ",".join("?" * len(chunk))
            for key, value in self._db.execute(f"SELECT key, value FROM verdicts WHERE key IN ({marks})", chunk):
                found[key] = orjson.loads(value)
        return found

    def put_many(self, entries: dict[str, dict[str, Any]]) -> None:
        if not entries:
            return
        now = time.time()
        rows = [(key, orjson.dumps(value), now) for key, value in entries.items()]
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", rows)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
