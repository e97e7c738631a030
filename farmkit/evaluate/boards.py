"""Board formats: how farm-winrate, farm-eval and farm-correlate write their rows (--format NAME),
one renderer per name, and the one writer every board goes through."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from farmkit.core.io import dumps, write_text

# AlpacaEval's leaderboard CSV (data_AlpacaEval_2/*_leaderboard.csv): its column names in its order,
# each with the field of a farm-winrate row it holds; the model name is the unnamed first column.
# `mode` is AlpacaEval's provenance label (verified, minimal, community): a row's own, else community.
ALPACA_EVAL_BOARD = (
    ("win_rate", "win_rate"),
    ("standard_error", "standard_error"),
    ("n_wins", "n_wins"),
    ("n_wins_base", "n_losses"),
    ("n_draws", "n_draws"),
    ("n_total", "n_total"),
    ("discrete_win_rate", "discrete_win_rate"),
    ("mode", "mode"),
    ("avg_length", "avg_length"),
    ("length_controlled_winrate", "length_controlled_win_rate"),
    ("lc_standard_error", "lc_standard_error"),
)


def alpaca_eval_board(rows: Iterable[dict[str, Any]]) -> str:
    """Leaderboard rows as AlpacaEval writes its leaderboard CSV (pandas' `to_csv` of a frame indexed
    by model), so `pandas.read_csv(path, index_col=0)` reads them by AlpacaEval's column names."""
    board = [
        {"": row["generator"], **{name: row.get(field) for name, field in ALPACA_EVAL_BOARD}}
        for row in rows
    ]
    for row in board:
        row["mode"] = row["mode"] or "community"
    return indexed_csv(board, [name for name, _ in ALPACA_EVAL_BOARD])


def indexed_csv(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """CSV of rows whose name is under the key "" (an unnamed first column, as pandas writes an
    index), then `columns` in order; None is an empty cell."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["", *columns])
    for row in rows:
        writer.writerow([_csv_value(row.get(name)) for name in ("", *columns)])
    return buffer.getvalue()


def _shown(
    rows: Iterable[dict[str, Any]], columns: Sequence[str] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows without their provenance, and the columns of `columns` (default: every field) that
    some row has: what the text formats show."""
    rows = [{k: v for k, v in row.items() if k != "provenance"} for row in rows]
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    return rows, [c for c in columns if any(c in row for row in rows)]


def csv_text(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as CSV (numbers as they are; lists joined by commas)."""
    import csv
    import io

    rows, columns = _shown(rows, columns)
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    return buffer.getvalue()


def markdown_text(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as a markdown table (numbers to 2 decimals)."""
    rows, columns = _shown(rows, columns)
    if not rows:
        return ""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    # a `|` inside a cell (annotator pairs "a|b") would end the cell: markdown escapes it
    lines += [
        "| " + " | ".join(_cell(row.get(c)).replace("|", "\\|") for c in columns) + " |"
        for row in rows
    ]
    return "\n".join(lines) + "\n"


def table_text(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as an aligned text table (numbers to 2 decimals, right-aligned)."""
    rows, columns = _shown(rows, columns)
    if not rows:
        return ""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [
        all(isinstance(row.get(c), (int, float, type(None))) for row in rows) for c in columns
    ]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for r in cells:
        lines.append(
            "  ".join(
                v.rjust(w) if right else v.ljust(w)
                for v, w, right in zip(r, widths, numeric, strict=True)
            ).rstrip()
        )
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # two decimals, but small values (p-values) keep two significant digits
        return f"{value:.2g}" if 0 < abs(value) < 0.005 else f"{value:.2f}"
    if isinstance(value, dict):  # figures by name (kappas by annotator pair): name: figure; ...
        return "; ".join(f"{key}: {_cell(item)}" for key, item in value.items())
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, float) for v in value)
    ):
        return f"{_cell(value[0])}–{_cell(value[1])}"  # an interval (low, high)
    if isinstance(value, (list, tuple)):
        # long lists (models missing from a board) would swamp a table: the count and the first few
        shown = ",".join(map(str, value[:3]))
        return shown if len(value) <= 3 else f"{len(value)}: {shown},..."
    return str(value)


def _csv_value(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "" if value is None else value


# A renderer turns rows into the text of a board; `columns`: the ones the text formats show, in
# order (None: every field). jsonl and alpaca-eval have columns of their own.
Renderer = Callable[[Sequence[dict[str, Any]], Sequence[str] | None], str]


def _jsonl(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    return b"".join(dumps(row) for row in rows).decode("utf-8")


def _alpaca_eval(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    return alpaca_eval_board(rows)


BOARD_FORMATS: dict[str, Renderer] = {
    "jsonl": _jsonl,  # records, every field: what farm-correlate and farm-eval --leaderboard read
    "table": table_text,
    "csv": csv_text,
    "markdown": markdown_text,
    "alpaca-eval": _alpaca_eval,  # AlpacaEval's leaderboard CSV (its column names and order)
}


def write_board(
    rows: Sequence[dict[str, Any]], fmt: str, output: str, columns: Sequence[str] | None = None
) -> None:
    """Write `rows` in the format named `fmt` to stdout (`-`) or to a file, whole or not at all."""
    write_text(BOARD_FORMATS[fmt](rows, columns), output)
