"""farm-audit: a judge (an annotator pool) audited in one run: it is asked every pair in both orders,
R times where it samples, through farm-annotate's engine (cache, budget, ledger-free), and the report
says how far its verdicts can be trusted.

Every figure has a 95% percentile bootstrap interval over --bootstrap resamples of the pairs (a pair
with all its verdicts, both orders and every run, is one unit), and n, the pairs it is computed on.
Verdicts: 1 (output_1 better), 2 (output_2 better), 1.5 (tie), fractional where the judge weighs
its answer (a soft preference); "as shown" is the order the judge saw, "as given" the pair's own.
- flip_rate: over the pairs and every (run in one order, run in the other order) combination of
  verdicts, the share that disagree once the mirrored order's verdict is mirrored back (verdicts
  rounded to 1, tie or 2; farm-correlate's flip rate).
- p_prefers_first: 2 - mean preference as shown, over every verdict (a tie counts 1/2): AlpacaEval's
  "Proba. prefer 1". A judge with no position bias is near 0.5 because every pair is shown both ways.
- p_prefers_longer, p_prefers_lists: AlpacaEval's evaluators' leaderboard's "Proba. prefer longer"
  and "Proba. prefer lists" (farmkit.evaluate.correlate.alpaca_eval_preferences): over the first run's
  verdicts as shown (each order is a pair of its own there, as AlpacaEval keys pairs by their texts),
  the share whose preferred output is the longer one (outputs that differ by more than 30 characters;
  an exact tie left out) / the one holding a list (exactly one does, AlpacaEval's loose detector).
- length_coefficient: the length term of AlpacaEval 2's length-controlled GLM
  (farmkit.evaluate.length_control.glm_win_rate) fitted to every verdict as shown: logit P(output 2
  preferred) = theta + phi * tanh(delta / sd(delta)), delta = len(output_2) - len(output_1) in
  characters; phi is the effect of length with quality (theta, and the order, both orders being asked)
  held fixed: 0 for a judge blind to length, > 0 when it rewards the longer output. Its interval
  refits the GLM on each resample at the penalty cross-validation chose on all the verdicts.
- variance (with two runs or more): AlpacaEval's, 1 - the agreement of one run's verdict with the
  mode of the other runs' on the same pair and order (a tied mode counts as the expected agreement
  with one of them), averaged over the verdicts. 0 for a judge that does not sample.
- own_family_win_rate / self_preference (with families): on the pairs where exactly one output's
  generator is of the judge's family, the share of the judge's verdicts (as given, every run and
  order) that prefer its family's output (a tie 1/2); with --humans, self_preference is that minus
  the humans' same share on the same pairs.
- With --humans (preference records of the same pairs, several labels per pair allowed, either
  order): agreement (AlpacaFarm's: mean over the judge's verdicts as given of the agreement with the
  mode of the humans' labels, a tied mode counting its expected agreement), cohen_kappa (the judge's
  first-run verdict in the pair's own order against the humans' mode, on the pairs with one mode),
  the alternative annotator test (farmkit.evaluate.correlate.alt_test, pairs with three human labels
  or more: alt_test_advantage, alt_test_winning_rate and pass; the winning rate's interval reruns the
  test on the first 100 resamples), and calibration of the
  judge's confidence in output_2 (its soft preference - 1, else 1 - p_first_better where its backend
  gives one, else the hard verdict) against the humans' majority (pairs with a majority that is not a
  tie): brier (mean squared error) and ece (expected calibration error over 10 equal-width bins:
  the sum over bins of |sum(confidence - outcome)| / n).

--fail-on FIGURE>VALUE (or <, >=, <=) checks a figure's estimate; any failed check makes the run end
with exit code 3 once the report is written (a figure that could not be computed fails no check, and
is said on stderr).
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farmkit.core.fields import EXISTING_FILE, help_field
from farmkit.core.records import mirrored_record
from farmkit.core.values import FRACTION, NON_NEGATIVE, Bounds
from farmkit.evaluate.correlate import (
    TIE,
    agreement,
    alpaca_eval_preferences,
    alt_test,
    cohen_kappa,
    interval,
    label_value,
    modes,
    pair_key,
    resample_weights,
)
from farmkit.train.config import shared_field

log = logging.getLogger("farmkit")

FAIL_EXIT = 3  # docs/exit-codes.md: a --fail-on check failed
CALIBRATION_BINS = 10
LENGTH_GLM_RESAMPLES = 200  # the length coefficient's interval refits the GLM: fewer resamples
WINNING_RATE_RESAMPLES = 100  # and the winning rate's reruns the alternative annotator test
_CHECK = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}


def parse_check(text: str) -> tuple[str, str, float]:
    """A --fail-on check, FIGURE>VALUE (also <, >=, <=), as (figure, operator, value)."""
    found = _CHECK.match(text)
    if found is None:
        raise ValueError(f"{text!r}: expected FIGURE>VALUE, e.g. flip_rate>0.2 (or <, >=, <=)")
    name, sign, value = found.groups()
    if name not in FIGURES:
        raise ValueError(f"{text!r}: no figure {name!r}; expected one of {', '.join(FIGURES)}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{text!r}: the value must be a finite number")
    return name, sign, number


def parse_families(text: str | None) -> dict[str, str]:
    """--families: a JSON or YAML file mapping names to families, or NAME=FAMILY,NAME=FAMILY."""
    if not text:
        return {}
    if Path(text).is_file():
        from farmkit.core.yamltext import safe_yaml

        data = safe_yaml(Path(text).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError(f"{text}: expected a mapping of names to family names")
        return dict(data)
    families = {}
    for part in text.split(","):
        name, separator, family = part.partition("=")
        if not separator or not name.strip() or not family.strip():
            raise ValueError(f"{part!r}: expected NAME=FAMILY (or a JSON/YAML file of them)")
        families[name.strip()] = family.strip()
    return families


@dataclass
class AuditConfig:
    """farm-audit's own settings (its pool, seed, cache, budget and output options are shared)."""

    repeats: int = help_field(
        3,
        "Runs per pair and order where the judge samples (temperature > 0), each with its own seed "
        "(the first with --seed, the others with seeds derived from it), for the variance; a judge that does not sample is asked once.",
        bounds=Bounds(min=1),
        metavar="R",
    )
    humans: str | None = help_field(
        None,
        "Human preference records of the same pairs (either order; several labels per pair "
        "allowed): agreement, Cohen's kappa, the alternative annotator test, calibration and "
        "the humans' side of self_preference.",
        path=EXISTING_FILE,
        show_default=False,
    )
    include_screened: bool = shared_field("include_screened", False)
    families: str | None = help_field(
        None,
        "The family of each generator (and of the judge's model): a JSON/YAML file or "
        "NAME=FAMILY,... Records' family_1/family_2 fields come first, then generator_1/generator_2 "
        "looked up here.",
        metavar="MAP",
        show_default=False,
    )
    judge_family: str | None = help_field(
        None,
        "The judge's family, for self_preference. Default: its model's (or pool's) name in "
        "--families.",
        metavar="FAMILY",
        show_default=False,
    )
    fail_on: tuple[str, ...] = help_field(
        (),
        "A check on a figure's estimate, e.g. flip_rate>0.2 or p_prefers_first>0.6 (>, <, >=, <=); "
        "repeatable. A failed check ends the run with exit code 3, after the report is written.",
        multiple=True,
        metavar="FIGURE>VALUE",
        show_default=False,
    )
    report: str | None = help_field(
        None,
        "Also write the report as markdown to this file (atomically).",
        path={"dir_okay": False},
        show_default=False,
    )
    plot: str | None = help_field(
        None,
        "Draw the figures with their intervals as PNG, and the reliability curve of the judge's "
        "confidence against the humans' majority where there are --humans.",
        path={"dir_okay": False},
        show_default=False,
    )
    bootstrap: int = help_field(
        1000,
        "95% intervals from N bootstrap resamples of the pairs (--seed sets the draw).",
        bounds=Bounds(min=1),
        metavar="N",
    )
    min_length_difference: int = help_field(
        30,
        "p_prefers_longer counts the pairs whose outputs differ by more than this many characters (AlpacaEval's 30).",
        bounds=NON_NEGATIVE,
        metavar="CHARS",
    )
    epsilon: float = help_field(
        0.15,
        "The alternative annotator test's margin (with --humans), as farm-correlate's.",
        bounds=FRACTION,
    )
    fmt: str = help_field(
        "markdown",
        "markdown: the report; jsonl: one row per figure (figure, estimate, ci_low, ci_high, n).",
        ("markdown", "jsonl"),
        flags=("--format",),
    )


