"""Validation statistics: rank correlation between leaderboards, and a judge's labels against
human labels (AlpacaFarm's and AlpacaEval's annotator analysis).

Annotation mode, definitions (all as fractions in [0, 1]; labels are 1, 2 or 1.5 for a tie, the
legacy 0 is a tie, other values in (1, 2) round to the nearer side):
- Where a set of labels has several most frequent values (a tied mode), a label's agreement with
  "the mode" is its expected agreement with one of them drawn at random.
- Judges are told apart by their records' `annotator` (else the file's name): one row per judge,
  its files and repeated labels being its runs.
- human_agreement of a judge (AlpacaFarm's): mean over pairs, held-out humans and judge runs of the
  agreement of the run's label with the mode of the other humans (leave-one-out; a pair with a single
  human label is compared with it); a tie is a label like the others. For the humans: each human
  against the mode of the others.
- human_agreement_alpacaeval (AlpacaEval's): mean over pairs and runs of the agreement of the run's
  label with the mode of all the humans, where a tie on one side only scores 1/2.
- flip_rate: over the pairs a judge labelled in both orders (the same instruction and outputs, with
  output_1 and output_2 swapped), the share of (one order, other order) label combinations that
  disagree once the swapped label is mirrored; null when no pair comes in both orders. Pairs are
  otherwise keyed in the order given, so a swapped copy counts as a pair of its own elsewhere.
- price_per_1000 / seconds_per_1000: 1,000 times the mean price (USD) / seconds of the judge's
  verdicts that record one (farm-annotate's provenance `price` and `time`, a cached verdict keeping
  what it cost when asked; else AlpacaEval's `price_per_example` / `time_per_example`); null when
  none does. AlpacaEval's evaluators' leaderboard reports the same two figures.
- bias: 1 - agreement of the mode of the judge's runs with the mode of all humans.
- variance: mean over runs of 1 - agreement of the run with the mode of the other runs (needs two
  runs or more: several files, or several labels per pair in one file).
- p_prefers_longer / p_prefers_lists / p_prefers_first: among the non-tie labels on pairs whose
  lengths differ by more than 30 characters / where exactly one output has a list / all pairs, the
  share choosing the longer output / the output with a list / output_1. The 30 characters are
  AlpacaEval's: its evaluators' leaderboard counts P(prefers longer) over 445 of the 648
  cross-annotated pairs, exactly those whose outputs differ by more than 30 characters.
- AlpacaEval's evaluators table (`alpaca_eval_evaluators`): Human agreement = 100 x
  human_agreement_alpacaeval (for the humans: 100 x their leave-one-out human_agreement), Bias and
  Variance x 100, price and time per 1,000 as above, the three preferences as fractions, # parsed =
  the labels that are a verdict (over all runs), and Spearman / Pearson between the judge's
  leaderboard and the human one (1 for the humans).
- cohen_kappa: between every two human annotators (their shared pairs), (p_o - p_e) / (1 - p_e);
  left out when there are more than 20 named annotators (crowd labels, where pairs rarely overlap).
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farmkit.core.fields import FILE_OR_STDIN, help_field
from farmkit.core.io import (
    FarmError,
    RecordError,
    decode_text,
    display_name,
    iter_json,
    iter_json_stream,
    open_binary,
)
from farmkit.core.validate import problems
from farmkit.core.values import NON_NEGATIVE
from farmkit.evaluate.boards import BOARD_FORMATS

TIE = 1.5
_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+\S", re.MULTILINE)


def field_names(text: str | None) -> tuple[str, ...] | None:
    """The fields of a comma-separated list (--human-label, --outputs)."""
    return tuple(part.strip() for part in text.split(",") if part.strip()) if text else text


@dataclass
class CorrelateConfig:
    """farm-correlate's settings (its options; -o is the shared board output)."""

    names: tuple[str, ...] = help_field(
        (),
        "Model-name column of the boards (once for all, or once per board). Default: generator, Model, or a CSV's first column.",
        flags=("--name",),
        multiple=True,
        metavar="COLUMN",
        show_default=False,
    )
    scores: tuple[str, ...] = help_field(
        (),
        "Score column of the boards (once for all, or once per board; a unique prefix is enough). Default: win_rate.",
        flags=("--score",),
        multiple=True,
        metavar="COLUMN",
        show_default=False,
    )
    plot: str | None = help_field(
        None,
        "Leaderboard mode: scatter of the first two boards as PNG (labelled points, their intervals, y = x when both share a scale).",
        path={"dir_okay": False},
        show_default=False,
    )
    max_labels: int | None = help_field(
        None,
        "With --plot: label at most N points. Default: every point up to 25, else 15 (the highest and lowest on each axis, then the largest departures from the trend).",
        bounds=NON_NEGATIVE,
        aliases=("--labels",),  # farm-annotate's --labels is a FILE of verdicts
        metavar="N",
        show_default=False,
    )
    judges: tuple[str, ...] = help_field(
        (),
        "Annotation mode: the judge's preference records; each file is a run (repeat for repeated runs).",
        flags=("--judge",),
        multiple=True,
        path=FILE_OR_STDIN,
        show_default=False,
    )
    humans: tuple[str, ...] = help_field(
        (),
        "Annotation mode: human preference records (several labels per pair allowed).",
        multiple=True,
        path=FILE_OR_STDIN,
        show_default=False,
    )
    key: str | None = help_field(
        None,
        "Field that identifies a pair in all files. Default: pair_id, else the texts.",
        metavar="FIELD",
        show_default=False,
    )
    judge_label: str = help_field("preference", "Field holding the judge's label.", metavar="FIELD")
    human_label: tuple[str, ...] = help_field(
        "preference",
        "Field holding a human label; several fields: one annotator each (wide records).",
        metavar="FIELD[,FIELD...]",
        parse=field_names,
    )
    outputs: tuple[str, ...] = help_field(
        "output_1,output_2",
        "Fields holding the two output texts (for the length, list and position preferences).",
        metavar="FIELD1,FIELD2",
        parse=field_names,
    )
    min_length_difference: int = help_field(
        30,
        "p_prefers_longer counts the pairs whose outputs differ by more than this many characters (AlpacaEval's 30).",
        bounds=NON_NEGATIVE,
        metavar="CHARS",
    )
    human_board: str | None = help_field(
        None,
        "Annotation mode: the human leaderboard each --judge-board is correlated with (Spearman, Pearson).",
        path=FILE_OR_STDIN,
        metavar="FILE",
        show_default=False,
    )
    judge_boards: tuple[str, ...] = help_field(
        (),
        "Annotation mode: a judge's leaderboard, the judge named by the `annotator` of its rows, else "
        "by the file's name. Repeatable.",
        flags=("--judge-board",),
        multiple=True,
        path=FILE_OR_STDIN,
        metavar="FILE",
        show_default=False,
    )
    fmt: str = help_field(
        "jsonl",
        "alpaca-eval (annotation mode): AlpacaEval's evaluators leaderboard CSV (its columns and "
        "order, percent where it uses percent, # parsed, the annotator as the unnamed first column).",
        tuple(BOARD_FORMATS),
        flags=("--format",),
    )


