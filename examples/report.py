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

With --evals DIR (the demo's eval folder: sim/ and gold/ hold each system's verdicts against the
reference, one per val prompt), the significance follows: each method against SFT on gold win rate
(a paired bootstrap over the val prompts: both systems answered the same prompts, so the prompts are
resampled and the difference of win rates recomputed; its 95% interval and two-sided p-value), the
paper's method ranking beside farmkit's, and the simulated-vs-gold Spearman over the systems with a
bootstrap interval (prompts resampled). With --reference-scores FILE (the reference's val answers
scored by the reward model) the reward model's accuracy against gold on those held-out pairs (val
prompts, never trained on) follows, with a bootstrap interval over prompts and whether it is above
chance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from farmkit.core.io import read_records

# AlpacaFarm's simulated win rates against Davinci003 (Dubois et al., 2023, Table 2, the
# "AlpacaFarm" column; arXiv v4 added DPO), for the methods farmkit runs, keyed by farmkit's output
# file name. Checked on 2026-11-27 against a transcription of v4's Table 2: every figure here is
# the table's. Its other rows (GPT-4 79.0, ChatGPT 61.4, SFT 52k 39.2, Davinci001 24.4, LLaMA 7B
# 11.3) are systems farmkit does not train.
PAPER_SIM_WIN_RATES = {
    "ppo": ("PPO", 46.8),
    "dpo": ("DPO", 46.8),
    "bon": ("best-of-1024", 45.0),
    "expiter": ("expert iteration", 41.9),
    "sft": ("SFT 10k", 36.7),
    "feedme": ("binary FeedME", 36.6),
    "quark": ("Quark", 35.6),
    "rc": ("binary reward conditioning", 32.4),
}
RESAMPLES = 2000
ALPHA = 0.05


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


# -------------------------------------------------------------------------------------------
# Significance: paired bootstraps over the evaluation prompts


def _prompt(record: dict[str, Any]) -> tuple[str, str]:
    return str(record.get("instruction", "")), str(record.get("input") or "")


