"""Expert iteration: best-of-n on a set of prompts with a reward model, then supervised fine-tuning
of the policy on the winners (farm-sft's code path), repeated for a number of rounds. The folder
written holds the last round's policy; its meta.json records every round's sampling and training.
Each round before the last is a checkpoint under the one rule (farmkit.train.checkpoints): its
policy in OUTPUT-checkpoints/step-N/, complete once trainer/state.json (what the next rounds carry
on) is written; --resume continues after the newest complete round."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from farmkit.core import distributed
from farmkit.core.io import FarmError
from farmkit.core.runs import METRICS_FILE, read_metrics
from farmkit.core.seeds import derive_seed
from farmkit.core.values import AT_LEAST_ONE
from farmkit.methods.bon import BestOfNConfig, ScoredPrompt, mean_rewards, sample_and_score
from farmkit.train.config import config_dict, help_field
from farmkit.train.metrics import metrics_row, write_metrics
from farmkit.train.tracking import tracker_dir

log = logging.getLogger("farmkit")


def winners(scored: Sequence[ScoredPrompt], n: int) -> list[dict[str, str]]:
    """The best of the first n samples of each prompt, as demonstrations for SFT."""
    return [
        {
            "instruction": p.record["instruction"],
            "input": p.record.get("input") or "",
            "output": p.samples[p.best(n)].text,
        }
        for p in scored
    ]


# the settings of farm-sft (SFTConfig) that each round's fine-tuning takes from farm-expiter's options
SFT_ROUND_FIELDS = (
    "epochs",
    "max_steps",
    "learning_rate",
    "batch_size",
    "max_length",
    "lora",
    "lora_rank",
    "lora_alpha",
    "precision",
)


@dataclass
class ExpertIterationConfig:
    """farm-expiter's own setting (its sampling and SFT options are farm-bon's and farm-sft's)."""

    rounds: int = help_field(
        1,
        "Rounds of best-of-n + SFT, each starting from the previous round's policy.",
        bounds=AT_LEAST_ONE,
    )


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
    gold: Any = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run `rounds` rounds of best-of-n + SFT from `policy` and write the final policy to `output_dir`.

    Round r samples with seed derive_seed(sampling.seed, "expiter round", r) and trains with
    derive_seed(sft_config.seed, "expiter round", r): no round repeats another's draws, nor those of a
    run with the next seed. `sft_config` is a farmkit.methods.sft.SFTConfig.
    `gold`: a farmkit.train.gold.GoldEvaluator that judges each round's policy (its figures go on
    the round's last metrics row). meta.json's `budget` counts the run (farmkit.train.budget).
    `resume`: continue after the newest complete round in OUTPUT-checkpoints (with none, from the
    beginning); it must have been written with the same sampling and training settings.
    Returns {"rounds": [per-round figures], "output_dir": ..., "budget": ...}.
    """
    from farmkit.methods.sft import train_sft
    from farmkit.train import checkpoints as C
    from farmkit.train.budget import Budget, reward_model_labels
    from farmkit.train.scoring import RewardScorer

    if rounds < 1:
        raise FarmError("rounds must be at least 1")
    if not prompts:
        raise FarmError("no prompts to sample from")
    n = max(sampling.ns)
    scorer = RewardScorer(reward_model, device=device, batch_size=sampling.score_batch_size)
    target = Path(output_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    # what a resumed run must share with the one that wrote the rounds (--rounds may grow)
    settings = {"sampling": config_dict(sampling), **config_dict(replace(sft_config, resume=False))}
    checkpoints = C.checkpoint_folder(str(target), None)
    found = C.resume_from(checkpoints, resume, distributed.is_main())
    carried: dict[str, Any] = json.loads(C.state_file(found).read_text()) if found else {}
    if found is not None:
        C.check_same_settings(found, carried["config"], settings)
        if gold is not None and "gold" in carried:
            gold.restore(carried["gold"])
    history: list[dict[str, Any]] = carried.get("history", [])
    rows: list[dict[str, Any]] = carried.get("rows", [])
    steps_before = carried.get("steps_before", 0)
    budget = Budget(reward_model_labels(reward_model), carried.get("budget"))
    current = str(found) if found else str(policy)
    first = carried.get("step", 0) + 1
    if first > rounds:
        raise FarmError(f"--resume: {found} is at round {first - 1}, past --rounds {rounds}")
    for number in range(first, rounds + 1):
        round_sampling = replace(
            sampling, ns=(1, n), seed=derive_seed(sampling.seed, "expiter round", number)
        )
        round_training = replace(
            sft_config, seed=derive_seed(sft_config.seed, "expiter round", number)
        )
        scored = sample_and_score(current, scorer, prompts, round_sampling, device=device)
        # response tokens, the end token included (as the rollouts count them)
        budget.add(sampled=sum(s.completion_tokens + s.finished for p in scored for s in p.samples))
        rewards = mean_rewards(scored, (1, n))
        figures = {
            "round": number,
            "policy": str(policy) if number == 1 else f"round {number - 1}",
            "prompts": len(scored),
            "n": n,
            "sampling_seed": round_sampling.seed,
            "training_seed": round_training.seed,
            "mean_reward_first_sample": rewards[1],
            f"mean_reward_best_of_{n}": rewards[n],
        }
        log.info(
            "round %d: mean reward %.4f for the first sample, %.4f for the best of %d",
            number,
            rewards[1],
            rewards[n],
            n,
        )
        destination = target if number == rounds else checkpoints / f"step-{number:06d}"
        meta = {
            "tool": "farm-expiter",
            "base_model": str(policy),
            "expert_iteration": {
                "rounds_total": rounds,
                "reward_model": scorer.path,
                "best_of_n": asdict(sampling),
                "rounds": [*history, figures],
            },
        }
        meta.update(meta_extra or {})
        try:
            summary = train_sft(
                current,
                winners(scored, n),
                destination,
                round_training,
                meta_extra=meta,
                tracker_dir=tracker_dir(target) / f"round-{number}",
            )
        except FarmError as error:  # which round, besides the step of its SFT
            raise FarmError(f"round {number}: {error}") from None
        figures["sft"] = {key: summary.get(key) for key in ("examples", "steps", "train_loss")}
        history.append(figures)
        current = str(destination)  # train_sft returns once the main process has written it
        trained_before = budget.training_tokens
        budget.add(trained=summary.get("training_tokens") or 0)
        judged = gold.evaluate_folder(destination, f"round-{number}") if gold is not None else {}
        # the SFT rows of every round, steps counted over all rounds, with the round's rewards;
        # the main process alone keeps them: the others could read the last round's file after
        # the main process has rewritten it with these rows
        round_rows = [
            metrics_row(
                "expiter",
                row["step"] + steps_before,
                row["loss"],
                **{k: v for k, v in row.items() if k not in ("method", "step", "loss")},
                round=number,
                reward=rewards[1],
                best_of_n_reward=rewards[n],
                n=n,
                labels_used=budget.labels_used,
                tokens_sampled=budget.tokens_sampled,
                training_tokens=trained_before
                + int(row.get("num_tokens") or summary.get("training_tokens") or 0),
            )
            for row in (
                read_metrics(destination)
                if distributed.is_main() and (destination / METRICS_FILE).is_file()
                else []
            )
        ]
        if round_rows:  # the round's last row: its totals (SFT logs every few steps)
            round_rows[-1].update(judged, training_tokens=budget.training_tokens)
        rows += round_rows
        steps_before += summary.get("steps") or 0
        if number < rounds and distributed.is_main():
            C.mark_complete(
                destination,
                {
                    "step": number,
                    "config": settings,
                    "history": history,
                    "rows": rows,
                    "steps_before": steps_before,
                    "budget": {**budget.row(), "elapsed_s": budget.wall_seconds},
                    **({"gold": gold.counters()} if gold is not None else {}),
                },
            )
            C.remove_older(checkpoints, destination)
        distributed.barrier()  # no process reads the round's policy before it is marked
    if distributed.is_main() and (target / METRICS_FILE).is_file():
        write_metrics(target / METRICS_FILE, rows)
    if distributed.is_main():
        # the run's budget (and gold judge) are known once the last round has trained: its
        # meta.json gets them, replaced in one rename
        from farmkit.lm.models import read_meta, write_meta

        meta = read_meta(target)
        meta["budget"] = budget.block(rounds=rounds)
        if gold is not None:
            meta["gold"] = gold.block()
        write_meta(target, meta)
    if distributed.is_main():
        shutil.rmtree(checkpoints, ignore_errors=True)  # the run is done: no need to resume it
    return {"rounds": history, "output_dir": str(target), "budget": budget.block(rounds=rounds)}