# ---------------------------------------------------------------- leaderboard mode


@dataclass
class Board:
    """Scores by model name from one leaderboard file."""

    label: str
    scores: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # model -> (low, high), where given
    axis_label: str = ""  # file stem: score, and the judge when the board names one
    judges: tuple[str, ...] = ()  # the `annotator` its rows name (farm-winrate's boards)


# the standard error that goes with a score column (AlpacaEval's CSV names and farm-winrate's)
_STANDARD_ERRORS = {
    "win_rate": "standard_error",
    "length_controlled_winrate": "lc_standard_error",
    "length_controlled_win_rate": "lc_standard_error",
}


def _interval_reader(columns: Sequence[str], score: str):
    """A function from a row (name -> raw value) to the score's (low, high) interval or None: the
    bootstrap bounds ci_low / ci_high of a win rate, else +-1.96 standard errors."""
    if score == "win_rate" and "ci_low" in columns and "ci_high" in columns:
        bounds = ("ci_low", "ci_high")
    else:
        error = next(
            (c for c in (_STANDARD_ERRORS.get(score), f"{score}_standard_error") if c in columns),
            None,
        )
        if error is None:
            return lambda row: None
        bounds = None

    def interval(row: dict[str, Any]) -> tuple[float, float] | None:
        try:
            if bounds is not None:
                return float(row[bounds[0]]), float(row[bounds[1]])
            center, spread = float(row[score]), 1.96 * float(row[error])
        except (KeyError, TypeError, ValueError):
            return None
        return center - spread, center + spread

    return interval


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def pick_column(
    columns: Sequence[str], wanted: str | None, defaults: Sequence[str], source: str, what: str
) -> str:
    """The column named `wanted` (exactly, or the only one it is a whitespace-insensitive prefix of),
    or the first of `defaults` present."""
    if wanted is None:
        for name in defaults:
            if name in columns:
                return name
        raise FarmError(
            f"{source}: no {what} column among {', '.join(map(repr, columns))}; expected one of "
            f"{', '.join(map(repr, defaults))} or name it with --{what}"
        )
    if wanted in columns:
        return wanted
    matches = [c for c in columns if _norm(c).startswith(_norm(wanted))]
    if len(matches) == 1:
        return matches[0]
    found = "several" if matches else "no"
    raise FarmError(
        f"{source}: {found} columns match {wanted!r} for --{what}; expected one of {', '.join(map(repr, columns))}"
    )


