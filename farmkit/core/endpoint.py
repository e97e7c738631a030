"""The one client for OpenAI-compatible endpoints, shared by farm-annotate's `openai` judges and
farm-sample's `openai` backend: where the endpoint is and which key it gets, how requests are
retried, which errors stop a run, and how an endpoint's words are reported without the key.

It speaks HTTP/1.1 over asyncio streams with kept-alive connections (httpx where a proxy is set) and
parses replies with orjson: the `openai` package's per-request machinery cost milliseconds of CPU per
reply, which held throughput below the endpoint's limit at short latencies.

Errors fall in three kinds:
- `EndpointFatal`: retrying cannot fix it (connection refused, host unknown or no connection within
  the connect timeout, before the endpoint ever answered in this run; 401/403; 404 unknown model or
  route): the caller stops the run at once.
- transient (429, 408, 5xx, timeouts, dropped connections, a 200 whose body is not a well-formed
  completion): retried with exponential backoff that honours Retry-After, then `EndpointFailed`.
- other 4xx (a request the endpoint rejects), and a reply larger than the cap: `EndpointFailed` at once,
  for this request only.
A redirect (3xx) is fatal too: a request that carries the key is never sent on to a host the user did
not name.

The base URL may hold a query (Azure's `?api-version=...`), sent with every request, and credentials
(`https://user:password@host/v1`), sent as HTTP Basic authentication where no API key is set; messages
show the URL without credentials and with the query's values blanked (`Address.shown`). What an
endpoint says is cleared of every secret the client holds, in any form (farmkit.core.secrets).

Waits: a wait an endpoint asks for (Retry-After, x-ratelimit-reset-*) is honoured up to MAX_WAIT, and
one that is not a finite, non-negative number is taken as not given; any wait longer than LONG_WAIT is
said on stderr with its reason. `stop()` ends every wait at once (a SIGTERM): a request not yet sent is
not sent, a retry not yet made is not made.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import itertools
import logging
import math
import os
import random
import re
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from farmkit.core.io import FarmError
from farmkit.core.secrets import held

log = logging.getLogger("farmkit")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_BACKOFF = 60.0  # seconds: the longest of our own backoffs between retries
# seconds: the longest wait an endpoint's headers (Retry-After, a rate limit's reset) may ask for; a
# provider's limits reset within a minute or a day, and a run told to wait a day waits 10 minutes,
# then asks again (a 429 then says how long is left)
MAX_WAIT = 600.0
LONG_WAIT = 5.0  # seconds: a longer wait is said on stderr, with its reason
# seconds to open a connection (TLS included): a healthy endpoint takes well under one; a host that
# never answers (blackholed, firewalled) is told apart from a slow reply in seconds, not a timeout
CONNECT_TIMEOUT = 10.0
# bytes of one reply body: a verdict or a sample is kilobytes; an endpoint that sends far more (a broken
# proxy, a hostile server) is cut off there instead of growing the process without bound
DEFAULT_MAX_REPLY = 4 * 2**20
# key shapes of the common providers, bearer tokens and basic credentials, a URL's password, whatever
# the configured key is
_KEY_SHAPES = re.compile(
    r"\b(?:sk|pk|rk|hf|gsk|xai|key)[-_][\w*.-]{6,}|\b(?:Bearer|Basic)\s+[^\s;,\"')]+"
    r"|\bAIza[\w-]{10,}|(?<=://)[^\s/@:]+:[^\s/@]+(?=@)",
    re.IGNORECASE,
)
# a query parameter whose value is a secret, by its name (as farmkit.core.secrets reads URLs)
_QUERY_SECRET = re.compile(
    r"([?&][\w.-]*(?:key|token|sig|secret|pass|pwd|auth|credential|session|code)[\w.-]*=)[^&\s#\"')]+",
    re.IGNORECASE,
)


def configured() -> tuple[str | None, str | None]:
    """(base URL, API key) from OPENAI_BASE_URL and OPENAI_API_KEY; None where unset."""
    return os.environ.get("OPENAI_BASE_URL") or None, os.environ.get("OPENAI_API_KEY") or None


@dataclass(frozen=True)
class Address:
    """An endpoint's base URL taken apart: where requests go (`netloc`, the Host header: no
    credentials), the path they start with, the query every request carries, and the credentials."""

    scheme: str
    host: str
    port: int
    netloc: str
    path: str
    query: str
    username: str | None
    password: str | None

    @property
    def shown(self) -> str:
        """The URL as messages show it: no credentials, the query's values blanked (a key may be one)."""
        query = "&".join(part.partition("=")[0] + "=***" for part in self.query.split("&") if part)
        return f"{self.scheme}://{self.netloc}{self.path}" + (f"?{query}" if query else "")

    def target(self, path: str) -> str:
        """The request target of `path` under the base URL, with the base URL's query."""
        return f"{self.path}{path}" + (f"?{self.query}" if self.query else "")


