"""One-command evaluation (farm-eval), as a convenience over the tools it stands for:

    farm-sample MODEL REFERENCE -n 1                          (only for a model folder)
    | farm-annotate - --reference REFERENCE --pool POOL       (or --labels FILE)
    | farm-winrate --instruction-difficulty FILE --bootstrap N

and then the rows placed among a published leaderboard's (AlpacaEval's CSV), sorted by the raw or the
length-controlled win rate. This module is the evaluation's part (the verdicts' check, the rows,
the board); tools/farm_eval.py composes it with farm-sample's command and farm-annotate's run
(farmkit.annotate.run.judge_against_reference), each step the one those tools take.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.core.fields import EXISTING_FILE, help_field
from farmkit.core.io import FarmError, display_name, open_binary
from farmkit.core.values import NON_NEGATIVE, Bounds
from farmkit.evaluate.boards import BOARD_FORMATS

log = logging.getLogger("farmkit")

SORT_BY = {"lc": "length_controlled_win_rate", "win_rate": "win_rate"}
# AlpacaEval's CSV column -> farmkit's leaderboard field
ALPACA_EVAL_COLUMNS = {
    "length_controlled_winrate": "length_controlled_win_rate",
    "n_wins_base": "n_losses",
}
MODEL_FILES = ("config.json", "meta.json")  # what makes a folder a model, not a dataset


def is_model(path: str) -> bool:
    """Whether an OUTPUTS argument names a model to sample from (then farm-eval samples first):
    `embedded`, a .gguf file, or a folder holding a model (config.json, or a farm tool's meta.json)."""
    if path == "embedded" or path.endswith(".gguf"):
        return True
    folder = Path(path)
    return folder.is_dir() and any((folder / name).is_file() for name in MODEL_FILES)


MIN_VERDICTS = (
    0.9  # of a model's pairs; a pool's few failed requests pass, a labels file's gaps not
)


def check_verdicts(preferences: list[dict[str, Any]], minimum: float = MIN_VERDICTS) -> None:
    """Refuse a board row that would stand on too few verdicts: a model with verdicts for fewer than
    `minimum` of its pairs (labels that do not cover its outputs, a judge that failed) is an error
    naming how many pairs lack one and why (their preference_reason), not a win rate on the rest."""
    from collections import Counter

    by_model: dict[str, list[dict[str, Any]]] = {}
    for record in preferences:
        by_model.setdefault(str(record.get("generator_2")), []).append(record)
    for model, records in by_model.items():
        missing = [record for record in records if record.get("preference") is None]
        judged = len(records) - len(missing)
        if missing and judged < minimum * len(records):
            reasons = Counter(record.get("preference_reason") or "no reason" for record in missing)
            why = "; ".join(f"{reason}: {count}" for reason, count in reasons.most_common(3))
            raise FarmError(
                f"{model}: {len(missing)} of {len(records)} pairs have no verdict ({why}); a win "
                f"rate on the other {judged} would not stand for the model. Give verdicts that "
                f"cover its outputs, or --min-verdicts {judged / len(records):.2f} to accept it "
                f"(now {minimum:g})"
            )


# the judge farm-eval asks when neither --pool nor --labels is given
DEFAULT_POOL = "weighted_gpt4_turbo"


@dataclass
class EvalConfig:
    """farm-eval's own settings (its sampling and judge options are farm-sample's and
    farm-annotate's shared ones)."""

    pool: str | None = help_field(
        None,
        f"The judge: a pool name (farm-annotate --list-pools) or a pool YAML file.  [default: {DEFAULT_POOL}]",
        show_default=False,
    )
    labels: str | None = help_field(
        None,
        "Take verdicts from this file instead of a pool: AlpacaEval annotations or preference "
        "records with both texts (matched on the instruction and the two outputs; fractions kept).",
        path=EXISTING_FILE,
        show_default=False,
    )
    leaderboard: str | None = help_field(
        None,
        "A published board (AlpacaEval's leaderboard CSV, or farmkit rows): print it with the new "
        "rows placed among its rows (a model already on it is replaced).",
        path=EXISTING_FILE,
        show_default=False,
    )
    sort_by: str = help_field(
        "lc",
        "The board's order: the length-controlled win rate, or the raw one.",
        tuple(sorted(SORT_BY)),
    )
    instruction_difficulty: str | None = help_field(
        None,
        "Instruction difficulties for the length-controlled win rate, as in farm-winrate "
        "(AlpacaEval's instruction_difficulty.csv); without it one model's LC has no difficulty term.",
        path=EXISTING_FILE,
        show_default=False,
    )
    context: tuple[str, ...] = help_field(
        (),
        "Other models' verdicts against the same reference (AlpacaEval annotations with the "
        "instruction text; repeatable): the length control is fitted jointly with them (instruction "
        "difficulties, the judge's shared length term), as over a whole board; their rows are not printed.",
        multiple=True,
        path=EXISTING_FILE,
        show_default=False,
    )
    bootstrap: int = help_field(
        1000,
        "Resamples of the percentile interval of the raw win rate (ci_low, ci_high); 0: none.",
        bounds=NON_NEGATIVE,
    )
    fmt: str = help_field(
        "jsonl",
        "jsonl: rows (records); table, csv, markdown: for people and spreadsheets; alpaca-eval: the "
        "CSV AlpacaEval publishes its leaderboards in (its columns and order; farm-winrate's).",
        tuple(BOARD_FORMATS),
        flags=("--format",),
    )
    min_verdicts: float = help_field(
        MIN_VERDICTS,
        "The fraction of a model's pairs that must have a verdict: fewer is an error (exit 1) "
        "naming how many lack one and why (labels that do not cover the outputs), not a row.",
        bounds=Bounds(0, 1),
    )


def leaderboard(
    preferences: list[dict[str, Any]],
    *,
    difficulty: str | None = None,
    bootstrap: int = 0,
    seed: int = 0,
    context: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """farm-winrate: one row per model against the reference, with the length-controlled win rate
    and, with `bootstrap` resamples, a percentile interval of the raw one. `context`: files of other
    models' verdicts against the same reference (AlpacaEval annotations): the length control is
    fitted jointly with them, as farm-winrate does over a whole board, and only the new rows return."""
    from farmkit.evaluate.length_control import read_instruction_difficulty
    from farmkit.evaluate.winrate import WinrateTable, item_key

    given = None
    if difficulty is not None:
        given = (display_name(difficulty), read_instruction_difficulty(difficulty, item_key))
    table = WinrateTable(bootstrap=bootstrap > 0, difficulty=given)
    table.add_records(preferences, source="farm-eval")
    evaluated = {record.get("generator_2") for record in preferences}
    for path in context:
        numbers, records = context_verdicts(path, evaluated)
        if records:
            table.add_records(records, source=display_name(path), numbers=numbers)
    rows = [
        row
        for row in table.rows(seed=seed, resamples=max(bootstrap, 1))
        if row["generator"] in evaluated
    ]
    for note in table.lc_notes:
        log.info("farm-eval: instruction difficulty %s", note)
    return rows


def context_verdicts(path: str, evaluated: set[Any]) -> tuple[list[int], list[dict[str, Any]]]:
    """The verdicts of `path` that fit beside farm-eval's own: other models' (a model being evaluated
    is judged anew), rows that are what their AlpacaEval folder says (an upstream copy of another
    system's folder is left out, counted on stderr), keyed by their instruction text as farm-eval's
    are. A verdict without its instruction text cannot be matched and is an error naming its line."""
    from farmkit.core.io import RecordError, iter_json

    name = display_name(path)
    numbers, records, copies = [], [], 0
    for number, record in iter_json(path):
        if not isinstance(record, dict) or not isinstance(record.get("instruction"), str):
            raise RecordError(
                name,
                number,
                "a context verdict needs its `instruction` text (AlpacaEval's annotations have it), "
                "to be matched with the evaluated models' instructions",
            )
        if record.get("generator_2") in evaluated:
            continue
        if record.get("results_dir") not in (None, record.get("generator_2")):
            copies += 1
            continue
        kept = {k: v for k, v in record.items() if k not in ("id", "instruction_index")}
        numbers.append(number)
        records.append(kept)
    if copies:
        log.warning(
            "farm-eval: %s: left out %d verdict(s) whose results_dir names another system "
            "(an upstream copy)",
            name,
            copies,
        )
    return numbers, records


def _number(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return text
    return (
        int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value
    )


def read_board(path: str) -> list[dict[str, Any]]:
    """A published leaderboard: AlpacaEval's CSV (the model in the first, unnamed column) or farmkit's
    JSONL rows; AlpacaEval's column names become farmkit's (length_controlled_winrate ->
    length_controlled_win_rate, n_wins_base -> n_losses)."""
    name = display_name(path)
    if not str(path).endswith((".csv", ".csv.gz")):
        from farmkit.core.io import read_records

        return list(read_records(path))
    with open_binary(path) as stream:
        text = stream.read().decode("utf-8-sig")
    table = list(csv.reader(io.StringIO(text)))
    if not table or len(table[0]) < 2:
        raise FarmError(f"{name}: an empty board; expected AlpacaEval's leaderboard CSV")
    header = [ALPACA_EVAL_COLUMNS.get(c, c) for c in table[0]]
    header[0] = "generator" if header[0] in ("", "name", "model", "generator") else header[0]
    if "generator" not in header or "win_rate" not in header:
        raise FarmError(
            f"{name}:1: expected AlpacaEval's leaderboard columns (the model first, then win_rate, "
            f"...); found {', '.join(table[0])}"
        )
    rows = []
    for number, cells in enumerate(table[1:], start=2):
        if not cells:
            continue
        if len(cells) != len(header):
            raise FarmError(
                f"{name}:{number}: {len(cells)} cells; expected {len(header)} as in the header"
            )
        row = {
            key: (cell if key == "generator" else _number(cell))
            for key, cell in zip(header, cells, strict=True)
        }
        rows.append(row)
    return rows


def place(
    board: list[dict[str, Any]], new: list[dict[str, Any]], sort_by: str = "lc"
) -> list[dict[str, Any]]:
    """The board with the new rows among its rows, sorted by `sort_by` (lc or win_rate, best first;
    rows without the figure last) and ranked from 1. A new row replaces the board's row of the same
    model (said on stderr). Each row says where it comes from: `source` published or farm-eval."""
    column = SORT_BY[sort_by]
    names = {row["generator"] for row in new}
    for row in board:
        if row.get("generator") in names:
            log.warning(
                "farm-eval: %s is on the board already (win_rate %s, LC %s); the new row replaces it",
                row["generator"],
                _shown(row.get("win_rate")),
                _shown(row.get("length_controlled_win_rate")),
            )
    merged = [{**row, "source": "published"} for row in board if row.get("generator") not in names]
    merged += [{**row, "source": "farm-eval"} for row in new]

    def key(row: dict[str, Any]) -> tuple[int, float]:
        value = row.get(column)
        if not isinstance(value, (int, float)) or math.isnan(value):
            return (1, 0.0)
        return (0, -float(value))

    merged.sort(key=key)
    ranked = []
    for rank, row in enumerate(merged, start=1):  # a rank the row had (a board of ours) is replaced
        ranked.append({"rank": rank, **{k: v for k, v in row.items() if k != "rank"}})
    return ranked


def _shown(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "n/a"


TABLE_COLUMNS = (
    "rank",
    "generator",
    "length_controlled_win_rate",
    "lc_standard_error",
    "win_rate",
    "standard_error",
    "ci_low",
    "ci_high",
    "n_wins",
    "n_losses",
    "n_draws",
    "n_total",
    "avg_length",
    "reference",
    "source",
)
