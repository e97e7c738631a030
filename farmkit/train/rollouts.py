"""The rollout every policy-gradient method shares (PPO, RLOO, GRPO and Quark): load the
policy and its frozen reference in one precision, take prompts in a seeded order, sample responses
from exactly the tempered policy, score them with the reward model and penalize unfinished ones."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from farmkit.core.seeds import derive_seed
from farmkit.train import policy as P

# Policy and reference share this precision: a reference in bf16 beside an fp32 policy makes the KL
# non-zero before the first update (and an automatic dtype picks bf16 on a GPU or from the config).
TRAINING_DTYPE = "float32"


@dataclass
class ScoredRollout:
    """One batch of sampled responses with the reward model's verdicts."""

    rollout: P.Rollout
    prompt_indices: list[int]  # row -> index into the prompt records
    texts: list[str]  # responses as farm-sample writes them
    rewards: torch.Tensor  # the reward model's scores
    scores: (
        torch.Tensor
    )  # what the method optimizes: rewards, unfinished answers penalized if asked
    # the rollout engine's log-probabilities of the sampled tokens [batch, response width] (vLLM's;
    # None when the policy sampled itself)
    engine_logprobs: torch.Tensor | None = None

    def rows(self, index: Sequence[int]) -> ScoredRollout:
        """These rows of the batch."""
        picked = torch.as_tensor(list(index), dtype=torch.long)
        return ScoredRollout(
            self.rollout.rows(picked.to(self.rollout.response_ids.device)),
            [self.prompt_indices[i] for i in index],
            [self.texts[i] for i in index],
            self.rewards[picked.to(self.rewards.device)],
            self.scores[picked.to(self.scores.device)],
            None if self.engine_logprobs is None else self.engine_logprobs[picked],
        )


def join(batches: Sequence[ScoredRollout], pad_token_id: int) -> ScoredRollout:
    """The batches one after the other, prompts padded on the left and responses on the right to
    the widest (what sample_rollout would have built from them at once)."""
    import torch.nn.functional as F

    def padded(get: Any, value: float, left: bool) -> torch.Tensor:
        width = max(get(b).shape[1] for b in batches)
        return torch.cat(
            [
                F.pad(
                    get(b),
                    (width - get(b).shape[1], 0) if left else (0, width - get(b).shape[1]),
                    value=value,
                )
                for b in batches
            ]
        )

    rollout = P.Rollout(
        padded(lambda b: b.rollout.prompt_ids, pad_token_id, left=True),
        padded(lambda b: b.rollout.prompt_mask, 0, left=True),
        padded(lambda b: b.rollout.response_ids, pad_token_id, left=False),
        padded(lambda b: b.rollout.response_mask, 0, left=False),
        torch.cat([b.rollout.finished for b in batches]),
        None
        if batches[0].rollout.kept is None
        else padded(lambda b: b.rollout.kept, 0, left=False),
    )
    engine = None
    if batches[0].engine_logprobs is not None:
        engine = padded(lambda b: b.engine_logprobs, 0.0, left=False)
    return ScoredRollout(
        rollout,
        [i for b in batches for i in b.prompt_indices],
        [t for b in batches for t in b.texts],
        torch.cat([b.rewards for b in batches]),
        torch.cat([b.scores for b in batches]),
        engine,
    )


def load_policy_and_reference(
    model: str | Path,
    device: str,
    reference: bool = True,
    start_from: str | Path | None = None,
    reference_device: str | None = None,
) -> tuple[Any, Any, Any]:
    """(policy, frozen reference or None, tokenizer), both from `model` in TRAINING_DTYPE; the policy
    from `start_from` instead when given (a checkpoint being resumed); the reference on
    `reference_device` when given (the CPU, for a reference to be offloaded)."""
    from farmkit.lm.models import load_causal_lm

    policy, tokenizer = load_causal_lm(start_from or model, device=device, dtype=TRAINING_DTYPE)
    frozen = None
    if reference:
        frozen, _ = load_causal_lm(model, device=reference_device or device, dtype=TRAINING_DTYPE)
        frozen.requires_grad_(False)
    return policy, frozen, tokenizer


