"""One farm-annotate run: the checks made before anything is asked (endpoint configured, budget),
the cache, the records, and the summary on stderr. This is what tools/farm_annotate.py calls, and
the Python entry point for annotating pairs from code; farm-eval judges against a reference through
it (judge_against_reference), farm-online-dpo labels each round's pairs, and farm-grpo and
farm-rloo --pool each step's (PoolLabeller)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from farmkit.annotate import ledger
from farmkit.annotate.backends import backend_class
from farmkit.annotate.batch import BatchConfig, BatchMode, hold_pending
from farmkit.annotate.cache import VerdictCache
from farmkit.annotate.cost import PriceTable
from farmkit.annotate.engine import Annotator, Plan, require_endpoint
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
        batch: BatchConfig | None = None,
        retry_failed: bool = False,
        as_given: bool = False,
    ):
        """`cache_path`: a SQLite file, "default" (under farmkit's cache folder) or None (no cache).
        `show_progress`: a progress bar on stderr even when stderr is not a terminal (never with -q).
        `batch`: how paid judges are asked (its `batch` False: directly).
        `retry_failed`: ask again the questions whose cached reply could not be read.
        `as_given`: show every pair in its own order, not a drawn one (farm-audit)."""
        self.show_progress = show_progress
        self.pool = pool
        self.prices = PriceTable.from_file(prices_path, pool.prices)
        self.cache = None
        if cache_path is not None:
            self.cache = VerdictCache(
                default_cache_path() if cache_path == "default" else cache_path
            )
        self.cache_path = None if self.cache is None else self.cache.path
        # the cache's rows that were not well formed, kept past close() for the summary
        self.unreadable_rows: set[str] = set() if self.cache is None else self.cache.unreadable
        self.annotator = Annotator(
            pool,
            seed=seed,
            both_orders=both_orders,
            cache=self.cache,
            prices=self.prices,
            max_cost=max_cost,
            device=device,
            assign_by=assign_by,
            retry_failed=retry_failed,
            as_given=as_given,
        )
        self.max_cost = max_cost
        self.paid = batch or BatchConfig()
        self.batch = self.paid if self.paid.batch else None
        if self.batch is not None and self.cache is None:
            raise FarmError(
                "--batch keeps its pending batches in the verdict cache; drop --no-cache"
            )
        self._batch_mode: BatchMode | None = None
        self._plan: Plan | None = None  # the plan of the last records() (what the ledger books)
        self.held_pending = 0  # questions a pending batch asks, not asked by this direct run

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

    def annotate(self, items: list[Item], write: Callable[[Iterator[dict[str, Any]]], None]) -> int:
        """Ask for the verdicts of `items`, hand their records to `write`, say the summary and book
        the run in the ledger (--ledger); the exit status: 0, or PENDING_EXIT while questions are
        pending in batches (nothing handed to `write`)."""
        ready = self.prepare_batch(items) if self.batch is not None else True
        if ready:
            write(self.records(items))
        self.summary()
        if self.paid.ledger:
            ledger.append(self.paid.ledger, self.ledger_entry())
        return 0 if ready or self._batch_mode is None else self._batch_mode.exit_status()

    def prepare_batch(self, items: list[Item]) -> bool:
        """--batch: collect finished batches, submit what is new and (wait) poll; True when every
        question of `items` has its verdict (records() then writes them), False while some are
        pending (the summary says how many)."""
        assert self.batch is not None and self.cache is not None
        self._check(items, batch=True)
        self._batch_mode = BatchMode(self.annotator, self.cache, self.batch)
        with _sigterm_ends_at_once():
            self._plan = self._batch_mode.prepare(items)
        return self._plan is not None

    def _check(self, items: list[Item], batch: bool = False) -> Plan:
        """What must hold before anything is asked; the plan of `items`."""
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
            expected = self.annotator.estimate(items, plan)["batch_price" if batch else "price"]
            if expected > self.max_cost:
                raise FarmError(
                    f"the expected price ${expected:.4f} exceeds --max-cost ${self.max_cost:.4f}; "
                    "nothing was asked (see --estimate)"
                )
        return plan

    def records(self, items: list[Item]) -> Iterator[dict[str, Any]]:
        """The preference records of `items` (after prepare_batch in batch mode: its plan)."""
        if self._batch_mode is not None:
            assert self._plan is not None, "prepare_batch left questions pending"
            plan = self._plan
        else:
            plan = self._plan = self._check(items)
            if self.cache is not None:
                self.held_pending += hold_pending(self.cache, plan)
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

    def _cache_warnings(self) -> None:
        """What the summary says of replies that could not be read and of cache rows that were not
        well formed."""
        stats = self.annotator.stats
        if stats.unreadable:
            log.warning(
                "farm-annotate: %d pair(s) have no verdict because the judge's reply could not be read "
                "(preference null, see preference_reason), %d pair(s) answered from cached failures: "
                "such replies are cached, a rerun re-reads them for free and --retry-failed asks again",
                stats.unreadable,
                stats.cached_failures,
            )
        if self.unreadable_rows:
            log.warning(
                "farm-annotate: %d cache row(s) in %s could not be read (not a well-formed verdict): "
                "asked again as if missing",
                len(self.unreadable_rows),
                self.cache_path,
            )

    def close(self) -> None:
        """Close the backends (their connections, on their event loop) and the cache, giving up any
        claims this run still holds."""
        try:
            self.annotator.close()
            if self._batch_mode is not None:
                self._batch_mode.close()
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
        if self._batch_mode is not None:
            log.info(self._batch_mode.summary())
            if self._batch_mode.stats.pending:
                log.warning(
                    "farm-annotate: %d question(s) are pending in batches; no records were written: run "
                    "the same command later to collect them",
                    self._batch_mode.stats.pending,
                )
        if self.held_pending:
            log.warning(
                "farm-annotate: %d question(s) are pending in a batch and were not asked again (preference "
                "null): collect them with the same command and --batch",
                self.held_pending,
            )
        self._cache_warnings()
        unanswered = sum(stats.unanswered.values())
        if stats.failures > stats.skipped_budget + unanswered + stats.unreadable:
            log.warning(
                "farm-annotate: %d pair(s) have no verdict (preference null, see preference_reason); rerun the "
                "same command to ask them again: verdicts already given are cached",
                stats.failures - stats.skipped_budget - unanswered - stats.unreadable,
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

    def ledger_entry(self) -> dict[str, Any]:
        """What this run asked and spent, as one line of a ledger (farmkit.annotate.ledger)."""
        stats = self.annotator.stats
        judges: dict[str, dict[str, float]] = {}

        def book(model: str, pairs: float, prompt: float, completion: float, price: float) -> None:
            entry = judges.setdefault(
                model, {"pairs": 0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "price": 0.0}
            )
            for name, amount in zip(entry, (pairs, prompt, completion, price), strict=True):
                entry[name] += amount

        # what this run paid for directly: each question once (a repeated one is answered by its first)
        seen: set[str] = set()
        for ask in self._plan.asks if self._plan is not None else []:
            verdict = ask.verdict
            if ask.cached or verdict is None or verdict.model is None or ask.key in seen:
                continue
            if ask.key is not None:
                seen.add(ask.key)
            book(
                verdict.model,
                1,
                verdict.prompt_tokens,
                verdict.completion_tokens,
                verdict.price,
            )
        # what batches were billed is in the ledger already, booked as each was collected
        batch = self._batch_mode.stats if self._batch_mode is not None else None
        booked = (
            [sum(spent[i] for spent in batch.spend.values()) for i in (1, 2, 3)]
            if batch
            else [0, 0, 0]
        )
        return {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "pool": self.pool.name,
            "mode": "batch" if self.batch is not None else "direct",
            "pairs": stats.items,
            "requests": stats.requests + (batch.submitted if batch else 0),
            "cached": stats.cache_hits,
            "pending": batch.pending if batch else 0,
            "prompt_tokens": stats.prompt_tokens - booked[0],
            "completion_tokens": stats.completion_tokens - booked[1],
            "price": round(stats.price - booked[2], 8),
            "judges": {
                model: {**entry, "price": round(entry["price"], 8)}
                for model, entry in sorted(judges.items())
            },
        }


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
    batch: BatchConfig | None = None,
) -> list[dict[str, Any]] | int:
    """farm-annotate OUTPUTS --reference REFERENCE: the preference records of every output against
    the reference's output for its instruction (`device`: of the local and reward-model judges;
    `batch`: --batch and --ledger), the run's summary on stderr; none when OUTPUTS hold no output
    record; the exit status instead (PENDING_EXIT) while questions are pending in batches."""
    from farmkit.annotate.pairs import read_items

    items = read_items(outputs, reference, (), skip_missing)
    if not items:
        return []
    records: list[dict[str, Any]] = []
    with Run(
        pool,
        seed=seed,
        both_orders=both_orders,
        cache_path=cache,
        prices_path=prices,
        max_cost=max_cost,
        device=device,
        batch=batch,
    ) as run:
        status = run.annotate(items, records.extend)
    return status or records


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


@contextlib.contextmanager
def _sigterm_ends_at_once() -> Iterator[None]:
    """Within it, SIGTERM ends the run at once (exit 143) with a line saying so, as SIGINT does
    (exit 130): submitting, collecting and polling batches keep in the cache what was paid (each
    batch is noted as soon as it is created, each reply collected in one transaction), so a rerun
    collects what this run submitted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number: int, frame: Any) -> None:
        log.warning(
            "farm-annotate: stopped by SIGTERM; the batches submitted are noted in the cache: rerun "
            "the same command to collect them"
        )
        raise SystemExit(128 + number)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
