"""The parts in which the on-policy methods differ, each a registered function (the shape of verl's
core_algos.py): how a rollout batch's scores become advantages, and how a micro-batch's clipped
surrogate is aggregated into a loss. farmkit.train.onpolicy runs the loop they share.

Advantage estimators (ADVANTAGE_ESTIMATORS):
- gae: per-token rewards (the score at the last token, the KL penalty on every token) and a value
  model's per-token values -> GAE advantages and returns (PPO);
- rloo: a_i = r_i - mean of the other k - 1 scores of i's group (Ahmadian et al., 2024);
- grpo: a_i = (r_i - group mean) / (group sample std + eps) (Shao et al., 2024);
- dr_grpo: a_i = r_i - group mean (Liu et al., 2025: no division by the standard deviation).

Policy losses (POLICY_LOSSES), each its terms (PPO's pessimistic clipped surrogate, the ratio
clipped to [1 - low, 1 + high]: DAPO's clip-higher when high > low, or CISPO's weight) aggregated
its own way (checked against TRL's GRPOTrainer in tests/train/test_estimators_trl.py):
- token-mean: per-token ratios, summed over every response token of the minibatch, divided by the
  minibatch's token count (PPO);
- sequence-ratio: one ratio per response (its summed token log-ratio), averaged over the
  minibatch's responses (RLOO treats the response as one action);
- seq-mean-token-mean: per-token ratios averaged over each response's own tokens, then over the
  minibatch's responses (GRPO);
- seq-mean-token-sum-norm: per-token ratios summed over each response and divided by a constant
  (max-new-tokens), then averaged over responses (Dr.GRPO: no per-response length normalization);
- dapo: per-token ratios, every token of the minibatch alike (DAPO, Yu et al., 2025);
- bnpo: as dapo, each micro-batch over its own tokens (TRL's bnpo);
- gspo: one ratio per response, exp of the mean of its token log-ratios, clipped to its own small
  range (GSPO, Zheng et al., 2025);
- cispo: min(r, 1 + high) without gradient x the advantage x the token's log-probability,
  aggregated as dapo (CISPO, MiniMax-M1, 2025);
- sapo: a soft gate in place of the clip, (4 / tau) sigmoid(tau (r - 1)) per token, tau of the
  advantage's sign, aggregated as GRPO (SAPO, Gao et al., 2025);
- luspo: GSPO's clipped ratio per response, its term multiplied by the response's length, then
  averaged over responses (LUSPO, Liu et al., 2026);
- vespo: phi(w) = w^k exp(lambda (1 - w)) without gradient x the advantage x the token's
  log-probability, w the whole response's ratio (the product of its token ratios), k and lambda
  of the advantage's sign, aggregated as dapo (VESPO, Shen et al., 2026).

Each term may be multiplied by a weight (farmkit.train.rollout_backends.rollout_correction's
correction of the rollout engine's mismatch, the off-policy mask): per token,
or per response; None leaves it as it is. A loss whose ratio is taken from the sampling engine
itself (vespo: `rollout_in_ratio`) takes the rollout correction's weights into its ratio instead.
A loss's own parameters (SAPO's temperatures, VESPO's k and lambda) are keyword arguments of its
terms, declared by name (`params`): the group tools' options of the same names.

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

import math
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
    """A registered policy loss: its per-token (or per-response) terms, the kind of advantages it
    takes, and how it weighs them into a micro-batch's share of the minibatch's loss (one of the
    aggregations below, declared once: the surrogate and the KL term of --kl-in loss are weighed by
    it alike). `per_response_weights`: one ratio per response, so importance weights (and the
    rollout correction) apply per response. `clip`: the loss's own default (low, high) clip range,
    where its publication sets one (GSPO's ratio is of another scale than a token's). `params`:
    the names of its own parameters, keyword arguments of `terms` (config fields of the same
    names). `rollout_in_ratio`: the rollout correction's weights go into its ratio (its terms'
    keyword `rollout_weights`), not onto its terms."""

    terms: Callable[..., Any]
    kind: str
    aggregate: Callable[..., Any]
    per_response_weights: bool = False
    clip: tuple[float, float] | None = None
    params: tuple[str, ...] = ()
    rollout_in_ratio: bool = False

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        clip: float | tuple[float, float],
        *,
        responses: int,
        tokens: Any,
        norm: int | None = None,
        weights: torch.Tensor | None = None,
        rollout_weights: torch.Tensor | None = None,
        params: dict[str, Any] | None = None,
        **_: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(this micro-batch's share of its minibatch's loss, its figures' shares): the terms of
        `terms`, each multiplied by its importance weight (per token [rows, tokens], or per response
        [rows]; 0 masks it), aggregated as `aggregate` says. `clip`: one range, or (low, high).
        `rollout_weights`: the rollout correction's, multiplied into `weights`, or handed to the
        terms where the loss takes them into its ratio. `params`: values of the loss's own
        parameters by name (those it does not declare are left out; those not given take the
        terms' defaults)."""
        low, high = (clip, clip) if isinstance(clip, (int, float)) else clip
        own = {name: value for name, value in (params or {}).items() if name in self.params}
        if self.rollout_in_ratio:
            own["rollout_weights"] = rollout_weights
        else:
            weights = combined_weights(rollout_weights, weights)
        terms, figures = self.terms(logprobs, old_logprobs, advantages, mask, low, high, **own)
        if weights is not None:
            # a non-negative weight scales the term after its clipping decision, as TRL and verl do
            terms = terms * (weights[:, None] if weights.dim() == 1 else weights)
        # per-response terms [rows, 1] count once each, a response without tokens 0 (as TRL's
        # mean over its tokens); per-token terms over the response mask
        per_token = terms.shape == mask.shape
        entries = mask if per_token else (mask.sum(dim=1, keepdim=True) > 0).to(terms.dtype)
        loss = self.aggregate(terms, entries, responses=responses, tokens=tokens, norm=norm)
        count = tokens if per_token else responses
        import torch

        with torch.no_grad():
            shares = {
                name: (value.float() * entries).sum() / count for name, value in figures.items()
            }
        return loss, shares


