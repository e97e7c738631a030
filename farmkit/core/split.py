"""Splitting instruction data into AlpacaFarm's splits (sft / pref / unlabeled / val), stably.

Each record gets a position u in [0, 1) from a seeded SHA-256 of its content (instruction and input,
whitespace-normalized). Records with the same content are one group: they share u and so always
land in the same split (and are reported as duplicates).

Default (stable) mode: the split is the interval of [0, 1) that u falls in, with widths proportional
to the split sizes. An input smaller than the sizes' total is used whole, each split getting its
proportional share in expectation (binomial noise: about sqrt(n) records). From the total on, a
split given an absolute size keeps only its `size` groups of smallest u. A record's split therefore
never changes when records are appended: at most it drops out of a full split.
Exact mode: groups are ordered by u and cut at the scaled sizes: sizes are exact, but appending
records can move the records near a cut into the next split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from farmkit.core.fields import help_field
from farmkit.core.seeds import unit_interval
from farmkit.core.values import POSITIVE, check_number

DEFAULT_SIZES = {"sft": 10_000, "pref": 10_000, "unlabeled": 20_000, "val": 2_000}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Sizes:
    """Split names in order with their sizes: absolute counts (integers) or fractions of the input."""

    names: tuple[str, ...]
    values: tuple[float, ...]
    fractions: bool

    def targets(self, n: int) -> list[int]:
        """The number of records each split should hold for an input of n records."""
        if self.fractions:
            shares = [n * v for v in self.values]
        elif n >= sum(self.values):
            return [int(v) for v in self.values]
        else:
            total = sum(self.values)
            shares = [n * v / total for v in self.values]
        # largest remainder, so the targets add up to the rounded total
        floors = [int(s) for s in shares]
        left = round(sum(shares)) - sum(floors)
        order = sorted(range(len(shares)), key=lambda i: (floors[i] - shares[i], i))
        for i in order[:left]:
            floors[i] += 1
        return floors

    def widths(self) -> list[float]:
        """The share of [0, 1) that each split's interval covers in stable mode."""
        if self.fractions:
            return list(self.values)
        total = sum(self.values)
        return [v / total for v in self.values]


def parse_sizes(text: str) -> Sizes:
    """Parse `sft=10000,pref=10000,...` (counts) or `train=0.9,val=0.1` (fractions, sum <= 1)."""
    names, values = [], []
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not _NAME.match(name.strip()):
            raise ValueError(
                f"{part.strip()!r} is not NAME=SIZE; expected e.g. sft=10000,pref=10000 or train=0.9,val=0.1"
            )
        try:
            number = check_number(value, float, POSITIVE)
        except ValueError:
            raise ValueError(
                f"size of {name.strip()!r} is {value!r}; expected a positive count or fraction"
            ) from None
        names.append(name.strip())
        values.append(number)
    if len(set(names)) != len(names):
        raise ValueError("a split is named twice")
    fractions = all(v < 1 or (v == 1 and "." in text) for v in values)
    if fractions:
        if sum(values) > 1 + 1e-9:
            raise ValueError(f"fractions add up to {sum(values):g}; expected at most 1")
    elif any(v != int(v) for v in values):
        raise ValueError(
            "sizes mix counts and fractions; expected all counts (sft=10000) or all fractions (sft=0.25)"
        )
    return Sizes(tuple(names), tuple(values), fractions)


DEFAULT_SIZES_TEXT = ",".join(f"{name}={size}" for name, size in DEFAULT_SIZES.items())


@dataclass
class SplitConfig:
    """farm-split's settings (its options; --seed is the shared one)."""

    output_dir: str | None = help_field(
        None,
        "Write DIR/<split>.jsonl, one file per split (each atomically).",
        flags=("-o", "--output"),
        aliases=("--output-dir",),
        path={"file_okay": False},
    )
    tag: bool = help_field(
        False,
        "Write every record to stdout with a `split` field (null: in no split).",
        flag=True,
    )
    sizes: Sizes = help_field(
        DEFAULT_SIZES_TEXT,
        "Split names and sizes: counts (scaled down proportionally for a smaller input) or fractions (train=0.9,val=0.1).",
        parse=parse_sizes,
    )
    exact: bool = help_field(
        False,
        "Exact sizes, at the price of stability: appending records may move records near a cut.",
        flag=True,
    )

    def __post_init__(self) -> None:
        if isinstance(self.sizes, str):  # built in Python: the text --sizes takes
            self.sizes = parse_sizes(self.sizes)


def content_key(record: dict[str, Any]) -> str:
    """What makes two instruction records duplicates: the same instruction and input, whitespace aside."""
    instruction = " ".join(str(record.get("instruction", "")).split())
    given = " ".join(str(record.get("input") or "").split())
    return f"{instruction}\x00{given}"


def position(key: str, seed: int) -> float:
    """A record's place in [0, 1): a seeded hash of its content, independent of every other record."""
    return unit_interval(seed, key, sep="\x00")


@dataclass
class SplitResult:
    assignment: list[str | None]  # the split of each record, in input order (None: left out)
    duplicates: list[
        tuple[int, int]
    ]  # (index of a duplicate record, index of its first occurrence)
    counts: dict[str, int]


def assign(
    records: Sequence[dict[str, Any]], sizes: Sizes, seed: int = 0, exact: bool = False
) -> SplitResult:
    """Assign each record to a split (or to none), duplicates always together."""
    first_of: dict[str, int] = {}
    group_of: list[int] = []
    duplicates = []
    for index, record in enumerate(records):
        key = content_key(record)
        if key in first_of:
            duplicates.append((index, first_of[key]))
        else:
            first_of[key] = index
        group_of.append(first_of[key])
    members: dict[int, int] = {}
    for first in group_of:
        members[first] = members.get(first, 0) + 1
    order = sorted(members, key=lambda first: (position(content_key(records[first]), seed), first))
    targets = sizes.targets(len(records))
    split_of_group: dict[int, str | None] = {}
    filled = dict.fromkeys(sizes.names, 0)
    if exact:
        bounds, running = [], 0
        for target in targets:
            running += target
            bounds.append(running)
        placed = 0
        for first in order:
            slot = next((i for i, bound in enumerate(bounds) if placed < bound), None)
            split_of_group[first] = None if slot is None else sizes.names[slot]
            if slot is not None:
                placed += members[first]
    else:
        edges, running = [], 0.0
        for width in sizes.widths():
            running += width
            edges.append(running)
        if edges[-1] > 1 - 1e-9:  # shares that add up to 1 cover all of [0, 1), rounding aside
            edges[-1] = 1.0
        capped = not sizes.fractions and len(records) >= sum(sizes.values)
        for first in order:
            u = position(content_key(records[first]), seed)
            slot = next((i for i, edge in enumerate(edges) if u < edge), None)
            name = None if slot is None else sizes.names[slot]
            if name is not None and capped and filled[name] >= targets[slot]:
                name = None
            if name is not None:
                filled[name] += members[first]
            split_of_group[first] = name
    assignment = [split_of_group[first] for first in group_of]
    counts = dict.fromkeys(sizes.names, 0)
    for name in assignment:
        if name is not None:
            counts[name] += 1
    return SplitResult(assignment, duplicates, counts)
