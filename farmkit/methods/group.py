"""RLOO and GRPO (and Dr.GRPO): policy-gradient methods whose baseline is the group, not a value model.

Each step takes rollout_batch_size / k prompts and samples k responses to each (the shared rollout,
farmkit.methods.rollouts), scores them with the reward model, and turns each group of k scores into
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
The KL to the SFT model is either subtracted from the score before the group advantages
(kl_in=reward: kl_coef times the response's summed per-token estimate under the sampling policy), or
added to the loss (kl_in=loss: kl_coef times the per-token estimate of the current policy, weighted
as the policy loss weights its tokens). Accelerate/DeepSpeed, checkpoints, --resume, LoRA, metrics and
the output folder work as in farm-ppo (farmkit.methods.ppo); a group never spans two processes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from farmkit.io import FarmError
from farmkit.methods.config import (
    KL_ESTIMATORS,
    GoldArgs,
    RolloutConfig,
    TrackingArgs,
    config_dict,
    help_field,
    require_positive,
)
from farmkit.metrics import metrics_row
from farmkit.seeds import derive_seed

log = logging.getLogger("farmkit")
KL_IN = ("reward", "loss")
STD_EPS = 1e-4  # added to a group's standard deviation (GRPO): a group of equal scores gets 0

KL_COEF_HELP = "Coefficient of the KL penalty to the SFT model (see --kl-in; 0: none, the KL is still measured)."
KL_IN_HELP = "Where the KL to the SFT model enters: 'reward' subtracts kl-coef x the response's summed per-token estimate (sampling policy vs SFT) from its score before the group advantages; 'loss' adds kl-coef x the current policy's per-token estimate to the loss."
KL_ESTIMATOR_HELP = "Per-token KL estimate: k1 = log pi - log pi_ref; clamped = k1 floored at 0; k3 = (r - 1) - log r, r = pi_ref / pi (never negative; the usual choice in the loss, where k1's expected gradient is 0)."


@dataclass
class GroupConfig(RolloutConfig, TrackingArgs, GoldArgs):
    """What RLOO and GRPO share; the names are farm-ppo's wherever the setting is the same."""

    method: ClassVar[str] = ""
    tool: ClassVar[str] = ""

    steps: int = help_field(
        100, "Steps: each samples one rollout batch and trains `ppo-epochs` passes over it."
    )
    rollout_batch_size: int = help_field(
        64,
        "Responses sampled per step, over all processes: rollout-batch-size / samples-per-prompt prompts, samples-per-prompt responses to each.",
    )
    samples_per_prompt: int = help_field(
        4,
        "k, the responses sampled per prompt: the group whose scores give each other their baseline (at least 2).",
    )
    minibatch_size: int = help_field(
        16, "Responses per optimizer step, over all processes (groups may be split)."
    )
    micro_batch_size: int = help_field(
        4,
        "Responses per forward/backward pass on one process; gradients accumulate up to a minibatch. Lower it to save memory.",
    )
    ppo_epochs: int = help_field(
        2, "Passes over each rollout batch (1: plain on-policy policy gradient, the ratio is 1)."
    )
    learning_rate: float = help_field(
        1e-5, "Peak learning rate (AdamW); decays linearly to 0 by the last step."
    )
    kl_coef: float = help_field(0.05, KL_COEF_HELP)
    kl_in: str = help_field("reward", KL_IN_HELP, KL_IN)
    kl_estimator: str = help_field("k1", KL_ESTIMATOR_HELP, KL_ESTIMATORS)
    clip_range: float = help_field(0.2, "Clipping of the probability ratio: 1 +/- this.")
    checkpoint_every: int = help_field(
        20, "Write a policy checkpoint every K steps (0: none), as farm-ppo."
    )
    checkpoint_dir: str | None = help_field(
        None,
        "Folder of checkpoints and metrics.jsonl. Default: OUTPUT-checkpoints beside the output.",
    )
    resume: bool = help_field(
        False, "Continue from the newest checkpoint in the checkpoint folder."
    )
    lora: bool = help_field(
        False,
        "Train LoRA adapters instead of all weights; the KL reference is the policy with its adapters off; the saved policy has them merged.",
    )
    lora_rank: int = help_field(16, "LoRA rank.")
    lora_alpha: int = help_field(32, "LoRA alpha.")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(
            self,
            "steps",
            "rollout_batch_size",
            "minibatch_size",
            "micro_batch_size",
            "ppo_epochs",
            "lora_rank",
        )
        if self.samples_per_prompt < 2:
            raise ValueError(
                "samples-per-prompt must be at least 2: a group of one has no baseline"
            )
        if self.rollout_batch_size % self.samples_per_prompt:
            raise ValueError("rollout-batch-size must be a multiple of samples-per-prompt")
        if self.rollout_batch_size % self.minibatch_size:
            raise ValueError("rollout-batch-size must be a multiple of minibatch-size")
        if self.learning_rate <= 0:
            raise ValueError("learning-rate must be positive")
        if self.kl_coef < 0 or self.clip_range <= 0:
            raise ValueError("kl-coef must be >= 0 and clip-range > 0")
        if self.checkpoint_every < 0:
            raise ValueError("checkpoint-every must be >= 0")

    def advantages(self, scores: Any) -> Any:
        raise NotImplementedError

    def token_weights(self, mask: Any) -> Any:
        """Weight of each token in the per-response loss (the KL term of kl_in=loss, and GRPO's
        policy term); the minibatch's loss is the weighted sum divided by its responses."""
        raise NotImplementedError


