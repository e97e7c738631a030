"""The `openai` backend: any OpenAI-compatible chat-completions endpoint (OpenAI, `vllm serve`,
llama.cpp's server, Ollama) through farmkit's endpoint client (farmkit/core/endpoint.py), which retries
transient failures, malformed replies included, and stops the run on errors retrying cannot fix.

A judge whose pool sets `top_logprobs: N` is weighted: it asks for the N likeliest tokens of the
reply's first position and its verdict is the share of the answer shown second among the two
verdict tokens (see `weighted_verdict`), a fractional preference rather than a parsed letter.

Concurrency is bounded by the engine (one slot per request, held while backing off). The key comes
from OPENAI_API_KEY and is never written anywhere: what the endpoint says (errors, replies kept in
records) passes through `farmkit.core.endpoint.redact` first.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from farmkit.annotate.base import Backend, FatalBackendError, RequestFailed, Verdict
from farmkit.annotate.cost import PriceTable, Reservation, prompt_bound
from farmkit.annotate.parse import parse_verdicts
from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown, load_template
from farmkit.core.endpoint import EndpointClient, EndpointFailed, EndpointFatal, redact
from farmkit.core.endpoint import configured as endpoint  # the engine imports it from here


def base_url() -> str:
    """The endpoint's base URL as requests go to it (OpenAI's when OPENAI_BASE_URL is unset)."""
    return (endpoint()[0] or "https://api.openai.com/v1").rstrip("/")


class OpenAIBackend(Backend):
    name = "openai"
    cacheable = True
    priced = True
    needs_endpoint = True
    parses = True
    batched = True

    @classmethod
    def identity(cls, pool: Pool, judge: Judge, options: dict[str, Any]) -> dict[str, Any]:
        """Where it is asked, the concrete model, the prompt's text and the examples shown, the parser."""
        import dataclasses

        from farmkit.annotate import parse, prompts

        fields = {
            "endpoint": base_url(),
            "model": pool.model_for(judge),
            "template": prompts.load_template(judge.prompt).text,
            "parser": parse.KEYED_VERSION,
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
        if not (judge.tier or judge.model):
            return "an openai judge needs a tier or a model"
        if judge.top_logprobs:
            if not 1 <= judge.top_logprobs <= MOST_TOP_LOGPROBS:
                return f"top_logprobs must be between 1 and {MOST_TOP_LOGPROBS} (0: not weighted)"
            if judge.batch_size != 1:
                return "a weighted judge (top_logprobs) needs batch_size 1: one verdict token per reply"
            if load_template(judge.prompt).format != "choice":
                return (
                    "a weighted judge (top_logprobs) needs a `choice` prompt (one letter, A or B)"
                )
        return None

    @classmethod
    def rereads(cls, judge: Judge) -> bool:
        return (
            not judge.top_logprobs
        )  # a weighted judge's verdict is in log-probabilities, not text

    @classmethod
    def reread(cls, judge: Judge, raw: str, position: int, count: int) -> Verdict:
        from farmkit.annotate import parse  # by module: the parser as it is now

        template = load_template(judge.prompt)
        choices, reason = parse.parse_verdicts(template.format, raw, count, template)
        choice = choices[position]
        return Verdict(choice, reason=None if choice else (reason or "no verdict"))

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
            max_reply_bytes=int(self.settings["max_reply_bytes"]),
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
                request_body(judge, model, messages, seed),
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
        read = read_reply(
            judge, reply.text, reply.logprobs, len(pairs), self.client.base_url, self.client.api_key
        )
        share = len(pairs)
        return [
            dataclasses.replace(
                verdict,
                estimated=bool(unknown or reply.prompt_unreported or reply.completion_unreported),
                prompt_tokens=prompt_tokens / share,
                completion_tokens=completion_tokens / share,
                price=price / share,
                seconds=elapsed / share,
                model=model,
                # what the endpoint says, kept in records: redacted as its other words are
                reply_model=reply.reply_model and redact(reply.reply_model, self.client.api_key),
                system_fingerprint=reply.system_fingerprint
                and redact(reply.system_fingerprint, self.client.api_key),
            )
            for verdict in read
        ]

    def stop(self) -> None:
        self.client.stop()

    async def close(self) -> None:
        await self.client.close()


def request_body(
    judge: Judge, model: str, messages: list[dict[str, str]], seed: int
) -> dict[str, Any]:
    """The chat-completions request that asks `judge` (sent directly, or as a line of a batch)."""
    return {
        "model": model,
        "messages": messages,
        "temperature": judge.temperature,
        "max_tokens": judge.max_tokens,
        "seed": seed,
        **({"logprobs": True, "top_logprobs": judge.top_logprobs} if judge.top_logprobs else {}),
    }


def read_reply(
    judge: Judge, text: str, logprobs: Any, pairs: int, endpoint: str, api_key: str | None
) -> list[Verdict]:
    """The verdicts (choice, reason, raw, probability, soft; no tokens or price) a reply to a
    request of `pairs` pairs gives, however it came (directly, or a line of a batch's output)."""
    if judge.top_logprobs:
        verdict = weighted_verdict(logprobs, endpoint, judge)
        if verdict.reason:  # it quotes the endpoint's tokens, which may echo the key
            verdict.reason = redact(verdict.reason, api_key or "")
        read = [verdict]
    else:
        template = load_template(judge.prompt)
        choices, reason = parse_verdicts(template.format, text, pairs, template)
        read = [Verdict(choice, reason=reason) for choice in choices]
    # kept in the records of pairs without a verdict: an endpoint may echo the key in its reply
    raw = redact(text, api_key or "") if any(not v.choice for v in read) else None
    return [
        Verdict(
            verdict.choice,
            reason=None if verdict.choice else (verdict.reason or "no verdict"),
            raw=None if verdict.choice else raw,
            probability=verdict.probability,
            soft=verdict.soft,
        )
        for verdict in read
    ]


MOST_TOP_LOGPROBS = 20  # the most OpenAI's chat completions give
VERDICT_TOKENS = ("A", "B")  # the answer shown first, second


def weighted_verdict(
    logprobs: Any, endpoint: str = "the endpoint", judge: Judge | None = None
) -> Verdict:
    """The verdict a weighted judge's reply means: at the reply's first non-blank position, the
    probabilities of the listed tokens that read "A" or "B" once stripped of spaces (spellings of one
    letter add up; a letter not listed counts as 0), and P(B) = P(B) / (P(A) + P(B)) as `soft` (the
    answer shown second is better), P(A) as `probability`, the likelier letter as `choice`. Neither
    letter listed: no verdict. A reply without log-probabilities is an error no retry fixes."""
    positions = logprobs.get("content") if isinstance(logprobs, dict) else None
    listed = _top_of_first_word(positions) if isinstance(positions, list) else None
    if listed is None:
        asked = f"top_logprobs: {judge.top_logprobs}" if judge else "top_logprobs"
        raise FatalBackendError(
            f"{endpoint} returned no log-probabilities for the verdict token (judge "
            f"{judge.name if judge else '?'} asks for logprobs with {asked}); use an endpoint that "
            "gives them (OpenAI, vLLM) or a pool whose judges parse the reply's text"
        )
    mass = dict.fromkeys(VERDICT_TOKENS, 0.0)
    for entry in listed:
        token, logprob = entry.get("token"), entry.get("logprob")
        if isinstance(token, str) and token.strip() in mass and isinstance(logprob, int | float):
            if not logprob <= 0:  # NaN, or above 0: a probability past 1 (exp(1000) overflows)
                return Verdict(
                    None,
                    reason=f"the reply is not valid: {token!r} has log-probability {logprob} "
                    "(a log-probability is at most 0)",
                )
            mass[token.strip()] += math.exp(logprob) if logprob > -9999 else 0.0
    total = mass["A"] + mass["B"]
    if total <= 0:
        shown = ", ".join(repr(e.get("token")) for e in listed[:MOST_TOP_LOGPROBS])
        return Verdict(None, reason=f"neither verdict token (A, B) among the top tokens ({shown})")
    second = mass["B"] / total
    choice = "tie" if mass["A"] == mass["B"] else ("B" if second > 0.5 else "A")
    return Verdict(choice, probability=round(1 - second, 6), soft=round(second, 6))


def _top_of_first_word(positions: list[Any]) -> list[dict[str, Any]] | None:
    """The top tokens listed at the first position whose token is not blank (the first, if all are)."""
    usable = [
        p for p in positions if isinstance(p, dict) and isinstance(p.get("top_logprobs"), list)
    ]
    if not usable or not any(isinstance(e, dict) for e in usable[0]["top_logprobs"]):
        return None
    for position in usable:
        if str(position.get("token") or "").strip():
            return [e for e in position["top_logprobs"] if isinstance(e, dict)]
    return [e for e in usable[0]["top_logprobs"] if isinstance(e, dict)]
