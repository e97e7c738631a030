"""Expert iteration: best-of-n on a set of prompts with a reward model, then supervised fine-tuning
of the policy on the winners (farm-sft's code path), repeated for a number of rounds. The folder
written holds the last round's policy; its meta.json records every round's sampling and training."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from farmkit.io import FarmError
from farmkit.methods.bon import BestOfNConfig, ScoredPrompt, mean_rewards, sample_and_score

log = logging.getLogger("farmkit")


def winners(scored: Sequence[ScoredPrompt], n: int) -> list[dict[str, str]]:
    """The best of the first n samples of each prompt, as demonstrations for SFT."""
    return [
        {"instruction": p.record["instruction"], "input": p.record.get("input") or "", "output": p.samples[p.best(n)].text}
        for p in scored
    ]


def expert_iteration(
    policy: str | os.PathLike,
    reward_model: str | os.PathLike,
    prompts: Sequence[dict[str, Any]],
    output_dir: str | os.PathLike,
    sampling: BestOfNConfig,
    sft_config: Any,
    rounds: int = 1,
    meta_extra: dict[str, Any] | None = None,
    device: str = "auto",
) -> dict[str, Any]:
    """Run `rounds` rounds of best-of-n + SFT from `policy` and write the final policy to `output_dir`.

    Round r samples with seed sampling.seed + r - 1 and trains with seed sft_config.seed + r - 1, so
    later rounds do not repeat the first round's draws. `sft_config` is a farmkit.methods.sft.SFTConfig.
    Returns {"rounds": [per-round figures], "output_dir": ...}.
    """
    from farmkit.methods.reward import RewardScorer
    from farmkit.methods.sft import train_sft

    if rounds < 1:
        raise FarmError("rounds must be at least 1")
    if not prompts:
        raise FarmError("no prompts to sample from")
    n = max(sampling.ns)
    scorer = RewardScorer(reward_model, device=device, batch_size=sampling.score_batch_size)
    target = Path(output_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    history: list[dict[str, Any]] = []
    current = str(policy)
    # intermediate rounds' policies live beside the target and go away with the run
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.rounds.", dir=target.parent) as workdir:
        for number in range(1, rounds + 1):
            round_sampling = replace(sampling, ns=(1, n), seed=sampling.seed + number - 1)
            scored = sample_and_score(current, scorer, prompts, round_sampling, device=device)
            rewards = mean_rewards(scored, (1, n))
            figures = {"round": number, "policy": str(policy) if number == 1 else f"round {number - 1}", "prompts": len(scored), "n": n,
                       "sampling_seed": round_sampling.seed, "mean_reward_first_sample": rewards[1], f"mean_reward_best_of_{n}": rewards[n]}
            log.info("round %d: mean reward %.4f for the first sample, %.4f for the best of %d", number, rewards[1], rewards[n], n)
            destination = target if number == rounds else Path(workdir) / f"round-{number}"
            meta = {
                "tool": "farm-expiter",
                "base_model": str(policy),
                "expert_iteration": {
                    "rounds_total": rounds, "reward_model": scorer.path, "best_of_n": asdict(sampling),
                    "rounds": [*history, figures],
                },
            }
            meta.update(meta_extra or {})
            summary = train_sft(current, winners(scored, n), destination, replace(sft_config, seed=sft_config.seed + number - 1), meta_extra=meta)
            figures["sft"] = {key: summary.get(key) for key in ("examples", "steps", "train_loss")}
            history.append(figures)
            current = str(destination)
    return {"rounds": history, "output_dir": str(target)}
