"""Board formats: how farm-winrate, farm-eval and farm-correlate write their rows (--format NAME),
one renderer per name, and the one writer every board goes through."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from farmkit.core.io import dumps, write_text
from farmkit.evaluate.winrate import alpaca_eval_board, csv_text, markdown_text, table_text

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
