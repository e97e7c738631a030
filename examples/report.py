"""Print the demo's result: the simulated and the gold leaderboard side by side (best simulated win
rate first), each system's answers as the surrogate reward model scores them, and what its training
did; then how well the simulated leaderboard predicts the gold one.

    python report.py [--reward-model DIR] leaderboard_sim.jsonl leaderboard_gold.jsonl \
        correlation.jsonl [scores/SYSTEM.jsonl ...]

A scores file holds one system's val answers scored by the demo's reward model (farm-score); its
system's training figures, when the method logs them, are in ../models/SYSTEM/metrics.jsonl beside
the scores folder. Columns: `RM score` is the mean surrogate reward of the val answers; `train
reward` the mean reward of the method's rollouts (what it optimized, sampled at its rollout
temperature) over its first and its last pass through the training prompts, so that both means
cover the same prompts (a step's mean over a few prompts moves more with the prompts drawn than with
the policy); a run of fewer than two passes shows its first and last step or round instead, marked
`(steps)`; for expert iteration, its last round's first sample against the best of n it trained
on; `KL/token` its last KL(policy || SFT) in nats per
response token (PPO, RLOO and GRPO log their estimate summed over a response: it is divided by
their mean response length in tokens; Quark logs the exact per-token KL over the vocabulary on the
responses it trained on); `length` the mean answer length in characters. With --reward-model, the
reward model's held-out pairwise accuracy (farm-rm-train's, from its meta.json) follows the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from farmkit.core.io import read_records


def _cell(row: dict[str, Any] | None) -> str:
    if row is None or row.get("win_rate") is None:
        return "-"
    return f"{row['win_rate']:5.1f} ± {row.get('standard_error') or 0:4.1f}"


def _figures(scores_path: str) -> tuple[str, dict[str, str]]:
    """The system a scores file is of, and its RM score, training reward, KL and answer length."""
    records = list(read_records(scores_path))
    if not records:
        raise SystemExit(f"{scores_path}: no scored answers")
    rewards = [float(record["reward"]) for record in records]
    figures = {
        "rm": f"{sum(rewards) / len(rewards):+.3f}",
        "length": str(sum(len(record["output"]) for record in records) // len(records)),
    }
    metrics_path = (
        Path(scores_path).parent.parent / "models" / Path(scores_path).stem / "metrics.jsonl"
    )
    history = (
        [entry for entry in read_records(metrics_path) if "reward" in entry]
        if metrics_path.exists()
        else []
    )
    if history:
        figures["train"] = train_reward(history, steps_per_pass(metrics_path.parent))
        kl = kl_per_token(history[-1])
        if kl is not None:
            figures["kl"] = f"{kl:.4f}"
    return str(records[0]["generator"]), figures


def steps_per_pass(folder: Path) -> int | None:
    """How many steps (rounds) of a policy method's run make one pass through its training prompts,
    from its meta.json: the prompts per step (PPO's rollout batch; RLOO's and GRPO's rollout batch
    over their samples per prompt; Quark's prompts per round) and the prompts in its input file."""
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text())
    config = meta.get("config") or {}
    per_step = config.get("prompts_per_round") or (
        (config.get("rollout_batch_size") or 0) // (config.get("samples_per_prompt") or 1)
    )
    inputs = [Path(name) for name in meta.get("inputs") or {}]
    if not per_step or len(inputs) != 1 or not inputs[0].is_file():
        return None
    prompts = sum(1 for _ in read_records(inputs[0]))
    return -(-prompts // per_step) if prompts else None


def train_reward(history: list[dict[str, Any]], per_pass: int | None) -> str:
    """The mean rollout reward of the first and of the last pass through the prompts (or of the
    first and last step when the run made fewer than two passes); for expert iteration, the mean
    reward of the first sample and of the best of n that its last round trained on."""
    if "best_of_n_reward" in history[-1]:  # expert iteration: what its last round trained on
        last = history[-1]
        return f"{last['reward']:+.3f} → {last['best_of_n_reward']:+.3f} (best of {last['n']})"
    if per_pass and len(history) >= 2 * per_pass:
        first = sum(entry["reward"] for entry in history[:per_pass]) / per_pass
        last = sum(entry["reward"] for entry in history[-per_pass:]) / per_pass
        return f"{first:+.3f} → {last:+.3f}"
    return f"{history[0]['reward']:+.3f} → {history[-1]['reward']:+.3f} (steps)"


# trainers whose metrics.jsonl `kl` is summed over a response's tokens (the others log it per token)
KL_PER_RESPONSE = ("ppo", "rloo", "grpo")


def kl_per_token(entry: dict[str, Any]) -> float | None:
    """A metrics row's KL in nats per response token, whichever way its trainer logged it."""
    kl = entry.get("kl")
    if kl is None:
        return None
    if entry.get("method") in KL_PER_RESPONSE:
        tokens = entry.get("response_length")
        return float(kl) / float(tokens) if tokens else None
    return float(kl)


def reward_model_line(folder: str) -> str:
    """What farm-rm-train measured on the pairs it held out, from the folder's meta.json."""
    meta = json.loads((Path(folder) / "meta.json").read_text())
    training = meta.get("training") or {}
    trained_on = training.get("train_pairs")
    accuracy, pairs = training.get("eval_accuracy"), training.get("eval_pairs")
    if accuracy is None or not pairs:
        return f"Reward model: trained on {trained_on} pairs, none held out (no held-out accuracy)."
    return (
        f"Reward model: held-out pairwise accuracy {accuracy:.3f} on {pairs} pairs "
        f"(eval loss {training.get('eval_loss', float('nan')):.3f}; trained on {trained_on} pairs, "
        "chance is 0.5)."
    )


def main(
    sim_path: str,
    gold_path: str,
    correlation_path: str,
    *scores_paths: str,
    reward_model: str | None = None,
) -> None:
    sim = {row["generator"]: row for row in read_records(sim_path)}
    gold = {row["generator"]: row for row in read_records(gold_path)}
    figures = dict(_figures(path) for path in scores_paths)
    references = sorted({str(row.get("reference", "")) for row in sim.values()} - {""})
    systems = sorted(sim, key=lambda name: -(sim[name].get("win_rate") or 0.0))
    systems += sorted(set(gold) - set(sim))
    header = (
        "system",
        "sim win rate",
        "gold win rate",
        "n",
        "RM score",
        "train reward",
        "KL/token",
        "length",
    )
    lines = [header]
    for name in systems:
        row = sim.get(name) or gold.get(name) or {}
        own = figures.get(name, {})
        length = own.get("length", str(row.get("avg_length", "")))
        lines.append(
            (
                name,
                _cell(sim.get(name)),
                _cell(gold.get(name)),
                str(row.get("n_total", "")),
                own.get("rm", "-"),
                own.get("train", "-"),
                own.get("kl", "-"),
                length,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    against = f" against {', '.join(references)}" if references else ""
    print(
        f"Win rates (%, ± standard error){against}; the surrogate reward model's view and the training figures:"
    )
    for line in lines:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    for record in read_records(correlation_path):
        values = ", ".join(
            f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
            for key, value in record.items()
            if key in ("n", "spearman", "kendall", "pearson", "r2")
        )
        print(f"Simulated vs gold leaderboard: {values}")
    if reward_model is not None:
        print(reward_model_line(reward_model))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    folder = None
    if arguments[:1] == ["--reward-model"] and len(arguments) > 1:
        folder, arguments = arguments[1], arguments[2:]
    if len(arguments) < 3:
        sys.exit(__doc__)
    main(*arguments, reward_model=folder)
