"""farm-ppo: optimize a policy against a reward model with PPO, as AlpacaFarm did."""

from __future__ import annotations

from farmkit.cli import entry_point, policy_command
from farmkit.methods.ppo import PPOConfig

cli = policy_command(
    "farm-ppo",
    PPOConfig,
    "farmkit.methods.ppo:train_ppo",
    """Train SFT with PPO to maximize RM's reward on PROMPTS (instruction records) minus a KL
    penalty to SFT; write the policy to -o DIR.

    The value model starts from RM (so RM and SFT share a tokenizer). Every step appends a line
    to CHECKPOINT_DIR/metrics.jsonl (reward, kl, entropy, response_length, value_loss,
    clip_fraction, ...); every --save-steps steps a loadable policy folder is written there
    (step-N/), which --resume continues from. Where farmkit departs from AlpacaFarm's PPO an option
    says so and takes AlpacaFarm's value (--kl-estimator clamped --whiten-rewards --value-head zero
    --warmup-steps 5); --preset alpacafarm sets all of AlpacaFarm's values. Run under `accelerate launch` for several GPUs (DDP, or DeepSpeed ZeRO-2/3:
    the policy and the value model train as one module).

    \b
    Example:
      farm-ppo sft/ rm/ unlabeled.jsonl -o ppo/ --kl-coef 0.0067 --steps 50 \\
          --rollout-batch-size 32 --minibatch-size 8 --max-new-tokens 128
    """,
)
main = entry_point(cli)

if __name__ == "__main__":
    main()
