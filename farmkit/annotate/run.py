"""One farm-annotate run: the checks made before anything is asked (endpoint configured, budget),
the cache, the records, and the summary on stderr. This is what tools/farm_annotate.py calls, and
the Python entry point for annotating pairs from code."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farmkit.annotate.cache import VerdictCache
from farmkit.annotate.cost import PriceTable
from farmkit.annotate.engine import Annotator, require_endpoint
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import Pool
from farmkit.io import FarmError

log = logging.getLogger("farmkit")


def default_cache_path() -> Path:
    from farmkit.models import cache_dir

    return cache_dir() / "annotations.sqlite"


class Run:
    def __init__(self, pool: Pool, seed: int = 0, both_orders: bool = False, cache_path: str | Path | None = "default",
                 prices_path: str | None = None, max_cost: float | None = None, device: str = "auto"):
        """`cache_path`: a SQLite file, "default" (under farmkit's cache folder) or None (no cache)."""
        self.pool = pool
        self.prices = PriceTable.from_file(prices_path, pool.prices)
        self.cache = None
        if cache_path is not None:
            self.cache = VerdictCache(default_cache_path() if cache_path == "default" else cache_path)
        self.annotator = Annotator(pool, seed=seed, both_orders=both_orders, cache=self.cache, prices=self.prices,
                                   max_cost=max_cost, device=device)
        self.max_cost = max_cost

    def estimate(self, items: list[Item]) -> dict[str, Any]:
        """Expected requests, tokens and price of annotating `items` (cache hits and noised items cost nothing)."""
        plan = self.annotator.plan(items)
        return {"pool": self.pool.name, **self.annotator.estimate(items, plan)}

    def records(self, items: list[Item]) -> Iterator[dict[str, Any]]:
        plan = self.annotator.plan(items)
        if plan.requests and any(self.pool.judges[r[0].judge].backend == "openai" for r in plan.requests):
            require_endpoint(self.pool)
        if self.max_cost is not None:
            expected = self.annotator.estimate(items, plan)["price"]
            if expected > self.max_cost:
                raise FarmError(f"the expected price ${expected:.4f} exceeds --max-cost ${self.max_cost:.4f}; "
                                "nothing was asked (see --estimate)")
        try:
            yield from self.annotator.run(items, plan)
        finally:
            if self.cache is not None:
                self.cache.close()

    def summary(self) -> None:
        stats = self.annotator.stats
        retries = self.annotator.backends.retries
        parts = [
            f"{stats.items} items ({stats.noised} noised)",
            f"{stats.requests} requests" + (f" (+{retries} retries)" if retries else ""),
            f"{stats.cache_hits} cache hits",
            f"{stats.failures} without a verdict",
            f"{stats.prompt_tokens:,.0f} prompt + {stats.completion_tokens:,.0f} completion tokens",
            f"${stats.price:.4f}",
            f"{time.perf_counter() - stats.started:.1f} s",
        ]
        log.info("farm-annotate: %s", ", ".join(parts))
        if stats.failures > stats.skipped_budget:
            log.warning("farm-annotate: %d pair(s) have no verdict (preference null, see preference_reason); rerun the "
                        "same command to ask them again: verdicts already given are cached", stats.failures - stats.skipped_budget)
        if stats.skipped_budget:
            log.warning("farm-annotate: %d pair(s) not asked to stay within --max-cost (written with preference null); "
                        "paid verdicts are cached: rerun with a higher budget to finish", stats.skipped_budget)
        if self.prices.unpriced:
            log.info("farm-annotate: no price known for %s (counted as $0; see --prices)", ", ".join(sorted(self.prices.unpriced)))
