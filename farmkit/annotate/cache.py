"""The persistent verdict cache: SQLite in WAL mode, one row per (judge configuration, pair as shown,
seed), written as soon as a request's verdicts are in, so a killed run loses nothing it paid for and
concurrent runs can share the file. A row is a verdict, or a reply that arrived and could not be read (its
text, redacted, and the version of the parser that failed on it: see `usable`), so that it is re-read
rather than paid for again; requests that failed (timeouts, errors) are never cached. Rows are checked
as they are read: one that is not a well-formed verdict (a file edited by hand, another program's
writes) is taken as missing and counted in `unreadable`.

Concurrent runs share work through claims: before asking, a run claims the keys it is about to ask for
(a row in `claims` naming its host and process, with a lease); another run that needs a claimed key waits
for the verdict instead of paying for it again. A claim ends when its verdict is written, when its run
releases it (a failure, the end of the run), when its process is gone (same host: exited, killed
and not yet reaped, or its pid since reused) or when its lease ends (a live run renews its claims'
leases as it goes, so only a run that died on another host is waited for that long).

Questions sent through a Batch API (farmkit.annotate.batch) are pending for hours: the batches a run
means to create or has created (`batches`, one row per intent, written before anything is uploaded),
the lines of each (`batch_lines`: a custom_id, the keys it asks and how to read its reply) and the key
-> line index (`batch_keys`) live here too, so that a later run collects them and no run asks a
pending question again (a line's spec may list keys another run `joined` to it: the same request
asked under another host name). Schema 2 added these tables; a schema 1 file gains them when opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import socket
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from farmkit.core.io import FarmError, process_umask

SCHEMA_VERSION = 2
VERDICTS = "key TEXT PRIMARY KEY, value BLOB NOT NULL, created REAL NOT NULL"
CLAIMS = "key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, expires REAL NOT NULL"
# schema 2: pending batches. batch_id and file_id stay NULL until the endpoint gave them; `worst` is
# the most the batch can be billed (USD), `endpoint` where it was sent
BATCHES = (
    "intent TEXT PRIMARY KEY, endpoint TEXT NOT NULL, batch_id TEXT, file_id TEXT, "
    "owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, created REAL NOT NULL, worst REAL NOT NULL"
)
BATCH_LINES = (
    "custom_id TEXT PRIMARY KEY, intent TEXT NOT NULL, keys BLOB NOT NULL, spec BLOB NOT NULL"
)
BATCH_KEYS = "key TEXT PRIMARY KEY, custom_id TEXT NOT NULL"


def _create(path: Path) -> None:
    """Make a new cache file complete (schema, WAL mode) under a temporary name, then link it into place:
    processes that start together on a new path all open the same finished file, and none of them has to
    change the journal mode of a file others hold open (that needs an exclusive lock and fails at once)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
    os.close(fd)
    # mkstemp's 0600 would survive the link: a cron job's cache gets the umask's permissions, like every
    # output (SQLite gives the -wal and -shm files the database file's permissions)
    os.chmod(temporary, 0o666 & ~process_umask())
    try:
        db = sqlite3.connect(temporary, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"CREATE TABLE IF NOT EXISTS verdicts ({VERDICTS})")
        db.execute(f"CREATE TABLE IF NOT EXISTS claims ({CLAIMS})")
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
        db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        db.close()
        try:
            os.link(
                temporary, path
            )  # never replaces: the first process to get here wins, the others use its file
        except FileExistsError:
            pass
    finally:
        for leftover in (temporary, temporary + "-wal", temporary + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _retry_busy(action, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), "" where /proc cannot tell (not
    Linux), None where the process is gone or is a zombie (killed, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # the command name (field 2) is in parentheses and may hold spaces: fields are counted after it
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else ""
    except OSError:
        return ""
    if fields[0] in (b"Z", b"X"):  # state: dead, only its exit status left for the parent to read
        return None
    return fields[19].decode()  # field 22, starttime


def _alive(pid: int, owner: str) -> bool:
    """Whether the run that wrote claim `owner` (host:pid:start:random) is still running on this host:
    its pid exists, is not a zombie, and (where the owner records it) started when that run did, so a
    pid the system has since given to another process does not hold the claim."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, alive
        pass
    started = _started(pid)
    if started is None:
        return False
    parts = owner.split(":")
    recorded = (
        parts[2] if len(parts) == 4 else ""
    )  # owners written before start times were recorded
    return not (started and recorded and recorded != started)


# the reason a direct run gives a question that a pending batch asks (it is not asked twice)
PENDING_IN_BATCH = "pending in a batch: collect it with --batch"
# an intent recorded on another host, whose batch id never came: how long before another run takes
# it for abandoned and looks for its batch itself (a live run creates its batch within seconds)
ORPHAN_AFTER = 3600.0
CHOICES = ("A", "B", "tie")
_AMOUNTS = ("prompt_tokens", "completion_tokens", "price", "seconds")


def _amount(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _share(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and 0 <= value <= 1)


def _count(value: Any, least: int) -> bool:
    return type(value) is int and value >= least


def well_formed(row: Any) -> bool:
    """Whether a stored row is a verdict (choice A, B or tie, with its costs) or a reply that could not
    be read (choice null, its text, the parser's version, the pair's place in the request): never a
    preference out of range, a choice that means nothing, or a missing field."""
    if not isinstance(row, dict) or not all(_amount(row.get(name)) for name in _AMOUNTS):
        return False
    if not (
        isinstance(row.get("model"), str | None) and isinstance(row.get("estimated", False), bool)
    ):
        return False
    if not (_count(row.get("attempts", 1), 1) and _count(row.get("parse_failures", 0), 0)):
        return False
    if row.get("choice") is None:
        return (
            isinstance(row.get("raw"), str)
            and isinstance(row.get("reason"), str)
            and _count(row.get("parser"), 0)
            and _count(row.get("position"), 0)
            and _count(row.get("count"), row["position"] + 1)
        )
    return row["choice"] in CHOICES and _share(row.get("probability")) and _share(row.get("soft"))


def cache_key(parts: dict[str, Any]) -> str:
    """A stable hash of everything that can change a verdict."""
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


class VerdictCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                _create(self.path)
            # isolation_level=None: we commit explicitly, one short transaction per request
            self._db = sqlite3.connect(
                self.path, timeout=60, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA busy_timeout=60000")
            self._db.execute("PRAGMA synchronous=NORMAL")
            # an older cache made before files were created in WAL mode: switching needs the file alone,
            # so a busy file is retried rather than failed
            _retry_busy(lambda: self._db.execute("PRAGMA journal_mode=WAL"))
            self._db.execute(f"CREATE TABLE IF NOT EXISTS verdicts ({VERDICTS})")
            self._db.execute(f"CREATE TABLE IF NOT EXISTS claims ({CLAIMS})")
            self._migrate()
            self.unreadable: set[str] = set()  # keys whose rows were not well formed, asked again
            pid = os.getpid()
            self.owner = f"{socket.gethostname()}:{pid}:{_started(pid) or ''}:{os.urandom(6).hex()}"
        except sqlite3.DatabaseError as exc:
            raise FarmError(
                f"{self.path}: cannot open the annotation cache ({exc}); pass --cache PATH or --no-cache"
            ) from None

    def _migrate(self) -> None:
        """Bring a schema 1 file to schema 2 (the batch tables; nothing else changed)."""
        row = self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'batch_keys'"
        ).fetchone()
        if row is not None:
            return
        with self._transaction():
            self._db.execute(f"CREATE TABLE IF NOT EXISTS batches ({BATCHES})")
            self._db.execute(f"CREATE TABLE IF NOT EXISTS batch_lines ({BATCH_LINES})")
            self._db.execute(f"CREATE TABLE IF NOT EXISTS batch_keys ({BATCH_KEYS})")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
            )

    def get_many(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The well-formed rows of `keys`; a row that is not (see `well_formed`) is left out, as if
        missing, and its key added to `unreadable`."""
        keys = list(dict.fromkeys(keys))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(keys), 900):  # SQLite's bound-parameter limit
            chunk = keys[start : start + 900]
            marks = ",".join("?" * len(chunk))
            for key, value in self._db.execute(
                f"SELECT key, value FROM verdicts WHERE key IN ({marks})", chunk
            ):
                try:
                    row = orjson.loads(value)
                except orjson.JSONDecodeError:
                    row = None
                if well_formed(row):
                    found[key] = row
                else:
                    self.unreadable.add(key)
        return found

    def put_many(self, entries: dict[str, dict[str, Any]]) -> None:
        if not entries:
            return
        now = time.time()
        rows = [(key, orjson.dumps(value), now) for key, value in entries.items()]
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", rows)
            self._db.executemany("DELETE FROM claims WHERE key = ?", [(key,) for key in entries])

    def claim(
        self,
        keys: list[str],
        lease: float,
        answers: Callable[[str, dict[str, Any]], bool] | None = None,
    ) -> tuple[list[str], list[str], dict[str, dict[str, Any]]]:
        """(keys now claimed by this run, keys another live run is asking for, verdicts of keys answered
        since the caller last read the cache). The verdicts are read in the same transaction as the
        claims: a key another run answered (and so stopped claiming) between the caller's read and this
        call is returned with its verdict, never claimed and paid for again. `answers(key, row)`: whether
        a row answers its question (a reply cached as unreadable may be asked again); default: all do."""
        host, now = socket.gethostname(), time.time()
        mine, theirs = [], []
        with self._transaction():
            answered = self.get_many(keys)
            if answers is not None:
                answered = {key: row for key, row in answered.items() if answers(key, row)}
            for key in dict.fromkeys(keys):
                if key in answered:
                    continue
                if self._claimed_elsewhere(key, host, now):
                    theirs.append(key)
                    continue
                self._db.execute(
                    "INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                    (key, self.owner, host, os.getpid(), now + lease),
                )
                mine.append(key)
        return mine, theirs, answered

    def _claimed_elsewhere(self, key: str, host: str, now: float) -> bool:
        """Whether another live run holds a claim on `key` (inside a transaction)."""
        row = self._db.execute(
            "SELECT owner, host, pid, expires FROM claims WHERE key = ?", (key,)
        ).fetchone()
        return (
            row is not None
            and row[0] != self.owner
            and row[3] > now
            and not (row[1] == host and not _alive(row[2], row[0]))
        )

    # -- pending batches (farmkit.annotate.batch) ----------------------------------------------

    def pending_keys(self, keys: Iterable[str]) -> set[str]:
        """The keys among `keys` that a pending batch asks."""
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        for start in range(0, len(keys), 900):
            chunk = keys[start : start + 900]
            marks = ",".join("?" * len(chunk))
            found.update(
                key
                for (key,) in self._db.execute(
                    f"SELECT key FROM batch_keys WHERE key IN ({marks})", chunk
                )
            )
        return found

    def record_batch(
        self,
        intent: str,
        endpoint: str,
        lines: list[tuple[str, list[str], dict[str, Any]]],
        worst: Callable[[list[str]], float],
    ) -> list[str]:
        """Record the intent to send `lines` ((custom_id, keys, spec)) as one batch, before anything
        is uploaded, and return the custom_ids taken: a line whose keys are answered, pending in
        another batch or claimed by a live run is left out (in the same transaction, so two runs
        never both send a question). `worst(taken custom_ids)`: the batch's worst price (USD)."""
        host, now = socket.gethostname(), time.time()
        taken: list[str] = []
        with self._transaction():
            for custom_id, keys, spec in lines:
                if (
                    self.get_many(keys)
                    or self.pending_keys(keys)
                    or any(self._claimed_elsewhere(key, host, now) for key in keys)
                ):
                    continue
                self._db.execute(
                    "INSERT OR REPLACE INTO batch_lines VALUES (?, ?, ?, ?)",
                    (custom_id, intent, orjson.dumps(keys), orjson.dumps(spec)),
                )
                self._db.executemany(
                    "INSERT INTO batch_keys VALUES (?, ?)", [(key, custom_id) for key in keys]
                )
                taken.append(custom_id)
            if taken:
                self._db.execute(
                    "INSERT INTO batches VALUES (?, ?, NULL, NULL, ?, ?, ?, ?, ?)",
                    (intent, endpoint, self.owner, host, os.getpid(), now, worst(taken)),
                )
        return taken

    def pending_requests(self, requests: Iterable[str]) -> dict[str, dict[str, Any]]:
        """request id -> the pending line that asks it (its custom_id, intent, endpoint and batch id),
        for the `request` ids (a line's spec) among `requests`."""
        wanted = set(requests)
        found: dict[str, dict[str, Any]] = {}
        for custom_id, spec, intent, endpoint, batch_id in self._db.execute(
            "SELECT l.custom_id, l.spec, b.intent, b.endpoint, b.batch_id "
            "FROM batch_lines l JOIN batches b ON b.intent = l.intent"
        ):
            request = orjson.loads(spec).get("request")
            if request in wanted and request not in found:
                found[request] = {
                    "custom_id": custom_id,
                    "intent": intent,
                    "endpoint": endpoint,
                    "batch_id": batch_id,
                }
        return found

    def join_line(self, custom_id: str, keys: list[str]) -> bool:
        """Have the pending line `custom_id` answer `keys` too (another run's keys for the same
        request); False where the line is no longer pending or a key is answered or pending."""
        with self._transaction():
            row = self._db.execute(
                "SELECT spec FROM batch_lines WHERE custom_id = ?", (custom_id,)
            ).fetchone()
            if row is None or self.get_many(keys) or self.pending_keys(keys):
                return False
            spec = orjson.loads(row[0])
            spec["joined"] = [*spec.get("joined", []), keys]
            self._db.execute(
                "UPDATE batch_lines SET spec = ? WHERE custom_id = ?",
                (orjson.dumps(spec), custom_id),
            )
            self._db.executemany(
                "INSERT INTO batch_keys VALUES (?, ?)", [(key, custom_id) for key in keys]
            )
        return True

    def set_batch(self, intent: str, column: str, value: str) -> None:
        """Note the endpoint's id of an intent's uploaded file (`file_id`) or its batch (`batch_id`)."""
        assert column in ("file_id", "batch_id")
        with self._transaction():
            self._db.execute(f"UPDATE batches SET {column} = ? WHERE intent = ?", (value, intent))

    def batches(self) -> list[dict[str, Any]]:
        """Every pending batch, oldest first, with `orphaned`: its batch id is not known yet and the
        run that recorded it is gone (killed between recording and creating it)."""
        host, now = socket.gethostname(), time.time()
        rows = self._db.execute(
            "SELECT intent, endpoint, batch_id, file_id, owner, host, pid, created, worst "
            "FROM batches ORDER BY created"
        ).fetchall()
        found = []
        for intent, endpoint, batch_id, file_id, owner, on, pid, created, worst in rows:
            gone = owner != self.owner and (
                not _alive(pid, owner) if on == host else created + ORPHAN_AFTER < now
            )
            found.append(
                {
                    "intent": intent,
                    "endpoint": endpoint,
                    "batch_id": batch_id,
                    "file_id": file_id,
                    "created": created,
                    "worst": worst,
                    "orphaned": batch_id is None and gone,
                }
            )
        return found

    def batch_lines(self, intent: str) -> dict[str, tuple[list[str], dict[str, Any]]]:
        """custom_id -> (keys, spec) of an intent's lines still pending."""
        return {
            custom_id: (orjson.loads(keys), orjson.loads(spec))
            for custom_id, keys, spec in self._db.execute(
                "SELECT custom_id, keys, spec FROM batch_lines WHERE intent = ?", (intent,)
            )
        }

    def settle_lines(
        self, intent: str, custom_ids: list[str], verdicts: dict[str, dict[str, Any]]
    ) -> int:
        """Lines of `intent` that are done (answered, or to be asked again): their `verdicts` written
        and the lines no longer pending, in one transaction; the intent ends with its last line.
        Returns how many of the lines were still pending: 0 where another run settled them first
        (it collected the batch at the same time, and books it), and nothing is written."""
        now = time.time()
        with self._transaction():
            pending = sum(
                self._db.execute(
                    "SELECT 1 FROM batch_lines WHERE custom_id = ? AND intent = ?", (c, intent)
                ).fetchone()
                is not None
                for c in custom_ids
            )
            if not pending:
                return 0
            self._db.executemany(
                "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)",
                [(key, orjson.dumps(value), now) for key, value in verdicts.items()],
            )
            self._db.executemany(
                "DELETE FROM batch_keys WHERE custom_id = ?", [(c,) for c in custom_ids]
            )
            self._db.executemany(
                "DELETE FROM batch_lines WHERE custom_id = ? AND intent = ?",
                [(c, intent) for c in custom_ids],
            )
            left = self._db.execute(
                "SELECT 1 FROM batch_lines WHERE intent = ? LIMIT 1", (intent,)
            ).fetchone()
            if left is None:
                self._db.execute("DELETE FROM batches WHERE intent = ?", (intent,))
        return pending

    def renew(self, lease: float) -> None:
        """Extend every claim this run holds to `lease` seconds from now."""
        with self._transaction():
            self._db.execute(
                "UPDATE claims SET expires = ? WHERE owner = ?", (time.time() + lease, self.owner)
            )

    def release(self, keys: list[str] | None = None) -> None:
        """Give up this run's claims on `keys` (None: all of them), so that waiting runs ask for themselves."""
        with self._transaction():
            if keys is None:
                self._db.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))
            else:
                self._db.executemany(
                    "DELETE FROM claims WHERE key = ? AND owner = ?",
                    [(key, self.owner) for key in keys],
                )

    @contextlib.contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.release()
        self._db.close()