# ---------------------------------------------------------------- the figures


@dataclass
class Figure:
    figure: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    what: str

    def row(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "estimate": self.estimate,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n": self.n,
            "what": self.what,
        }


FIGURES = {
    "flip_rate": "verdicts that change when the order is swapped",
    "p_prefers_first": "P(prefers the output shown first), AlpacaEval's Proba. prefer 1",
    "p_prefers_longer": "P(prefers the longer output), AlpacaEval's Proba. prefer longer",
    "p_prefers_lists": "P(prefers the output with a list), AlpacaEval's Proba. prefer lists",
    "length_coefficient": "length term of AlpacaEval 2's length-controlled GLM (0: blind to length)",
    "variance": "1 - agreement of one run with the mode of the other runs",
    "own_family_win_rate": "the judge's win rate for its own family's outputs",
    "self_preference": "own_family_win_rate minus the humans' on the same pairs",
    "agreement": "agreement with the humans' majority",
    "cohen_kappa": "Cohen's kappa with the humans' majority",
    "alt_test_advantage": "alternative annotator test: advantage probability rho",
    "alt_test_winning_rate": "alternative annotator test: winning rate omega (pass at 0.5)",
    "brier": "Brier score of the judge's confidence against the humans' majority",
    "ece": "expected calibration error (10 bins)",
}