def read_board(path: str, name: str | None = None, score: str | None = None) -> Board:
    """A leaderboard from farm-winrate JSONL (or a JSON array) or a CSV with a name and a score column.

    Defaults: name `generator`, `Model`, `model`, `name` or the CSV's unnamed first column; score
    `win_rate`. Empty scores leave the model out of this board.
    """
    source = display_name(path)
    stream = open_binary(path)
    try:
        data = stream.read()  # a leaderboard is small: one row per model
    except OSError as exc:
        raise FarmError(f"{source}: cannot read: {exc}") from None
    finally:
        if path != "-":
            stream.close()
    text = decode_text(data, source)
    head = text.lstrip()[:1]
    if path != "-" and (str(path).endswith((".csv", ".csv.gz")) or head not in ("{", "[", "")):
        rows = list(csv.reader(io.StringIO(text)))
        if not rows:
            return Board(source, {})
        header, body = rows[0], rows[1:]
        name_column = pick_column(
            header, name, ["generator", "Model", "model", "name", ""], source, "name"
        )
        score_column = pick_column(header, score, ["win_rate"], source, "score")
        i, j = header.index(name_column), header.index(score_column)
        interval = _interval_reader(header, score_column)
        items = (
            (number, row[i], row[j], interval(dict(zip(header, row, strict=False))))
            for number, row in enumerate(body, start=2)
            if len(row) > max(i, j)
        )
        label, judges = score_column, set()
    else:
        records = []
        for number, record in iter_json_stream(
            io.BufferedReader(io.BytesIO(text.encode())), source
        ):
            problem = problems(record, "leaderboard")
            if problem:
                raise RecordError(source, number, problem)
            records.append((number, record))
        if not records:
            return Board(source, {})
        keys = list(dict.fromkeys(k for _, r in records for k in r))
        name_column = pick_column(keys, name, ["generator"], source, "name")
        score_column = pick_column(keys, score, ["win_rate"], source, "score")
        interval = _interval_reader(keys, score_column)
        items = (
            (number, r.get(name_column), r.get(score_column), interval(r)) for number, r in records
        )
        label, judges = (
            score_column,
            {r["annotator"] for _, r in records if isinstance(r.get("annotator"), str)},
        )
    scores: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for number, model, value, bounds in items:
        if value in (None, ""):
            continue
        try:
            number_value = float(value)
        except (TypeError, ValueError):
            raise RecordError(
                source,
                number,
                f"score {value!r} of {model!r} is not a number; expected a number or nothing",
            ) from None
        if model in scores:
            raise RecordError(
                source, number, f"model {model!r} appears twice; expected one row per model"
            )
        scores[str(model)] = number_value
        if bounds is not None:
            intervals[str(model)] = bounds
    score_name = " ".join(label.split())
    axis_label = f"{board_stem(source)}: {score_name}" + (
        f" ({', '.join(sorted(judges))})" if judges else ""
    )
    return Board(
        f"{Path(source).name}:{score_name}", scores, intervals, axis_label, tuple(sorted(judges))
    )


