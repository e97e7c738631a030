"""The `openai` backend: any OpenAI-compatible chat-completions endpoint (OpenAI, `vllm serve`,
llama.cpp's server, Ollama) through farmkit's endpoint client (farmkit/endpoint.py), which retries
transient failures, malformed replies included, and stops the run on errors retrying cannot fix.

Concurrency is bounded by the engine (one slot per request, held while backing off). The key comes
from OPENAI_API_KEY and is never written anywhere: what the endpoint says (errors, replies kept in
records) passes through `farmkit.endpoint.redact` first.
"""

from __future__ import annotations

import time
from typing import Any

from farmkit.annotate.base import Backend, FatalBackendError, RequestFailed, Verdict
from farmkit.annotate.cost import PriceTable, Reservation, prompt_bound
from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown, load_template, parse_verdicts
from farmkit.endpoint import EndpointClient, EndpointFailed, EndpointFatal, redact
from farmkit.endpoint import configured as endpoint  # the engine imports it from here


def base_url() -> str:
    """The endpoint's base URL as requests go to it (OpenAI's when OPENAI_BASE_URL is unset)."""
    return (endpoint()[0] or "https://api.openai.com/v1").rstrip("/")


class OpenAIBackend(Backend):
    name = "openai"
    cacheable = True
    priced = True
    needs_endpoint = True
    parses = True

    @classmethod
    def identity(cls, pool: Pool, judge: Judge, options: dict[str, Any]) -> dict[str, Any]:
        """Where it is asked, the concrete model, the prompt's text and the examples shown, the parser."""
        import dataclasses

        from farmkit.annotate import prompts

        fields = {
            "endpoint": base_url(),
            "model": pool.model_for(judge),
            "template": prompts.load_template(judge.prompt).text,
            "parser": prompts.PARSER_VERSION,
        }
        if (
            judge.examples
        ):  # the examples it is shown, so editing one re-asks only the judges that see it
            fields["worked_examples"] = [
                dataclasses.asdict(e) for e in prompts.worked_examples()[: judge.examples]
            ]
        return fields

    @classmethod
    def check(cls, judge: Judge) -> str | None:
        return None if judge.tier or judge.model else "an openai judge needs a tier or a model"

    def __init__(self, pool: Pool, options: dict[str, Any]):
        self.pool = pool
        self.settings = pool.settings
        self.prices: PriceTable = options["prices"]
        base_url, api_key = endpoint()
        self.client = EndpointClient(
            base_url,
            api_key,
            timeout=float(self.settings["timeout"]),
            max_retries=int(self.settings["max_retries"]),
            backoff=float(self.settings["backoff"]),
            connections=int(self.settings["concurrency"]),
            connect_timeout=float(self.settings["connect_timeout"]),
        )
        self.stats = self.client.stats

    def model_name(self, judge: Judge) -> str:
        model = self.pool.model_for(judge)
        assert model is not None  # checked when the pool was loaded
        return model

    async def judge(
        self,
        judge: Judge,
        pairs: list[Shown],
        draws: list[float],
        seed: int,
        reservation: Reservation | None = None,
    ) -> list[Verdict]:
        template = load_template(judge.prompt)
        model = self.model_name(judge)
        messages = template.messages(pairs, judge.examples)
        # what an attempt whose bill is not told is booked at: the most it can be billed
        worst_prompt = prompt_bound(messages) if reservation is None else reservation.prompt_bound()
        started = time.perf_counter()
        try:
            reply = await self.client.complete(
                {
                    "model": model,
                    "messages": messages,
                    "temperature": judge.temperature,
                    "max_tokens": judge.max_tokens,
                    "seed": seed,
                },
                before_retry=None if reservation is None else reservation.retry_fits,
            )
        except EndpointFatal as exc:
            raise FatalBackendError(str(exc)) from None
        except EndpointFailed as exc:
            prompt = exc.usage[0] + exc.unknown * worst_prompt
            completion = exc.usage[1] + exc.unknown * judge.max_tokens
            raise RequestFailed(
                str(exc),
                prompt,
                completion,
                self.prices.price(model, prompt, completion),
                over_budget=exc.over_budget,
                estimated=exc.unknown > 0,
            ) from None
        elapsed = time.perf_counter() - started
        if reservation is not None:
            reservation.update(reply.prompt_tokens, reply.completion_tokens)
        # the tokens of every attempt, malformed replies included: each was billed; a count the
        # endpoint did not tell is booked at its most (the prompt's bound, max_tokens), so that the
        # budget never counts less than was billed
        unknown = reply.unknown_attempts
        prompt_tokens = reply.prompt_tokens + (unknown + reply.prompt_unreported) * worst_prompt
        completion_tokens = (
            reply.completion_tokens + (unknown + reply.completion_unreported) * judge.max_tokens
        )
        price = self.prices.price(model, prompt_tokens, completion_tokens)
        choices, reason = parse_verdicts(template.format, reply.text, len(pairs), template)
        # kept in the records of pairs without a verdict: an endpoint may echo the key in its reply
        raw = redact(reply.text, self.client.api_key or "") if None in choices else None
        share = len(pairs)
        return [
            Verdict(
                choice,
                reason=None if choice else (reason or "no verdict"),
                raw=None if choice else raw,
                estimated=bool(unknown or reply.prompt_unreported or reply.completion_unreported),
                prompt_tokens=prompt_tokens / share,
                completion_tokens=completion_tokens / share,
                price=price / share,
                seconds=elapsed / share,
                model=model,
            )
            for choice in choices
        ]

    async def close(self) -> None:
        await self.client.close()