def _round(value: float) -> float:
    """A verdict as 1, 1.5 or 2 (a soft preference to its nearer side)."""
    return TIE if value == TIE else (1.0 if value < TIE else 2.0)


def _mirror(value: float) -> float:
    return 3.0 - value


@dataclass
class Verdicts:
    """The audit's verdicts by pair: given[i][r] and shown_mirrored[i][r] (None: no verdict), the
    pair's texts, and the judge's confidence in output_2 where it said one."""

    items: list[Any]
    given: list[list[float | None]]
    swapped: list[
        list[float | None]
    ]  # as shown: 1 means the mirrored pair's output_1 (the given output_2)
    confidence: list[list[float | None]]  # P(given output_2 better), per run, as given

    @classmethod
    def from_runs(cls, items: list[Any], runs: list[list[dict[str, Any]]]) -> Verdicts:
        n = len(items)
        given = [[_value(run[i]) for run in runs] for i in range(n)]
        swapped = [[_value(run[n + i]) for run in runs] for i in range(n)]
        confidence = [[_confidence(run[i]) for run in runs] for i in range(n)]
        return cls(items, given, swapped, confidence)


def _value(record: dict[str, Any]) -> float | None:
    try:
        return label_value(record.get("preference"))
    except ValueError:
        return None


def _soft(record: dict[str, Any]) -> float | None:
    value = record.get("preference")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value <= 2:
        return float(value)
    return None


def _confidence(record: dict[str, Any]) -> float | None:
    """P(output_2 better) as the judge says it: its soft preference, else its backend's probability
    of the first shown (shown as given here), else its hard verdict."""
    value = _soft(record)
    if value is None:
        return None
    if value not in (1.0, 2.0, TIE):
        return value - 1
    given = ((record.get("provenance") or {}).get("farm-annotate") or {}).get("p_first_better")
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        return 1 - float(given)
    return value - 1


