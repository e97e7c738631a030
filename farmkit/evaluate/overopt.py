"""The reward over-optimization study (AlpacaFarm's, after Gao et al. 2022): best-of-n sweeps and PPO
checkpoints against one or more reward models, judged by a gold annotator. Systems are recognised by
name: `<rm>-best-of-<n>` and `ppo-<rm>-step-<k>`; their outputs carry the surrogate `reward` of the
reward model they optimized, and the gold reward is the record's `gold_reward`, else the one a
`gold` function gives (farm-plot passes the offline simulation's gold oracle,
farmkit.annotate.oracle.gold_reward). The best-of-n systems come from one scored sampling pass
(farmkit.methods.bon.rerank)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from statistics import fmean
from typing import Any

from farmkit.core.io import read_records

NAME = re.compile(
    r"^(?:(?P<rm>[\w.]+)-best-of-(?P<n>\d+)|ppo-(?P<ppo_rm>[\w.]+)-step-(?P<step>\d+))$"
)


Outputs = dict[str, dict[tuple[str, str], tuple[float, float]]]
# the gold reward of (instruction, input, output), for a record that carries no `gold_reward`
GoldReward = Callable[[str, str, str], float]


def _gold(record: dict[str, Any], key: tuple[str, str], gold: GoldReward) -> float:
    return (
        record["gold_reward"]
        if record.get("gold_reward") is not None
        else gold(key[0], key[1], record["output"])
    )


def load_outputs(output_paths: list[str], gold: GoldReward) -> Outputs:
    """Every system's answers, read once: generator -> (instruction, input) -> (surrogate reward, gold reward)."""
    outputs: Outputs = defaultdict(dict)
    for path in output_paths:
        for record in read_records(path, "reward"):
            key = (record["instruction"], record.get("input") or "")
            outputs[record["generator"]][key] = (record["reward"], _gold(record, key, gold))
    return outputs


def curves(
    leaderboard_path: str,
    outputs: Outputs,
    ppo_metrics: dict[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """One row per system: method, reward model, n or step, mean surrogate and gold reward, gold win
    rate, and the KL to the SFT policy: best-of-n's analytic bound log n - (n - 1) / n (Stiennon et
    al. 2020), PPO's measured `kl` at the checkpoint's step in the run's metrics (ppo_metrics, by
    reward model; null without them)."""
    rows = []
    for board in read_records(leaderboard_path):
        match = NAME.match(board["generator"])
        if match is None or board["generator"] not in outputs:
            continue
        scores = outputs[board["generator"]].values()
        bon = match["rm"] is not None
        rows.append(
            {
                "system": board["generator"],
                "method": "best-of-n" if bon else "ppo",
                "reward_model": match["rm"] if bon else match["ppo_rm"],
                "n" if bon else "step": int(match["n"] if bon else match["step"]),
                "surrogate_reward": fmean(reward for reward, _ in scores),
                "gold_reward": fmean(gold for _, gold in scores),
                "gold_win_rate": board["win_rate"],
                "gold_standard_error": board.get("standard_error"),
                "kl": best_of_n_kl(int(match["n"]))
                if bon
                else _measured_kl((ppo_metrics or {}).get(match["ppo_rm"]), int(match["step"])),
            }
        )
    rows.sort(key=lambda r: (r["reward_model"], r["method"], r.get("n", r.get("step"))))
    return rows


def best_of_n_kl(n: int) -> float:
    return math.log(n) - (n - 1) / n


def _measured_kl(metrics: list[dict[str, Any]] | None, step: int) -> float | None:
    """The run's `kl` at `step` (the last row logged at or before it)."""
    logged = [
        row
        for row in metrics or ()
        if row.get("step", math.inf) <= step and isinstance(row.get("kl"), int | float)
    ]
    return float(logged[-1]["kl"]) if logged else None


def comparisons(outputs: Outputs, resamples: int = 5000) -> list[dict[str, Any]]:
    """Paired differences in gold reward between best-of-n systems (see the module's docstring)."""
    import random

    golds = {
        name: {key: gold for key, (_, gold) in answers.items()} for name, answers in outputs.items()
    }
    sweeps: dict[str, list[int]] = defaultdict(list)
    for name in golds:
        match = NAME.match(name)
        if match and match["rm"]:
            sweeps[match["rm"]].append(int(match["n"]))
    wanted = []
    for model, ns in sorted(sweeps.items()):
        ns.sort()
        if len(ns) > 1:
            wanted.append((f"{model}-best-of-{ns[-1]}", f"{model}-best-of-{ns[0]}"))
        if len(ns) > 2:
            wanted.append((f"{model}-best-of-{ns[-1]}", f"{model}-best-of-{ns[-2]}"))
    models = sorted(sweeps)
    for i, first in enumerate(models):
        for second in models[i + 1 :]:
            if max(sweeps[first]) == max(sweeps[second]):
                top = max(sweeps[first])
                wanted.append((f"{second}-best-of-{top}", f"{first}-best-of-{top}"))
    rows = []
    for system, baseline in wanted:
        keys = sorted(set(golds[system]) & set(golds[baseline]))
        differences = [golds[system][key] - golds[baseline][key] for key in keys]
        if not differences:
            continue
        rng = random.Random(0)
        means = sorted(
            fmean(rng.choices(differences, k=len(differences))) for _ in range(resamples)
        )
        rows.append(
            {
                "comparison": f"{system} - {baseline}",
                "measure": "gold reward, paired by prompt",
                "prompts": len(keys),
                "mean_difference": fmean(differences),
                "ci95": [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]],
            }
        )
    return rows


def agreement(scored_path: str, gold: GoldReward) -> dict[str, Any]:
    """How well one reward model's scores of the sampling pass agree with the gold reward: within each
    prompt, the share of sample pairs with different gold rewards that the reward model orders the
    same way (0.5 is chance), and the Spearman correlation over all samples."""
    from scipy.stats import spearmanr

    prompts: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    model = None
    for record in read_records(scored_path, "reward"):
        model = model or record.get("reward_model")
        key = (record["instruction"], record.get("input") or "")
        prompts[key].append((record["reward"], _gold(record, key, gold)))
    agree = pairs = 0
    for scores in prompts.values():
        for i, (reward_i, gold_i) in enumerate(scores):
            for reward_j, gold_j in scores[i + 1 :]:
                if gold_i == gold_j:
                    continue
                pairs += 1
                agree += (reward_i - reward_j) * (gold_i - gold_j) > 0
    everything = [score for scores in prompts.values() for score in scores]
    rho = (
        spearmanr([s[0] for s in everything], [s[1] for s in everything]).statistic
        if len(everything) > 2
        else None
    )
    return {
        "scored": scored_path,
        "reward_model": model,
        "samples": len(everything),
        "pairs": pairs,
        "pairwise_agreement_with_gold": agree / pairs if pairs else None,
        "spearman_with_gold": None if rho is None or rho != rho else float(rho),
    }
