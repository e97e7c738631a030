"""The parts in which the on-policy methods differ, each a registered function (the shape of verl's
core_algos.py): how a rollout batch's scores become advantages, and how a micro-batch's clipped
surrogate is aggregated into a loss. farmkit.train.onpolicy runs the loop they share.

Advantage estimators (ADVANTAGE_ESTIMATORS):
- gae: per-token rewards (the score at the last token, the KL penalty on every token) and a value
  model's per-token values -> GAE advantages and returns (PPO);
- rloo: a_i = r_i - mean of the other k - 1 scores of i's group (Ahmadian et al., 2024);
- grpo: a_i = (r_i - group mean) / (group sample std + eps) (Shao et al., 2024);
- dr_grpo: a_i = r_i - group mean (Liu et al., 2025: no division by the standard deviation).

Policy losses (POLICY_LOSSES), each PPO's pessimistic clipped surrogate aggregated its own way:
- token-mean: per-token ratios, summed over every response token of the minibatch, divided by the
  minibatch's token count (PPO);
- sequence-ratio: one ratio per response (its summed token log-ratio), averaged over the
  minibatch's responses (RLOO treats the response as one action);
- seq-mean-token-mean: per-token ratios averaged over each response's own tokens, then over the
  minibatch's responses (GRPO);
- seq-mean-token-sum-norm: per-token ratios summed over each response and divided by a constant
  (max-new-tokens), then averaged over responses (Dr.GRPO: no per-response length normalization).

Every loss takes optional per-token importance weights (truncated importance sampling of the
rollout engine's mismatch, farmkit.train.rollout_backends.truncated_is_weights): the surrogate of
each token is multiplied by its weight; None leaves it as it is.

Each entry declares what it fits, and the methods ask it (never its name): an estimator the kind of
advantages it makes, a loss the kind it takes and how it weighs a response's tokens (`aggregate`,
which the KL term of --kl-in loss follows). farm-ppo's method makes per-token advantages (TOKEN),
farm-rloo's and farm-grpo's one per response (RESPONSE); an entry of the other kind is refused
before any work (check_fit). The options --advantage-estimator and --policy-loss offer every name
registered here (or by a module imported before the tool's options are built): a new estimator or
loss is one registered function (docs/methods.md):

    @register_advantage("my-baseline", kind=RESPONSE)
    def my_baseline_advantages(scores: torch.Tensor, k: int) -> torch.Tensor: ...

    farm-grpo sft/ rm/ prompts.jsonl -o out/ --advantage-estimator my-baseline
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the functions: `farm-grpo --help` must not load it
    import torch

    from farmkit.train import rl_common

STD_EPS = 1e-4  # added to a group's standard deviation (GRPO): a group of equal scores gets 0

# The kinds of advantages, each with what makes it and the tools whose method does (the help of
# the options and the refusals say it). A TOKEN estimator is called as
# f(rewards, values, mask, gamma, lam, reduce=...) -> (advantages, returns), all [batch, tokens];
# a RESPONSE estimator as f(scores, k) -> advantages [batch], scores in consecutive groups of k.
TOKEN = "token"
RESPONSE = "response"
ADVANTAGE_KINDS = {
    TOKEN: "per-token advantages from a value model (farm-ppo)",
    RESPONSE: "one advantage per response from its group of k samples (farm-rloo, farm-grpo)",
}


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: its function and the kind of advantages it makes."""

    compute: Callable[..., Any]
    kind: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compute(*args, **kwargs)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its function (called as MicroBatch.surrogate calls it), the kind
    of advantages it takes, how it weighs per-token terms into a micro-batch's share of the
    minibatch's loss (one of the aggregations below; the KL term of --kl-in loss is weighed
    alike), and whether importance weights apply per response (one ratio per response)."""

    compute: Callable[..., Any]
    kind: str
    aggregate: Callable[..., Any]
    per_response_weights: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compute(*args, **kwargs)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def _check_new(registry: dict[str, Any], name: str, kind: str) -> None:
    if name in registry:
        raise ValueError(f"{name!r} is registered already")
    if kind not in ADVANTAGE_KINDS:
        raise ValueError(f"{name!r}: the kind of advantages is one of {sorted(ADVANTAGE_KINDS)}")


def register_advantage(name: str, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an advantage estimator that makes advantages of `kind` (TOKEN or RESPONSE)."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        _check_new(ADVANTAGE_ESTIMATORS, name, kind)
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(function, kind)
        return function

    return register


def register_policy_loss(
    name: str, kind: str, aggregate: Callable[..., Any], per_response_weights: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a policy loss that takes advantages of `kind` and weighs its tokens as
    `aggregate` does (see PolicyLoss)."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        _check_new(POLICY_LOSSES, name, kind)
        POLICY_LOSSES[name] = PolicyLoss(function, kind, aggregate, per_response_weights)
        return function

    return register


def _entry(registry: dict[str, Any], what: str, name: str) -> Any:
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(registry)}")
    return registry[name]


def advantage_estimator(name: str) -> AdvantageEstimator:
    return _entry(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def policy_loss(name: str) -> PolicyLoss:
    return _entry(POLICY_LOSSES, "policy loss", name)


def names_of(registry: dict[str, Any], kind: str) -> str:
    """The registered names of one kind, in the order they were registered."""
    return ", ".join(name for name, entry in registry.items() if entry.kind == kind)


def check_fit(tool: str, kind: str, estimator: str, loss: str) -> None:
    """Refuse (ValueError) an estimator or a loss that is not of `kind`, the kind of advantages
    the method of `tool` makes, saying which tools it is for and what this one takes."""
    for option, registry, entry in (
        ("--advantage-estimator", ADVANTAGE_ESTIMATORS, advantage_estimator(estimator)),
        ("--policy-loss", POLICY_LOSSES, policy_loss(loss)),
    ):
        if entry.kind != kind:
            name = estimator if registry is ADVANTAGE_ESTIMATORS else loss
            raise ValueError(
                f"{option} {name} is for {ADVANTAGE_KINDS[entry.kind]}; "
                f"{tool} takes {names_of(registry, kind)}"
            )


# ---------------------------------------------------------------------------------------------
# Advantages


@register_advantage("gae", TOKEN)
def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    reduce: rl_common.Reduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both [batch, tokens]: GAE over each response, the advantages whitened
    over the whole rollout batch (every process with `reduce`), padding left out."""
    from farmkit.train import rl_common

    advantages, returns = rl_common.generalized_advantages(rewards, values, mask, gamma, lam)
    return rl_common.masked_whiten(advantages, mask, reduce=reduce), returns


