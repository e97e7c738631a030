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

CHARS_PER_TOKEN = 4.0  # a rough English average; estimates only, records carry the endpoint's counts
EXPECTED_COMPLETION_TOKENS = {"plain": 8, "ranking": 10, "json": 45, "choice": 1}  # per pair


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


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
                raise FarmError(f"{path}: expected a mapping model -> {{prompt: USD per 1M, completion: USD per 1M}}")
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
    raise FarmError(f"price of {model}: expected {{prompt: USD per 1M tokens, completion: USD per 1M tokens}}")
