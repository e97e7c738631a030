"""farm-grpo: optimize a policy against a reward model with GRPO or Dr.GRPO (group-normalized advantages)."""

from __future__ import annotations

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    input_argument,
    last_step,
    output_dir_option,
    resolve_config,
    train_on_prompts,
)
from farmkit.methods.group import GRPOConfig


@click.command(name="farm-grpo")
@click.argument("sft")
@click.argument("reward_model", metavar="RM")
@input_argument("prompts")
@output_dir_option
@config_options(GRPOConfig)
@common_options
def cli(
    sft: str,
    reward_model: str,
    prompts: str,
    output: str,
    config_file: str | None,
    **values,
) -> None:
    """Train SFT with GRPO to maximize RM's reward on PROMPTS (instruction records), KL to SFT
    in the loss; write the policy to -o DIR.

    Each step samples --num-samples (k) responses to each of rollout-batch-size / k
    prompts; a response's advantage is its score minus its group's mean, divided by the group's
    standard deviation. No value model. The loss clips per-token ratios and averages over each
    response's tokens (--ppo-epochs passes). --dr-grpo drops the division by the standard
    deviation and the per-response length average (token terms summed, divided by
    --max-new-tokens). --preset deepseekmath or dr-grpo runs the method as published (one
    update per batch; Dr.GRPO: no KL). --kl-in loss (default) adds --kl-coef x the per-token KL estimate to
    the loss; --kl-in reward subtracts it from the score. Metrics, checkpoints
    (--save-steps, --resume), --lora and `accelerate launch` as in farm-ppo.

    \b
    Example:
      farm-grpo sft/ rm/ unlabeled.jsonl -o grpo/ --num-samples 8 --steps 50 \\
          --rollout-batch-size 64 --minibatch-size 16 --max-new-tokens 128 --dr-grpo
    """
    from farmkit.methods.group import train_group

    config = resolve_config(GRPOConfig, config_file, values)
    train_on_prompts(train_group, config, sft, reward_model, prompts, output, last_step)


main = entry_point(cli)

if __name__ == "__main__":
    main()
