"""The length-controlled win rate: AlpacaEval 2's GLM (Dubois et al. 2024, "Length-Controlled AlpacaEval").

For each model against its reference, a logistic regression of the soft verdict x on
    logit P(model preferred) = theta + phi * tanh(delta / sd(delta)) + psi * difficulty[instruction],
delta = len_model - len_reference (characters), sd over that model's verdicts. theta is the model
term, phi the length term (length_coefficient: > 0 when the judge rewards the longer output), psi
scales the instruction difficulty. No intercept; an L1 penalty on (theta, phi, psi) whose strength C
is chosen among 10 values from 1e-4 to 1e4 by 5-fold cross-validated log loss, then refitted on all
verdicts (AlpacaEval's regularization, which also pulls theta towards the reference's 50%).
AlpacaEval also pulls (phi, psi) towards the judge's behaviour on the reference's own length-gamed
outputs: it adds to each model's fit the verdicts on the reference prompted to be verbose and prompted
to be concise (two per instruction, downloaded), each with weight 0.2, where the model term is absent
(the reference against itself has none), so they pin the length and difficulty terms directly. Those
verdicts are not available offline; ours stand in for them with the verdicts of all the models against
the reference: one fit shares (phi, psi) across them (each model its own theta), and each model's fit
adds the quadratic expansion of that fit's log loss around its (phi, psi), with the models' thetas
held at their fitted values (as AlpacaEval's stand-ins have theirs fixed at zero), for as many
stand-in verdicts as AlpacaEval's set has (two per instruction) at weight 0.2: penalty matrix =
0.2 * 2 * n * that information per verdict. It is what keeps a model that is always much shorter
(always longer) from buying its win rate back with its own length coefficient: gpt4_gamed (68
characters) has little length variation of its own, and its length term has to come from the judge.
length_controlled_win_rate = 100 * mean over the model's verdicts of sigmoid(theta + psi * difficulty),
the length term set to zero; lc_standard_error = the standard error of that mean over instructions.
Instruction difficulties (AlpacaEval downloads its own, fitted once jointly on its leaderboard) come
from a file, or are estimated from the input when it holds two models or more against one reference,
by one joint fit: logit = theta_m + phi_m * tanh(...) + ease[instruction], a ridge (unit Gaussian
prior) on ease, difficulty = -ease. lc_difficulty says which was used. AlpacaEval's warning: a length-
controlled win rate below min(wr - wr/4, wr - 10) or above max(wr + (100 - wr)/4, wr + 10) sets
lc_extreme_change (the GLM may have failed for that model).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from farmkit.core.io import FarmError, RecordError, display_name, iter_json, open_binary

LC_PENALTIES = np.logspace(-4, 4, 10)  # the inverse L1 strengths C tried by cross-validation
LC_FOLDS = 5
DIFFICULTY_RIDGE = 1.0
LC_POOLED_WEIGHT = (
    0.2  # AlpacaEval's weight of each verdict on the reference's length-gamed outputs
)
LC_POOLED_VERDICTS = 2  # and how many of those it has per instruction (verbose and concise)


def length_controlled(
    reference: str,
    verdicts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    item_index: dict[Any, int],
    given: tuple[str, dict[Any, float]] | None,
) -> tuple[list[dict[str, Any]], str]:
    """The GLM's figures for each model against one reference, from its verdicts (item index or -1,
    len_model - len_reference, x), and a sentence saying where the instruction difficulties came from.
    item_index: item key -> index; given: (file name, difficulty by item key) from a file, or None."""
    fits, _, source, note = board_fits(reference, verdicts, item_index, given)
    return [{**fit.figures(), "lc_difficulty": source} for fit in fits], note


@dataclass
class GlmFit:
    """One model's fitted GLM: its features (length term, difficulty, 1) per verdict, coefficients
    (phi, psi, theta), verdict weights and targets, the quadratic prior's matrix on (phi, psi) and
    the inverse L1 strength C."""

    features: np.ndarray
    coefficients: np.ndarray
    weights: np.ndarray
    targets: np.ndarray
    prior_matrix: np.ndarray | None
    penalty: float

    def controlled(self) -> np.ndarray:
        """Each verdict's win probability with the length term at zero."""
        return _sigmoid(self.features[:, 1:] @ self.coefficients[1:])

    def figures(self) -> dict[str, Any]:
        controlled = self.controlled()
        # the same controlled win rate on every instruction (no difficulty term: one model, no
        # --instruction-difficulty) has no spread to estimate an error from; its std is rounding
        # noise (1e-17), which AlpacaEval leaves blank
        n = len(controlled)
        spread = float(np.ptp(controlled)) if n > 1 else 0.0
        return {
            "length_controlled_win_rate": 100 * float(controlled.mean()),
            "lc_standard_error": 100 * float(controlled.std(ddof=1) / math.sqrt(n))
            if spread > CONSTANT_TOLERANCE
            else None,
            "length_coefficient": float(self.coefficients[0]),
        }

    def influence(self) -> np.ndarray:
        """u_i per verdict: N times the change of the length-controlled win rate (a probability) per
        unit of weight * (target - fitted probability) at verdict i, from the fit's linearization: the
        coefficients the L1 penalty leaves non-zero move by H^-1 sum_i w_i x_i (y_i - p_i), H the
        weighted information (plus the prior's matrix), the win rate by its gradient g = mean over
        the verdicts of sigma'(z) (0, difficulty, 1). Zero when the penalty zeroes every coefficient."""
        n, k = len(self.targets), len(self.coefficients)
        active = np.flatnonzero(self.coefficients != 0)
        if not len(active):
            return np.zeros(n)
        p = _sigmoid(self.features @ self.coefficients)
        hessian = (self.features * (self.weights * p * (1 - p))[:, None]).T @ self.features
        if self.prior_matrix is not None:
            size = len(self.prior_matrix)
            extra = np.zeros((k, k))
            extra[:size, :size] = self.prior_matrix
            hessian = hessian + extra
        controlled = self.controlled()
        gradient = np.concatenate(
            [[0.0], (self.features[:, 1:] * (controlled * (1 - controlled))[:, None]).mean(axis=0)]
        )
        block = hessian[np.ix_(active, active)]
        direction = np.linalg.lstsq(block, gradient[active], rcond=None)[0]
        return n * (self.features[:, active] @ direction)


