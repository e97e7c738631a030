"""Pacing by the provider's rate-limit headers (farmkit/core/endpoint.py's Pacer), against the local
server in tests/openai_server.py enforcing a requests and a tokens limit over a sliding window: none
over the limit once the headers are known, and no reset waited out that was not needed."""

from __future__ import annotations

import asyncio

import pytest
from openai_server import OpenAIServer, count_tokens

from farmkit.core.endpoint import EndpointClient, duration

WINDOW = 1.5  # seconds: the limits below scaled from a minute to keep the test short
PER_WINDOW = 30  # requests the binding limit lets through per window
REPLY = "Reply with a fixed length."


def _body(i: int) -> dict:
    # prompts of one length (and so of one token count): the client's guess of a request's tokens holds
    return {"model": "m", "messages": [{"role": "user", "content": f"Prompt {i:04d} of the run."}]}


@pytest.mark.parametrize("binding", ["requests", "tokens"])
def test_requests_stay_under_the_limits_the_headers_tell_and_wait_no_needless_reset(binding):
    cost = count_tokens(_body(0)["messages"][0]["content"]) + count_tokens(REPLY)
    limits = {"requests": PER_WINDOW, "tokens": 10**9, "window": WINDOW}
    if binding == "tokens":
        limits = {"requests": 10**6, "tokens": PER_WINDOW * cost, "window": WINDOW}
    total = 2 * PER_WINDOW + 1  # the last one cannot go before two windows have passed

    async def run(url: str) -> list:
        client = EndpointClient(url, None, timeout=5, max_retries=6, backoff=0.05, connections=16)
        try:
            return await asyncio.gather(*(client.complete(_body(i)) for i in range(total)))
        finally:
            await client.close()

    with OpenAIServer(respond=lambda body: REPLY, limits=limits) as server:
        replies = asyncio.run(run(server.url))
    assert len(replies) == total
    assert server.over == 0  # the first reply told the limits: nothing was sent over them
    elapsed = server.admitted[-1] - server.admitted[0]
    ideal = 2 * WINDOW
    # no faster than the limit allows (load only slows a run down), and not a window later: a pacer
    # that waits out one more reset than it needs takes 3 windows or more. (The bound was 10% over
    # the ideal, 3.33 s: runs on 2 busy cores took 3.1-3.25 s, a hair from failing; the slack here,
    # a whole window, is 6 times the most those runs went over the ideal.)
    assert ideal <= elapsed < ideal + WINDOW, elapsed


def test_without_the_headers_nothing_waits():
    async def run(url: str) -> float:
        client = EndpointClient(url, None, timeout=5, max_retries=0, backoff=0.01, connections=8)
        try:
            await asyncio.gather(*(client.complete(_body(i)) for i in range(40)))
            return client.pacer.waits
        finally:
            await client.close()

    with OpenAIServer(respond=lambda body: REPLY) as server:
        assert asyncio.run(run(server.url)) == 0


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("soon", None),
        ("inf", None),  # not a wait: malformed, as are the rest
        ("1e999", None),
        ("nan", None),
        ("-5", None),
        ("Infinity", None),
    ],
)
def test_reset_durations_read_as_openai_writes_them(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("reset", ["inf", "1e999", "nan", "-1"])
def test_a_reset_that_is_not_a_finite_wait_is_ignored_not_a_hang(reset):
    # every reply says nothing is left until a reset that never comes: the header is malformed,
    # so requests go on as without it (a 429 would then be retried with the default backoff)
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": reset}

    async def run(url: str) -> int:
        client = EndpointClient(url, None, timeout=5, max_retries=0, backoff=0.01, connections=1)
        try:
            replies = [await client.complete(_body(i)) for i in range(3)]
            return len(replies)
        finally:
            await client.close()

    with OpenAIServer(respond=lambda body: REPLY, headers=headers) as server:
        assert asyncio.run(asyncio.wait_for(run(server.url), 10)) == 3


@pytest.mark.parametrize("retry_after", [float("inf"), -30.0])
def test_a_retry_after_that_is_not_a_finite_wait_gets_the_default_backoff(retry_after):
    async def run(url: str) -> int:
        client = EndpointClient(url, None, timeout=5, max_retries=2, backoff=0.01, connections=1)
        try:
            return (await client.complete(_body(0))).attempts
        finally:
            await client.close()

    with OpenAIServer(respond=lambda body: REPLY, script=["429"], retry_after=retry_after) as s:
        assert asyncio.run(asyncio.wait_for(run(s.url), 10)) == 2
