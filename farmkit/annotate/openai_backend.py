"""The `openai` backend: any OpenAI-compatible chat-completions endpoint (OpenAI, `vllm serve`,
llama.cpp's server, Ollama) through the `openai` package's AsyncOpenAI.

Concurrency is bounded by the engine (one slot per request, held while backing off); the client's own retries are off so that ours can honour
Retry-After (and retry-after-ms) on 429 and 5xx, back off exponentially on timeouts and dropped
connections, and stop the whole run at once on errors retrying cannot fix (unknown model, rejected
key, forbidden). The key comes from OPENAI_API_KEY and is never written anywhere.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from typing import Any

from farmkit.annotate.backends import FatalBackendError, RequestFailed, Verdict
from farmkit.annotate.cost import PriceTable
from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown, load_template, parse_verdicts

MAX_BACKOFF = 60.0


def endpoint() -> tuple[str | None, str | None]:
    """(base URL, API key) from the standard environment variables; None where unset."""
    return os.environ.get("OPENAI_BASE_URL") or None, os.environ.get("OPENAI_API_KEY") or None


class OpenAIBackend:
    bulk = False
    priced = True

    def __init__(self, pool: Pool, options: dict[str, Any]):
        import openai

        self.pool = pool
        self.settings = pool.settings
        self.prices: PriceTable = options["prices"]
        base_url, api_key = endpoint()
        self.base_url = base_url or "https://api.openai.com/v1"
        # a local server (vLLM, llama.cpp) needs no key, but the client insists on one
        self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key or "no-key", max_retries=0,
                                         timeout=float(self.settings["timeout"]))
        self.stats = {"requests": 0, "retries": 0, "answered": 0}

    def model_name(self, judge: Judge) -> str:
        model = self.pool.model_for(judge)
        assert model is not None  # checked when the pool was loaded
        return model

    async def judge(self, judge: Judge, pairs: list[Shown], draws: list[float], seed: int) -> list[Verdict]:
        template = load_template(judge.prompt)
        model = self.model_name(judge)
        messages = template.messages(pairs, judge.examples)
        started = time.perf_counter()
        response = await self._create(model=model, messages=messages, temperature=judge.temperature,
                                      max_tokens=judge.max_tokens, seed=seed)
        elapsed = time.perf_counter() - started
        replies = response.get("choices") or [{}]
        text = (replies[0].get("message") or {}).get("content") or ""
        usage = response.get("usage") or {}
        prompt_tokens, completion_tokens = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        price = self.prices.price(model, prompt_tokens, completion_tokens)
        choices, reason = parse_verdicts(template.format, text, len(pairs))
        share = len(pairs)
        return [
            Verdict(choice, reason=None if choice else (reason or "no verdict"), raw=text,
                    prompt_tokens=prompt_tokens / share, completion_tokens=completion_tokens / share,
                    price=price / share, seconds=elapsed / share, model=model)
            for choice in choices
        ]

    async def _create(self, **request: Any) -> Any:
        import openai

        attempts = int(self.settings["max_retries"]) + 1
        unreachable = False
        for attempt in range(attempts):
            wait, unreachable = None, False
            self.stats["requests"] += 1
            try:
                # the client's generic post: the same HTTP, auth and error classes as chat.completions.create,
                # without its per-request type-driven transformation, which cost ~8 ms of CPU per request
                response = await self.client.post("/chat/completions", body=request, cast_to=dict)
                self.stats["answered"] += 1
                return response
            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                raise FatalBackendError(
                    f"the endpoint {self.base_url} refused the request (HTTP {exc.status_code}): "
                    "check OPENAI_API_KEY and OPENAI_BASE_URL") from None
            except openai.NotFoundError:
                raise FatalBackendError(
                    f"the endpoint {self.base_url} has no model {request['model']!r} (HTTP 404); "
                    "map the pool's tiers to models it serves with --model NAME or --model TIER=NAME") from None
            except openai.APIStatusError as exc:
                if exc.status_code != 429 and exc.status_code < 500 and exc.status_code != 408:
                    raise RequestFailed(f"HTTP {exc.status_code}: {_short(exc.message)}") from None
                last = f"HTTP {exc.status_code}"
                wait = _retry_after(exc.response)
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                last = type(exc).__name__
                unreachable = not isinstance(exc, openai.APITimeoutError)
            if attempt + 1 < attempts:
                self.stats["retries"] += 1
                backoff = float(self.settings["backoff"]) * 2**attempt * (0.5 + random.random())
                await asyncio.sleep(min(MAX_BACKOFF, wait if wait is not None else backoff))
        if unreachable and not self.stats["answered"]:
            # never reached at all, through every retry: a wrong address, not a passing fault
            raise FatalBackendError(f"cannot connect to {self.base_url} (after {attempts} attempts); check OPENAI_BASE_URL")
        raise RequestFailed(f"{last} after {attempts} attempts")

    async def close(self) -> None:
        await self.client.close()


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None


def _short(text: str) -> str:
    """An endpoint's error message for a record or a log: short, and with anything like a key blanked
    (OpenAI's own messages quote part of a rejected key)."""
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        text = text.replace(key, "***")
    text = re.sub(r"\bsk-[\w*-]+", "sk-***", text)
    return text if len(text) <= 200 else text[:197] + "..."
