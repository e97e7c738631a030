"""Active labelling (farm-label --judge) against uniform sampling at the same human budget: coverage
and mean width of the 95% interval of a win rate, on simulated data with a biased judge and on real
data (PandaLM's 999 pairs, each labelled by three humans, with a gpt-3.5-turbo judge; skipped when
../shared/data is absent). `--small` adds the small-sample table behind farm-winrate's small_sample
flag (farmkit/evaluate/ppi.py MIN_HUMAN_LABELS).

    python bench/bench_active_labels.py [--draws 2000] [--budget 150] [--small]

Designs, each at the same expected budget, each row with its coverage, mean width, the width's Monte
Carlo standard error and its difference from uniform's (with that difference's standard error):
- uniform (PPI++, fixed n): a fixed-size uniform sample, PPI++ as farm-winrate computes it (the peer);
- uniform, IPW: a Bernoulli(n/N) sample weighted by 1 / pi (ppi_mean_ipw), the estimator of the
  active designs, so the two sides differ only in the design;
- active, f (1 - f) (farm-label --judge): pi proportional to sqrt(f (1 - f)), mixed half and half
  with uniform and at most twice n/N (active_probabilities' defaults: every pair between half and
  twice as likely as uniformly, chosen on draws of another seed than the one reported);
- the rule before: the same with 20% uniform and no ceiling but 1;
- active, learnt from a pilot (pilot_design): a uniform pilot of a quarter of the budget learns how
  far the humans are from the judge as a function of u, then the rest is drawn accordingly, or
  uniformly when the pilot finds nothing to learn. Measured here, not in farm-label (which would need
  two sessions and a combined estimate in farm-winrate).
Each draw draws the labelled pairs again (and, simulated, the data too); coverage is the share of
draws whose interval holds the truth (simulated: the population mean; PandaLM: the mean human
verdict over the 999 pairs), width the mean of high - low, in win-rate points.

PandaLM's judge gives hard verdicts (1, 2, Tie; 25 unparsed are a tie here), so its own f (1 - f) only
singles out its ties; the pool is therefore the judge and "the longer response wins" (a second judge
of the pool, as sim_eval's pool has several): where they disagree f = 0.5. Both are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

from farmkit.annotate.label.active import active_probabilities
from farmkit.evaluate.ppi import ppi_mean, ppi_mean_ipw

PILOT_SHARE = 0.25  # of the budget, drawn uniformly first (fixed before the runs reported)

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("FARMKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
PANDALM = DATA / "human_prefs"


def emit(**row) -> None:
    print(json.dumps({"benchmark": "active_labels", **row}), flush=True)


def summary(figures: dict, truth) -> tuple[float, float, float]:
    """Coverage, mean width (points) and the mean width's Monte Carlo standard error."""
    covered = (figures["low"] <= truth) & (truth <= figures["high"])
    width = 100 * (figures["high"] - figures["low"])
    return (
        float(np.mean(covered)),
        float(np.mean(width)),
        float(np.std(width) / np.sqrt(len(width))),
    )


def normal(estimate: np.ndarray, standard_error: np.ndarray) -> dict:
    z = NormalDist().inv_cdf(0.975)
    low, high = estimate - z * standard_error, estimate + z * standard_error
    return {"low": np.clip(low, 0, 1), "high": np.clip(high, 0, 1)}


