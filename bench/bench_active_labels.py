"""Active labelling (farm-label --judge) against uniform sampling at the same human budget: coverage
and mean width of the 95% interval of a win rate, on simulated data with a biased judge and on real
data (PandaLM's 999 pairs, each labelled by three humans, with a gpt-3.5-turbo judge; skipped when
../shared/data is absent). `--small` adds the small-sample table behind farm-winrate's small_sample
flag (farmkit/evaluate/ppi.py MIN_HUMAN_LABELS).

    python bench/bench_active_labels.py [--draws 2000] [--budget 150] [--small]

Active: pair i drawn with probability pi_i (farmkit.annotate.label.active.active_probabilities of the judge's
f (1 - f), 20% uniform), the IPW estimate (ppi_mean_ipw). Uniform: the same expected budget drawn
uniformly, PPI++ as farm-winrate computed it before (ppi_mean on a fixed-size uniform sample), and the
same IPW estimate on a Bernoulli(n/N) sample (pi = n/N), so both sides of the comparison use the same
estimator. Each draw draws the labelled pairs again (and, simulated, the data too); coverage is the
share of draws whose interval holds the truth (simulated: the population mean; PandaLM: the mean human
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

import numpy as np

from farmkit.annotate.label.active import active_probabilities
from farmkit.evaluate.ppi import ppi_mean, ppi_mean_ipw

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("FARMKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
PANDALM = DATA / "human_prefs"


def emit(**row) -> None:
    print(json.dumps({"benchmark": "active_labels", **row}), flush=True)


def summary(figures: dict, truth) -> tuple[float, float]:
    covered = (figures["low"] <= truth) & (truth <= figures["high"])
    return float(np.mean(covered)), 100 * float(np.mean(figures["high"] - figures["low"]))


def compare(name: str, f: np.ndarray, y: np.ndarray, truth, budget: int, rng) -> None:
    """f, y: (draws, N) judge and human win values; every draw labels pairs afresh."""
    draws, pairs = f.shape
    probability = np.stack([active_probabilities(row * (1 - row), budget) for row in f])
    active = ppi_mean_ipw(y, f, probability, rng.random(f.shape) < probability)
    uniform_pi = np.full(f.shape, budget / pairs)
    bernoulli = ppi_mean_ipw(y, f, uniform_pi, rng.random(f.shape) < uniform_pi)
    order = np.argsort(rng.random(f.shape), axis=1)[:, :budget]  # a fixed-size uniform sample
    rows = np.arange(draws)[:, None]
    fixed = ppi_mean(y[rows, order], f[rows, order], f)
    (ca, wa), (cb, wb), (cf, wf) = (summary(x, truth) for x in (active, bernoulli, fixed))
    common = {"draws": draws, "pairs": pairs, "budget": budget}
    emit(
        figure=f"{name}: coverage at 95%, active",
        value=ca,
        peer="uniform (PPI++, fixed n)",
        peer_value=cf,
        ratio=ca / cf,
        target=">= 0.93",
        met=ca >= 0.93,
        **common,
    )
    emit(figure=f"{name}: coverage at 95%, uniform IPW (Bernoulli n/N)", value=cb, **common)
    emit(
        figure=f"{name}: mean interval width, active",
        value=wa,
        unit="points",
        peer="uniform (PPI++, fixed n)",
        peer_value=wf,
        ratio=wa / wf,
        target="< 1",
        met=wa < wf,
        **common,
    )
    emit(
        figure=f"{name}: mean interval width, uniform IPW (Bernoulli n/N)",
        value=wb,
        unit="points",
        peer="active",
        peer_value=wa,
        ratio=wb / wa,
        **common,
    )
    emit(
        figure=f"{name}: mean labels drawn, active",
        value=float(np.mean((rng.random(f.shape) < probability).sum(axis=1))),
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
    compare(
        "PandaLM, pool of judge and longer", tile((judge + longer) / 2), tile(y), truth, budget, rng
    )


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
