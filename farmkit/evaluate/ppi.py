"""Prediction-powered win rates (farm-winrate --humans): many simulated verdicts, their bias corrected
by human labels on a uniformly random subset of the same pairs.

Definitions (PPI++, Angelopoulos, Duchi and Zrnic 2023, the mean with power tuning):
    each of a model's N pairs has a simulated win value f (the mean of its simulated verdicts); n of
    them, drawn uniformly at random, also have a human one Y (the mean of their human labels)
    theta = lambda * mean(f over the N) + mean(Y - lambda * f over the n)
    lambda = cov(Y, f) / var(f), clipped to [0, 1] (0: the humans alone; a judge that does not
        agree with the humans is not used)
    With lambda' = lambda (1 - n/N), theta = mean(Y - lambda' f over the n) + lambda' * mean(f over
    the N - n unlabelled), two independent means, so
    se^2 = var(Y - lambda' f over the n) / n + lambda'^2 var(f over the N) / (N - n)
    which lambda minimises; at lambda = 0 it is the humans' own var(Y) / n, so the interval
    theta +- z se is never (asymptotically) wider than theirs. Variances are sample ones (ddof 1).
    The interval is clipped to [0, 1] (a win rate's bounds); the humans' own interval is Wilson's
    score interval, which respects them by construction.

Labels sampled with known probabilities (farm-label --judge: active statistical inference, Zrnic and
Candes 2024), each label carrying its pair's `sampling_probability` pi_i, use the inverse-probability
weighted estimate instead, over all N judged pairs (xi_i = 1 for a labelled pair):
    g_i = lambda f_i + c,  z_i = g_i + xi_i (Y_i - g_i) / pi_i,  theta = mean(z),  se^2 = var(z) / N
    var(z_i) = var(Y_i) + E[(Y_i - g_i)^2 (1 - pi_i) / pi_i], so lambda and c are the weighted least
    squares of Y on f over the labelled pairs, weights (1 - pi) / pi^2 (lambda clipped to [0, 1]), and
    the labelled residuals' spread in var(z) is scaled by k / (k - 2) for the two fitted (k: Kish's
    effective number of those weights, at least 3; under 3 labels with pi < 1, lambda = c = 0)
E[z_i] = Y_i whatever lambda and c, so the estimate is unbiased for the mean of Y (lambda and c
estimated from the same data leave an O(1/N) bias); with pi_i = n/N it is PPI on a Bernoulli sample,
as narrow as PPI++ on a uniform sample of n. Without the intercept c, a judge whose mean is off the
humans' leaves mean(Y - lambda f)^2 in every label's weighted term (8% wider on PandaLM's 999 pairs,
13% in tests/evaluate/test_winrate_ppi.py).

Below MIN_HUMAN_LABELS human labels a row is flagged (small_sample): the normal interval's coverage
was checked by simulation (bench/bench_active_labels.py --small, 4000 draws a cell) to be at least
0.91 at 95% for win rates between 20% and 80% from 40 labels up; it falls to 0.86-0.89 at 20 labels
and 0.31-0.69 at 5 (bench/results/active-labels-2026-12-07.jsonl).

The authors' library (ppi-python) computes the same for means, but depends on numba, statsmodels,
scikit-learn and gdown; the mean case is these few lines of numpy.
"""

from __future__ import annotations

import hashlib
from statistics import NormalDist
from typing import Any

import numpy as np
import orjson

from farmkit.core.io import FarmError

MIN_HUMAN_LABELS = 40  # see the module's docstring