def board_stem(source: str) -> str:
    """What names a board on an axis: its file name without .gz and its extension, and without
    AlpacaEval's `_leaderboard` suffix."""
    name = Path(source).name.removesuffix(".gz")
    for extension in (".csv", ".jsonl", ".json"):
        name = name.removesuffix(extension)
    return name.removesuffix("_leaderboard") or name


def correlate_boards(x: Board, y: Board) -> dict[str, Any]:
    """Spearman, Kendall, Pearson and R^2 over the models both boards score, with the models missing
    from either side."""
    from scipy import stats

    common = sorted(set(x.scores) & set(y.scores))
    result: dict[str, Any] = {"x": x.label, "y": y.label, "n": len(common)}
    a = [x.scores[m] for m in common]
    b = [y.scores[m] for m in common]
    enough = len(common) >= 3 and len(set(a)) > 1 and len(set(b)) > 1
    for name, function in (
        ("spearman", stats.spearmanr),
        ("kendall", stats.kendalltau),
        ("pearson", stats.pearsonr),
    ):
        if enough:
            outcome = function(a, b)
            result[name], result[f"{name}_p"] = float(outcome.statistic), float(outcome.pvalue)
        else:
            result[name] = result[f"{name}_p"] = None
    result["r2"] = result["pearson"] ** 2 if result["pearson"] is not None else None
    result["missing_from_x"] = sorted(set(y.scores) - set(x.scores))
    result["missing_from_y"] = sorted(set(x.scores) - set(y.scores))
    return result


# ---------------------------------------------------------------- annotation mode


@dataclass
class Pair:
    """The labels given to one pair of outputs, with what is known of the outputs."""

    humans: list[tuple[str, float]] = field(default_factory=list)  # (annotator, label)
    judge: list[tuple[str, int, float]] = field(default_factory=list)  # (judge, run, label)
    length_1: int | None = None
    length_2: int | None = None
    list_1: bool | None = None
    list_2: bool | None = None


class UnparsedLabel(ValueError):
    """A text label that is no verdict (a judge's unparsable answer): counted as no verdict."""