@dataclass
class RLOOConfig(GroupConfig):
    method: ClassVar[str] = "rloo"
    tool: ClassVar[str] = "farm-rloo"

    def advantages(self, scores: Any) -> Any:
        return rloo_advantages(scores, self.samples_per_prompt)

    def token_weights(self, mask: Any) -> Any:
        return mask  # the response is one action: its tokens' terms add up


@dataclass
class GRPOConfig(GroupConfig):
    method: ClassVar[str] = "grpo"
    tool: ClassVar[str] = "farm-grpo"

    kl_coef: float = help_field(0.04, KL_COEF_HELP + " GRPO's paper: 0.04; Dr.GRPO's: 0.")
    kl_in: str = help_field("loss", KL_IN_HELP, KL_IN)
    kl_estimator: str = help_field("k3", KL_ESTIMATOR_HELP, KL_ESTIMATORS)
    dr_grpo: bool = help_field(
        False,
        "Dr.GRPO: advantages r - group mean, not divided by the group's standard deviation, and each response's token terms summed and divided by max-new-tokens (a constant) instead of averaged over its own length.",
    )

    def advantages(self, scores: Any) -> Any:
        return grpo_advantages(scores, self.samples_per_prompt, scale=not self.dr_grpo)

    def token_weights(self, mask: Any) -> Any:
        if self.dr_grpo:
            return mask / self.max_new_tokens
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1)


def rloo_advantages(scores: Any, k: int) -> Any:
    """a_i = r_i - (sum of the other k - 1 scores of i's group) / (k - 1); scores hold consecutive
    groups of k. Each group's advantages sum to 0."""
    grouped = scores.reshape(-1, k)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (k - 1)
    return (grouped - baseline).reshape(scores.shape)


def grpo_advantages(scores: Any, k: int, scale: bool = True, eps: float = STD_EPS) -> Any:
    """a_i = (r_i - group mean) / (group sample std + eps), or r_i - group mean when not `scale`
    (Dr.GRPO); scores hold consecutive groups of k."""
    grouped = scores.reshape(-1, k)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(scores.shape)


