"""A board's statistics (farm-winrate --baseline, --plan): every model against one baseline model with
a paired test on the prompts both were judged on, the p-values adjusted across the board, the
board's separability, and the number of prompts (and human labels) a study needs.

Definitions:
    paired test: per prompt d = x_model - x_baseline (each model's verdicts on a prompt averaged
        first), t = mean(d) / (sd(d) / sqrt(n)), two-sided p from Student's t with n - 1 degrees
        of freedom (`winrate.paired`, what --compare prints)
    Holm (the default): the m p-values sorted, p_(i) adjusted to max over j <= i of
        min(1, (m - j + 1) p_(j)); controls the family-wise error rate
    Benjamini-Hochberg (--adjust bh): p_(i) adjusted to min over j >= i of min(1, m p_(j) / j);
        controls the false discovery rate
    separability (Arena-Hard's figure): the share of the board's model pairs whose intervals (the
        bootstrap one with --bootstrap, else win_rate +- z standard_error) do not overlap
    prompts needed (--plan) to detect a difference of D points with a two-sided test at level
        alpha = 1 - confidence and power 1 - beta, from a pilot's standard deviation s of the
        paired differences (or, without --baseline, of the verdicts, against 50%):
        n = ceil(((z_(1 - alpha/2) + z_(1 - beta)) s / D)^2)
    human labels PPI needs for a standard error of T points (--target-se): the smallest n whose
        PPI++ standard error (farmkit/evaluate/ppi.py, with the pilot's lambda, variances and
        covariance) is at most T on the model's N pairs (`ppi.labels_for_se`)
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

ADJUSTMENTS = ("holm", "bh")


def adjust(p_values: list[float | None], method: str = "holm") -> list[float | None]:
    """The p-values adjusted for multiplicity (None stays None and is not counted)."""
    known = [(p, i) for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    m = len(known)
    order = sorted(known)
    if method == "holm":
        running = 0.0
        for rank, (p, i) in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p))
            adjusted[i] = running
    elif method == "bh":
        running = 1.0
        for rank in range(m - 1, -1, -1):
            p, i = order[rank]
            running = min(running, min(1.0, m * p / (rank + 1)))
            adjusted[i] = running
    else:
        raise ValueError(f"unknown adjustment {method!r}; expected one of {', '.join(ADJUSTMENTS)}")
    return adjusted


def against_baseline(
    comparisons: list[dict[str, Any]], method: str, confidence: float
) -> list[dict[str, Any]]:
    """`winrate.paired` rows (model_a the model, model_b the baseline) with p_adjusted (`method`)
    and significant (p_adjusted below 1 - confidence), most significant first."""
    adjusted = adjust([row["p_value"] for row in comparisons], method)
    rows = []
    for row, p in zip(comparisons, adjusted, strict=True):
        rows.append(
            {
                **row,
                "adjustment": method,
                "p_adjusted": p,
                "significant": None if p is None else p < 1 - confidence,
            }
        )
    rows.sort(key=lambda row: (row["p_adjusted"] is None, row["p_adjusted"] or 0.0))
    return rows


def interval(row: dict[str, Any], confidence: float) -> tuple[float, float] | None:
    """A board row's interval on its win rate: the bootstrap one when it has it, else normal."""
    if row.get("ci_low") is not None and row.get("ci_high") is not None:
        return row["ci_low"], row["ci_high"]
    if row.get("win_rate") is None or row.get("standard_error") is None:
        return None
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    return row["win_rate"] - z * row["standard_error"], row["win_rate"] + z * row["standard_error"]


def separability(rows: list[dict[str, Any]], confidence: float) -> tuple[float | None, int]:
    """(share of model pairs whose intervals do not overlap, number of pairs) among rows against
    one reference; (None, 0) for fewer than two rows with an interval."""
    intervals = [found for found in (interval(row, confidence) for row in rows) if found]
    pairs = separate = 0
    for i, (low_a, high_a) in enumerate(intervals):
        for low_b, high_b in intervals[i + 1 :]:
            pairs += 1
            separate += high_a < low_b or high_b < low_a
    return (separate / pairs if pairs else None), pairs


def prompts_needed(sd: float, detect: float, confidence: float, power: float) -> int | None:
    """Prompts for a two-sided test at level 1 - confidence to detect a difference of `detect`
    (same unit as sd) with `power`, by the normal approximation; None when sd is unknown."""
    if sd is None or not math.isfinite(sd):
        return None
    z = NormalDist().inv_cdf((1 + confidence) / 2) + NormalDist().inv_cdf(power)
    return max(2, math.ceil((z * sd / detect) ** 2))


def plan_row(
    name: str, against: str, values: np.ndarray, detect: float, confidence: float, power: float
) -> dict[str, Any]:
    """The planning row of one model: its pilot's per-prompt values (differences with the baseline,
    or win values against the reference minus 0.5), in [0, 1] units; figures in points."""
    sd = float(values.std(ddof=1)) if len(values) > 1 else None
    return {
        "generator": name,
        "against": against,
        "n_pilot": len(values),
        "pilot_difference": 100 * float(values.mean()) if len(values) else None,
        "pilot_sd": None if sd is None else 100 * sd,
        "detect": detect,
        "power": power,
        "level": 1 - confidence,
        "n_prompts_needed": prompts_needed(
            None if sd is None else 100 * sd, detect, confidence, power
        ),
    }