def board_fits(
    reference: str,
    verdicts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    item_index: dict[Any, int],
    given: tuple[str, dict[Any, float]] | None,
    weights: list[np.ndarray] | None = None,
    held: np.ndarray | None = None,
    penalties: list[float] | None = None,
) -> tuple[list[GlmFit], np.ndarray | None, str, str]:
    """The GLM fitted to each model against one reference (see `length_controlled`), the instruction
    difficulties by item index (None: none), their source and a sentence saying so. weights: per
    model, a weight per verdict (default 1; the prediction-powered fit's, see
    `ppi_length_controlled`), in every fit: the difficulties', the pooled length effect's and each
    model's, its cross-validation included. held: instruction difficulties to use as they are;
    penalties: each model's C, instead of choosing it by cross-validation."""
    scaled = [_scaled_length_difference(delta) for _, delta, _ in verdicts]
    items, x = [v[0] for v in verdicts], [v[2] for v in verdicts]
    if weights is None:
        weights = [np.ones(len(target)) for target in x]
    if held is None:
        difficulty, source, note = instruction_difficulty(
            reference, items, scaled, x, item_index, given, weights
        )
    else:
        difficulty, source, note = held, "held", "held"
    row_difficulty = [
        np.zeros(len(i)) if difficulty is None else _lookup(difficulty, i) for i in items
    ]
    prior = pooled_length_effect(scaled, row_difficulty, x, weights) if len(verdicts) > 1 else None
    if prior is not None:
        note += f"; each model's length term pulled towards the {len(verdicts)} models' shared one"
    fits = []
    for m, (length_term, item_difficulty, target, weight) in enumerate(
        zip(scaled, row_difficulty, x, weights, strict=True)
    ):
        penalty = (
            None
            if prior is None
            else (prior[0], LC_POOLED_WEIGHT * LC_POOLED_VERDICTS * len(target) * prior[1])
        )
        c = None if penalties is None else penalties[m]
        fits.append(glm_fit(length_term, item_difficulty, target, penalty, weight, c))
    return fits, difficulty, source, note


