"""farm-label --judge: which pairs people label, drawn with known probabilities where the judge is least
sure (active statistical inference, Zrnic and Candes 2024; farmkit/evaluate/ppi.py weighs each label
by 1 / its probability, so the estimate stays unbiased)."""

from __future__ import annotations

from typing import Any

import numpy as np

from farmkit.core.io import FarmError, RecordError, display_name, iter_json
from farmkit.core.seeds import stable_hash, unit_interval


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    """A pair whatever the order of its outputs."""
    outputs = sorted((str(record.get("output_1")), str(record.get("output_2"))))
    return (record.get("instruction"), record.get("input") or "", *outputs)


def _win_value(preference: Any) -> float | None:
    """The win value of output_2 (None: no verdict), as farm-winrate reads a preference."""
    if preference is None:
        return None
    if isinstance(preference, bool) or not isinstance(preference, (int, float)):
        raise ValueError(f"preference is {preference!r}")
    if preference == 0:
        return 0.5
    if not 1 <= preference <= 2:
        raise ValueError(f"preference is {preference!r}")
    return float(preference) - 1


def judge_means(path: str) -> dict[tuple[Any, ...], float]:
    """Each judged pair's mean verdict (of the output that sorts second), over every verdict on it:
    a soft preference and the pool's disagreement both make it less sure."""
    sums: dict[tuple[Any, ...], list[float]] = {}
    name = display_name(path)
    for number, record in iter_json(path):
        if not isinstance(record, dict) or not all(
            isinstance(record.get(field), str) for field in ("instruction", "output_1", "output_2")
        ):
            raise RecordError(
                name, number, "expected a preference record (instruction, output_1, output_2)"
            )
        try:
            value = _win_value(record.get("preference"))
        except ValueError as exc:
            raise RecordError(
                name, number, f"{exc}; expected a verdict in [1, 2], 0 (a tie) or null"
            ) from None
        if value is None:
            continue
        key = _key(record)
        if str(record["output_2"]) != key[3]:
            value = 1 - value
        cell = sums.setdefault(key, [0, 0.0])
        cell[0] += 1
        cell[1] += value
    return {key: total / count for key, (count, total) in sums.items()}


def active_probabilities(
    uncertainty: np.ndarray, budget: float, uniform: float = 0.5, most: float | None = 2.0
) -> np.ndarray:
    """Each pair's probability of being labelled, for an expected `budget` labels (active
    statistical inference, Zrnic and Candes 2024): proportional to the square root of the expected
    squared residual of its human label given the judge (`uncertainty`, e.g. f (1 - f) of a soft
    verdict or of the pool's mean), mixed with the uniform n/N at the share `uniform`, so no weight
    1 / pi exceeds N / (uniform n), and at most `most` times n/N (None: 1), the rest of the budget
    spread over the others. The defaults keep every pair between half and twice as likely to be
    drawn as uniformly: a judge whose uncertainty does not say where it errs costs a little, not
    a lot (bench/bench_active_labels.py: the choice and its measurements)."""
    count = len(uncertainty)
    root = np.sqrt(np.clip(np.asarray(uncertainty, dtype=np.float64), 0.0, None))
    shape = root / root.sum() if root.sum() > 0 else np.full(count, 1 / count)
    shape = (1 - uniform) * shape + uniform / count
    ceiling = 1.0 if most is None else min(1.0, most * budget / count)
    probability = np.zeros(count)
    capped = np.zeros(count, dtype=bool)
    for _ in range(count):
        rest = budget - ceiling * capped.sum()
        probability = np.where(capped, ceiling, rest * shape / shape[~capped].sum())
        over = ~capped & (probability >= ceiling)
        if not over.any():
            break
        capped |= over
    return np.minimum(probability, ceiling)


def draw(items: list[dict[str, Any]], judge: str, budget: int, seed: int) -> list[dict[str, Any]]:
    """The pairs to label, each with its `sampling_probability`, most informative first: pair i is
    drawn with probability pi_i (active_probabilities of its f (1 - f), `budget` labels expected),
    by a seeded coin of its own. Every pair of PAIRS must be judged, and every judged pair in PAIRS:
    the estimate counts the pairs not drawn too."""
    means = judge_means(judge)
    keys = [_key(item) for item in items]
    missing = [position for position, key in enumerate(keys, 1) if key not in means]
    if missing:
        raise FarmError(
            f"{display_name(judge)}: no verdict on {len(missing)} pair(s) of PAIRS (the first: pair "
            f"{missing[0]}); --judge needs the simulated verdicts on every pair"
        )
    extra = len(means.keys() - set(keys))
    if extra:
        raise FarmError(
            f"{display_name(judge)}: judges {extra} pair(s) that PAIRS lacks; give farm-label every "
            "judged pair (farm-label SIM --judge SIM): the estimate weighs the pairs not drawn too"
        )
    if not 0 < budget <= len(items):
        raise FarmError(
            f"--budget {budget}: expected between 1 and the {len(items)} pairs of PAIRS"
        )
    f = np.array([means[key] for key in keys])
    probability = active_probabilities(f * (1 - f), budget)
    chosen = [
        index
        for index, key in enumerate(keys)
        if unit_interval(seed, "farm-label active", stable_hash(list(key))) < probability[index]
    ]
    chosen.sort(key=lambda index: -probability[index])
    return [{**items[index], "sampling_probability": float(probability[index])} for index in chosen]
