"""Batch mode (farm-annotate --batch): the questions a run has to ask an endpoint judge go through an
OpenAI-compatible Batch API, at the batch price: a JSONL file of chat-completion requests uploaded to
/files, a batch created on /batches, polled, then its output and error files read. Verdicts land in
the verdict cache as direct ones do, so a run mixing the two never pays twice.

What is pending lives in the cache (farmkit.annotate.cache: batches, batch_lines, batch_keys), never
only in memory, so a cron job submits one night and the same command collects the next, and a run
killed at any point neither loses a batch nor pays for a question twice:
- the intent (its lines and the keys each asks) is recorded before anything is uploaded, and goes
  with the batch as its metadata `farmkit_intent`;
- killed before its batch id was recorded: a later run finds the intent orphaned (its run is gone),
  looks among the endpoint's batches for one with that metadata and adopts it, or, finding none,
  drops the intent (no batch: nothing billed) and asks its questions again;
- killed after: the batch id is in the cache, and a later run collects it.
Every reply is matched by its line's custom_id (a hash of the keys it asks: the same questions always
have the same id). A line that failed, expired, was cancelled or is missing from the output is asked
again (in a new batch, or directly with --batch-fallback sync), never dropped, and counted.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import orjson

from farmkit.annotate.backends import backend_class
from farmkit.annotate.base import Verdict
from farmkit.annotate.cache import PENDING_IN_BATCH, VerdictCache
from farmkit.annotate.cost import prompt_bound
from farmkit.annotate.engine import Annotator, Ask, Plan, _stored, unreadable_row
from farmkit.annotate.openai_backend import base_url, endpoint, read_reply, request_body
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import Judge
from farmkit.core.endpoint import (
    LONG_WAIT,
    Malformed,
    _parse,
    address,
    authorization,
    redact,
    retry_wait,
)
from farmkit.core.fields import help_field
from farmkit.core.io import PENDING_EXIT, FarmError
from farmkit.core.values import NON_NEGATIVE

log = logging.getLogger("farmkit")

ENDPOINT = "/v1/chat/completions"  # what every line asks, as the Batch API names it
COMPLETION_WINDOW = "24h"  # the only window OpenAI offers
MOST_LINES = 50_000  # requests one batch may hold (OpenAI's limit)
DONE = ("completed", "expired", "failed", "cancelled")  # a batch in these states changes no more
FIRST_POLL = (
    1.0  # seconds before the first look at a batch --batch wait is waiting for, doubled each time
)
MOST_POLL = 60.0
PAGES = 50  # pages of the batch list searched for an orphaned intent's batch (100 batches a page)


@dataclass
class BatchConfig:
    """How a run asks its paid judges (farm-annotate's and farm-eval's options), and where it books
    what it spent."""

    batch: str | None = help_field(
        None,
        "Ask endpoint judges through the Batch API, at the batch price (a reply within 24 h): `submit` "
        "uploads what is neither cached nor pending and exits 0 (a later run of the same command "
        "collects and writes the records; exit 75 while questions are still pending); `wait` (a "
        "bare --batch) submits, then polls until every reply is in or --batch-wait runs out.",
        ("submit", "wait"),
        flag_value="wait",
        show_default=False,
    )
    batch_wait: float = help_field(
        86400.0,
        "With --batch wait: the most seconds to wait for the batches (then exit 75, as submit does).",
        bounds=NON_NEGATIVE,
    )
    batch_fallback: str = help_field(
        "resubmit",
        "With --batch: what becomes of questions a batch did not answer (failed, expired, cancelled, "
        "missing): asked again in a new batch, or asked directly at the direct price (sync).",
        ("resubmit", "sync"),
    )
    ledger: str | None = help_field(
        None,
        "Append one JSON line per run to this file: date (UTC), pool, judges, pairs, requests, cache "
        "hits, mode (batch or direct), tokens and price (farm-winrate --ledger totals it).",
        path={"dir_okay": False},
        show_default=False,
    )


@dataclass
class BatchStats:
    """What a run did through the Batch API, for its summary and the ledger."""

    submitted: int = 0  # lines (requests) uploaded
    batches: int = 0  # batches created
    collected: int = 0  # lines read back with a reply
    answered: int = 0  # questions answered (verdicts cached)
    unparsed: int = 0  # questions whose reply could not be read
    failed: int = 0  # lines the batch did not answer (error, expired, cancelled, missing)
    resubmitted: int = 0  # questions of those lines asked again in a new batch
    direct: int = 0  # questions of those lines asked directly (--batch-fallback sync)
    abandoned: int = 0  # lines of intents whose run died before creating their batch
    pending: int = 0  # questions of this run still pending when it ended
    calls: int = 0  # HTTP requests to the files and batches endpoints
    # model -> [questions, prompt tokens, completion tokens, price] collected
    spend: dict[str, list[float]] = field(default_factory=dict)


def line_id(keys: list[str]) -> str:
    """A line's custom_id: the same questions, in the same request, always have the same id."""
    return "farmkit-" + hashlib.sha256("\n".join(keys).encode()).hexdigest()[:48]