def verdicts(path: Path) -> tuple[str, dict[tuple[str, str], float]]:
    """A system's name (generator_2) and its score on each prompt against the reference: 1 when
    the system's answer won, 0 when the reference's did, 0.5 a tie (soft labels in between); prompts
    without a verdict are left out."""
    name, scores = path.stem, {}
    for line, record in enumerate(read_records(path), 1):
        name = str(record.get("generator_2") or name)
        preference = record.get("preference")
        if preference is None:
            continue
        preference = float(preference)
        if preference == 0:  # AlpacaEval's legacy tie
            preference = 1.5
        if not 1 <= preference <= 2:
            raise SystemExit(
                f"{path}:{line}: preference must be in [1, 2] or null, got {preference}"
            )
        scores[_prompt(record)] = preference - 1.0
    return name, scores


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, float]:
    """The difference of means mean(a) - mean(b) of two paired per-prompt score arrays (same prompts,
    same order), its 95% percentile interval from resampling prompts, and a two-sided p-value (the
    bootstrap distribution shifted to the null of no difference)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("paired_bootstrap needs two non-empty arrays of the same length")
    difference = a - b
    observed = float(difference.mean())
    rng = np.random.default_rng(seed)
    index = rng.integers(0, difference.size, size=(resamples, difference.size))
    means = difference[index].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    extreme = np.abs(means - observed) >= abs(observed) - 1e-12
    p_value = (1 + int(extreme.sum())) / (resamples + 1) if observed != 0 else 1.0
    return {"difference": observed, "low": float(low), "high": float(high), "p": p_value}


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):  # ties share their mean rank
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rank correlation (ties at their mean rank); None when either side is constant."""
    rx, ry = _ranks(np.asarray(x, dtype=float)), _ranks(np.asarray(y, dtype=float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _common(tables: list[dict[tuple[str, str], float]]) -> list[tuple[str, str]]:
    prompts = set(tables[0])
    for table in tables[1:]:
        prompts &= set(table)
    return sorted(prompts)


def method_lines(gold: dict[str, dict[tuple[str, str], float]], baseline: str = "sft") -> list[str]:
    """Each method against the baseline on gold win rate: a paired bootstrap over the prompts."""
    if baseline not in gold:
        return [f"Significance: no {baseline} verdicts to compare the methods with."]
    lines = [
        f"Gold win rate of each method minus {baseline}'s (percentage points; paired bootstrap over "
        f"the evaluation prompts, {RESAMPLES} resamples, 95% interval):"
    ]
    for name in sorted(gold, key=lambda n: -np.mean(list(gold[n].values()) or [0.0])):
        if name == baseline:
            continue
        prompts = _common([gold[name], gold[baseline]])
        if not prompts:
            lines.append(f"  {name}: no prompts judged for both")
            continue
        result = paired_bootstrap(
            np.array([gold[name][p] for p in prompts]),
            np.array([gold[baseline][p] for p in prompts]),
        )
        verdict = "significant at p<0.05" if result["p"] < ALPHA else "not significant at p<0.05"
        lines.append(
            f"  {name} vs {baseline}: {100 * result['difference']:+.1f} "
            f"[{100 * result['low']:+.1f}, {100 * result['high']:+.1f}], p={result['p']:.3f}, "
            f"n={len(prompts)} prompts: {verdict}"
        )
    return lines


def correlation_line(
    sim: dict[str, dict[tuple[str, str], float]],
    gold: dict[str, dict[tuple[str, str], float]],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> str:
    """Spearman of the simulated and the gold win rates over the systems, with a bootstrap interval
    (the prompts resampled, the same draw for every system and both judges)."""
    systems = sorted(set(sim) & set(gold))
    prompts = _common([table[name] for name in systems for table in (sim, gold)])
    if len(systems) < 3 or not prompts:
        return "Simulated vs gold Spearman: too few systems or common prompts for an interval."
    s = np.array([[sim[name][p] for p in prompts] for name in systems])
    g = np.array([[gold[name][p] for p in prompts] for name in systems])
    observed = spearman(s.mean(axis=1), g.mean(axis=1))
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        index = rng.integers(0, len(prompts), size=len(prompts))
        value = spearman(s[:, index].mean(axis=1), g[:, index].mean(axis=1))
        if value is not None:
            draws.append(value)
    if observed is None or not draws:
        return "Simulated vs gold Spearman: undefined (a leaderboard is constant)."
    low, high = np.quantile(draws, [0.025, 0.975])
    return (
        f"Simulated vs gold Spearman over {len(systems)} systems: {observed:.3f} "
        f"[{low:.3f}, {high:.3f}] (95% bootstrap interval over {len(prompts)} prompts)"
    )


def paper_lines(files: dict[str, str], gold: dict[str, dict[tuple[str, str], float]]) -> list[str]:
    """AlpacaFarm's ranking of the methods beside farmkit's gold ranking of the same methods."""
    ours = {
        file: 100 * float(np.mean(list(gold[name].values())))
        for file, name in files.items()
        if file in PAPER_SIM_WIN_RATES and gold.get(name)
    }
    if not ours:
        return []
    table = list(PAPER_SIM_WIN_RATES)  # a tie (PPO and DPO) is listed in the table's order
    paper = sorted(ours, key=lambda f: (-PAPER_SIM_WIN_RATES[f][1], table.index(f)))
    farm = sorted(ours, key=lambda f: -ours[f])
    lines = [
        "Method ranking, AlpacaFarm paper (Table 2, simulated win rate vs Davinci003) beside farmkit's (gold):"
    ]
    for rank, (theirs, mine) in enumerate(zip(paper, farm, strict=True), 1):
        label, rate = PAPER_SIM_WIN_RATES[theirs]
        lines.append(f"  {rank}. {label} {rate:.1f}  |  {files[mine]} {ours[mine]:.1f}")
    rho = spearman(
        np.array([PAPER_SIM_WIN_RATES[f][1] for f in ours]), np.array(list(ours.values()))
    )
    lines.append(
        f"  Spearman, paper vs farmkit over these {len(ours)} methods: "
        + ("undefined" if rho is None else f"{rho:.3f}")
    )
    return lines


def reward_model_gold_line(
    gold_paths: list[Path], reference_scores: str, scores_paths: list[str], seed: int = 0
) -> str:
    """The reward model's pairwise accuracy against the gold judge on the evaluation pairs (each
    system's val answer against the reference's; val prompts are never trained on): the RM is right
    when it scores higher the answer gold preferred. Ties (either side) are left out; the interval
    resamples prompts (a prompt's pairs share the reference answer)."""
    rewards: dict[tuple[tuple[str, str], str], float] = {}
    for path in [reference_scores, *scores_paths]:
        for record in read_records(path):
            rewards[(_prompt(record), str(record["output"]))] = float(record["reward"])
    by_prompt: dict[tuple[str, str], list[float]] = {}
    for path in gold_paths:
        for record in read_records(path):
            preference = record.get("preference")
            if preference is None or float(preference) == 1.5 or float(preference) == 0:
                continue
            key = _prompt(record)
            r1 = rewards.get((key, str(record.get("output_1"))))
            r2 = rewards.get((key, str(record.get("output_2"))))
            if r1 is None or r2 is None or r1 == r2:
                continue
            gold_second = float(preference) > 1.5
            by_prompt.setdefault(key, []).append(float((r2 > r1) == gold_second))
    if not by_prompt:
        return "Reward model vs gold: no decided pairs with both answers scored."
    groups = list(by_prompt.values())
    correct = sum(sum(group) for group in groups)
    total = sum(len(group) for group in groups)
    rng = np.random.default_rng(seed)
    sums = np.array([sum(group) for group in groups])
    sizes = np.array([len(group) for group in groups])
    index = rng.integers(0, len(groups), size=(RESAMPLES, len(groups)))
    draws = sums[index].sum(axis=1) / sizes[index].sum(axis=1)
    low, high = np.quantile(draws, [0.025, 0.975])
    verdict = "above chance" if low > 0.5 else "not above chance"
    return (
        f"Reward model vs gold on held-out evaluation pairs: accuracy {correct / total:.3f} "
        f"[{low:.3f}, {high:.3f}] (95% bootstrap interval over {len(groups)} prompts, {total} "
        f"decided pairs; chance 0.5): {verdict}"
    )


def significance(
    evals: str,
    scores_paths: list[str],
    reference_scores: str | None = None,
) -> list[str]:
    folder = Path(evals)
    files: dict[str, str] = {}
    tables: dict[str, dict[str, dict[tuple[str, str], float]]] = {"sim": {}, "gold": {}}
    for kind in tables:
        for path in sorted((folder / kind).glob("*.jsonl")):
            name, scores = verdicts(path)
            tables[kind][name] = scores
            files[path.stem] = name
    if not tables["gold"]:
        return [f"Significance: no gold verdicts under {folder / 'gold'}"]
    lines = method_lines(tables["gold"])
    lines += paper_lines(files, tables["gold"])
    lines.append(correlation_line(tables["sim"], tables["gold"]))
    if reference_scores is not None:
        lines.append(
            reward_model_gold_line(
                sorted((folder / "gold").glob("*.jsonl")), reference_scores, scores_paths
            )
        )
    return lines


def main(
    sim_path: str,
    gold_path: str,
    correlation_path: str,
    *scores_paths: str,
    reward_model: str | None = None,
    evals: str | None = None,
    reference_scores: str | None = None,
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
    if evals is not None:
        for line in significance(evals, list(scores_paths), reference_scores):
            print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reward-model")
    parser.add_argument("--evals")
    parser.add_argument("--reference-scores")
    parser.add_argument("files", nargs="+")
    arguments = parser.parse_args()
    if len(arguments.files) < 3:
        parser.error("needs leaderboard_sim.jsonl leaderboard_gold.jsonl correlation.jsonl")
    main(
        *arguments.files,
        reward_model=arguments.reward_model,
        evals=arguments.evals,
        reference_scores=arguments.reference_scores,
    )
