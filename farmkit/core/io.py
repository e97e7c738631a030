"""Reading and writing records: JSONL (or a JSON array), `-` for stdin/stdout, transparent .gz,
validation at the boundary with FILE:LINE errors, and output files that appear whole or not at all."""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import itertools
import logging
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from farmkit.core.validate import problems

log = logging.getLogger("farmkit")


# sysexits' EX_TEMPFAIL: the work is not finished yet and the same command, run later, goes on
# (farm-annotate --batch while questions are pending; farm-label --status before LABELS is complete)
PENDING_EXIT = 75


class FarmError(Exception):
    """A data or runtime problem the user can fix; reported without a traceback, exit 1."""

    exit_code = 1


class MissingInput(FarmError):
    """An input path given that does not exist: a usage error (exit 2), as click reports a missing
    path given to an option that must exist, so the same mistake exits the same in every tool."""

    exit_code = 2


class RecordError(FarmError):
    """A record that is not what the tool expects, with where it is."""

    def __init__(self, source: str, line: int | None, message: str):
        self.source, self.line, self.message = source, line, message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


ON_ERROR = ("fail", "skip")
SHOWN_BAD_RECORDS = 5  # bad records named one by one on stderr under --on-error skip


class BadRecords:
    """What reading does with a bad record (invalid JSON, a foreign format that does not fit, a
    schema violation): `fail` raises its RecordError; `skip` leaves it out, names the first few on
    stderr (FILE:LINE: reason) and counts them per file, so that nothing is left out silently."""

    def __init__(self, mode: str = "fail"):
        if mode not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}")
        self.mode = mode
        self.skipped: dict[str, int] = {}  # file -> bad records left out
        self.reported: set[str] = set()

    def reject(self, error: RecordError) -> None:
        """Raise `error`, or (skip) note it and return so that the reader goes on."""
        if self.mode == "fail":
            raise error
        count = self.skipped[error.source] = self.skipped.get(error.source, 0) + 1
        if sum(self.skipped.values()) <= SHOWN_BAD_RECORDS:
            log.warning("%s (skipped: --on-error skip)", error)
        elif count == 1:
            log.warning("%s: skipping its bad records too (--on-error skip)", error.source)

    def finish(self, source: str, kept: int) -> None:
        """At the end of a file: say how many bad records it had; a file whose every record was bad
        is an error, not an empty input."""
        skipped = self.skipped.get(source, 0)
        if not skipped or source in self.reported:
            return
        self.reported.add(source)
        if not kept:
            raise FarmError(
                f"{source}: every record ({skipped:,}) is bad, none left to read; see the reasons "
                "above (run without --on-error skip to stop at the first)"
            )
        log.warning(
            "%s: skipped %s bad record(s) of %s (--on-error skip; the first reasons above)",
            source,
            f"{skipped:,}",
            f"{skipped + kept:,}",
        )


_bad_records = BadRecords()


def bad_records() -> BadRecords:
    """The policy for bad records of the command that runs (set by --on-error; default fail)."""
    return _bad_records


def set_on_error(mode: str) -> BadRecords:
    global _bad_records
    _bad_records = BadRecords(mode)
    return _bad_records


