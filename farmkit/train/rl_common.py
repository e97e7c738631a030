"""The arithmetic of policy-gradient fine-tuning that PPO and Quark share, on padded [batch, tokens]
tensors with a 0/1 mask of the response tokens that count: masked statistics and whitening (across
processes too), the per-token KL penalty with the score added at the last token, GAE, and the
clipped policy and value losses. Pure torch, no model code, so every piece is unit-tested by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# sums that several processes add up (accelerate's reduce); identity on one process
Reduce = Callable[[torch.Tensor], torch.Tensor]


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None
) -> torch.Tensor:
    """Mean over the entries where mask is 1, over all processes when `reduce` sums across them."""
    total = torch.stack([masked_sum(values, mask), mask.sum().to(values.dtype)])
    if reduce is not None:
        total = reduce(total)
    return total[0] / total[1].clamp(min=1)


def masked_var(
    values: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None
) -> torch.Tensor:
    """Population variance over the masked entries (all processes with `reduce`)."""
    mean = masked_mean(values, mask, reduce)
    return masked_mean((values - mean) ** 2, mask, reduce)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, reduce: Reduce | None = None
) -> torch.Tensor:
    """Normalize to unit variance (and zero mean when shift_mean) using only the masked entries.

    Padding neither enters the statistics nor keeps a value: masked-out entries come back as 0.
    AlpacaFarm whitened per process and counted padding; here the statistics cover the whole
    rollout batch on every process.
    """
    mean = masked_mean(values, mask, reduce)
    var = masked_var(values, mask, reduce)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of a response mask (0 for an empty row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return (positions * mask.long()).max(dim=1).values


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probabilities.

    k1: log pi - log pi_ref, unbiased, negative on some tokens. clamped: k1 floored at 0 (AlpacaFarm's),
    biased upwards. k3: (r - 1) - log r with r = pi_ref / pi, unbiased and never negative (Schulman's
    "Approximating KL divergence", 2020)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "clamped":
        return log_ratio.clamp(min=0.0)
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}")


def kl_penalized_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: -kl_coef * KL estimate (see kl_estimate) on every response token, plus the
    reward model's score on the last one. Returns (rewards, per-token KL estimate), both zero on padding."""
    kl = kl_estimate(logprobs, ref_logprobs, estimator) * mask
    rewards = -kl_coef * kl
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last_token_index(mask)] += scores.to(rewards.dtype)
    return rewards * mask, kl


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al., 2025, eq. 13), added to a response's score: 0 up
    to max_length - cache tokens, then (max_length - cache - length) / cache, -1 at max_length
    (and beyond, for a length that got there)."""
    expected = max_length - cache
    return ((expected - lengths.float()) / cache).clamp(min=-1.0, max=0.0)


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """Learning-rate factor after `done` scheduler steps: rises linearly to 1 over `warmup` steps, then
    falls linearly to 0 at `total` (what AlpacaFarm's PPO and Quark ran)."""

    def factor(done: int) -> float:
        if done < warmup:
            return (done + 1) / warmup
        return max(0.0, 1.0 - (done - warmup) / max(1, total - warmup))

    return factor


def generalized_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over each response (padding after the end carries no reward and no value).

    With gamma = lam = 1 the advantage of token t is the sum of the rewards from t to the end minus
    V(t), and the return is that sum. Returns (advantages, returns), zero on padding.
    """
    values = values * mask
    rewards = rewards * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    width = rewards.shape[1]
    for t in reversed(range(width)):
        next_value = values[:, t + 1] if t + 1 < width else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def clipped_policy_terms(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    low: float,
    high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's pessimistic surrogate per entry, max(-A r, -A clip(r, 1 - low, 1 + high)) with
    r = exp(log_ratio) (one range, or DAPO's clip-higher when high > low), and its figures per
    entry: whether the clipped branch won, and the update's approximate KL 0.5 log_ratio^2. The
    caller aggregates (farmkit.train.estimators). `delta`: two-sided clipping (INTELLECT-2; TRL's
    GRPOConfig.delta), the first branch's r capped at delta, so that a negative advantage's term
    stops growing (and its gradient stops) once r passes delta."""
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * (ratio if delta is None else ratio.clamp(max=delta))
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    figures = {
        "clip_fraction": (clipped > unclipped).detach(),
        "approx_kl": 0.5 * log_ratio.detach() ** 2,
    }
    return torch.maximum(unclipped, clipped), figures


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    tokens: Any = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * mean over tokens of max((V - R)^2, (V_clipped - R)^2), V_clipped kept within `clip` of
    the rollout's value. Returns (loss, stats)."""
    count = mask.sum().clamp(min=1) if tokens is None else tokens
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * masked_sum(torch.maximum(unclipped_error, clipped_error), mask) / count
    with torch.no_grad():
        stats = {
            "value_clip_fraction": masked_sum((clipped_error > unclipped_error).float(), mask)
            / count
        }
    return loss, stats


def response_mask(
    response_ids: torch.Tensor, eos_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, finished): 1 on each response token up to and including the first end-of-sequence
    token, 0 after it (padding, which may share the eos id); finished says whether the row ended."""
    is_eos = response_ids == eos_token_id
    finished = is_eos.any(dim=1)
    eos_seen_before = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0
    return (~eos_seen_before).to(torch.float32), finished
