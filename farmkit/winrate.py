"""Win rates against a reference from preference records, in one streaming pass.

AlpacaEval's leaderboard figures (reproduced exactly from its published annotations):
    x = preference - 1 for the model in position 2 (1 -> 0, 2 -> 1, 1.5 and the legacy 0 -> 0.5,
        fractional preferences count fractionally); null verdicts are dropped and counted
    win_rate = 100 * mean(x);  standard_error = 100 * sd(x, ddof=1) / sqrt(n)
    n_wins = #(x > 0.5), n_losses = #(x < 0.5) (AlpacaEval's n_wins_base), n_draws = #(x == 0.5)
    discrete_win_rate = 100 * (n_wins + n_draws / 2) / n_total
    avg_length = floor of the mean length (characters) of the model's outputs, null verdicts included

Memory grows with the number of models, never with the number of records: each (reference, model)
keeps running sums, plus two bounded histograms when asked for (bootstrap values on a 1e-4 grid,
log length ratios on a 0.02 grid for the length-controlled win rate). Only `--compare` keeps one
value per item, and only for the two models compared.

Length-controlled win rate (ours; AlpacaEval's needs per-instruction difficulties from a hub):
a logistic regression fitted per model on its own records,
    P(model preferred) = sigmoid(alpha + beta * z),  z = log((len_model + 1) / (len_reference + 1)),
with soft targets x and a weak ridge penalty (1e-3) that keeps it finite when one side always wins.
length_controlled_win_rate = 100 * sigmoid(alpha): the predicted win rate when both outputs have the
same length; length_coefficient = beta (log-odds per e-fold length ratio); lc_standard_error by the
delta method from the inverse Hessian. z is binned at 0.02 (2% length ratio), each bin using the
mean z of its records, so the fit is that of the per-record regression up to that resolution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farmkit.io import RecordError, display_name, iter_json
from farmkit.validate import problems

LENGTH_BIN = 50.0  # bins per unit of log length ratio (0.02 wide)
VALUE_GRID = 10_000  # bootstrap histogram resolution of x
RIDGE = 1e-3


@dataclass
class Tally:
    """Running sums for one model against one reference."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    wins: int = 0
    losses: int = 0
    draws: int = 0
    dropped: int = 0
    length_sum: int = 0
    length_n: int = 0
    length_bins: dict[int, list[float]] = field(default_factory=dict)
    values: dict[int, list[float]] = field(default_factory=dict)


def verdict(preference: Any) -> float | None:
    """x = P(output_2 better) from a preference: None for null; ValueError outside [1, 2] and 0."""
    if preference is None:
        return None
    if preference == 0:
        return 0.5
    if not 1 <= preference <= 2:
        raise ValueError(
            f"preference {preference!r} is outside [1, 2]; expected 1, 2, 1.5 (tie), a value in between, "
            "0 (AlpacaEval's legacy tie) or null"
        )
    return float(preference) - 1.0


def item_key(record: dict[str, Any]) -> Any:
    """What identifies the instruction a verdict is about: id, instruction_index, or the texts."""
    for name in ("id", "instruction_index"):
        if record.get(name) is not None:
            return record[name]
    return (record.get("instruction"), record.get("input") or "")


def _length(record: dict[str, Any], position: str) -> int | None:
    length = record.get(f"len_{position}")
    if isinstance(length, int) and not isinstance(length, bool):
        return length
    text = record.get(f"output_{position}")
    return len(text) if isinstance(text, str) else None