def label_value(value: Any) -> float | None:
    """A preference as 1, 2 or 1.5 (tie, also 0 and 'tie'); None for a missing verdict; UnparsedLabel
    for other text; ValueError for other values."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        if value.strip().lower() == "tie":
            return TIE
        try:
            value = float(value)
        except ValueError:
            raise UnparsedLabel(
                f"label {value!r} is not a number; expected 1, 2, 1.5, 0 or 'tie'"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"label {value!r} is not a number; expected 1, 2, 1.5 or 0 (tie)")
    if value == 0 or value == TIE:
        return TIE
    if not 1 <= value <= 2:
        raise ValueError(f"label {value!r} is outside [1, 2]; expected 1, 2, 1.5 or 0 (tie)")
    return 1.0 if value < TIE else 2.0


def pair_key(record: dict[str, Any], key_field: str | None, outputs: tuple[str, str]) -> Any:
    """The pair a label is about: the --key field, else `pair_id`, else a hash of the texts."""
    if key_field is not None:
        if key_field not in record:
            raise ValueError(f"no field {key_field!r}; expected it to identify the pair (--key)")
        return record[key_field]
    if "pair_id" in record:
        return record["pair_id"]
    texts = [
        record.get("instruction"),
        record.get("input") or "",
        record.get(outputs[0]),
        record.get(outputs[1]),
    ]
    if texts[2] is None or texts[3] is None:
        raise ValueError(
            f"no pair_id and no {outputs[0]}/{outputs[1]}; expected a pair key (--key FIELD) or both outputs"
        )
    return hashlib.sha256("\x00".join(map(str, texts)).encode()).hexdigest()


class Annotations:
    """Labels by pair, from judge files (each file a run; several labels per pair within a file are
    further runs) and human files (long: one label per record with `annotator`; wide: one field per
    annotator)."""

    def __init__(
        self, key_field: str | None = None, outputs: tuple[str, str] = ("output_1", "output_2")
    ):
        self.key_field, self.outputs = key_field, outputs
        self.pairs: dict[Any, Pair] = defaultdict(Pair)
        self.judge_runs = 0  # files and repeats read so far: the next file's first run
        self.runs_of: dict[str, set[int]] = {}  # judge -> its runs, judges in the order first seen
        self.orders: dict[
            tuple[str, str], tuple[list[float], list[float]]
        ] = {}  # (judge, pair) -> labels as given, mirrored
        self.unparsed, self.first_unparsed = 0, ""
        self.costs: dict[str, list[list[float]]] = {}  # judge -> [prices], [seconds] per verdict
        self.missing: dict[
            str, list[Any]
        ] = {}  # label field -> [records without it, the first FILE:LINE]
        self.records_read: Counter = Counter()  # file -> records read from it

    def _note_missing(
        self, record: dict[str, Any], label_fields: Sequence[str], source: str, number: int
    ) -> None:
        for name in label_fields:
            if name not in record:
                self.missing.setdefault(name, [0, f"{source}:{number}"])[0] += 1

    def _note_outputs(self, pair: Pair, record: dict[str, Any]) -> None:
        for position, name in enumerate(self.outputs, start=1):
            text = record.get(name)
            if isinstance(text, str):
                setattr(pair, f"length_{position}", len(text))
                setattr(pair, f"list_{position}", bool(_LIST_LINE.search(text)))
            elif isinstance(record.get(f"len_{position}"), int):
                setattr(pair, f"length_{position}", record[f"len_{position}"])

    def _label(self, value: Any, source: str, number: int) -> float | None:
        try:
            return label_value(value)
        except UnparsedLabel as exc:
            if not self.unparsed:
                self.first_unparsed = f"{source}:{number}: {exc}"
            self.unparsed += 1
            return None

    def _records(self, path: str) -> Iterable[tuple[str, int, dict[str, Any]]]:
        source = display_name(path)
        for number, record in iter_json(path):
            if not isinstance(record, dict):
                raise RecordError(
                    source,
                    number,
                    f"a {type(record).__name__} is not a record; expected a JSON object",
                )
            self.records_read[source] += 1
            yield source, number, record

    def judge_labels(self) -> int:
        """How many judge labels were read (a verdict, not a record left out)."""
        return sum(len(pair.judge) for pair in self.pairs.values())

    def require_judge_labels(self, paths: Sequence[str], label_field: str) -> None:
        """Refuse judge files that gave no usable label: every record skipped is not a result."""
        if self.judge_labels():
            return
        names = [display_name(path) for path in paths]
        read = sum(self.records_read[name] for name in names)
        missing = self.missing.get(label_field, [0])[0]
        raise FarmError(
            f"no usable judge label in {', '.join(names)}: {read} records read, {missing} without "
            f"the {label_field!r} field, {self.unparsed} no verdict; expected labels 1, 2 or 1.5 "
            "(name the field with --judge-label)"
        )

    def add_judge(self, path: str, label_field: str = "preference") -> None:
        first_run = self.judge_runs
        seen: Counter = Counter()
        for source, number, record in self._records(path):
            try:
                key = pair_key(record, self.key_field, self.outputs)
                label = self._label(record.get(label_field), source, number)
            except ValueError as exc:
                raise RecordError(source, number, str(exc)) from None
            self._note_missing(record, (label_field,), source, number)
            pair = self.pairs[key]
            self._note_outputs(pair, record)
            name = str(record.get("annotator", Path(source).stem))
            run = first_run + seen[key]
            seen[key] += 1
            self.runs_of.setdefault(name, set()).add(run)
            if label is not None:
                pair.judge.append((name, run, label))
                self._note_order(name, record, label)
            self._note_cost(name, record)
        self.judge_runs = first_run + max(seen.values(), default=0)

    def _note_cost(self, judge: str, record: dict[str, Any]) -> None:
        """A verdict's price and seconds: farm-annotate's provenance, else AlpacaEval's fields."""
        given = (record.get("provenance") or {}).get("farm-annotate") or {}
        prices, seconds = self.costs.setdefault(judge, [[], []])
        for found, values in (
            (given.get("price", record.get("price_per_example")), prices),
            (given.get("time", record.get("time_per_example")), seconds),
        ):
            if isinstance(found, (int, float)) and not isinstance(found, bool):
                values.append(float(found))

    def _note_order(self, judge: str, record: dict[str, Any], label: float) -> None:
        """File the label under the pair whatever its order, for the flip rate."""
        first, second = (record.get(name) for name in self.outputs)
        if not isinstance(first, str) or not isinstance(second, str) or first == second:
            return
        swapped = first > second
        texts = [record.get("instruction"), record.get("input") or "", *sorted((first, second))]
        key = hashlib.sha256("\x00".join(map(str, texts)).encode()).hexdigest()
        self.orders.setdefault((judge, key), ([], []))[swapped].append(
            _mirror(label) if swapped else label
        )

    def add_humans(self, path: str, label_fields: Sequence[str] = ("preference",)) -> None:
        wide = len(label_fields) > 1
        for source, number, record in self._records(path):
            try:
                key = pair_key(record, self.key_field, self.outputs)
                labels = [
                    (
                        name if wide else str(record.get("annotator", f"{source}:{number}")),
                        self._label(record.get(name), source, number),
                    )
                    for name in label_fields
                ]
            except ValueError as exc:
                raise RecordError(source, number, str(exc)) from None
            self._note_missing(record, label_fields, source, number)
            pair = self.pairs[key]
            self._note_outputs(pair, record)
            pair.humans.extend((name, label) for name, label in labels if label is not None)


