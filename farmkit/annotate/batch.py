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

Money follows the direct path's rules (farmkit.core.endpoint): every reply of the endpoint is read
under the same cap; every line it billed is booked once, by the run whose transaction settles the
batch, at its usage or at its worst case where the usage is not told (duplicates, replies to lines
never sent and lines that are not JSON included), into the ledger as it is collected. A batch that
can no longer be collected is marked failed, booked at its worst case and its questions requeued.
A line pending since the first --batch, which kept no worst tokens per line, is booked at its share
of its batch's worst price (recorded with every batch), never at $0 (`_dated`).
A line is also known by what it asks (`request_id`), so a run that reaches the same endpoint by
another host name joins a pending line rather than paying for it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl

import orjson

from farmkit.annotate import ledger
from farmkit.annotate.backends import backend_class
from farmkit.annotate.base import FatalBackendError, Verdict
from farmkit.annotate.cache import PENDING_IN_BATCH, VerdictCache
from farmkit.annotate.cost import PriceTable, prompt_bound
from farmkit.annotate.engine import Annotator, Ask, Plan, _stored, unreadable_row
from farmkit.annotate.openai_backend import base_url, endpoint, read_reply, request_body
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import Judge
from farmkit.core.endpoint import (
    DEFAULT_MAX_REPLY,
    LONG_WAIT,
    Malformed,
    _parse,
    _Response,
    _TooLarge,
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

    batch: bool = help_field(
        False,
        "Ask endpoint judges through the Batch API, at the batch price (a reply within 24 h); "
        "--batch-mode says whether the run waits for the replies.",
        flag=True,
        show_default=False,
    )
    batch_mode: str | None = help_field(
        None,
        "With --batch: `submit` uploads what is neither cached nor pending and exits 0 (a later run "
        "of the same command collects and writes the records; exit 75 while questions are still "
        "pending); `wait` submits, then polls until every reply is in or --batch-wait runs out. "
        "Default: wait. Implies --batch; `--batch submit` and `--batch wait` are read as --batch "
        "--batch-mode MODE.",
        ("submit", "wait"),
        show_default=False,
    )
    batch_wait: float = help_field(
        86400.0,
        "With --batch-mode wait: the most seconds to wait for the batches (then exit 75, as submit "
        "does).",
        bounds=NON_NEGATIVE,
    )
    batch_fallback: str = help_field(
        "resubmit",
        "With --batch: what becomes of questions a batch did not answer (failed, expired, cancelled, "
        "missing, or the whole batch lost: an output file or a batch the endpoint no longer "
        "gives): asked again in a new batch, or asked directly at the direct price (sync).",
        ("resubmit", "sync"),
    )
    ledger: str | None = help_field(
        None,
        "Append one JSON line per run to this file: date (UTC), pool, judges, pairs, requests, cache "
        "hits, mode (batch or direct), tokens and price (farm-winrate --ledger totals it).",
        path={"dir_okay": False},
        show_default=False,
    )

    def __post_init__(self) -> None:
        if isinstance(self.batch, str):  # BatchConfig("submit"), as before --batch-mode
            self.batch, self.batch_mode = True, self.batch
        self.batch = bool(self.batch or self.batch_mode)
        self.batch_mode = self.batch_mode or "wait"


BATCH_MODES = ("submit", "wait")


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
    lost: int = 0  # batches that could no longer be collected (marked failed, questions requeued)
    pending: int = 0  # questions of this run still pending when it ended
    calls: int = 0  # HTTP requests to the files and batches endpoints
    # model -> [questions, prompt tokens, completion tokens, price] collected
    spend: dict[str, list[float]] = field(default_factory=dict)


def request_id(body: dict[str, Any], judge: str) -> str:
    """What a line asks, whoever asks it: its request's content and model, without the seed (which
    farmkit derives from the verdict cache keys, and so from the endpoint's host name), and the judge
    that asks it (two judges of a pool alike but for their names are two draws, not one)."""
    asked = {name: value for name, value in body.items() if name != "seed"}
    asked["farmkit_judge"] = judge
    return hashlib.sha256(orjson.dumps(asked, option=orjson.OPT_SORT_KEYS)).hexdigest()


def line_id(keys: list[str]) -> str:
    """A line's custom_id: the same questions, in the same request, always have the same id."""
    return "farmkit-" + hashlib.sha256("\n".join(keys).encode()).hexdigest()[:48]


class BatchCallFailed(FarmError):
    """A request to the files or batches endpoints that failed; `lasting`: asking again cannot help
    (a 4xx other than 401/403, a reply over the cap or not of the shape asked for); `answered`: the
    endpoint may have done what was asked (a reply over the cap, or a success not of that shape)."""

    def __init__(self, message: str, lasting: bool = False, answered: bool = False):
        super().__init__(message)
        self.lasting, self.answered = lasting, answered


class BatchClient:
    """The files and batches endpoints of an OpenAI-compatible API, over httpx (a handful of calls
    per run: no need for the lean client of farmkit.core.endpoint), under the direct client's
    rules: every reply is read up to `max_reply` bytes as decoded (a gzip bomb is cut off where its
    inflated size passes the cap), transient failures (429, 5xx, timeouts, dropped connections) are
    retried with backoff, and anything else is a BatchCallFailed whose message never holds the key."""

    def __init__(
        self,
        base: str,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        backoff: float,
        stats: BatchStats,
        max_reply: int = DEFAULT_MAX_REPLY,
    ):
        import httpx

        self.api_key, self.max_retries, self.backoff = api_key, max_retries, backoff
        self.address, self.stats, self._url = address(base), stats, base
        self.max_reply = max_reply
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
        return _identifier(_object(reply, "uploading the batch file").get("id"), "the file's id")

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
            return reply if isinstance(reply, dict) else _object(reply, "creating the batch")
        except FarmError as exc:
            found = None
            with contextlib.suppress(BatchCallFailed):  # no listing: the create's own error says
                found = self.find(intent, since)
            if found is None:
                raise exc from None
            return found

    def get(self, batch_id: str) -> dict[str, Any]:
        what = f"reading batch {batch_id}"
        return _object(self._call("GET", f"/batches/{batch_id}", what), what)

    def content(self, file_id: str, most: int) -> bytes:
        """A file's content, of at most `most` bytes."""
        what = f"reading file {file_id}"
        return self._call("GET", f"/files/{file_id}/content", what, most=most).content

    def find(self, intent: str, since: float) -> dict[str, Any] | None:
        """The batch created for `intent` (newest first, back to shortly before `since`), or None."""
        after = None
        for _ in range(PAGES):
            params: dict[str, Any] = {"limit": 100, **({"after": after} if after else {})}
            what = "listing the batches"
            page = _object(self._call("GET", "/batches", what, params=params), what)
            batches = [b for b in page.get("data") or [] if isinstance(b, dict)]
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
        most: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """The reply (status_code, headers, content) to a request, retried while the failure is
        transient; `done()`, asked before each retry, may say what the request was for is done
        already (its reply was lost): that is returned instead. `most`: the cap on the reply's
        decoded bytes (default max_reply)."""
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
                reply = self._send(
                    method,
                    self.origin + self.address.target(path),
                    most or self.max_reply,
                    **kwargs,
                )
            except httpx.TransportError as exc:
                last = self._redact(f"{type(exc).__name__}: {exc}")[:200]
            except _TooLarge as exc:  # asking again would bring the same flood
                raise BatchCallFailed(
                    f"{what}: {exc} from {self.base}; not read (the cap is max_reply_bytes)",
                    lasting=True,
                    answered=True,
                ) from None
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
                    raise BatchCallFailed(
                        f"{what}: HTTP {reply.status_code} from {self.base}: {message}",
                        lasting=True,
                    )
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
        raise BatchCallFailed(
            f"{what}: {last} (after {self.max_retries + 1} attempts to {self.base})"
        )

    def _send(self, method: str, path: str, most: int, **kwargs: Any) -> _Response:
        """One request, its body read as it streams in (decoded) up to `most` bytes."""
        reply = self.http.send(self.http.build_request(method, path, **kwargs), stream=True)
        try:
            told = reply.headers.get("content-length")
            if told and told.isdigit() and int(told) > most:
                raise _TooLarge(int(told), most)
            content = bytearray()
            for piece in reply.iter_bytes():
                content += piece
                if len(content) > most:
                    raise _TooLarge(None, most)
        finally:
            reply.close()
        return _Response(reply.status_code, dict(reply.headers), bytes(content))

    def _message(self, reply: _Response) -> str:
        detail = _json(reply.content)
        if detail is None:
            text = reply.content.decode("utf-8", "replace")
        else:
            detail = detail.get("error", detail) if isinstance(detail, dict) else detail
            text = str(detail.get("message") if isinstance(detail, dict) else detail)
        return self._redact(" ".join(text.split()))[:200]

    def _redact(self, text: str) -> str:
        """`text` without any secret the client holds (the key, the URL's credentials and query
        secrets), in any form."""
        return redact(text, self.api_key, url=self._url)

    def close(self) -> None:
        self.http.close()


def _object(reply: _Response, what: str) -> dict[str, Any]:
    """A reply's JSON object, or a lasting failure saying what came instead."""
    value = _json(reply.content)
    if not isinstance(value, dict):
        shown = " ".join(reply.content[:120].decode("utf-8", "replace").split())
        raise BatchCallFailed(
            f"{what}: the reply is not a JSON object: {redact(shown)}", lasting=True, answered=True
        )
    return value


def _identifier(value: Any, what: str) -> str:
    """An id the endpoint gave (a file's, a batch's): a non-empty string, or a lasting failure."""
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise BatchCallFailed(f"{what} is {value!r}, not an id", lasting=True)
    return value


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
            int(settings["max_reply_bytes"]),
        )
        # key -> its verdict-less answer in this run (a reply that could not be read, or none after
        # max_retries + 1 batches): not sent again by this run
        self.unparsed: dict[str, Verdict] = {}
        self.failed: set[str] = set()  # keys of lines a batch did not answer, in this run
        self.tries: Counter = Counter()  # key -> batches that left it unanswered, in this run
        self.most_tries = int(settings["max_retries"])
        self.committed: dict[str, float] = {}  # intent -> worst price, of this run's batches
        # intent -> whether this endpoint knows a batch recorded under another endpoint's name
        self.elsewhere: dict[str, bool] = {}

    # -- the run ----------------------------------------------------------------------------

    def prepare(self, items: list[Item]) -> Plan | None:
        """The plan whose questions are all answered (from the cache, or to be asked directly: free
        in-process judges and, with --batch-fallback sync, what a batch did not answer), or None
        while questions are pending (stats.pending)."""
        wait = self.config.batch_mode == "wait"
        deadline = time.monotonic() + self.config.batch_wait
        poll = FIRST_POLL
        joined = False
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
            if not joined:
                # before anything is collected: questions a pending batch asks under another
                # host name join it, so that its reply answers them when it is collected
                joined = True
                if fresh:
                    self.submit(fresh, items, send=False)
                self.collect()
                continue
            if fresh:
                if self.submit(fresh, items):
                    continue  # a batch was lost as it was created: its questions go back
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
            1
            for request in plan.requests
            for ask in request
            if ask.key in self.failed and ask.verdict is None
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

    def submit(self, asks: list[Ask], items: list[Item], send: bool = True) -> bool:
        """Send `asks` as batches (one model each, at most MOST_LINES lines), each only after its
        intent is recorded in the cache and its worst price fits under --max-cost; whether a batch
        was lost as it was created (its questions back in the queue). A line a pending batch asks
        already joins it (`_join`); `send` False: only that."""
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
                # the most the line can be billed (prompt and completion tokens): what a reply
                # whose bill is not told is booked at
                "worst": [prompt_bound(messages), judge.max_tokens],
                "request": request_id(body, judge.name),
            }
            worst = annotator.prices.price(model, *spec["worst"], batch=True)
            by_model.setdefault(model, []).append((custom_id, keys, spec, line, worst))
            self.stats.resubmitted += send * sum(key in self.failed for key in keys)
        lost = False
        for lines in by_model.values():
            lines = self._join(lines)
            for start in range(0, len(lines) if send else 0, MOST_LINES):
                lost = self._send(lines[start : start + MOST_LINES]) or lost
        return lost

    def _join(
        self, lines: list[tuple[str, list[str], dict[str, Any], bytes, float]]
    ) -> list[tuple[str, list[str], dict[str, Any], bytes, float]]:
        """The lines still to send: a line whose request (its content and model, whatever host name
        its endpoint was given by) a pending batch asks already, in a batch this endpoint can
        collect, joins that line (its keys are answered with its reply) instead of being paid for
        again."""
        asked = self.cache.pending_requests(spec["request"] for _, _, spec, _, _ in lines)
        left = []
        for line in lines:
            custom_id, keys, spec = line[:3]
            found = asked.get(spec["request"])
            if found is not None and self._reachable(found) and found["custom_id"] != custom_id:
                if self.cache.join_line(found["custom_id"], keys):
                    continue
            left.append(line)
        return left

    def _reachable(self, row: dict[str, Any]) -> bool:
        """Whether a pending batch can be collected through this endpoint: one sent to it, or one
        sent under another host name that this endpoint knows by its id and its intent."""
        if row["endpoint"] in (self.endpoint, base_url()):  # base_url(): as noted before issue 44
            return True
        if row["intent"] not in self.elsewhere:
            known = False
            if row["batch_id"] is not None:
                try:
                    batch = self.client.get(row["batch_id"])
                    known = (batch.get("metadata") or {}).get("farmkit_intent") == row["intent"]
                except BatchCallFailed:
                    known = False
            self.elsewhere[row["intent"]] = known
        return self.elsewhere[row["intent"]]

    def _send(self, lines: list[tuple[str, list[str], dict[str, Any], bytes, float]]) -> bool:
        """Upload and create one batch; whether it was lost as it was created (a reply without a
        batch id that no listing finds: given up, its questions back in the queue)."""
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
            return False
        chosen = set(taken)
        content = b"".join(
            line + b"\n" for custom_id, _, _, line, _ in lines if custom_id in chosen
        )
        created = time.time()
        file_id = None
        try:
            file_id = self.client.upload(content)
            self.cache.set_batch(intent, "file_id", file_id)
            batch = self.client.create(file_id, intent, created)
        except FarmError as exc:
            # a create answered with a reply that could not be read may have made the batch
            if file_id is None or not getattr(exc, "answered", False):
                # no batch was created (create looks for one before it gives up): nothing was
                # billed, and the questions are free for the next run
                self.cache.settle_lines(intent, taken, {})
                raise FarmError(f"{exc}; nothing was submitted, rerun the same command") from None
            batch = {"id": None, "unread": str(exc)}  # answered, unreadable: it may exist
        self.committed[intent] = sum(worst[i] for i in taken)
        self.stats.submitted += len(taken)
        self.stats.batches += 1
        try:
            batch_id = _identifier(batch.get("id"), "the id of the batch created")
        except BatchCallFailed as exc:
            found = self._search(intent, created)
            if found is None or not isinstance(found.get("id"), str):
                row = {"intent": intent, "batch_id": None, "file_id": file_id}
                self._give_up(row, batch.get("unread") or str(exc))
                return True
            batch_id = found["id"]
        self.cache.set_batch(intent, "batch_id", batch_id)
        return False

    def _search(self, intent: str, since: float) -> dict[str, Any] | None:
        """The batch of `intent` from the endpoint's listing; None where it lists none such, or has
        no listing."""
        try:
            return self.client.find(intent, since)
        except BatchCallFailed as exc:
            if not exc.lasting:
                raise
            return None

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
        cache, adopting or dropping the intents of runs that died before their batch id was noted.
        A batch that can no longer be collected (the endpoint does not know it, lists no batches to
        find it by, or answers its look or its output file with an error no retry fixes, a reply
        over the cap or of the wrong shape) is given up: see `_give_up`."""
        for row in self.cache.batches():
            if not self._reachable(row):
                continue  # sent to another endpoint: left for a run that asks it
            try:
                batch = self._look(row)
                if batch is not None and batch.get("status") in DONE:
                    self._read(row, batch)
            except BatchCallFailed as exc:
                if not exc.lasting:
                    raise
                self._give_up(row, str(exc))

    def _look(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The batch of a pending intent as the endpoint tells it now; None while a live run is
        creating it, or where its run died before creating it (its lines dropped: nothing billed)."""
        if row["batch_id"] is not None:
            return self.client.get(row["batch_id"])
        if not row["orphaned"]:
            return None  # a live run is creating it
        batch = self.client.find(row["intent"], row["created"])
        if batch is None:
            lines = self.cache.batch_lines(row["intent"])
            self.cache.settle_lines(row["intent"], list(lines), {})
            self.stats.abandoned += len(lines)
            return None
        batch_id = _identifier(batch.get("id"), "the id of the batch found")
        self.cache.set_batch(row["intent"], "batch_id", batch_id)
        return batch

    def _give_up(self, row: dict[str, Any], reason: str) -> None:
        """A batch that can no longer be collected: its lines are settled without verdicts, its
        questions go back to the queue (--batch-fallback), and, where a batch may have been created
        (its file was uploaded), each of its lines is booked at its worst case: the endpoint may
        have billed them and will not say."""
        lines = _dated(self.cache.batch_lines(row["intent"]), row.get("worst"))
        if not self.cache.settle_lines(row["intent"], list(lines), {}):
            return  # another run settled it
        self.committed.pop(row["intent"], None)
        billed = row["batch_id"] is not None or row["file_id"] is not None
        spend = _Spend(self.annotator.prices)
        for keys, spec in lines.values():
            if billed:
                spend.add_worst(spec)
            for asked in [keys, *spec.get("joined", [])]:
                self._unanswered(asked, f"batch lost: {reason}")
        self.stats.failed += len(lines)
        self.stats.lost += 1
        log.warning(
            "farm-annotate: batch %s can no longer be collected (%s): marked failed; its %d "
            "request(s) go back to the queue (--batch-fallback %s)%s",
            row["batch_id"] or row["intent"],
            reason,
            len(lines),
            self.config.batch_fallback,
            f", booked at their worst case, ${spend.price:.4f}" if billed else "",
        )
        self._book(row["batch_id"] or row["intent"], spend)

    def _unanswered(self, keys: list[str], reason: str) -> None:
        """Questions a batch did not answer: asked again (--batch-fallback), up to max_retries + 1
        batches in a run, then no verdict, with the reason."""
        self.tries.update(keys)
        if max(self.tries[key] for key in keys) > self.most_tries:
            # batch after batch leaves it unanswered (a model the endpoint refuses in batches,
            # say): no verdict, with the reason, rather than a new batch every poll
            reason = f"no reply in {self.most_tries + 1} batches: {reason}"
            self.unparsed.update({key: Verdict(None, reason=reason) for key in keys})
        else:
            self.failed.update(keys)

    def _read(self, row: dict[str, Any], batch: dict[str, Any]) -> None:
        """Read a finished batch's output and error files. Every reply the endpoint billed (a line
        answered with HTTP 200) is booked once, at its usage or, where it does not tell it, at its
        worst case: replies to lines the batch never held, duplicates, and lines that are not a
        reply at all (booked at the batch's largest worst case) included. A line answered twice
        with different verdicts keeps neither (it is asked again)."""
        intent = row["intent"]
        lines = _dated(self.cache.batch_lines(intent), row.get("worst"))
        if not lines:
            return
        got: dict[str, list[dict[str, Any]]] = {}
        strays: list[dict[str, Any]] = []  # replies to custom_ids the batch never held
        cut = 0  # output lines that are not a reply
        most = self.client.max_reply * len(lines)  # each reply under the direct path's cap
        for name in ("output_file_id", "error_file_id"):
            if not batch.get(name):
                continue
            file_id = _identifier(batch[name], f"the batch's {name}")
            for raw in self.client.content(file_id, most).splitlines():
                entry = _json(raw) if raw.strip() else None
                if not isinstance(entry, dict) or not isinstance(entry.get("custom_id"), str):
                    cut += bool(raw.strip()) and name == "output_file_id"
                elif entry["custom_id"] in lines:
                    got.setdefault(entry["custom_id"], []).append(entry)
                else:
                    strays.append(entry)
        spend = _Spend(self.annotator.prices)
        # what a reply that cannot be told apart is booked at: the costliest line's worst case
        largest = max((spec for _, spec in lines.values()), key=spend.worst_price)
        verdicts: dict[str, dict[str, Any]] = {}
        answers: list[tuple[list[str], list[Verdict] | str]] = []
        for custom_id, (keys, spec) in lines.items():
            reads: list[list[Verdict] | str] = []
            line_spend = _Spend(self.annotator.prices)
            for entry in got.get(custom_id, []):
                if _billed(entry):
                    line_spend.add_reply(entry, spec)
                reads.append(self._reply(entry, spec))
            spend.merge(line_spend)
            read = self._choose(custom_id, reads, batch)
            if not isinstance(read, str):
                read = [
                    dataclasses.replace(
                        verdict,
                        prompt_tokens=line_spend.prompt / len(keys),
                        completion_tokens=line_spend.completion / len(keys),
                        price=line_spend.price / len(keys),
                        estimated=line_spend.estimated > 0,
                        model=spec["model"],
                    )
                    for verdict in read
                ]
                for asked in [keys, *spec.get("joined", [])]:
                    for position, (key, verdict) in enumerate(zip(asked, read, strict=True)):
                        if verdict.choice is not None:
                            verdicts[key] = _stored(verdict)
                        elif verdict.raw is not None:  # cached: a rerun re-reads it, not pays
                            verdicts[key] = unreadable_row(verdict, position, len(asked))
            answers.append(([keys, *spec.get("joined", [])], read))
        for entry in strays:
            if _billed(entry):
                spend.add_reply(entry, largest)
        spend.add_worst(largest, times=cut)
        if not self.cache.settle_lines(intent, list(lines), verdicts):
            return  # another run collected it at the same time, and booked it
        self.committed.pop(intent, None)
        lasting: set[str] = set()
        for asked, read in answers:  # the line's keys, and those of the runs that joined it
            if isinstance(read, str):
                self.stats.failed += not isinstance(read, _Lasting)
                if not isinstance(read, _Lasting):
                    log.info("farm-annotate: batch %s: %s", batch.get("id"), read)
            else:
                self.stats.collected += 1
            for keys in asked:
                if isinstance(read, _Lasting):  # no batch would answer it: none in this run
                    self.unparsed.update({key: Verdict(None, reason=str(read)) for key in keys})
                    self.stats.unparsed += len(keys)
                    lasting.add(str(read))
                elif isinstance(read, str):
                    self._unanswered(keys, read)
                else:
                    for key, verdict in zip(keys, read, strict=True):
                        if verdict.choice is None:
                            self.unparsed[key] = verdict
                            self.stats.unparsed += 1
                        else:
                            self.stats.answered += 1
        for reason in sorted(lasting):
            log.warning("farm-annotate: batch %s: no verdict: %s", batch.get("id"), reason)
        if strays:
            shown = ", ".join(sorted({str(entry["custom_id"])[:40] for entry in strays})[:3])
            log.warning(
                "farm-annotate: batch %s: %d reply to a line it never held (%s): booked, not used",
                batch.get("id"),
                len(strays),
                redact(shown, self.client.api_key),
            )
        if cut:
            log.warning(
                "farm-annotate: batch %s: %d line(s) of its output are not a reply (not JSON): "
                "booked at their worst case; their questions are asked again",
                batch.get("id"),
                cut,
            )
        self._book(batch.get("id"), spend)

    def _choose(
        self, custom_id: str, reads: list[list[Verdict] | str], batch: dict[str, Any]
    ) -> list[Verdict] | str:
        """The answer of a line from its replies: the one reply, the first where several agree;
        where none came, or several disagree, why it has none (to be asked again)."""
        answered = [read for read in reads if not isinstance(read, str)]
        if not answered:
            if reads:
                return reads[0]
            errors = (batch.get("errors") or {}).get("data") or [{}]
            first = errors[0] if isinstance(errors[0], dict) else {}
            said = f": {first.get('message')}" if first.get("message") else ""
            return redact(f"no reply (batch {batch.get('status')}{said})", self.client.api_key)
        if len(answered) > 1:
            told = {tuple((v.choice, v.soft) for v in read) for read in answered}
            log.warning(
                "farm-annotate: batch %s: line %s has %d replies%s: each is booked",
                batch.get("id"),
                custom_id,
                len(answered),
                " that disagree, so neither is used (asked again)" if len(told) > 1 else "",
            )
            if len(told) > 1:
                return f"{len(answered)} replies that disagree"
        return answered[0]

    def _reply(self, entry: dict[str, Any], spec: dict[str, Any]) -> list[Verdict] | str:
        """The verdicts of one reply (no tokens or price), or why it gives none: a `_Lasting`
        reason where no batch would give one (a weighted judge's reply without log-probabilities)."""
        response = entry.get("response") if isinstance(entry.get("response"), dict) else {}
        if not _billed(entry):
            body = response.get("body") if isinstance(response.get("body"), dict) else {}
            error = entry.get("error") or body.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else error
            return redact(f"HTTP {response.get('status_code')}: {message}", self.client.api_key)
        try:
            text, _, _, _, logprobs = _parse(orjson.dumps(response.get("body")), chat=True)
        except Malformed as exc:
            return redact(f"malformed reply: {exc}", self.client.api_key)
        judge = Judge(
            spec["judge"],
            "openai",
            prompt=spec["prompt"],
            top_logprobs=spec["top_logprobs"],
        )
        try:
            return read_reply(
                judge, text, logprobs, spec["pairs"], self.endpoint, self.client.api_key
            )
        except FatalBackendError as exc:
            return _Lasting(redact(str(exc), self.client.api_key))

    def _book(self, batch_id: Any, spend: _Spend) -> None:
        """Book what a collected (or given up) batch was billed: in the run's spend (--max-cost,
        the summary) and, at once, as its own line of the ledger (--ledger), so that a run that
        fails after collecting loses no booking."""
        if not spend.models:
            return
        stats = self.annotator.stats
        stats.prompt_tokens += spend.prompt
        stats.completion_tokens += spend.completion
        self.annotator._pay(spend.price)
        for model, amounts in spend.models.items():
            spent = self.stats.spend.setdefault(model, [0, 0.0, 0.0, 0.0])
            for position, amount in enumerate(amounts):
                spent[position] += amount
        if self.config.ledger:
            ledger.append(
                self.config.ledger,
                {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "pool": self.annotator.pool.name,
                    "mode": "batch",
                    "collected": str(batch_id),
                    "pairs": 0,
                    "requests": 0,
                    "cached": 0,
                    "pending": 0,
                    "prompt_tokens": spend.prompt,
                    "completion_tokens": spend.completion,
                    "price": round(spend.price, 8),
                    "estimated": spend.estimated,
                    "judges": {
                        model: {
                            "pairs": pairs,
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "price": round(price, 8),
                        }
                        for model, (pairs, prompt, completion, price) in sorted(
                            spend.models.items()
                        )
                    },
                },
            )

    def exit_status(self) -> int:
        """0 where questions are pending because this run submitted them (`--batch submit`: come
        back later), PENDING_EXIT where they were pending already or the wait ran out."""
        submitted = self.config.batch_mode == "submit" and self.stats.submitted
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
        if stats.lost:
            parts.append(f"{stats.lost} batch(es) that could no longer be collected")
        parts.append(f"{stats.pending} question(s) pending")
        return "farm-annotate: batch: " + ", ".join(parts)

    def close(self) -> None:
        self.client.close()


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