def pilot_design(
    u: np.ndarray, y: np.ndarray, f: np.ndarray, budget: int, rng
) -> tuple[dict, float]:
    """Two phases (the design is learnt, not assumed): a uniform pilot of PILOT_SHARE of the budget
    (Bernoulli n1/N), on whose labels the squared residual (Y - lambda f - c)^2 is regressed on the
    uncertainty u; the rest of the budget is drawn with pi proportional to the square root of the
    fitted E[(Y - lambda f - c)^2 | u] (active_probabilities, 20% uniform, no ceiling) when its slope is
    significant (t > 2) and the design it gives would cut the variance by at least 5% ((mean
    sqrt m)^2 / mean m < 0.95), uniformly otherwise. Each phase's IPW estimate is unbiased (the
    second given the first); they are averaged with the budget's weights, and their shared part
    (the population's own variance, var(Y) / N) counted in the standard error. Returns the figures
    and the share of draws where the pilot chose an active design."""
    draws, pairs = f.shape
    first = PILOT_SHARE * budget
    second = (budget - first) / (1 - first / pairs)  # the pairs drawn twice are labelled once
    pi1 = np.full(f.shape, first / pairs)
    drawn1 = rng.random(f.shape) < pi1
    pi2 = np.full(f.shape, second / pairs)
    chosen, population = 0, np.empty(draws)
    for row in range(draws):
        seen = drawn1[row]
        ys, fs, us = y[row, seen], f[row, seen], u[row, seen]
        design = np.c_[fs, np.ones_like(fs)]
        squared = (ys - design @ np.linalg.lstsq(design, ys, rcond=None)[0]) ** 2
        population[row] = ys.var(ddof=1)
        on_u = np.c_[us, np.ones_like(us)]
        coefficients, *_ = np.linalg.lstsq(on_u, squared, rcond=None)
        spread = squared - on_u @ coefficients
        covariance = spread @ spread / max(len(us) - 2, 1) * np.linalg.pinv(on_u.T @ on_u)
        t = coefficients[0] / np.sqrt(covariance[0, 0]) if covariance[0, 0] > 0 else 0.0
        fitted = np.clip(coefficients[0] * u[row] + coefficients[1], 1e-3, None)
        if t > 2 and np.mean(np.sqrt(fitted)) ** 2 / np.mean(fitted) < 0.95:
            pi2[row] = active_probabilities(fitted, second, uniform=0.2, most=None)
            chosen += 1
    drawn2 = rng.random(f.shape) < pi2
    one, two = ppi_mean_ipw(y, f, pi1, drawn1), ppi_mean_ipw(y, f, pi2, drawn2)
    share = PILOT_SHARE
    estimate = share * one["estimate"] + (1 - share) * two["estimate"]
    variance = share**2 * one["standard_error"] ** 2 + (1 - share) ** 2 * two["standard_error"] ** 2
    variance += 2 * share * (1 - share) * population / pairs
    figures = normal(estimate, np.sqrt(variance))
    figures["labels"] = (drawn1 | drawn2).sum(axis=1)
    return figures, chosen / draws


def compare(name: str, f: np.ndarray, y: np.ndarray, truth, budget: int, rng, u=None) -> None:
    """f, y: (draws, N) judge and human win values; every draw labels pairs afresh. u: the
    uncertainty the designs read (default the judge's f (1 - f))."""
    draws, pairs = f.shape
    u = f * (1 - f) if u is None else u
    order = np.argsort(rng.random(f.shape), axis=1)[:, :budget]  # a fixed-size uniform sample
    rows = np.arange(draws)[:, None]
    fixed = ppi_mean(y[rows, order], f[rows, order], f)
    uniform_pi = np.full(f.shape, budget / pairs)
    uniform_drawn = rng.random(f.shape) < uniform_pi
    probability = np.stack([active_probabilities(row, budget) for row in u])
    drawn = rng.random(f.shape) < probability
    before = np.stack([active_probabilities(row, budget, 0.2, None) for row in u])
    drawn_before = rng.random(f.shape) < before
    pilot, chosen = pilot_design(u, y, f, budget, rng)
    common = {"draws": draws, "pairs": pairs, "budget": budget}
    peer_coverage, peer_width, peer_error = summary(fixed, truth)
    emit(
        figure=f"{name}: uniform (PPI++, fixed n)",
        coverage=peer_coverage,
        width=peer_width,
        width_se=peer_error,
        unit="points",
        **common,
    )
    for design, figures, labels in (
        (
            "uniform, IPW (Bernoulli n/N)",
            ppi_mean_ipw(y, f, uniform_pi, uniform_drawn),
            uniform_drawn,
        ),
        ("active, f (1 - f) (farm-label --judge)", ppi_mean_ipw(y, f, probability, drawn), drawn),
        (
            "active, f (1 - f), 20% uniform, no ceiling (the rule before)",
            ppi_mean_ipw(y, f, before, drawn_before),
            drawn_before,
        ),
        (f"active, learnt from a {PILOT_SHARE:.0%} pilot", pilot, None),
    ):
        coverage, width, error = summary(figures, truth)
        labelled = figures["labels"] if labels is None else labels.sum(axis=1)
        emit(
            figure=f"{name}: {design}",
            coverage=coverage,
            width=width,
            width_se=error,
            unit="points",
            peer="uniform (PPI++, fixed n)",
            peer_width=peer_width,
            width_difference=width - peer_width,
            width_difference_se=float(np.hypot(error, peer_error)),
            ratio=width / peer_width,
            labels=float(np.mean(labelled)),
            target="coverage >= 0.93, width < uniform's",
            met=bool(coverage >= 0.93 and width < peer_width),
            **({"pilot_chose_active": chosen} if labels is None else {}),
            **common,
        )


