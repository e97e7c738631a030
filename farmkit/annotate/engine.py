"""The annotation engine: decides noise, judge and order shown for every pair (seeded hashes of the
pair, so a decision never depends on what else is in the file or on a previous, killed run), looks
verdicts up in the cache, sends the rest in batched requests with bounded concurrency and a budget,
retries unparseable verdicts, undoes the order shown, and yields preference records in input order
as soon as each prefix of the input is complete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from farmkit.annotate import parse
from farmkit.annotate.backends import Backends, backend_class
from farmkit.annotate.base import FatalBackendError, RequestFailed, Verdict
from farmkit.annotate.cache import PENDING_IN_BATCH, VerdictCache, cache_key
from farmkit.annotate.cost import (
    EXPECTED_COMPLETION_TOKENS,
    MESSAGE_TOKENS,
    Budget,
    PriceTable,
    Reservation,
    prompt_bound,
)
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import Judge, Pool, shipped_pools
from farmkit.annotate.prompts import Shown, load_template
from farmkit.core.endpoint import redact
from farmkit.core.io import FarmError
from farmkit.core.provenance import provenance, stamp
from farmkit.lm.tokens import estimate_tokens

log = logging.getLogger("farmkit")
TOOL = "farm-annotate"
_SIGNALLED = object()  # put on a run's record queue by its SIGINT or SIGTERM handler
CLAIM_POLL = 0.2  # seconds between looks at a verdict another run is asking for
# seconds a claim lasts unless renewed, and between renewals: a live run renews its claims, so the lease
# only bounds how long a run that died on another host (where its pid cannot be checked) holds them
CLAIM_LEASE = 120.0
CLAIM_RENEWAL = 20.0
BULK_REQUEST = (
    512  # pairs per call for in-process backends (oracle, file), whatever the judge's batch size
)
# seconds a SIGINT or SIGTERM waits for the replies already on their way (cached as they come);
# a request still unanswered then is left, whatever its timeout: the run ends within seconds
STOP_GRACE = 2.0
BUDGET_POLL = 0.02  # seconds between looks at the budget, while requests in flight may free room


@dataclass
class Ask:
    """One question to one judge: an item shown in one order."""

    item: int
    judge: int
    swapped: bool  # True: output_2 is shown first (as A)
    draw: float
    key: str | None = None
    verdict: Verdict | None = None
    cached: bool = False
    # what the attempts whose reply could not be parsed cost: they were paid too
    spent: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    unparsed: int = 0  # replies whose verdict for this ask could not be read
    estimated: bool = False  # some of what its attempts cost is booked at its most (see Verdict)


@dataclass
class Plan:
    asks: list[Ask]
    noise: dict[int, int]  # item -> the coin's preference, for noised items
    ties: set[int]  # items whose two outputs are the same text: a tie, asked of nobody
    requests: list[list[Ask]]  # what still has to be asked, grouped into requests
    followers: dict[
        str, list[Ask]
    ]  # key -> later asks of the same question, answered with the first one's verdict


@dataclass
class Stats:
    items: int = 0
    noised: int = 0
    identical: int = 0
    requests: int = 0
    cache_hits: int = 0
    failures: int = 0
    skipped_budget: int = 0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    price: float = 0.0
    replies: dict[str, int] = field(
        default_factory=dict
    )  # judge -> verdicts it was asked for (every attempt)
    parse_failures: dict[str, int] = field(
        default_factory=dict
    )  # judge -> replies that could not be read
    # reason -> pairs a judge that is not asked (a labels file) had no verdict for
    unanswered: dict[str, int] = field(default_factory=dict)
    unreadable: int = 0  # pairs without a verdict because their reply could not be read
    cached_failures: int = 0  # of those, pairs answered from replies cached as unreadable
    started: float = field(default_factory=time.perf_counter)


UNITS = ("noise", "coin", "judge", "order", "draw-0", "draw-1")


def units(seed: int, item_hash: str) -> dict[str, float]:
    """Uniform numbers in [0, 1) for each random decision about a pair, from the seed and the pair alone,
    so a decision never depends on what else is in the file or on an earlier, killed run."""
    digest = hashlib.sha512(f"{seed}|{item_hash}".encode()).digest()
    return {
        name: int.from_bytes(digest[8 * i : 8 * i + 8], "big") / 2**64
        for i, name in enumerate(UNITS)
    }


def instruction_hash(item: Item) -> str:
    return hashlib.sha256(orjson.dumps([item.instruction, item.input])).hexdigest()


def item_hash(item: Item) -> str:
    return hashlib.sha256(
        orjson.dumps([item.instruction, item.input, item.output_1, item.output_2])
    ).hexdigest()


def needs_endpoint(pool: Pool) -> bool:
    return any(backend_class(name).needs_endpoint for name in pool.backends)


def require_endpoint(pool: Pool) -> None:
    """Fail before any work when the pool calls an endpoint and none is configured."""
    from farmkit.annotate.openai_backend import endpoint

    if needs_endpoint(pool) and endpoint() == (None, None):
        from farmkit.annotate.pools import load_pool

        offline = [name for name in shipped_pools() if not needs_endpoint(load_pool(name))]
        raise FarmError(
            f"pool {pool.name} asks an OpenAI-compatible endpoint and none is configured: set OPENAI_BASE_URL "
            f"(vllm serve, llama.cpp, Ollama) and/or OPENAI_API_KEY. Offline pools need none: {', '.join(offline)}"
        )


class Annotator:
    def __init__(
        self,
        pool: Pool,
        seed: int = 0,
        both_orders: bool = False,
        cache: VerdictCache | None = None,
        prices: PriceTable | None = None,
        max_cost: float | None = None,
        device: str = "auto",
        assign_by: str = "item",
        retry_failed: bool = False,
        as_given: bool = False,
    ):
        """`assign_by`: "item" (each pair draws its judge and order) or "instruction" (all pairs of one
        instruction share them). `retry_failed`: ask again the questions whose cached reply could not be
        read (by default such a reply is re-read, and asked again only when a newer parser cannot read it).
        `as_given`: show every pair in its own order (output_1 first) instead of a drawn one (farm-audit
        asks each pair and its mirror image so)."""
        self.pool, self.seed, self.both_orders, self.cache = pool, seed, both_orders, cache
        self.as_given = as_given
        self.assign_by, self.retry_failed = assign_by, retry_failed
        self.prices = prices or PriceTable(pool.prices)
        self.max_cost = max_cost
        self.budget = None if max_cost is None else Budget(max_cost, self.prices)
        options = {"prices": self.prices, "device": device}
        self.backends = Backends(pool, options)
        self._classes = [backend_class(judge.backend) for judge in pool.judges]
        self._judge_details = [self._details(judge) for judge in pool.judges]
        self.stats = Stats()
        self._loop: asyncio.AbstractEventLoop | None = None  # made on first use, ended by close()
        self._requests: tuple[asyncio.Task, threading.Thread] | None = None  # running on the loop
        self._stopped = False
        self._signal: int | None = None  # SIGINT or SIGTERM received while requests ran
        self._followers: dict[str, list[Ask]] = {}
        self._weights = [judge.weight for judge in pool.judges]
        self._noised_details = self._details(None)
        # the judge's part of every cache key: its settings, what they resolve to, and the seed where the judge
        # samples (a greedy judge gives the same verdict whatever the seed, so a seed sweep does not pay it again)
        self._judge_keys = [
            cache_key(
                {
                    "judge": judge.key_fields(),
                    "identity": cls.identity(pool, judge, options),
                    "seed": seed if judge.temperature > 0 else None,
                }
            ).encode()
            if cls.cacheable
            else None
            for judge, cls in zip(pool.judges, self._classes, strict=True)
        ]

    # -- planning ---------------------------------------------------------------------------

    def plan(self, items: list[Item]) -> Plan:
        asks: list[Ask] = []
        noise: dict[int, int] = {}
        ties: set[int] = set()
        total = sum(self._weights)
        for index, item in enumerate(items):
            if (
                item.output_1 == item.output_2
            ):  # a judge could only flip a coin (or show its position bias)
                ties.add(index)
                continue
            draws = units(self.seed, item_hash(item))
            if self.assign_by == "instruction":
                # every model meets the same judge in the same order on an instruction (as AlpacaEval does),
                # so the judge's draw cancels out of a comparison between models
                shared = units(self.seed, instruction_hash(item))
                draws["judge"], draws["order"] = shared["judge"], shared["order"]
            if self.pool.flip_rate > 0 and draws["noise"] < 2 * self.pool.flip_rate:
                noise[index] = 1 if draws["coin"] < 0.5 else 2
                continue
            point, judge_index = draws["judge"] * total, 0
            while judge_index < len(self._weights) - 1 and point >= self._weights[judge_index]:
                point -= self._weights[judge_index]
                judge_index += 1
            if self.both_orders:
                orders: tuple[bool, ...] = (False, True)
            else:
                orders = (False,) if self.as_given else (draws["order"] < 0.5,)
            for swapped in orders:
                ask = Ask(index, judge_index, swapped, draws[f"draw-{int(swapped)}"])
                if self._judge_keys[judge_index] is not None:
                    ask.key = self._key(ask, items[index])
                asks.append(ask)
        if self.cache is not None:
            found = self.cache.get_many(ask.key for ask in asks if ask.key is not None)
            for ask in asks:
                if ask.key in found:
                    ask.verdict = self._from_cache(ask, found[ask.key])
                    ask.cached = ask.verdict is not None
        # the same question twice in one run (a repeated pair, or a pair and its mirror image shown the other
        # way round) is asked once
        leaders: set[str] = set()
        followers: dict[str, list[Ask]] = {}
        pending = []
        for ask in asks:
            if ask.verdict is not None:
                continue
            if ask.key is not None and ask.key in leaders:
                followers.setdefault(ask.key, []).append(ask)
                continue
            if ask.key is not None:
                leaders.add(ask.key)
            pending.append(ask)
        return Plan(asks, noise, ties, self._group(pending), followers)

    def _from_cache(self, ask: Ask, row: dict[str, Any]) -> Verdict | None:
        """The verdict a cache row gives `ask`, or None where it is to be asked again: a reply cached as
        unreadable is read with the parser as it is now (a verdict now: the row becomes one), and asked
        again with --retry-failed, or where the parser changed since and still cannot read it."""
        if row["choice"] is not None:
            return _verdict(row)
        judge = self.pool.judges[ask.judge]
        read = self._classes[ask.judge].reread(judge, row["raw"], row["position"], row["count"])
        if read.choice is not None:
            upgraded = {name: row[name] for name in _stored(read) if name in row}
            upgraded.update(choice=read.choice, probability=read.probability, soft=read.soft)
            if self.cache is not None:
                self.cache.put_many({ask.key: upgraded})
            return _verdict(upgraded)
        if self.retry_failed or row["parser"] != parse.PARSER_VERSION:
            return None
        return dataclasses.replace(_verdict(row), reason=row["reason"], raw=row["raw"])

    def _key(self, ask: Ask, item: Item) -> str:
        shown = self.shown(item, ask)
        texts = orjson.dumps([shown.instruction, shown.input, shown.output_a, shown.output_b])
        return hashlib.sha256(self._judge_keys[ask.judge] + texts).hexdigest()

    def _group(self, pending: list[Ask]) -> list[list[Ask]]:
        by_judge: dict[int, list[Ask]] = {}
        for ask in pending:
            by_judge.setdefault(ask.judge, []).append(ask)
        requests = []
        for judge_index, asks in by_judge.items():
            judge = self.pool.judges[judge_index]
            size = BULK_REQUEST if self._classes[judge_index].bulk else judge.batch_size
            requests.extend(asks[start : start + size] for start in range(0, len(asks), size))
        # roughly in input order, so records can be written while later requests are still running
        return sorted(requests, key=lambda request: request[0].item)

    @staticmethod
    def shown(item: Item, ask: Ask) -> Shown:
        first, second = (
            (item.output_2, item.output_1) if ask.swapped else (item.output_1, item.output_2)
        )
        return Shown(item.instruction, item.input, first, second)

    # -- estimating -------------------------------------------------------------------------

    def _messages(self, request: list[Ask], items: list[Item]) -> list[dict[str, str]]:
        judge = self.pool.judges[request[0].judge]
        return load_template(judge.prompt).messages(
            [self.shown(items[a.item], a) for a in request], judge.examples
        )

    def request_cost(self, request: list[Ask], items: list[Item]) -> tuple[int, int, float]:
        """(prompt tokens, completion tokens, price) expected for a request (the budget's holds are
        bounds from above instead, see _reserve)."""
        judge = self.pool.judges[request[0].judge]
        if not self._classes[request[0].judge].priced:
            return 0, 0, 0.0
        template = load_template(judge.prompt)
        messages = self._messages(request, items)
        prompt = sum(estimate_tokens(m["content"]) + MESSAGE_TOKENS for m in messages)
        completion = min(
            judge.max_tokens, EXPECTED_COMPLETION_TOKENS[template.format] * len(request)
        )
        model = self.pool.model_for(judge) or ""
        return prompt, completion, self.prices.price(model, prompt, completion)

    async def _reserve(self, request: list[Ask], items: list[Item]) -> Reservation | None:
        """The budget's hold for `request`'s first attempt (the most it can be billed), or None when
        that cannot fit under --max-cost. While other requests are in flight, it waits for them:
        they are billed less than they hold, and what they free may let this one fit."""
        assert self.budget is not None
        judge = self.pool.judges[request[0].judge]
        model, bound = (
            self.pool.model_for(judge) or "",
            prompt_bound(self._messages(request, items)),
        )
        while True:
            reservation = self.budget.reserve(model, bound, judge.max_tokens)
            if reservation is not None or not self.budget.holding or self._stopped:
                return reservation
            await asyncio.sleep(BUDGET_POLL)

    def estimate(self, items: list[Item], plan: Plan) -> dict[str, Any]:
        prompt = completion = 0
        price = batch_price = 0.0
        for request in plan.requests:
            p, c, cost = self.request_cost(request, items)
            prompt, completion, price = prompt + p, completion + c, price + cost
            model = self.pool.model_for(self.pool.judges[request[0].judge]) or ""
            batch_price += self.prices.price(model, p, c, batch=True) if cost else 0.0
        paid = [self._classes[r[0].judge].priced for r in plan.requests]
        return {
            "items": len(items),
            "noised": len(plan.noise),
            "identical": len(plan.ties),
            "cached": sum(a.cached for a in plan.asks),
            "requests": sum(paid),
            "in_process_pairs": sum(
                len(r) for r, p in zip(plan.requests, paid, strict=True) if not p
            ),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "price": round(price, 6),
            "batch_price": round(batch_price, 6),  # the same requests through a Batch API
            "unpriced_models": sorted(self.prices.unpriced),
        }

    # -- running ----------------------------------------------------------------------------

    def run(self, items: list[Item], plan: Plan | None = None) -> Iterator[dict[str, Any]]:
        """Preference records for `items`, in input order, yielded as each prefix is complete."""
        plan = plan or self.plan(items)
        self._followers = plan.followers
        self.stats.items += len(items)
        self.stats.noised += len(plan.noise)
        self.stats.identical += len(plan.ties)
        self.stats.cache_hits += sum(a.cached for a in plan.asks)
        by_item: dict[int, list[Ask]] = {}
        for ask in plan.asks:
            by_item.setdefault(ask.item, []).append(ask)
        ready: list[dict[str, Any]] = []
        state = {"next": 0}

        def flush() -> None:
            while state["next"] < len(items):
                index = state["next"]
                asks = by_item.get(index, [])
                if any(ask.verdict is None for ask in asks):
                    return
                ready.append(
                    self.record(items[index], asks, plan.noise.get(index), index in plan.ties)
                )
                state["next"] += 1

        flush()
        if plan.requests:
            yield from ready
            ready.clear()
            yield from self._drive(plan.requests, items, flush, ready)
        flush()
        yield from ready

    def _drive(
        self,
        requests: list[list[Ask]],
        items: list[Item],
        flush: Callable[[], None],
        ready: list[dict[str, Any]],
    ) -> Iterator[dict[str, Any]]:
        """Run the requests on the annotator's event loop, in a thread of its own, yielding finished
        records as they come. The loop does not wait for whoever reads the records: a reader that is
        slow or gone (a full pipe nobody reads) holds no request, no claim and no verdict back, so other
        runs on the cache never wait for this run's stdout. The loop, and the backends' connections on
        it, outlive this call: close() ends them."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        loop = self._loop
        out: queue.SimpleQueue = queue.SimpleQueue()
        restore = self._stop_on_signals(out)
        work = loop.create_task(self._all(requests, items, flush, ready, out))

        def serve() -> None:
            try:
                loop.run_until_complete(work)
                out.put(None)
            except BaseException as exc:  # handed to the reader, raised there
                out.put(exc)

        thread = threading.Thread(target=serve, name="farm-annotate-requests", daemon=True)
        thread.start()
        self._requests = (work, thread)
        try:
            # once a signal came: when the replies on their way are no longer waited for
            stop_at: float | None = None
            while True:
                try:
                    wait = None if stop_at is None else max(0.0, stop_at - time.monotonic())
                    batch = out.get(timeout=wait)
                except queue.Empty:  # still unanswered: left (a rerun asks them again)
                    assert self._signal is not None
                    self._stop_requests()
                    _interrupted(self._signal, left=True)
                if batch is _SIGNALLED:
                    stop_at = time.monotonic() + STOP_GRACE
                    continue
                if batch is None:
                    break
                if isinstance(batch, BaseException):
                    raise batch
                yield from batch
            if self._signal is not None:
                _interrupted(self._signal)
        finally:
            restore()
            self._stop_requests()

    def _stop_requests(self) -> None:
        """Cancel what is left of the requests (stopped early: an error, or the reader closed the
        pipe), quietly, and wait for their thread to end."""
        if self._requests is None:
            return
        work, thread = self._requests
        if not work.done() and self._loop is not None:
            self._loop.call_soon_threadsafe(work.cancel)
        thread.join()
        self._requests = None

    async def _all(
        self,
        requests: list[list[Ask]],
        items: list[Item],
        flush: Callable[[], None],
        ready: list[dict[str, Any]],
        out: queue.SimpleQueue,
    ) -> None:
        """Ask every request, putting each batch of newly finished records on `out`."""
        slots = asyncio.Semaphore(int(self.pool.settings["concurrency"]))
        tasks = [asyncio.create_task(self._request(request, items, slots)) for request in requests]
        renewing = asyncio.create_task(self._renew()) if self.cache is not None else None
        # completed tasks are collected by a callback: asyncio.wait over every pending task at each step
        # would cost O(requests) per completion, O(requests^2) in all
        finished: list[asyncio.Task] = []
        some_done = asyncio.Event()

        def collect(task: asyncio.Task) -> None:
            finished.append(task)
            some_done.set()

        for task in tasks:
            task.add_done_callback(collect)
        try:
            collected = 0
            while collected < len(tasks):
                await some_done.wait()
                some_done.clear()
                done, finished[:] = list(finished), []
                collected += len(done)
                for task in done:
                    error = task.exception()
                    if isinstance(error, FatalBackendError):
                        raise FarmError(str(error)) from None
                    if error is not None:
                        raise error
                flush()
                if ready:
                    out.put(list(ready))
                    ready.clear()
        finally:
            unfinished = [task for task in tasks if not task.done()]
            if renewing is not None:
                renewing.cancel()
                unfinished.append(renewing)
            for task in unfinished:
                task.cancel()
            if unfinished:
                await asyncio.wait(unfinished)
            for task in tasks:
                if not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not report it again at exit

    def _stop_on_signals(self, out: queue.SimpleQueue) -> Callable[[], None]:
        """Until the returned function is called, SIGINT or SIGTERM stops sending requests: those
        waiting (for a rate limit's reset, a retry's backoff, a place) are not sent, and the replies
        of the requests in flight (at most the pool's concurrency) are waited for STOP_GRACE seconds
        and their verdicts cached, so that a paid reply is not lost; a request unanswered by then is
        left (not cached, its claim released: a rerun asks it again), so that the run ends within
        seconds whatever the timeout. A second signal acts at once. The handlers run in the main
        thread (where Python delivers signals); the requests' thread reads the flag they set, and
        the reader of `out` is told at once (SimpleQueue.put may be called from a handler)."""
        saved: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def restore() -> None:
            for number, handler in saved.items():
                signal.signal(number, signal.SIG_DFL if handler is None else handler)
            saved.clear()

        def stop(number: int, frame: Any) -> None:
            self._stopped, self._signal = True, number
            restore()
            # requests waiting for a rate limit's reset or a retry's backoff end now
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.backends.stop)
            out.put(_SIGNALLED)

        for number in (signal.SIGINT, signal.SIGTERM):
            try:
                saved[number] = signal.signal(number, stop)
            except (ValueError, OSError):
                continue
        return restore

    async def _renew(self) -> None:
        """Extend this run's claims while it runs: a live run keeps its claims however long its requests
        take (a slow endpoint, a queue for the endpoint's concurrency), a dead one loses them a lease
        after its last renewal (at once where its host sees it is gone)."""
        assert self.cache is not None
        while True:
            await asyncio.sleep(CLAIM_RENEWAL)
            self.cache.renew(CLAIM_LEASE)

    def close(self) -> None:
        """Close the backends it built, on the event loop their connections belong to, and the loop.
        The Run that owns this annotator calls it once, at the end of the run."""
        if self._loop is None:
            return
        # a reader that stopped reading (a closed pipe) leaves the records' generator suspended, its
        # requests still running on the loop
        self._stop_requests()
        try:
            self._loop.run_until_complete(self.backends.close())
        finally:
            self._loop.close()
            self._loop = None

    def __enter__(self) -> Annotator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _request(
        self, request: list[Ask], items: list[Item], slots: asyncio.Semaphore
    ) -> None:
        """Ask `request`, less what the cache answers by now and what another run is asking (wait for that)."""
        waiting = request
        while waiting:
            # claimed only once a slot is free, so that a claim is not held while the request waits its turn
            async with slots:
                mine, waiting = self._take(waiting, CLAIM_LEASE)
                if mine:
                    try:
                        await self._ask(mine, items)
                    finally:
                        # failures: let a waiting run ask for itself (a verdict written to the cache
                        # ended its claim in the same transaction: nothing to release)
                        unanswered = [
                            ask.key
                            for ask in mine
                            if ask.key is not None
                            and (ask.verdict is None or ask.verdict.choice is None)
                        ]
                        if self.cache is not None and unanswered:
                            self.cache.release(unanswered)
            if waiting:
                await asyncio.sleep(CLAIM_POLL)

    def _take(self, asks: list[Ask], lease: float) -> tuple[list[Ask], list[Ask]]:
        """(asks this run now claims, asks another run is answering); cached verdicts are settled here."""
        if self.cache is None or self._stopped:
            return asks, []
        # the claim reads the verdicts in its own transaction: a key answered by another run since the
        # plan (or since this run last looked) is settled from the cache, never claimed and paid again
        by_key = {ask.key: ask for ask in asks if ask.key is not None}
        from_cache: dict[str, Verdict] = {}

        def answers(key: str, row: dict[str, Any]) -> bool:
            verdict = self._from_cache(by_key[key], row)
            if verdict is not None:
                from_cache[key] = verdict
            return verdict is not None

        mine, theirs, _ = self.cache.claim(list(by_key), lease, answers)
        for ask in asks:
            if ask.key in from_cache:
                self._settle(ask, from_cache[ask.key], cached=True)
        self._leave_batched(asks, mine)
        rest = [ask for ask in asks if ask.verdict is None]
        taken = set(theirs)
        return [ask for ask in rest if ask.key not in taken], [
            ask for ask in rest if ask.key in taken
        ]

    def _leave_batched(self, asks: list[Ask], mine: list[str]) -> None:
        """Questions a batch took since the plan (farm-annotate --batch in another run) are not
        asked directly: paid once, by the batch. Read after this run's claim, so a batch recorded
        later saw the claim and left them out."""
        assert self.cache is not None
        batched = self.cache.pending_keys(mine)
        if not batched:
            return
        self.cache.release(list(batched))
        for ask in asks:
            if ask.key in batched and ask.verdict is None:
                self._settle(ask, Verdict(None, reason=PENDING_IN_BATCH))

    def _settle(self, ask: Ask, verdict: Verdict, cached: bool = False) -> None:
        """Give `ask`, and the same question asked elsewhere in this run, its verdict."""
        for each in [ask, *self._followers.get(ask.key, [])] if ask.key is not None else [ask]:
            each.verdict, each.cached = verdict, cached
            self.stats.cache_hits += cached

    async def _ask(self, request: list[Ask], items: list[Item]) -> None:
        """Send `request` (its slot held), asking again for the verdicts that could not be parsed."""
        judge = self.pool.judges[request[0].judge]
        backend = self.backends.get(judge.backend)
        pending = request
        for attempt in range(int(self.pool.settings["parse_retries"]) + 1):
            if self._stopped:
                return  # a fatal error elsewhere: send nothing more
            hold: dict[str, Any] = {}
            if backend.priced and self.budget is not None:
                reservation = await self._reserve(pending, items)
                if reservation is None:
                    self._fail(
                        pending,
                        f"not asked: the next request could exceed --max-cost {self.max_cost}",
                        backend.model_name(judge),
                    )
                    self.stats.skipped_budget += sum(
                        1 + len(self._followers.get(a.key, [])) for a in pending
                    )
                    return
                hold["reservation"] = reservation
            try:
                verdicts = await backend.judge(
                    judge,
                    [self.shown(items[a.item], a) for a in pending],
                    [a.draw for a in pending],
                    self._request_seed(pending, attempt),
                    **hold,
                )
            except FatalBackendError:
                self._stopped = True
                raise
            except RequestFailed as exc:
                if backend.priced:  # sent, and failed: a request all the same
                    self.stats.requests += 1
                # its billed attempts count against the budget and in each pair's price
                self.stats.prompt_tokens += exc.prompt_tokens
                self.stats.completion_tokens += exc.completion_tokens
                self._pay(exc.price)
                share = len(pending)
                for ask in pending:
                    ask.spent[0] += exc.prompt_tokens / share
                    ask.spent[1] += exc.completion_tokens / share
                    ask.spent[2] += exc.price / share
                    ask.estimated = ask.estimated or exc.estimated
                reason = f"request failed: {exc}"
                if exc.over_budget:
                    reason += f" (--max-cost {self.max_cost})"
                    self.stats.skipped_budget += sum(
                        1 + len(self._followers.get(a.key, [])) for a in pending
                    )
                self._fail(pending, reason, backend.model_name(judge), sent=True)
                return
            finally:
                if "reservation" in hold:
                    hold["reservation"].release()
            if backend.priced:
                self.stats.requests += 1
            for verdict in verdicts:
                self.stats.prompt_tokens += verdict.prompt_tokens
                self.stats.completion_tokens += verdict.completion_tokens
                self._pay(verdict.price)
            for ask, verdict in zip(pending, verdicts, strict=True):
                self.stats.replies[judge.name] = self.stats.replies.get(judge.name, 0) + 1
                # a backend that reads no text (labels from a file) had no verdict to give: asking
                # again gives the same answer, and nothing failed to parse
                unparsed = verdict.choice is None and backend.parses
                if unparsed:
                    ask.unparsed += 1
                    self.stats.parse_failures[judge.name] = (
                        self.stats.parse_failures.get(judge.name, 0) + 1
                    )
                if not unparsed or attempt == int(self.pool.settings["parse_retries"]):
                    self._settle(
                        ask,
                        dataclasses.replace(
                            verdict,
                            prompt_tokens=verdict.prompt_tokens + ask.spent[0],
                            completion_tokens=verdict.completion_tokens + ask.spent[1],
                            price=verdict.price + ask.spent[2],
                            seconds=verdict.seconds + ask.spent[3],
                            attempts=attempt + 1,
                            parse_failures=ask.unparsed,
                            estimated=verdict.estimated or ask.estimated,
                        ),
                    )
                else:
                    for position, amount in enumerate(
                        (
                            verdict.prompt_tokens,
                            verdict.completion_tokens,
                            verdict.price,
                            verdict.seconds,
                        )
                    ):
                        ask.spent[position] += amount
                    ask.estimated = ask.estimated or verdict.estimated
            answered = {
                ask.key: _stored(ask.verdict)
                for ask in pending
                if ask.key is not None
                and ask.verdict is not None
                and ask.verdict.choice is not None
            }
            if self.cache is not None:
                self.cache.put_many({**answered, **self._unreadable(judge, pending)})
            pending = [ask for ask in pending if ask.verdict is None]
            if not pending:
                return
        self._fail(pending, "no verdict")  # only reached when parse_retries is negative

    def _unreadable(self, judge: Judge, pending: list[Ask]) -> dict[str, dict[str, Any]]:
        """Cache rows for the replies of `pending` (one request, as sent) that arrived and could not be
        read, after their parse retries: what a rerun re-reads instead of paying for again."""
        if not self._classes[pending[0].judge].rereads(judge):
            return {}
        return {
            ask.key: unreadable_row(ask.verdict, position, len(pending))
            for position, ask in enumerate(pending)
            if ask.key is not None
            and ask.verdict is not None
            and ask.verdict.choice is None
            and ask.verdict.raw is not None
        }

    def _pay(self, price: float) -> None:
        self.stats.price += price
        if self.budget is not None:
            self.budget.pay(price)

    def _request_seed(self, asks: list[Ask], attempt: int) -> int:
        digest = hashlib.sha256(
            orjson.dumps([self.seed, attempt, [a.key or a.draw for a in asks]])
        ).digest()
        return int.from_bytes(digest[:4], "big")

    def _fail(
        self, asks: list[Ask], reason: str, model: str | None = None, sent: bool = False
    ) -> None:
        """No verdict for `asks`, priced for what their earlier attempts were billed (`sent`: the last
        attempt was sent and failed, so it counts as an attempt too)."""
        for ask in asks:
            prompt, completion, price, seconds = ask.spent
            self._settle(
                ask,
                Verdict(
                    None,
                    reason=reason,
                    model=model,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    price=price,
                    seconds=seconds,
                    attempts=max(1, ask.unparsed + sent),
                    parse_failures=ask.unparsed,
                    estimated=ask.estimated,
                ),
            )

    # -- records ----------------------------------------------------------------------------

    def record(
        self, item: Item, asks: list[Ask], coin: int | None, identical: bool = False
    ) -> dict[str, Any]:
        record = dict(item.record)
        if identical:
            preference, reason = 1.5, None
            details = dict(self._noised_details, noised=False, tie_reason="identical outputs")
        elif coin is not None:
            preference, reason = coin, None
            details = dict(self._noised_details)
        else:
            details = dict(self._judge_details[asks[0].judge])
            verdicts = [ask.verdict for ask in asks]
            reasons = [v.reason or "no verdict" for v in verdicts if v.choice is None]
            if reasons:
                # what an endpoint said, written out: no secret of the endpoint's, whatever form
                # it came back in (the backends redact it already; this is the last line)
                preference, reason = None, redact("; ".join(dict.fromkeys(reasons)), shapes=False)
                self.stats.failures += 1
                if any(v.choice is None and v.raw is not None for v in verdicts):
                    self.stats.unreadable += 1
                    self.stats.cached_failures += any(
                        a.cached and a.verdict.choice is None for a in asks
                    )
                if not self._classes[asks[0].judge].cacheable:
                    # answered from what the judge holds (a labels file): a rerun answers the same
                    self.stats.unanswered[reason] = self.stats.unanswered.get(reason, 0) + 1
            elif all(v.soft is not None for v in verdicts):
                # soft labels, P(shown second better): undone, and averaged when asked in both orders
                undone = [
                    1 - v.soft if a.swapped else v.soft for a, v in zip(asks, verdicts, strict=True)
                ]
                preference, reason = 1 + sum(undone) / len(undone), None
            else:
                preferences = {_undo_order(ask) for ask in asks}
                # asked in both orders: two verdicts that disagree are a tie
                preference, reason = (preferences.pop() if len(preferences) == 1 else 1.5), None
            details["model"] = verdicts[0].model
            for name in ("reply_model", "system_fingerprint"):  # where the endpoint said them
                said = [getattr(v, name) for v in verdicts if getattr(v, name) is not None]
                if said:
                    details[name] = said[0]
            details["order_shown"] = (
                "both" if len(asks) > 1 else ("2,1" if asks[0].swapped else "1,2")
            )
            details["prompt_tokens"] = round(sum(v.prompt_tokens for v in verdicts), 1)
            details["completion_tokens"] = round(sum(v.completion_tokens for v in verdicts), 1)
            details["price"] = round(sum(v.price for v in verdicts), 8)
            details["time"] = round(sum(v.seconds for v in verdicts), 4)
            attempts = sum(v.attempts for v in verdicts)
            if attempts > len(
                verdicts
            ):  # replies that could not be read were asked again (and paid)
                details["attempts"] = attempts
            if self._classes[asks[0].judge].parses:
                # replies whose verdict could not be read, retried or not: summed over a judge's records
                # and divided by their attempts, the judge's parse-failure rate
                details["parse_failures"] = sum(v.parse_failures for v in verdicts)
            if len(asks) == 1 and verdicts[0].probability is not None:
                details["p_first_better"] = verdicts[0].probability
            if any(v.estimated for v in verdicts):
                # tokens and price include counts the endpoint did not tell, booked at their most
                details["tokens_estimated"] = True
            if preference is None:
                raw = [
                    redact(v.raw, shapes=False)
                    for v in verdicts
                    if v.choice is None and v.raw is not None
                ]
                if raw:
                    details["raw"] = raw
        record["preference"] = preference
        if reason is not None:
            record["preference_reason"] = reason
        else:
            record.pop("preference_reason", None)
        record["annotator"] = self.pool.name
        return stamp(record, TOOL, details)

    def _details(self, judge: Judge | None) -> dict[str, Any]:
        """The provenance every record from `judge` (None: a noised label) shares."""
        if judge is None:
            return provenance(TOOL, self.seed, pool=self.pool.name, noised=True)
        asks_a_model = backend_class(
            judge.backend
        ).cacheable  # a prompted model, where prompt and batch matter
        return provenance(
            TOOL,
            self.seed,
            pool=self.pool.name,
            noised=False,
            judge=judge.name,
            backend=judge.backend,
            prompt=judge.prompt if asks_a_model else None,
            batch_size=judge.batch_size if asks_a_model else None,
            temperature=judge.temperature,
        )


