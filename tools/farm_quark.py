"""farm-quark: Quark's top-quantile variant (AlpacaFarm's best): sample, score, keep the best
quantile, train on it behind a reward control token; sampling adds that token."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    input_argument,
    output_dir_option,
    resolve_config,
)
from farmkit.core.io import FarmError, display_name, read_records
from farmkit.methods.quark import QuarkConfig

log = logging.getLogger("farmkit")


@click.command(name="farm-quark")
@click.argument("sft")
@click.argument("reward_model", metavar="RM")
@input_argument("prompts")
@output_dir_option
@config_options(QuarkConfig)
@common_options
def cli(
    sft: str,
    reward_model: str,
    prompts: str,
    output: str,
    config_file: str | None,
    **values,
) -> None:
    """Train SFT with Quark on PROMPTS (instruction records) scored by RM; write the policy to -o DIR.

    Each round samples responses, ranks them by RM's score into quantiles and trains on the best
    quantile (--keep top) or on all (--keep all), each behind its control token, with a KL
    penalty to SFT; the pool is emptied between rounds. The policy's meta.json names the
    best-quantile token as `sampling_control_token`: farm-sample adds it by itself. Per-round
    metrics are in DIR/metrics.jsonl. --preset alpacafarm sets all of AlpacaFarm's values (512
    prompts a round, one step of 256, learning rate 3e-6, 4 quantiles, ...; the learning rate
    decays to 0 over the rounds by default). Run under `accelerate launch` for
    several GPUs (DDP, or DeepSpeed ZeRO-2/3).

    \b
    Example:
      farm-quark sft/ rm/ unlabeled.jsonl -o quark/ --rounds 4 --prompts-per-round 64 \\
          --num-samples 4 --max-new-tokens 128
    """
    config = resolve_config(QuarkConfig, config_file, values)
    records = list(read_records(prompts, "instruction"))
    if not records:
        raise FarmError(f"{display_name(prompts)}: no prompts to train on")
    from farmkit.lm.models import check_reward_model
    from farmkit.train.launch import check_device

    # a device that is not there is said first, as every trainer says it
    check_device(config.device)
    check_reward_model(reward_model)  # before any work: any other model scores at random
    from farmkit.methods.quark import train_quark

    history = train_quark(
        sft, reward_model, records, output, config, seed=config.seed, inputs=[prompts]
    )
    log.info("mean reward by round: %s", ", ".join(f"{entry['reward']:.4f}" for entry in history))
    log.info("wrote %s", output)


main = entry_point(cli)

if __name__ == "__main__":
    main()