@register_advantage("rloo", RESPONSE)
def rloo_advantages(scores: torch.Tensor, k: int) -> torch.Tensor:
    """a_i = r_i - (sum of the other k - 1 scores of i's group) / (k - 1); scores hold consecutive
    groups of k. Each group's advantages sum to 0."""
    grouped = scores.reshape(-1, k)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (k - 1)
    return (grouped - baseline).reshape(scores.shape)


@register_advantage("grpo", RESPONSE)
def grpo_advantages(
    scores: torch.Tensor, k: int, scale: bool = True, eps: float = STD_EPS
) -> torch.Tensor:
    """a_i = (r_i - group mean) / (group sample std + eps), or r_i - group mean when not `scale`
    (Dr.GRPO); scores hold consecutive groups of k."""
    grouped = scores.reshape(-1, k)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(scores.shape)


@register_advantage("dr_grpo", RESPONSE)
def dr_grpo_advantages(scores: torch.Tensor, k: int) -> torch.Tensor:
    """a_i = r_i - group mean (no division by the group's standard deviation)."""
    return grpo_advantages(scores, k, scale=False)


# ---------------------------------------------------------------------------------------------
# Aggregations: how a loss weighs per-token terms [batch, tokens] into a micro-batch's share of
# its minibatch's loss (verl's loss_agg_mode). Each takes the terms and the response mask, with
# the minibatch's `responses` and `tokens` and the constant `norm` (max-new-tokens) by keyword.


def token_mean(values: torch.Tensor, mask: torch.Tensor, *, tokens: Any, **_: Any) -> torch.Tensor:
    """Summed over every token, divided by the minibatch's tokens: a long response weighs more."""
    from farmkit.train import rl_common

    return rl_common.masked_sum(values, mask) / tokens