def address(base_url: str) -> Address:
    from urllib.parse import unquote, urlsplit

    url = urlsplit(base_url)
    netloc = url.netloc.rpartition("@")[2]
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        raise FarmError(f"{netloc}: not a host and port; check OPENAI_BASE_URL") from None
    username = None if url.username is None else unquote(url.username)
    password = None if url.password is None else unquote(url.password)
    return Address(
        url.scheme,
        url.hostname or "",
        port,
        netloc,
        url.path.rstrip("/"),
        url.query,
        username,
        password,
    )


class EndpointFatal(Exception):
    """An error no retry can fix: the run stops."""


class EndpointFailed(Exception):
    """A request that failed for good (its retries spent, or rejected as it stands). `usage` holds the
    (prompt, completion) tokens its attempts reported: malformed replies may still have been billed.
    `over_budget`: the caller's budget refused a retry. `unknown`: attempts whose bill was not told
    (timed out, dropped, or a malformed reply without usage): the endpoint may have billed them."""

    def __init__(
        self,
        message: str,
        usage: tuple[int, int] = (0, 0),
        over_budget: bool = False,
        unknown: int = 0,
    ):
        super().__init__(message)
        self.usage, self.over_budget, self.unknown = usage, over_budget, unknown


class Malformed(Exception):
    """A 200 reply that is not a well-formed completion (treated as a transient failure); `usage` holds
    the tokens it reports where it reports them, since the attempt may still be billed; `reported`:
    whether it reported both counts."""

    def __init__(self, message: str, usage: tuple[int, int] = (0, 0), reported: bool = False):
        super().__init__(message)
        self.usage, self.reported = usage, reported


@dataclass
class Reply:
    text: str
    finished: bool  # finish_reason "stop": not cut off by max_tokens
    prompt_tokens: int  # summed over every attempt the endpoint reported usage for
    completion_tokens: int
    attempts: int
    # the answering attempt gave no count (usage missing or null): the caller adds its own estimate
    prompt_unreported: bool = False
    completion_unreported: bool = False
    # earlier attempts whose bill was not told (timed out, dropped, malformed without usage)
    unknown_attempts: int = 0
    # the first choice's `logprobs` as the endpoint gave it (None where it gave none)
    logprobs: Any = None
    # what the reply says answered it: its `model` (a dated name behind an alias) and its
    # `system_fingerprint` (the backend's configuration), None where the endpoint gives none
    reply_model: str | None = None
    system_fingerprint: str | None = None


def redact(text: str, key: str | None = None, shapes: bool = True, url: str | None = None) -> str:
    """`text` without the secrets of `key` and `url` nor those of OPENAI_API_KEY and OPENAI_BASE_URL
    (the key, the URL's password and credentials, its query's secret values), in any form and any
    run of FRAGMENT or more of their characters (farmkit.core.secrets), and, with `shapes`, without
    anything shaped like a common provider's key, a bearer or basic credential, a URL's password or
    a query's secret value."""
    environment_url, environment_key = configured()
    for secrets in {held(environment_key, environment_url), held(key or None, url)}:
        text = secrets.redact(text)
    if shapes:
        text = _QUERY_SECRET.sub(r"\1***", _KEY_SHAPES.sub("***", text))
    return text


def authorization(address: Address, api_key: str | None) -> dict[str, str]:
    """The Authorization header of requests to `address`: the API key as a bearer token, or the URL's
    credentials as HTTP Basic authentication (a gateway that asks for it); none for a local server."""
    if address.username is None:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # a request has one Authorization header: with a key as well, one would be lost
    if api_key:
        raise FarmError(
            f"OPENAI_BASE_URL holds credentials (user:password@ before {address.netloc}) and "
            "OPENAI_API_KEY is set too: a request carries one of them; unset one"
        )
    userinfo = f"{address.username}:{address.password or ''}"
    return {"Authorization": "Basic " + base64.b64encode(userinfo.encode()).decode()}


# a reply later than this share of the timeout means the endpoint is near its limit: no more at once
HEADROOM = 0.5
OVERLOADED = (408, 429, 503)  # statuses by which an endpoint says it has too much to do


