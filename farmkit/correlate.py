"""Validation statistics: rank correlation between leaderboards, and a judge's labels against
human labels (AlpacaFarm's and AlpacaEval's annotator analysis).

Annotation mode, definitions (all as fractions in [0, 1]; labels are 1, 2 or 1.5 for a tie, the
legacy 0 is a tie, other values in (1, 2) round to the nearer side):
- Where a set of labels has several most frequent values (a tied mode), a label's agreement with
  "the mode" is its expected agreement with one of them drawn at random.
- human_agreement of the judge: mean over pairs, held-out humans and judge runs of the agreement of
  the run's label with the mode of the other humans (leave-one-out, as AlpacaFarm measures it; a pair
  with a single human label is compared with it). For the humans: each human against the mode of
  the others.
- bias: 1 - agreement of the mode of the judge's runs with the mode of all humans.
- variance: mean over runs of 1 - agreement of the run with the mode of the other runs (needs two
  runs or more: several files, or several labels per pair in one file).
- p_prefers_longer / p_prefers_lists / p_prefers_first: among the non-tie labels on pairs whose
  lengths differ by more than 30 characters / where exactly one output has a list / all pairs, the
  share choosing the longer output / the output with a list / output_1. The 30 characters are
  AlpacaEval's: its evaluators' leaderboard counts P(prefers longer) over 445 of the 648
  cross-annotated pairs, exactly those whose outputs differ by more than 30 characters.
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

from farmkit.io import FarmError, RecordError, display_name, iter_json, open_binary
from farmkit.validate import problems

TIE = 1.5
_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+\S", re.MULTILINE)


# ---------------------------------------------------------------- leaderboard mode


@dataclass
class Board:
    """Scores by model name from one leaderboard file."""

    label: str
    scores: dict[str, float]


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def pick_column(columns: Sequence[str], wanted: str | None, defaults: Sequence[str], source: str, what: str) -> str:
    """The column named `wanted` (exactly, or the only one it is a whitespace-insensitive prefix of),
    or the first of `defaults` present."""
    if wanted is None:
        for name in defaults:
            if name in columns:
                return name
        raise FarmError(f"{source}: no {what} column among {', '.join(map(repr, columns))}; expected one of "
                        f"{', '.join(map(repr, defaults))} or name it with --{what}")
    if wanted in columns:
        return wanted
    matches = [c for c in columns if _norm(c).startswith(_norm(wanted))]
    if len(matches) == 1:
        return matches[0]
    found = "several" if matches else "no"
    raise FarmError(f"{source}: {found} columns match {wanted!r} for --{what}; expected one of {', '.join(map(repr, columns))}")


def read_board(path: str, name: str | None = None, score: str | None = None) -> Board:
    """A leaderboard from farm-winrate JSONL (or a JSON array) or a CSV with a name and a score column.

    Defaults: name `generator`, `Model`, `model`, `name` or the CSV's unnamed first column; score
    `win_rate`. Empty scores leave the model out of this board.
    """
    source = display_name(path)
    stream = open_binary(path)
    head = stream.peek(64).lstrip()[:1]
    if path != "-" and (str(path).endswith((".csv", ".csv.gz")) or head not in (b"{", b"[", b"")):
        text = stream.read().decode("utf-8-sig")
        stream.close()
        rows = list(csv.reader(io.StringIO(text)))
        if not rows:
            return Board(source, {})
        header, body = rows[0], rows[1:]
        name_column = pick_column(header, name, ["generator", "Model", "model", "name", ""], source, "name")
        score_column = pick_column(header, score, ["win_rate"], source, "score")
        i, j = header.index(name_column), header.index(score_column)
        items = ((number, row[i], row[j]) for number, row in enumerate(body, start=2) if len(row) > max(i, j))
        label = score_column
    else:
        if path != "-":
            stream.close()
        records = []
        for number, record in iter_json(path):
            problem = problems(record, "leaderboard")
            if problem:
                raise RecordError(source, number, problem)
            records.append((number, record))
        if not records:
            return Board(source, {})
        keys = list(dict.fromkeys(k for _, r in records for k in r))
        name_column = pick_column(keys, name, ["generator"], source, "name")
        score_column = pick_column(keys, score, ["win_rate"], source, "score")
        items = ((number, r.get(name_column), r.get(score_column)) for number, r in records)
        label = score_column
    scores: dict[str, float] = {}
    for number, model, value in items:
        if value in (None, ""):
            continue
        try:
            number_value = float(value)
        except (TypeError, ValueError):
            raise RecordError(source, number, f"score {value!r} of {model!r} is not a number; expected a number or nothing") from None
        if model in scores:
            raise RecordError(source, number, f"model {model!r} appears twice; expected one row per model")
        scores[str(model)] = number_value
    return Board(f"{Path(source).name}:{' '.join(label.split())}", scores)


def correlate_boards(x: Board, y: Board) -> dict[str, Any]:
    """Spearman, Kendall, Pearson and R^2 over the models both boards score, with the models missing
    from either side."""
    from scipy import stats

    common = sorted(set(x.scores) & set(y.scores))
    result: dict[str, Any] = {"x": x.label, "y": y.label, "n": len(common)}
    a = [x.scores[m] for m in common]
    b = [y.scores[m] for m in common]
    enough = len(common) >= 3 and len(set(a)) > 1 and len(set(b)) > 1
    for name, function in (("spearman", stats.spearmanr), ("kendall", stats.kendalltau), ("pearson", stats.pearsonr)):
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
    judge: list[tuple[int, float]] = field(default_factory=list)  # (run, label)
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
            raise UnparsedLabel(f"label {value!r} is not a number; expected 1, 2, 1.5, 0 or 'tie'") from None
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
    texts = [record.get("instruction"), record.get("input") or "", record.get(outputs[0]), record.get(outputs[1])]
    if texts[2] is None or texts[3] is None:
        raise ValueError(f"no pair_id and no {outputs[0]}/{outputs[1]}; expected a pair key (--key FIELD) or both outputs")
    return hashlib.sha256("\x00".join(map(str, texts)).encode()).hexdigest()


class Annotations:
    """Labels by pair, from judge files (each file a run; several labels per pair within a file are
    further runs) and human files (long: one label per record with `annotator`; wide: one field per
    annotator)."""

    def __init__(self, key_field: str | None = None, outputs: tuple[str, str] = ("output_1", "output_2")):
        self.key_field, self.outputs = key_field, outputs
        self.pairs: dict[Any, Pair] = defaultdict(Pair)
        self.judge_runs = 0
        self.judge_names: Counter = Counter()
        self.unparsed, self.first_unparsed = 0, ""

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
                raise RecordError(source, number, f"a {type(record).__name__} is not a record; expected a JSON object")
            yield source, number, record

    def add_judge(self, path: str, label_field: str = "preference") -> None:
        first_run = self.judge_runs
        seen: Counter = Counter()
        for source, number, record in self._records(path):
            try:
                key = pair_key(record, self.key_field, self.outputs)
                label = self._label(record.get(label_field), source, number)
            except ValueError as exc:
                raise RecordError(source, number, str(exc)) from None
            pair = self.pairs[key]
            self._note_outputs(pair, record)
            self.judge_names[record.get("annotator", Path(source).stem)] += 1
            run = first_run + seen[key]
            seen[key] += 1
            if label is not None:
                pair.judge.append((run, label))
        self.judge_runs = first_run + max(seen.values(), default=0)

    def add_humans(self, path: str, label_fields: Sequence[str] = ("preference",)) -> None:
        wide = len(label_fields) > 1
        for source, number, record in self._records(path):
            try:
                key = pair_key(record, self.key_field, self.outputs)
                labels = [(name if wide else str(record.get("annotator", f"{source}:{number}")),
                           self._label(record.get(name), source, number)) for name in label_fields]
            except ValueError as exc:
                raise RecordError(source, number, str(exc)) from None
            pair = self.pairs[key]
            self._note_outputs(pair, record)
            pair.humans.extend((name, label) for name, label in labels if label is not None)


def modes(labels: Sequence[float]) -> list[float]:
    counts = Counter(labels)
    top = max(counts.values())
    return [label for label, count in counts.items() if count == top]


def agreement(label: float, others: Sequence[float]) -> float:
    """Expected agreement of `label` with the mode of `others` (a tied mode drawn at random)."""
    top = modes(others)
    return (label in top) / len(top)


def _mode_agreement(a: Sequence[float], b: Sequence[float]) -> float:
    top_a, top_b = modes(a), modes(b)
    return len(set(top_a) & set(top_b)) / (len(top_a) * len(top_b))


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _preferences(pairs: Iterable[Pair], labels_of, min_length_difference: int) -> dict[str, float | None]:
    longer, lists, first = [], [], []
    for pair in pairs:
        for label in labels_of(pair):
            if label == TIE:
                continue
            first.append(float(label == 1.0))
            if (pair.length_1 is not None and pair.length_2 is not None
                    and abs(pair.length_1 - pair.length_2) > min_length_difference):
                longer.append(float((label == 2.0) == (pair.length_2 > pair.length_1)))
            if pair.list_1 is not None and pair.list_2 is not None and pair.list_1 != pair.list_2:
                lists.append(float((label == 2.0) == pair.list_2))
    return {"p_prefers_longer": _mean(longer), "p_prefers_lists": _mean(lists), "p_prefers_first": _mean(first)}


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


def human_summary(annotations: Annotations, min_length_difference: int = 30) -> dict[str, Any] | None:
    pairs = [p for p in annotations.pairs.values() if p.humans]
    if not pairs:
        return None
    loo = [agreement(label, [x for j, (_, x) in enumerate(p.humans) if j != i])
           for p in pairs if len(p.humans) > 1 for i, (_, label) in enumerate(p.humans)]
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
            kappas[f"{first}|{second}"] = kappa([by_annotator[first][k] for k in shared], [by_annotator[second][k] for k in shared])
    return {
        "annotator": "humans",
        "n_pairs": len(pairs),
        "n_labels": sum(len(p.humans) for p in pairs),
        "human_agreement": _mean(loo),
        **_preferences(pairs, lambda p: [label for _, label in p.humans], min_length_difference),
        "majority_labels": dict(sorted(majority.items())),
        "cohen_kappa": kappas,
    }


def judge_summary(annotations: Annotations, min_length_difference: int = 30) -> dict[str, Any] | None:
    pairs = [p for p in annotations.pairs.values() if p.judge]
    if not pairs:
        return None
    against_humans, bias = [], []
    for p in pairs:
        runs = [label for _, label in p.judge]
        humans = [label for _, label in p.humans]
        if len(humans) == 1:
            against_humans.extend(agreement(run, humans) for run in runs)
        elif len(humans) > 1:
            for i in range(len(humans)):
                others = humans[:i] + humans[i + 1:]
                against_humans.extend(agreement(run, others) for run in runs)
        if humans:
            bias.append(1 - _mode_agreement(runs, humans))
    # variance is a mean over runs: average each run's disagreements over its pairs first
    per_run: dict[int, list[float]] = defaultdict(list)
    for p in pairs:
        runs = p.judge
        if len(runs) > 1:
            for i, (run, label) in enumerate(runs):
                per_run[run].append(1 - agreement(label, [x for j, (_, x) in enumerate(runs) if j != i]))
    name = annotations.judge_names.most_common(1)[0][0] if annotations.judge_names else "judge"
    return {
        "annotator": name,
        "n_pairs": len(pairs),
        "n_runs": annotations.judge_runs,
        "human_agreement": _mean(against_humans),
        "bias": _mean(bias),
        "variance": _mean([_mean(v) for v in per_run.values()]) if per_run else None,
        **_preferences(pairs, lambda p: [label for _, label in p.judge], min_length_difference),
    }