def ppi_mean(
    human: np.ndarray, judge_labelled: np.ndarray, judge: np.ndarray, confidence: float = 0.95
) -> dict[str, np.ndarray]:
    """PPI++ estimate of a mean along the last axis (leading axes are independent problems): human
    labels Y (..., n), the judge's f on the same pairs (..., n) and on all N pairs (..., N), the
    labelled ones included. Returns estimate, standard_error, low, high (the normal interval at
    `confidence`) and lambda, each of the leading shape."""
    n, total = human.shape[-1], judge.shape[-1]
    centred = judge_labelled - judge_labelled.mean(axis=-1, keepdims=True)
    covariance = (centred * (human - human.mean(axis=-1, keepdims=True))).sum(axis=-1) / (n - 1)
    variance = judge.var(axis=-1, ddof=1)
    safe = np.where(variance > 0, variance, 1.0)
    lam = np.clip(np.where(variance > 0, covariance / safe, 0.0), 0.0, 1.0)
    estimate = lam * judge.mean(axis=-1) + (human - lam[..., None] * judge_labelled).mean(axis=-1)
    scaled = lam * (1 - n / total)
    rectified = human - scaled[..., None] * judge_labelled
    # lambda'^2 / (N - n) = lambda^2 (N - n) / N^2: defined when every pair is labelled
    standard_error = np.sqrt(
        rectified.var(axis=-1, ddof=1) / n + lam**2 * variance * (total - n) / total**2
    )
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    return {
        "estimate": estimate,
        "standard_error": standard_error,
        "low": np.clip(estimate - z * standard_error, 0.0, 1.0),
        "high": np.clip(estimate + z * standard_error, 0.0, 1.0),
        "lambda": lam,
    }


