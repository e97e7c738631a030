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
  share choosing the longer output / the output with a list / output_1. A list is a line that starts
  with a bullet or a number (`contains_list`); the alpaca-eval format's "Proba. prefer lists" uses
  AlpacaEval's looser detector instead (`alpaca_eval_contains_list`), as its leaderboard does. The 30 characters are
  AlpacaEval's: its evaluators' leaderboard counts P(prefers longer) over 445 of the 648
  cross-annotated pairs, exactly those whose outputs differ by more than 30 characters.
- AlpacaEval's evaluators table (`alpaca_eval_evaluators`): Human agreement = 100 x
  human_agreement_alpacaeval (for the humans: 100 x their leave-one-out human_agreement), Bias and
  Variance x 100, price and time per 1,000 as above, the three preferences as fractions, # parsed =
  the labels that are a verdict (over all runs), and Spearman / Pearson between the judge's
  leaderboard and the human one (1 for the humans).

Agreement as AlpacaFarm reports it, on the overlap: the pairs that two humans or more labelled (its
650 cross-annotated pairs). Every figure has a 95% percentile bootstrap interval (`_ci`, low and high)
over --bootstrap resamples of the overlap's pairs, drawn once (--seed) and shared by all figures.
- pairwise_agreement: mean over pairs of the share of its pairs of human labels that are equal (a tie
  a label like the others): Fleiss' observed agreement.
- fleiss_kappa: (P - P_e) / (1 - P_e), P that mean, P_e the sum of the squared shares of the labels
  1, tie and 2 among all the overlap's labels. Pairs may have different numbers of labels
  (labels_per_pair gives the fewest and the most): each pair's agreement is over its own label
  pairs and the shares pool every label, which is Fleiss' (1971) kappa when the numbers are equal.
- annotator_pair_agreement / cohen_kappa: between every two named annotators, on the pairs both
  labelled: the share of equal labels, and (p_o - p_e) / (1 - p_e) with p_e from each one's shares
  of the three labels. Left out, like the rows per human, above 20 annotators (crowd labels, where
  two annotators rarely share a pair).
- held_out_agreement of a human (a row per named annotator, role "human"): the agreement of their
  labels with the mode of the others' on the same pair, over the overlap pairs they labelled (the
  paper's held-out human). The humans row's human_agreement is the same over every human.
- held_out_agreement of a judge: the same held-out protocol on the overlap pairs it labelled (mean
  over held-out humans and runs of the agreement of its label with the mode of the other humans),
  so that a judge and a human are measured against majorities of the same size; n_overlap pairs.