class ConcurrencyLimit:
    """How many requests an endpoint is sent at once, adapted to what it sustains (AIMD, as TCP's
    congestion window), judged by how long replies take: the slowest of the last round's replies and
    of the requests still awaited. It starts at one. Until the first back-off, a latency within
    HEADROOM of the timeout raises it at once to what even an endpoint that answers one request at
    a time would answer within that headroom (timeout x HEADROOM / latency). Beyond that it grows on
    replies to requests sent while every place was taken, while one more at once would still be
    answered within the headroom were the endpoint to answer one at a time: to one more than were in
    flight with that request until the first back-off, then by one per round trip. A timeout, 408,
    429 or 503 halves it (once per round: requests already in flight when it was cut do not cut it
    again). Never below one nor above `most`."""

    def __init__(self, most: int, timeout: float):
        self.most, self.timeout = max(1, most), timeout
        self.limit = 1.0
        self.slow_start = True  # until the first back-off
        self.cuts = 0
        self.in_flight = 0
        self._cut_at = -math.inf
        self._waiting: collections.deque[asyncio.Future] = collections.deque()
        self._started: dict[int, float] = {}  # place -> when it was given, for those in flight
        self._latencies: collections.deque[float] = collections.deque(maxlen=self.most)
        self._issued = 0

    @property
    def allowed(self) -> int:
        return int(self.limit)

    async def acquire(self) -> tuple[int, float, int, bool]:
        """Wait for a place: (its number, when it was given, how many were in flight with it, whether
        it took the last free place), for release."""
        if self.in_flight >= self.allowed or self._waiting:
            place = asyncio.get_running_loop().create_future()
            self._waiting.append(place)
            try:
                together, full = await place
            except asyncio.CancelledError:
                if place.done() and not place.cancelled():  # given just now: hand it on
                    self.in_flight -= 1
                    self._wake()
                raise
        else:
            self.in_flight += 1
            together, full = self.in_flight, self.in_flight >= self.allowed
        self._issued += 1
        self._started[self._issued] = started = time.monotonic()
        return self._issued, started, together, full

    def release(self, place: tuple[int, float, int, bool], outcome: str | None) -> None:
        """Give back a place: `outcome` "ok" (a reply), "overloaded" (timed out, or a status saying so)
        or None (any other failure: nothing learnt)."""
        token, started, together, full = place
        del self._started[token]
        self.in_flight -= 1
        now = time.monotonic()
        if outcome == "ok":
            self._latencies.append(now - started)
        # the slowest of the last round's replies and of those still awaited: an endpoint that answers
        # out of turn makes one reply quick while another waits
        latency = max(
            [
                now - min([started, *self._started.values()]),
                *itertools.islice(reversed(self._latencies), self.allowed),
            ]
        )
        headroom = self.timeout * HEADROOM
        if outcome == "overloaded":
            if started >= self._cut_at:
                self.limit, self.slow_start = max(1.0, self.limit / 2), False
                self._cut_at, self.cuts = now, self.cuts + 1
        elif outcome == "ok" and latency <= headroom:
            if self.slow_start:  # what even an endpoint that answers one at a time answers in time
                self.limit = max(self.limit, headroom / max(latency, 1e-6))
            # one more at once, were the endpoint to answer one at a time, would still be in time
            if full and latency * (together + 1) / together <= headroom:
                if self.slow_start:
                    self.limit = max(self.limit, together + 1.0)
                else:
                    self.limit += 1 / self.limit
            self.limit = min(self.limit, float(self.most))
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.in_flight < self.allowed:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result((self.in_flight, self.in_flight >= self.allowed))