def instruction_difficulty(
    reference: str,
    items: list[np.ndarray],
    scaled: list[np.ndarray],
    x: list[np.ndarray],
    item_index: dict[Any, int],
    given: tuple[str, dict[Any, float]] | None,
    weights: list[np.ndarray] | None = None,
) -> tuple[np.ndarray | None, str, str]:
    """Instruction difficulties by item index for one reference's models, their source (a row's
    lc_difficulty) and a sentence saying so (weights: per model, a weight per verdict)."""
    if given is not None:
        name, by_key = given
        difficulty = np.full(len(item_index), np.nan)
        for key, index in item_index.items():
            difficulty[index] = by_key.get(key, np.nan)
        missing = int(np.isnan(difficulty).sum())
        extra = f"; {missing} instructions missing from it count as average" if missing else ""
        return (
            np.nan_to_num(difficulty),
            f"file {name}",
            f"read from {name} for the models against {reference!r}{extra}",
        )
    if len(items) < 2:
        return (
            None,
            "none",
            (
                f"not estimated: one model against {reference!r} "
                "(--instruction-difficulty FILE gives AlpacaEval's or another leaderboard's)"
            ),
        )
    difficulty = estimate_difficulty(items, scaled, x, len(item_index), weights)
    return (
        difficulty,
        f"estimated from {len(items)} models",
        f"estimated from the {len(items)} models against {reference!r}",
    )


NO_LENGTH_CONTROL = {
    "length_controlled_win_rate": None,
    "lc_standard_error": None,
    "length_coefficient": None,
    "lc_difficulty": None,
}


def _scaled_length_difference(delta: np.ndarray) -> np.ndarray:
    """tanh of the length differences over their standard deviation (0 where they do not vary)."""
    spread = delta.std(ddof=1) if len(delta) > 1 else 0.0
    return np.tanh(delta / spread) if spread > 0 else np.zeros_like(delta)


def _lookup(difficulty: np.ndarray, items: np.ndarray) -> np.ndarray:
    # records without an instruction identity (index -1) count as average difficulty
    return np.where(items >= 0, difficulty[np.maximum(items, 0)] if len(difficulty) else 0.0, 0.0)


CONSTANT_TOLERANCE = 1e-12  # controlled win rates (probabilities) that differ by less are equal


