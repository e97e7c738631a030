"""Glue for the reward over-optimization study (`make overopt`).

    python overopt.py rerank SCORED -n 1,2,4,...,64 --generator NAME
        scored samples (farm-score output, several per prompt in sampling order) -> for each n, the
        best of the first n samples of every prompt, as output records named NAME-best-of-N
    python overopt.py plot GOLD_LEADERBOARD OUTPUTS... -o overopt.png
        one point per system: its gold win rate (from farm-winrate over gold annotations) against
        the mean surrogate reward of its outputs (the `reward` field), in two panels (one per reward
        model) plus gold win rate against n; prints the table as JSONL on stdout, each row with the
        mean gold reward of the system's answers too; then rows comparing best-of-n systems prompt by
        prompt on the gold reward (largest n against n = 1 and against the n before it, and the reward
        models against each other at the largest n), each a mean difference with a 95% paired
        bootstrap interval. With --scored FILE... (one reward model's scores of the whole sampling
        pass each), also one row per reward model saying how well it agrees with the gold reward.

Systems are recognised by name: `<rm>-best-of-<n>` and `ppo-<rm>-step-<k>`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from statistics import fmean
from typing import Any

from farmkit.annotate.oracle import gold_reward
from farmkit.generation import Sample
from farmkit.io import RecordWriter, read_records
from farmkit.methods.bon import ScoredPrompt

NAME = re.compile(r"^(?:(?P<rm>[\w.]+)-best-of-(?P<n>\d+)|ppo-(?P<ppo_rm>[\w.]+)-step-(?P<step>\d+))$")


def rerank(scored_path: str, ns: list[int], generator: str) -> None:
    prompts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in read_records(scored_path, "reward"):
        prompts[(record["instruction"], record.get("input") or "")].append(record)
    groups = []
    for records in prompts.values():
        records.sort(key=lambda r: r.get("sample_index", 0))
        group = ScoredPrompt(records[0], [Sample(r["output"], 0, 0, True) for r in records], [r["reward"] for r in records])
        groups.append((group, records))
    if any(len(records) < max(ns) for _, records in groups):
        raise SystemExit(f"{scored_path}: fewer than {max(ns)} samples for some prompt")
    with RecordWriter("-") as writer:
        for n in ns:
            for group, records in groups:
                chosen = dict(records[group.best(n)])
                chosen.update(generator=f"{generator}-best-of-{n}", best_of=n)
                writer.write(chosen)


Outputs = dict[str, dict[tuple[str, str], tuple[float, float]]]


def load_outputs(output_paths: list[str]) -> Outputs:
    """Every system's answers, read once: generator -> (instruction, input) -> (surrogate reward, gold reward)."""
    outputs: Outputs = defaultdict(dict)
    for path in output_paths:
        for record in read_records(path, "reward"):
            key = (record["instruction"], record.get("input") or "")
            outputs[record["generator"]][key] = (record["reward"], gold_reward(key[0], key[1], record["output"]))
    return outputs


def curves(leaderboard_path: str, outputs: Outputs) -> list[dict[str, Any]]:
    """One row per system: method, reward model, n or step, mean surrogate and gold reward, gold win rate."""
    rows = []
    for board in read_records(leaderboard_path):
        match = NAME.match(board["generator"])
        if match is None or board["generator"] not in outputs:
            continue
        scores = outputs[board["generator"]].values()
        bon = match["rm"] is not None
        rows.append({
            "system": board["generator"],
            "method": "best-of-n" if bon else "ppo",
            "reward_model": match["rm"] if bon else match["ppo_rm"],
            "n" if bon else "step": int(match["n"] if bon else match["step"]),
            "surrogate_reward": fmean(reward for reward, _ in scores),
            "gold_reward": fmean(gold for _, gold in scores),
            "gold_win_rate": board["win_rate"],
            "gold_standard_error": board.get("standard_error"),
        })
    rows.sort(key=lambda r: (r["reward_model"], r["method"], r.get("n", r.get("step"))))
    return rows


def comparisons(outputs: Outputs, resamples: int = 5000) -> list[dict[str, Any]]:
    """Paired differences in gold reward between best-of-n systems (see the module's docstring)."""
    import random

    golds = {name: {key: gold for key, (_, gold) in answers.items()} for name, answers in outputs.items()}
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
        for second in models[i + 1:]:
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
        means = sorted(fmean(rng.choices(differences, k=len(differences))) for _ in range(resamples))
        rows.append({"comparison": f"{system} - {baseline}", "measure": "gold reward, paired by prompt", "prompts": len(keys),
                     "mean_difference": fmean(differences),
                     "ci95": [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]})
    return rows


