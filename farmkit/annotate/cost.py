"""Prices and token estimates: prompt and completion tokens priced separately, per model, from a table
users can override (a pool's `prices:` or `--prices FILE`), and the pre-flight estimate of a run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from farmkit.io import FarmError

# USD per million tokens (prompt, completion), public list prices at the time of writing.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-3.5-turbo": (0.50, 1.50),
}

CHARS_PER_TOKEN = (
    4.0  # a rough English average; estimates only, records carry the endpoint's counts
)
# Bounds for the budget, which must not under-count: BPE tokenizers give English about 4 characters a token
# and seldom fewer than 2.5; a character outside ASCII (Chinese, Japanese, emoji) takes one to three tokens.
WORST_CHARS_PER_TOKEN = 2.5
WORST_TOKENS_PER_WIDE_CHAR = 3.0
EXPECTED_COMPLETION_TOKENS = {"plain": 8, "ranking": 10, "json": 45, "choice": 1}  # per pair


def estimate_tokens(text: str) -> int:
    """The expected token count: ASCII at 4 characters a token, any other character a token of its own
    (chars / 4 alone under-counted Chinese text 2.4 times)."""
    wide = _wide_chars(text)
    return math.ceil((len(text) - wide) / CHARS_PER_TOKEN + wide)


def most_tokens(text: str) -> int:
    """A token count the endpoint's will hardly exceed: what the budget reserves for a prompt."""
    wide = _wide_chars(text)
    return math.ceil((len(text) - wide) / WORST_CHARS_PER_TOKEN + wide * WORST_TOKENS_PER_WIDE_CHAR)


def _wide_chars(text: str) -> int:
    return len(text) - len(text.encode("ascii", "ignore"))


class PriceTable:
    def __init__(self, overrides: dict[str, Any] | None = None):
        self.table = dict(PRICES)
        self.unpriced: set[str] = set()
        for model, entry in (overrides or {}).items():
            self.table[model] = _parse_entry(model, entry)

    @classmethod
    def from_file(cls, path: str | None, pool_prices: dict[str, Any]) -> PriceTable:
        overrides = dict(pool_prices)
        if path:
            import yaml

            try:
                loaded = yaml.safe_load(Path(path).read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise FarmError(f"{path}: cannot read the price table ({exc})") from None
            if not isinstance(loaded, dict):
                raise FarmError(
                    f"{path}: expected a mapping model -> {{prompt: USD per 1M, completion: USD per 1M}}"
                )
            overrides.update(loaded)
        return cls(overrides)

    def price(self, model: str, prompt_tokens: float, completion_tokens: float) -> float:
        """The price in USD; a model without a price costs 0 and is reported in the summary."""
        rates = self.table.get(model)
        if rates is None:
            self.unpriced.add(model)
            return 0.0
        return (prompt_tokens * rates[0] + completion_tokens * rates[1]) / 1e6


def _parse_entry(model: str, entry: Any) -> tuple[float, float]:
    if isinstance(entry, dict) and {"prompt", "completion"} <= set(entry):
        return float(entry["prompt"]), float(entry["completion"])
    if isinstance(entry, (list, tuple)) and len(entry) == 2:
        return float(entry[0]), float(entry[1])
    raise FarmError(
        f"price of {model}: expected {{prompt: USD per 1M tokens, completion: USD per 1M tokens}}"
    )


MESSAGE_TOKENS = 4  # what a chat message costs beyond its text (role, delimiters)


class Budget:
    """--max-cost while requests run. Each request in flight holds the most its next attempt could be
    billed, so that requests running together cannot overshoot the cap: the prompt at the highest
    billed tokens per UTF-8 byte this run has seen for the model (until a first reply reports usage,
    a token per byte, which no tokenizer exceeds), and the completion at max_tokens. A retry (of a
    reply that was billed but malformed, or of a failure) must fit again before it is sent."""

    def __init__(self, cap: float, prices: PriceTable):
        self.cap, self.prices = cap, prices
        self.spent = 0.0  # what replies were billed, priced
        self.held = 0.0  # what the requests in flight may still be billed
        self.per_byte: dict[str, float] = {}  # model -> highest billed prompt tokens per byte seen

    def worst_prompt(self, model: str, size: int, messages: int, bound: int) -> int:
        """The prompt tokens to hold for a prompt of `size` UTF-8 bytes in `messages` messages (at
        least `bound`, the character-based worst case)."""
        rate = self.per_byte.get(model, 1.0)
        return max(bound, math.ceil(size * rate) + MESSAGE_TOKENS * messages)

    def learn(self, model: str, prompt_tokens: float, size: int) -> None:
        """One attempt at a prompt of `size` bytes was billed `prompt_tokens`: later holds follow the
        highest rate seen."""
        if prompt_tokens > 0 and size > 0:
            rate = prompt_tokens / size
            if model not in self.per_byte:
                self.per_byte[model] = rate
            else:
                self.per_byte[model] = max(self.per_byte[model], rate)

    def pay(self, price: float) -> None:
        self.spent += price

    def reserve(
        self, model: str, size: int, messages: int, bound: int, max_completion: int
    ) -> Reservation | None:
        """A hold for one request's first attempt, or None when it does not fit under the cap."""
        reservation = Reservation(self, model, size, messages, bound, max_completion)
        hold = reservation.attempt_price()
        if self.spent + self.held + hold > self.cap:
            return None
        reservation.hold, self.held = hold, self.held + hold
        return reservation


class Reservation:
    """One request's hold on the budget, from its first attempt to its release."""

    def __init__(
        self, budget: Budget, model: str, size: int, messages: int, bound: int, max_completion: int
    ):
        self.budget, self.model = budget, model
        self.size, self.messages, self.bound, self.max_completion = (
            size,
            messages,
            bound,
            max_completion,
        )
        self.hold = 0.0
        self.billed = (0.0, 0.0)  # tokens reported so far, over every attempt

    def prompt_bound(self) -> int:
        """The most prompt tokens an attempt is expected to be billed."""
        return self.budget.worst_prompt(self.model, self.size, self.messages, self.bound)

    def attempt_price(self) -> float:
        return self.budget.prices.price(self.model, self.prompt_bound(), self.max_completion)

    def update(self, prompt_tokens: float, completion_tokens: float) -> None:
        """The tokens the request's attempts were billed so far (cumulative): the prompt tokens of the
        attempt since the last update teach the budget how densely this model bills."""
        self.budget.learn(self.model, prompt_tokens - self.billed[0], self.size)
        self.billed = (prompt_tokens, completion_tokens)

    def retry_fits(self, prompt_tokens: float, completion_tokens: float) -> bool:
        """Before a retry: hold what was billed so far plus another worst case, if that fits."""
        self.update(prompt_tokens, completion_tokens)
        billed = self.budget.prices.price(self.model, prompt_tokens, completion_tokens)
        hold = billed + self.attempt_price()
        budget = self.budget
        if budget.spent + budget.held - self.hold + hold > budget.cap:
            return False
        budget.held += hold - self.hold
        self.hold = hold
        return True

    def release(self) -> None:
        self.budget.held -= self.hold
        self.hold = 0.0
