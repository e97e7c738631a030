"""The `oracle` backend: preferences from a known "true" reward, for offline simulations and reward
over-optimization studies.

The gold reward is a learned judge (a folder written by farm-judge-train, or the name of one shipped in
farmkit/annotate/judges/), a reward model folder (scored by RewardScorer, as the methods score it), or the
documented heuristic `gold_reward` below. An oracle judge prefers answer A with probability
    sigmoid((r(A) - r(B) + length_bias * (log1p(words(A)) - log1p(words(B))) + position_bias) / T)
(Bradley-Terry with temperature T; T = 0 picks the higher side deterministically, equal rewards tie).
`length_bias` and `position_bias` make judges that differ the way LLM judges do.
"""

from __future__ import annotations

import math
from typing import Any

from farmkit.annotate.base import Backend, Verdict, decide, sigmoid
from farmkit.annotate.learned import load_judge, words
from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown

_STOPWORDS = frozenset(
    "the a an and or but if then else of to in on at by for with from as is are was were be been being it its "
    "this that these those there here what which who whom whose when where why how can could should would will "
    "shall may might must do does did done have has had having not no yes you your yours me my mine we our us "
    "they them their he him his she her i about into than so such very just also any some all each more most "
    "give write make tell explain describe list following please using use one two three".split()
)
CLEAN_ENDINGS = tuple(".!?)]\"'`*:;") + ("```",)

# Weights of the four parts of the heuristic gold reward (they sum to 1).
RELEVANCE, LENGTH, VARIETY, ENDING = 0.35, 0.30, 0.20, 0.15
LENGTH_SCALE, LENGTH_PEAK = 50.0, 150.0  # words


def gold_reward(instruction: str, input: str, output: str) -> float:
    """The heuristic "true" reward of an answer, in [0, 1]; higher is better.

    - relevance (0.35): share of the instruction's and input's content words (3+ letters, not
      stopwords) that the answer uses, saturating at 8 such words;
    - length (0.30): 1 - exp(-words / 50), with diminishing returns, then decaying past 150 words
      (exp(-(words - 150) / 150)), so "longer" helps only up to a point;
    - variety (0.20): (distinct word trigrams / trigrams) squared, which punishes degenerate repetition;
    - ending (0.15): 1 if the answer ends like finished text (. ! ? a closing bracket, quote or code
      fence), 0 if it stops mid-sentence (a truncated generation).
    An empty answer scores 0. Each part can be pushed by a policy, and a learned reward model that
    picks up only some of them (length, keywords) can be exploited: that is what the over-optimization
    study measures.
    """
    tokens = words(output)
    if not tokens:
        return 0.0
    content = {
        word
        for word in words(f"{instruction} {input or ''}")
        if len(word) >= 3 and word not in _STOPWORDS
    }
    if content:
        relevance = min(1.0, len(content.intersection(tokens)) / min(len(content), 8))
    else:
        relevance = 1.0
    count = len(tokens)
    length = 1.0 - math.exp(-count / LENGTH_SCALE)
    if count > LENGTH_PEAK:
        length *= math.exp(-(count - LENGTH_PEAK) / LENGTH_PEAK)
    trigrams = [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]
    variety = (len(set(trigrams)) / len(trigrams)) ** 2 if trigrams else 1.0
    ending = 1.0 if output.rstrip().endswith(CLEAN_ENDINGS) else 0.0
    return RELEVANCE * relevance + LENGTH * length + VARIETY * variety + ENDING * ending


class OracleBackend(Backend):
    """Verdicts from the gold reward (heuristic or reward model), with the judge's biases and temperature."""

    name = "oracle"
    bulk = True

    def __init__(self, pool: Pool, options: dict[str, Any]) -> None:
        super().__init__(pool, options)
        self._models: dict[str, Any] = {}
        self._scores: dict[tuple[str, str, str, str], float] = {}

    def model_name(self, judge: Judge) -> str:
        return "gold-heuristic" if judge.reward == "heuristic" else judge.reward

    async def judge(
        self,
        judge: Judge,
        pairs: list[Shown],
        draws: list[float],
        seed: int,
        reservation: Any = None,  # unpriced: no budget to hold
    ) -> list[Verdict]:
        rewards = self.rewards(
            judge.reward,
            [(p.instruction, p.input, o) for p in pairs for o in (p.output_a, p.output_b)],
        )
        verdicts = []
        for number, (pair, draw) in enumerate(zip(pairs, draws, strict=True)):
            reward_a, reward_b = rewards[2 * number], rewards[2 * number + 1]
            margin = reward_a - reward_b + judge.position_bias
            margin += judge.length_bias * (
                math.log1p(len(words(pair.output_a))) - math.log1p(len(words(pair.output_b)))
            )
            if judge.temperature == 0:
                probability = 0.5 if margin == 0 else (1.0 if margin > 0 else 0.0)
            else:
                probability = sigmoid(margin / judge.temperature)
            verdicts.append(
                Verdict(
                    decide(probability, judge.temperature, draw),
                    model=self.model_name(judge),
                    probability=round(probability, 6),
                )
            )
        return verdicts

    def rewards(self, reward: str, texts: list[tuple[str, str, str]]) -> list[float]:
        """Gold rewards of (instruction, input, output) triples, each computed once per run."""
        missing = [t for t in dict.fromkeys(texts) if (reward, *t) not in self._scores]
        if missing:
            if reward == "heuristic":
                scores = [gold_reward(*t) for t in missing]
            else:
                scores = self._model_rewards(reward, missing)
            self._scores.update({(reward, *t): s for t, s in zip(missing, scores, strict=True)})
        return [self._scores[(reward, *t)] for t in texts]

    def _model_rewards(self, folder: str, texts: list[tuple[str, str, str]]) -> list[float]:
        """A learned judge's rewards, or a reward model's scores read exactly as the methods that
        optimize it read them (RewardScorer: the formatted prompt, the answer and its end token,
        scored at that token)."""
        if folder not in self._models:
            judge = load_judge(folder)
            if judge is None:
                from farmkit.train.scoring import RewardScorer

                judge = RewardScorer(folder)
            self._models[folder] = judge
        return self._models[folder].score(texts)

    async def close(self) -> None:
        self._models.clear()