def agreement(scored_path: str) -> dict[str, Any]:
    """How well one reward model's scores of the sampling pass agree with the gold reward: within each
    prompt, the share of sample pairs with different gold rewards that the reward model orders the
    same way (0.5 is chance), and the Spearman correlation over all samples."""
    from scipy.stats import spearmanr

    prompts: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    model = None
    for record in read_records(scored_path, "reward"):
        model = model or record.get("reward_model")
        gold = gold_reward(record["instruction"], record.get("input") or "", record["output"])
        prompts[(record["instruction"], record.get("input") or "")].append((record["reward"], gold))
    agree = pairs = 0
    for scores in prompts.values():
        for i, (reward_i, gold_i) in enumerate(scores):
            for reward_j, gold_j in scores[i + 1:]:
                if gold_i == gold_j:
                    continue
                pairs += 1
                agree += (reward_i - reward_j) * (gold_i - gold_j) > 0
    everything = [score for scores in prompts.values() for score in scores]
    rho = spearmanr([s[0] for s in everything], [s[1] for s in everything]).statistic if len(everything) > 2 else None
    return {"scored": scored_path, "reward_model": model, "samples": len(everything), "pairs": pairs,
            "pairwise_agreement_with_gold": agree / pairs if pairs else None,
            "spearman_with_gold": None if rho is None or rho != rho else float(rho)}


def plot(rows: list[dict[str, Any]], path: str, labels: dict[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({row["reward_model"] for row in rows})
    figure, axes = plt.subplots(1, len(models) + 1, figsize=(5 * (len(models) + 1), 4.2), squeeze=False)
    for panel, model in zip(axes[0], models, strict=False):
        for method, marker in (("best-of-n", "o"), ("ppo", "s")):
            points = [row for row in rows if row["reward_model"] == model and row["method"] == method]
            if not points:
                continue
            xs = [row["surrogate_reward"] for row in points]
            ys = [row["gold_win_rate"] for row in points]
            errors = [row["gold_standard_error"] or 0 for row in points]
            panel.errorbar(xs, ys, yerr=errors, marker=marker, capsize=2, label=method)
            for row, x, y in zip(points, xs, ys, strict=True):
                panel.annotate(f"n={row['n']}" if method == "best-of-n" else f"step {row['step']}", (x, y),
                               textcoords="offset points", xytext=(3, 3), fontsize=7)
        panel.set_title(f"reward model: {labels.get(model, model)}", fontsize=10)
        panel.set_xlabel("mean surrogate reward")
        panel.set_ylabel("gold win rate (%)")
        panel.legend(fontsize=8)
    sweep = axes[0][-1]
    for model in models:
        points = [row for row in rows if row["reward_model"] == model and row["method"] == "best-of-n"]
        sweep.plot([row["n"] for row in points], [row["gold_win_rate"] for row in points], marker="o",
                   label=labels.get(model, model))
    sweep.set_xscale("log", base=2)
    sweep.set_xlabel("n (best-of-n)")
    sweep.set_ylabel("gold win rate (%)")
    sweep.set_title("best-of-n sweep", fontsize=10)
    sweep.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=110)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rerank_parser = commands.add_parser("rerank")
    rerank_parser.add_argument("scored")
    rerank_parser.add_argument("-n", required=True, help="comma-separated sample counts")
    rerank_parser.add_argument("--generator", required=True)
    plot_parser = commands.add_parser("plot")
    plot_parser.add_argument("leaderboard")
    plot_parser.add_argument("outputs", nargs="+")
    plot_parser.add_argument("-o", "--output", required=True, help="the PNG")
    plot_parser.add_argument("--scored", nargs="+", default=[], metavar="FILE",
                             help="each reward model's scores of the whole sampling pass (agreement with gold)")
    plot_parser.add_argument("--label", action="append", default=[], metavar="RM=TEXT", help="panel title of a reward model")
    args = parser.parse_args(argv)
    if args.command == "rerank":
        rerank(args.scored, sorted({int(n) for n in args.n.split(",")}), args.generator)
        return
    outputs = load_outputs(args.outputs)
    rows = curves(args.leaderboard, outputs)
    if not rows:
        raise SystemExit(f"{args.leaderboard}: no best-of-n or PPO systems with outputs in {', '.join(args.outputs)}")
    plot(rows, args.output, dict(label.split("=", 1) for label in args.label))
    with RecordWriter("-") as writer:
        writer.write_all(rows)
        writer.write_all(comparisons(outputs))
        writer.write_all(agreement(path) for path in args.scored)


if __name__ == "__main__":
    main(sys.argv[1:])