def _per_1000(values: list[float]) -> float | None:
    return 1000 * sum(values) / len(values) if values else None


def _mirror(label: float) -> float:
    return 3.0 - label


def modes(labels: Sequence[float]) -> list[float]:
    counts = Counter(labels)
    top = max(counts.values())
    return [label for label, count in counts.items() if count == top]


def agreement(label: float, others: Sequence[float]) -> float:
    """Expected agreement of `label` with the mode of `others` (a tied mode drawn at random)."""
    top = modes(others)
    return (label in top) / len(top)


def half_tie_agreement(label: float, humans: Sequence[float]) -> float:
    """AlpacaEval's agreement of `label` with the mode of `humans` (a tied mode drawn at random): 1 if
    equal, 1/2 if one of the two is a tie, else 0."""
    top = modes(humans)
    return math.fsum(
        1.0 if label == mode else 0.5 if TIE in (label, mode) else 0.0 for mode in top
    ) / len(top)


def _mode_agreement(a: Sequence[float], b: Sequence[float]) -> float:
    top_a, top_b = modes(a), modes(b)
    return len(set(top_a) & set(top_b)) / (len(top_a) * len(top_b))


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _preferences(
    pairs: Iterable[Pair], labels_of, min_length_difference: int
) -> dict[str, float | None]:
    longer, lists, first = [], [], []
    for pair in pairs:
        for label in labels_of(pair):
            if label == TIE:
                continue
            first.append(float(label == 1.0))
            if (
                pair.length_1 is not None
                and pair.length_2 is not None
                and abs(pair.length_1 - pair.length_2) > min_length_difference
            ):
                longer.append(float((label == 2.0) == (pair.length_2 > pair.length_1)))
            if pair.list_1 is not None and pair.list_2 is not None and pair.list_1 != pair.list_2:
                lists.append(float((label == 2.0) == pair.list_2))
    return {
        "p_prefers_longer": _mean(longer),
        "p_prefers_lists": _mean(lists),
        "p_prefers_first": _mean(first),
    }