class _Lasting(str):
    """Why a line has no verdict, where asking again in another batch would not give one."""


class _Spend:
    """What replies were billed, by model: [pairs, prompt tokens, completion tokens, price], and how
    many were booked at their worst case."""

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.models: dict[str, list[float]] = {}
        self.estimated = 0

    def add(
        self,
        spec: dict[str, Any],
        prompt: float,
        completion: float,
        estimated: bool = False,
        times: int = 1,
        price: float | None = None,
    ) -> None:
        """Book `times` replies of the line `spec`: their tokens, at the batch price (or at
        `price` each, where only that is known)."""
        if times <= 0:
            return
        model = spec["model"]
        if price is None:
            price = self.prices.price(model, prompt, completion, batch=True)
        entry = self.models.setdefault(model, [0, 0.0, 0.0, 0.0])
        for position, amount in enumerate((spec["pairs"], prompt, completion, price)):
            entry[position] += amount * times
        self.estimated += times * estimated

    def worst_price(self, spec: dict[str, Any]) -> float:
        """The most the line `spec` can be billed (USD): its worst tokens at the batch price; a line
        recorded before it kept them (farm-annotate's first --batch), its `share` (`_dated`)."""
        if "worst" not in spec and "share" in spec:
            return float(spec["share"])
        return self.prices.price(spec["model"], *_worst(spec), batch=True)

    def add_worst(self, spec: dict[str, Any], times: int = 1) -> None:
        """Book `times` replies of the line `spec` at its worst case (their bill is not told)."""
        if "worst" not in spec and "share" in spec:  # its tokens are not known, only its price
            self.add(spec, 0.0, 0.0, estimated=True, times=times, price=self.worst_price(spec))
        else:
            self.add(spec, *_worst(spec), estimated=True, times=times)

    def add_reply(self, entry: dict[str, Any], spec: dict[str, Any]) -> None:
        """Book a billed reply of the line `spec` at its usage, or at the line's worst case where
        the reply does not tell it and the line's worst tokens are not known."""
        prompt, completion, estimated = _usage(entry, spec)
        if estimated and "worst" not in spec and "share" in spec:
            self.add_worst(spec)
        else:
            self.add(spec, prompt, completion, estimated)

    def merge(self, other: _Spend) -> None:
        for model, amounts in other.models.items():
            entry = self.models.setdefault(model, [0, 0.0, 0.0, 0.0])
            for position, amount in enumerate(amounts):
                entry[position] += amount
        self.estimated += other.estimated

    @property
    def prompt(self) -> float:
        return sum(entry[1] for entry in self.models.values())

    @property
    def completion(self) -> float:
        return sum(entry[2] for entry in self.models.values())

    @property
    def price(self) -> float:
        return sum(entry[3] for entry in self.models.values())