class WinrateTable:
    """Accumulates preference records into one tally per (reference, model).

    reference: orient every record so that this system is the reference (records that do not
    involve it are skipped and counted); swap: treat position 1 as the model for every record;
    otherwise position 2 is the model and position 1 its reference. compare: pairs of models whose
    per-item verdicts are kept for a paired comparison.
    """

    def __init__(
        self,
        reference: str | None = None,
        swap: bool = False,
        bootstrap: bool = False,
        length_control: bool = True,
        compare: Sequence[tuple[str, str]] = (),
    ):
        self.reference, self.swap = reference, swap
        self.bootstrap, self.length_control = bootstrap, length_control
        self.tallies: dict[tuple[str, str], Tally] = {}
        self.skipped = 0
        self.items: dict[str, dict[Any, list[float]]] = {name: {} for pair in compare for name in pair}

    def add(self, record: dict[str, Any]) -> None:
        """Count one (already schema-checked) record; ValueError says what is wrong with it."""
        first, second = record.get("generator_1"), record.get("generator_2")
        flip = False
        if self.reference is not None:
            if first == self.reference:
                model, reference = second, first
            elif second == self.reference:
                model, reference, flip = first, second, True
            else:
                self.skipped += 1
                return
        elif self.swap:
            model, reference, flip = first, second, True
        else:
            model, reference = second, first
        if model is None:
            raise ValueError("no generator_2 to rank; expected generator_1 (the reference) and generator_2 (the model)")
        key = (reference or "", model)
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = Tally()
        model_length = _length(record, "1" if flip else "2")
        if model_length is not None:
            tally.length_sum += model_length
            tally.length_n += 1
        x = verdict(record.get("preference"))
        if x is None:
            tally.dropped += 1
            return
        if flip:
            x = 1.0 - x
        tally.n += 1
        tally.total += x
        tally.total_sq += x * x
        if x > 0.5:
            tally.wins += 1
        elif x < 0.5:
            tally.losses += 1
        else:
            tally.draws += 1
        if self.length_control and model_length is not None:
            reference_length = _length(record, "2" if flip else "1")
            if reference_length is not None:
                z = math.log((model_length + 1) / (reference_length + 1))
                cell = tally.length_bins.setdefault(round(z * LENGTH_BIN), [0.0, 0.0, 0.0])
                cell[0] += 1
                cell[1] += x
                cell[2] += z
        if self.bootstrap:
            cell = tally.values.setdefault(round(x * VALUE_GRID), [0.0, 0.0])
            cell[0] += 1
            cell[1] += x
        if model in self.items:
            cell = self.items[model].setdefault(item_key(record), [0.0, 0.0])
            cell[0] += 1
            cell[1] += x

    def add_file(self, path: str) -> None:
        """Read and count every record of a file (JSONL, JSON array, .gz, `-`)."""
        name = display_name(path)
        for number, record in iter_json(path):
            problem = problems(record, "preference")
            if problem is None:
                try:
                    self.add(record)
                    continue
                except ValueError as exc:
                    problem = str(exc)
            raise RecordError(name, number, problem)

    def rows(self, seed: int = 0, resamples: int = 1000, confidence: float = 0.95) -> list[dict[str, Any]]:
        """One leaderboard row per (reference, model), best win rate first."""
        rng = np.random.default_rng(seed)
        rows = []
        for (reference, model), tally in sorted(self.tallies.items()):
            row = leaderboard_row(model, reference, tally)
            if self.length_control:
                row.update(length_controlled(tally))
            if self.bootstrap:
                row.update(bootstrap_interval(tally, rng, resamples, confidence))
            rows.append(row)
        rows.sort(key=lambda row: -math.inf if row["win_rate"] is None else -row["win_rate"])
        return rows

    def comparison(self, model_a: str, model_b: str) -> dict[str, Any]:
        """Paired comparison of two models on the items both were judged on (see `paired`)."""
        return paired(model_a, model_b, self.items.get(model_a, {}), self.items.get(model_b, {}))


def leaderboard_row(model: str, reference: str, tally: Tally) -> dict[str, Any]:
    n = tally.n
    mean = tally.total / n if n else None
    if n > 1:
        variance = max(tally.total_sq - n * mean * mean, 0.0) / (n - 1)
        standard_error = 100 * math.sqrt(variance / n)
    else:
        standard_error = None
    return {
        "generator": model,
        "reference": reference,
        "win_rate": 100 * mean if n else None,
        "standard_error": standard_error,
        "n_wins": tally.wins,
        "n_losses": tally.losses,
        "n_draws": tally.draws,
        "n_total": n,
        "n_dropped": tally.dropped,
        "discrete_win_rate": 100 * (tally.wins + tally.draws / 2) / n if n else None,
        "avg_length": tally.length_sum // tally.length_n if tally.length_n else None,
    }