def kappa(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Cohen's kappa of two annotators' labels on the same items."""
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    count_a, count_b = Counter(a), Counter(b)
    expected = sum(count_a[c] * count_b[c] for c in set(a) | set(b)) / (n * n)
    return None if expected == 1 else (observed - expected) / (1 - expected)


def _label_name(label: float) -> str:
    return {1.0: "1", 2.0: "2", TIE: "tie"}[label]


def human_summary(
    annotations: Annotations, min_length_difference: int = 30
) -> dict[str, Any] | None:
    pairs = [p for p in annotations.pairs.values() if p.humans]
    if not pairs:
        return None
    loo = [
        agreement(label, [x for j, (_, x) in enumerate(p.humans) if j != i])
        for p in pairs
        if len(p.humans) > 1
        for i, (_, label) in enumerate(p.humans)
    ]
    majority: Counter = Counter()
    for p in pairs:
        top = modes([label for _, label in p.humans])
        majority[_label_name(top[0]) if len(top) == 1 else "none"] += 1
    by_annotator: dict[str, dict[Any, float]] = defaultdict(dict)
    for key, p in annotations.pairs.items():
        for name, label in p.humans:
            by_annotator[name][key] = label
    kappas = {}
    if len(by_annotator) <= 20:  # wide human files: a handful of named annotators
        for first, second in itertools.combinations(sorted(by_annotator), 2):
            shared = sorted(set(by_annotator[first]) & set(by_annotator[second]), key=repr)
            kappas[f"{first}|{second}"] = kappa(
                [by_annotator[first][k] for k in shared], [by_annotator[second][k] for k in shared]
            )
    return {
        "annotator": "humans",
        "n_pairs": len(pairs),
        "n_labels": sum(len(p.humans) for p in pairs),
        "human_agreement": _mean(loo),
        "human_agreement_alpacaeval": None,
        "flip_rate": None,
        "price_per_1000": None,
        "seconds_per_1000": None,
        **_preferences(pairs, lambda p: [label for _, label in p.humans], min_length_difference),
        "majority_labels": dict(sorted(majority.items())),
        "cohen_kappa": kappas,
    }


def judge_summaries(
    annotations: Annotations, min_length_difference: int = 30
) -> list[dict[str, Any]]:
    """One row per judge, in the order the judges were first read."""
    rows = [judge_summary(annotations, name, min_length_difference) for name in annotations.runs_of]
    return [row for row in rows if row is not None]


def judge_summary(
    annotations: Annotations, name: str, min_length_difference: int = 30
) -> dict[str, Any] | None:
    labelled = {
        key: [(run, label) for judge, run, label in p.judge if judge == name]
        for key, p in annotations.pairs.items()
    }
    pairs = [(annotations.pairs[key], labels) for key, labels in labelled.items() if labels]
    if not pairs:
        return None
    against_humans, half_ties, bias = [], [], []
    for p, labels in pairs:
        runs = [label for _, label in labels]
        humans = [label for _, label in p.humans]
        if len(humans) == 1:
            against_humans.extend(agreement(run, humans) for run in runs)
        elif len(humans) > 1:
            for i in range(len(humans)):
                others = humans[:i] + humans[i + 1 :]
                against_humans.extend(agreement(run, others) for run in runs)
        if humans:
            half_ties.extend(half_tie_agreement(run, humans) for run in runs)
            bias.append(1 - _mode_agreement(runs, humans))
    # variance is a mean over runs: average each run's disagreements over its pairs first
    per_run: dict[int, list[float]] = defaultdict(list)
    for _, labels in pairs:
        if len(labels) > 1:
            for i, (run, label) in enumerate(labels):
                per_run[run].append(
                    1 - agreement(label, [x for j, (_, x) in enumerate(labels) if j != i])
                )
    flips = [
        float(a != b)
        for (judge, _), (given, mirrored) in annotations.orders.items()
        if judge == name
        for a in given
        for b in mirrored
    ]
    return {
        "annotator": name,
        "n_pairs": len(pairs),
        "n_runs": len(annotations.runs_of[name]),
        "human_agreement": _mean(against_humans),
        "human_agreement_alpacaeval": _mean(half_ties),
        "flip_rate": _mean(flips),
        "price_per_1000": _per_1000(annotations.costs.get(name, [[], []])[0]),
        "seconds_per_1000": _per_1000(annotations.costs.get(name, [[], []])[1]),
        "bias": _mean(bias),
        "variance": _mean([_mean(v) for v in per_run.values()]) if per_run else None,
        **_preferences(
            [p for p, _ in pairs],
            lambda p: [label for judge, _, label in p.judge if judge == name],
            min_length_difference,
        ),
    }


# AlpacaEval's evaluators leaderboard (evaluators/evaluators_leaderboard.csv): its columns in its
# order, each with the field of an annotation-mode row and the factor it is shown at
ALPACA_EVAL_EVALUATORS = (
    ("Human agreement", "human_agreement_alpacaeval", 100),
    ("Price [$/1000 examples]", "price_per_1000", 1),
    ("Time [seconds/1000 examples]", "seconds_per_1000", 1),
    ("Spearman corr.", "spearman", 1),
    ("Pearson corr.", "pearson", 1),
    ("Bias", "bias", 100),
    ("Variance", "variance", 100),
    ("Proba. prefer longer", "p_prefers_longer", 1),
    ("Proba. prefer lists", "p_prefers_lists", 1),
    ("Proba. prefer 1", "p_prefers_first", 1),
    ("# parsed", "n_parsed", 1),
    ("mode", "mode", 1),
)


def alpaca_eval_evaluators(
    rows: Sequence[dict[str, Any]],
    annotations: Annotations,
    human_board: Board | None = None,
    judge_boards: dict[str, Board] | None = None,
) -> list[dict[str, Any]]:
    """Annotation-mode rows as AlpacaEval's evaluators leaderboard rows (keyed by its column names,
    the annotator under ""): percent where it uses percent, # parsed, and the rank and linear
    correlation of each judge's leaderboard (`judge_boards`, by judge name) with `human_board`."""
    judge_boards = judge_boards or {}
    table = []
    for row in rows:
        name = row["annotator"]
        people = name == "humans" and name not in annotations.runs_of
        fields = dict(row)
        if people:
            fields["human_agreement_alpacaeval"] = row["human_agreement"]
            fields["n_parsed"] = row["n_labels"]
        else:
            fields["n_parsed"] = sum(
                1
                for pair in annotations.pairs.values()
                for judge, _, _ in pair.judge
                if judge == name
            )
        if human_board is not None and people:
            fields["spearman"] = fields["pearson"] = 1.0
        elif human_board is not None and name in judge_boards:
            correlation = correlate_boards(judge_boards[name], human_board)
            fields["spearman"], fields["pearson"] = correlation["spearman"], correlation["pearson"]
        fields["mode"] = row.get("mode") or "community"
        entry: dict[str, Any] = {"": name}
        for column, field_name, factor in ALPACA_EVAL_EVALUATORS:
            value = fields.get(field_name)
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            entry[column] = value * factor if numeric and factor != 1 else value
        table.append(entry)
    return table
