"""Conversions between record kinds that several tools need: preference verdicts as training targets,
chosen/rejected pairs (TRL's prompt/chosen/rejected), and pairs from consecutive outputs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from farmkit.core.io import RecordError

TIE = 1.5


def preference_target(preference: float | None) -> float | None:
    """P(output_2 is better) for a verdict: 1 -> 0, 2 -> 1, 1.5 (or AlpacaEval's legacy 0) -> 0.5,
    fractional values in [1, 2] -> soft labels; None (no verdict) -> None."""
    if preference is None:
        return None
    if preference == 0:
        return 0.5
    if not 1 <= preference <= 2:
        raise ValueError(f"preference {preference!r} is outside [1, 2]")
    return float(preference) - 1.0


def mirrored_record(record: dict[str, Any]) -> dict[str, Any]:
    """A pair record with its outputs (and their per-output fields) swapped."""
    swapped = dict(record)
    for name in ("output", "generator", "family", "sample_index", "len"):
        first, second = f"{name}_1", f"{name}_2"
        if first in record or second in record:
            swapped[first], swapped[second] = record.get(second), record.get(first)
    return swapped


def pair_texts(record: dict[str, Any], source: str, number: int) -> tuple[str, str, str, str]:
    """A preference record's instruction, input ("" when absent) and two output texts; a RecordError
    naming line `number` of `source` when it lacks the outputs (AlpacaEval's compact annotations keep
    only their lengths)."""
    output_1, output_2 = record.get("output_1"), record.get("output_2")
    if not isinstance(output_1, str) or not isinstance(output_2, str):
        raise RecordError(
            source, number, "the preference has no output texts; expected output_1 and output_2"
        )
    return record.get("instruction", ""), record.get("input") or "", output_1, output_2


@dataclass(frozen=True)
class Comparison:
    """One usable verdict: target is P(output_2 better) in [0, 1]."""

    instruction: str
    input: str
    output_1: str
    output_2: str
    target: float
    messages: Any = (
        None  # a multi-turn prompt (the conversation before the reply), when the record has one
    )
    # whether output_1 and output_2 ended with their end token (False: cut at the length limit, as
    # the record's finished_1/finished_2 say; records without them count as finished)
    finished: tuple[bool, bool] = (True, True)

    @property
    def chosen(self) -> str:
        return self.output_2 if self.target > 0.5 else self.output_1

    @property
    def rejected(self) -> str:
        return self.output_1 if self.target > 0.5 else self.output_2


def comparisons(
    records: Iterable[dict[str, Any]], source: str = "<input>", ties: str = "drop"
) -> tuple[list[Comparison], Counter]:
    """Turn preference records into comparisons, counting what was left out and why.

    ties="drop" leaves out exact ties (target 0.5); ties="half" keeps them with target 0.5.
    Null verdicts are always left out and counted as `null`. Records without both output texts are
    an error (AlpacaEval's compact annotations cannot be trained on).
    """
    if ties not in ("drop", "half"):
        raise ValueError("ties must be 'drop' or 'half'")
    kept: list[Comparison] = []
    counts: Counter = Counter()
    for number, record in enumerate(records, start=1):
        texts = pair_texts(record, source, number)
        target = preference_target(record.get("preference"))
        if target is None:
            counts["null"] += 1
            continue
        if target == 0.5 and ties == "drop":
            counts["tie"] += 1
            continue
        counts["used"] += 1
        kept.append(
            Comparison(
                *texts,
                target,
                record.get("messages") or None,
                (record.get("finished_1") is not False, record.get("finished_2") is not False),
            )
        )
    return kept, counts


def chosen_rejected(items: Iterable[Comparison]) -> Iterator[dict[str, Any]]:
    """Comparisons as instruction/input/chosen/rejected dicts (ties, if any were kept, are skipped)."""
    for item in items:
        if item.target != 0.5:
            pair = {
                "instruction": item.instruction,
                "input": item.input,
                "chosen": item.chosen,
                "rejected": item.rejected,
            }
            if item.messages:
                pair["messages"] = item.messages
            # an answer cut at the length limit: DPO trains it without an end token
            second_chosen = item.target > 0.5
            for side, finished in (
                ("chosen", item.finished[1] if second_chosen else item.finished[0]),
                ("rejected", item.finished[0] if second_chosen else item.finished[1]),
            ):
                if not finished:
                    pair[f"{side}_finished"] = False
            yield pair