def display_name(path: str | os.PathLike) -> str:
    return "<stdin>" if str(path) == "-" else str(path)


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open a file for reading bytes; `-` is stdin and a gzip file (by magic bytes) is decompressed."""
    if str(path) == "-":
        raw: IO[bytes] = sys.stdin.buffer
    else:
        try:
            raw = open(path, "rb")
        except FileNotFoundError as exc:
            raise MissingInput(f"{path}: cannot open: {exc.strerror}") from None
        except OSError as exc:
            raise FarmError(f"{path}: cannot open: {exc.strerror}") from None
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[arg-type]
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return _GzipReader(display_name(path), buffered)  # type: ignore[return-value]
    return buffered


class CorruptInput(FarmError):
    """Compressed input that cannot be decompressed; `reason` is what the decompressor said."""

    def __init__(self, source: str, reason: str):
        self.source, self.reason = source, reason
        super().__init__(f"{source}: cannot read: {reason}")


class _GzipReader(gzip.GzipFile):
    """A gzip stream whose errors name the file: zlib's own say only `Error -3 while decompressing data`."""

    def __init__(self, name: str, fileobj: IO[bytes]):
        super().__init__(fileobj=fileobj)
        self.source = name

    def _named(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except (zlib.error, EOFError, gzip.BadGzipFile) as exc:
            raise CorruptInput(self.source, f"corrupt or truncated gzip data ({exc})") from None

    def read(self, size: int | None = -1) -> bytes:
        return self._named(super().read, size)

    def read1(self, size: int = -1) -> bytes:
        return self._named(super().read1, size)

    def peek(self, n: int = 0) -> bytes:
        return self._named(super().peek, n)

    def readline(self, size: int | None = -1) -> bytes:
        return self._named(super().readline, size)


def _array_or_skipped_lines(stream: IO[bytes], name: str) -> tuple[list[Any] | None, int]:
    """Skip a UTF-8 byte order mark and leading blank lines; return (the items, 0) for a JSON array
    file, else (None, lines skipped)."""
    if stream.peek(3)[:3] == codecs.BOM_UTF8:  # type: ignore[attr-defined]  # editors on Windows write one
        stream.read(3)
    skipped_lines = 0
    while True:  # skip leading whitespace to see whether this is a JSON array
        head = stream.peek(64)  # type: ignore[attr-defined]
        if not head or head.lstrip():
            break
        skipped_lines += stream.read(len(head)).count(b"\n")
    if stream.peek(64).lstrip()[:1] == b"[":  # type: ignore[attr-defined]
        try:
            items = orjson.loads(stream.read())
        except orjson.JSONDecodeError as exc:
            raise RecordError(
                name, None, f"invalid JSON array ({exc}); expected a JSON array or JSON Lines"
            ) from None
        return items, 0
    return None, skipped_lines


def _bad_line(name: str, number: int, line: bytes) -> RecordError:
    shown = line.strip()[:60].decode("utf-8", "replace")
    return RecordError(
        name, number, f"not valid JSON ({shown!r}); expected one JSON object per line"
    )


def iter_json(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed value) from a JSONL file or a JSON array file.

    A JSON array (AlpacaEval's .json files) is recognised by its first non-blank byte; its items
    are numbered from 1 in the order they appear. Blank lines in JSONL are skipped.
    """
    stream = open_binary(path)
    try:
        yield from iter_json_stream(stream, display_name(path))
    finally:
        if str(path) != "-":
            stream.close()


def iter_json_stream(stream: IO[bytes], name: str) -> Iterator[tuple[int, Any]]:
    """`iter_json` over an open binary stream (with `peek`) that errors call `name`."""
    number: int | None = None  # the last line read, once reading line by line
    try:
        items, skipped_lines = _array_or_skipped_lines(stream, name)
        if items is not None:
            yield from enumerate(items, start=1)
            return
        number = skipped_lines
        for number, line in enumerate(stream, start=1 + skipped_lines):
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad_records().reject(_bad_line(name, number, line))
                continue
            yield number, value
    except CorruptInput as exc:  # the line being read when the data broke
        raise RecordError(name, None if number is None else number + 1, exc.reason) from None
    except OSError as exc:
        raise FarmError(f"{name}: cannot read: {exc}") from None


def decode_text(data: bytes, name: str) -> str:
    """A whole text file's bytes as text: UTF-8 (a byte order mark skipped), or UTF-16 when it starts
    with a UTF-16 byte order mark (what spreadsheets and PowerShell save); anything else is an error
    naming the line of the first byte that is not UTF-8."""
    try:
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        line = data[: exc.start].decode(exc.encoding, "replace").count("\n") + 1
        found = data[exc.start : exc.start + 4].hex(" ")
        raise RecordError(
            name,
            line,
            f"not {'UTF-16' if utf16 else 'UTF-8'} text (bytes {found} at offset {exc.start}); "
            "expected UTF-8 (or UTF-16 with a byte order mark): is it a binary file? "
            "Save it as UTF-8 text",
        ) from None


def iter_json_chunks(
    path: str | os.PathLike, size: int = 65536
) -> Iterator[tuple[list[int], list[Any]]]:
    """Like `iter_json`, in lists of up to `size` values with their line numbers: one call per
    chunk instead of per record, for tools that fold millions of records (it reads `size` lines
    before yielding, so interactive streaming tools should use `iter_json`)."""
    name = display_name(path)
    stream = open_binary(path)
    try:
        items, skipped_lines = _array_or_skipped_lines(stream, name)
        if items is not None:
            for start in range(0, len(items), size):
                chunk = items[start : start + size]
                yield list(range(start + 1, start + 1 + len(chunk))), chunk
            return
        number = 1 + skipped_lines
        while True:
            lines = list(itertools.islice(stream, size))
            if not lines:
                return
            try:
                values = list(map(orjson.loads, lines))
                numbers = list(range(number, number + len(lines)))
            except (
                orjson.JSONDecodeError
            ):  # a blank or bad line: go line by line to skip or name it
                values, numbers = [], []
                for offset, line in enumerate(lines):
                    if not line.strip():
                        continue
                    try:
                        values.append(orjson.loads(line))
                    except orjson.JSONDecodeError:
                        bad_records().reject(_bad_line(name, number + offset, line))
                        continue
                    numbers.append(number + offset)
            number += len(lines)
            yield numbers, values
    except CorruptInput as exc:  # within the chunk of lines being read
        raise RecordError(name, None, exc.reason) from None
    except OSError as exc:
        raise FarmError(f"{name}: cannot read: {exc}") from None
    finally:
        if str(path) != "-":
            stream.close()


def iter_rows(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """`iter_json`, and also Parquet files (`.parquet`, with pyarrow) and Hugging Face datasets (see
    `dataset_rows`): a dataset name, a folder saved by `datasets`' save_to_disk or a folder of data
    files, with `:SPLIT` after it or the split that --split set; their rows are numbered from 1."""
    yield from open_rows(path)[1]


def open_rows(path: str | os.PathLike) -> tuple[str, Iterator[tuple[int, Any]]]:
    """(what errors call the input, its (number, row) pairs) for `iter_rows`: a dataset is loaded at
    once (so that a name that is not one fails here) and called `DATASET:SPLIT`."""
    if str(path) != "-" and not Path(path).is_file():
        found = dataset_rows(str(path))
        if found is not None:
            return found
    return display_name(path), _file_rows(path)


def _file_rows(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    name = display_name(path)
    if str(path).endswith(".parquet"):
        try:
            import pyarrow.parquet as parquet
        except ImportError:
            raise FarmError(f"{name}: reading Parquet needs `pip install pyarrow`") from None
        try:
            batches = parquet.ParquetFile(str(path)).iter_batches()
            number = 0
            for batch in batches:
                for row in batch.to_pylist():
                    number += 1
                    yield number, row
        except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
            raise FarmError(f"{name}: cannot read Parquet: {exc}") from None
        return
    yield from iter_json(path)


# -- Hugging Face datasets: names, saved folders and folders of data files ----------------------

_split: str | None = None  # the split --split chose for every dataset input without its own
# file names, not dataset names: a missing one keeps the plain "cannot open" error
FILE_SUFFIXES = (".json", ".jsonl", ".gz", ".parquet", ".csv", ".tsv", ".txt", ".arrow", ".yaml")
DATA_FILE_SUFFIXES = (".parquet", ".json", ".jsonl", ".csv", ".arrow", ".json.gz", ".jsonl.gz")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\]%:]+$")


def set_split(split: str | None) -> None:
    """The split of every dataset input that names none (`--split`); None: train, or the only one."""
    global _split
    _split = split


def _hub_name(spec: str) -> bool:
    return bool(_HUB_NAME.match(spec)) and not spec.lower().endswith(FILE_SUFFIXES)


def _saved_folder(folder: Path) -> bool:
    return any(
        (folder / marker).exists()
        for marker in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def _data_files(folder: Path) -> bool:
    return any(
        entry.name.lower().endswith(DATA_FILE_SUFFIXES) and not entry.name.startswith(".")
        for entry in folder.rglob("*")
        if entry.is_file()
    )


def parse_dataset(spec: str) -> tuple[str, str | None] | None:
    """(dataset, split) for a dataset input: an existing folder, `FOLDER:SPLIT`, or a hub name
    (`owner/name`, `name`) with or without `:SPLIT`; None when `spec` is meant as a file."""
    if Path(spec).is_dir():
        return spec, None
    head, colon, tail = spec.rpartition(":")
    if colon and head and tail and _SPLIT_NAME.match(tail):
        if Path(head).is_dir() or (not Path(head).exists() and _hub_name(head)):
            return head, tail
    if not Path(spec).exists() and _hub_name(spec):
        return spec, None
    return None


def _import_datasets(name: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise FarmError(
            f"{name}: reading a Hugging Face dataset needs `pip install datasets`"
        ) from None
    datasets.logging.set_verbosity_error()
    if not log.isEnabledFor(logging.INFO) or not sys.stderr.isatty():
        datasets.disable_progress_bars()
    return datasets


def hub_offline() -> bool:
    """Whether the Hugging Face hub is out of reach: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set, or its
    host does not answer within 3 seconds (then `datasets` would retry for half a minute)."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on"):
            return True
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection(
            (endpoint.hostname or "huggingface.co", endpoint.port or 443), timeout=3
        ).close()
    except OSError:
        return True
    return False


def _go_offline(datasets: Any) -> None:
    """Have `datasets` (and huggingface_hub under it) use the local cache only."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    with contextlib.suppress(Exception):
        datasets.config.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True
    with contextlib.suppress(Exception):
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True


def _choose_split(names: list[str], name: str, split: str | None) -> str:
    """The split to read of those a dataset has: the one asked for, else `train`, else the only one."""
    if split is not None:
        if split not in names:
            raise FarmError(
                f"{name}: no split {split!r}; it has {', '.join(names)} (choose with "
                f"{name}:SPLIT or --split)"
            )
        return split
    if len(names) == 1:
        return names[0]
    if "train" in names:
        log.info("farmkit: %s: reading its train split (of %s)", name, ", ".join(names))
        return "train"
    raise FarmError(
        f"{name}: holds several splits ({', '.join(names)}) and none is train; choose one with "
        f"{name}:SPLIT or --split SPLIT"
    )


_OWN_READER = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".parquet")


def _folder_files(name: str, split: str | None, datasets: Any) -> tuple[str, Iterator] | None:
    """A folder of JSON/JSONL/Parquet data files read by farmkit itself, the split's files found
    as `datasets` finds them (`data/train-*.parquet`, `test.jsonl`, ...): values exactly as written
    (datasets' type inference would turn a column of mixed types into decoded JSON) and errors
    naming FILE:LINE when the split is one file. None for other files (csv, arrow): `datasets`."""
    try:
        builder = datasets.load_dataset_builder(name)
    except (ValueError, FileNotFoundError, ConnectionError) as exc:
        raise FarmError(f"{name}: cannot read the dataset folder: {exc}") from None
    files = {str(key): list(value) for key, value in (builder.config.data_files or {}).items()}
    if not files:
        return None
    chosen = _choose_split(list(files), name, split)
    paths = files[chosen]
    if not all(str(path).lower().endswith(_OWN_READER) for path in paths):
        return None
    if len(paths) == 1:
        return str(paths[0]), _file_rows(paths[0])

    def rows() -> Iterator[tuple[int, Any]]:  # one count over the split's files, in order
        number = 0
        for path in paths:
            for _, row in _file_rows(path):
                number += 1
                yield number, row

    return f"{name}:{chosen}", rows()


def dataset_rows(spec: str) -> tuple[str, Iterator[tuple[int, Any]]] | None:
    """(`DATASET:SPLIT`, the rows numbered from 1) of the Hugging Face dataset `spec` names (see
    `parse_dataset`); None when `spec` is a file name. A folder saved by
    save_to_disk is loaded from disk, a folder of data files and a hub name with `load_dataset`
    (offline, or with the hub out of reach, from the local cache only)."""
    parsed = parse_dataset(spec)
    if parsed is None:
        return None
    name, split = parsed
    split = split if split is not None else _split
    folder = Path(name)
    if folder.is_dir() and not _saved_folder(folder) and not _data_files(folder):
        raise FarmError(
            f"{name}: a folder, not a records file; expected JSONL, JSON, Parquet, a folder saved by "
            "HF datasets or a folder of data files (parquet, json, jsonl, csv)"
        )
    datasets = _import_datasets(name)
    if folder.is_dir() and _saved_folder(folder):
        try:
            dataset = datasets.load_from_disk(name)
        except (OSError, ValueError) as exc:
            raise FarmError(f"{name}: cannot read the saved dataset: {exc}") from None
    else:
        if folder.is_dir():
            found = _folder_files(name, split, datasets)
            if found is not None:
                return found
        offline = not folder.is_dir() and hub_offline()
        if offline:
            _go_offline(datasets)
        try:
            dataset = datasets.load_dataset(name, split=split)
        except (ConnectionError, FileNotFoundError) as exc:
            if folder.is_dir():
                raise FarmError(f"{name}: cannot read the dataset folder: {exc}") from None
            if offline:
                raise FarmError(
                    f"{name}: cannot open: no such file or folder, and a dataset name that is "
                    "not in the local cache (offline: HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set, or the "
                    "hub out of reach); give a file, a dataset folder, or a name cached while online"
                ) from None
            raise FarmError(
                f"{name}: cannot open: no such file or folder, and not a dataset on the Hugging "
                f"Face hub ({exc})"
            ) from None
        except ValueError as exc:  # an unknown split, among others
            raise FarmError(f"{name}: {exc}") from None
    chosen = split or ""
    if isinstance(dataset, datasets.DatasetDict):
        chosen = _choose_split(list(dataset), name, split)
        dataset = dataset[chosen]
    return (f"{name}:{chosen}" if chosen else name), enumerate(dataset, start=1)


def read_records(path: str | os.PathLike, kind: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield records from `path`, each checked against the schema of `kind` when one is given.
    Other projects' formats that fit `kind` (TRL, hh-rlhf, chat messages) are converted on the way
    (farmkit.core.formats), the format detected from the first record."""
    name, rows = open_rows(path)
    yield from check_rows(rows, name, kind)


def read_numbered(
    path: str | os.PathLike, kind: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Every record of `path` (as `read_records` reads it) with where it is: (FILE:LINE, record)."""
    name, rows = open_rows(path)
    return [(f"{name}:{number}", record) for number, record in numbered_records(rows, name, kind)]


def check_rows(
    rows: Iterable[tuple[int, Any]], name: str, kind: str | None = None
) -> Iterator[dict[str, Any]]:
    """`read_records` over (line, value) pairs already read from the file called `name`."""
    for _, record in numbered_records(rows, name, kind):
        yield record


def numbered_records(
    rows: Iterable[tuple[int, Any]], name: str, kind: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) pairs of `check_rows`. A bad record raises its RecordError, or is left out and
    reported under --on-error skip (see BadRecords)."""
    from farmkit.core.formats import converted

    policy = bad_records()

    def reject(source: str, number: int, message: str) -> None:
        policy.reject(RecordError(source, number, message))

    if kind is not None:
        rows = converted(rows, kind, name, reject)
    kept = 0
    for number, record in rows:
        if kind is not None:
            problem = problems(record, kind)
        elif not isinstance(record, dict):
            problem = f"a {type(record).__name__} is not a record; expected a JSON object"
        else:
            problem = None
        if problem:
            policy.reject(RecordError(name, number, problem))
            continue
        kept += 1
        yield number, record
    policy.finish(name, kept)


def read_many(
    paths: Iterable[str | os.PathLike], kind: str | None = None
) -> Iterator[dict[str, Any]]:
    for path in paths:
        yield from read_records(path, kind)


def dumps(record: Any) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


_OWNER = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"


def _sweep_stale(target: Path, suffix: str) -> None:
    """Remove the temporary files or folders that a killed writer of `target` left behind: those named
    with this host and the id of a process that no longer exists (a live writer's are left alone, and
    so are other hosts' on a shared file system)."""
    pattern = re.compile(
        rf"^\.{re.escape(target.name)}\.{re.escape(_OWNER)}-(\d+)\.[^/]*{re.escape(suffix)}\.tmp$"
    )
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        pass
    return True


# names of the process's stdout: while a farm-* command runs, file descriptor 1 carries stderr
# (farmkit.cli.records_only_stdout), so these mean the records' stream, records_stdout()
_STDOUT_NAMES = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def _stream_target(target: Path) -> Path | None:
    """The path to write in place when `target` is a stream rather than a file or folder; None
    otherwise (a missing path included)."""
    if str(target) in _STDOUT_NAMES:
        try:
            return Path(f"/dev/fd/{records_stdout().fileno()}")
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return target  # not a real file (a test runner's capture): the process's stdout
    try:
        mode = target.stat().st_mode  # follows symlinks: a link to /dev/null is a stream too
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else target


def process_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    Works for files and for directories (a model folder is written whole or not at all too). A
    symlink is followed: the file it names is replaced, and the link stays. A stream (a device such
    as /dev/null, a FIFO, a socket, /dev/stdout) is yielded itself to be written in place: it has no
    atomicity to keep, and a rename would put a regular file where the stream was.
    """
    stream = _stream_target(Path(path))
    if stream is not None:
        yield stream
        return
    # the rename happens beside the real file, on its file system, not beside the link
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(target, suffix)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.{_OWNER}-{os.getpid()}.", suffix=suffix + ".tmp", dir=target.parent
    )
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(
        tmp, 0o666 & ~process_umask()
    )  # mkstemp's 0600 would survive the rename and lock others out
    try:
        yield tmp
        if tmp.is_dir() and target.is_dir():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


_records_stdout: IO[bytes] | None = None


def records_stdout() -> IO[bytes]:
    """The stream that carries a tool's records to stdout. While a farm-* command runs, the process's
    stdout is routed to stderr (so that whatever a library prints cannot corrupt the records) and this
    is the real stdout; elsewhere (a test runner, Python code) it is sys.stdout."""
    return _records_stdout if _records_stdout is not None else sys.stdout.buffer


def set_records_stdout(stream: IO[bytes] | None) -> None:
    global _records_stdout
    _records_stdout = stream


class RecordWriter:
    """Write records as JSONL to stdout (streamed) or to a file (atomically, on close)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = None if path in (None, "-") else Path(path)  # type: ignore[arg-type]
        self.count = 0
        self._stack = contextlib.ExitStack()
        if self.path is None:
            self._stream: IO[bytes] = records_stdout()
        else:
            tmp = self._stack.enter_context(atomic_path(self.path))
            opener = gzip.open if self.path.suffix == ".gz" else open
            self._stream = self._stack.enter_context(opener(tmp, "wb"))  # type: ignore[operator]

    def write(self, record: Any) -> None:
        self._stream.write(dumps(record))
        self.count += 1
        if self.path is None and self.count % 64 == 0:
            self._stream.flush()

    def write_all(self, records: Iterable[Any]) -> int:
        for record in records:
            self.write(record)
        return self.count

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.path is None:
            if exc_type is None:
                self._stream.flush()
            return
        self._stack.__exit__(exc_type, exc, tb)


def write_records(records: Iterable[Any], path: str | os.PathLike | None = None) -> int:
    with RecordWriter(path) as writer:
        return writer.write_all(records)


def write_text(text: str, path: str | os.PathLike | None = None) -> None:
    """Write `text` (UTF-8) where records would go: to stdout for `-` or None, else to a file
    written whole or not at all (.gz compresses), as RecordWriter writes records."""
    if path in (None, "-"):
        records_stdout().write(text.encode("utf-8"))
        return
    with atomic_path(path) as tmp:
        opener = gzip.open if Path(path).suffix == ".gz" else open
        with opener(tmp, "wb") as stream:  # type: ignore[operator]
            stream.write(text.encode("utf-8"))
