"""farm-convert: records to and from TRL's formats (JSONL or Parquet) and Label Studio's JSON."""

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
    seed_option,
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
    write_text,
)
from farmkit.core.label_studio import (
    LABEL_STUDIO_CONFIG,
    is_label_studio_export,
    label_studio_records,
    label_studio_tasks,
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
@seed_option
@common_options
def cli(records, output, seed, **values):
    """Convert RECORDS between farmkit's record kinds and TRL's dataset formats.

    Every farm-* tool already reads TRL, hh-rlhf and chat `messages` files directly; this command
    writes them out (for TRL's trainers or HF datasets) and normalises them in. Preferences go out as
    prompt/chosen/rejected, instructions and outputs as prompt/completion; a soft label is kept in
    `farmkit_preference`, where chosen stood in `farmkit_chosen`, and every other field (generator,
    id, input, ...) in a column of its own, which TRL ignores, so the rows read back as the records
    they came from. Ties and null verdicts
    are left out and counted. `-o FILE.parquet` writes Parquet.

    Label Studio, for teams that label there: `--to label-studio` writes pairs as tasks to import
    (and --label-config the labeling config they are made for); its JSON export, read with the
    default --to farmkit, gives one preference record per annotation (annotator, preference 1, 2
    or 1.5, strength, shown, seconds, time), as farm-label writes them.

    \b
      farm-convert prefs.jsonl --to trl -o prefs.trl.parquet
      farm-convert hh_rlhf_train.jsonl --kind preference -o prefs.jsonl
      farm-convert pairs.jsonl --to label-studio --label-config config.xml -o tasks.json
      farm-convert project-1-export.json -o labels.jsonl
    """
    config = tool_config(ConvertConfig, values)
    target, kind = config.target, config.kind
    if config.label_config and target != "label-studio":
        raise click.UsageError("--label-config goes with --to label-studio")
    name = display_name(records)
    raw = list(iter_rows(records))
    if target == "label-studio":
        pairs = (pair for _, pair in numbered_records(raw, name, "pair"))
        write_text(label_studio_tasks(pairs, seed), output)
        if config.label_config:
            write_text(LABEL_STUDIO_CONFIG, config.label_config)
        return
    if not raw:
        return
    if target == "farmkit" and is_label_studio_export(raw[0][1]):
        with RecordWriter(output) as writer:
            writer.write_all(label_studio_records(raw, name))
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