def combined_weights(first: Any, second: Any) -> Any:
    """The product of two sets of weights, each None (off), per response [rows] or per token
    [rows, tokens]: per token if either is."""
    if first is None or second is None:
        return second if first is None else first
    if first.dim() != second.dim():
        first, second = (w if w.dim() == 2 else w[:, None] for w in (first, second))
    return first * second


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
    name: str,
    kind: str,
    aggregate: Callable[..., Any],
    per_response_weights: bool = False,
    clip: tuple[float, float] | None = None,
    params: tuple[str, ...] = (),
    rollout_in_ratio: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the terms of a policy loss that takes advantages of `kind`, weighed as `aggregate`
    does (see PolicyLoss)."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        _check_new(POLICY_LOSSES, name, kind)
        POLICY_LOSSES[name] = PolicyLoss(
            function, kind, aggregate, per_response_weights, clip, params, rollout_in_ratio
        )
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


def micro_token_mean(
    values: torch.Tensor, mask: torch.Tensor, *, responses: int, **_: Any
) -> torch.Tensor:
    """Averaged over this micro-batch's own tokens, the micro-batch weighing by its rows (TRL's bnpo:
    the local batch's token count, then the mean over the accumulated micro-batches)."""
    from farmkit.train import rl_common

    share = mask.shape[0] / responses
    return rl_common.masked_sum(values, mask) / mask.sum().clamp(min=1) * share


def seq_mean_token_weights(mask: torch.Tensor) -> torch.Tensor:
    """Each token's weight when a response's terms are averaged over its own tokens."""
    return mask / mask.sum(dim=1, keepdim=True).clamp(min=1)


# ---------------------------------------------------------------------------------------------
# Policy losses: each registers its terms, f(logprobs, old_logprobs, advantages, mask, low, high)
# -> (terms, figures): per token [rows, tokens] or per response [rows, 1], figures of the same
# shape (the clipped share, the approximate KL of the update); PolicyLoss weighs and aggregates.
# Ratios are clipped to [1 - low, 1 + high] (DAPO's clip-higher when high > low).

GSPO_CLIP = (3e-4, 4e-4)  # GSPO (Zheng et al., 2025, v2 section 5.1), as TRL's paper index sets it