def train_group(
    sft: str,
    reward_model: str,
    prompts: list[dict[str, Any]],
    output: str,
    config: GroupConfig,
    seed: int = 0,
    inputs: list[str] | None = None,
) -> dict[str, Any]:
    """Train a policy with RLOO or GRPO (the config's class says which) and write it to `output`;
    returns the last step's metrics."""

    import torch

    from farmkit.methods import launch, rl_common, tracking
    from farmkit.methods import policy as P
    from farmkit.methods.gold import check_processes
    from farmkit.methods.ppo import (
        RunRecord,
        checkpoint_step,
        engine_state,
        linear_scheduler,
        load_engine_state,
        load_trainer_state,
        resume_point,
        rollout_prompts_and_gold,
    )
    from farmkit.methods.reward import RewardScorer
    from farmkit.methods.rollouts import load_policy_and_reference, prompt_order, sample_and_score
    from farmkit.models import PromptFormat

    if not config.method:
        raise ValueError("train_group needs an RLOOConfig or a GRPOConfig")
    k = config.samples_per_prompt
    accelerator = launch.make_accelerator(**tracking.accelerator_kwargs(config.report_to, output))
    tracking.start(accelerator, config.tool, config_dict(config))
    if config.gold:
        check_processes()
    device = str(accelerator.device)
    world, rank = accelerator.num_processes, accelerator.process_index
    if not accelerator.is_main_process:
        log.setLevel(logging.ERROR)  # one process speaks for all
    prompts_per_step = config.rollout_batch_size // k
    if prompts_per_step % world or config.minibatch_size % world:
        raise FarmError(
            "rollout-batch-size / samples-per-prompt (prompts per step) and minibatch-size must be "
            "multiples of the number of processes: each process samples whole groups"
        )
    local_rollouts = config.rollout_batch_size // world
    local_minibatch = max(1, config.minibatch_size // world)
    accumulation = -(-local_minibatch // config.micro_batch_size)
    accelerator.gradient_accumulation_steps = accumulation
    stage = launch.zero_stage(accelerator)
    if stage == 3 and config.lora:
        raise FarmError(
            "--lora under ZeRO-3 is not supported (merging split adapters is untested): use ZeRO-2 or DDP"
        )
    checkpoints, resume_from, start_step, state = resume_point(output, config)
    engine = engine_state(state, stage)
    torch.manual_seed(seed)

    with launch.no_zero3_init(accelerator):
        policy, reference, tokenizer = load_policy_and_reference(
            sft, device, reference=not config.lora, start_from=None if config.lora else resume_from
        )
        scorer = RewardScorer(reward_model, device=device, batch_size=config.reward_batch_size)
    scorer.network.requires_grad_(False)
    if config.lora:
        policy = P.add_lora(
            policy,
            config.lora_rank,
            config.lora_alpha,
            adapter=state / "policy-adapter" if state and engine is None else None,
        )
    for network in (policy, reference, scorer.network):
        if network is not None:
            P.disable_dropout(network)
            network.eval()  # no dropout: rollout and update see the same function

    fmt = PromptFormat.for_model(sft, config.template)
    policy_prompts, gold = rollout_prompts_and_gold(
        config, policy, tokenizer, fmt, prompts, sft, seed, device, reference, config.tool
    )

    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad],
        lr=config.learning_rate,
        eps=config.adam_eps,
    )
    updates_per_step = config.ppo_epochs * (local_rollouts // local_minibatch)
    scheduler = linear_scheduler(optimizer, config, updates_per_step)
    load_trainer_state(state, engine, optimizer, scheduler)
    launch.configure_deepspeed(
        accelerator, config.micro_batch_size, accumulation, config.max_grad_norm
    )
    model, optimizer = accelerator.prepare(P.PolicyOnly(policy), optimizer)
    load_engine_state(model, engine)
    if state is not None:
        log.info("resuming from %s (step %d)", resume_from, start_step)
    trained_dtype = next(accelerator.unwrap_model(model).parameters()).dtype
    if reference is not None and reference.dtype != trained_dtype:
        reference.to(trained_dtype)  # DeepSpeed's mixed precision casts the policy
    parameters = [p for p in model.parameters() if p.requires_grad]

    def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        return accelerator.reduce(tensor, reduction="sum") if world > 1 else tensor

    def reference_logits(chunk: P.Rollout) -> torch.Tensor:
        if reference is not None:
            return P.response_logits(reference, chunk, config.temperature)
        policy = accelerator.unwrap_model(model).policy
        with policy.disable_adapter():
            return P.response_logits(policy, chunk, config.temperature)

    record = RunRecord(
        accelerator,
        config,
        checkpoints,
        start_step,
        reward_model,
        dict(
            tool=config.tool,
            base_model=sft,
            template=fmt.resolved(tokenizer),
            seed=seed,
            inputs=list(inputs or []),
        ),
    )
    last, budget = record.last, record.budget
    order = prompt_order(len(prompts), config.steps * prompts_per_step, seed)
    kl_in_loss = config.kl_in == "loss" and config.kl_coef > 0
    started = time.time()
    for step in range(start_step, config.steps):
        step_prompts = order[step * prompts_per_step : (step + 1) * prompts_per_step][rank::world]
        batch_indices = [index for index in step_prompts for _ in range(k)]  # groups of k rows
        with launch.for_generation(accelerator, model) as unwrapped:
            batch = sample_and_score(
                unwrapped.policy,
                tokenizer,
                scorer,
                prompts,
                policy_prompts,
                batch_indices,
                temperature=config.temperature,
                max_new_tokens=config.max_new_tokens,
                unfinished=config.unfinished,
                unfinished_penalty=config.unfinished_penalty,
                seed=derive_seed(seed, f"{config.method} rollout", step, rank),
            )
        rollout, mask = batch.rollout, batch.rollout.response_mask
        with torch.no_grad():
            old_logprobs, ref_logprobs, entropies = [], [], []
            for start in range(0, len(batch_indices), config.micro_batch_size):
                chunk = rollout.rows(slice(start, start + config.micro_batch_size))
                logits = model(chunk, config.temperature)
                old_logprobs.append(P.token_logprobs(logits, chunk.response_ids))
                entropies.append(P.entropy(logits))
                ref_logprobs.append(P.token_logprobs(reference_logits(chunk), chunk.response_ids))
            old_logprobs, ref_logprobs = torch.cat(old_logprobs), torch.cat(ref_logprobs)
            entropies = torch.cat(entropies)
            kl = rl_common.kl_estimate(old_logprobs, ref_logprobs, config.kl_estimator) * mask
            scores = batch.scores.float()
            if config.kl_in == "reward":
                scores = scores - config.kl_coef * kl.sum(dim=1)
            advantages = config.advantages(scores)
            grouped = scores.reshape(-1, k)
            group_std = grouped.std(dim=1)
            old_sequence = (old_logprobs * mask).sum(dim=1)

        totals: dict[str, float] = {}
        for epoch in range(config.ppo_epochs):
            generator = torch.Generator().manual_seed(
                derive_seed(seed, f"{config.method} minibatches", step, epoch)
            )
            permutation = torch.randperm(len(batch_indices), generator=generator)
            for start in range(0, len(batch_indices), local_minibatch):
                rows = permutation[start : start + local_minibatch]
                responses = len(rows)
                tokens = mask[rows].sum().clamp(min=1)
                for micro in range(0, len(rows), config.micro_batch_size):
                    index = rows[micro : micro + config.micro_batch_size].to(mask.device)
                    chunk = rollout.rows(index)
                    chunk_mask = chunk.response_mask
                    with accelerator.accumulate(model):
                        logprobs = P.token_logprobs(
                            model(chunk, config.temperature), chunk.response_ids
                        )
                        loss, stats = _policy_loss(
                            config,
                            logprobs,
                            old_logprobs[index],
                            old_sequence[index],
                            advantages[index],
                            chunk_mask,
                            responses,
                            tokens,
                        )
                        if kl_in_loss:
                            kl_loss = (
                                rl_common.masked_sum(
                                    rl_common.kl_estimate(
                                        logprobs, ref_logprobs[index], config.kl_estimator
                                    ),
                                    config.token_weights(chunk_mask),
                                )
                                / responses
                            )
                            stats["kl_loss"] = kl_loss.detach()
                            loss = loss + config.kl_coef * kl_loss
                        # the loss is already divided by the whole minibatch: undo the launcher's
                        # division by the number of micro-batches
                        accelerator.backward(loss * accumulation)
                        if accelerator.sync_gradients:
                            accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
                        optimizer.step()  # a no-op until the minibatch's last micro-batch
                        optimizer.zero_grad()
                    for name, value in {"policy_loss": loss, **stats}.items():
                        totals[name] = (
                            totals.get(name, 0.0) + float(value.detach()) / updates_per_step
                        )
                scheduler.step()

        local = {
            "reward": batch.rewards.sum(),
            "score": batch.scores.sum(),
            "kl": kl.sum(),
            "response_length": mask.sum(),
            "unfinished": (~rollout.finished).float().sum(),
            "group_std": group_std.sum(),
            "zero_std_groups": (group_std == 0).float().sum(),
            "advantage_abs": advantages.abs().sum(),
            "prompt_tokens": rollout.prompt_mask.sum(),
        }
        summed = {name: float(reduce_sum(value.detach().float())) for name, value in local.items()}
        count = float(reduce_sum(torch.tensor(float(len(batch_indices)), device=mask.device)))
        groups = count / k
        budget.add(
            sampled=summed["response_length"],
            trained=(summed["prompt_tokens"] + summed["response_length"]) * config.ppo_epochs,
        )
        done = step + 1
        last = {
            "step": step + 1,
            "reward": summed["reward"] / count,
            "score": summed["score"] / count,
            "kl": summed["kl"] / count,
            "entropy": float(rl_common.masked_mean(entropies, mask, reduce_sum)),
            "response_length": summed["response_length"] / count,
            "unfinished_fraction": summed["unfinished"] / count,
            "group_score_std": summed["group_std"] / groups,
            "zero_std_group_fraction": summed["zero_std_groups"] / groups,
            "advantage_abs": summed["advantage_abs"] / count,
            **{
                name: float(reduce_sum(torch.tensor(value, device=mask.device))) / world
                for name, value in totals.items()
            },
            "learning_rate": scheduler.get_last_lr()[0],
            "elapsed_s": round(time.time() - started, 2),
            **budget.row(),
        }
        if gold is not None and checkpoint_step(done, config):
            with launch.for_generation(accelerator, model) as unwrapped:
                last.update(gold.evaluate(unwrapped.policy, tokenizer, f"step-{done}"))
        # the one metrics schema: the loss is the policy loss (KL term included when it is in the loss)
        last = metrics_row(config.method, last.pop("step"), last.get("policy_loss"), **last)
        message = (
            f"step {done}/{config.steps}  reward {last['reward']:.4f}  kl {last['kl']:.4f}  "
            f"entropy {last['entropy']:.3f}  length {last['response_length']:.1f}  "
            f"group std {last['group_score_std']:.3f}  clip {last['clip_fraction']:.3f}"
        )
        record.end_step(last, message, model, optimizer, scheduler, tokenizer, gold)
    record.save(model, tokenizer, output, gold)
    return last


def _policy_loss(
    config: GroupConfig,
    logprobs: Any,
    old_logprobs: Any,
    old_sequence: Any,
    advantages: Any,
    mask: Any,
    responses: int,
    tokens: Any,
) -> tuple[Any, dict[str, Any]]:
    """The clipped surrogate of one micro-batch, divided by the `responses` of its whole minibatch.
    RLOO: one ratio per response (its summed token log-ratio); GRPO: per-token ratios weighted by
    token_weights. The stats are per response (RLOO) or per token of the minibatch (GRPO)."""
    from farmkit.methods import rl_common

    if config.method == "rloo":
        sequence = (logprobs * mask).sum(dim=1, keepdim=True)
        ones = mask.new_ones(sequence.shape)
        return rl_common.clipped_policy_loss(
            sequence, old_sequence[:, None], advantages[:, None], ones, config.clip_range, responses
        )
    per_token = advantages[:, None] * mask
    loss, _ = rl_common.clipped_policy_loss(
        logprobs,
        old_logprobs,
        per_token,
        config.token_weights(mask),
        config.clip_range,
        responses,
    )
    _, stats = rl_common.clipped_policy_loss(
        logprobs.detach(), old_logprobs, per_token, mask, config.clip_range, tokens
    )
    return loss, stats


def run_cli(config: GroupConfig, sft: str, reward_model: str, prompts: str, output: str) -> None:
    """What farm-rloo and farm-grpo do once their options are read into `config`."""
    from farmkit.io import display_name, read_records

    records = list(read_records(prompts, "instruction"))
    if not records:
        raise FarmError(f"{display_name(prompts)}: no prompts to train on")
    last = train_group(
        sft, reward_model, records, output, config, seed=config.seed, inputs=[prompts]
    )
    if last:
        log.info("last step: reward %.4f, kl %.4f", last["reward"], last["kl"])
    log.info("wrote %s", output)