def prompt_order(n_prompts: int, needed: int, seed: int) -> list[int]:
    """At least `needed` prompt indices: successive seeded shuffles of all prompts (epochs), so a run
    resumed at any step takes the same prompts as one that never stopped."""
    rng = random.Random(derive_seed(seed, "prompt order"))
    order: list[int] = []
    while len(order) < needed:
        epoch = list(range(n_prompts))
        rng.shuffle(epoch)
        order.extend(epoch)
    return order


def penalize_unfinished(
    rewards: torch.Tensor, finished: torch.Tensor, unfinished: str, penalty: float
) -> torch.Tensor:
    """Scores to optimize: under 'penalty' an answer that never ended scores `penalty`; under
    'truncate' the truncated text keeps its reward."""
    if unfinished == "truncate":
        return rewards.clone()
    return torch.where(finished.to(rewards.device), rewards, torch.full_like(rewards, penalty))


def sample_and_score(
    policy: Any,
    tokenizer: Any,
    scorer: Any,
    records: Sequence[dict[str, Any]],
    prompts: Sequence[Sequence[int]],
    indices: Sequence[int],
    *,
    temperature: float,
    max_new_tokens: int,
    unfinished: str,
    unfinished_penalty: float,
    seed: int,
    suppress: Sequence[int] = (),
    backend: Any = None,
    top_p: float = 1.0,
    top_k: int = 0,
) -> ScoredRollout:
    """Sample one response to each of prompts[i] for i in indices (seeded; prompts as token ids from
    policy.fit_rollout_prompts, so a prompt longer than the context has lost its beginning), score it
    against its instruction record with `scorer` (a RewardScorer, told which responses finished) and
    apply the unfinished rule. `backend` (farmkit.train.rollout_backends) samples; by default
    the policy itself, with transformers. `top_p` < 1 or `top_k` > 0: from the tempered
    distribution truncated (policy.truncation_mask)."""
    chosen = [prompts[i] for i in indices]
    if backend is None:
        torch.manual_seed(seed % 2**63)
        rollout = P.sample_rollout(
            policy,
            tokenizer,
            chosen,
            temperature,
            max_new_tokens,
            suppress,
            top_p=top_p,
            top_k=top_k,
        )
        engine_logprobs = None
    else:
        rollout, engine_logprobs = backend.sample(
            policy,
            tokenizer,
            chosen,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            suppress=suppress,
            top_p=top_p,
            top_k=top_k,
        )
    return score_rollout(
        tokenizer,
        scorer,
        records,
        indices,
        rollout,
        engine_logprobs,
        unfinished=unfinished,
        unfinished_penalty=unfinished_penalty,
    )


def score_rollout(
    tokenizer: Any,
    scorer: Any,
    records: Sequence[dict[str, Any]],
    indices: Sequence[int],
    rollout: P.Rollout,
    engine_logprobs: torch.Tensor | None,
    *,
    unfinished: str,
    unfinished_penalty: float,
) -> ScoredRollout:
    """A sampled rollout (rows: prompts[i] for i in indices) scored against its instruction records
    with `scorer`, the unfinished rule applied (sample_and_score's second half; --async-rollouts
    samples ahead and scores when the step comes)."""
    texts = P.decode_responses(tokenizer, rollout)
    rewards = torch.tensor(
        scorer.score(
            [
                (records[i]["instruction"], records[i].get("input"), text)
                for i, text in zip(indices, texts, strict=True)
            ],
            # a cut-off answer is scored without an end token, so the reward model can tell it
            # from a finished one (what --unfinished truncate relies on)
            finished=rollout.finished.tolist(),
        ),
        device=rollout.response_mask.device,
    )
    scores = penalize_unfinished(rewards, rollout.finished, unfinished, unfinished_penalty)
    return ScoredRollout(rollout, list(indices), texts, rewards, scores, engine_logprobs)