# the clipped losses' two-sided clipping (rl_common.clipped_policy_terms; TRL's delta, which it
# applies to these losses and not to cispo, sapo or vespo): --delta
TWO_SIDED = ("delta",)


def per_token_clipped(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A ratio per token; advantages per token [rows, tokens] or per response [rows]."""
    from farmkit.train import rl_common

    per_token = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
    return rl_common.clipped_policy_terms(logprobs - old_logprobs, per_token, low, high, delta)


register_policy_loss("token-mean", TOKEN, token_mean, params=TWO_SIDED)(per_token_clipped)


@register_policy_loss(
    "sequence-ratio", RESPONSE, seq_mean_token_sum, per_response_weights=True, params=TWO_SIDED
)
def sequence_ratio_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One ratio per response, of the whole response's probability (its summed token log-ratio):
    RLOO's one action."""
    from farmkit.train import rl_common

    log_ratio = ((logprobs - old_logprobs) * mask).sum(dim=1, keepdim=True)
    return rl_common.clipped_policy_terms(log_ratio, advantages[:, None], low, high, delta)


# GRPO averages over each response's tokens; Dr.GRPO divides by a constant instead
register_policy_loss("seq-mean-token-mean", RESPONSE, seq_mean_token_mean, params=TWO_SIDED)(
    per_token_clipped
)
register_policy_loss(
    "seq-mean-token-sum-norm", RESPONSE, seq_mean_token_sum_norm, params=TWO_SIDED
)(per_token_clipped)
# DAPO (Yu et al., 2025): every token of the minibatch weighs the same, however long its response
register_policy_loss("dapo", RESPONSE, token_mean, params=TWO_SIDED)(per_token_clipped)
# BNPO (TRL's): as DAPO, each micro-batch normalized by its own tokens
register_policy_loss("bnpo", RESPONSE, micro_token_mean, params=TWO_SIDED)(per_token_clipped)


@register_policy_loss(
    "gspo",
    RESPONSE,
    seq_mean_token_mean,
    per_response_weights=True,
    clip=GSPO_CLIP,
    params=TWO_SIDED,
)
def gspo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al., 2025): one ratio per response, exp of the mean of its token log-ratios
    (length-normalized, so its scale is a token's), clipped; TRL's importance_sampling_level
    "sequence" with loss_type "grpo"."""
    from farmkit.train import rl_common

    log_ratio = ((logprobs - old_logprobs) * mask).sum(dim=1, keepdim=True)
    length = mask.sum(dim=1, keepdim=True).clamp(min=1)
    return rl_common.clipped_policy_terms(log_ratio / length, advantages[:, None], low, high, delta)


@register_policy_loss("cispo", RESPONSE, token_mean)
def cispo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, 2025): -min(r, 1 + high) x A x log pi per token, the clipped weight
    without gradient, so every token keeps a gradient (TRL's cispo with epsilon_high = 1 + high);
    aggregated as DAPO."""
    import torch

    log_ratio = logprobs.detach() - old_logprobs
    ratio = torch.exp(log_ratio)
    per_token = advantages[:, None].expand_as(mask)
    terms = -ratio.clamp(max=1.0 + high) * per_token * logprobs
    figures = {
        "clip_fraction": (ratio > 1.0 + high) & (per_token > 0),
        "approx_kl": 0.5 * log_ratio**2,
    }
    return terms, figures


# SAPO's temperatures (Gao et al., 2025) and VESPO's kernels (Shen et al., 2026): TRL's defaults
SAPO_TEMPERATURES = {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}
VESPO_KERNEL = {
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
}
# VESPO's bounds on log w, as its authors' code sets them: each token's log-ratio within +/- 20,
# the response's within [ln 1e-8, 20] (so w^k and exp(-lambda w) stay finite)
VESPO_TOKEN_LOG_BOUND = 20.0
VESPO_LOG_BOUNDS = (math.log(1e-8), 20.0)


@register_policy_loss("sapo", RESPONSE, seq_mean_token_mean, params=tuple(SAPO_TEMPERATURES))
def sapo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    sapo_temperature_pos: float = SAPO_TEMPERATURES["sapo_temperature_pos"],
    sapo_temperature_neg: float = SAPO_TEMPERATURES["sapo_temperature_neg"],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Gao et al., 2025, Soft Adaptive Policy Optimization): -f(r) x A per token, the soft
    gate f(r) = (4 / tau) sigmoid(tau (r - 1)) in place of the clip (its slope at r = 1 is 1, as
    the plain ratio's; it fades smoothly as r leaves 1), tau = the positive temperature where
    A > 0 and the negative one elsewhere; aggregated as GRPO. Nothing is clipped (clip_fraction 0;
    the clip range is not used)."""
    import torch

    log_ratio = logprobs - old_logprobs
    per_token = advantages[:, None].expand_as(mask)
    tau = torch.where(per_token > 0, sapo_temperature_pos, sapo_temperature_neg).to(logprobs.dtype)
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1)) * 4 / tau
    figures = {
        "clip_fraction": torch.zeros_like(mask, dtype=torch.bool),
        "approx_kl": 0.5 * log_ratio.detach() ** 2,
    }
    return -gate * per_token, figures


@register_policy_loss(
    "luspo", RESPONSE, seq_mean_token_sum, per_response_weights=True, params=TWO_SIDED
)
def luspo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LUSPO (Liu et al., 2026, Length-Unbiased Sequence Policy Optimization): GSPO's term (one
    length-normalized ratio per response, clipped) on each of the response's tokens, so that
    summed over them it counts |y| times: each response's term scaled by its length, then
    averaged over the responses (TRL's loss_type "luspo", importance_sampling_level "sequence")."""
    terms, figures = gspo_terms(logprobs, old_logprobs, advantages, mask, low, high, delta)
    return terms.expand_as(mask), {name: value.expand_as(mask) for name, value in figures.items()}


@register_policy_loss(
    "vespo", RESPONSE, token_mean, params=tuple(VESPO_KERNEL), rollout_in_ratio=True
)
def vespo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    vespo_k_pos: float = VESPO_KERNEL["vespo_k_pos"],
    vespo_lambda_pos: float = VESPO_KERNEL["vespo_lambda_pos"],
    vespo_k_neg: float = VESPO_KERNEL["vespo_k_neg"],
    vespo_lambda_neg: float = VESPO_KERNEL["vespo_lambda_neg"],
    rollout_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VESPO (Shen et al., 2026, Variational Sequence-level Soft Policy Optimization): -phi(w) x A
    x log pi per token, phi without gradient (so the gradient is phi(w) A grad log pi), aggregated
    as DAPO. w = pi(y) / pi_sampling(y), the whole response's ratio (no length normalization), times
    the rollout correction's weights where it is on (the ratio to the engine that sampled);
    phi(w) = w^k exp(lambda (1 - w)), 1 at w = 1, falling towards 0 for w far from 1 on either
    side, with k and lambda of A >= 0 or of A < 0. Nothing is clipped (clip_fraction 0)."""
    import torch

    with torch.no_grad():
        bound = VESPO_TOKEN_LOG_BOUND
        log_ratio = (logprobs - old_logprobs).clamp(-bound, bound)
        log_w = (log_ratio * mask).sum(dim=1)
        if rollout_weights is not None:
            # the ratio pi_trainer / pi_engine of each token (or the response's), 0 where masked
            log_rollout = torch.log(rollout_weights.to(log_w.dtype)).clamp(*VESPO_LOG_BOUNDS)
            if log_rollout.dim() == 2:
                log_rollout = (log_rollout * mask).sum(dim=1)
            log_w = log_w + log_rollout
        log_w = log_w.clamp(*VESPO_LOG_BOUNDS)
        positive = advantages >= 0
        k = torch.where(positive, vespo_k_pos, vespo_k_neg).to(log_w.dtype)
        lam = torch.where(positive, vespo_lambda_pos, vespo_lambda_neg).to(log_w.dtype)
        phi = torch.exp(k * log_w + lam * (1 - torch.exp(log_w)))
    per_token = advantages[:, None].expand_as(mask)
    figures = {
        "clip_fraction": torch.zeros_like(mask, dtype=torch.bool),
        "approx_kl": 0.5 * (logprobs - old_logprobs).detach() ** 2,
    }
    return -phi[:, None] * per_token * logprobs, figures
