"""The annotation engine: decides noise, judge and order shown for every pair (seeded hashes of the
pair, so a decision never depends on what else is in the file or on a previous, killed run), looks
verdicts up in the cache, sends the rest in batched requests with bounded concurrency and a budget,
retries unparseable verdicts, undoes the order shown, and yields preference records in input order
as soon as each prefix of the input is complete.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from farmkit.annotate.backends import (
    Backends,
    FatalBackendError,
    RequestFailed,
    Verdict,
    cacheable,
    identity,
)
from farmkit.annotate.cache import VerdictCache, cache_key
from farmkit.annotate.cost import EXPECTED_COMPLETION_TOKENS, PriceTable, estimate_tokens
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import Judge, Pool, shipped_pools
from farmkit.annotate.prompts import Shown, load_template
from farmkit.cli import provenance, stamp
from farmkit.io import FarmError

log = logging.getLogger("farmkit")
TOOL = "farm-annotate"
# the budget check assumes a prompt may hold this many times our estimate of its tokens (chars / 4)
WORST_TOKENS = 1.5
BULK_REQUEST = 512  # pairs per call for in-process backends (oracle, file), whatever the judge's batch size


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


@dataclass
class Plan:
    asks: list[Ask]
    noise: dict[int, int]  # item -> the coin's preference, for noised items
    requests: list[list[Ask]]  # what still has to be asked, grouped into requests


@dataclass
class Stats:
    items: int = 0
    noised: int = 0
    requests: int = 0
    cache_hits: int = 0
    failures: int = 0
    skipped_budget: int = 0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    price: float = 0.0
    started: float = field(default_factory=time.perf_counter)


UNITS = ("noise", "coin", "judge", "order", "draw-0", "draw-1")


def units(seed: int, item_hash: str) -> dict[str, float]:
    """Uniform numbers in [0, 1) for each random decision about a pair, from the seed and the pair alone,
    so a decision never depends on what else is in the file or on an earlier, killed run."""
    digest = hashlib.sha512(f"{seed}|{item_hash}".encode()).digest()
    return {name: int.from_bytes(digest[8 * i : 8 * i + 8], "big") / 2**64 for i, name in enumerate(UNITS)}


def item_hash(item: Item) -> str:
    return hashlib.sha256(orjson.dumps([item.instruction, item.input, item.output_1, item.output_2])).hexdigest()


def require_endpoint(pool: Pool) -> None:
    """Fail before any work when the pool calls an endpoint and none is configured."""
    from farmkit.annotate.openai_backend import endpoint

    if "openai" in pool.backends and endpoint() == (None, None):
        offline = []
        for name in shipped_pools():
            from farmkit.annotate.pools import load_pool

            if "openai" not in load_pool(name).backends:
                offline.append(name)
        raise FarmError(
            f"pool {pool.name} asks an OpenAI-compatible endpoint and none is configured: set OPENAI_BASE_URL "
            f"(vllm serve, llama.cpp, Ollama) and/or OPENAI_API_KEY. Offline pools need none: {', '.join(offline)}")


class Annotator:
    def __init__(self, pool: Pool, seed: int = 0, both_orders: bool = False, cache: VerdictCache | None = None,
                 prices: PriceTable | None = None, max_cost: float | None = None, device: str = "auto"):
        self.pool, self.seed, self.both_orders, self.cache = pool, seed, both_orders, cache
        self.prices = prices or PriceTable(pool.prices)
        self.max_cost = max_cost
        self.backends = Backends(pool, {"prices": self.prices, "device": device})
        self.stats = Stats()
        self._stopped = False
        self._weights = [judge.weight for judge in pool.judges]
        self._judge_details = [self._details(judge) for judge in pool.judges]
        self._noised_details = self._details(None)
        # the judge's part of every cache key: its configuration, model, prompt text, and the seed
        self._judge_keys = [cache_key({"judge": judge.key_fields(), "identity": identity(pool, judge), "seed": seed}).encode()
                            if cacheable(judge) else None for judge in pool.judges]

    # -- planning ---------------------------------------------------------------------------

    def plan(self, items: list[Item]) -> Plan:
        asks: list[Ask] = []
        noise: dict[int, int] = {}
        total = sum(self._weights)
        for index, item in enumerate(items):
            draws = units(self.seed, item_hash(item))
            if self.pool.flip_rate > 0 and draws["noise"] < 2 * self.pool.flip_rate:
                noise[index] = 1 if draws["coin"] < 0.5 else 2
                continue
            point, judge_index = draws["judge"] * total, 0
            while judge_index < len(self._weights) - 1 and point >= self._weights[judge_index]:
                point -= self._weights[judge_index]
                judge_index += 1
            orders = (False, True) if self.both_orders else (draws["order"] < 0.5,)
            for swapped in orders:
                ask = Ask(index, judge_index, swapped, draws[f"draw-{int(swapped)}"])
                if self._judge_keys[judge_index] is not None:
                    ask.key = self._key(ask, items[index])
                asks.append(ask)
        if self.cache is not None:
            found = self.cache.get_many(ask.key for ask in asks if ask.key is not None)
            for ask in asks:
                if ask.key in found:
                    ask.verdict, ask.cached = _verdict(found[ask.key]), True
        pending = [ask for ask in asks if ask.verdict is None]
        return Plan(asks, noise, self._group(pending))

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
            size = BULK_REQUEST if judge.backend in ("oracle", "file") else judge.batch_size
            requests.extend(asks[start : start + size] for start in range(0, len(asks), size))
        # roughly in input order, so records can be written while later requests are still running
        return sorted(requests, key=lambda request: request[0].item)

    @staticmethod
    def shown(item: Item, ask: Ask) -> Shown:
        first, second = (item.output_2, item.output_1) if ask.swapped else (item.output_1, item.output_2)
        return Shown(item.instruction, item.input, first, second)

    # -- estimating -------------------------------------------------------------------------

    def request_cost(self, request: list[Ask], items: list[Item], worst: bool) -> tuple[int, int, float]:
        """(prompt tokens, completion tokens, price) expected for a request, or at most when `worst`."""
        judge = self.pool.judges[request[0].judge]
        if judge.backend != "openai":
            return 0, 0, 0.0
        template = load_template(judge.prompt)
        messages = template.messages([self.shown(items[a.item], a) for a in request], judge.examples)
        prompt = sum(estimate_tokens(m["content"]) + 4 for m in messages)
        completion = judge.max_tokens if worst else min(judge.max_tokens, EXPECTED_COMPLETION_TOKENS[template.format] * len(request))
        model = self.pool.model_for(judge) or ""
        return prompt, completion, self.prices.price(model, prompt * (WORST_TOKENS if worst else 1.0), completion)

    def estimate(self, items: list[Item], plan: Plan) -> dict[str, Any]:
        prompt = completion = 0
        price = 0.0
        for request in plan.requests:
            p, c, cost = self.request_cost(request, items, worst=False)
            prompt, completion, price = prompt + p, completion + c, price + cost
        paid = [self.pool.judges[r[0].judge].backend == "openai" for r in plan.requests]
        return {"items": len(items), "noised": len(plan.noise), "cached": sum(a.cached for a in plan.asks),
                "requests": sum(paid), "in_process_pairs": sum(len(r) for r, p in zip(plan.requests, paid, strict=True) if not p),
                "prompt_tokens": prompt, "completion_tokens": completion, "price": round(price, 6),
                "unpriced_models": sorted(self.prices.unpriced)}

    # -- running ----------------------------------------------------------------------------

    def run(self, items: list[Item], plan: Plan | None = None) -> Iterator[dict[str, Any]]:
        """Preference records for `items`, in input order, yielded as each prefix is complete."""
        plan = plan or self.plan(items)
        self.stats.items += len(items)
        self.stats.noised += len(plan.noise)
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
                ready.append(self.record(items[index], asks, plan.noise.get(index)))
                state["next"] += 1

        flush()
        if plan.requests:
            yield from ready
            ready.clear()
            yield from self._drive(plan.requests, items, flush, ready)
        flush()
        yield from ready

    def _drive(self, requests: list[list[Ask]], items: list[Item], flush: Callable[[], None],
               ready: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Run the requests on an event loop in steps, yielding finished records between steps."""
        loop = asyncio.new_event_loop()
        tasks: list[asyncio.Task] = []
        try:
            slots = asyncio.Semaphore(int(self.pool.settings["concurrency"]))
            budget = {"reserved": 0.0}
            tasks = [loop.create_task(self._request(request, items, slots, budget)) for request in requests]
            # completed tasks are collected by a callback: asyncio.wait over every pending task at each
            # step would cost O(requests) per completion, O(requests^2) in all
            finished: list[asyncio.Task] = []
            some_done = asyncio.Event()

            def collect(task: asyncio.Task) -> None:
                finished.append(task)
                some_done.set()

            for task in tasks:
                task.add_done_callback(collect)
            collected = 0
            while collected < len(tasks):
                loop.run_until_complete(some_done.wait())
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
                yield from ready
                ready.clear()
        finally:
            # stopped early (an error, or the reader closed the pipe): cancel what is left, quietly
            unfinished = [task for task in tasks if not task.done()]
            for task in unfinished:
                task.cancel()
            if unfinished:
                loop.run_until_complete(asyncio.wait(unfinished))
            for task in tasks:
                if not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not report it again at exit
            loop.run_until_complete(self.backends.close())
            loop.close()

    async def _request(self, request: list[Ask], items: list[Item], slots: asyncio.Semaphore, budget: dict) -> None:
        judge = self.pool.judges[request[0].judge]
        backend = self.backends.get(judge.backend)
        pending = request
        for attempt in range(int(self.pool.settings["parse_retries"]) + 1):
            async with slots:
                if self._stopped:
                    return  # a fatal error elsewhere: send nothing more
                worst = 0.0
                if backend.priced and self.max_cost is not None:
                    worst = self.request_cost(pending, items, worst=True)[2]
                    if self.stats.price + budget["reserved"] + worst > self.max_cost:
                        self._fail(pending, f"not asked: the next request could exceed --max-cost {self.max_cost}",
                                   backend.model_name(judge))
                        self.stats.skipped_budget += len(pending)
                        return
                budget["reserved"] += worst
                try:
                    verdicts = await backend.judge(judge, [self.shown(items[a.item], a) for a in pending],
                                                   [a.draw for a in pending], self._request_seed(pending, attempt))
                except FatalBackendError:
                    self._stopped = True
                    raise
                except RequestFailed as exc:
                    self._fail(pending, f"request failed: {exc}", backend.model_name(judge))
                    return
                finally:
                    budget["reserved"] -= worst
            if backend.priced:
                self.stats.requests += 1
            for verdict in verdicts:
                self.stats.prompt_tokens += verdict.prompt_tokens
                self.stats.completion_tokens += verdict.completion_tokens
                self.stats.price += verdict.price
            for ask, verdict in zip(pending, verdicts, strict=True):
                if verdict.choice is not None or attempt == int(self.pool.settings["parse_retries"]):
                    ask.verdict = verdict
            answered = {ask.key: _stored(ask.verdict) for ask in pending
                        if ask.key is not None and ask.verdict is not None and ask.verdict.choice is not None}
            if self.cache is not None:
                self.cache.put_many(answered)
            pending = [ask for ask in pending if ask.verdict is None]
            if not pending:
                return
        for ask in pending:  # only reached when parse_retries is negative
            ask.verdict = Verdict(None, reason="no verdict")

    def _request_seed(self, asks: list[Ask], attempt: int) -> int:
        digest = hashlib.sha256(orjson.dumps([self.seed, attempt, [a.key or a.draw for a in asks]])).digest()
        return int.from_bytes(digest[:4], "big")

    def _fail(self, asks: list[Ask], reason: str, model: str | None = None) -> None:
        for ask in asks:
            ask.verdict = Verdict(None, reason=reason, model=model)

    # -- records ----------------------------------------------------------------------------

    def record(self, item: Item, asks: list[Ask], coin: int | None) -> dict[str, Any]:
        record = dict(item.record)
        if coin is not None:
            preference, reason = coin, None
            details = dict(self._noised_details)
        else:
            details = dict(self._judge_details[asks[0].judge])
            verdicts = [ask.verdict for ask in asks]
            reasons = [v.reason or "no verdict" for v in verdicts if v.choice is None]
            if reasons:
                preference, reason = None, "; ".join(dict.fromkeys(reasons))
                self.stats.failures += 1
            else:
                preferences = {_undo_order(ask) for ask in asks}
                # asked in both orders: two verdicts that disagree are a tie
                preference, reason = (preferences.pop() if len(preferences) == 1 else 1.5), None
            details["model"] = verdicts[0].model
            details["order_shown"] = "both" if len(asks) > 1 else ("2,1" if asks[0].swapped else "1,2")
            details["prompt_tokens"] = round(sum(v.prompt_tokens for v in verdicts), 1)
            details["completion_tokens"] = round(sum(v.completion_tokens for v in verdicts), 1)
            details["price"] = round(sum(v.price for v in verdicts), 8)
            details["time"] = round(sum(v.seconds for v in verdicts), 4)
            if len(asks) == 1 and verdicts[0].probability is not None:
                details["p_first_better"] = verdicts[0].probability
            if preference is None:
                raw = [v.raw for v in verdicts if v.choice is None and v.raw is not None]
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
        asks_a_model = judge.backend in ("openai", "local")
        return provenance(TOOL, self.seed, pool=self.pool.name, noised=False, judge=judge.name, backend=judge.backend,
                          prompt=judge.prompt if asks_a_model else None,
                          batch_size=judge.batch_size if asks_a_model else None, temperature=judge.temperature)


def _undo_order(ask: Ask) -> float:
    """The verdict on the pair as given (1: output_1 better, 2: output_2, 1.5: tie)."""
    choice = ask.verdict.choice
    if choice == "tie":
        return 1.5
    first_won = choice == "A"
    return 2 if first_won == ask.swapped else 1


def _stored(verdict: Verdict) -> dict[str, Any]:
    return {"choice": verdict.choice, "prompt_tokens": verdict.prompt_tokens, "completion_tokens": verdict.completion_tokens,
            "price": verdict.price, "seconds": verdict.seconds, "model": verdict.model, "probability": verdict.probability}


def _verdict(stored: dict[str, Any]) -> Verdict:
    return Verdict(stored["choice"], prompt_tokens=stored["prompt_tokens"], completion_tokens=stored["completion_tokens"],
                   price=stored["price"], seconds=stored["seconds"], model=stored["model"], probability=stored["probability"])