class Bootstrap:
    """Ratios of per-pair sums with their intervals over resamples of the pairs."""

    def __init__(self, n: int, resamples: int, seed: int):
        self.weights = resample_weights(n, resamples, seed)

    def ratio(
        self, name: str, top: Sequence[float], bottom: Sequence[float], what: str = ""
    ) -> Figure:
        top_, bottom_ = np.asarray(top, float), np.asarray(bottom, float)
        n = int((bottom_ > 0).sum())
        if not bottom_.sum():
            return Figure(name, None, None, None, 0, what or FIGURES[name])
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = (self.weights @ top_) / (self.weights @ bottom_)
        bounds = interval(draws) or [None, None]
        return Figure(name, float(top_.sum() / bottom_.sum()), *bounds, n, what or FIGURES[name])

    def difference(
        self, name: str, a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
    ) -> Figure:
        """(sum a_top / sum a_bottom) - (sum b_top / sum b_bottom), on the pairs both count."""
        both = (a[1] > 0) & (b[1] > 0)
        if not both.any():
            return Figure(name, None, None, None, 0, FIGURES[name])
        a_top, a_bottom, b_top, b_bottom = (x * both for x in (*a, *b))
        w = self.weights
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = (w @ a_top) / (w @ a_bottom) - (w @ b_top) / (w @ b_bottom)
        estimate = a_top.sum() / a_bottom.sum() - b_top.sum() / b_bottom.sum()
        bounds = interval(draws) or [None, None]
        return Figure(name, float(estimate), *bounds, int(both.sum()), FIGURES[name])


def position_figures(verdicts: Verdicts, boot: Bootstrap) -> list[Figure]:
    n = len(verdicts.items)
    flips, combos, first, shown = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    for i in range(n):
        given = [v for v in verdicts.given[i] if v is not None]
        other = [_mirror(v) for v in verdicts.swapped[i] if v is not None]
        for a in given:
            for b in other:
                flips[i] += _round(a) != _round(b)
                combos[i] += 1
        for value in given + [v for v in verdicts.swapped[i] if v is not None]:
            first[i] += 2.0 - value
            shown[i] += 1
    return [boot.ratio("flip_rate", flips, combos), boot.ratio("p_prefers_first", first, shown)]


def style_figures(verdicts: Verdicts, boot: Bootstrap, min_length_difference: int) -> list[Figure]:
    n = len(verdicts.items)
    longer, longer_n, lists, lists_n = (np.zeros(n) for _ in range(4))
    for i, item in enumerate(verdicts.items):
        shown = [
            (item.output_1, item.output_2, verdicts.given[i][0]),
            (item.output_2, item.output_1, verdicts.swapped[i][0]),
        ]
        for prefers_longer, prefers_lists, _ in alpaca_eval_preferences(
            shown, min_length_difference
        ):
            if prefers_longer is not None:
                longer[i] += prefers_longer
                longer_n[i] += 1
            if prefers_lists is not None:
                lists[i] += prefers_lists
                lists_n[i] += 1
    return [
        boot.ratio("p_prefers_longer", longer, longer_n),
        boot.ratio("p_prefers_lists", lists, lists_n),
        length_figure(verdicts, boot),
    ]


