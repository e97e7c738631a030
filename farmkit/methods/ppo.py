"""PPO as AlpacaFarm ran it: maximize the reward model's score minus a fixed-coefficient, per-token
KL penalty to the SFT model.

Four networks: the policy and a frozen reference (both from the SFT model, in one precision), the
frozen reward model, and a value model whose body is the reward model (its scalar head, or a zero
head, read at every token). The score is added at the last response token (the KL estimate is k1,
AlpacaFarm's clamped k1, or k3), rewards are optionally whitened, advantages come from GAE with
gamma = lambda = 1 and are whitened over the whole rollout batch with padding left out (on every
process together under accelerate). Clipped policy and value losses, gradient clipping, a learning
rate that warms up and decays linearly to 0. A step = one rollout batch, then `ppo_epochs` passes
over it in minibatches. The loop, checkpoints, --resume and the rollout backends are the one
on-policy trainer's (farmkit.train.onpolicy); this module holds what is PPO's: the value model,
the KL-penalized per-token rewards and their advantages (farmkit.train.estimators' `gae` by
default, --advantage-estimator), and the clipped policy (`token-mean`, --policy-loss) and value
losses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from farmkit.core.io import FarmError
from farmkit.core.values import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE
from farmkit.train.config import (
    KL_ESTIMATORS,
    OnPolicyConfig,
    Preset,
    advantage_estimator_field,
    help_field,
    policy_loss_field,
    preset_field,
    shared_field,
)
from farmkit.train.estimators import TOKEN
from farmkit.train.onpolicy import MicroBatch, OnPolicyMethod, Prepared

log = logging.getLogger("farmkit")
VALUE_HEADS = ("reward", "zero")

# AlpacaFarm's PPO run: the values of examples/scripts/rlhf_ppo.sh (tatsu-lab/alpaca_farm at
# 7f53055) and, for what the script does not set, of the code it runs (rl/ppo_utils.py's
# TrainingArguments, rl/ppo_trainer.py, models/rl_models.py). README, farm-ppo, cites each line.
PPO_PRESETS = {
    "alpacafarm": Preset(
        "AlpacaFarm's examples/scripts/rlhf_ppo.sh and the defaults of the code it runs "
        "(docs/tools/farm-ppo.md, its table)",
        {
            "rollout_batch_size": 512,
            "minibatch_size": 256,  # step_batch_size
            "micro_batch_size": 2,  # step_per_device_batch_size
            "learning_rate": 1e-5,
            "warmup_steps": 5,
            "kl_coef": 0.0067,
            # total_epochs 10 over the 20,000 prompts of the unlabeled split, 512 a step
            "steps": 390,
            "checkpoint_every": 20,
            "ppo_epochs": 2,  # noptepochs
            "clip_range": 0.2,
            "value_clip_range": 0.2,
            "value_loss_coef": 0.1,
            "gamma": 1.0,
            "lam": 1.0,
            "whiten_rewards": True,
            "kl_estimator": "clamped",
            "value_head": "zero",  # init_value_with_reward: the reward model's body, a zero head
            "adam_eps": 1e-5,
            "max_grad_norm": 1.0,
            "temperature": 1.0,
            "max_new_tokens": 300,  # response_len
            "unfinished": "truncate",  # truncate_token_ids None: no penalty
        },
    )
}


@dataclass
class PPOConfig(OnPolicyConfig):
    tool: ClassVar[str] = "farm-ppo"
    advantage_kind: ClassVar[str] = TOKEN

    preset: str | None = preset_field(PPO_PRESETS)
    steps: int = help_field(
        100,
        "PPO steps: each samples one rollout batch and trains `ppo-epochs` passes over it.",
        bounds=AT_LEAST_ONE,
    )
    rollout_batch_size: int = help_field(
        64, "Prompts sampled per step, over all processes (AlpacaFarm: 512).", bounds=AT_LEAST_ONE
    )
    minibatch_size: int = help_field(
        16,
        "Rollouts per optimizer step, over all processes (AlpacaFarm: 256).",
        bounds=AT_LEAST_ONE,
    )
    # of the policy and the value model; decays linearly to 0 by the last step
    learning_rate: float = shared_field("learning_rate", 1e-5)
    kl_coef: float = help_field(
        0.0067,
        "Fixed coefficient of the per-token KL penalty to the SFT model (AlpacaFarm: 0.002-0.0067 with simulated preferences, 0.02 with human ones, at temperature 1).",
        bounds=NON_NEGATIVE,
    )
    kl_estimator: str = help_field(
        "k1",
        "Per-token KL estimate in the penalty: k1 = log pi - log pi_ref (unbiased); clamped = k1 floored at 0 (AlpacaFarm's, biased upwards); k3 = (r - 1) - log r, r = pi_ref / pi (unbiased, never negative).",
        KL_ESTIMATORS,
    )
    whiten_rewards: bool = help_field(
        False,
        "Divide the per-token rewards (score and KL penalty) by their standard deviation over the rollout batch before GAE, mean kept (AlpacaFarm: on).",
    )
    value_head: str = help_field(
        "reward",
        "Head of the value model, whose body is the reward model: 'reward' reuses the reward model's scoring head (values start at its scores); 'zero' starts a zero head (AlpacaFarm).",
        VALUE_HEADS,
    )
    gamma: float = help_field(1.0, "Discount of GAE (AlpacaFarm: 1).", bounds=FRACTION)
    lam: float = help_field(1.0, "Lambda of GAE (AlpacaFarm: 1).", bounds=FRACTION)
    clip_range: float = help_field(
        0.2, "PPO clipping of the probability ratio: 1 +/- this.", bounds=POSITIVE
    )
    value_clip_range: float = help_field(
        0.2, "Clipping of the value prediction around its rollout value.", bounds=POSITIVE
    )
    value_loss_coef: float = help_field(
        0.1, "Weight of the value loss in the total loss.", bounds=NON_NEGATIVE
    )
    advantage_estimator: str = advantage_estimator_field("gae")
    policy_loss: str = policy_loss_field("token-mean")
    offload_frozen: bool = help_field(
        False,
        "Keep the frozen reference and reward models in CPU memory and copy each layer's weights to the GPU only while it runs (accelerate's cpu_offload): they then take about one layer of GPU memory each, at the price of copying their weights in every forward pass (see docs/scaling.md).",
    )


class PPOMethod(OnPolicyMethod):
    """PPO in the on-policy loop: a value model beside the policy, GAE advantages."""

    name = "ppo"
    tool = PPOConfig.tool
    value_model = True

    def load_value_model(
        self,
        reward_model: str,
        scorer: Any,
        tokenizer: Any,
        state: Path | None,
        engine: Path | None,
        device: str,
    ) -> Any:
        if scorer.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise FarmError(
                "the value model starts from the reward model, so the reward model and the SFT model must share a tokenizer"
            )
        if state is not None and engine is None and not self.config.lora:
            return load_value_model(state / "value", device, "reward")
        return load_value_model(reward_model, device, self.config.value_head)

    def prepare(
        self, batch: Any, old_logprobs: Any, ref_logprobs: Any, old_values: Any, reduce: Any
    ) -> Prepared:
        from farmkit.train import rl_common
        from farmkit.train.estimators import advantage_estimator

        config, mask = self.config, batch.rollout.response_mask
        rewards, kl = rl_common.kl_penalized_rewards(
            batch.scores, old_logprobs, ref_logprobs, mask, config.kl_coef, config.kl_estimator
        )
        if config.whiten_rewards:
            rewards = rl_common.masked_whiten(rewards, mask, shift_mean=False, reduce=reduce)
        advantages, returns = advantage_estimator(config.advantage_estimator)(
            rewards, old_values, mask, config.gamma, config.lam, reduce=reduce
        )
        return Prepared(advantages, kl, returns=returns, old_values=old_values)

    def loss(self, micro: MicroBatch, prepared: Prepared) -> tuple[Any, dict[str, Any]]:
        from farmkit.train import rl_common

        config = self.config
        loss, policy_stats = micro.surrogate(
            config.policy_loss, prepared.advantages, config.clip_bounds, config.max_new_tokens
        )
        value_loss, value_stats = rl_common.clipped_value_loss(
            micro.values,
            micro.rows(prepared.old_values),
            micro.rows(prepared.returns),
            micro.mask,
            config.value_clip_range,
            micro.tokens,
        )
        figures = {"policy_loss": loss, "value_loss": value_loss, **policy_stats, **value_stats}
        return loss + config.value_loss_coef * value_loss, figures

    def total_loss(self, row: dict[str, Any]) -> float | None:
        if "policy_loss" not in row:
            return None
        return row["policy_loss"] + self.config.value_loss_coef * row["value_loss"]

    def message_figures(self, row: dict[str, Any]) -> str:
        return f"value loss {row['value_loss']:.4f}"


def train_ppo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """train_ppo(sft, reward_model, prompts, output, config, seed=0, inputs=None, gold_pools=None):
    train a policy with PPO (a PPOConfig) and write it to `output`; returns the last step's
    metrics."""
    from farmkit.train.onpolicy import run_method

    return run_method(PPOMethod, *args, **kwargs)


def load_value_model(source: str | Path, device: str, head: str) -> Any:
    """The value model: the reward model's network (body and, with head 'reward', its scoring head;
    with 'zero', that head's weights set to 0, so every value starts at 0 as in AlpacaFarm)."""
    import torch

    from farmkit.lm.models import load_reward_model
    from farmkit.train.policy import score_head
    from farmkit.train.rollouts import TRAINING_DTYPE

    value_model, _ = load_reward_model(source, device=device, dtype=TRAINING_DTYPE)
    if head == "zero":
        with torch.no_grad():
            for parameter in score_head(value_model).parameters():
                parameter.zero_()
    return value_model
