"""One farm-annotate run: the checks made before anything is asked (endpoint configured, budget),
the cache, the records, and the summary on stderr. This is what tools/farm_annotate.py calls, and
the Python entry point for annotating pairs from code; farm-eval judges against a reference through
it (judge_against_reference), farm-online-dpo labels each round's pairs, and farm-grpo and
farm-rloo --pool each step's (PoolLabeller)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.annotate.backends import backend_class
from farmkit.annotate.cache import VerdictCache
from farmkit.annotate.cost import PriceTable
from farmkit.annotate.engine import Annotator, require_endpoint
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import Pool, load_pool
from farmkit.core.io import FarmError, RecordWriter

log = logging.getLogger("farmkit")


def default_cache_path() -> Path:
    from farmkit.lm.models import cache_dir

    return cache_dir() / "annotations.sqlite"


class Run:
    """The one owner of a run's lifecycle: it opens the cache, builds the annotator (whose backends and
    event loop live as long as the run, across several calls to records()), and closes them all in
    close(). Use it as a context manager (or call close())."""

    def __init__(
        self,
        pool: Pool,
        seed: int = 0,
        both_orders: bool = False,
        cache_path: str | Path | None = "default",
        prices_path: str | None = None,
        max_cost: float | None = None,
        device: str = "auto",
        show_progress: bool = False,
        assign_by: str = "item",
    ):
        """`cache_path`: a SQLite file, "default" (under farmkit's cache folder) or None (no cache).
        `show_progress`: a progress bar on stderr even when stderr is not a terminal (never with -q)."""
        self.show_progress = show_progress
        self.pool = pool
        self.prices = PriceTable.from_file(prices_path, pool.prices)
        self.cache = None
        if cache_path is not None:
            self.cache = VerdictCache(
                default_cache_path() if cache_path == "default" else cache_path
            )
        self.annotator = Annotator(
            pool,
            seed=seed,
            both_orders=both_orders,
            cache=self.cache,
            prices=self.prices,
            max_cost=max_cost,
            device=device,
            assign_by=assign_by,
        )
        self.max_cost = max_cost

    def estimate(self, items: list[Item]) -> dict[str, Any]:
        """Expected requests, tokens and price of annotating `items` (cache hits and noised items cost nothing)."""
        plan = self.annotator.plan(items)
        return {"pool": self.pool.name, **self.annotator.estimate(items, plan)}

    def affordable(self, items: list[Item], budget: float) -> list[Item]:
        """The longest prefix of `items` whose expected price stays within `budget` (USD)."""
        expected = self.estimate(items)["price"]
        if expected <= budget:
            return items
        count = int(len(items) * budget / expected) if expected > 0 else len(items)
        while count > 0:
            if self.estimate(items[:count])["price"] <= budget:
                return items[:count]
            count -= 1
        return []

    def records(self, items: list[Item]) -> Iterator[dict[str, Any]]:
        if self.max_cost is not None:
            # a model without a price would cost $0 to the budget: the cap would silently stop capping
            unpriced = sorted(
                {
                    str(self.pool.model_for(judge))
                    for judge in self.pool.judges
                    if backend_class(judge.backend).priced
                    and self.pool.model_for(judge) not in self.prices.table
                }
            )
            if unpriced:
                raise FarmError(
                    f"--max-cost cannot hold: no price is known for {', '.join(unpriced)}; give one with "
                    "--prices FILE (MODEL: {prompt: USD per 1M tokens, completion: USD per 1M tokens})"
                )
        # whether any pair reaches the endpoint depends on the seed's draws (noise, ties, the judge
        # drawn) and on the cache: a missing endpoint is the pool's fault, said for any input
        require_endpoint(self.pool)
        plan = self.annotator.plan(items)
        if self.max_cost is not None:
            expected = self.annotator.estimate(items, plan)["price"]
            if expected > self.max_cost:
                raise FarmError(
                    f"the expected price ${expected:.4f} exceeds --max-cost ${self.max_cost:.4f}; "
                    "nothing was asked (see --estimate)"
                )
        from tqdm import tqdm

        from farmkit.core.console import quiet

        stats = self.annotator.stats
        with tqdm(
            total=len(items),
            unit="pair",
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
            disable=quiet() or not (self.show_progress or sys.stderr.isatty()),
        ) as bar:
            for record in self.annotator.run(items, plan):
                bar.set_postfix_str(
                    f"{stats.cache_hits} cache hits, {stats.requests} requests, "
                    f"{stats.failures} failed, ${stats.price:.4f}",
                    refresh=False,
                )
                bar.update(1)
                yield record
            bar.refresh()  # the final counts, however fast the run was

    def close(self) -> None:
        """Close the backends (their connections, on their event loop) and the cache, giving up any
        claims this run still holds."""
        try:
            self.annotator.close()
        finally:
            if self.cache is not None:
                self.cache.close()
                self.cache = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self) -> None:
        stats = self.annotator.stats
        retries = self.annotator.backends.retries
        parts = [
            f"{stats.items} items ({stats.noised} noised, {stats.identical} identical pairs tied)",
            f"{stats.requests} requests" + (f" (+{retries} retries)" if retries else ""),
            f"{stats.cache_hits} cache hits",
            *(
                f"{name} concurrency {now} of {most}"
                + (f" (backed off {cuts} times)" if cuts else "")
                for name, now, most, cuts in self.annotator.backends.concurrency
            ),
            f"{stats.failures} without a verdict",
            f"{stats.prompt_tokens:,.0f} prompt + {stats.completion_tokens:,.0f} completion tokens",
            f"${stats.price:.4f}",
            f"{time.perf_counter() - stats.started:.1f} s",
        ]
        log.info("farm-annotate: %s", ", ".join(parts))
        unanswered = sum(stats.unanswered.values())
        if stats.failures > stats.skipped_budget + unanswered:
            log.warning(
                "farm-annotate: %d pair(s) have no verdict (preference null, see preference_reason); rerun the "
                "same command to ask them again: verdicts already given are cached",
                stats.failures - stats.skipped_budget - unanswered,
            )
        for reason, count in sorted(stats.unanswered.items()):
            log.warning(
                "farm-annotate: %d of %d pair(s) have no verdict (preference null): %s",
                count,
                stats.items,
                reason,
            )
        if stats.skipped_budget:
            log.warning(
                "farm-annotate: %d pair(s) not asked to stay within --max-cost (written with preference null); "
                "paid verdicts are cached: rerun with a higher budget to finish",
                stats.skipped_budget,
            )
        if stats.parse_failures:
            log.warning(
                "farm-annotate: verdicts that could not be parsed (asked again up to parse_retries times): %s",
                ", ".join(
                    f"{judge} {count} of {stats.replies[judge]} ({count / stats.replies[judge]:.1%})"
                    for judge, count in sorted(stats.parse_failures.items())
                ),
            )
        if self.prices.unpriced:
            log.info(
                "farm-annotate: no price known for %s (counted as $0; see --prices)",
                ", ".join(sorted(self.prices.unpriced)),
            )


def judge_against_reference(
    outputs: list[str],
    reference: str,
    pool: Pool,
    *,
    seed: int = 0,
    both_orders: bool = False,
    cache: str | None = "default",
    prices: str | None = None,
    max_cost: float | None = None,
    skip_missing: bool = False,
    device: str = "auto",
) -> list[dict[str, Any]]:
    """farm-annotate OUTPUTS --reference REFERENCE: the preference records of every output against
    the reference's output for its instruction (`device`: of the local and reward-model judges), the
    run's summary on stderr; none when OUTPUTS hold no output record."""
    from farmkit.annotate.pairs import read_items

    items = read_items(outputs, reference, (), skip_missing)
    if not items:
        return []
    with Run(
        pool,
        seed=seed,
        both_orders=both_orders,
        cache_path=cache,
        prices_path=prices,
        max_cost=max_cost,
        device=device,
    ) as run:
        records = list(run.records(items))
    run.summary()
    return records


@dataclass
class PoolLabeller:
    """Labels fresh pair records with a pool, a run at a time, each within what is left of a budget:
    what farm-online-dpo asks each round (farmkit.methods.online_dpo.Labeller) and farm-grpo and
    farm-rloo each step under --pool (farmkit.train.pairwise.PairJudge)."""

    pool: Pool
    both_orders: bool = False
    cache: str | None = "default"  # a SQLite file, "default" or None (no cache)
    prices: str | None = None
    device: str = "auto"
    max_cost: float | None = (
        None  # USD over a whole training run (the group methods keep the count)
    )

    def __call__(
        self, pairs: list[dict[str, Any]], seed: int, budget: float | None, folder: Path
    ) -> dict[str, Any] | None:
        """Label `pairs` into folder/preferences.jsonl (as many as `budget` pays for); return what
        it took (labels.json), or None when `budget` (USD; None: no cap) pays for no pair."""
        asked = self._ask(pairs, seed, budget, whole=False)
        if asked is None:
            return None
        records, took = asked
        folder.mkdir(parents=True, exist_ok=True)
        with RecordWriter(folder / "preferences.jsonl") as writer:
            writer.write_all(records)
        return took

    def preferences(
        self, pairs: list[dict[str, Any]], seed: int, budget: float | None
    ) -> tuple[list[Any], dict[str, Any]] | None:
        """The preference of each pair (None: no verdict) and what asking took, for all `pairs`
        or none: None when `budget` does not pay for every one (a group's rewards need all its
        comparisons)."""
        asked = self._ask(pairs, seed, budget, whole=True)
        if asked is None:
            return None
        records, took = asked
        return [record.get("preference") for record in records], took

    def _ask(
        self, pairs: list[dict[str, Any]], seed: int, budget: float | None, whole: bool
    ) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """The preference records of `pairs` (`whole`: all or None; otherwise the longest prefix
        `budget` pays for, None when it pays for no pair) and what asking took."""
        items = [Item(pair) for pair in pairs]
        with Run(
            self.pool,
            seed=seed,
            both_orders=self.both_orders,
            cache_path=self.cache,
            prices_path=self.prices,
            max_cost=budget,
            device=self.device,
        ) as run:
            cut = False
            if budget is not None:
                fitting = run.affordable(items, budget)
                if not fitting or (whole and len(fitting) < len(items)):
                    return None
                cut = len(fitting) < len(items)
                items = fitting
            records = list(run.records(items))
            run.summary()
            stats = run.annotator.stats
            return records, {
                "pairs": len(items),
                "requests": stats.requests,
                "judge_calls": sum(stats.replies.values()),
                "cache_hits": stats.cache_hits,
                "noised": stats.noised,
                "identical": stats.identical,
                "failures": stats.failures,
                "skipped_budget": stats.skipped_budget,
                "prompt_tokens": stats.prompt_tokens,
                "completion_tokens": stats.completion_tokens,
                "price": stats.price,
                "budget_cut": cut or stats.skipped_budget > 0,
            }


class GoldPool:
    """An annotator pool as the gold judge of a training run asks it (farmkit.train.gold's
    PoolJudge): each call a Run of the pool over pair records, through the verdict cache."""

    def __init__(self, pool: Pool, seed: int, cache: str | Path | None, device: str) -> None:
        require_endpoint(pool)  # fail before training, not at the first checkpoint
        self.pool, self.seed, self.cache, self.device = pool, seed, cache, device

    def preferences(self, pairs: list[dict[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
        """The preference of each pair (None: no verdict) and what asking cost."""
        items = [Item(pair) for pair in pairs]
        with Run(self.pool, seed=self.seed, cache_path=self.cache, device=self.device) as run:
            records = list(run.records(items))
            stats = run.annotator.stats
            cost = {
                "pairs": len(items),
                "requests": stats.requests,
                "cache_hits": stats.cache_hits,
                "price": stats.price,
            }
        return [record.get("preference") for record in records], cost


def gold_pool(spec: str, *, seed: int, cache: str | Path | None, device: str) -> GoldPool:
    """The pool --gold names (a pool name, YAML file or learned judge folder), as a gold judge: what
    the training tools hand to farmkit.train.gold (which sits below this pillar)."""
    try:
        pool = load_pool(spec)
    except FarmError as exc:
        raise FarmError(
            f"--gold {spec}: neither a reward model folder nor an annotator pool ({exc})"
        ) from None
    return GoldPool(pool, seed, cache, device)