def length_figure(verdicts: Verdicts, boot: Bootstrap) -> Figure:
    """AlpacaEval 2's GLM length term over every verdict as shown, its interval by refitting."""
    from farmkit.evaluate.length_control import (
        LC_FOLDS,
        LC_PENALTIES,
        _log_loss,
        _scaled_length_difference,
        l1_logistic,
    )

    pair, delta, target = [], [], []
    for i, item in enumerate(verdicts.items):
        difference = len(item.output_2) - len(item.output_1)
        for values, sign in ((verdicts.given[i], 1), (verdicts.swapped[i], -1)):
            for value in values:
                if value is not None:
                    pair.append(i)
                    delta.append(sign * difference)
                    target.append(value - 1)
    name = "length_coefficient"
    if len(target) < 2 * LC_FOLDS or not np.std(delta):
        return Figure(name, None, None, None, len(set(pair)), FIGURES[name])
    pairs, x = np.array(pair), np.array(target, float)
    features = np.column_stack([_scaled_length_difference(np.array(delta, float)), np.ones(len(x))])
    weights = np.ones(len(x))
    folds = pairs % LC_FOLDS  # a pair's verdicts stay in one fold
    losses = np.zeros(len(LC_PENALTIES))
    for fold in range(LC_FOLDS):
        train = folds != fold
        start = None
        for k, c in enumerate(LC_PENALTIES):
            start = l1_logistic(features[train], x[train], weights[train], c, start)
            losses[k] += _log_loss(features[~train] @ start, x[~train]).sum()
    c = float(LC_PENALTIES[int(np.argmin(losses))])
    fitted = l1_logistic(features, x, weights, c)
    draws = []
    for resample in boot.weights[:LENGTH_GLM_RESAMPLES]:
        drawn = resample[pairs].astype(float)
        draws.append(l1_logistic(features, x, drawn, c, fitted)[0])
    bounds = interval(np.array(draws)) or [None, None]
    return Figure(name, float(fitted[0]), *bounds, len(set(pair)), FIGURES[name])


def variance_figure(verdicts: Verdicts, boot: Bootstrap) -> Figure:
    n = len(verdicts.items)
    top, bottom = np.zeros(n), np.zeros(n)
    for i in range(n):
        for values in (verdicts.given[i], verdicts.swapped[i]):
            labels = [_round(v) for v in values if v is not None]
            if len(labels) < 2:
                continue
            for k, label in enumerate(labels):
                top[i] += 1 - agreement(label, labels[:k] + labels[k + 1 :])
                bottom[i] += 1
    return boot.ratio("variance", top, bottom)


def family_of(item: Any, side: int, families: dict[str, str]) -> str | None:
    family = item.record.get(f"family_{side}")
    if isinstance(family, str):
        return family
    generator = item.record.get(f"generator_{side}")
    return families.get(generator) if isinstance(generator, str) else None


def self_preference_figures(
    verdicts: Verdicts, humans: list[list[float]] | None, judge_family: str, families, boot
) -> list[Figure]:
    n = len(verdicts.items)
    own = np.zeros(n)  # 1 or 2: which given output is of the judge's family; 0: neither or both
    for i, item in enumerate(verdicts.items):
        sides = [family_of(item, side, families) == judge_family for side in (1, 2)]
        if sides[0] != sides[1]:
            own[i] = 1 if sides[0] else 2
    judge_top, judge_bottom = np.zeros(n), np.zeros(n)
    people_top, people_bottom = np.zeros(n), np.zeros(n)
    for i in np.nonzero(own)[0]:
        labels = [v for v in verdicts.given[i] if v is not None]
        labels += [_mirror(v) for v in verdicts.swapped[i] if v is not None]
        for value in labels:
            judge_top[i] += _wins(value, own[i])
            judge_bottom[i] += 1
        for value in humans[i] if humans else []:
            people_top[i] += _wins(value, own[i])
            people_bottom[i] += 1
    found = [boot.ratio("own_family_win_rate", judge_top, judge_bottom)]
    if humans:
        found.append(
            boot.difference(
                "self_preference", (judge_top, judge_bottom), (people_top, people_bottom)
            )
        )
    return found


def _wins(value: float, side: float) -> float:
    """How much a verdict (as given) prefers `side` (1 or 2): 1, 1/2 for a tie, 0; soft in between."""
    return (2 - value) if side == 1 else (value - 1)


