"""What farm-annotate judges: pairs read from pair records, from consecutive output records for the same
instruction (farm-sample writes its n samples per prompt one after the other), or from output
records joined with a reference file (the reference in position 1, as in evaluation)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from farmkit.core.formats import generator_stand_in, log_stand_in
from farmkit.core.io import FarmError, RecordError, bad_records, open_rows, read_records
from farmkit.core.validate import problems

log = logging.getLogger("farmkit")

# fields that describe one output, not the pair built from two of them
_PER_OUTPUT = ("output", "generator", "sample_index", "reward", "reward_model", "provenance")


@dataclass
class Item:
    record: dict[
        str, Any
    ]  # the preference record so far: the pair's fields and whatever passes through

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


def read_items(
    paths: str | list[str] | tuple[str, ...],
    reference: str | None = None,
    generators: list[str] | tuple[str, ...] = (),
    skip_missing: bool = False,
) -> list[Item]:
    """Read and validate every input record of every file, then form the pairs (nothing is judged
    yet). Pairs never span two files. `generators`: one name for every file's output records that
    carry no `generator` (AlpacaFarm's published outputs have none), or one name per file, in order.
    `skip_missing`: an output record whose instruction the reference lacks is left out (counted on
    stderr) instead of stopping the run."""
    paths = [paths] if isinstance(paths, str) else list(paths or ["-"])
    if len(generators) > 1 and len(generators) != len(paths):
        raise FarmError(
            f"{len(generators)} --generator names for {len(paths)} input files; expected one name "
            "for all of them or one per file, in order"
        )
    references = _references(reference) if reference is not None else None
    items: list[Item] = []
    missing = 0
    for index, path in enumerate(paths):
        generator = generators[0 if len(generators) == 1 else index] if generators else None
        name, kind, records = _read_file(path, reference, generator)
        if kind == "pair":
            items.extend(Item(_pair_record(record)) for _, record in records)
        elif references is not None:
            found, skipped = _with_reference(name, records, reference, references, skip_missing)
            items.extend(found)
            missing += skipped
        else:
            items.extend(_consecutive(name, records))
    if missing:
        log.warning(
            "farm-annotate: skipped %d output record(s) with no reference output in %s "
            "(--skip-missing)",
            missing,
            reference,
        )
    return items


def _read_file(
    path: str, reference: str | None, generator: str | None
) -> tuple[str, str | None, list[tuple[int, dict[str, Any]]]]:
    name, rows = open_rows(path)  # a file, or a Hugging Face dataset (a name or a folder)
    records: list[tuple[int, dict[str, Any]]] = []
    kind = None
    for line, record in rows:
        if kind is None:
            kind = (
                "pair"
                if isinstance(record, dict) and ("output_1" in record or "output_2" in record)
                else "output"
            )
            if reference is not None and kind == "pair":
                raise RecordError(
                    name,
                    line,
                    "--reference pairs output records with the reference; this is a pair record "
                    "(expected fields instruction, output, generator)",
                )
        if (
            kind == "output"
            and isinstance(record, dict)
            and "generator" not in record
            and "output" in record
        ):
            if generator is None and path != "-":
                # AlpacaFarm's published outputs name no generator: the file's name stands in, as
                # it does for --reference and farm-convert
                generator = generator_stand_in(name)
                log_stand_in(name)
            if generator is not None:
                record["generator"] = generator
        problem = problems(record, kind)
        if problem:
            if kind == "output" and "'generator'" in problem and generator is None:
                problem += " (name the system of a file without one with --generator NAME)"
            bad_records().reject(RecordError(name, line, problem))  # raises, unless --on-error skip
            continue
        records.append((line, record))
    bad_records().finish(name, len(records))
    return name, kind, records


def _pair_record(record: dict[str, Any]) -> dict[str, Any]:
    pair = {"instruction": record["instruction"], "input": record.get("input") or ""}
    pair.update((key, value) for key, value in record.items() if key not in pair)
    return pair


def _join(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A pair record from two output records; fields the two share (id, dataset...) pass through, and so
    does the second record's provenance (the model under evaluation, with a reference)."""
    record: dict[str, Any] = {
        "instruction": second["instruction"],
        "input": second.get("input") or "",
        "output_1": first["output"],
        "output_2": second["output"],
        "generator_1": first["generator"],
        "generator_2": second["generator"],
    }
    for key, value in second.items():
        if (
            key not in record
            and key not in _PER_OUTPUT
            and key != "input"
            and first.get(key) == value
        ):
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
            if (first["instruction"], first.get("input") or "") == (
                second["instruction"],
                second.get("input") or "",
            ):
                items.append(Item(_join(first, second)))
                position += 2
                continue
        left_over += 1
        position += 1
    if records and not items:
        raise RecordError(
            name,
            records[0][0],
            "no pairs: output records pair up when consecutive records share an "
            "instruction (farm-sample -n 2); for evaluation pass --reference FILE",
        )
    if left_over:
        log.warning(
            "farm-annotate: %d output record(s) in %s had no partner (an odd number of outputs for an "
            "instruction) and were left out",
            left_over,
            name,
        )
    return items


def _references(reference: str) -> dict[tuple[str, str], dict[str, Any]]:
    references: dict[tuple[str, str], dict[str, Any]] = {}
    for record in read_records(reference, "output"):
        references.setdefault((record["instruction"], record.get("input") or ""), record)
    return references


def _with_reference(
    name: str,
    records: list[tuple[int, dict[str, Any]]],
    reference: str,
    references: dict[tuple[str, str], dict[str, Any]],
    skip_missing: bool = False,
) -> tuple[list[Item], int]:
    items = []
    missing = 0
    for line, record in records:
        found = references.get((record["instruction"], record.get("input") or ""))
        if found is None:
            if skip_missing:
                missing += 1
                continue
            raise RecordError(
                name,
                line,
                f"no reference output in {reference} for this instruction "
                f"({record['instruction'][:50]!r}); expected one with the same instruction and "
                "input (--skip-missing leaves such records out)",
            )
        items.append(Item(_join(found, record)))
    return items, missing