_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float | None:
    """Seconds in a reset header: OpenAI's form ("20ms", "1s", "6m0s", "1h2m3.5s") or a plain number of
    seconds; None where it is neither, or not a finite, non-negative number ("inf", "1e999", "-5")."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT[unit] for number, unit in parts)


@dataclass(frozen=True)
class Ticket:
    """A request as the pacer let it go: its number, the tokens sent with it included, and how many
    requests sent before it were still unanswered (the provider may count them after it)."""

    number: int
    spent: float
    earlier: int


@dataclass
class _Known:
    """What the reply to `ticket` said of one limit: `remaining`, until `reset_at` (monotonic
    seconds), `period` seconds after the reply came (at most MAX_WAIT); `told`: the reset as the
    header gave it."""

    remaining: float
    reset_at: float
    period: float
    ticket: Ticket
    told: str = ""


class Pacer:
    """Paces requests by the provider's own rate-limit headers (OpenAI's x-ratelimit-remaining-requests,
    -tokens and x-ratelimit-reset-requests, -tokens), so that a long run slows before it meets 429s.

    What a reply says holds from the request it answered: the requests sent after it, and those sent
    before it and unanswered then, count against it (the provider may have counted some already:
    pacing errs slow, never over). A request waits while the latest word leaves less than one
    request, or fewer tokens than a request takes (the most the last replies were billed), until that
    word's reset time; then one request goes alone, and its reply says what is left. The run's first
    request goes alone too. Without such headers it never waits after that. A reset is waited at
    most MAX_WAIT; `announce(seconds, why)` is told of each wait for a reset."""

    KINDS = ("requests", "tokens")

    def __init__(self, announce: Callable[[float, str], None] = lambda seconds, why: None) -> None:
        self.announce, self.stopped = announce, False
        self.sent = self.ended = 0  # requests sent, and those whose attempt has ended
        self.spent = 0.0  # the tokens the requests sent are expected to take
        self.known: dict[str, _Known] = {}
        self.billed: collections.deque[int] = collections.deque(maxlen=32)
        self.waits = 0  # requests that waited for a limit (not for the first reply)
        self._changed = asyncio.Event()
        self._waiting = 0

    def _cost(self) -> float:
        return float(max(self.billed, default=0))

    def _short(self, kind: str, known: _Known) -> bool:
        ticket = known.ticket
        if kind == "requests":
            used, need = self.sent - ticket.number - 1 + ticket.earlier, 1.0
        else:
            used, need = self.spent - ticket.spent + ticket.earlier * self._cost(), self._cost()
        return known.remaining - used < need

    async def wait(self) -> Ticket:
        """Wait until a request may go; its ticket, for `observe`."""
        waited = False
        while True:
            if self.stopped:
                raise _Stopped
            now = time.monotonic()
            # the first request goes alone: its reply tells the limits
            if self.sent and not self.ended:
                until = math.inf
            else:
                short = [
                    (kind, known) for kind, known in self.known.items() if self._short(kind, known)
                ]
                if not short:
                    break
                if all(known.reset_at <= now for _, known in short):
                    # reset by now: one request alone says what is left
                    alone = Ticket(self.sent - 1, self.spent, 0)
                    for kind, known in short:
                        need = 1.0 if kind == "requests" else self._cost()
                        self.known[kind] = _Known(
                            need, now + known.period, known.period, alone, known.told
                        )
                    waited = True
                    break
                kind, latest = max(short, key=lambda pair: pair[1].reset_at)
                until, waited = latest.reset_at, True
                self.announce(
                    until - now,
                    f"before the next request, as the endpoint's x-ratelimit-reset-{kind}: "
                    f"{latest.told} says"
                    + (f", capped at {_span(MAX_WAIT)}" if latest.period >= MAX_WAIT else ""),
                )
            self._waiting += 1
            try:
                await asyncio.wait_for(
                    self._changed.wait(), max(0.001, until - now) if until < math.inf else None
                )
            except (TimeoutError, asyncio.TimeoutError):  # distinct before Python 3.11
                pass
            finally:
                self._waiting -= 1
        self.waits += waited
        self.spent += self._cost()
        ticket = Ticket(self.sent, self.spent, self.sent - self.ended)
        self.sent += 1
        return ticket

    def stop(self) -> None:
        """Every wait ends now, with _Stopped, and so does every later one."""
        self.stopped = True
        self._changed.set()

    def observe(self, ticket: Ticket, headers: Any) -> None:
        """Take what the reply to `ticket` says of the limits (`headers` empty: no reply came)."""
        now = time.monotonic()
        self.ended += 1
        for kind in self.KINDS:
            remaining = headers.get(f"x-ratelimit-remaining-{kind}")
            reset = headers.get(f"x-ratelimit-reset-{kind}")
            seconds = None if reset is None else duration(reset)
            try:
                left = float(remaining) if remaining is not None else None
            except ValueError:
                left = None
            if left is None or seconds is None:
                continue
            seconds = min(seconds, MAX_WAIT)
            known = self.known.get(kind)
            if known is None or ticket.number >= known.ticket.number:  # the latest word wins
                self.known[kind] = _Known(left, now + seconds, seconds, ticket, reset.strip()[:40])
        if self._waiting:  # woken to look again; none waits in a run without limits
            self._changed.set()
            self._changed = asyncio.Event()


class EndpointClient:
    """Requests to one endpoint over one connection pool. `stats` counts attempts sent, retries and
    replies received, for the callers' summaries."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        *,
        timeout: float,
        max_retries: int,
        backoff: float,
        connections: int = 100,
        connect_timeout: float | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY,
    ):
        """`timeout`: seconds for a whole request; `connect_timeout`: seconds to open a connection
        (default: CONNECT_TIMEOUT, or `timeout` where that is shorter); `max_reply_bytes`: the largest
        reply body read (a larger one fails its request unread)."""
        self._url = (base_url or DEFAULT_BASE_URL).strip()  # never shown: it may hold secrets
        self.address = address(self._url)
        self.base_url = self.address.shown  # as messages show it
        self.api_key = api_key
        self.max_retries, self.backoff = max(0, int(max_retries)), float(backoff)
        self.max_reply_bytes = int(max_reply_bytes)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **authorization(self.address, api_key),
        }
        proxied = any(os.environ.get(name) for name in _PROXY_VARIABLES)
        # streams are the lean path; httpx knows proxies
        transport = _HttpxTransport if proxied else _StreamTransport
        connect = min(
            float(timeout), CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        )
        self._transport = transport(
            self.address,
            headers,
            float(timeout),
            max(1, int(connections)),
            connect,
            self.max_reply_bytes,
        )
        self.limit = ConcurrencyLimit(max(1, int(connections)), float(timeout))
        self.pacer = Pacer(self._announce)
        self.stats = {"requests": 0, "retries": 0, "answered": 0}
        self._halt = asyncio.Event()  # set by stop()
        self._said_until = -math.inf  # when the last wait said on stderr ends

    def stop(self) -> None:
        """End every wait now and send nothing more: requests waiting for the provider's limits or
        for a retry fail at once ("stopped"); those already sent are answered as usual. Called on
        the client's event loop."""
        self._halt.set()
        self.pacer.stop()

    def _announce(self, seconds: float, why: str) -> None:
        """Say a wait longer than LONG_WAIT on stderr, once for the waits that end about together
        (requests in flight together wait together)."""
        ends = time.monotonic() + seconds
        if seconds > LONG_WAIT and ends > self._said_until + LONG_WAIT:
            self._said_until = ends
            log.warning("farmkit: %s: waiting %s %s", self.base_url, _span(seconds), why)

    @property
    def concurrency(self) -> tuple[int, int, int]:
        """(requests it may send at once now, the most it may, times it backed off)."""
        return self.limit.allowed, self.limit.most, self.limit.cuts

    async def complete(
        self,
        body: dict[str, Any],
        chat: bool = True,
        before_retry: Callable[[int, int], bool] | None = None,
    ) -> Reply:
        """The reply to one chat completion (or, with chat=False, a text completion) request.
        `before_retry(prompt_tokens, completion_tokens, unknown)`, given what the attempts so far
        reported and how many were not told (timeouts, dropped connections, malformed replies without
        usage: the endpoint may have billed them), says whether a retry may be sent (a budget).
        An answer with an HTTP error status is taken as not billed."""
        path = "/chat/completions" if chat else "/completions"
        payload = orjson.dumps(body)
        attempts = self.max_retries + 1
        prompt_tokens = completion_tokens = unknown = 0
        last = ""
        for attempt in range(attempts):
            told: Any = {}  # the headers of a reply that may say how long to wait
            try:
                response = await self._attempt(path, payload)
            except _Stopped:
                raise EndpointFailed(
                    f"{last + '; ' if last else ''}not sent: the run was stopped",
                    (prompt_tokens, completion_tokens),
                    unknown=unknown,
                ) from None
            except _ConnectFailed as exc:
                if not self.stats["answered"]:
                    # never reached at all: a wrong address, a server that is not running or a host
                    # that does not answer, not a passing fault
                    raise EndpointFatal(
                        f"cannot connect to {self.base_url} ({self._reason(exc)}); "
                        "check OPENAI_BASE_URL"
                    ) from None
                last = f"connection failed ({self._reason(exc)})"
            except (TimeoutError, asyncio.TimeoutError):  # distinct before Python 3.11
                last, unknown = "timed out", unknown + 1
            except _Dropped as exc:  # dropped connection, protocol error
                last, unknown = f"connection dropped ({self._reason(exc)})", unknown + 1
            except _TooLarge as exc:  # asking again would bring the same flood
                raise EndpointFailed(
                    f"{exc}; not read (the cap is max_reply_bytes)",
                    (prompt_tokens, completion_tokens),
                    unknown=unknown + 1,
                ) from None
            else:
                self.stats["answered"] += 1
                status = response.status_code
                if status == 200:
                    try:
                        text, finished, prompt, completion, logprobs = _parse(
                            response.content, chat
                        )
                    except Malformed as exc:
                        last, unknown = f"malformed reply: {exc}", unknown + (not exc.reported)
                        prompt_tokens, completion_tokens = (
                            prompt_tokens + exc.usage[0],
                            completion_tokens + exc.usage[1],
                        )
                    else:
                        if prompt is not None and completion is not None:
                            self.pacer.billed.append(prompt + completion)
                        return Reply(
                            text,
                            finished,
                            prompt_tokens + (prompt or 0),
                            completion_tokens + (completion or 0),
                            attempt + 1,
                            prompt is None,
                            completion is None,
                            unknown,
                            logprobs,
                            *_served(response.content),
                        )
                elif status in (401, 403):
                    raise EndpointFatal(
                        f"the endpoint {self.base_url} refused the request (HTTP {status}: "
                        f"{self._message(response)}); check OPENAI_API_KEY and OPENAI_BASE_URL"
                    )
                elif status == 404:
                    raise EndpointFatal(
                        f"the endpoint {self.base_url} has no model {body.get('model')!r} "
                        f"(HTTP 404: {self._message(response)})"
                    )
                elif 300 <= status < 400:
                    raise EndpointFatal(self._redirected(response))
                elif status in (408, 409, 429) or status >= 500:
                    last = f"HTTP {status}: {self._message(response)}"
                    told = response.headers
                else:
                    raise EndpointFailed(
                        f"HTTP {status}: {self._message(response)}",
                        (prompt_tokens, completion_tokens),
                        unknown=unknown,
                    )
            if attempt + 1 < attempts:
                if before_retry is not None and not before_retry(
                    prompt_tokens, completion_tokens, unknown
                ):
                    raise EndpointFailed(
                        f"{last}; not retried: the retry could exceed the budget",
                        (prompt_tokens, completion_tokens),
                        over_budget=True,
                        unknown=unknown,
                    )
                backoff = self.backoff * 2**attempt * (0.5 + random.random())
                seconds, why = retry_wait(told, backoff)
                self._announce(seconds, f"before retrying a request ({last[:100]}), as {why}")
                try:
                    await self._pause(seconds)
                except _Stopped:
                    raise EndpointFailed(
                        f"{last}; not retried: the run was stopped",
                        (prompt_tokens, completion_tokens),
                        unknown=unknown,
                    ) from None
                self.stats["retries"] += 1
        raise EndpointFailed(
            f"{last} (after {attempts} attempts)",
            (prompt_tokens, completion_tokens),
            unknown=unknown,
        )

    async def _attempt(self, path: str, payload: bytes) -> _Response:
        """One attempt, sent when the provider's limits (as its headers tell them) and the concurrency
        limit have a place for it, and telling them how it went."""
        ticket = await self.pacer.wait()
        headers: Any = {}
        try:
            place = await self.limit.acquire()
            outcome = None
            try:
                if self._halt.is_set():  # stopped while it waited for a place
                    raise _Stopped
                self.stats["requests"] += 1
                response = await self._transport.post(path, payload)
                headers = response.headers
                status = response.status_code
                outcome = "overloaded" if status in OVERLOADED else "ok" if status == 200 else None
                return response
            except (TimeoutError, asyncio.TimeoutError):  # distinct before Python 3.11
                outcome = "overloaded"
                raise
            finally:
                self.limit.release(place, outcome)
        finally:
            self.pacer.observe(ticket, headers)

    def _redirected(self, response: _Response) -> str:
        """The line that ends a run on a redirect: its status, the origin it points to, and why it is
        not followed."""
        from urllib.parse import urljoin, urlsplit

        location = response.headers.get("location") or ""
        target = urlsplit(urljoin(f"{self.address.scheme}://{self.address.netloc}/", location))
        origin = f"{target.scheme}://{target.netloc.rpartition('@')[2]}" if location else "nowhere"
        return (
            f"the endpoint {self.base_url} answered HTTP {response.status_code}, a redirect to "
            f"{self._redact(origin)}: farmkit does not follow redirects, which would send the request and "
            "its key to an address you did not name; set OPENAI_BASE_URL to the address it should use"
        )

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or raise _Stopped as soon as the client is stopped."""
        if self._halt.is_set():
            raise _Stopped
        try:
            await asyncio.wait_for(self._halt.wait(), seconds)
        except (TimeoutError, asyncio.TimeoutError):  # distinct before Python 3.11
            return
        raise _Stopped

    def _redact(self, text: str) -> str:
        """`text` without any secret the client holds (the key, the base URL's password and
        credentials, its query's secrets), in any form."""
        return redact(text, self.api_key, url=self._url)

    def _reason(self, exc: Exception) -> str:
        return self._redact(str(exc) or type(exc).__name__)[:200]

    def _message(self, response: Any) -> str:
        """The endpoint's error message, short and without the key (OpenAI's quotes part of a rejected key)."""
        try:
            detail = orjson.loads(response.content)
            detail = detail.get("error", detail) if isinstance(detail, dict) else detail
            message = detail.get("message") if isinstance(detail, dict) else None
            text = str(message) if message else response.content.decode("utf-8", "replace")
        except orjson.JSONDecodeError:
            text = response.content.decode("utf-8", "replace")
        text = self._redact(" ".join(text.split()))
        return text if len(text) <= 200 else text[:197] + "..."

    async def close(self) -> None:
        await self._transport.close()


_PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


class _Stopped(Exception):
    """The client was stopped while a request waited to be sent."""


class _ConnectFailed(Exception):
    """No connection could be opened (refused, unknown host, unreachable, no answer in time)."""


class _Dropped(Exception):
    """The connection broke, or the reply was not HTTP."""


class _TooLarge(Exception):
    """A reply body larger than the client reads."""

    def __init__(self, size: int | None, most: int):
        told = f"of {size:,} bytes, more" if size is not None else "of more"
        super().__init__(f"a reply {told} than {most:,} bytes")


@dataclass
class _Response:
    status_code: int
    headers: dict[str, str]  # names in lower case
    content: bytes


class _StreamTransport:
    """HTTP/1.1 over asyncio streams, with a pool of kept-alive connections: about a fifth of httpx's
    CPU per request. Requests are small JSON posts, so only what chat completions need is spoken."""

    def __init__(
        self,
        address: Address,
        headers: dict[str, str],
        timeout: float,
        connections: int,
        connect_timeout: float,
        max_reply: int,
    ):
        import ssl

        self.address, self.host, self.port = address, address.host, address.port
        self.ssl = ssl.create_default_context() if address.scheme == "https" else None
        self.head = "".join(
            f"{name}: {value}\r\n" for name, value in {**headers, "Host": address.netloc}.items()
        )
        self.timeout, self.connections, self.connect_timeout = timeout, connections, connect_timeout
        self.max_reply = max_reply
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, payload: bytes) -> _Response:
        request = (
            f"POST {self.address.target(path)} HTTP/1.1\r\n{self.head}"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode("latin-1") + payload
        while self.idle:
            reader, writer = self.idle.pop()
            if _reusable(reader, writer):
                return await asyncio.wait_for(self._exchange(reader, writer, request), self.timeout)
            writer.close()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl), self.connect_timeout
            )
        except (TimeoutError, asyncio.TimeoutError):  # distinct before Python 3.11
            raise _ConnectFailed(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as exc:  # refused, unknown host, unreachable, a failed TLS handshake
            raise _ConnectFailed(str(exc) or type(exc).__name__) from None
        return await asyncio.wait_for(self._exchange(reader, writer, request), self.timeout)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> _Response:
        keep = False
        try:
            writer.write(request)
            status, headers = await _read_head(reader)
            # interim replies (100 Continue, 103 Early Hints) come before the final one (RFC 9110 15.2)
            while 100 <= status < 200 and status != 101:
                status, headers = await _read_head(reader)
            coding = headers.get("transfer-encoding", "").lower()
            if coding:
                # Transfer-Encoding overrides Content-Length (RFC 9112 6.3); a reply that has both may be
                # an attempt at smuggling, so its connection is not used again
                if coding.rsplit(",", 1)[-1].strip() == "chunked":
                    content = await _read_chunked(reader, self.max_reply)
                    keep = "content-length" not in headers
                else:  # a coding that does not delimit the body: it ends when the connection closes
                    content = await _read_to_close(reader, self.max_reply)
            elif "content-length" in headers:
                length = int(headers["content-length"])
                if length > self.max_reply:
                    raise _TooLarge(length, self.max_reply)
                content = await reader.readexactly(length)
                keep = True
            else:
                content = await _read_to_close(reader, self.max_reply)
            keep = keep and headers.get("connection", "").lower() != "close"
            return _Response(status, headers, content)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            # any OSError on an open connection (reset, aborted, a TLS record that fails: ssl.SSLError,
            # a socket timeout) loses this reply, not the endpoint: retried as a dropped connection
            raise _Dropped(str(exc) or type(exc).__name__) from None
        finally:
            if keep and len(self.idle) < self.connections:
                self.idle.append((reader, writer))
            else:
                writer.close()

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def _reusable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether an idle connection may carry the next request: still open, and with nothing to read.
    Bytes that arrived while it was idle (a reply nobody asked for, or the start of the server closing
    it) would be read as the answer to the next request, and every later answer on it would be the one
    before; such a connection is closed instead. Looked for in what the stream has buffered and, without
    blocking, in what the socket holds that the event loop has not read yet."""
    # the stream's buffer has no public size: its private bytearray is read
    if reader.at_eof() or writer.is_closing() or reader._buffer:
        return False
    sock = writer.get_extra_info("socket")
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):  # closed under us
        return False
    return not readable


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """A reply's status and headers (names in lower case)."""
    status_line = await reader.readline()
    if not status_line:
        raise _Dropped("the connection was closed before a reply")
    status = int(status_line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_chunked(reader: asyncio.StreamReader, most: int) -> bytes:
    chunks, size = [], 0
    while length := int((await reader.readline()).split(b";")[0], 16):
        size += length
        if size > most:
            raise _TooLarge(None, most)
        chunks.append(await reader.readexactly(length))
        await reader.readexactly(2)
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
        pass
    return b"".join(chunks)


async def _read_to_close(reader: asyncio.StreamReader, most: int) -> bytes:
    """A body delimited by the server closing the connection, read up to `most` bytes."""
    content = bytearray()
    while piece := await reader.read(65536):
        content += piece
        if len(content) > most:
            raise _TooLarge(None, most)
    return bytes(content)


class _HttpxTransport:
    """httpx, for endpoints reached through a proxy (it reads the proxy variables)."""

    def __init__(
        self,
        address: Address,
        headers: dict[str, str],
        timeout: float,
        connections: int,
        connect_timeout: float,
        max_reply: int,
    ):
        import httpx

        self.address, self.httpx, self.connect_timeout = address, httpx, connect_timeout
        self.origin, self.max_reply = f"{address.scheme}://{address.netloc}", max_reply
        self.client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def post(self, path: str, payload: bytes) -> _Response:
        request = self.client.build_request(
            "POST", self.origin + self.address.target(path), content=payload
        )
        try:
            response = await self.client.send(request, stream=True)
            try:
                content = await self._read(response)
            finally:
                await response.aclose()
        except self.httpx.ConnectError as exc:
            raise _ConnectFailed(str(exc) or type(exc).__name__) from None
        except self.httpx.ConnectTimeout:
            raise _ConnectFailed(f"no connection within {self.connect_timeout:g} s") from None
        except self.httpx.TimeoutException:
            raise TimeoutError from None
        except self.httpx.TransportError as exc:
            raise _Dropped(str(exc) or type(exc).__name__) from None
        return _Response(response.status_code, response.headers, content)

    async def _read(self, response: Any) -> bytes:
        """The body, read as it streams in up to the cap."""
        told = response.headers.get("content-length")
        if told and told.isdigit() and int(told) > self.max_reply:
            raise _TooLarge(int(told), self.max_reply)
        content = bytearray()
        async for piece in response.aiter_bytes():
            content += piece
            if len(content) > self.max_reply:
                raise _TooLarge(None, self.max_reply)
        return bytes(content)

    async def close(self) -> None:
        await self.client.aclose()


def _parse(content: bytes, chat: bool) -> tuple[str, bool, int | None, int | None, Any]:
    """(text, finished, prompt tokens, completion tokens, the choice's logprobs) of a 200 reply, or
    Malformed saying what is wrong; a token count the reply does not give is None."""
    try:
        reply = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise Malformed(f"not JSON: {_snippet(content)}") from None
    if not isinstance(reply, dict):
        raise Malformed(f"not a JSON object: {_snippet(content)}")
    usage = reply.get("usage") or {}
    if not isinstance(usage, dict):
        raise Malformed(f"usage is not token counts: {_snippet(orjson.dumps(usage))}")
    counts = [_count(usage.get(name)) for name in ("prompt_tokens", "completion_tokens")]
    if any(count == -1 for count in counts):
        raise Malformed(f"usage is not token counts: {_snippet(orjson.dumps(usage))}")
    billed = (counts[0] or 0, counts[1] or 0)
    told = None not in counts
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Malformed(f"no choices: {_snippet(content)}", billed, told)
    choice = choices[0]
    text = choice.get("text")
    if chat:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        if not isinstance(message, dict):
            raise Malformed(f"no message: {_snippet(content)}", billed, told)
    if not isinstance(text, str | None):
        raise Malformed(f"the text is not a string: {_snippet(content)}", billed, told)
    finished = choice.get("finish_reason") == "stop"
    return text or "", finished, counts[0], counts[1], choice.get("logprobs")


def _served(content: bytes) -> tuple[str | None, str | None]:
    """The reply's `model` and `system_fingerprint` where it gives them as non-empty strings (a
    well-formed reply: `_parse` has read it)."""
    reply = orjson.loads(content)
    return tuple(  # type: ignore[return-value]
        value if isinstance(value, str) and value.strip() else None
        for value in (reply.get("model"), reply.get("system_fingerprint"))
    )


# tokens one reply can be billed: no model reads or writes this many in one request; a count above it
# is a broken or hostile reply, not a bill (1e30 tokens would price at $1e23)
MOST_TOKENS = 10_000_000


def _count(value: Any) -> int | None:
    """A usage count: an integer as given, a fraction rounded, None where the endpoint gives none
    (the caller estimates it), -1 where it is not a count at all (a string, a negative number, more
    than MOST_TOKENS)."""
    if value is None:
        return None
    if type(value) is int and 0 <= value <= MOST_TOKENS:
        return value
    if type(value) is float and math.isfinite(value) and 0 <= value <= MOST_TOKENS:
        return round(value)
    return -1


def _snippet(content: bytes) -> str:
    text = " ".join(content[:120].decode("utf-8", "replace").split())
    return redact(text + ("..." if len(content) > 120 else ""))


def _retry_after(headers: Any) -> tuple[float, str] | None:
    """(seconds, the header as given) of a reply's retry-after-ms or Retry-After; None where neither
    is a finite, non-negative number (an HTTP date, "inf", "-1": our own backoff then)."""
    for name, scale in (("retry-after-ms", 0.001), ("Retry-After", 1.0)):
        value = headers.get(name.lower())
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds, f"{name}: {value.strip()[:40]}"
    return None


def retry_wait(headers: Any, backoff: float) -> tuple[float, str]:
    """Seconds to wait before a retry, and why: what the reply's Retry-After asks, up to MAX_WAIT,
    else `backoff`, up to MAX_BACKOFF."""
    told = _retry_after(headers)
    if told is None:
        return min(MAX_BACKOFF, backoff), "the backoff between retries says"
    seconds, header = told
    if seconds > MAX_WAIT:
        return MAX_WAIT, f"its {header} says, capped at {_span(MAX_WAIT)}"
    return seconds, f"its {header} says"


def _span(seconds: float) -> str:
    """A wait as people read it: "45 s", "10 min"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"