def read_humans(
    path: str, items: list[Any], include_screened: bool = False
) -> tuple[list[list[float]], list[list[str]], int, int]:
    """The human labels of each audited pair (as given; a label of the mirrored pair is mirrored),
    who gave each (the record's `annotator`, else its place among the pair's labels), how many
    human records matched no audited pair, and how many were left out as screened_out
    (farm-label --min-check-score) unless `include_screened`."""
    from farmkit.core.io import RecordError, display_name, iter_json

    index: dict[Any, tuple[int, bool]] = {}
    for i, item in enumerate(items):
        index[pair_key(item.record, None, ("output_1", "output_2"))] = (i, False)
        index[pair_key(mirrored_record(item.record), None, ("output_1", "output_2"))] = (i, True)
    labels: list[list[float]] = [[] for _ in items]
    names: list[list[str]] = [[] for _ in items]
    unmatched = screened = 0
    source = display_name(path)
    for number, record in iter_json(path):
        if not isinstance(record, dict):
            raise RecordError(source, number, "not a record; expected a JSON object")
        if not include_screened and record.get("screened_out") is True:
            screened += 1
            continue
        try:
            key = pair_key(record, None, ("output_1", "output_2"))
            value = label_value(record.get("preference"))
        except ValueError as exc:
            raise RecordError(source, number, str(exc)) from None
        found = index.get(key)
        if found is None:
            unmatched += 1
            continue
        if value is not None:
            i = found[0]
            labels[i].append(_mirror(value) if found[1] else value)
            names[i].append(str(record.get("annotator", f"label {len(names[i]) + 1}")))
    return labels, names, unmatched, screened


def human_figures(
    verdicts: Verdicts,
    humans: list[list[float]],
    epsilon: float,
    boot: Bootstrap,
    names: list[list[str]] | None = None,
) -> tuple[list[Figure], list[tuple[float, float]]]:
    """Agreement, kappa, the alternative annotator test and calibration; and the (confidence,
    outcome) points of the reliability curve."""
    n = len(verdicts.items)
    agree, counted = np.zeros(n), np.zeros(n)
    for i in range(n):
        people = [_round(v) for v in humans[i]]
        if not people:
            continue
        for value in verdicts.given[i]:
            if value is not None:
                agree[i] += agreement(_round(value), people)
                counted[i] += 1
    found = [boot.ratio("agreement", agree, counted)]
    # kappa: the first run's verdict against the humans' single mode
    chosen, judge_labels, human_labels = [], [], []
    for i in range(n):
        top = modes([_round(v) for v in humans[i]]) if humans[i] else []
        first = verdicts.given[i][0]
        if len(top) == 1 and first is not None:
            chosen.append(i)
            judge_labels.append(_round(first))
            human_labels.append(top[0])
    name = "cohen_kappa"
    if chosen:
        value = cohen_kappa(judge_labels, human_labels)
        draws = cohen_kappa(judge_labels, human_labels, boot.weights[:, chosen])
        bounds = interval(draws) or [None, None]
        found.append(Figure(name, value, *bounds, len(chosen), FIGURES[name]))
    else:
        found.append(Figure(name, None, None, None, 0, FIGURES[name]))
    # the alternative annotator test: each annotator with the pairs they labelled
    people: dict[str, dict[int, float]] = {}
    for i, labels in enumerate(humans):
        who = names[i] if names else [f"label {k + 1}" for k in range(len(labels))]
        for name, label in zip(who, labels, strict=True):
            people.setdefault(name, {})[i] = _round(label)
    runs = [[_round(v) for v in values if v is not None] for values in verdicts.given]
    test = alt_test(people, runs, epsilon, boot.weights)
    advantage = test.get("advantage_ci") or [None, None]
    winning = [None, None]
    if test.get("winning_rate") is not None:
        draws = [
            alt_test(*_resampled(people, runs, resample), epsilon).get("winning_rate")
            for resample in boot.weights[:WINNING_RATE_RESAMPLES]
        ]
        winning = interval(np.array([d for d in draws if d is not None], float)) or winning
    pairs = test.get("pairs") or 0
    found.append(
        Figure(
            "alt_test_advantage",
            test.get("advantage"),
            *advantage,
            pairs,
            FIGURES["alt_test_advantage"] + (f"; {test['note']}" if test.get("note") else ""),
        )
    )
    found.append(
        Figure(
            "alt_test_winning_rate",
            test.get("winning_rate"),
            *winning,
            pairs,
            FIGURES["alt_test_winning_rate"]
            + (f", pass: {test['pass']}" if test.get("pass") is not None else ""),
        )
    )
    # calibration against the humans' majority (not a tie)
    points: list[tuple[float, float]] = []
    owner = []
    for i in range(n):
        top = modes([_round(v) for v in humans[i]]) if humans[i] else []
        if len(top) != 1 or top[0] == TIE:
            continue
        outcome = float(top[0] == 2.0)
        for confidence in verdicts.confidence[i]:
            if confidence is not None:
                points.append((confidence, outcome))
                owner.append(i)
    found += calibration_figures(points, owner, n, boot)
    return found, points


