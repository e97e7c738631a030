"""RLOO and GRPO (and Dr.GRPO): policy-gradient methods whose baseline is the group, not a value model.

Each step takes rollout_batch_size / k prompts and samples k responses to each (the shared rollout,
farmkit.train.rollouts), scores them with the reward model, and turns each group of k scores into
advantages:
- RLOO: a_i = r_i - mean_{j != i} r_j (the leave-one-out mean of the other k - 1 responses);
- GRPO: a_i = (r_i - mean_j r_j) / (std_j r_j + eps), the group's sample standard deviation;
- Dr.GRPO: a_i = r_i - mean_j r_j (no division by the standard deviation).
Every response's advantage applies to each of its tokens. The loss is PPO's clipped surrogate over
`ppo_epochs` passes in minibatches, with no value loss:
- RLOO treats the response as one action: the ratio is that of the whole response's probability
  (sum of its token log-ratios), clipped, averaged over responses;
- GRPO clips per-token ratios, averages over each response's tokens, then over responses;
- Dr.GRPO clips per-token ratios and sums them over each response, divided by a constant (the longest
  response allowed), then averages over responses: no per-response length normalization.
Each is a name in farmkit.train.estimators' registries (--advantage-estimator, --policy-loss): RLOO
and GRPO are one method with two sets of defaults, and any registered estimator and loss of
one advantage per response runs in either.
The KL to the SFT model is either subtracted from the score before the group advantages
(kl_in=reward: kl_coef times the response's summed per-token estimate under the sampling policy), or
added to the loss (kl_in=loss: kl_coef times the per-token estimate of the current policy, weighted
as the policy loss weights its tokens). Accelerate/DeepSpeed, checkpoints, --resume, LoRA, metrics and
the output folder work as in farm-ppo: the loop is the one on-policy trainer's
(farmkit.train.onpolicy), the advantages and losses farmkit.train.estimators' registered ones;
a group never spans two processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from farmkit.core.io import FarmError
from farmkit.core.values import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE
from farmkit.train.config import (
    KL_ESTIMATORS,
    OnPolicyConfig,
    Preset,
    advantage_estimator_field,
    help_field,
    policy_loss_field,
    preset_field,
    same_as,
    shared_field,
)
from farmkit.train.estimators import (
    RESPONSE,
    SAPO_TEMPERATURES,
    STD_EPS,
    VESPO_KERNEL,
    advantage_estimator,
    grpo_advantages,
    policy_loss,
    rloo_advantages,
)
from farmkit.train.onpolicy import MicroBatch, OnPolicyMethod, Prepared
from farmkit.train.pairwise import POOL_REWARDS

__all__ = [
    "STD_EPS",
    "GRPOConfig",
    "GroupConfig",
    "GroupMethod",
    "RLOOConfig",
    "grpo_advantages",
    "rloo_advantages",
    "train_group",
]
KL_IN = ("reward", "loss")

KL_COEF_HELP = "Coefficient of the KL penalty to the SFT model (see --kl-in; 0: none, the KL is still measured)."
KL_IN_HELP = "Where the KL to the SFT model enters: 'reward' subtracts kl-coef x the response's summed per-token estimate (sampling policy vs SFT) from its score before the group advantages; 'loss' adds kl-coef x the current policy's per-token estimate to the loss."
PPO_EPOCHS_HELP = "Passes over each rollout batch, each in minibatches. The probability ratio is 1 (plain on-policy policy gradient, nothing clipped) only with one pass of one minibatch (--ppo-epochs 1 and minibatch-size = rollout-batch-size: one update per batch, as the published methods ran; --preset sets it); farmkit's default of 2 passes in minibatches is a PPO-style departure that reuses each batch for several updates."
KL_ESTIMATOR_HELP = "Per-token KL estimate: k1 = log pi - log pi_ref; clamped = k1 floored at 0; k3 = (r - 1) - log r, r = pi_ref / pi (never negative; the usual choice in the loss, where k1's expected gradient is 0)."


@dataclass
class GroupConfig(OnPolicyConfig):
    """What RLOO and GRPO share; the names are farm-ppo's wherever the setting is the same."""

    method: ClassVar[str] = ""
    advantage_kind: ClassVar[str] = RESPONSE

    rollout_batch_size: int = help_field(
        64,
        "Responses sampled per step, over all processes: rollout-batch-size / num-samples prompts, num-samples responses to each.",
        bounds=AT_LEAST_ONE,
    )
    samples_per_prompt: int = shared_field(
        "num_samples",
        4,
        more_help="k: the group whose scores give each other their baseline (at least 2).",
    )
    dynamic_sampling: bool = help_field(
        False,
        "DAPO's dynamic sampling: groups whose scores are all equal (no signal) are dropped and more prompts drawn until the batch is full (at most --max-extra-draws draws; then dropped groups fill it). metrics.jsonl counts dropped_groups and extra_draws.",
    )
    max_extra_draws: int = help_field(
        4,
        "With --dynamic-sampling: the most extra draws of rollout-batch-size / num-samples prompts per step.",
        bounds=NON_NEGATIVE,
    )
    minibatch_size: int = help_field(
        16,
        "Responses per optimizer step, over all processes (groups may be split).",
        bounds=AT_LEAST_ONE,
    )
    micro_batch_size: int = help_field(
        4,
        "Responses per forward/backward pass on one process; gradients accumulate up to a minibatch. Lower it to save memory.",
        bounds=AT_LEAST_ONE,
    )
    ppo_epochs: int = help_field(2, PPO_EPOCHS_HELP, bounds=AT_LEAST_ONE)
    kl_coef: float = help_field(0.05, KL_COEF_HELP, bounds=NON_NEGATIVE)
    kl_in: str = help_field("reward", KL_IN_HELP, KL_IN)
    kl_estimator: str = help_field("k1", KL_ESTIMATOR_HELP, KL_ESTIMATORS)
    kl_bias_correction: bool = help_field(
        False,
        "With --kl-in loss: each token's KL estimate multiplied by its importance ratio pi / "
        "pi_sampling (for a loss with one ratio per response, exp of the mean of its token "
        "log-ratios), as TRL's use_bias_correction_kl (TRL's default; farmkit's is off, TRL's "
        "use_bias_correction_kl=False). It matters only where the policy has moved from the "
        "sampling policy (several updates per batch).",
    )
    delta: float | None = help_field(
        None,
        "Two-sided clipping (INTELLECT-2; TRL's delta): each ratio r is also capped at DELTA in "
        "the surrogate's unclipped branch, so a response with a negative advantage stops pushing "
        "once r passes DELTA (above 1 + clip-range-high, as TRL recommends). For the clipped "
        "losses (not cispo, sapo, vespo). Default: off.",
        bounds=POSITIVE,
        show_default=False,
    )
    sapo_temperature_pos: float = help_field(
        SAPO_TEMPERATURES["sapo_temperature_pos"],
        "With --policy-loss sapo: the temperature tau of the soft gate (4 / tau) sigmoid(tau (r - "
        "1)) of tokens whose advantage is positive (higher: the gate falls faster as the ratio "
        "leaves 1; TRL's sapo_temperature_pos).",
        bounds=POSITIVE,
    )
    sapo_temperature_neg: float = help_field(
        SAPO_TEMPERATURES["sapo_temperature_neg"],
        "With --policy-loss sapo: the gate's temperature for the other tokens (advantage 0 or "
        "below; TRL's sapo_temperature_neg).",
        bounds=POSITIVE,
    )
    vespo_k_pos: float = help_field(
        VESPO_KERNEL["vespo_k_pos"],
        "With --policy-loss vespo: the power k of the kernel phi(w) = w^k exp(lambda (1 - w)) "
        "that weighs a response of positive (or 0) advantage by its ratio w (higher: a response "
        "the policy now finds less likely weighs less; TRL's vespo_k_pos).",
        bounds=NON_NEGATIVE,
    )
    vespo_lambda_pos: float = help_field(
        VESPO_KERNEL["vespo_lambda_pos"],
        "With --policy-loss vespo: the decay lambda of the kernel for a response of positive (or "
        "0) advantage (higher: a response the policy now finds more likely weighs less; TRL's "
        "vespo_lambda_pos).",
        bounds=POSITIVE,
    )
    vespo_k_neg: float = help_field(
        VESPO_KERNEL["vespo_k_neg"],
        "With --policy-loss vespo: the kernel's power for a response of negative advantage "
        "(TRL's vespo_k_neg).",
        bounds=NON_NEGATIVE,
    )
    vespo_lambda_neg: float = help_field(
        VESPO_KERNEL["vespo_lambda_neg"],
        "With --policy-loss vespo: the kernel's decay for a response of negative advantage "
        "(TRL's vespo_lambda_neg).",
        bounds=POSITIVE,
    )
    pool: str | None = help_field(
        None,
        "Score with this farm-annotate pool (a name, farm-annotate --list-pools, or a pool YAML "
        "file) instead of a reward model: give SFT PROMPTS without RM. Each response's reward "
        "comes from the pool's verdicts on pairs of its own group (--opponents, --pool-reward); "
        "the verdicts are cached and priced (--cache, --prices, --max-cost).",
        metavar="POOL",
        show_default=False,
    )
    opponents: str = help_field(
        "all",
        "With --pool: each response is compared with K others of its group, the same number "
        "for every one (a seeded draw: num-samples x K / 2 comparisons per group, so num-samples "
        "x K must be even), or with all of them (num-samples x (num-samples - 1) / 2).",
        metavar="K|all",
    )
    pool_reward: str = help_field(
        "win-rate",
        "With --pool: a response's reward from its group's verdicts. win-rate: the share of its "
        "comparisons it won (ties half); bradley-terry: its strength in a Bradley-Terry model "
        "fitted to the group's verdicts (a standard normal prior), which uses transitivity when "
        "K < num-samples - 1.",
        POOL_REWARDS,
    )

    @property
    def loss_params(self) -> dict[str, float]:
        """The values of the policy loss's own parameters (SAPO's temperatures, VESPO's kernel,
        the clipped losses' --delta where given)."""
        return {
            name: getattr(self, name)
            for name in policy_loss(self.policy_loss).params
            if getattr(self, name) is not None
        }

    @property
    def opponent_count(self) -> int | None:
        """--opponents as a number (None: all)."""
        return None if self.opponents == "all" else int(self.opponents)

    def check_rollout(self) -> None:
        if self.delta is not None and "delta" not in policy_loss(self.policy_loss).params:
            raise ValueError(
                f"--delta is the clipped losses' two-sided clipping; --policy-loss "
                f"{self.policy_loss} has no clipped ratio to cap (as in TRL, which ignores it there)"
            )
        if self.samples_per_prompt < 2:
            raise ValueError("num-samples must be at least 2: a group of one has no baseline")
        if self.rollout_batch_size % self.samples_per_prompt:
            raise ValueError("rollout-batch-size must be a multiple of num-samples")
        self.opponents = str(self.opponents).strip().lower()
        if self.opponents != "all":
            if not self.opponents.isdigit() or int(self.opponents) < 1:
                raise ValueError(
                    f"opponents must be a positive count or all, not {self.opponents!r}"
                )
            count = int(self.opponents)
            if count >= self.samples_per_prompt:
                raise ValueError(
                    f"opponents ({count}) must be below num-samples ({self.samples_per_prompt}): "
                    "a response meets the others of its group (all: every one)"
                )
            if count * self.samples_per_prompt % 2:
                raise ValueError(
                    f"num-samples x opponents ({self.samples_per_prompt} x {count}) must be even: "
                    "every comparison is of two responses"
                )


