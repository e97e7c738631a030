"""Group rewards from pairwise verdicts: what farm-grpo and farm-rloo score with under --pool, an
annotator pool judging the responses of each group against each other instead of a reward model.

Each group of k responses to one prompt is judged in pairs: every pair of the group (--opponents
all: k (k - 1) / 2 comparisons), or K opponents per response (k K / 2 comparisons), drawn so that
each response meets K distinct others (the positions of a seeded shuffle of the group joined to their
K / 2 next neighbours on a circle, and with K odd to the opposite one: a K-regular graph). Which
response is output_1 is drawn too; the pool then shows each pair in a seeded random order, or in
both (--both-orders), as farm-annotate does, since its judges favour a position. The schedule is
seeded by the run's seed and the group's texts, so a resumed step asks the very pairs (the cache
answers them).

Definitions, within a group (comparison c of responses i and j, preference p_c as farm-annotate
writes it: 1 output_1 better, 2 output_2 better, 1.5 a tie; s = 2 - p for output_1, p - 1 for
output_2; null verdicts are left out):
- win-rate (the default): r_i = the mean of s over i's comparisons; 0.5 with no verdict at all.
  Unbiased for i's chance to beat a group mate, needs no fit, and with --opponents all it ranks the
  group exactly as Bradley-Terry does.
- bradley-terry: r_i = theta_i, the maximum a posteriori strengths of P(i beats j) =
  sigmoid(theta_i - theta_j) over the group's comparisons (ties half a win each way) under a
  standard normal prior on each theta (finite when one response wins every comparison). It uses
  transitivity: with K < k - 1 a response that beat a strong one scores above one that beat a
  weak one with the same record.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed, stable_hash

POOL_REWARDS = ("win-rate", "bradley-terry")
BT_PRIOR = 1.0  # precision of the normal prior on each strength
# running totals of what asking the pool took, on every metrics row and in meta.json's budget
COST_FIGURES = ("annotator_requests", "judge_calls", "cache_hits", "spent")


class PairJudge(Protocol):
    """What judges a step's pairs: farm-grpo and farm-rloo pass farm-annotate's pool run
    (farmkit.annotate.run.PoolLabeller)."""

    max_cost: float | None  # USD over the whole run (None: no cap)

    def preferences(
        self, pairs: list[dict[str, Any]], seed: int, budget: float | None
    ) -> tuple[list[float | None], dict[str, Any]] | None:
        """The preference of each pair record (None: no verdict) and what asking took (pairs,
        requests, judge_calls, cache_hits, price); None when `budget` (USD; None: no cap) does
        not pay for them all."""


class BudgetSpent(FarmError):
    """--max-cost does not pay for the next step's comparisons: the run stops before it."""


