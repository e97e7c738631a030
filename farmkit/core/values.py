"""The one check of a numeric setting (an option, a --config key, a config field): a finite number
of the right kind (a whole number where one is counted), inside the range its declaration gives.

The range lives with the declaration (a config field's metadata, farmkit.cli's SHARED, a tool's
click option) and both the options and the configs call `check_number`, so a flag, a YAML key and
a config built in Python are refused alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The allowed range of a number: min and max (None: unbounded), each open or closed."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False

    def contains(self, number: float) -> bool:
        if self.min is not None and (number <= self.min if self.min_open else number < self.min):
            return False
        return self.max is None or (number < self.max if self.max_open else number <= self.max)

    def describe(self) -> str:
        """The range as a reader writes it: '> 0', '>= 1', 'in [0, 0.5]', '' when unbounded."""
        if self.min is not None and self.max is not None:
            left, right = "(" if self.min_open else "[", ")" if self.max_open else "]"
            return f"in {left}{_plain(self.min)}, {_plain(self.max)}{right}"
        if self.min is not None:
            return f"{'>' if self.min_open else '>='} {_plain(self.min)}"
        if self.max is not None:
            return f"{'<' if self.max_open else '<='} {_plain(self.max)}"
        return ""


UNBOUNDED = Bounds()
POSITIVE = Bounds(min=0, min_open=True)
NON_NEGATIVE = Bounds(min=0)
AT_LEAST_ONE = Bounds(min=1)
FRACTION = Bounds(0, 1)


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def expected(kind: type, bounds: Bounds = UNBOUNDED) -> str:
    """What a value of this kind and range must be, in words: 'a finite number > 0'."""
    noun = "a whole number" if kind is int else "a finite number"
    described = bounds.describe()
    return f"{noun} {described}" if described else noun


def check_number(value: Any, kind: type, bounds: Bounds = UNBOUNDED) -> int | float:
    """`value` (a number, or its text from a flag) as `kind` (int or float) when it is finite, whole
    for an int, and inside `bounds`; else ValueError saying what was expected.

    A bool, a list or a mapping is refused rather than coerced (YAML's `true` is not 1), and so is a
    fractional value for a count (int(1.5) would silently make it 1)."""
    want = expected(kind, bounds)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not {want}")
    try:
        number = _parse(value) if isinstance(value, str) else value
    except ValueError:
        raise ValueError(f"{value!r} is not {want}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"{value!r} is not {want}")
    if kind is int:
        if isinstance(number, float) and not number.is_integer():
            raise ValueError(f"{value!r} is not {want}")
        number = int(number)
    else:
        number = float(number)
    if not bounds.contains(number):
        raise ValueError(f"{value!r} is not {want}")
    return number


def _parse(text: str) -> int | float:
    try:
        return int(text)  # exact, where float() would round a long count
    except ValueError:
        return float(text)


@dataclasses.dataclass(frozen=True)
class Number:
    """A numeric setting's declaration: its kind (int or float) and range."""

    kind: type
    bounds: Bounds = UNBOUNDED

    def check(self, value: Any) -> int | float:
        return check_number(value, self.kind, self.bounds)


def finite_json(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, tuples, scalars) with every NaN or infinity replaced by None:
    json.dumps would write them as NaN and Infinity, which is not JSON (a metric can be NaN where
    nothing was measured, as a held-out accuracy with no held-out pair)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value
