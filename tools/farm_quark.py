"""farm-quark: Quark's top-quantile variant (AlpacaFarm's best): sample, score, keep the best
quantile, train on it behind a reward control token; sampling adds that token."""

from __future__ import annotations

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    input_argument,
    output_dir_option,
    resolve_config,
    train_on_prompts,
)
from farmkit.methods.quark import QuarkConfig


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
    from farmkit.methods.quark import train_quark

    config = resolve_config(QuarkConfig, config_file, values)
    train_on_prompts(train_quark, config, sft, reward_model, prompts, output, rewards_by_round)


def rewards_by_round(history: list[dict]) -> str:
    return "mean reward by round: " + ", ".join(f"{entry['reward']:.4f}" for entry in history)


main = entry_point(cli)

if __name__ == "__main__":
    main()
