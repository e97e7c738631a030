"""farm-grpo: optimize a policy against a reward model with GRPO or Dr.GRPO (group-normalized advantages)."""

from __future__ import annotations

from farmkit.cli import entry_point, policy_command
from farmkit.methods.group import GRPOConfig

cli = policy_command(
    "farm-grpo",
    GRPOConfig,
    "farmkit.methods.group:train_group",
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

    Without a reward model: SFT PROMPTS --pool POOL scores each group by the pool's verdicts on
    pairs of its responses (--opponents K or all; --pool-reward win-rate or bradley-terry), the
    verdicts cached and priced as farm-annotate's (--max-cost over the whole run: it stops before
    a step it cannot pay for). metrics.jsonl and meta.json count the labels used and their price.

    \b
    Example:
      farm-grpo sft/ rm/ unlabeled.jsonl -o grpo/ --num-samples 8 --steps 50 \\
          --rollout-batch-size 64 --minibatch-size 16 --max-new-tokens 128 --dr-grpo
      farm-grpo sft/ unlabeled.jsonl -o grpo-pool/ --pool sim_ann_offline --opponents 2 \\
          --num-samples 4 --steps 50 --rollout-batch-size 64 --max-new-tokens 128
    """,
)
main = entry_point(cli)

if __name__ == "__main__":
    main()
