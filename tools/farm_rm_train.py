"""farm-rm-train: train a Bradley-Terry reward model on preference records."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    input_argument,
    model_dir_option,
    on_error_option,
    resolve_config,
    split_option,
)
from farmkit.core.io import FarmError, display_name, read_records
from farmkit.methods.reward import RewardConfig

log = logging.getLogger("farmkit")


@click.command(name="farm-rm-train")
@click.argument("model")
@input_argument("prefs")
@model_dir_option("output_dir")
@config_options(RewardConfig)
@on_error_option
@split_option
@common_options
def cli(model, prefs, output_dir, config_file, **values):
    """Train a reward model (MODEL's backbone + a scalar head read at the end token) on PREFS by
    maximizing the Bradley-Terry likelihood. Fractional preferences are soft labels; null verdicts are
    skipped and counted. Reports held-out pairwise accuracy; per-step metrics go to DIR/metrics.jsonl."""
    config = resolve_config(RewardConfig, config_file, values)
    from farmkit.core.records import comparisons
    from farmkit.lm.models import file_sha256

    source = display_name(prefs)
    records = list(read_records(prefs, "preference"))
    items, counts = comparisons(records, source=source, ties=config.ties)
    skipped = ", ".join(f"{counts[k]} {k}" for k in ("null", "tie") if counts[k])
    if skipped:
        log.info("%s: skipped %s verdict(s)", source, skipped)
    if not items:
        raise FarmError(
            f"{source}: no usable preferences to train on ({len(records)} records{'; skipped ' + skipped if skipped else ''})"
        )

    from farmkit.methods.reward import train_reward_model

    meta = {
        "inputs": {prefs: file_sha256(prefs)},
        "preferences": {"records": len(records), **counts},
    }
    summary = train_reward_model(model, items, output_dir, config, meta_extra=meta)
    log.info("wrote %s (%d steps, %.0f s)", output_dir, summary["steps"], summary["seconds"])


main = entry_point(cli)

if __name__ == "__main__":
    main()