# One update per rollout batch: the ratio of the update is 1, so nothing is clipped (REINFORCE).
ONE_UPDATE = {"ppo_epochs": 1, "minibatch_size": same_as("rollout_batch_size")}

RLOO_PRESETS = {
    "ahmadian2024": Preset(
        "RLOO as Ahmadian et al. (2024, Back to Basics) ran it: REINFORCE with the leave-one-out "
        "baseline, one update per rollout batch (--ppo-epochs 1, minibatch-size = "
        "rollout-batch-size, so the ratio is 1 and nothing is clipped), the KL in the reward",
        {**ONE_UPDATE, "kl_in": "reward", "kl_estimator": "k1"},
    )
}
GRPO_PRESETS = {
    "deepseekmath": Preset(
        "GRPO as DeepSeekMath (Shao et al. 2024) trained DeepSeekMath-RL: one update per "
        "rollout batch, KL coefficient 0.04 in the loss with the k3 estimator, advantages "
        "divided by the group's standard deviation, 64 samples per prompt, learning rate 1e-6, "
        "answers up to 1024 tokens, 1024 responses per batch",
        {
            **ONE_UPDATE,
            "kl_coef": 0.04,
            "kl_in": "loss",
            "kl_estimator": "k3",
            "dr_grpo": False,
            "samples_per_prompt": 64,
            "learning_rate": 1e-6,
            "max_new_tokens": 1024,
            "rollout_batch_size": 1024,
        },
    ),
    "dr-grpo": Preset(
        "Dr.GRPO (Liu et al. 2025): --dr-grpo (no division by the group's standard deviation, "
        "no per-response length normalization) and no KL penalty (--kl-coef 0)",
        {"dr_grpo": True, "kl_coef": 0.0},
    ),
    "dapo": Preset(
        "DAPO (Yu et al. 2025): the dapo loss (every token of a minibatch weighs the same), "
        "clip-higher 0.2 / 0.28, no KL, dynamic sampling, the soft overlong penalty over the last "
        "4096 of 20480 tokens, 16 samples for each of 512 prompts, minibatches of 512 responses "
        "(16 updates per batch), learning rate 1e-6 warmed up over 20 steps",
        {
            "policy_loss": "dapo",
            "clip_range_low": 0.2,
            "clip_range_high": 0.28,
            "kl_coef": 0.0,
            "dynamic_sampling": True,
            "overlong": "penalty",
            "overlong_cache": 4096,
            "max_new_tokens": 20480,
            "samples_per_prompt": 16,
            "rollout_batch_size": 8192,
            "minibatch_size": 512,
            "ppo_epochs": 1,
            "learning_rate": 1e-6,
            "warmup_steps": 20,
        },
    ),
    "gspo": Preset(
        "GSPO (Zheng et al. 2025) as TRL's paper index sets it: the gspo loss (one "
        "length-normalized ratio per response, clipped to 1 - 3e-4 and 1 + 4e-4), no KL, each "
        "rollout batch in 4 minibatches of one pass",
        {
            "policy_loss": "gspo",
            "kl_coef": 0.0,
            "ppo_epochs": 1,
            "minibatch_size": lambda lookup: lookup("rollout_batch_size") // 4,
        },
    ),
}


