"""farm-dpo: train a policy from preference records with Direct Preference Optimization."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    input_argument,
    on_error_option,
    output_dir_option,
    resolve_config,
    split_option,
)
from farmkit.core.io import FarmError, display_name, read_records
from farmkit.methods.dpo import DPOConfig, dpo_pairs

log = logging.getLogger("farmkit")


@click.command(name="farm-dpo")
@click.argument("sft")
@input_argument("prefs")
@output_dir_option
@config_options(DPOConfig)
@on_error_option
@split_option
@common_options
def cli(sft: str, prefs: str, output: str, config_file: str | None, **values) -> None:
    """Fine-tune SFT on PREFS (preference records) with DPO; write the policy to -o DIR.

    The SFT model is the starting point and the frozen reference. Each verdict becomes a
    prompt/chosen/rejected pair, the prompt formatted as farm-sample formats it; ties and null
    verdicts are left out and counted. SFT is a model folder, a hub id or `embedded`.

    \b
    Example:
      farm-dpo sft/ prefs.jsonl -o dpo/ --beta 0.1 --epochs 2
    """
    config = resolve_config(DPOConfig, config_file, values)
    records = list(read_records(prefs, "preference"))
    if not records:
        raise FarmError(f"{display_name(prefs)}: no preference records to train on")
    pairs, counts = dpo_pairs(records, display_name(prefs))
    log.info(
        "%d pairs (%d ties and %d null verdicts left out)",
        len(pairs),
        counts.get("tie", 0),
        counts.get("null", 0),
    )
    if not pairs:
        raise FarmError(f"{display_name(prefs)}: no usable pairs: every verdict is a tie or null")
    from farmkit.annotate.run import gold_pool
    from farmkit.methods.dpo import train_dpo

    metrics = train_dpo(
        sft,
        pairs,
        output,
        config,
        seed=config.seed,
        inputs=[prefs],
        counts=dict(counts),
        gold_pools=gold_pool,
    )
    if "rewards/margins" in metrics:
        log.info(
            "last step: loss %.4f, reward margin %.4f, accuracy %.2f",
            metrics["loss"],
            metrics["rewards/margins"],
            metrics.get("rewards/accuracies", float("nan")),
        )
    log.info("wrote %s", output)


main = entry_point(cli)

if __name__ == "__main__":
    main()