def seq_mean_token_sum(
    values: torch.Tensor, mask: torch.Tensor, *, responses: int, **_: Any
) -> torch.Tensor:
    """Summed over each response's tokens, averaged over the minibatch's responses."""
    from farmkit.train import rl_common

    return rl_common.masked_sum(values, mask) / responses


def seq_mean_token_mean(
    values: torch.Tensor, mask: torch.Tensor, *, responses: int, **_: Any
) -> torch.Tensor:
    """Averaged over each response's own tokens, then over the minibatch's responses."""
    from farmkit.train import rl_common

    return rl_common.masked_sum(values, seq_mean_token_weights(mask)) / responses


def seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, *, responses: int, norm: int, **_: Any
) -> torch.Tensor:
    """Summed over each response's tokens and divided by the constant `norm`, then averaged over
    the minibatch's responses."""
    from farmkit.train import rl_common

    return rl_common.masked_sum(values, mask / norm) / responses


# ---------------------------------------------------------------------------------------------
# Policy losses. Each returns (loss, stats) for one micro-batch, the loss already divided by what
# its whole minibatch counts (tokens or responses), so micro-batch losses add up to the minibatch's.


def _weighted(advantages: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """A non-negative per-token weight scales both branches of the pessimistic max alike, so
    weighting the advantage weights the surrogate (and leaves clipping decisions as they were)."""
    return advantages if weights is None else advantages * weights


@register_policy_loss("token-mean", TOKEN, token_mean)
def token_mean_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    *,
    tokens: Any,
    weights: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token advantages [batch, tokens]; divided by the minibatch's `tokens`."""
    from farmkit.train import rl_common

    return rl_common.clipped_policy_loss(
        logprobs, old_logprobs, _weighted(advantages, weights), mask, clip, tokens
    )


@register_policy_loss("sequence-ratio", RESPONSE, seq_mean_token_sum, per_response_weights=True)
def sequence_ratio_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    *,
    responses: int,
    weights: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-response advantages [batch]; one ratio per response (its summed token log-ratio),
    divided by the minibatch's `responses`. Stats per response. `weights` here are per response
    [batch] (the capped ratio of the whole response's probabilities)."""
    from farmkit.train import rl_common

    sequence = (logprobs * mask).sum(dim=1, keepdim=True)
    old_sequence = (old_logprobs * mask).sum(dim=1, keepdim=True)
    ones = mask.new_ones(sequence.shape)
    per_response = advantages[:, None]
    if weights is not None:
        per_response = per_response * weights[:, None]
    return rl_common.clipped_policy_loss(
        sequence, old_sequence, per_response, ones, clip, responses
    )


def _grouped_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    token_weights: torch.Tensor,
    responses: int,
    tokens: Any,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    from farmkit.train import rl_common

    per_token = advantages[:, None] * mask
    loss, _ = rl_common.clipped_policy_loss(
        logprobs, old_logprobs, _weighted(per_token, weights), token_weights, clip, responses
    )
    _, stats = rl_common.clipped_policy_loss(
        logprobs.detach(), old_logprobs, per_token, mask, clip, tokens
    )
    return loss, stats


@register_policy_loss("seq-mean-token-mean", RESPONSE, seq_mean_token_mean)
def seq_mean_token_mean_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    *,
    responses: int,
    tokens: Any,
    weights: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-response advantages [batch] applied to each token; each response's token terms averaged
    over its own length, then over the minibatch's `responses`. Stats per token of the minibatch."""
    return _grouped_token_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip,
        seq_mean_token_weights(mask),
        responses,
        tokens,
        weights,
    )


@register_policy_loss("seq-mean-token-sum-norm", RESPONSE, seq_mean_token_sum_norm)
def seq_mean_token_sum_norm_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    *,
    responses: int,
    tokens: Any,
    norm: int,
    weights: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """As seq-mean-token-mean, but each response's token terms summed and divided by the constant
    `norm` (max-new-tokens), not by its own length."""
    return _grouped_token_loss(
        logprobs, old_logprobs, advantages, mask, clip, mask / norm, responses, tokens, weights
    )


def seq_mean_token_weights(mask: torch.Tensor) -> torch.Tensor:
    """Each token's weight when a response's terms are averaged over its own tokens."""
    return mask / mask.sum(dim=1, keepdim=True).clamp(min=1)
