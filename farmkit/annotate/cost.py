"""Prices and token estimates: prompt and completion tokens priced separately, per model, from a table
users can override (a pool's `prices:` or `--prices FILE`), and the pre-flight estimate of a run (a
text's token count: farmkit.lm.tokens)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError

# USD per million tokens (prompt, completion), public list prices at the time of writing.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4-1106-preview": (10.00, 30.00),
    "gpt-3.5-turbo": (0.50, 1.50),
}

EXPECTED_COMPLETION_TOKENS = {"plain": 8, "ranking": 10, "json": 45, "choice": 1}  # per pair

# What a request sent through a Batch API costs, as a share of its direct price: OpenAI bills
# batches at half its list prices; a prices file's `batch:` sets another share for one model.
BATCH_FACTOR = 0.5


class PriceTable:
    def __init__(self, overrides: dict[str, Any] | None = None):
        self.table = dict(PRICES)
        self.batch_factor: dict[str, float] = {}  # model -> its own share, where it has one
        self.unpriced: set[str] = set()
        for model, entry in (overrides or {}).items():
            self.table[model] = _parse_entry(model, entry)
            if isinstance(entry, dict) and "batch" in entry:
                self.batch_factor[model] = _batch_factor(model, entry["batch"])

    @classmethod
    def from_file(cls, path: str | None, pool_prices: dict[str, Any]) -> PriceTable:
        overrides = dict(pool_prices)
        if path:
            import yaml

            from farmkit.core.yamltext import safe_yaml

            try:
                text = Path(path).read_text()
                loaded = safe_yaml(text)
            except (OSError, yaml.YAMLError) as exc:
                raise FarmError(f"{path}: cannot read the price table ({exc})") from None
            if not isinstance(loaded, dict):
                raise BadPrices(
                    f"{path}: expected a mapping model -> {{prompt: USD per 1M, completion: USD per 1M}}"
                )
            lines = _lines(text)
            for model, entry in loaded.items():
                try:
                    cls({model: entry})
                except FarmError as exc:
                    where = f"{path}:{lines[model]}" if model in lines else path
                    raise BadPrices(f"{where}: {exc}") from None
            overrides.update(loaded)
        return cls(overrides)

    def price(
        self, model: str, prompt_tokens: float, completion_tokens: float, batch: bool = False
    ) -> float:
        """The price in USD (`batch`: sent through a Batch API, at the model's batch factor); a
        model without a price costs 0 and is reported in the summary."""
        rates = self.table.get(model)
        if rates is None:
            self.unpriced.add(model)
            return 0.0
        factor = self.batch_factor.get(model, BATCH_FACTOR) if batch else 1.0
        return factor * (prompt_tokens * rates[0] + completion_tokens * rates[1]) / 1e6


# USD per million tokens: a dollar a token; a price above it is a typo (the dearest models cost well
# under $1,000 per million)
MOST_PRICE = 1_000_000.0


class BadPrices(FarmError):
    """A prices file that does not hold prices: a usage error (exit 2), named with its line."""

    exit_code = 2


def _lines(text: str) -> dict[Any, int]:
    """The line (1-based) of each top-level key of a YAML mapping."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value}


def _parse_entry(model: str, entry: Any) -> tuple[float, float]:
    if isinstance(entry, dict) and {"prompt", "completion"} <= set(entry):
        return _rate(model, "prompt", entry["prompt"]), _rate(
            model, "completion", entry["completion"]
        )
    if isinstance(entry, (list, tuple)) and len(entry) == 2:
        return _rate(model, "prompt", entry[0]), _rate(model, "completion", entry[1])
    raise FarmError(
        f"price of {model}: expected {{prompt: USD per 1M tokens, completion: USD per 1M tokens}}"
    )


def _rate(model: str, name: str, value: Any) -> float:
    """A price in USD per million tokens: a finite number from 0 to MOST_PRICE (a NaN, a negative or
    an infinite price would silently undo --max-cost)."""
    rate = value if type(value) in (int, float) else math.nan
    if not 0 <= rate <= MOST_PRICE:
        shown = {math.inf: ".inf", -math.inf: "-.inf"}.get(value, value)
        if isinstance(value, float) and math.isnan(value):
            shown = ".nan"
        raise FarmError(
            f"price of {model}: {name} {shown}: expected USD per 1M tokens, a number from 0 to "
            f"{MOST_PRICE:,.0f}"
        )
    return float(rate)


def _batch_factor(model: str, value: Any) -> float:
    try:
        factor = float(value)
    except (TypeError, ValueError):
        factor = math.nan
    if not 0 < factor <= 1:
        raise FarmError(
            f"price of {model}: batch {value!r}: expected the share of the direct price a batch "
            "costs, a number in (0, 1] (OpenAI: 0.5)"
        )
    return factor


MESSAGE_TOKENS = 4  # what a chat message costs beyond its text (role, delimiters), as expected

# What --max-cost relies on, from above: a cap is a promise, so what the budget holds for a request
# and books for a reply whose bill it was not told must never be less than what the endpoint bills.
# Byte-level BPE tokenizers (GPT, Llama 3, Qwen, SmolLM) and byte-fallback ones (Llama 2, Mistral)
# never make more tokens of a text than it has UTF-8 bytes; the chat template adds its markers
# around each message and, once per request, what some templates add (a default system prompt, a
# date line, the assistant's header). An endpoint that bills more than this is learned from its
# first reported usage (see Budget.learn).
WORST_TOKENS_PER_BYTE = 1
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_PER_REQUEST = 48


def prompt_bound(messages: list[dict[str, str]]) -> int:
    """The most prompt tokens an endpoint can bill for `messages` (chat messages)."""
    return TEMPLATE_TOKENS_PER_REQUEST + sum(
        WORST_TOKENS_PER_BYTE * len(m["content"].encode()) + TEMPLATE_TOKENS_PER_MESSAGE
        for m in messages
    )


class Budget:
    """--max-cost while requests run: a request is sent only if the most it can be billed fits in
    what the cap leaves, counting what every request in flight may still be billed. A request holds
    its worst case (the prompt at `prompt_bound`, the completion at max_tokens) from before it is
    sent to its release; a retry must fit again before it is sent. What is spent is what replies
    were billed (their usage) and, for attempts whose bill is unknown (a reply without usage, a
    timeout, a dropped connection: the endpoint may have billed them), their worst case."""

    def __init__(self, cap: float, prices: PriceTable):
        self.cap, self.prices = cap, prices
        self.spent = 0.0  # what replies were billed, priced (unknown bills at their worst case)
        self.held = 0.0  # what the requests in flight may still be billed
        self.holding = 0  # requests in flight (holds not yet released)
        # model -> the most prompt tokens an attempt was billed beyond its prompt_bound
        self.extra: dict[str, int] = {}

    def worst_prompt(self, model: str, bound: int) -> int:
        """The prompt tokens to hold for a prompt whose `prompt_bound` is `bound`."""
        return bound + self.extra.get(model, 0)

    def learn(self, model: str, prompt_tokens: float, bound: int) -> None:
        """One attempt at a prompt bounded by `bound` was billed `prompt_tokens`: an endpoint that
        bills more than the bound (a template longer than allowed for) raises later holds. Holds
        are never lowered by what a reply shows: the next prompt may be denser."""
        if prompt_tokens > bound + self.extra.get(model, 0):
            self.extra[model] = math.ceil(prompt_tokens - bound)

    def pay(self, price: float) -> None:
        self.spent += price

    def reserve(self, model: str, bound: int, max_completion: int) -> Reservation | None:
        """A hold for one request's first attempt, or None when it does not fit under the cap now."""
        reservation = Reservation(self, model, bound, max_completion)
        hold = reservation.attempt_price()
        if self.spent + self.held + hold > self.cap:
            return None
        reservation.hold, self.held = hold, self.held + hold
        self.holding += 1
        return reservation


class Reservation:
    """One request's hold on the budget, from its first attempt to its release."""

    def __init__(self, budget: Budget, model: str, bound: int, max_completion: int):
        self.budget, self.model = budget, model
        self.bound, self.max_completion = bound, max_completion
        self.hold = 0.0
        self.billed = (0.0, 0.0)  # tokens reported so far, over every attempt

    def prompt_bound(self) -> int:
        """The most prompt tokens one attempt can be billed."""
        return self.budget.worst_prompt(self.model, self.bound)

    def attempt_price(self) -> float:
        return self.budget.prices.price(self.model, self.prompt_bound(), self.max_completion)

    def update(self, prompt_tokens: float, completion_tokens: float) -> None:
        """The tokens the request's attempts were billed so far (cumulative): the prompt tokens of
        the attempt since the last update may teach the budget a larger template."""
        self.budget.learn(self.model, prompt_tokens - self.billed[0], self.bound)
        self.billed = (prompt_tokens, completion_tokens)

    def retry_fits(self, prompt_tokens: float, completion_tokens: float, unknown: int = 0) -> bool:
        """Before a retry: hold what was billed so far (`unknown` attempts whose bill was not told at
        their worst case) plus another worst case, if that fits."""
        self.update(prompt_tokens, completion_tokens)
        billed = self.budget.prices.price(self.model, prompt_tokens, completion_tokens)
        hold = billed + (unknown + 1) * self.attempt_price()
        budget = self.budget
        if budget.spent + budget.held - self.hold + hold > budget.cap:
            return False
        budget.held += hold - self.hold
        self.hold = hold
        return True

    def release(self) -> None:
        budget = self.budget
        budget.holding -= 1
        # nothing in flight: nothing held (no float residue from the sums)
        budget.held = budget.held - self.hold if budget.holding else 0.0
        self.hold = 0.0
