"""What farm-annotate judges: pairs read from pair records, from consecutive output records for the same
instruction (farm-sample writes its n samples per prompt one after the other), or from output
records joined with a reference file (the reference in position 1, as in evaluation)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from farmkit.io import RecordError, display_name, iter_json, read_records
from farmkit.validate import problems

log = logging.getLogger("farmkit")

# fields that describe one output, not the pair built from two of them
_PER_OUTPUT = ("output", "generator", "sample_index", "reward", "reward_model", "provenance")


@dataclass
class Item:
    record: dict[str, Any]  # the preference record so far: the pair's fields and whatever passes through

    @property
    def instruction(self) -> str:
        return self.record["instruction"]

    @property
    def input(self) -> str:
        return self.record.get("input") or ""

    @property
    def output_1(self) -> str:
        return self.record["output_1"]

    @property
    def output_2(self) -> str:
        return self.record["output_2"]


def read_items(path: str, reference: str | None = None) -> list[Item]:
    """Read and validate every input record, then form the pairs (nothing is judged yet)."""
    name = display_name(path)
    records: list[tuple[int, dict[str, Any]]] = []
    kind = None
    for line, record in iter_json(path):
        if kind is None:
            kind = "pair" if isinstance(record, dict) and ("output_1" in record or "output_2" in record) else "output"
            if reference is not None and kind == "pair":
                raise RecordError(name, line, "--reference pairs output records with the reference; this is a pair record "
                                              "(expected fields instruction, output, generator)")
        problem = problems(record, kind)
        if problem:
            raise RecordError(name, line, problem)
        records.append((line, record))
    if kind == "pair":
        return [Item(_pair_record(record)) for _, record in records]
    if reference is not None:
        return _with_reference(name, records, reference)
    return _consecutive(name, records)


def _pair_record(record: dict[str, Any]) -> dict[str, Any]:
    pair = {"instruction": record["instruction"], "input": record.get("input") or ""}
    pair.update((key, value) for key, value in record.items() if key not in pair)
    return pair


def _join(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A pair record from two output records; fields the two share (id, dataset...) pass through, and so
    does the second record's provenance (the model under evaluation, with a reference)."""
    record: dict[str, Any] = {
        "instruction": second["instruction"], "input": second.get("input") or "",
        "output_1": first["output"], "output_2": second["output"],
        "generator_1": first["generator"], "generator_2": second["generator"],
    }
    for key, value in second.items():
        if key not in record and key not in _PER_OUTPUT and key != "input" and first.get(key) == value:
            record[key] = value
    for side, source in (("1", first), ("2", second)):
        if "sample_index" in source:
            record[f"sample_index_{side}"] = source["sample_index"]
    if isinstance(second.get("provenance"), dict):
        record["provenance"] = second["provenance"]
    return record


def _consecutive(name: str, records: list[tuple[int, dict[str, Any]]]) -> list[Item]:
    items: list[Item] = []
    left_over = 0
    position = 0
    while position < len(records):
        line, first = records[position]
        if position + 1 < len(records):
            _, second = records[position + 1]
            if (first["instruction"], first.get("input") or "") == (second["instruction"], second.get("input") or ""):
                items.append(Item(_join(first, second)))
                position += 2
                continue
        left_over += 1
        position += 1
    if records and not items:
        raise RecordError(name, records[0][0], "no pairs: output records pair up when consecutive records share an "
                                               "instruction (farm-sample -n 2); for evaluation pass --reference FILE")
    if left_over:
        log.warning("farm-annotate: %d output record(s) in %s had no partner (an odd number of outputs for an "
                    "instruction) and were left out", left_over, name)
    return items


def _with_reference(name: str, records: list[tuple[int, dict[str, Any]]], reference: str) -> list[Item]:
    references: dict[tuple[str, str], dict[str, Any]] = {}
    for record in read_records(reference, "output"):
        references.setdefault((record["instruction"], record.get("input") or ""), record)
    items = []
    for line, record in records:
        found = references.get((record["instruction"], record.get("input") or ""))
        if found is None:
            raise RecordError(name, line, f"no reference output in {reference} for this instruction "
                                          f"({record['instruction'][:50]!r}); expected one with the same instruction and input")
        items.append(Item(_join(found, record)))
    return items