def fit_length_model(counts: np.ndarray, targets: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ridge-penalized logistic regression of soft targets on z (binned: counts per bin, sums of
    targets per bin): returns (alpha, beta) and their covariance (the inverse Hessian)."""
    design = np.column_stack([np.ones_like(z), z])
    params = np.zeros(2)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ params)))
        gradient = design.T @ (targets - counts * p) - RIDGE * params
        hessian = (design * (counts * p * (1 - p))[:, None]).T @ design + RIDGE * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        params = params + step
        if np.max(np.abs(step)) < 1e-10:
            break
    p = 1.0 / (1.0 + np.exp(-(design @ params)))
    hessian = (design * (counts * p * (1 - p))[:, None]).T @ design + RIDGE * np.eye(2)
    return params, np.linalg.inv(hessian)


def length_controlled(tally: Tally) -> dict[str, Any]:
    empty = {"length_controlled_win_rate": None, "lc_standard_error": None, "length_coefficient": None}
    if not tally.length_bins:
        return empty
    cells = np.array([tally.length_bins[key] for key in sorted(tally.length_bins)])
    counts, targets = cells[:, 0], cells[:, 1]
    z = cells[:, 2] / counts
    (alpha, beta), covariance = fit_length_model(counts, targets, z)
    rate = 1.0 / (1.0 + math.exp(-alpha))
    return {
        "length_controlled_win_rate": 100 * rate,
        "lc_standard_error": 100 * rate * (1 - rate) * math.sqrt(covariance[0, 0]),
        "length_coefficient": float(beta),
    }


def bootstrap_interval(tally: Tally, rng: np.random.Generator, resamples: int, confidence: float) -> dict[str, Any]:
    """Percentile bootstrap of the win rate over items, drawn from the histogram of verdicts (exact
    for 1 / 1.5 / 2 verdicts; fractional ones are grouped on a 1e-4 grid at their group's mean)."""
    if tally.n == 0:
        return {"ci_low": None, "ci_high": None}
    cells = np.array([tally.values[key] for key in sorted(tally.values)])
    counts, means = cells[:, 0], cells[:, 1] / cells[:, 0]
    estimates = []
    for start in range(0, resamples, 200):
        draws = rng.multinomial(tally.n, counts / tally.n, size=min(200, resamples - start))
        estimates.append(draws @ means / tally.n)
    low, high = np.quantile(np.concatenate(estimates), [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"ci_low": 100 * float(low), "ci_high": 100 * float(high)}


def paired(model_a: str, model_b: str, items_a: dict, items_b: dict) -> dict[str, Any]:
    """Difference of win rates (a - b) on the items both models have (a model's several verdicts
    on one item are averaged first), with the paired standard error and a two-sided t-test p-value."""
    from scipy import stats

    common = sorted(set(items_a) & set(items_b), key=repr)
    a = np.array([items_a[key][1] / items_a[key][0] for key in common])
    b = np.array([items_b[key][1] / items_b[key][0] for key in common])
    result: dict[str, Any] = {
        "model_a": model_a,
        "model_b": model_b,
        "n_items": len(common),
        "win_rate_a": 100 * float(a.mean()) if len(common) else None,
        "win_rate_b": 100 * float(b.mean()) if len(common) else None,
        "difference": None,
        "standard_error": None,
        "p_value": None,
    }
    if len(common) < 2:
        return result
    differences = a - b
    standard_error = float(differences.std(ddof=1) / math.sqrt(len(common)))
    result["difference"] = 100 * float(differences.mean())
    result["standard_error"] = 100 * standard_error
    if standard_error > 0:
        t = float(differences.mean()) / standard_error
        result["p_value"] = float(2 * stats.t.sf(abs(t), df=len(common) - 1))
    else:
        result["p_value"] = 1.0 if differences.mean() == 0 else 0.0
    return result


# Columns shown by the human-readable formats (jsonl and csv carry every field).
TABLE_COLUMNS = (
    "generator", "reference", "win_rate", "standard_error", "ci_low", "ci_high", "length_controlled_win_rate",
    "n_wins", "n_losses", "n_draws", "n_total", "n_dropped", "avg_length",
)


def render(rows: Iterable[dict[str, Any]], fmt: str, columns: Sequence[str] | None = None) -> str:
    """Rows as csv, markdown or an aligned text table (numbers to 2 decimals but in csv)."""
    import csv
    import io

    rows = [{k: v for k, v in row.items() if k != "provenance"} for row in rows]
    if not rows:
        return ""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    columns = [c for c in columns if any(c in row for row in rows)]
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(row.get(k)) for k in columns})
        return buffer.getvalue()
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join(lines) + "\n"
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}")
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for r in cells:
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _csv_value(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "" if value is None else value