class BatchClient:
    """The files and batches endpoints of an OpenAI-compatible API, over httpx (a handful of calls
    per run: no need for the lean client of farmkit.core.endpoint). Transient failures (429, 5xx,
    timeouts, dropped connections) are retried with backoff; anything else is a FarmError whose
    message never holds the key."""

    def __init__(
        self,
        base: str,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        backoff: float,
        stats: BatchStats,
    ):
        import httpx

        self.api_key, self.max_retries, self.backoff = api_key, max_retries, backoff
        self.address, self.stats, self._url = address(base), stats, base
        # where requests go: `address.target` keeps the base URL's query after each path
        self.origin = f"{self.address.scheme}://{self.address.netloc}"
        self.base = self.address.shown  # as messages show it: no credentials, no query values
        headers = authorization(self.address, api_key)
        self.http = httpx.Client(headers=headers, timeout=timeout)

    def upload(self, content: bytes) -> str:
        reply = self._call(
            "POST",
            "/files",
            "uploading the batch file",
            files={"file": ("farmkit-batch.jsonl", content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        return str(reply.json()["id"])

    def create(self, file_id: str, intent: str, since: float) -> dict[str, Any]:
        """Create the batch of `file_id`. A create whose reply was lost (a 5xx, a dropped
        connection) may have created it all the same: before sending it again, and before giving
        up, the endpoint's batches are searched for the intent's."""
        body = {
            "input_file_id": file_id,
            "endpoint": ENDPOINT,
            "completion_window": COMPLETION_WINDOW,
            "metadata": {"farmkit_intent": intent},
        }
        try:
            reply = self._call(
                "POST",
                "/batches",
                "creating the batch",
                json=body,
                done=lambda: self.find(intent, since),
            )
            return reply if isinstance(reply, dict) else reply.json()
        except FarmError:
            found = self.find(intent, since)
            if found is None:
                raise
            return found

    def get(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/batches/{batch_id}", f"reading batch {batch_id}").json()

    def content(self, file_id: str) -> bytes:
        return self._call("GET", f"/files/{file_id}/content", f"reading file {file_id}").content

    def find(self, intent: str, since: float) -> dict[str, Any] | None:
        """The batch created for `intent` (newest first, back to shortly before `since`), or None."""
        after = None
        for _ in range(PAGES):
            params: dict[str, Any] = {"limit": 100, **({"after": after} if after else {})}
            page = self._call("GET", "/batches", "listing the batches", params=params).json()
            batches = page.get("data") or []
            for batch in batches:
                if (batch.get("metadata") or {}).get("farmkit_intent") == intent:
                    return batch
            older = [b.get("created_at") or 0 for b in batches]
            if not page.get("has_more") or not batches or min(older) < since - 300:
                return None
            after = batches[-1].get("id")
        return None

    def _call(
        self,
        method: str,
        path: str,
        what: str,
        done: Callable[[], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """The reply (an httpx.Response) to a request, retried while the failure is transient;
        `done()`, asked before each retry, may say what the request was for is done already (its
        reply was lost): that is returned instead."""
        import httpx

        if "params" in kwargs:  # httpx puts params in place of a URL's query: the base URL's first
            kwargs["params"] = [
                *parse_qsl(self.address.query, keep_blank_values=True),
                *kwargs["params"].items(),
            ]
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt and done is not None and (found := done()) is not None:
                return found
            self.stats.calls += 1
            told: Any = {}  # the headers of a reply that may say how long to wait
            try:
                reply = self.http.request(method, self.origin + self.address.target(path), **kwargs)
            except httpx.TransportError as exc:
                last = self._redact(f"{type(exc).__name__}: {exc}")[:200]
            else:
                if reply.status_code < 300:
                    return reply
                message = self._message(reply)
                if reply.status_code in (401, 403):
                    raise FarmError(
                        f"{what}: {self.base} refused the request (HTTP {reply.status_code}: "
                        f"{message}); check OPENAI_API_KEY and OPENAI_BASE_URL"
                    )
                if reply.status_code not in (408, 409, 429) and reply.status_code < 500:
                    raise FarmError(f"{what}: HTTP {reply.status_code} from {self.base}: {message}")
                last, told = f"HTTP {reply.status_code}: {message}", reply.headers
            if attempt < self.max_retries:
                seconds, why = retry_wait(told, self.backoff * 2**attempt)
                if seconds > LONG_WAIT:
                    log.warning(
                        "farm-annotate: %s: waiting %.0f s before retrying %s (%s), as %s",
                        self.base,
                        seconds,
                        what,
                        last[:100],
                        why,
                    )
                time.sleep(seconds)
        raise FarmError(f"{what}: {last} (after {self.max_retries + 1} attempts to {self.base})")

    def _message(self, reply: Any) -> str:
        try:
            detail = reply.json()
            detail = detail.get("error", detail) if isinstance(detail, dict) else detail
            text = str(detail.get("message") if isinstance(detail, dict) else detail)
        except ValueError:
            text = reply.text
        return self._redact(" ".join(text.split()))[:200]

    def _redact(self, text: str) -> str:
        """`text` without any secret the client holds (the key, the URL's credentials and query
        secrets), in any form."""
        return redact(text, self.api_key, url=self._url)

    def close(self) -> None:
        self.http.close()


class BatchMode:
    """One run's work through the Batch API: collect what finished, submit what is new, and (wait)
    poll until every question of the run has its verdict."""

    def __init__(self, annotator: Annotator, cache: VerdictCache, config: BatchConfig):
        self.annotator, self.cache, self.config = annotator, cache, config
        self.stats = BatchStats()
        settings = annotator.pool.settings
        # where its batches go, as the cache notes it: the URL less its secrets
        self.endpoint = redact(base_url(), shapes=False)
        self.client = BatchClient(
            base_url(),
            endpoint()[1],
            float(settings["timeout"]),
            int(settings["max_retries"]),
            float(settings["backoff"]),
            self.stats,
        )
        # key -> its verdict-less answer in this run (a reply that could not be read, or none after
        # max_retries + 1 batches): not sent again by this run
        self.unparsed: dict[str, Verdict] = {}
        self.failed: set[str] = set()  # keys of lines a batch did not answer, in this run
        self.tries: Counter = Counter()  # key -> batches that left it unanswered, in this run
        self.most_tries = int(settings["max_retries"])
        self.committed: dict[str, float] = {}  # intent -> worst price, of this run's batches

    # -- the run ----------------------------------------------------------------------------

    def prepare(self, items: list[Item]) -> Plan | None:
        """The plan whose questions are all answered (from the cache, or to be asked directly: free
        in-process judges and, with --batch-fallback sync, what a batch did not answer), or None
        while questions are pending (stats.pending)."""
        wait = self.config.batch == "wait"
        deadline = time.monotonic() + self.config.batch_wait
        poll = FIRST_POLL
        self.collect()
        while True:
            plan = self.annotator.plan(items)
            self._settle_unparsed(plan)
            batched = [
                ask
                for request in plan.requests
                for ask in request
                if backend_class(self.annotator.pool.judges[ask.judge].backend).batched
                and ask.verdict is None
                and not (self.config.batch_fallback == "sync" and ask.key in self.failed)
            ]
            pending = self.cache.pending_keys(ask.key for ask in batched)
            fresh = [ask for ask in batched if ask.key not in pending]
            if fresh:
                self.submit(fresh, items)
                pending = self.cache.pending_keys(ask.key for ask in batched)
            waiting = [ask for ask in batched if ask.key in pending]
            if not waiting:
                break
            left = deadline - time.monotonic()
            if not wait or left <= 0:
                self.stats.pending = len(waiting)
                return None
            time.sleep(min(poll, left))
            poll = min(2 * poll, MOST_POLL)
            self.collect()
        self.stats.direct = sum(
            1 for request in plan.requests for ask in request if ask.key in self.failed
        )
        plan.requests = self.annotator._group(
            [ask for request in plan.requests for ask in request if ask.verdict is None]
        )
        return plan

    def _settle_unparsed(self, plan: Plan) -> None:
        """Questions whose batch reply could not be read in this run get it as their verdict (no
        choice, with the reason and the raw reply), and are not sent again by this run."""
        for request in plan.requests:
            for ask in request:
                verdict = self.unparsed.get(ask.key or "")
                if verdict is not None:
                    for each in [ask, *plan.followers.get(ask.key, [])]:
                        each.verdict = verdict

    # -- submitting -------------------------------------------------------------------------

    def submit(self, asks: list[Ask], items: list[Item]) -> None:
        """Send `asks` as batches (one model each, at most MOST_LINES lines), each only after its
        intent is recorded in the cache and its worst price fits under --max-cost."""
        annotator = self.annotator
        by_model: dict[str, list[tuple[str, list[str], dict[str, Any], bytes, float]]] = {}
        for request in annotator._group(asks):
            judge = annotator.pool.judges[request[0].judge]
            model = annotator.pool.model_for(judge) or ""
            messages = annotator._messages(request, items)
            keys = [ask.key for ask in request]
            custom_id = line_id(keys)
            body = request_body(judge, model, messages, annotator._request_seed(request, 0))
            line = orjson.dumps(
                {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body}
            )
            spec = {
                "judge": judge.name,
                "prompt": judge.prompt,
                "top_logprobs": judge.top_logprobs,
                "model": model,
                "pairs": len(request),
            }
            worst = annotator.prices.price(
                model, prompt_bound(messages), judge.max_tokens, batch=True
            )
            by_model.setdefault(model, []).append((custom_id, keys, spec, line, worst))
            self.stats.resubmitted += sum(key in self.failed for key in keys)
        for lines in by_model.values():
            for start in range(0, len(lines), MOST_LINES):
                self._send(lines[start : start + MOST_LINES])

    def _send(self, lines: list[tuple[str, list[str], dict[str, Any], bytes, float]]) -> None:
        worst = {custom_id: price for custom_id, _, _, _, price in lines}
        self._hold(sum(worst.values()), len(lines))
        intent = uuid.uuid4().hex
        taken = self.cache.record_batch(
            intent,
            self.endpoint,
            [(custom_id, keys, spec) for custom_id, keys, spec, _, _ in lines],
            lambda ids: sum(worst[i] for i in ids),
        )
        if not taken:
            return
        chosen = set(taken)
        content = b"".join(
            line + b"\n" for custom_id, _, _, line, _ in lines if custom_id in chosen
        )
        created = time.time()
        try:
            file_id = self.client.upload(content)
            self.cache.set_batch(intent, "file_id", file_id)
            batch = self.client.create(file_id, intent, created)
        except FarmError as exc:
            # no batch was created (create looks for one before it gives up): nothing was billed,
            # and the questions are free for the next run
            self.cache.settle_lines(intent, taken, {})
            raise FarmError(f"{exc}; nothing was submitted, rerun the same command") from None
        self.cache.set_batch(intent, "batch_id", str(batch["id"]))
        self.committed[intent] = sum(worst[i] for i in taken)
        self.stats.submitted += len(taken)
        self.stats.batches += 1

    def _hold(self, worst: float, lines: int) -> None:
        """--max-cost: a batch is sent only if the most it can be billed fits in what is left after
        what this run spent and the worst case of the batches it submitted and has not collected."""
        cap = self.annotator.max_cost
        if cap is None:
            return
        spent = self.annotator.stats.price + sum(self.committed.values())
        if spent + worst > cap:
            raise FarmError(
                f"a batch of {lines} request(s) could cost up to ${worst:.4f} at the batch price, and "
                f"${spent:.4f} is spent or held: over --max-cost ${cap:.4f}; it was not sent "
                "(see --estimate)"
            )

    # -- collecting -------------------------------------------------------------------------

    def collect(self) -> None:
        """Read every finished batch sent to this endpoint (by this run or an earlier one) into the
        cache, adopting or dropping the intents of runs that died before their batch id was noted."""
        for row in self.cache.batches():
            if row["endpoint"] not in (self.endpoint, base_url()):  # as noted before issue 44
                continue
            if row["batch_id"] is None:
                if not row["orphaned"]:
                    continue  # a live run is creating it
                batch = self.client.find(row["intent"], row["created"])
                if batch is None:
                    lines = self.cache.batch_lines(row["intent"])
                    self.cache.settle_lines(row["intent"], list(lines), {})
                    self.stats.abandoned += len(lines)
                    continue
                self.cache.set_batch(row["intent"], "batch_id", str(batch["id"]))
            else:
                batch = self.client.get(row["batch_id"])
            if batch.get("status") in DONE:
                self._read(row["intent"], batch)

    def _read(self, intent: str, batch: dict[str, Any]) -> None:
        lines = self.cache.batch_lines(intent)
        replies: dict[str, dict[str, Any]] = {}
        for name in ("error_file_id", "output_file_id"):  # a reply in the output wins
            if batch.get(name):
                for raw in self.client.content(batch[name]).splitlines():
                    entry = _json(raw)
                    if isinstance(entry, dict) and isinstance(entry.get("custom_id"), str):
                        replies[entry["custom_id"]] = entry
        verdicts: dict[str, dict[str, Any]] = {}
        for custom_id, (keys, spec) in lines.items():
            read = self._reply(replies.get(custom_id), spec, batch)
            if isinstance(read, str):
                log.info("farm-annotate: batch %s, %s: %s", batch.get("id"), custom_id, read)
                self.stats.failed += 1
                self.tries.update(keys)
                if max(self.tries[key] for key in keys) > self.most_tries:
                    # a batch after batch leaves it unanswered (a model the endpoint refuses in
                    # batches, say): no verdict, with the reason, rather than a new batch every poll
                    reason = f"no reply in {self.most_tries + 1} batches: {read}"
                    self.unparsed.update({key: Verdict(None, reason=reason) for key in keys})
                else:
                    self.failed.update(keys)
                continue
            self.stats.collected += 1
            for position, (key, verdict) in enumerate(zip(keys, read, strict=True)):
                if verdict.choice is None:
                    self.unparsed[key] = verdict
                    self.stats.unparsed += 1
                    if verdict.raw is not None:  # cached: a rerun re-reads it, never pays again
                        verdicts[key] = unreadable_row(verdict, position, len(keys))
                else:
                    verdicts[key] = _stored(verdict)
                    self.stats.answered += 1
        self.cache.settle_lines(intent, list(lines), verdicts)
        self.committed.pop(intent, None)

    def _reply(
        self, entry: dict[str, Any] | None, spec: dict[str, Any], batch: dict[str, Any]
    ) -> list[Verdict] | str:
        """The verdicts of one line's reply, or why it has none (to be asked again)."""
        if entry is None:
            errors = (batch.get("errors") or {}).get("data") or [{}]
            said = f": {errors[0].get('message')}" if errors[0].get("message") else ""
            return redact(f"no reply (batch {batch.get('status')}{said})", self.client.api_key)
        response = entry.get("response") if isinstance(entry.get("response"), dict) else {}
        if entry.get("error") or response.get("status_code") != 200:
            error = entry.get("error") or (response.get("body") or {}).get("error") or {}
            message = error.get("message") if isinstance(error, dict) else error
            return redact(f"HTTP {response.get('status_code')}: {message}", self.client.api_key)
        try:
            text, _, prompt, completion, logprobs = _parse(
                orjson.dumps(response.get("body")), chat=True
            )
        except Malformed as exc:
            return redact(f"malformed reply: {exc}", self.client.api_key)
        judge = Judge(
            spec["judge"],
            "openai",
            prompt=spec["prompt"],
            top_logprobs=spec["top_logprobs"],
        )
        model, pairs = spec["model"], spec["pairs"]
        read = read_reply(judge, text, logprobs, pairs, self.endpoint, self.client.api_key)
        prompt, completion = prompt or 0, completion or 0
        price = self.annotator.prices.price(model, prompt, completion, batch=True)
        self.annotator.stats.prompt_tokens += prompt
        self.annotator.stats.completion_tokens += completion
        self.annotator._pay(price)
        spent = self.stats.spend.setdefault(model, [0, 0.0, 0.0, 0.0])
        for position, amount in enumerate((pairs, prompt, completion, price)):
            spent[position] += amount
        return [
            Verdict(
                verdict.choice,
                reason=verdict.reason,
                raw=verdict.raw,
                probability=verdict.probability,
                soft=verdict.soft,
                prompt_tokens=prompt / pairs,
                completion_tokens=completion / pairs,
                price=price / pairs,
                model=model,
            )
            for verdict in read
        ]

    def exit_status(self) -> int:
        """0 where questions are pending because this run submitted them (`--batch submit`: come
        back later), PENDING_EXIT where they were pending already or the wait ran out."""
        submitted = self.config.batch == "submit" and self.stats.submitted
        return 0 if not self.stats.pending or submitted else PENDING_EXIT

    def summary(self) -> str:
        stats = self.stats
        parts = [
            f"{stats.submitted} request(s) submitted in {stats.batches} batch(es)",
            f"{stats.collected} collected ({stats.answered} verdicts, {stats.unparsed} unreadable)",
            f"{stats.failed} unanswered by their batch ({stats.resubmitted} question(s) resubmitted, "
            f"{stats.direct} asked directly)",
        ]
        if stats.abandoned:
            parts.append(f"{stats.abandoned} line(s) of a run killed before its batch was created")
        parts.append(f"{stats.pending} question(s) pending")
        return "farm-annotate: batch: " + ", ".join(parts)

    def close(self) -> None:
        self.client.close()


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def hold_pending(cache: VerdictCache, plan: Plan) -> int:
    """In a direct run: the questions a pending batch asks are not asked again (that would pay twice)
    but given no verdict, with the reason; returns how many."""
    asks = [ask for request in plan.requests for ask in request if ask.key is not None]
    pending = cache.pending_keys(ask.key for ask in asks)
    if not pending:
        return 0
    verdict = Verdict(None, reason=PENDING_IN_BATCH)
    for ask in asks:
        if ask.key in pending:
            for each in [ask, *plan.followers.get(ask.key, [])]:
                each.verdict = verdict
    plan.requests = [
        left for request in plan.requests if (left := [a for a in request if a.verdict is None])
    ]
    return len(pending)