def ppi_mean_ipw(
    human: np.ndarray,
    judge: np.ndarray,
    probability: np.ndarray,
    labelled: np.ndarray,
    confidence: float = 0.95,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> dict[str, np.ndarray]:
    """The inverse-probability weighted PPI estimate of a mean along the last axis (see the module's
    docstring), over all N pairs: human labels Y (..., N; read where `labelled`), the judge's f
    (..., N), each pair's sampling probability pi (..., N; read where `labelled`) and whether it was
    drawn and labelled (..., N). The interval is clipped to `bounds`. Returns what ppi_mean does."""
    pi = np.where(labelled, probability, 1.0)
    y = np.where(labelled, human, 0.0)
    # the weighted least squares of Y on (f, 1) over the labelled pairs, weights (1 - pi) / pi^2:
    # the lambda and c that minimise the estimated mean of (1 - pi) / pi (Y - lambda f - c)^2
    weight = np.where(labelled, (1 - pi) / pi**2, 0.0)
    total_weight = weight.sum(axis=-1, keepdims=True)
    safe_total = np.where(total_weight > 0, total_weight, 1.0)
    f_mean = (weight * judge).sum(axis=-1, keepdims=True) / safe_total
    y_mean = (weight * y).sum(axis=-1, keepdims=True) / safe_total
    covariance = (weight * (judge - f_mean) * (y - y_mean)).sum(axis=-1)
    variance = (weight * (judge - f_mean) ** 2).sum(axis=-1)
    # under 3 such labels the line would fit them exactly: the plain weighted mean (lambda = c = 0)
    count = (weight > 0).sum(axis=-1)
    fit = count > 2
    safe = np.where(variance > 0, variance, 1.0)
    lam = np.clip(np.where(fit & (variance > 0), covariance / safe, 0.0), 0.0, 1.0)
    fitted = lam[..., None] * judge + np.where(
        fit[..., None], y_mean - lam[..., None] * f_mean, 0.0
    )
    residual = np.where(labelled, (y - fitted) / pi, 0.0)
    estimate = (fitted + residual).mean(axis=-1)
    # two parameters fitted to the residuals: their spread scaled by k / (k - 2), k the weights'
    # effective number (Kish's: a few labels of small pi can carry the fit), at least 3
    squares = np.maximum((weight**2).sum(axis=-1), np.finfo(float).tiny)
    effective = np.maximum(total_weight[..., 0] ** 2 / squares, 3.0)
    inflate = np.sqrt(np.where(fit, effective / (effective - 2), 1.0))[..., None]
    z_values = fitted + residual * np.where(weight > 0, inflate, 1.0)
    standard_error = z_values.std(axis=-1, ddof=1) / np.sqrt(z_values.shape[-1])
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    return {
        "estimate": estimate,
        "standard_error": standard_error,
        "low": np.clip(estimate - z * standard_error, *bounds),
        "high": np.clip(estimate + z * standard_error, *bounds),
        "lambda": lam,
    }


def wilson(mean: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion `mean` observed over `n` labels (a tie counts half,
    as in the win rate), inside [0, 1] by construction."""
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n))
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def rank_sets(
    estimates: np.ndarray, standard_errors: np.ndarray, confidence: float = 0.95
) -> tuple[np.ndarray, ...]:
    """Rank sets of K systems (1 the best) that hold together at `confidence` (prediction-powered
    ranking, Chatzi et al. 2024): from simultaneous intervals (each at 1 - (1 - confidence) / K,
    Bonferroni), a system ranks below every one whose interval lies wholly above its own and above
    every one wholly below it. When every interval covers its system's truth, every true rank is
    in its set. Returns each one's best rank, worst rank, and the simultaneous interval's low and
    high."""
    count = len(estimates)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / (2 * count))
    low, high = estimates - z * standard_errors, estimates + z * standard_errors
    above = (low[None, :] > high[:, None]).sum(axis=1)  # j surely better than i
    below = (high[None, :] < low[:, None]).sum(axis=1)  # j surely worse than i
    return 1 + above, count - below, low, high


def _digest(instruction: str, input: str, first: str, second: str) -> bytes:
    return hashlib.blake2b(
        orjson.dumps([instruction, input, first, second]), digest_size=16
    ).digest()


def _texts(record: dict[str, Any]) -> tuple[str, str, str, str] | None:
    """(instruction, input, output_1, output_2) of a record that has them all."""
    texts = (record.get("instruction"), record.get("input") or "")
    texts += (record.get("output_1"), record.get("output_2"))
    return texts if all(isinstance(text, str) for text in texts) else None


class PairLedger:
    """The pairs behind each (reference, model)'s simulated verdicts, and the human labels on them.

    A pair is known by a digest of its texts in the model's orientation (instruction, input, the
    reference's output, the model's), or, for records without texts, by (item key, reference,
    model). A human label is matched by its texts in either order (a swapped pair mirrors it), or,
    without texts, by item key and generators."""

    def __init__(self, item_key: Any):
        self._item_key = item_key
        self._pairs: dict[tuple[int, Any], int] = {}  # (slot, identity) -> pair
        self._by_texts: dict[bytes, list[int]] = {}
        self._by_item: dict[tuple[Any, Any, Any], int] = {}  # -1: several pairs share it
        self._has_texts: list[bool] = []
        self.slot: list[int] = []
        self.simulated: list[list[float]] = []  # per pair: count, sum of the simulated verdicts
        self.human: list[list[float]] = []  # per pair: count, sum of the human labels
        self.item: list[Any] = []  # per pair: its item key (None: none), for paired differences
        self.probability: list[float | None] = []  # per pair: its labels' sampling probability
        self.null_labels = 0

    def add_simulated(
        self,
        records: list[dict[str, Any]],
        slots: list[int],
        values: np.ndarray,
        flips: np.ndarray,
        names: list[tuple[Any, Any]],
    ) -> list[int]:
        """Simulated verdicts: records, their (reference, model) slot, their win value for the model
        (NaN: none), whether the model is in position 1, and the (reference, model) of each slot.
        Returns each record's pair."""
        found = []
        for record, slot, value, flip in zip(
            records, slots, values.tolist(), flips.tolist(), strict=True
        ):
            reference, model = names[slot]
            texts = _texts(record)
            digest = None
            if texts is not None:
                instruction, input, first, second = texts
                digest = _digest(
                    instruction, input, *((second, first) if flip else (first, second))
                )
            item = self._item_key(record)
            by_item = None if item is None else (item, reference, model)
            identity = digest or by_item or ("record", len(self.slot))
            pair = self._pairs.get((slot, identity))
            if pair is None:
                pair = self._pairs[(slot, identity)] = len(self.slot)
                self.slot.append(slot)
                self.simulated.append([0, 0.0])
                self.human.append([0, 0.0])
                self.item.append(item)
                self.probability.append(None)
                self._has_texts.append(digest is not None)
                if digest is not None:
                    self._by_texts.setdefault(digest, []).append(pair)
                if by_item is not None:
                    self._by_item[by_item] = (
                        pair if self._by_item.get(by_item, pair) == pair else -1
                    )
            if value == value:
                self.simulated[pair][0] += 1
                self.simulated[pair][1] += value
            found.append(pair)
        return found

    def add_human(self, record: dict[str, Any], value: float) -> None:
        """One human label (its win value for position 2, NaN: no verdict) on its pair; ValueError
        says why when it has no pair among the simulated ones."""
        matches = self._matches(record)
        probability = record.get("sampling_probability")
        if probability is not None and (
            isinstance(probability, bool)
            or not isinstance(probability, (int, float))
            or not 0 < probability <= 1
        ):
            raise ValueError(
                f"sampling_probability is {probability!r}; expected the probability its pair was "
                "drawn with, in (0, 1] (farm-label --judge writes it)"
            )
        if value != value:
            self.null_labels += 1
            return
        for pair, mirrored in matches:
            if self.human[pair][0] and self.probability[pair] != probability:
                raise ValueError(
                    f"its sampling_probability ({probability!r}) is not that of the pair's other "
                    f"labels ({self.probability[pair]!r}); a pair is drawn once, with one probability"
                )
            self.probability[pair] = probability
            self.human[pair][0] += 1
            self.human[pair][1] += 1 - value if mirrored else value

    def _matches(self, record: dict[str, Any]) -> list[tuple[int, bool]]:
        """The pairs a label is on, each with whether its positions are the other way round: by its
        texts, else by item key and generators (with texts, only pairs simulated without them)."""
        texts = _texts(record)
        wanted = "the simulated pairs; the humans must label pairs of the simulated preferences"
        if texts is not None:
            instruction, input, first, second = texts
            shown, mirrored = _digest(*texts), _digest(instruction, input, second, first)
            matches = [(pair, False) for pair in self._by_texts.get(shown, ())]
            if mirrored != shown:
                matches += [(pair, True) for pair in self._by_texts.get(mirrored, ())]
            if matches:
                return matches
        item = self._item_key(record)
        first, second = record.get("generator_1"), record.get("generator_2")
        if item is None or first is None or second is None:
            if texts is not None:
                raise ValueError(
                    f"its pair (instruction, input, output_1 and output_2, in either order) is not among {wanted}"
                )
            raise ValueError(
                "it has no output_1 and output_2 texts, nor an id (or instruction) and generator_1 "
                "and generator_2 to find its pair by"
            )
        found = [
            (self._by_item.get((item, a, b)), mirrored)
            for a, b, mirrored in ((first, second, False), (second, first, True))
        ]
        if any(pair == -1 for pair, _ in found):
            raise ValueError(
                f"several simulated pairs of {first} and {second} have the item {item!r} (different "
                "outputs): give the label its output_1 and output_2 texts"
            )
        matches = [
            (pair, mirrored)
            for pair, mirrored in found
            if pair is not None and not (texts and self._has_texts[pair])
        ]
        if not matches:
            raise ValueError(
                f"its pair (item {item!r}, {first} against {second}, in either order"
                f"{', with these texts' if texts else ''}) is not among {wanted}"
            )
        return matches

    def labels_by_pair(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per pair: whether it has a label, the mean of its labels (0 where none), and whether its
        labels carry a sampling_probability (drawn with unequal probabilities)."""
        human = np.array(self.human, dtype=np.float64).reshape(-1, 2)
        labelled = human[:, 0] > 0
        label = np.divide(human[:, 1], human[:, 0], where=labelled, out=np.zeros(len(human)))
        weighted = np.array([p is not None for p in self.probability], dtype=bool)
        return labelled, label, weighted

    def unjudged(self) -> int:
        """Human-labelled pairs without a simulated verdict (left out of the estimate)."""
        return sum(
            1
            for (judged, _), (labelled, _) in zip(self.simulated, self.human, strict=True)
            if labelled and not judged
        )

    def _values(self) -> tuple[np.ndarray, ...]:
        """Per pair: slot, whether judged, whether labelled, judge mean, human mean, probability
        (NaN: none recorded)."""
        slots = np.array(self.slot, dtype=np.int64)
        simulated = np.array(self.simulated, dtype=np.float64).reshape(-1, 2)
        human = np.array(self.human, dtype=np.float64).reshape(-1, 2)
        judged = simulated[:, 0] > 0  # pairs whose simulated verdicts were all null are left out
        labelled = judged & (human[:, 0] > 0)
        judge = np.divide(simulated[:, 1], simulated[:, 0], where=judged, out=np.zeros(len(slots)))
        label = np.divide(human[:, 1], human[:, 0], where=labelled, out=np.zeros(len(slots)))
        probability = np.array(
            [np.nan if p is None else p for p in self.probability], dtype=np.float64
        )
        return slots, judged, labelled, judge, label, probability

    def figures(self, confidence: float, names: list[Any]) -> dict[int, dict[str, Any]]:
        """Each (reference, model) slot's human-only and prediction-powered figures, in percent
        (`names`: each slot's (reference, model), for the messages)."""
        slots, judged, labelled, judge, label, probability = self._values()
        rows = {}
        for slot in np.unique(slots).tolist():
            mine = slots == slot
            weights = _probabilities(probability[labelled & mine], names[slot][1])
            rows[slot] = _row(
                label[labelled & mine],
                judge[labelled & mine],
                judge[judged & mine],
                confidence,
                weights,
                judge[judged & ~labelled & mine],
            )
        return rows

    def difference(self, slot_a: int, slot_b: int, confidence: float) -> dict[str, Any]:
        """The prediction-powered difference of two slots' win rates (a - b) on the items both were
        judged on, paired by item: the mean of f_a - f_b corrected by Y_a - Y_b on the items both
        pairs of which were labelled (drawn with probability pi_a pi_b: farm-label draws each pair
        independently), in percent."""
        slots, judged, labelled, judge, label, probability = self._values()
        by_item: list[dict[Any, int]] = [{}, {}]
        for side, slot in enumerate((slot_a, slot_b)):
            for pair in np.flatnonzero((slots == slot) & judged).tolist():
                if self.item[pair] is not None:
                    by_item[side].setdefault(self.item[pair], pair)
        common = [(a, by_item[1][key]) for key, a in by_item[0].items() if key in by_item[1]]
        first = np.array([a for a, _ in common], dtype=np.int64)
        second = np.array([b for _, b in common], dtype=np.int64)
        both = labelled[first] & labelled[second]
        f = judge[first] - judge[second]
        y = label[first] - label[second]
        row: dict[str, Any] = {
            "n_human": int(both.sum()),
            "ppi_difference": None,
            "ppi_standard_error": None,
            "ppi_ci_low": None,
            "ppi_ci_high": None,
            "ppi_lambda": None,
            "small_sample": bool(both.sum() < MIN_HUMAN_LABELS),
        }
        if both.sum() < 2:
            return row
        weights = _probabilities(
            np.concatenate([probability[first[both]], probability[second[both]]]), "the comparison"
        )
        if weights is None:
            figures = ppi_mean(y[both], f[both], f, confidence)
            figures["low"], figures["high"] = _bounded(figures, confidence, (-1.0, 1.0))
        else:
            pi = np.where(both, probability[first] * probability[second], 1.0)
            figures = ppi_mean_ipw(y, f, pi, both, confidence, (-1.0, 1.0))
        row.update(
            ppi_difference=100 * float(figures["estimate"]),
            ppi_standard_error=100 * float(figures["standard_error"]),
            ppi_ci_low=100 * float(figures["low"]),
            ppi_ci_high=100 * float(figures["high"]),
            ppi_lambda=float(figures["lambda"]),
        )
        return row


def _bounded(figures: dict[str, Any], confidence: float, bounds: tuple[float, float]):
    """ppi_mean's interval again, clipped to `bounds` instead of [0, 1] (a difference)."""
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    estimate, se = figures["estimate"], figures["standard_error"]
    return np.clip(estimate - z * se, *bounds), np.clip(estimate + z * se, *bounds)


def _probabilities(probability: np.ndarray, what: Any) -> np.ndarray | None:
    """The sampling probabilities of a set of labelled pairs: None when none was recorded (a uniform
    sample), all of them otherwise; a mixture is an error."""
    recorded = ~np.isnan(probability)
    if not recorded.any():
        return None
    if not recorded.all():
        raise FarmError(
            f"{what}: {int(recorded.sum())} labelled pairs carry a sampling_probability and "
            f"{int((~recorded).sum())} do not; expected the labels of one farm-label session "
            "(all drawn with known probabilities, or none: a uniform sample)"
        )
    return probability


def _row(
    human: np.ndarray,
    judge_labelled: np.ndarray,
    judge: np.ndarray,
    confidence: float,
    probability: np.ndarray | None = None,
    judge_unlabelled: np.ndarray | None = None,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "n_human": len(human),
        "human_win_rate": None,
        "human_standard_error": None,
        "human_ci_low": None,
        "human_ci_high": None,
        "ppi_win_rate": None,
        "ppi_standard_error": None,
        "ppi_ci_low": None,
        "ppi_ci_high": None,
        "ppi_lambda": None,
        "small_sample": len(human) < MIN_HUMAN_LABELS,
    }
    if not len(human):
        return row
    # the humans alone: their mean (weighted by 1 / pi when the pairs were drawn unequally, with
    # Kish's effective sample size), Wilson's interval
    weights = np.ones(len(human)) if probability is None else 1 / probability
    mean = float(np.average(human, weights=weights))
    effective = float(weights.sum() ** 2 / (weights**2).sum())
    row["human_win_rate"] = 100 * mean
    low, high = wilson(mean, effective, confidence)
    row["human_ci_low"], row["human_ci_high"] = 100 * low, 100 * high
    if len(human) < 2:  # no variance, nor a covariance with the judge
        return row
    if probability is None:
        figures = ppi_mean(human, judge_labelled, judge, confidence)
        row["human_standard_error"] = 100 * float(human.std(ddof=1) / np.sqrt(len(human)))
    else:
        figures = ppi_mean_ipw(
            np.concatenate([human, np.zeros(len(judge_unlabelled))]),
            np.concatenate([judge_labelled, judge_unlabelled]),
            np.concatenate([probability, np.ones(len(judge_unlabelled))]),
            np.arange(len(human) + len(judge_unlabelled)) < len(human),
            confidence,
        )
        deviations = weights * (human - mean) / weights.sum()
        row["human_standard_error"] = 100 * float(
            np.sqrt((deviations**2).sum() * len(human) / (len(human) - 1))
        )
    row["ppi_win_rate"] = 100 * float(figures["estimate"])
    row["ppi_standard_error"] = 100 * float(figures["standard_error"])
    row["ppi_ci_low"] = 100 * float(figures["low"])
    row["ppi_ci_high"] = 100 * float(figures["high"])
    row["ppi_lambda"] = float(figures["lambda"])
    return row


def labels_for_se(
    human: np.ndarray, judge_labelled: np.ndarray, judge: np.ndarray, target_se: float
) -> int | None:
    """The fewest labels n (2 <= n <= N) whose PPI++ standard error would be at most target_se (same
    unit as the values), from a pilot's human labels, the judge on the same pairs and on all N:
    with the pilot's lambda, var(Y), cov(Y, f) and var(f), and lambda' = lambda (1 - n/N),
    se(n)^2 = (var Y - 2 lambda' cov + lambda'^2 var f) / n + lambda^2 var f (N - n) / N^2.
    A pilot whose labels are all equal has no variance: var(Y) is then q (1 - q), q = (sum + 0.5) /
    (n + 1). None: fewer than 2 pilot labels, or not reachable even with every pair labelled."""
    if len(human) < 2:
        return None
    total = len(judge)
    variance_f = judge.var(ddof=1) if total > 1 else 0.0
    covariance = float(np.cov(human, judge_labelled, ddof=1)[0, 1])
    variance_y = float(human.var(ddof=1))
    if variance_y == 0:  # a pilot of equal labels: the Bernoulli variance of its shrunk mean
        shrunk = (float(human.sum()) + 0.5) / (len(human) + 1)
        variance_y = shrunk * (1 - shrunk)
    lam = float(np.clip(covariance / variance_f, 0.0, 1.0)) if variance_f > 0 else 0.0
    n = np.arange(2, total + 1, dtype=np.float64)
    scaled = lam * (1 - n / total)
    rectified = variance_y - 2 * scaled * covariance + scaled**2 * variance_f
    se = np.sqrt(np.maximum(rectified, 0.0) / n + lam**2 * variance_f * (total - n) / total**2)
    reached = np.flatnonzero(se <= target_se)
    return int(n[reached[0]]) if len(reached) else None


def slot_values(ledger: PairLedger) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each (reference, model) slot's (human labels, the judge on them, the judge on every pair),
    as `PairLedger.figures` reads them."""
    slots = np.array(ledger.slot, dtype=np.int64)
    simulated = np.array(ledger.simulated, dtype=np.float64).reshape(-1, 2)
    human = np.array(ledger.human, dtype=np.float64).reshape(-1, 2)
    judged = simulated[:, 0] > 0
    labelled = judged & (human[:, 0] > 0)
    judge = np.divide(simulated[:, 1], simulated[:, 0], where=judged, out=np.zeros(len(slots)))
    label = np.divide(human[:, 1], human[:, 0], where=labelled, out=np.zeros(len(slots)))
    return {
        slot: (label[labelled & mine], judge[labelled & mine], judge[judged & mine])
        for slot in np.unique(slots).tolist()
        for mine in [slots == slot]
    }
