"""farm-convert: records to and from TRL's formats (JSONL or Parquet)."""

from __future__ import annotations

import click

from farmkit.cli import (
    common_options,
    entry_point,
    field_options,
    input_argument,
    log,
    on_error_option,
    output_option,
    tool_config,
)
from farmkit.core.formats import ConvertConfig, FormatError, to_trl
from farmkit.core.io import (
    FarmError,
    RecordError,
    RecordWriter,
    atomic_path,
    display_name,
    iter_rows,
    numbered_records,
)


def guess_kind(record: object) -> str:
    if isinstance(record, dict) and any(k in record for k in ("output_1", "chosen", "rejected")):
        return "preference"
    if (
        isinstance(record, dict)
        and "generator" in record
        and any(key in record for key in ("output", "completion", "messages"))
    ):
        return "output"
    return "instruction"


@click.command(name="farm-convert")
@input_argument("records")
@output_option
@field_options(ConvertConfig)
@on_error_option
@common_options
def cli(records, output, **values):
    """Convert RECORDS between farmkit's record kinds and TRL's dataset formats.

    Every farm-* tool already reads TRL, hh-rlhf and chat `messages` files directly; this command
    writes them out (for TRL's trainers or HF datasets) and normalises them in. Preferences go out as
    prompt/chosen/rejected, instructions and outputs as prompt/completion; a soft label is kept in
    `farmkit_preference`, where chosen stood in `farmkit_chosen`, and every other field (generator,
    id, input, ...) in a column of its own, which TRL ignores, so the rows read back as the records
    they came from. Ties and null verdicts
    are left out and counted. `-o FILE.parquet` writes Parquet.

    \b
      farm-convert prefs.jsonl --to trl -o prefs.trl.parquet
      farm-convert hh_rlhf_train.jsonl --kind preference -o prefs.jsonl
    """
    config = tool_config(ConvertConfig, values)
    target, kind = config.target, config.kind
    name = display_name(records)
    raw = list(iter_rows(records))
    if not raw:
        return
    chosen_kind = guess_kind(raw[0][1]) if kind == "auto" else kind
    rows, skipped = [], 0
    for number, record in numbered_records(raw, name, chosen_kind):
        if target == "farmkit":
            rows.append(record)
            continue
        try:
            row = to_trl(record, chosen_kind, conversational=target == "trl-chat")
        except FormatError as exc:
            raise RecordError(name, number, str(exc)) from None
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    if skipped:
        log.info(
            "farm-convert: left out %d tie(s) or null verdict(s): TRL's preference format has no place for them",
            skipped,
        )
    log.info("farm-convert: %d %s record(s) -> %s", len(rows), chosen_kind, target)
    if str(output).endswith(".parquet"):
        write_parquet(rows, output)
        return
    with RecordWriter(output) as writer:
        writer.write_all(rows)


def write_parquet(rows: list[dict], path: str) -> None:
    try:
        import pyarrow
        import pyarrow.parquet as parquet
    except ImportError:
        raise FarmError("writing Parquet needs `pip install pyarrow`") from None
    with atomic_path(path) as tmp:
        columns = list(
            dict.fromkeys(key for row in rows for key in row)
        )  # from_pylist sees only the first row's
        parquet.write_table(
            pyarrow.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]),
            str(tmp),
        )


main = entry_point(cli)

if __name__ == "__main__":
    main()
