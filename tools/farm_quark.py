"""farm-quark: Quark's top-quantile variant (AlpacaFarm's best): sample, score, keep the best
quantile, train on it behind a reward control token; sampling adds that token."""

from __future__ import annotations

from farmkit.cli import entry_point, policy_command
from farmkit.methods.quark import QuarkConfig


def rewards_by_round(history: list[dict]) -> str:
    return "mean reward by round: " + ", ".join(f"{entry['reward']:.4f}" for entry in history)


cli = policy_command(
    "farm-quark",
    QuarkConfig,
    "farmkit.methods.quark:train_quark",
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
    """,
    summary=rewards_by_round,
)
main = entry_point(cli)

if __name__ == "__main__":
    main()
