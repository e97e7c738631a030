"""farm-split: split instruction data into AlpacaFarm's sft / pref / unlabeled / val splits."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from farmkit.cli import (
    common_options,
    entry_point,
    field_options,
    input_argument,
    log,
    seed_option,
    tool_config,
)
from farmkit.core.io import FarmError, RecordWriter, display_name, read_records
from farmkit.core.provenance import provenance, stamp
from farmkit.core.split import SplitConfig, assign


@click.command(name="farm-split")
@input_argument("instructions")
@field_options(SplitConfig)
@seed_option
@common_options
def cli(instructions, seed, **values):
    """Split INSTRUCTIONS (instruction records; Alpaca JSON or JSONL, `-` for stdin) into disjoint
    splits. Each record's split comes from a seeded hash of its instruction and input, so appending
    records never moves the others to another split (see farmkit/core/split.py). Records with the same
    instruction and input are reported on stderr and always land in the same split.

    \b
    farm-split alpaca_data.json -o splits/
    farm-split data.jsonl --tag --sizes train=0.9,val=0.1 --seed 1
    """
    config = tool_config(SplitConfig, values)
    output_dir, tag, sizes = config.output_dir, config.tag, config.sizes
    if bool(output_dir) == tag:
        raise click.UsageError(
            "give exactly one of -o DIR (one file per split) or --tag (records on stdout)"
        )
    records = list(read_records(instructions, "instruction"))
    result = assign(records, sizes, seed=seed, exact=config.exact)
    name = display_name(instructions)
    for index, first in result.duplicates[:5]:
        log.warning(
            f"farm-split: {name}: record {index + 1} repeats record {first + 1} (same instruction and input); kept in one split"
        )
    if len(result.duplicates) > 5:
        log.warning(f"farm-split: {name}: {len(result.duplicates)} duplicate records in all")
    left_out = sum(split is None for split in result.assignment)
    summary = ", ".join(f"{split} {count}" for split, count in result.counts.items())
    log.info(
        f"farm-split: {len(records)} records: {summary}"
        + (f", in no split {left_out}" if left_out else "")
    )
    info = provenance(
        "farm-split",
        seed,
        sizes=",".join(f"{n}={v:g}" for n, v in zip(sizes.names, sizes.values, strict=True)),
        exact=config.exact or None,
    )
    if tag:
        with RecordWriter("-") as writer:
            for record, split in zip(records, result.assignment, strict=True):
                record["split"] = split
                writer.write(stamp(record, "farm-split", info))
        return
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise FarmError(f"{folder}: exists and is not a folder")
    # every file is written to a temporary name first and renamed only once all are complete
    with contextlib.ExitStack() as stack:
        writers = {
            split: stack.enter_context(RecordWriter(folder / f"{split}.jsonl"))
            for split in sizes.names
        }
        for record, split in zip(records, result.assignment, strict=True):
            if split is not None:
                writers[split].write(stamp(record, "farm-split", info))


main = entry_point(cli)

if __name__ == "__main__":
    main()