def simulated(draws: int, budget: int, rng) -> None:
    """The test's judge (tests/evaluate/test_winrate_ppi.py biased_soft_judge): sure of 70% of the
    pairs (0.02 / 0.98, calibrated) and unsure and biased by 0.2 on the rest."""
    pairs = 1000
    sure = rng.random((draws, pairs)) < 0.7
    f = np.where(sure, np.where(rng.random((draws, pairs)) < 0.5, 0.02, 0.98), 0.0)
    f = np.where(sure, f, rng.uniform(0.35, 0.65, (draws, pairs)))
    y = (rng.random((draws, pairs)) < np.where(sure, f, f - 0.2)).astype(float)
    compare("simulated, biased soft judge", f, y, 0.7 * 0.5 + 0.3 * 0.3, budget, rng)


def pandalm(draws: int, budget: int, rng) -> None:
    pairs = json.loads((PANDALM / "pandalm_testset_v1.json").read_text())
    judged = json.loads((PANDALM / "pandalm_gpt35_judgments_v1.json").read_text())
    assert [p["idx"] for p in pairs] == [j["idx"] for j in judged]
    win = {0: 0.5, 1: 0.0, 2: 1.0}  # the human labels: 0 tie, 1 response1, 2 response2
    y = np.array([np.mean([win[p[f"annotator{k}"]] for k in (1, 2, 3)]) for p in pairs])
    judge = np.array([{"1": 0.0, "2": 1.0}.get(j["gpt_result"], 0.5) for j in judged])
    longer = np.array([float(len(str(p["response2"])) > len(str(p["response1"]))) for p in pairs])
    truth = float(y.mean())
    emit(
        figure="PandaLM: the humans' mean (truth) and the judge's",
        value=100 * truth,
        peer="gpt-3.5-turbo",
        peer_value=100 * float(judge.mean()),
    )
    tile = lambda v: np.tile(v, (draws, 1))  # noqa: E731 - the data are fixed, the draws are not
    compare("PandaLM, judge alone", tile(judge), tile(y), truth, budget, rng)
    pool = (judge + longer) / 2
    compare("PandaLM, pool of judge and longer", tile(pool), tile(y), truth, budget, rng)


def small(rng) -> None:
    """PPI++'s normal interval (clipped to [0, 1]) on n human labels among 400 judged pairs: the worst
    coverage over judges agreeing 60, 80 and 95% (else preferring the model 70% of the time), per
    true win rate (symmetric: 20% is 80%'s)."""
    draws, pairs = 4000, 400
    for n in (5, 10, 20, 30, 40, 50, 80):
        worst = {}
        for p in (0.1, 0.2, 0.3, 0.5):
            for accuracy in (0.6, 0.8, 0.95):
                truth = (rng.random((draws, pairs)) < p).astype(float)
                other = rng.random((draws, pairs)) < 0.7
                judge = np.where(rng.random((draws, pairs)) < accuracy, truth, other)
                figures = ppi_mean(truth[:, :n], judge[:, :n].astype(float), judge.astype(float))
                worst[p] = min(worst.get(p, 1.0), summary(figures, p)[0])
        emit(
            figure=f"small samples: worst coverage at 95%, n = {n}",
            value=min(worst[0.2], worst[0.3], worst[0.5]),
            peer="by true win rate 10/20/30/50%",
            by_rate=worst,
            draws=draws,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    simulated(args.draws, args.budget, rng)
    if PANDALM.is_dir():
        pandalm(args.draws, args.budget, rng)
    else:
        print(f"bench_active_labels: {PANDALM} absent: PandaLM skipped", file=sys.stderr)
    if args.small:
        small(rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
