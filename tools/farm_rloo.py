"""farm-rloo: optimize a policy against a reward model with RLOO (leave-one-out group baseline)."""

from __future__ import annotations

from farmkit.cli import entry_point, policy_command
from farmkit.methods.group import RLOOConfig

cli = policy_command(
    "farm-rloo",
    RLOOConfig,
    "farmkit.methods.group:train_group",
    """Train SFT with RLOO to maximize RM's reward on PROMPTS (instruction records), KL to SFT
    as a penalty; write the policy to -o DIR.

    Each step samples --num-samples (k) responses to each of rollout-batch-size / k
    prompts; a response's advantage is its score minus the mean score of the other k - 1
    responses to its prompt. No value model. The loss clips the ratio of whole-response
    probabilities (--ppo-epochs passes; --preset ahmadian2024: one update per batch, so the ratio
    is 1, REINFORCE as published). --kl-in reward (default) subtracts --kl-coef x the
    response's KL estimate from its score; --kl-in loss adds it to the loss. Metrics,
    checkpoints (--save-steps, --resume), --lora and `accelerate launch` as in farm-ppo.

    Without a reward model: SFT PROMPTS --pool POOL scores each group by the pool's verdicts on
    pairs of its responses (--opponents K or all; --pool-reward win-rate or bradley-terry), the
    verdicts cached and priced as farm-annotate's (--max-cost over the whole run: it stops before
    a step it cannot pay for). metrics.jsonl and meta.json count the labels used and their price.

    \b
    Example:
      farm-rloo sft/ rm/ unlabeled.jsonl -o rloo/ --num-samples 4 --steps 50 \\
          --rollout-batch-size 64 --minibatch-size 16 --max-new-tokens 128
      farm-rloo sft/ unlabeled.jsonl -o rloo-pool/ --pool sim_ann_offline --opponents 2 \\
          --num-samples 4 --steps 50 --rollout-batch-size 64 --max-new-tokens 128
    """,
)
main = entry_point(cli)

if __name__ == "__main__":
    main()