@dataclass
class RLOOConfig(GroupConfig):
    method: ClassVar[str] = "rloo"
    tool: ClassVar[str] = "farm-rloo"

    preset: str | None = preset_field(RLOO_PRESETS)
    # the response is one action: one ratio, its tokens' terms added up
    advantage_estimator: str = advantage_estimator_field("rloo")
    policy_loss: str = policy_loss_field("sequence-ratio")


@dataclass
class GRPOConfig(GroupConfig):
    method: ClassVar[str] = "grpo"
    tool: ClassVar[str] = "farm-grpo"

    preset: str | None = preset_field(GRPO_PRESETS)
    kl_coef: float = help_field(
        0.04, KL_COEF_HELP + " GRPO's paper: 0.04; Dr.GRPO's: 0.", bounds=NON_NEGATIVE
    )
    kl_in: str = help_field("loss", KL_IN_HELP, KL_IN)
    kl_estimator: str = help_field("k3", KL_ESTIMATOR_HELP, KL_ESTIMATORS)
    dr_grpo: bool = help_field(
        False,
        "Dr.GRPO: advantages r - group mean, not divided by the group's standard deviation, and each response's token terms summed and divided by max-new-tokens (a constant) instead of averaged over its own length (the defaults of --advantage-estimator and --policy-loss become dr_grpo and seq-mean-token-sum-norm; either given wins). It leaves --kl-coef as it is (Dr.GRPO's paper: 0; --preset dr-grpo sets both).",
    )

    def __post_init__(self) -> None:
        # the estimator and the loss not given: GRPO's, or Dr.GRPO's with --dr-grpo
        if self.advantage_estimator is None:
            self.advantage_estimator = "dr_grpo" if self.dr_grpo else "grpo"
        if self.policy_loss is None:
            self.policy_loss = "seq-mean-token-sum-norm" if self.dr_grpo else "seq-mean-token-mean"
        super().__post_init__()


