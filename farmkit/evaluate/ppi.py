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
The authors' library (ppi-python) computes the same for means, but depends on numba, statsmodels,
scikit-learn and gdown; the mean case is these few lines of numpy.
"""

from __future__ import annotations

import hashlib
from statistics import NormalDist
from typing import Any

import numpy as np
import orjson


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
        "low": estimate - z * standard_error,
        "high": estimate + z * standard_error,
        "lambda": lam,
    }


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
        self.null_labels = 0

    def add_simulated(
        self,
        records: list[dict[str, Any]],
        slots: list[int],
        values: np.ndarray,
        flips: np.ndarray,
        names: list[tuple[Any, Any]],
    ) -> None:
        """Simulated verdicts: records, their (reference, model) slot, their win value for the model
        (NaN: none), whether the model is in position 1, and the (reference, model) of each slot."""
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

    def add_human(self, record: dict[str, Any], value: float) -> None:
        """One human label (its win value for position 2, NaN: no verdict) on its pair; ValueError
        says why when it has no pair among the simulated ones."""
        matches = self._matches(record)
        if value != value:
            self.null_labels += 1
            return
        for pair, mirrored in matches:
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

    def unjudged(self) -> int:
        """Human-labelled pairs without a simulated verdict (left out of the estimate)."""
        return sum(
            1
            for (judged, _), (labelled, _) in zip(self.simulated, self.human, strict=True)
            if labelled and not judged
        )

    def figures(self, confidence: float) -> dict[int, dict[str, Any]]:
        """Each (reference, model) slot's human-only and prediction-powered figures, in percent."""
        slots = np.array(self.slot, dtype=np.int64)
        simulated = np.array(self.simulated, dtype=np.float64).reshape(-1, 2)
        human = np.array(self.human, dtype=np.float64).reshape(-1, 2)
        judged = simulated[:, 0] > 0  # pairs whose simulated verdicts were all null are left out
        labelled = judged & (human[:, 0] > 0)
        judge = np.divide(simulated[:, 1], simulated[:, 0], where=judged, out=np.zeros(len(slots)))
        label = np.divide(human[:, 1], human[:, 0], where=labelled, out=np.zeros(len(slots)))
        rows = {}
        for slot in np.unique(slots).tolist():
            mine = slots == slot
            rows[slot] = _row(
                label[labelled & mine], judge[labelled & mine], judge[judged & mine], confidence
            )
        return rows


def _row(
    human: np.ndarray, judge_labelled: np.ndarray, judge: np.ndarray, confidence: float
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "n_human": len(human),
        "human_win_rate": 100 * float(human.mean()) if len(human) else None,
        "human_standard_error": None,
        "ppi_win_rate": None,
        "ppi_standard_error": None,
        "ppi_ci_low": None,
        "ppi_ci_high": None,
        "ppi_lambda": None,
    }
    if len(human) < 2:  # no variance, nor a covariance with the judge
        return row
    figures = ppi_mean(human, judge_labelled, judge, confidence)
    row["human_standard_error"] = 100 * float(human.std(ddof=1) / np.sqrt(len(human)))
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
