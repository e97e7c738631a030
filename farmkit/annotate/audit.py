"""Asking a judge what farm-audit needs (farmkit.evaluate.audit computes the figures from the
records): every pair as given and mirrored, shown in that order, in R runs where the judge samples,
through farm-annotate's engine (its cache, prices and budget)."""

from __future__ import annotations

from typing import Any

from farmkit.annotate.pairs import Item
from farmkit.core.io import FarmError
from farmkit.core.records import mirrored_record
from farmkit.core.seeds import derive_seed


def mirrored(item: Item) -> Item:
    """The pair with its outputs (and their per-output fields) swapped."""
    return Item(mirrored_record(item.record))


def samples(pool: Any) -> bool:
    """Whether any judge of the pool (or its label noise) draws its verdicts at random."""
    return pool.flip_rate > 0 or any(judge.temperature > 0 for judge in pool.judges)


def run_seed(seed: int, run: int) -> int:
    """The seed of the audit's run `run`: the first is farm-annotate's own `--seed`."""
    return seed if run == 0 else derive_seed(seed, "audit run", run)


def ask(
    pool: Any,
    items: list[Item],
    repeats: int,
    *,
    seed: int,
    cache: str | None,
    prices: str | None,
    max_cost: float | None,
    device: str,
) -> list[list[dict[str, Any]]]:
    """Every pair as given and mirrored (shown in that order), in `repeats` runs (the first
    with `seed`, the others with seeds derived from it): per run, the records of `items` then of their mirror images. In a pool of several
    judges, the judge is drawn per instruction, so that a pair and its mirror image meet the same one. The whole audit's
    expected price is checked against `max_cost` before anything is asked."""
    from farmkit.annotate.run import Run

    batch = items + [mirrored(item) for item in items]
    runs = []
    if max_cost is not None:
        expected = 0.0
        for r in range(repeats):
            with Run(
                pool, seed=run_seed(seed, r), cache_path=cache, prices_path=prices, as_given=True
            ) as run:
                expected += run.estimate(batch)["price"]
        if expected > max_cost:
            raise FarmError(
                f"the audit's expected price ${expected:.4f} ({repeats} run(s) of {len(items)} pairs in both "
                f"orders) exceeds --max-cost ${max_cost:.4f}; nothing was asked"
            )
    spent = 0.0
    for r in range(repeats):
        records: list[dict[str, Any]] = []
        with Run(
            pool,
            seed=run_seed(seed, r),
            cache_path=cache,
            prices_path=prices,
            max_cost=None if max_cost is None else max(max_cost - spent, 0.0),
            device=device,
            as_given=True,
            assign_by="instruction",  # a pair and its mirror image meet the same judge of the pool
        ) as run:
            run.annotate(batch, records.extend)
            spent += run.annotator.stats.price
        runs.append(records)
    return runs