def _resampled(
    people: dict[str, dict[int, float]], runs: list[list[float]], counts: np.ndarray
) -> tuple[dict[str, dict[int, float]], list[list[float]]]:
    """The annotators' labels and the judge's runs of a bootstrap resample: pair i `counts[i]` times."""
    drawn = [i for i, count in enumerate(counts) for _ in range(int(count))]
    labels = {
        name: {k: given[i] for k, i in enumerate(drawn) if i in given}
        for name, given in people.items()
    }
    return labels, [runs[i] for i in drawn]


def calibration_figures(
    points: list[tuple[float, float]], owner: list[int], n: int, boot: Bootstrap
) -> list[Figure]:
    if not points:
        return [Figure(name, None, None, None, 0, FIGURES[name]) for name in ("brier", "ece")]
    confidence, outcome = (np.array(values, float) for values in zip(*points, strict=True))
    pairs = np.array(owner)
    squared, counts = np.zeros(n), np.zeros(n)
    np.add.at(squared, pairs, (confidence - outcome) ** 2)
    np.add.at(counts, pairs, 1)
    brier = boot.ratio("brier", squared, counts)
    bins = np.minimum((confidence * CALIBRATION_BINS).astype(int), CALIBRATION_BINS - 1)
    gaps = np.zeros((n, CALIBRATION_BINS))  # per pair and bin: sum of (confidence - outcome)
    np.add.at(gaps, (pairs, bins), confidence - outcome)
    w = boot.weights.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.abs(w @ gaps).sum(axis=1) / (w @ counts)
    estimate = float(np.abs(gaps.sum(axis=0)).sum() / counts.sum())
    bounds = interval(draws) or [None, None]
    used = int((counts > 0).sum())
    return [brier, Figure("ece", estimate, *bounds, used, FIGURES["ece"])]


# ---------------------------------------------------------------- the report


@dataclass
class Audit:
    judge: str
    pairs: int
    repeats: int
    figures: list[Figure]
    points: list[tuple[float, float]]
    notes: list[str]

    def rows(self) -> list[dict[str, Any]]:
        return [{"judge": self.judge, **figure.row()} for figure in self.figures]

    def estimate(self, name: str) -> float | None:
        return next((f.estimate for f in self.figures if f.figure == name), None)

    def failures(self, checks: Sequence[tuple[str, str, float]]) -> list[str]:
        failed = []
        for name, sign, value in checks:
            estimate = self.estimate(name)
            if estimate is None:
                log.warning(
                    "farm-audit: --fail-on %s%s%g: %s could not be computed",
                    name,
                    sign,
                    value,
                    name,
                )
                continue
            if _COMPARE[sign](estimate, value):
                failed.append(f"{name} = {estimate:.4g} {sign} {value:g}")
        return failed

    def markdown(self, failed: Sequence[str] = ()) -> str:
        lines = [
            f"# Audit of {self.judge}",
            "",
            f"{self.pairs} pairs, each asked in both orders, {self.repeats} run(s); "
            "95% bootstrap intervals over the pairs.",
            "",
            "| figure | estimate [95% CI] | n (pairs) | what |",
            "|---|---|---|---|",
        ]
        for figure in self.figures:
            if figure.estimate is None:
                shown = "n/a"
            elif figure.ci_low is None:
                shown = f"{figure.estimate:.3f}"
            else:
                shown = f"{figure.estimate:.3f} [{figure.ci_low:.3f}, {figure.ci_high:.3f}]"
            lines.append(f"| {figure.figure} | {shown} | {figure.n} | {figure.what} |")
        lines += ["", *[f"- {note}" for note in self.notes]] if self.notes else []
        if failed:
            lines += ["", "**Failed checks** (--fail-on):", *[f"- {line}" for line in failed]]
        return "\n".join(lines) + "\n"


