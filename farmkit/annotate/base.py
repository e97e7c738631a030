"""The types every judge backend shares: what a backend returns per pair, the two ways a request can fail,
the Backend base class whose class attributes tell the engine how to treat it, and the helpers the
judges that compute P(A better) share (decide, sigmoid)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from farmkit.annotate.cost import Reservation
    from farmkit.annotate.pools import Judge, Pool
    from farmkit.annotate.prompts import Shown


@dataclass
class Verdict:
    """A judge's answer for one pair as shown: choice "A" (shown first), "B", "tie" or None (no verdict)."""

    choice: str | None
    reason: str | None = None
    raw: str | None = None
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    price: float = 0.0
    seconds: float = 0.0
    model: str | None = None
    probability: float | None = None  # P(A is better) where the backend knows it (oracle, local)
    soft: float | None = (
        None  # a soft label where the backend gives one: P(B, shown second, is better)
    )
    attempts: int = 1  # requests it took: replies that could not be parsed are asked again
    parse_failures: int = 0  # of those, replies whose verdict could not be read
    # its tokens include counts the endpoint did not tell (no usage, a timeout), booked at their most
    estimated: bool = False
    # what answered, as the endpoint's reply says (its `model`, its `system_fingerprint`), where it does
    reply_model: str | None = None
    system_fingerprint: str | None = None


class RequestFailed(Exception):
    """A request that failed for good (after its retries, or with an error no retry fixes for this item);
    its items get no verdict, the run goes on. What its attempts were billed (malformed replies that
    reported usage) is priced all the same: tokens and price for the whole request. `over_budget`: a
    retry was not sent because it could exceed --max-cost."""

    def __init__(
        self,
        message: str,
        prompt_tokens: float = 0.0,
        completion_tokens: float = 0.0,
        price: float = 0.0,
        over_budget: bool = False,
        estimated: bool = False,
    ):
        super().__init__(message)
        self.prompt_tokens, self.completion_tokens, self.price = (
            prompt_tokens,
            completion_tokens,
            price,
        )
        self.over_budget, self.estimated = over_budget, estimated


class FatalBackendError(Exception):
    """An error no retry can fix (unknown model, rejected key): the whole run stops."""


class Backend:
    """A judge backend. The class attributes say what it is, so the engine never asks for a name; `identity`
    is computed from the class alone, so a fully cached run builds no backend (and imports no torch or openai)."""

    name: ClassVar[str]
    cacheable: ClassVar[bool] = (
        False  # a verdict costs a request or a forward pass: keep it in the cache
    )
    priced: ClassVar[bool] = False  # requests cost money: the budget applies
    bulk: ClassVar[bool] = (
        False  # in-process and fast: many pairs per call, whatever the judge's batch size
    )
    needs_endpoint: ClassVar[bool] = (
        False  # asks an OpenAI-compatible endpoint that must be configured
    )
    parses: ClassVar[bool] = (
        False  # reads verdicts from a judge's text: records count parse failures
    )
    batched: ClassVar[bool] = False  # may be asked through a Batch API (farm-annotate --batch)

    def __init__(self, pool: Pool, options: dict[str, Any]) -> None:
        self.pool, self.options = pool, options

    @classmethod
    def identity(cls, pool: Pool, judge: Judge, options: dict[str, Any]) -> dict[str, Any]:
        """What, beyond the judge's own settings, decides its verdicts (part of the cache key)."""
        return {}

    @classmethod
    def check(cls, judge: Judge) -> str | None:
        """What is wrong with `judge` for this backend, or None."""
        return None

    @classmethod
    def rereads(cls, judge: Judge) -> bool:
        """Whether a reply of `judge` whose verdict could not be read can be read again later, from its
        text (`reread`): it is then cached as unreadable, and re-read rather than paid for again."""
        return False

    @classmethod
    def reread(cls, judge: Judge, raw: str, position: int, count: int) -> Verdict:
        """The verdict for the pair at `position` of the `count` in a request that `raw` (the reply's
        text) answered, read as the backend reads replies now."""
        raise NotImplementedError

    def model_name(self, judge: Judge) -> str:
        raise NotImplementedError

    async def judge(
        self,
        judge: Judge,
        pairs: list[Shown],
        draws: list[float],
        seed: int,
        reservation: Reservation | None = None,
    ) -> list[Verdict]:
        """Verdicts for `pairs` in one request. `draws` are uniform numbers in [0, 1), one per pair,
        for backends that sample; `seed` is the request's seed for endpoints that accept one;
        `reservation` (priced backends under --max-cost) is the request's hold on the budget, told
        what each attempt was billed and asked before any retry."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop waiting (a SIGINT or SIGTERM ends the run): what waits to be sent or retried is not,
        within seconds; work already under way may finish. Called on the run's event loop."""
        return None

    async def close(self) -> None:
        return None


def decide(probability_a: float, temperature: float, draw: float) -> str:
    """A verdict from P(A better): the likelier side at temperature 0 (ties stay ties), else a draw."""
    if temperature == 0:
        if probability_a == 0.5:
            return "tie"
        return "A" if probability_a > 0.5 else "B"
    return "A" if draw < probability_a else "B"


def sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exp = math.exp(value)
    return exp / (1.0 + exp)