def _interrupted(number: int, left: bool = False) -> None:
    """End the run after a SIGINT or SIGTERM, once the replies in flight are cached (`left`: those
    not received within STOP_GRACE seconds were left)."""
    received = (
        f"the replies received were cached, those not received within {STOP_GRACE:g} s were left "
        "(an endpoint may bill them)"
        if left
        else "the replies in flight were received and cached"
    )
    log.warning(
        "farm-annotate: stopped by %s; %s: rerun the same command to finish",
        signal.Signals(number).name,
        received,
    )
    if number == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + number)


def _undo_order(ask: Ask) -> float:
    """The verdict on the pair as given (1: output_1 better, 2: output_2, 1.5: tie)."""
    choice = ask.verdict.choice
    if choice == "tie":
        return 1.5
    first_won = choice == "A"
    return 2 if first_won == ask.swapped else 1


def _stored(verdict: Verdict) -> dict[str, Any]:
    return {
        "choice": verdict.choice,
        "prompt_tokens": verdict.prompt_tokens,
        "completion_tokens": verdict.completion_tokens,
        "price": verdict.price,
        "seconds": verdict.seconds,
        "model": verdict.model,
        "probability": verdict.probability,
        "soft": verdict.soft,
        "attempts": verdict.attempts,
        "parse_failures": verdict.parse_failures,
        "estimated": verdict.estimated,
        # a cached verdict keeps what answered it
        "reply_model": verdict.reply_model,
        "system_fingerprint": verdict.system_fingerprint,
    }


def unreadable_row(verdict: Verdict, position: int, count: int) -> dict[str, Any]:
    """The cache row of a reply that arrived and could not be read: the pair was at `position` of a
    request of `count` pairs, so a later parser can read its verdict out of `raw` again."""
    return {
        **_stored(verdict),
        "reason": redact(verdict.reason or "no verdict", shapes=False),
        "raw": None if verdict.raw is None else redact(verdict.raw, shapes=False),
        "parser": parse.PARSER_VERSION,
        "position": position,
        "count": count,
    }


def _verdict(stored: dict[str, Any]) -> Verdict:
    return Verdict(
        stored["choice"],
        prompt_tokens=stored["prompt_tokens"],
        completion_tokens=stored["completion_tokens"],
        price=stored["price"],
        seconds=stored["seconds"],
        model=stored["model"],
        probability=stored["probability"],
        soft=stored.get("soft"),
        attempts=stored.get("attempts", 1),
        # stored before the count was kept: a cached verdict was read, so its earlier replies were not
        parse_failures=stored.get("parse_failures", stored.get("attempts", 1) - 1),
        estimated=stored.get("estimated", False),
        reply_model=stored.get("reply_model"),
        system_fingerprint=stored.get("system_fingerprint"),
    )
