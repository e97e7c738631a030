"""Group rewards from pairwise verdicts (farmkit.train.pairwise), with a judge whose verdicts are
known (the longer answer wins): the rewards are the win rates the verdicts imply and land on the
responses that earned them, K opponents are balanced, Bradley-Terry ranks as the win rates do, null
verdicts are left out, and --max-cost stops before a step it does not pay for."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest
from policy_fixtures import FakePairJudge

from farmkit.train.pairwise import (
    BudgetSpent,
    PairwiseScorer,
    bradley_terry,
    opponent_pairs,
    outcomes,
    win_rates,
)


def longer(a: str, b: str) -> bool:
    return len(a) > len(b)


def longer_wins(max_cost: float | None = None) -> FakePairJudge:
    """The longer output wins (equal lengths tie), at $0.5 a pair."""
    return FakePairJudge(longer, price=0.5, max_cost=max_cost)


def config(k: int = 4, opponents: int | None = None, reward: str = "win-rate") -> SimpleNamespace:
    return SimpleNamespace(
        pool="longer-wins",
        samples_per_prompt=k,
        opponent_count=opponents,
        pool_reward=reward,
        seed=0,
        tool="farm-grpo",
    )


def group(prompt: str, lengths: list[int]) -> list[tuple[str, str, str]]:
    return [(prompt, "", "x" * length) for length in lengths]


def test_rewards_are_the_win_rates_the_verdicts_imply_on_the_right_responses():
    judge = longer_wins()
    scorer = PairwiseScorer(judge, config(k=4))
    # two groups; each response's length is its rank in its group, in a shuffled order
    items = group("a", [3, 1, 4, 2]) + group("b", [2, 2, 5, 1])
    rewards = scorer.score(items)
    # group a, every pair: the longest beats the 3 others, the shortest none
    assert rewards[:4] == [2 / 3, 0.0, 1.0, 1 / 3]
    # group b: the two of length 2 tie each other (half a win), beat the 1 and lose to the 5
    assert rewards[4:] == [0.5, 0.5, 1.0, 0.0]
    asked = judge.asked[0]
    assert len(asked) == 12 and scorer.labels_used == 12  # 4 x 3 / 2 pairs per group
    assert all(pair["instruction"] in "ab" for pair in asked)
    # each pair's outputs are its group's and the sample indices say which response they are
    for pair in asked:
        members = items[:4] if pair["instruction"] == "a" else items[4:]
        assert members[pair["sample_index_1"]][2] == pair["output_1"]
        assert members[pair["sample_index_2"]][2] == pair["output_2"]
    assert scorer.totals == {
        "annotator_requests": 12,
        "judge_calls": 12,
        "cache_hits": 0,
        "spent": 6.0,
    }


def test_the_reward_follows_the_response_not_its_row():
    scorer = PairwiseScorer(longer_wins(), config(k=4, opponents=2))
    lengths = [5, 9, 1, 7]
    order = [2, 0, 3, 1]
    first = scorer.score(group("p", lengths))
    moved = scorer.score(group("p", [lengths[i] for i in order]))
    # a response that won all (or none) of its comparisons keeps its reward wherever it sits
    by_length = dict(zip(lengths, first, strict=True))
    assert by_length[9] == 1.0 and by_length[1] == 0.0
    for row, index in enumerate(order):
        if lengths[index] in (1, 9):
            assert moved[row] == by_length[lengths[index]]


@pytest.mark.parametrize(
    ("size", "opponents"), [(4, 1), (4, 2), (4, 3), (6, 3), (8, 2), (5, 2), (8, 5)]
)
def test_k_opponents_are_balanced_distinct_and_seeded(size, opponents):
    pairs = opponent_pairs(size, opponents, random.Random(7))
    assert len(pairs) == size * opponents // 2
    met = Counter(i for pair in pairs for i in pair)
    assert met == dict.fromkeys(range(size), opponents)  # every response judged K times
    assert all(i != j for i, j in pairs)
    assert len({frozenset(pair) for pair in pairs}) == len(pairs)  # no pair twice
    assert pairs == opponent_pairs(size, opponents, random.Random(7))
    draws = {tuple(opponent_pairs(size, opponents, random.Random(seed))) for seed in range(20)}
    assert len(draws) > 1  # the schedule (who meets whom, who is output_1) is drawn


def test_all_opponents_is_every_pair_in_both_positions_over_draws():
    pairs = opponent_pairs(5, None, random.Random(0))
    assert {frozenset(pair) for pair in pairs} == {
        frozenset((i, j)) for i in range(5) for j in range(i + 1, 5)
    }
    firsts = Counter(
        i for seed in range(200) for i, _ in opponent_pairs(5, None, random.Random(seed))
    )
    assert all(300 < firsts[i] < 500 for i in range(5))  # 400 expected: the order is a coin


@pytest.mark.parametrize(("size", "opponents"), [(4, 4), (5, 3), (4, 0)])
def test_an_impossible_schedule_is_refused(size, opponents):
    with pytest.raises(ValueError, match="opponents in a group"):
        opponent_pairs(size, opponents, random.Random(0))


def test_bradley_terry_ranks_as_the_win_rates_with_every_pair():
    rng = random.Random(3)
    for _ in range(20):
        pairs = opponent_pairs(6, None, rng)
        results = outcomes(pairs, [rng.choice([1.0, 1.5, 2.0]) for _ in pairs])
        rates, strengths = win_rates(6, results), bradley_terry(6, results)
        for i in range(6):
            for j in range(6):
                if rates[i] > rates[j] + 1e-9:
                    assert strengths[i] > strengths[j]


def test_bradley_terry_uses_transitivity_where_win_rates_cannot():
    # two opponents each (a circle 0-1-2-3-0): 0 beat 1 and 3, 1 beat 2, 2 beat 3; 1 and 2 both
    # won one of two, but 1 lost to the strongest and 2 to 1
    results = [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0), (3, 0, 0.0)]
    rates = win_rates(4, results)
    strengths = bradley_terry(4, results)
    assert rates[1] == rates[2] == 0.5  # one win, one loss each
    assert strengths[1] > strengths[2]  # 1's win was over 2, who beat 3
    assert strengths == sorted(strengths, reverse=True)
    assert abs(sum(strengths)) < 1e-9  # the prior centres them


def test_null_verdicts_are_left_out_and_a_response_without_any_scores_half():
    assert outcomes([(0, 1), (1, 2), (2, 0)], [None, 1.5, 2.0]) == [(1, 2, 0.5), (2, 0, 0.0)]
    assert win_rates(4, [(1, 2, 0.5), (2, 0, 0.0)]) == [1.0, 0.5, 0.25, 0.5]


def test_max_cost_stops_before_a_step_it_does_not_pay_for_and_totals_resume():
    judge = longer_wins(max_cost=8.0)
    scorer = PairwiseScorer(judge, config(k=4))
    scorer.score(group("a", [1, 2, 3, 4]))  # 6 pairs: $3
    scorer.score(group("a", [1, 2, 3, 5]))  # $6 spent, $2 left
    with pytest.raises(BudgetSpent, match=r"\$2.0000 left of \$8.0000"):
        scorer.score(group("a", [1, 2, 3, 6]))
    assert len(judge.asked) == 2 and scorer.labels_used == 12
    resumed = PairwiseScorer(judge, config(k=4))
    resumed.resume({"labels_used": 12, **scorer.totals})
    with pytest.raises(BudgetSpent):  # what was spent before counts
        resumed.score(group("a", [1, 2, 3, 7]))


def test_bradley_terry_rewards_through_the_scorer_are_ordered_by_length():
    scorer = PairwiseScorer(longer_wins(), config(k=6, reward="bradley-terry"))
    lengths = [4, 1, 6, 3, 5, 2]
    rewards = scorer.score(group("p", lengths))
    assert sorted(range(6), key=rewards.__getitem__) == sorted(range(6), key=lengths.__getitem__)


def test_a_group_that_mixes_prompts_is_refused():
    scorer = PairwiseScorer(longer_wins(), config(k=2))
    with pytest.raises(ValueError, match="different prompts"):
        scorer.score([("a", "", "x"), ("b", "", "yy")])
