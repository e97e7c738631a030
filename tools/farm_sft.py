"""farm-sft: fine-tune a model on demonstrations (loss on the response only), or on preference pairs
with Binary FeedME (--from-preferences) or binary reward conditioning (--reward-conditioning)."""

from __future__ import annotations

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    field_options,
    input_argument,
    log,
    model_dir_option,
    on_error_option,
    resolve_config,
    split_option,
    tool_config,
)
from farmkit.core.io import FarmError, display_name, read_numbered, read_records
from farmkit.methods.sft import SFTConfig, SFTData


@click.command(name="farm-sft")
@click.argument("model")
@input_argument("demos")
@model_dir_option("output_dir")
@field_options(SFTData)
@config_options(SFTConfig)
@on_error_option
@split_option
@common_options
def cli(model, demos, output_dir, config_file, **values):
    """Fine-tune MODEL on DEMOS (instruction, input, output records) and write the model to -o DIR.

    MODEL is `embedded`, a model folder, a .gguf file or a hub id. Prompts are formatted exactly as
    farm-sample formats them (see --template), and the response ends with the end-of-sequence token.
    Options can also come from --config FILE.yaml (flags given here win).

    \b
    Examples:
      farm-sft embedded splits/sft.jsonl -o sft/ --epochs 3
      farm-sft sft/ prefs.jsonl -o feedme/ --from-preferences
      farm-sft sft/ prefs.jsonl -o conditioned/ --reward-conditioning --lora
    """
    data = tool_config(SFTData, values)
    config = resolve_config(SFTConfig, config_file, values)

    name = display_name(demos)
    meta_extra = {"tool": "farm-sft", "inputs": {}}
    if data.from_preferences or data.reward_conditioning:
        from farmkit.core.records import comparisons
        from farmkit.methods.sft import conditioning_examples, feedme_examples

        items, counts = comparisons(read_records(demos, "preference"), source=name)
        if data.from_preferences:
            examples, mode = feedme_examples(items), "binary-feedme"
        else:
            examples, mode = (
                conditioning_examples(items, data.positive_token, data.negative_token),
                "reward-conditioning",
            )
            meta_extra["sampling_control_token"] = data.positive_token
            meta_extra["control_tokens"] = {
                "positive": data.positive_token,
                "negative": data.negative_token,
            }
        log.info(
            "%s: %d pairs used, %d ties and %d null verdicts left out",
            name,
            counts["used"],
            counts["tie"],
            counts["null"],
        )
    else:
        mode = "demonstrations"
        examples = []
        for where, record in read_numbered(demos, "instruction"):  # where: FILE:LINE
            if not isinstance(record.get("output"), str) or not record["output"].strip():
                raise FarmError(
                    f"{where}: the demonstration has no output; expected an `output` text to train on"
                )
            example = {
                "instruction": record["instruction"],
                "input": record.get("input") or "",
                "output": record["output"],
            }
            if record.get("messages"):  # a multi-turn prompt (farmkit.core.formats)
                example["messages"] = record["messages"]
            examples.append(example)
    if not examples:
        raise FarmError(f"{name}: no demonstrations to train on")
    meta_extra["mode"] = mode

    from farmkit.lm.models import file_sha256
    from farmkit.methods.sft import train_sft

    meta_extra["inputs"] = {name: file_sha256(demos)}
    log.info("farm-sft: %s on %d demonstrations (%s) -> %s", model, len(examples), mode, output_dir)
    summary = train_sft(model, examples, output_dir, config, meta_extra=meta_extra)
    log.info(
        "farm-sft: %d steps, mean training loss %.4f; wrote %s",
        summary["steps"],
        summary["train_loss"],
        output_dir,
    )


main = entry_point(cli)

if __name__ == "__main__":
    main()