- The alternative annotator test (Calderon, Reichart and Dror, ACL 2025), on the pairs that three
  humans or more labelled. For human j and such a pair, the alignment of a labeller with the other
  humans is the share of their labels it equals (averaged over the judge's runs). The judge wins the
  pair against j when its alignment is at least j's, j wins it when j's is at least the judge's
  (both, on a draw). Per human, a one-sided paired t-test of the mean of (j wins - judge wins) being
  below epsilon: epsilon is the cost-benefit margin granted to the judge for being cheaper and
  faster (the paper suggests 0.2 for experts, 0.15 for skilled annotators, 0.1 for crowd workers;
  0.15 by default here: a team's own trained annotators are skilled rather than expert). The
  p-values over humans go through the Benjamini-Yekutieli procedure at a false discovery rate of
  0.05 (the paper's); alt_test_winning_rate (omega) is the share of humans whose null is rejected
  (the judge beats them), alt_test_pass is omega >= 0.5, and alt_test_advantage (rho) is the mean
  over humans of the share of their pairs the judge wins. Humans with fewer than two such pairs are
  left out; with fewer than three humans left the test is null and alt_test_note says why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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
from farmkit.core.values import FRACTION, NON_NEGATIVE
from farmkit.evaluate.boards import BOARD_FORMATS, markdown_text
from farmkit.train.config import shared_field

TIE = 1.5
LABEL_CODES = {1.0: 0, TIE: 1, 2.0: 2}  # a label's column in a table of counts
CONFIDENCE = 0.95  # of the bootstrap intervals
MAX_NAMED_ANNOTATORS = 20  # more: crowd labels, where two annotators rarely share a pair
ALT_TEST_FDR = 0.05  # the alternative annotator test's false discovery rate (the paper's)
ALT_TEST_FIELDS = (
    "pass",
    "winning_rate",
    "advantage",
    "advantage_ci",
    "epsilon",
    "humans",
    "pairs",
    "p_values",
    "note",
)
ANNOTATOR_PAIR_FIELDS = (
    "annotator_pair_agreement",
    "annotator_pair_agreement_ci",
    "cohen_kappa",
    "cohen_kappa_ci",
)
_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+\S", re.MULTILINE)


def contains_list(text: str) -> bool:
    """Whether a line of `text` starts with a bullet (-, *, \u2022) or a number and '.' or ')', then a
    space: farm-correlate's own list detector, stricter than AlpacaEval's (alpaca_eval_contains_list)."""
    return bool(_LIST_LINE.search(text))


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
    include_screened: bool = shared_field("include_screened", False)
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
    bootstrap: int = help_field(
        1000,
        "Annotation mode: 95% intervals of the agreement figures from N bootstrap resamples of the "
        "pairs two humans or more labelled (0: none; --seed sets the draw).",
        bounds=NON_NEGATIVE,
        metavar="N",
    )
    epsilon: float = help_field(
        0.15,
        "Annotation mode: the alternative annotator test's margin, what a judge is let off for being "
        "cheaper and faster. Calderon et al. (2025) suggest 0.2 for experts, 0.15 for skilled "
        "annotators (a team's own, trained), 0.1 for crowd workers.",
        bounds=FRACTION,
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
    annotator). list_detector: whether an output holds a list, for p_prefers_lists (default
    `contains_list`, a line that starts with a bullet or a number; AlpacaEval's evaluators table
    uses `alpaca_eval_contains_list`)."""

    def __init__(
        self,
        key_field: str | None = None,
        outputs: tuple[str, str] = ("output_1", "output_2"),
        list_detector: Callable[[str], bool] | None = None,
    ):
        self.key_field, self.outputs = key_field, outputs
        self.list_detector = list_detector or contains_list
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
        self._human_labelled: dict[tuple[Any, str], str] = {}  # (pair, human) -> first FILE:LINE
        # human -> [labels repeating their label of a pair, the first such FILE:LINE, the label's]
        self.repeated: dict[str, list[Any]] = {}
        self.screened: dict[str, int] = {}  # annotator -> their screened-out labels left out

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
                setattr(pair, f"list_{position}", self.list_detector(text))
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

    def add_humans(
        self, path: str, label_fields: Sequence[str] = ("preference",), include_screened=False
    ) -> None:
        """Human labels; a record marked screened_out (farm-label --min-check-score) is left out
        and counted in `screened` (per annotator) unless `include_screened`."""
        wide = len(label_fields) > 1
        for source, number, record in self._records(path):
            if not include_screened and record.get("screened_out") is True:
                name = str(record.get("annotator", f"{source}:{number}"))
                self.screened[name] = self.screened.get(name, 0) + 1
                continue
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
            for name, label in labels:
                if label is None:
                    continue
                first = self._human_labelled.setdefault((key, name), f"{source}:{number}")
                if first != f"{source}:{number}":  # one human's label again: never agreement
                    self.repeated.setdefault(name, [0, f"{source}:{number}", first])[0] += 1
                    continue
                pair.humans.append((name, label))


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


# AlpacaEval's list detector (its utils.contains_list): a bullet or star, a number or a letter
# followed by '.' or ')', or a dash, then (after optional spaces) a word character. It is loose (a
# sentence ending in a letter and a full stop followed by another word matches): the evaluators'
# leaderboard's "Proba. prefer lists" counts the 111 of its 648 pairs where exactly one output matches.
_ALPACA_EVAL_LIST = re.compile(r"[\u2022*]\s*\w|\d+[.)]\s*\w|[a-zA-Z][.)]\s*\w|-\s*\w")


def alpaca_eval_contains_list(text: str) -> bool:
    """Whether AlpacaEval's evaluators' leaderboard counts `text` as holding a list."""
    return bool(_ALPACA_EVAL_LIST.search(text))


def alpaca_eval_preferences(
    verdicts: Iterable[tuple[str, str, float | None]], min_length_difference: int = 30
) -> list[tuple[float | None, float | None, float | None]]:
    """Per verdict (output_1, output_2, preference), as AlpacaEval's evaluators' leaderboard counts it
    (its analyze.py): (prefers longer, prefers lists, prefers 1). Its "best" output is output_1 when the
    preference is in [1, 1.5), output_2 when it is in (1.5, 2] (an exact tie has no best output and
    counts in neither of the first two figures); prefers longer is 1 or 0 where
    the two outputs' lengths (characters) differ by more than `min_length_difference`, else None;
    prefers lists is 1 or 0 where exactly one output holds a list (alpaca_eval_contains_list), else
    None; prefers 1 is 2 - preference (a tie 1/2). A verdict without a preference gives (None, None,
    None). AlpacaEval keeps the first verdict of each pair (instruction, output_1, output_2) for the
    first two figures and every verdict for the third: the caller picks the verdicts."""
    found = []
    for first, second, preference in verdicts:
        if preference is None:
            found.append((None, None, None))
            continue
        if preference == TIE:
            found.append((None, None, 0.5))
            continue
        best, worse = (first, second) if preference < TIE else (second, first)
        longer = (
            float(len(best) > len(worse))
            if abs(len(best) - len(worse)) > min_length_difference
            else None
        )
        best_list, worse_list = alpaca_eval_contains_list(best), alpaca_eval_contains_list(worse)
        lists = float(best_list) if best_list != worse_list else None
        found.append((longer, lists, 2.0 - preference))
    return found


def resample_weights(n: int, resamples: int, seed: int = 0) -> np.ndarray:
    """(resamples x n) counts: how often each of n items is drawn in each bootstrap resample (n
    draws with replacement), so that a sum over the items of a resample is `weights @ values`."""
    if not n:
        return np.zeros((resamples, 0), dtype=np.int64)
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)


def interval(draws: np.ndarray) -> list[float] | None:
    """The central 95% of the finite bootstrap draws of a figure (None when there are none)."""
    finite = np.asarray(draws, float)
    finite = finite[np.isfinite(finite)]
    if not finite.size:
        return None
    tail = (1 - CONFIDENCE) / 2 * 100
    return [float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))]


def _batch(weights: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones((1, n)) if weights is None else np.asarray(weights, float)


def _kappa(observed: np.ndarray, expected: np.ndarray, weights: np.ndarray | None) -> Any:
    """(p_o - p_e) / (1 - p_e), undefined (nan, or None for one value) where p_e is 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (observed - expected) / (1 - expected)
    value[np.isclose(expected, 1) | ~np.isfinite(value)] = np.nan
    if weights is not None:
        return value
    return None if math.isnan(value[0]) else float(value[0])


def cohen_kappa(
    first: Sequence[Any], second: Sequence[Any], weights: np.ndarray | None = None
) -> Any:
    """Cohen's kappa of two annotators' labels on the same items (None if undefined); with
    `weights` (resample_weights), one kappa per resample (nan if undefined)."""
    a, b = np.asarray(first), np.asarray(second)
    categories = np.union1d(a, b)
    batch = _batch(weights, len(a))
    with np.errstate(divide="ignore", invalid="ignore"):
        total = batch.sum(axis=1)
        observed = (batch @ (a == b)) / total
        shares_a = (batch @ (a[:, None] == categories)) / total[:, None]
        shares_b = (batch @ (b[:, None] == categories)) / total[:, None]
    return _kappa(observed, (shares_a * shares_b).sum(axis=1), weights)


def fleiss_kappa(counts: Sequence[Sequence[float]], weights: np.ndarray | None = None) -> Any:
    """Fleiss' kappa of a table of counts (items x categories: how many ratings put the item in
    the category), every item rated twice or more; with `weights`, one kappa per resample.

    Items may have different numbers of ratings: each item's agreement is over its own pairs of
    ratings and the category shares pool every rating, which is Fleiss' (1971) kappa when every
    item has the same number."""
    table = np.asarray(counts, float)
    ratings = table.sum(axis=1)
    if (ratings < 2).any():
        raise ValueError("Fleiss' kappa needs two ratings or more of every item")
    batch = _batch(weights, len(table))
    per_item = (table * (table - 1)).sum(axis=1) / (ratings * (ratings - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        observed = (batch @ per_item) / batch.sum(axis=1)
        shares = (batch @ table) / (batch @ ratings)[:, None]
    return _kappa(observed, (shares**2).sum(axis=1), weights)


def _label_name(label: float) -> str:
    return {1.0: "1", 2.0: "2", TIE: "tie"}[label]


def human_summary(
    annotations: Annotations, overlap: Overlap, min_length_difference: int = 30
) -> dict[str, Any] | None:
    pairs = [p for p in annotations.pairs.values() if p.humans]
    if not pairs:
        return None
    majority: Counter = Counter()
    for p in pairs:
        top = modes([label for _, label in p.humans])
        majority[_label_name(top[0]) if len(top) == 1 else "none"] += 1
    agreement_all, agreement_ci = overlap.held_out_humans()
    return {
        "annotator": "humans",
        "n_pairs": len(pairs),
        "n_labels": sum(len(p.humans) for p in pairs),
        "human_agreement": agreement_all,
        "human_agreement_ci": agreement_ci,
        "human_agreement_alpacaeval": None,
        "flip_rate": None,
        "price_per_1000": None,
        "seconds_per_1000": None,
        **_preferences(pairs, lambda p: [label for _, label in p.humans], min_length_difference),
        "majority_labels": dict(sorted(majority.items())),
        **overlap.inter_annotator(),
    }


def held_out(runs: Sequence[float], humans: Sequence[float]) -> list[float]:
    """AlpacaFarm's agreement of each run's label with the mode of the humans but one, for each
    human held out (the one human label itself where there is only one)."""
    if len(humans) == 1:
        return [agreement(run, humans) for run in runs]
    return [
        agreement(run, [*humans[:i], *humans[i + 1 :]]) for i in range(len(humans)) for run in runs
    ]


class Overlap:
    """The pairs that two humans or more labelled (AlpacaFarm's cross-annotated set), the
    agreement figures on them, and their bootstrap intervals over `resamples` resamples of those
    pairs (none when 0)."""

    def __init__(self, annotations: Annotations, resamples: int = 1000, seed: int = 0):
        self.pairs = [p for p in annotations.pairs.values() if len(p.humans) > 1]
        self.weights = resample_weights(len(self.pairs), resamples, seed) if resamples else None
        # one label per annotator and pair (the last given), for the figures between annotators
        self.labels: dict[str, dict[int, float]] = defaultdict(dict)
        for i, pair in enumerate(self.pairs):
            for name, label in pair.humans:
                self.labels[name][i] = label
        self.named = len(self.labels) <= MAX_NAMED_ANNOTATORS

    def figure(
        self, numerators: Sequence[float], denominators: Sequence[float]
    ) -> tuple[float | None, list[float] | None]:
        """A ratio of sums over the pairs, and its interval: the same ratio over each resample."""
        top, bottom = np.asarray(numerators, float), np.asarray(denominators, float)
        if not bottom.sum():
            return None, None
        if self.weights is None:
            return float(top.sum() / bottom.sum()), None
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = (self.weights @ top) / (self.weights @ bottom)
        return float(top.sum() / bottom.sum()), interval(draws)

    def _held_out_sums(self, names: Iterable[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per pair: the sum and the count of the held-out agreements of the humans in `names`
        (all when None) with the mode of the others."""
        sums, counts = np.zeros(len(self.pairs)), np.zeros(len(self.pairs))
        wanted = None if names is None else set(names)
        for i, pair in enumerate(self.pairs):
            labels = [label for _, label in pair.humans]
            for k, (name, label) in enumerate(pair.humans):
                if wanted is None or name in wanted:
                    sums[i] += agreement(label, [*labels[:k], *labels[k + 1 :]])
                    counts[i] += 1
        return sums, counts

    def held_out_humans(self) -> tuple[float | None, list[float] | None]:
        """The humans' leave-one-out agreement (each human against the mode of the others)."""
        return self.figure(*self._held_out_sums())

    def individuals(self) -> list[dict[str, Any]]:
        """One row per named human: agreement with the mode of the others on the overlap."""
        if not self.named:
            return []
        rows = []
        for name in sorted(self.labels):
            value, bounds = self.figure(*self._held_out_sums([name]))
            rows.append(
                {
                    "annotator": name,
                    "n_pairs": len(self.labels[name]),
                    "held_out_agreement": value,
                    "held_out_agreement_ci": bounds,
                }
            )
        return rows

    def inter_annotator(self) -> dict[str, Any]:
        """Pairwise agreement and Fleiss' kappa over the overlap, and between every two named
        annotators their agreement and Cohen's kappa on the pairs both labelled."""
        if not self.pairs:
            return {}
        counts = np.zeros((len(self.pairs), len(LABEL_CODES)))
        for i, pair in enumerate(self.pairs):
            for _, label in pair.humans:
                counts[i, LABEL_CODES[label]] += 1
        ratings = counts.sum(axis=1)
        shares = (counts * (counts - 1)).sum(axis=1) / (ratings * (ratings - 1))
        pairwise, pairwise_ci = self.figure(shares, np.ones(len(self.pairs)))
        fields: dict[str, Any] = {
            "pairwise_agreement": pairwise,
            "pairwise_agreement_ci": pairwise_ci,
            "fleiss_kappa": fleiss_kappa(counts),
            "fleiss_kappa_ci": None
            if self.weights is None
            else interval(fleiss_kappa(counts, self.weights)),
            "labels_per_pair": [int(ratings.min()), int(ratings.max())],
        }
        if not self.named:  # crowd labels: pairs rarely share annotators
            return fields
        by_pair: dict[str, dict[str, Any]] = defaultdict(dict)
        for first, second in itertools.combinations(sorted(self.labels), 2):
            shared = sorted(set(self.labels[first]) & set(self.labels[second]))
            a = [self.labels[first][i] for i in shared]
            b = [self.labels[second][i] for i in shared]
            name = f"{first}|{second}"
            agree = np.zeros(len(self.pairs))
            agree[shared] = np.equal(a, b)
            present = np.zeros(len(self.pairs))
            present[shared] = 1
            value, bounds = self.figure(agree, present)
            by_pair["annotator_pair_agreement"][name] = value
            by_pair["annotator_pair_agreement_ci"][name] = bounds
            by_pair["cohen_kappa"][name] = cohen_kappa(a, b)
            by_pair["cohen_kappa_ci"][name] = (
                None
                if self.weights is None
                else interval(cohen_kappa(a, b, self.weights[:, shared]))
            )
        return {**fields, **{key: by_pair[key] for key in ANNOTATOR_PAIR_FIELDS}}

    def judge(self, name: str, epsilon: float) -> dict[str, Any]:
        """A judge against the humans on the overlap: AlpacaFarm's held-out agreement (as each
        human's, so that the two compare) and the alternative annotator test."""
        runs = [[label for judge, _, label in pair.judge if judge == name] for pair in self.pairs]
        sums, counts = np.zeros(len(self.pairs)), np.zeros(len(self.pairs))
        for i, pair in enumerate(self.pairs):
            if runs[i]:
                scores = held_out(runs[i], [label for _, label in pair.humans])
                sums[i], counts[i] = math.fsum(scores), len(scores)
        value, bounds = self.figure(sums, counts)
        test = alt_test(self.labels, runs, epsilon, self.weights)
        return {
            "n_overlap": sum(1 for labels in runs if labels),
            "held_out_agreement": value,
            "held_out_agreement_ci": bounds,
            **{f"alt_test_{key}": test[key] for key in ALT_TEST_FIELDS},
        }


def alt_test(
    humans: dict[str, Sequence[float | None] | dict[int, float]],
    judge: Sequence[Sequence[float]],
    epsilon: float = 0.15,
    weights: np.ndarray | None = None,
) -> dict[str, Any]:
    """The alternative annotator test (definitions in the module's docstring) of a judge whose
    runs' labels of pair i are judge[i] against humans[name][i] (a list with None where a human
    did not label, or a dict by pair index), on the pairs with three human labels or more;
    `weights` (resample_weights over the pairs) give the advantage probability an interval."""
    from scipy import stats

    by_pair: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for name, labels in humans.items():
        for i, label in labels.items() if isinstance(labels, dict) else enumerate(labels):
            if label is not None:
                by_pair[i].append((name, label))
    rows: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for i, runs in enumerate(judge):
        labelled = by_pair.get(i, [])
        if not runs or len(labelled) < 3:
            continue
        for k, (name, label) in enumerate(labelled):
            others = [other for _, other in labelled[:k] + labelled[k + 1 :]]
            human_score = np.mean([label == other for other in others])
            judge_score = np.mean([np.mean([run == other for other in others]) for run in runs])
            rows[name].append((i, human_score, judge_score))
    compared: dict[str, tuple[list[int], np.ndarray, np.ndarray]] = {}
    for name in sorted(rows):
        if len(rows[name]) >= 2:
            index, human_scores, judge_scores = zip(*rows[name], strict=True)
            compared[name] = (list(index), np.array(human_scores), np.array(judge_scores))
    result: dict[str, Any] = dict.fromkeys(ALT_TEST_FIELDS)
    result["epsilon"] = epsilon
    if len(compared) < 3:
        result["note"] = (
            f"the alternative annotator test needs three humans or more, each with two or more "
            f"pairs that three humans or more labelled; found {len(compared)}"
        )
        return result
    p_values, advantages = {}, {}
    for name, (_, human_scores, judge_scores) in compared.items():
        judge_wins = judge_scores >= human_scores
        difference = (human_scores >= judge_scores).astype(float) - judge_wins
        spread = difference.std(ddof=1)
        if spread == 0:  # every pair the same: the mean is exact
            p_values[name] = 0.0 if difference.mean() < epsilon else 1.0
        else:
            t = (difference.mean() - epsilon) / (spread / math.sqrt(len(difference)))
            p_values[name] = float(stats.t.cdf(t, len(difference) - 1))
        advantages[name] = judge_wins
    beaten = benjamini_yekutieli(list(p_values.values()), ALT_TEST_FDR)
    result.update(
        winning_rate=len(beaten) / len(compared),
        advantage=float(np.mean([wins.mean() for wins in advantages.values()])),
        humans=len(compared),
        pairs=len({i for index, _, _ in compared.values() for i in index}),
        p_values=p_values,
    )
    result["pass"] = result["winning_rate"] >= 0.5
    if weights is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            per_human = [
                (weights[:, index] @ advantages[name]) / weights[:, index].sum(axis=1)
                for name, (index, _, _) in compared.items()
            ]
        draws = np.array(per_human)
        finite = np.isfinite(draws)
        with np.errstate(divide="ignore", invalid="ignore"):
            means = np.where(finite, draws, 0).sum(axis=0) / finite.sum(axis=0)
        result["advantage_ci"] = interval(means)
    return result


def benjamini_yekutieli(p_values: Sequence[float], rate: float) -> list[int]:
    """The indices of the hypotheses rejected by the Benjamini-Yekutieli step-up procedure at
    false discovery rate `rate` (valid under any dependence between the tests)."""
    count = len(p_values)
    if not count:
        return []
    order = np.argsort(p_values, kind="stable")
    harmonic = math.fsum(1 / k for k in range(1, count + 1))
    thresholds = np.arange(1, count + 1) * rate / (count * harmonic)
    below = np.nonzero(np.asarray(p_values)[order] <= thresholds)[0]
    return sorted(order[: below[-1] + 1].tolist()) if below.size else []


def annotation_rows(
    annotations: Annotations,
    min_length_difference: int = 30,
    resamples: int = 1000,
    seed: int = 0,
    epsilon: float = 0.15,
) -> list[dict[str, Any]]:
    """Annotation mode's rows: one per judge, one per named human of the overlap, and the humans'
    own (role: judge, human, humans)."""
    overlap = Overlap(annotations, resamples, seed)
    rows = [
        {**row, **overlap.judge(row["annotator"], epsilon), "role": "judge"}
        for row in judge_summaries(annotations, min_length_difference)
    ]
    people = human_summary(annotations, overlap, min_length_difference)
    if people is not None:
        rows += [{**row, "role": "human"} for row in overlap.individuals()]
        rows.append({**people, "role": "humans"})
    return rows


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
        if humans:
            against_humans.extend(held_out(runs, humans))
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


def _figure(value: float | None, bounds: list[float] | None = None) -> str:
    """A figure to two decimals with its interval in brackets, as a paper prints it."""
    if value is None:
        return ""
    return f"{value:.2f}" + (f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "")


def annotation_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Annotation mode's rows as markdown: the judges' statistics, then, where humans labelled
    pairs in common, the agreement table (each judge and human against the humans' majority, the
    alternative annotator test) and the agreement between the humans, with their 95% intervals."""
    agreement_fields = {"n_overlap", "held_out_agreement", "held_out_agreement_ci", "role"}
    agreement_fields |= {f"alt_test_{key}" for key in ALT_TEST_FIELDS}
    agreement_fields |= {"human_agreement_ci", "pairwise_agreement", "pairwise_agreement_ci"}
    agreement_fields |= {"fleiss_kappa", "fleiss_kappa_ci", "labels_per_pair"}
    agreement_fields |= set(ANNOTATOR_PAIR_FIELDS)
    statistics = [
        {key: value for key, value in row.items() if key not in agreement_fields}
        for row in rows
        if row.get("role") != "human"
    ]
    text = markdown_text(statistics)
    people = next((row for row in rows if row.get("role") == "humans"), None)
    if people is None or people.get("pairwise_agreement") is None:
        return text
    epsilon = next((row["alt_test_epsilon"] for row in rows if row.get("role") == "judge"), None)
    table = []
    for row in rows:
        judge = row.get("role") == "judge"
        if row.get("role") == "humans":
            agreement, bounds = row["human_agreement"], row["human_agreement_ci"]
        else:
            agreement, bounds = row.get("held_out_agreement"), row.get("held_out_agreement_ci")
        entry = {
            "annotator": row["annotator"],
            "role": "all" if row.get("role") == "humans" else row.get("role"),
            "pairs": row["n_overlap"] if judge else row["n_pairs"],
            "agreement with the humans' majority [95% CI]": _figure(agreement, bounds),
        }
        if epsilon is not None:  # the test is a judge's
            passed = row.get("alt_test_pass")
            entry[f"alt-test (ε = {epsilon})"] = (
                ("pass" if passed else "fail") if passed is not None else row.get("alt_test_note")
            ) or ""
            entry["winning rate ω"] = _figure(row.get("alt_test_winning_rate"))
            entry["advantage ρ [95% CI]"] = _figure(
                row.get("alt_test_advantage"), row.get("alt_test_advantage_ci")
            )
        table.append(entry)
    between = [
        {
            "between the humans": "pairwise agreement",
            "value [95% CI]": _figure(
                people["pairwise_agreement"], people["pairwise_agreement_ci"]
            ),
        },
        {
            "between the humans": "Fleiss' kappa",
            "value [95% CI]": _figure(people["fleiss_kappa"], people["fleiss_kappa_ci"]),
        },
    ]
    for name, value in people.get("annotator_pair_agreement", {}).items():
        pair = name.replace("|", ", ")
        between.append(
            {
                "between the humans": f"{pair}: agreement",
                "value [95% CI]": _figure(value, people["annotator_pair_agreement_ci"][name]),
            }
        )
        between.append(
            {
                "between the humans": f"{pair}: Cohen's kappa",
                "value [95% CI]": _figure(
                    people["cohen_kappa"][name], people["cohen_kappa_ci"][name]
                ),
            }
        )
    return f"{text}\n{markdown_text(table)}\n{markdown_text(between)}"


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
        if row.get("role") == "human":  # one person's row: AlpacaEval's table has the humans' only
            continue
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