def opponent_pairs(size: int, opponents: int | None, rng: random.Random) -> list[tuple[int, int]]:
    """The comparisons (i, j) of a group of `size` (i shown as output_1): every pair (`opponents`
    None), or each response against `opponents` distinct others, the same number for every one."""
    count = size - 1 if opponents is None else opponents
    if not 1 <= count < size or size * count % 2:
        raise ValueError(
            f"{count} opponents in a group of {size}: need 1 to {size - 1}, and an even "
            "group size x opponents"
        )
    order = list(range(size))
    rng.shuffle(order)
    pairs = [
        (order[position], order[(position + distance) % size])
        for distance in range(1, count // 2 + 1)
        for position in range(size)
    ]
    if count % 2:  # size is even: each response also meets the one opposite it on the circle
        pairs += [(order[position], order[position + size // 2]) for position in range(size // 2)]
    return [(j, i) if rng.random() < 0.5 else (i, j) for i, j in pairs]


def outcomes(
    comparisons: Sequence[tuple[int, int]], preferences: Sequence[float | None]
) -> list[tuple[int, int, float]]:
    """(i, j, s): i's score against j (1 a win, 0.5 a tie, 0 a loss) of each comparison with a
    verdict; comparisons[c] = (output_1, output_2) of preferences[c]."""
    return [
        (first, second, 2.0 - float(preference))
        for (first, second), preference in zip(comparisons, preferences, strict=True)
        if preference is not None
    ]


def win_rates(size: int, results: Sequence[tuple[int, int, float]]) -> list[float]:
    """Each response's mean score over its comparisons (0.5 without any)."""
    scored = [0.0] * size
    met = [0] * size
    for first, second, score in results:
        scored[first] += score
        scored[second] += 1.0 - score
        met[first] += 1
        met[second] += 1
    return [scored[i] / met[i] if met[i] else 0.5 for i in range(size)]


def bradley_terry(
    size: int, results: Sequence[tuple[int, int, float]], prior: float = BT_PRIOR
) -> list[float]:
    """The strengths theta maximizing sum s log sigmoid(theta_i - theta_j) + (1 - s) log
    sigmoid(theta_j - theta_i) - prior / 2 |theta|^2, by Newton's method (the objective is
    strictly concave)."""
    import torch

    theta = torch.zeros(size, dtype=torch.float64)
    if not results:
        return theta.tolist()
    first = torch.tensor([r[0] for r in results])
    second = torch.tensor([r[1] for r in results])
    score = torch.tensor([r[2] for r in results], dtype=torch.float64)
    eye = torch.eye(size, dtype=torch.float64)
    difference = eye[first] - eye[second]  # [comparisons, size]
    for _ in range(100):
        p = torch.sigmoid(theta[first] - theta[second])
        gradient = difference.T @ (score - p) - prior * theta
        curvature = difference.T @ (difference * (p * (1 - p))[:, None]) + prior * eye
        change = torch.linalg.solve(curvature, gradient)
        theta += change
        if change.abs().max() < 1e-10:
            break
    return theta.tolist()


REWARD_FUNCTIONS = {"win-rate": win_rates, "bradley-terry": bradley_terry}


class PairwiseScorer:
    """The scorer of a group method under --pool: it scores whole groups (rows in groups of k, as
    the group methods sample them) by `judge`'s verdicts within each group, and keeps the running
    totals of what asking took (resumed from a checkpoint's metrics row)."""

    network = None  # no model of its own

    def __init__(self, judge: PairJudge, config: Any) -> None:
        """`config`: the group method's (its pool, samples_per_prompt, opponent_count,
        pool_reward, seed and tool)."""
        self.judge, self.tool = judge, config.tool
        self.name = config.pool
        self.size = config.samples_per_prompt
        self.opponents = config.opponent_count
        self.reward = REWARD_FUNCTIONS[config.pool_reward]
        self.seed = config.seed
        self.labels_used = 0
        self.totals = dict.fromkeys(COST_FIGURES, 0)

    def resume(self, last: dict[str, Any]) -> None:
        """Continue the totals of the metrics row a resumed run starts after."""
        self.labels_used = int(last.get("labels_used") or 0)
        for name in COST_FIGURES:
            self.totals[name] = last.get(name) or 0

    def comparisons(self, group: Sequence[tuple[str, str | None, str]]) -> list[tuple[int, int]]:
        """The seeded schedule of one group (its rows' (instruction, input, response))."""
        rng = random.Random(derive_seed(self.seed, "pool comparisons", stable_hash(list(group))))
        return opponent_pairs(len(group), self.opponents, rng)

    def score(
        self,
        items: Sequence[tuple[str, str | None, str]],
        progress: Any = None,
        finished: Sequence[bool] | None = None,
    ) -> list[float]:
        """The reward of each row: groups of k consecutive rows, each row its
        (instruction, input, response). Raises BudgetSpent when --max-cost does not pay for all
        the comparisons."""
        if len(items) % self.size:
            raise ValueError(f"{len(items)} responses are not groups of {self.size}")
        groups = [items[start : start + self.size] for start in range(0, len(items), self.size)]
        schedules, pairs = [], []
        for group in groups:
            if len({(instruction, prompt_input) for instruction, prompt_input, _ in group}) > 1:
                raise ValueError("a group's responses answer different prompts")
            schedule = self.comparisons(group)
            schedules.append(schedule)
            instruction, prompt_input, _ = group[0]
            pairs += [
                {
                    "instruction": instruction,
                    "input": prompt_input or "",
                    "output_1": group[first][2],
                    "output_2": group[second][2],
                    "generator_1": self.tool,
                    "generator_2": self.tool,
                    "sample_index_1": first,
                    "sample_index_2": second,
                }
                for first, second in schedule
            ]
        max_cost = self.judge.max_cost
        budget = None if max_cost is None else max_cost - self.totals["spent"]
        asked = self.judge.preferences(pairs, self.seed, budget)
        if asked is None:
            raise BudgetSpent(
                f"--max-cost: ${budget:.4f} left of ${max_cost:.4f} pays for no step's "
                f"{len(pairs)} comparisons"
            )
        preferences, cost = asked
        self.labels_used += cost["pairs"]
        for name, key in zip(
            COST_FIGURES, ("requests", "judge_calls", "cache_hits", "price"), strict=True
        ):
            self.totals[name] += cost[key]
        rewards: list[float] = []
        start = 0
        for schedule in schedules:
            verdicts = preferences[start : start + len(schedule)]
            rewards += self.reward(self.size, outcomes(schedule, verdicts))
            start += len(schedule)
        if progress is not None:
            progress.update(len(items))
        return rewards
