"""Seeds and stable hashes: every seed farmkit derives from (seed, item, purpose) and every hash that
names a configuration come from here, so two tools never derive the same thing two ways.

No torch here: tools import it at module level.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def seeded_digest(seed: int, *parts: Any, sep: str = ":") -> bytes:
    """SHA-256 of the seed and the parts, written as text and joined by `sep`: the same inputs give
    the same bytes on every machine and Python version (unlike hash())."""
    return hashlib.sha256(sep.join(str(part) for part in (seed, *parts)).encode()).digest()


def derive_seed(seed: int, *parts: Any) -> int:
    """A 31-bit seed for one purpose (an item, a sample, a round), independent of every other purpose
    and of the order in which they are drawn (adding 1 to the seed would collide with the next run's)."""
    return int.from_bytes(seeded_digest(seed, *parts)[:4], "little") & 0x7FFFFFFF


def unit_interval(seed: int, *parts: Any, sep: str = ":") -> float:
    """A uniform number in [0, 1) for one decision about one item."""
    return int.from_bytes(seeded_digest(seed, *parts, sep=sep)[:8], "big") / 2**64


def stable_hash(value: Any) -> str:
    """SHA-256 (hex) of a JSON-serialisable value with sorted keys: configurations, cache keys."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()