def glm_win_rate(
    length_term: np.ndarray,
    difficulty: np.ndarray,
    x: np.ndarray,
    prior: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """AlpacaEval's GLM for one model (see the module's docstring): the length-controlled win rate,
    its standard error over instructions and the length coefficient. prior: (centre, matrix) of a
    quadratic penalty on (phi, psi), see `pooled_length_effect`."""
    return glm_fit(length_term, difficulty, x, prior).figures()


def glm_fit(
    length_term: np.ndarray,
    difficulty: np.ndarray,
    x: np.ndarray,
    prior: tuple[np.ndarray, np.ndarray] | None = None,
    weights: np.ndarray | None = None,
    c: float | None = None,
) -> GlmFit:
    """`glm_win_rate`'s fit, each verdict weighted by `weights` (default 1), in the cross-validated
    log loss that chooses the penalty as in the fit; c: the penalty's C, not chosen."""
    features = np.column_stack([length_term, difficulty, np.ones_like(x)])
    weights = np.ones_like(x) if weights is None else weights
    folds = np.arange(len(x)) % LC_FOLDS
    if c is None and len(x) >= 2 * LC_FOLDS:
        losses = np.zeros(len(LC_PENALTIES))
        for fold in range(LC_FOLDS):
            train = folds != fold
            start = None
            for i, c in enumerate(
                LC_PENALTIES
            ):  # weakest penalty last, each fit starting from the previous
                start = l1_logistic(features[train], x[train], weights[train], c, start, prior)
                losses[i] += (
                    weights[~train] * _log_loss(features[~train] @ start, x[~train])
                ).sum()
        c = float(LC_PENALTIES[int(np.argmin(losses))])
    elif c is None:
        c = 1.0
    theta_phi_psi = l1_logistic(features, x, weights, c, prior=prior)
    return GlmFit(features, theta_phi_psi, weights, x, None if prior is None else prior[1], c)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


def _log_loss(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Log loss of soft targets in [0, 1] at these logits, per verdict."""
    return np.logaddexp(0.0, logits) - targets * logits


def l1_logistic(
    features: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    c: float,
    start: np.ndarray | None = None,
    prior: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """argmin over b of c * (sum(weights * log loss(features @ b, targets)) + q(b)) + |b|_1, soft targets
    in [0, 1], no intercept (liblinear's L1 logistic regression, which AlpacaEval uses); q(b) =
    (b' - centre)^T matrix (b' - centre) / 2 over the first len(centre) coefficients b' when a prior
    (centre, matrix) is given, else 0. Proximal Newton: each step minimizes the quadratic model plus the
    penalty by coordinate descent, then backtracks."""
    k = features.shape[1]
    coefficients = np.zeros(k) if start is None else start.copy()
    centre, matrix = np.zeros(k), np.zeros((k, k))
    if prior is not None:
        size = len(prior[0])
        centre[:size], matrix[:size, :size] = prior

    def objective(b: np.ndarray) -> float:
        quadratic = 0.5 * (b - centre) @ matrix @ (b - centre)
        return c * (float(weights @ _log_loss(features @ b, targets)) + quadratic) + float(
            np.abs(b).sum()
        )

    current = objective(coefficients)
    for _ in range(100):
        p = _sigmoid(features @ coefficients)
        gradient = features.T @ (c * weights * (p - targets)) + c * matrix @ (coefficients - centre)
        hessian = (features * (c * weights * p * (1 - p))[:, None]).T @ features + c * matrix
        linear = (gradient - hessian @ coefficients).tolist()
        h = hessian.tolist()
        new = coefficients.tolist()
        for _ in range(1000):  # k is 3: plain Python floats are faster than numpy here
            change = 0.0
            for j in range(k):
                r = linear[j] + sum(h[j][i] * new[i] for i in range(k) if i != j)
                value = (
                    0.0 if abs(r) <= 1 or h[j][j] <= 0 else -(r - math.copysign(1.0, r)) / h[j][j]
                )
                change, new[j] = max(change, abs(value - new[j])), value
            if change < 1e-13:
                break
        step, t = np.array(new) - coefficients, 1.0
        while True:
            trial = objective(coefficients + t * step)
            if trial <= current or t < 1e-10:
                break
            t /= 2
        coefficients = coefficients + t * step
        converged = current - trial < 1e-12 * max(1.0, abs(current))
        current = min(current, trial)
        if converged:
            break
    return coefficients


def estimate_difficulty(
    items: list[np.ndarray],
    length_terms: list[np.ndarray],
    x: list[np.ndarray],
    n_items: int,
    weights: list[np.ndarray] | None = None,
) -> np.ndarray:
    """Instruction difficulties from one joint fit over several models against one reference:
    logit = theta_m + phi_m * length_term + ease[item], a unit Gaussian prior on ease; returns -ease
    (items without a verdict get 0). Verdicts without an instruction identity (item -1) are left out.
    weights: per model, each verdict's weight in the log loss (default 1)."""
    from scipy import optimize

    k = len(items)
    model = np.concatenate([np.full(len(v), m, dtype=np.int32) for m, v in enumerate(items)])
    item, length_term, target = (
        np.concatenate(items),
        np.concatenate(length_terms),
        np.concatenate(x),
    )
    weight = None if weights is None else np.concatenate(weights)
    known = item >= 0
    if not known.all():  # copies, only when some verdicts lack an instruction identity
        model, item = model[known], item[known]
        length_term, target = length_term[known], target[known]
        weight = None if weight is None else weight[known]
    del known

    def loss(parameters: np.ndarray) -> tuple[float, np.ndarray]:
        theta, phi, ease = parameters[:k], parameters[k : 2 * k], parameters[2 * k :]
        logits = theta[model] + phi[model] * length_term + ease[item]
        residual = _sigmoid(logits) - target
        losses = _log_loss(logits, target)
        if weight is not None:
            residual, losses = weight * residual, weight * losses
        gradient = np.concatenate(
            [
                np.bincount(model, residual, k),
                np.bincount(model, residual * length_term, k),
                np.bincount(item, residual, n_items) + DIFFICULTY_RIDGE * ease,
            ]
        )
        return float(losses.sum() + 0.5 * DIFFICULTY_RIDGE * ease @ ease), gradient

    fit = optimize.minimize(
        loss, np.zeros(2 * k + n_items), jac=True, method="L-BFGS-B", options={"maxiter": 5000}
    )
    return -fit.x[2 * k :]


def pooled_length_effect(
    length_terms: list[np.ndarray],
    difficulties: list[np.ndarray],
    x: list[np.ndarray],
    weights: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The judge's length and difficulty coefficients shared by all the models against a reference,
    logit = theta_m + phi * length_term + psi * difficulty, with each model's own theta_m: returns
    (phi, psi) and the information per verdict about them with the thetas held at their fitted values
    (the Hessian of the log loss in (phi, psi) at the fit, over the number of verdicts), for the
    quadratic pull of each model's fit towards them. Held, not profiled out: AlpacaEval's stand-in
    verdicts (the reference's own verbose and concise outputs) have no model term to trade against the
    length term. weights: per model, each verdict's weight (default 1; the information is then per
    unit of weight). (Profiled, on AlpacaEval 2's 56 models: 0.010 per verdict for phi and 0.054 for psi
    against 0.016 and 0.126 held, and gpt4_gamed kept a length coefficient of 5.1 and an LC of 21.1.)"""
    k = len(x)
    model = np.concatenate([np.full(len(v), m, dtype=np.int32) for m, v in enumerate(x)])
    shared = np.column_stack([np.concatenate(length_terms), np.concatenate(difficulties)])
    target = np.concatenate(x)
    weight = np.ones(len(target)) if weights is None else np.concatenate(weights)
    theta, coefficients = np.zeros(k), np.zeros(2)
    for _ in range(50):
        p = _sigmoid(theta[model] + shared @ coefficients)
        residual, curvature = weight * (p - target), weight * np.maximum(p * (1 - p), 1e-12)
        h_theta = np.bincount(model, curvature, k)
        h_cross = np.stack(
            [np.bincount(model, curvature * shared[:, j], k) for j in range(2)], axis=1
        )
        h_shared = (shared * curvature[:, None]).T @ shared
        schur = h_shared - h_cross.T @ (h_cross / h_theta[:, None])
        g_theta, g_shared = np.bincount(model, residual, k), shared.T @ residual
        step_shared = np.linalg.solve(
            schur + 1e-9 * np.eye(2), g_shared - h_cross.T @ (g_theta / h_theta)
        )
        step_theta = (g_theta - h_cross @ step_shared) / h_theta
        theta, coefficients = theta - step_theta, coefficients - step_shared
        if max(np.abs(step_theta).max(), np.abs(step_shared).max()) < 1e-10:
            break
    p = _sigmoid(theta[model] + shared @ coefficients)
    information = (shared * (weight * p * (1 - p))[:, None]).T @ shared
    return coefficients, information / weight.sum()


def is_extreme_change(win_rate: float, controlled: float) -> bool:
    """AlpacaEval's test of a length-controlled win rate too far from the raw one to be trusted: below
    min(wr - wr/4, wr - 10) or above max(wr + (100 - wr)/4, wr + 10), in percent."""
    too_low = controlled < min(win_rate - win_rate / 4, win_rate - 10)
    too_high = controlled > max(win_rate + (100 - win_rate) / 4, win_rate + 10)
    return bool(too_low or too_high)


DIFFICULTY_KEYS = ("id", "instruction_index", "index", "", "instruction")


def read_instruction_difficulty(
    path: str, item_key: Callable[[dict[str, Any]], Any]
) -> dict[Any, float]:
    """Instruction difficulties by item key (as `item_key` makes them) from records with
    `instruction_difficulty` and an id, instruction_index or instruction (JSONL, JSON, .gz), or from a
    CSV with an `instruction_difficulty` column and an id, instruction_index, index, unnamed first or
    instruction column (AlpacaEval's instruction_difficulty.csv). item_key: a record's key, as the
    win-rate table makes them."""
    name = display_name(path)
    difficulty: dict[Any, float] = {}
    if str(path).endswith((".csv", ".csv.gz")):
        with open_binary(path) as stream:
            table = list(csv.reader(io.StringIO(stream.read().decode("utf-8-sig"))))
        header = table[0] if table else []
        key_column = next((c for c in DIFFICULTY_KEYS if c in header), None)
        if "instruction_difficulty" not in header or key_column is None:
            raise FarmError(
                f"{name}: expected a column instruction_difficulty and one of "
                f"{', '.join(repr(c) for c in DIFFICULTY_KEYS)}; found {', '.join(map(repr, header))}"
            )
        i, j = header.index(key_column), header.index("instruction_difficulty")
        records = []
        for number, row in enumerate(table[1:], start=2):
            key: Any = row[i]
            if key_column == "instruction":
                key = (key, "")
            elif key.lstrip("-").isdigit():
                key = int(key)
            records.append((number, key, row[j]))
    else:
        records = [
            (
                number,
                item_key(record) if isinstance(record, dict) else None,
                record.get("instruction_difficulty") if isinstance(record, dict) else None,
            )
            for number, record in iter_json(path)
        ]
    for number, key, value in records:
        try:
            number_value = float(value)
        except (TypeError, ValueError):
            number_value = math.nan
        if key is None or not math.isfinite(number_value):
            raise RecordError(
                name,
                number,
                f"expected an instruction (id, instruction_index or instruction) and a "
                f"number instruction_difficulty; found {value!r}",
            )
        difficulty[key] = number_value
    return difficulty


NO_PPI_LENGTH_CONTROL = {
    "ppi_lc_win_rate": None,
    "ppi_lc_standard_error": None,
    "ppi_lc_ci_low": None,
    "ppi_lc_ci_high": None,
}


def rectified_targets(
    judge: np.ndarray, labelled: np.ndarray, label: np.ndarray, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """The weights and targets that turn the GLM's log loss into PPI++'s rectified one (see
    `ppi_length_controlled`), per verdict: the judge's x on all N verdicts, whether each is labelled
    (n of them) and its label (read where labelled), power-tuning lambda."""
    total, n = len(judge), int(labelled.sum())
    boost = np.where(labelled, total / n, 0.0)
    weights = lam + boost * (1 - lam)
    numerator = lam * judge + boost * (label - lam * judge)
    targets = np.divide(numerator, weights, out=np.zeros(total), where=weights > 0)
    return weights, targets


def ppi_length_controlled(
    reference: str,
    verdicts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    labels: list[tuple[np.ndarray, np.ndarray, float]],
    difficulty: np.ndarray,
    penalties: list[float],
    confidence: float = 0.95,
) -> list[dict[str, Any] | None]:
    """The prediction-powered length-controlled win rate of each model against one reference, in
    percent: the GLM of `length_controlled` fitted to the labels (the humans', or an old judge's) that
    a uniformly random subset of each model's verdicts has, helped by the judge's verdicts on all of
    them. verdicts: per model, (item index, length difference, the judge's x) on all N verdicts;
    labels: per model, (whether each verdict is labelled, its label, PPI++'s lambda); difficulty: the
    instruction difficulties by item index, held as they are (the board's own: from a file, or
    estimated from the judge's verdicts on all the models; zeros for none); penalties: each model's
    C, held too (the board's own fit's, chosen by cross-validation on the judge's verdicts). A model
    whose fit does not converge to finite figures gets None.

    The GLM's log loss is linear in the target, so PPI++'s rectified loss, lambda times the loss at
    the judge's verdicts on all N plus N/n times (the loss at the labels minus lambda times the loss at
    the judge's) on the n labelled, is the same log loss with a weight and a target per verdict:
    w = lambda + N/n (1 - lambda) and y = (lambda f + N/n (Y - lambda f)) / w on a labelled verdict,
    w = lambda and y = f elsewhere (`rectified_targets`). The pooled length effect's fit and each
    model's take those, so the estimate is the GLM's fitted length-controlled win rate for the
    labellers, at the board's instruction difficulties and penalties. Those are held, not fitted to
    the rectified targets: a difficulty is one parameter per instruction, fitted from the few
    verdicts on it, which PPI cannot correct (an instruction outside the subset has no label), and
    the rectified targets (outside [0, 1], weighted N/n) would make them erratic; a cross-validated
    log loss at such targets is not bounded below, so it could choose a penalty under which the fit
    diverges. Its
    standard error (delta method): with u_i the fit's influence (`GlmFit.influence`), p_i its fitted
    probabilities and s_i the controlled win probability of instruction i, the estimate moves by
    mean over all N of A_i = s_i - LC + lambda u_i (f_i - p_i) plus mean over the n of
    B_i = u_i ((Y_i - p_i) - lambda (f_i - p_i)), so se^2 = var(A) / N + var(B) / n + 2 cov(A, B) / N
    (the covariance on the labelled verdicts). The pooled length effect and the penalty are held at
    their fitted values in it. lambda = 0 is the labels alone."""
    weights, targets = [], []
    for (_, _, judge), (labelled, label, lam) in zip(verdicts, labels, strict=True):
        weight, target = rectified_targets(judge, labelled, label, lam)
        weights.append(weight)
        targets.append(target)
    rectified = [
        (items, delta, target) for (items, delta, _), target in zip(verdicts, targets, strict=True)
    ]
    with np.errstate(over="ignore", invalid="ignore"):
        fits, _, _, _ = board_fits(reference, rectified, {}, None, weights, difficulty, penalties)
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    rows = []
    for fit, (_, _, judge), (labelled, label, lam) in zip(fits, verdicts, labels, strict=True):
        controlled = fit.controlled()
        estimate = float(controlled.mean())
        influence = fit.influence()
        fitted = _sigmoid(fit.features @ fit.coefficients)
        a = controlled - estimate + lam * influence * (judge - fitted)
        b = influence * ((label - fitted) - lam * (judge - fitted))
        total, n = len(judge), int(labelled.sum())
        variance = (
            a.var(ddof=1) / total
            + b[labelled].var(ddof=1) / n
            + 2 * np.cov(a[labelled], b[labelled], ddof=1)[0, 1] / total
        )
        se = math.sqrt(max(float(variance), 0.0))
        if not math.isfinite(estimate + se):
            rows.append(None)
            continue
        rows.append(
            {
                "ppi_lc_win_rate": 100 * estimate,
                "ppi_lc_standard_error": 100 * se,
                "ppi_lc_ci_low": 100 * max(0.0, estimate - z * se),
                "ppi_lc_ci_high": 100 * min(1.0, estimate + z * se),
            }
        )
    return rows