def audit(
    items: list[Any],
    runs: list[list[dict[str, Any]]],
    judge: str,
    *,
    humans: list[list[float]] | None = None,
    human_names: list[list[str]] | None = None,
    judge_family: str | None = None,
    families: dict[str, str] | None = None,
    resamples: int = 1000,
    seed: int = 0,
    min_length_difference: int = 30,
    epsilon: float = 0.15,
) -> Audit:
    """The audit's figures from the records of `ask`."""
    verdicts = Verdicts.from_runs(items, runs)
    boot = Bootstrap(len(items), resamples, seed)
    figures = position_figures(verdicts, boot)
    figures += style_figures(verdicts, boot, min_length_difference)
    notes = []
    if len(runs) > 1:
        figures.append(variance_figure(verdicts, boot))
    else:
        notes.append(
            "one run: the judge does not sample (variance 0 by construction), or --repeats 1"
        )
    if judge_family is not None:
        figures += self_preference_figures(verdicts, humans, judge_family, families or {}, boot)
    else:
        notes.append("no judge family (--judge-family or --families): no self-preference")
    points: list[tuple[float, float]] = []
    if humans is not None:
        found, points = human_figures(verdicts, humans, epsilon, boot, human_names)
        figures += found
    return Audit(judge, len(items), len(runs), figures, points, notes)


def plot_audit(path: str, result: Audit) -> str:
    """The figures as points with their intervals (fractions on one panel), and the reliability
    curve (confidence bins against the humans' share preferring output_2) where there are humans."""
    from farmkit.evaluate.plots import _pyplot, _save

    plt = _pyplot()
    shown = [f for f in result.figures if f.estimate is not None]
    panels = 2 if result.points else 1
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 0.45 * len(shown) + 1.8))
    axes = np.atleast_1d(axes)
    ax = axes[0]
    for k, f in enumerate(shown):
        low = f.estimate if f.ci_low is None else f.ci_low
        high = f.estimate if f.ci_high is None else f.ci_high
        ax.errorbar(
            f.estimate,
            k,
            xerr=[[f.estimate - low], [high - f.estimate]],
            fmt="o",
            color="tab:blue",
            capsize=3,
        )
    ax.set_yticks(range(len(shown)), [f.figure for f in shown])
    ax.invert_yaxis()
    ax.axvline(0.5, color="grey", lw=0.8, ls=":")
    ax.axvline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("estimate (95% CI)")
    ax.set_title(f"{result.judge}: {result.pairs} pairs, both orders, {result.repeats} run(s)")
    if result.points:
        confidence, outcome = (np.array(v, float) for v in zip(*result.points, strict=True))
        bins = np.minimum((confidence * CALIBRATION_BINS).astype(int), CALIBRATION_BINS - 1)
        ax = axes[1]
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="perfect calibration")
        xs, ys, sizes = [], [], []
        for b in range(CALIBRATION_BINS):
            inside = bins == b
            if inside.any():
                xs.append(confidence[inside].mean())
                ys.append(outcome[inside].mean())
                sizes.append(int(inside.sum()))
        ax.plot(xs, ys, "o-", color="tab:orange", label="judge")
        for x, y, size in zip(xs, ys, sizes, strict=True):
            ax.annotate(str(size), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        ax.set_xlim(-0.03, 1.03)
        ax.set_ylim(-0.03, 1.08)
        ax.set_xlabel("judge's confidence that output_2 is better")
        ax.set_ylabel("share of humans' majority preferring output_2")
        ax.set_title("reliability (points: verdicts per bin)")
        ax.legend(loc="upper left", fontsize=8)
    return _save(figure, path)