def _billed(entry: dict[str, Any]) -> bool:
    """Whether a line of a batch's files is a reply the endpoint bills: answered with HTTP 200."""
    response = entry.get("response")
    return (
        not entry.get("error") and isinstance(response, dict) and response.get("status_code") == 200
    )


def _dated(
    lines: dict[str, tuple[list[str], dict[str, Any]]], worst: float | None
) -> dict[str, tuple[list[str], dict[str, Any]]]:
    """A batch's pending `lines` (custom_id -> (keys, spec)), those recorded before each line kept
    its worst tokens (farm-annotate's first --batch wrote no `worst` in a line's spec) given a
    `share`: their batch's worst price (USD, recorded with every batch since the first --batch:
    `worst`, the sum of its lines' worst prices) shared equally among its lines, so that a reply
    whose bill is not told, or a lost batch, is booked at its worst case, never at $0."""
    if not lines or all("worst" in spec for _, spec in lines.values()):
        return lines
    share = float(worst or 0.0) / len(lines)
    return {
        custom_id: (keys, spec if "worst" in spec else {**spec, "share": share})
        for custom_id, (keys, spec) in lines.items()
    }


def _worst(spec: dict[str, Any]) -> tuple[float, float]:
    """The most a line can be billed (prompt, completion tokens); lines recorded before it was kept
    (farm-annotate's first --batch): 0 tokens (their worst price is their `share`, `_dated`)."""
    worst = spec.get("worst")
    return (
        (float(worst[0]), float(worst[1]))
        if isinstance(worst, list) and len(worst) == 2
        else (0.0, 0.0)
    )


def _usage(entry: dict[str, Any], spec: dict[str, Any]) -> tuple[float, float, bool]:
    """(prompt, completion tokens, estimated) a billed reply is booked at: the usage it tells, a
    count it does not tell (missing, or not a count: a negative, a string, beyond any real reply)
    at the line's worst case, as the direct path books it."""
    try:
        _, _, prompt, completion, _ = _parse(orjson.dumps(entry["response"].get("body")), chat=True)
    except Malformed as exc:
        prompt, completion = exc.usage if exc.reported else (None, None)
    worst = _worst(spec)
    return (
        worst[0] if prompt is None else prompt,
        worst[1] if completion is None else completion,
        prompt is None or completion is None,
    )


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