class GroupMethod(OnPolicyMethod):
    """RLOO, GRPO or Dr.GRPO in the on-policy loop: the config's estimator and loss say which;
    its class names the run (metrics' method, the seeds' label)."""

    def __init__(self, config: GroupConfig) -> None:
        if not config.method:
            raise ValueError("train_group needs an RLOOConfig or a GRPOConfig")
        super().__init__(config)
        self.name, self.tool = config.method, config.tool
        self.k = self.group_size = config.samples_per_prompt

    @property
    def prompts_per_step(self) -> int:
        return self.config.rollout_batch_size // self.k

    def check_processes(self, world: int) -> None:
        if self.prompts_per_step % world or self.config.minibatch_size % world:
            raise FarmError(
                "rollout-batch-size / num-samples (prompts per step) and minibatch-size must be "
                "multiples of the number of processes: each process samples whole groups"
            )

    def rows(self, prompt_indices: list[int]) -> list[int]:
        return [index for index in prompt_indices for _ in range(self.k)]  # groups of k rows

    def advantages_use_old_logprobs(self) -> bool:
        return self.config.kl_in == "reward" and self.config.kl_coef > 0

    def prepare(
        self, batch: Any, old_logprobs: Any, ref_logprobs: Any, old_values: Any, reduce: Any
    ) -> Prepared:
        from farmkit.train import rl_common

        config, mask = self.config, batch.rollout.response_mask
        kl = rl_common.kl_estimate(old_logprobs, ref_logprobs, config.kl_estimator) * mask
        scores = batch.scores.float()
        if config.kl_in == "reward":
            scores = scores - config.kl_coef * kl.sum(dim=1)
        advantages = advantage_estimator(config.advantage_estimator)(scores, self.k)
        group_std = scores.reshape(-1, self.k).std(dim=1)
        return Prepared(
            advantages,
            kl,
            sums={
                "group_std": group_std.sum(),
                "zero_std_groups": (group_std == 0).float().sum(),
                "advantage_abs": advantages.abs().sum(),
            },
        )

    def loss(self, micro: MicroBatch, prepared: Prepared) -> tuple[Any, dict[str, Any]]:
        from farmkit.train import rl_common

        config = self.config
        loss, stats = micro.surrogate(
            config.policy_loss,
            prepared.advantages,
            config.clip_bounds,
            config.max_new_tokens,
            config.loss_params,
        )
        if config.kl_in == "loss" and config.kl_coef > 0:
            kl = rl_common.kl_estimate(micro.logprobs, micro.ref_logprobs, config.kl_estimator)
            if config.kl_bias_correction:  # TRL's use_bias_correction_kl
                kl = kl * importance_ratio(micro, policy_loss(config.policy_loss))
            # weighed as the policy loss weighs its tokens
            kl_loss = policy_loss(config.policy_loss).aggregate(
                kl,
                micro.mask,
                responses=micro.responses,
                tokens=micro.tokens,
                norm=config.max_new_tokens,
            )
            stats["kl_loss"] = kl_loss.detach()
            loss = loss + config.kl_coef * kl_loss
        return loss, {"policy_loss": loss, **stats}

    def step_figures(self, summed: dict[str, float], count: float) -> dict[str, float]:
        groups = count / self.k
        return {
            "group_score_std": summed["group_std"] / groups,
            "zero_std_group_fraction": summed["zero_std_groups"] / groups,
            "advantage_abs": summed["advantage_abs"] / count,
        }

    def message_figures(self, row: dict[str, Any]) -> str:
        return f"group std {row['group_score_std']:.3f}"


def importance_ratio(micro: MicroBatch, loss: Any) -> Any:
    """pi / pi_sampling of each token [rows, tokens], or, for a loss with one ratio per response,
    exp of the mean of its token log-ratios [rows, 1] (TRL's importance_sampling_level
    "sequence"); with gradient, as TRL's."""
    import torch

    log_ratio = micro.logprobs - micro.old_logprobs
    if loss.per_response_weights:
        length = micro.mask.sum(dim=1, keepdim=True).clamp(min=1)
        log_ratio = (log_ratio * micro.mask).sum(dim=1, keepdim=True) / length
    return torch.exp(log_ratio)


def train_group(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """train_group(sft, reward_model, prompts, output, config, seed=0, inputs=None,
    gold_pools=None): train a policy with RLOO or GRPO (an RLOOConfig or a GRPOConfig says which)
    and write it to `output`; returns the last step's metrics."""
    from farmkit.train.onpolicy import run_method

    return run_method(GroupMethod, *args, **kwargs)
