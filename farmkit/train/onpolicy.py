"""The one on-policy trainer: the loop that PPO, RLOO, GRPO and Dr.GRPO share, each method being
what differs (farmkit.train.estimators: its advantage estimator and its loss).

A step: take the step's prompts in a seeded order (each process its share; a group never spans two
processes); push the policy's weights into the rollout engine when it has its own (vLLM); sample
one response per row with the rollout backend and score it with the reward model; recompute the
sampled tokens' log-probabilities under the policy (and the value model's values, for PPO) and
under the frozen reference, the per-token KL estimate; hand the batch to the method for its
advantages; then `ppo_epochs` passes over the batch in minibatches of micro-batches, under
accelerate (DDP or DeepSpeed ZeRO-2/3: the policy, with a value model, as one engine). Every step
appends a metrics line, every --save-steps steps a policy folder that --resume continues from
(farmkit.train.checkpoints), --gold judges checkpoints, and the trained policy is written whole at
the end.

Rollout backends (farmkit.train.rollout_backends): `hf` samples with transformers' generate from
the policy itself; `vllm` keeps a vLLM engine in the training process (colocated) and pushes the
policy's weights into it before each rollout. With an engine of its own, metrics.jsonl gets the
mismatch between the engine's log-probabilities of its sampled tokens and the trainer's
(rollout_logprob_diff_mean and _max), and --importance-sampling-cap turns on truncated importance
sampling: each token's surrogate weighted by min(pi_trainer / pi_engine, cap).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed
from farmkit.train.config import config_dict
from farmkit.train.metrics import metrics_row

log = logging.getLogger("farmkit")


@dataclass
class Prepared:
    """What a method makes of a scored rollout batch before its updates (rows of this process)."""

    advantages: Any  # [batch, tokens] (PPO) or [batch] (the group methods)
    kl: Any  # [batch, tokens], the per-token KL estimate under the sampling policy, 0 on padding
    returns: Any = None  # [batch, tokens] (PPO's value targets)
    old_values: Any = None  # [batch, tokens] (PPO)
    # per-step sums over this process's rows, reduced over processes and divided as `divisors` says
    sums: dict[str, Any] = field(default_factory=dict)


@dataclass
class MicroBatch:
    """One forward/backward pass of an update: the current policy's log-probabilities (and values)
    of some rollout rows, with what the rollout had for those rows."""

    logprobs: Any  # [rows, tokens], with gradient
    values: Any  # [rows, tokens] (PPO's value model), else None
    index: Any  # the rows, into the rollout batch
    mask: Any  # [rows, tokens] response mask
    old_logprobs: Any  # [rows, tokens] under the sampling policy (recomputed by the trainer)
    ref_logprobs: Any  # [rows, tokens] under the frozen reference
    responses: int  # rows in the whole minibatch (what per-response losses divide by)
    tokens: Any  # response tokens in the whole minibatch (what per-token losses divide by)
    weights: Any = None  # truncated importance weights of these rows (None: off)

    def rows(self, tensor: Any) -> Any:
        """This micro-batch's rows of a rollout-batch tensor."""
        return tensor[self.index]

    def surrogate(
        self, loss: str, advantages: Any, clip: float, norm: int | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The clipped surrogate of these rows aggregated as the registered policy loss `loss` says
        (farmkit.train.estimators), importance-weighted when weights are on."""
        from farmkit.train.estimators import policy_loss

        return policy_loss(loss)(
            self.logprobs,
            self.old_logprobs,
            self.rows(advantages),
            self.mask,
            clip,
            responses=self.responses,
            tokens=self.tokens,
            norm=norm,
            weights=self.weights,
        )


class OnPolicyMethod:
    """What one on-policy method adds to the shared loop. Subclasses set `name` (metrics' method
    and the seeds' label), `tool`, `value_model`, and implement prepare, loss and message."""

    name = ""
    tool = ""
    value_model = False  # PPO: a value model trains beside the policy, as one module

    def __init__(self, config: Any) -> None:
        self.config = config

    @property
    def prompts_per_step(self) -> int:
        return self.config.rollout_batch_size

    def check_processes(self, world: int) -> None:
        config = self.config
        if config.rollout_batch_size % world or config.minibatch_size % world:
            raise FarmError(
                "rollout-batch-size and minibatch-size must be multiples of the number of processes"
            )

    def rows(self, prompt_indices: list[int]) -> list[int]:
        """The rollout's rows for this process's prompts (one each; the group methods repeat each
        prompt k times)."""
        return prompt_indices

    def prepare(
        self, batch: Any, old_logprobs: Any, ref_logprobs: Any, old_values: Any, reduce: Any
    ) -> Prepared:
        raise NotImplementedError

    def advantages_use_old_logprobs(self) -> bool:
        """Whether prepare's advantages depend on the sampling policy's log-probabilities (a KL
        penalty in the reward does). When they do not, one epoch of one minibatch takes the old
        log-probabilities from the update's own forward instead of a pass of their own."""
        return True

    def loss(self, micro: MicroBatch, prepared: Prepared) -> tuple[Any, dict[str, Any]]:
        """(the loss to back-propagate, the figures to average over the step's updates)."""
        raise NotImplementedError

    def step_figures(self, summed: dict[str, float], count: float) -> dict[str, float]:
        """The method's own figures of a step from its reduced `sums` (after unfinished_fraction)."""
        return {}

    def total_loss(self, row: dict[str, Any]) -> float | None:
        return row.get("policy_loss")

    def message(self, row: dict[str, Any]) -> str:
        """The step's log line after "step N/M"."""
        return (
            f"reward {row['reward']:.4f}  kl {row['kl']:.4f}  entropy {row['entropy']:.3f}  "
            f"length {row['response_length']:.1f}  {self.message_figures(row)}  "
            f"clip {row['clip_fraction']:.3f}"
        )

    def message_figures(self, row: dict[str, Any]) -> str:
        return ""

    def sequence_weights(self) -> bool:
        """Whether importance weights apply per response (RLOO's one ratio) rather than per token."""
        return False


def rollout_prompts_and_gold(
    config: Any,
    policy: Any,
    tokenizer: Any,
    fmt: Any,
    prompts: list[dict[str, Any]],
    sft: str,
    seed: int,
    device: str,
    reference: Any,
    tool: str,
) -> tuple[list[list[int]], Any]:
    """The prompts' token ids, each cut to what the context holds beside max_new_tokens (warned
    once), and the run's gold judge (None without --gold)."""
    from farmkit.train import policy as P
    from farmkit.train.gold import make_gold

    policy_prompts = P.fit_rollout_prompts(
        policy,
        tokenizer,
        [fmt.prompt(tokenizer, r["instruction"], r.get("input")) for r in prompts],
        config.max_new_tokens,
    )
    gold = make_gold(
        config.gold,
        config.gold_prompts,
        config.gold_size,
        prompts,
        sft,
        template=config.template,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=seed,
        device=device,
        batch_size=config.reward_batch_size,
        start_network=reference,
        tool=tool,
    )
    return policy_prompts, gold


def run_method(
    method_class: type[OnPolicyMethod],
    sft: str,
    reward_model: str,
    prompts: list[dict[str, Any]],
    output: str,
    config: Any,
    seed: int = 0,
    inputs: list[str] | None = None,
) -> dict[str, Any]:
    """train_on_policy with a method made from `config` (what train_ppo and train_group call)."""
    return train_on_policy(
        method_class(config), sft, reward_model, prompts, output, seed=seed, inputs=inputs
    )


def train_on_policy(
    method: OnPolicyMethod,
    sft: str,
    reward_model: str,
    prompts: list[dict[str, Any]],
    output: str,
    seed: int = 0,
    inputs: list[str] | None = None,
) -> dict[str, Any]:
    """Train a policy with `method` and write it to `output`; returns the last step's metrics."""
    import torch

    from farmkit.lm.models import PromptFormat
    from farmkit.train import checkpoints as C
    from farmkit.train import launch, rl_common, tracking
    from farmkit.train import policy as P
    from farmkit.train.gold import check_processes
    from farmkit.train.rollout_backends import (
        logprob_mismatch,
        make_backend,
        resolve_backend,
        truncated_is_weights,
    )
    from farmkit.train.rollouts import load_policy_and_reference, prompt_order, sample_and_score
    from farmkit.train.scoring import RewardScorer

    config = method.config
    resolve_backend(config.rollout_backend)  # vllm asked for and missing: say so before any work
    accelerator = launch.device_accelerator(
        config.device, **tracking.accelerator_kwargs(config.report_to, output)
    )
    if config.gold:
        check_processes()
    tracking.start(accelerator, method.tool, config_dict(config))
    device = str(accelerator.device)
    world, rank = accelerator.num_processes, accelerator.process_index
    if not accelerator.is_main_process:
        log.setLevel(logging.ERROR)  # one process speaks for all
    method.check_processes(world)
    local_rollouts = config.rollout_batch_size // world
    local_minibatch = max(1, config.minibatch_size // world)
    # a minibatch is this many micro-batches; gradients accumulate over them (accelerate, or DeepSpeed's engine)
    accumulation = -(-local_minibatch // config.micro_batch_size)
    accelerator.gradient_accumulation_steps = accumulation
    stage = launch.zero_stage(accelerator)
    if stage == 3 and config.lora:
        raise FarmError(
            "--lora under ZeRO-3 is not supported (merging split adapters is untested): use ZeRO-2 or DDP"
        )

    checkpoints, resume_from, start_step, state = C.resume_point(output, config)
    engine = C.engine_state(state, stage)
    offload = getattr(config, "offload_frozen", False)
    torch.manual_seed(seed)
    value_model = None
    with launch.no_zero3_init(accelerator):
        policy, reference, tokenizer = load_policy_and_reference(
            sft,
            device,
            reference=not config.lora,
            start_from=None if config.lora else resume_from,
            reference_device="cpu" if offload else None,
        )
        scorer = RewardScorer(
            reward_model, device=device, batch_size=config.reward_batch_size, offload=offload
        )
        if method.value_model:
            value_model = method.load_value_model(
                reward_model, scorer, tokenizer, state, engine, device
            )
    scorer.network.requires_grad_(False)
    if value_model is not None:
        value_model.config.pad_token_id = tokenizer.pad_token_id
    if config.lora:
        policy = P.add_lora(
            policy,
            config.lora_rank,
            config.lora_alpha,
            adapter=state / "policy-adapter" if state and engine is None else None,
        )
        if value_model is not None:
            value_model = P.add_lora(
                value_model,
                config.lora_rank,
                config.lora_alpha,
                task_type="SEQ_CLS",
                adapter=state / "value-adapter" if state and engine is None else None,
            )
    for network in (policy, reference, scorer.network, value_model):
        if network is not None:
            P.disable_dropout(network)
            network.eval()  # no dropout: rollout and update see the same function

    fmt = PromptFormat.for_model(sft, config.template)
    policy_prompts, gold = rollout_prompts_and_gold(
        config, policy, tokenizer, fmt, prompts, sft, seed, device, reference, method.tool
    )

    parameters = [
        p
        for model in (policy, value_model)
        if model is not None
        for p in model.parameters()
        if p.requires_grad
    ]
    optimizer = P.adamw(parameters, lr=config.learning_rate, eps=config.adam_eps)
    updates_per_step = config.ppo_epochs * (local_rollouts // local_minibatch)
    scheduler = C.linear_scheduler(optimizer, config, updates_per_step)
    C.load_trainer_state(state, engine, optimizer, scheduler)
    # one module, one optimizer: DeepSpeed prepares a single model. The scheduler stays unprepared:
    # accelerate would step it once per process
    launch.configure_deepspeed(
        accelerator, config.micro_batch_size, accumulation, config.max_grad_norm
    )
    module = (
        P.PolicyAndValue(policy, value_model) if value_model is not None else P.PolicyOnly(policy)
    )
    model, optimizer = accelerator.prepare(module, optimizer)
    C.load_engine_state(model, engine)
    trained_dtype = next(accelerator.unwrap_model(model).parameters()).dtype
    if reference is not None and reference.dtype != trained_dtype:
        reference.to(
            trained_dtype
        )  # DeepSpeed's mixed precision casts the policy: the KL compares like with like
    if reference is not None and offload:
        launch.offload_frozen(reference, device)  # in the precision it compares in
    parameters = [p for p in model.parameters() if p.requires_grad]
    backend = make_backend(
        config.rollout_backend,
        sft,
        seed=seed,
        device=device,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        dtype=str(trained_dtype).removeprefix("torch."),
    )
    log.info("rollouts: %s backend", backend.name)
    is_cap = config.importance_sampling_cap

    def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        return accelerator.reduce(tensor, reduction="sum") if world > 1 else tensor

    # under a mixed-precision launch the prepared module's forward runs under autocast: the
    # reference's forward and the sampling must too, or the KL is not 0 before the first update and
    # the rollout is not drawn from the function the update's ratio assumes
    def reference_logits(chunk: P.Rollout) -> torch.Tensor:
        with accelerator.autocast():
            if reference is not None:
                return P.response_logits(reference, chunk, config.temperature)
            policy = accelerator.unwrap_model(model).policy
            with policy.disable_adapter():
                return P.response_logits(policy, chunk, config.temperature)

    record = C.RunRecord(
        accelerator,
        config,
        checkpoints,
        start_step,
        reward_model,
        dict(
            tool=method.tool,
            base_model=sft,
            template=fmt.resolved(tokenizer),
            seed=seed,
            inputs=list(inputs or []),
        ),
    )
    last, budget = record.last, record.budget
    per_step = method.prompts_per_step
    order = prompt_order(len(prompts), config.steps * per_step, seed)
    # the engine starts from the SFT folder: it needs the policy's weights once they differ from it
    stale = resume_from is not None or state is not None
    # one epoch of one minibatch: the update's forward runs before any weight changes, so it gives the
    # old log-probabilities (the ratio's denominator, detached) and no pass of their own is needed,
    # as TRL's GRPOTrainer does. PPO's value model and truncated importance sampling (whose weights
    # are needed before the update) keep the pass
    fused = (
        updates_per_step == 1
        and value_model is None
        and not is_cap
        and not method.advantages_use_old_logprobs()
    )

    def engine_mismatch(batch: Any, old_logprobs: Any, mask: Any) -> tuple[dict[str, Any], Any]:
        """The engine/trainer log-probability figures and the truncated importance weights."""
        if batch.engine_logprobs is None:
            return {}, None
        engine_logprobs = batch.engine_logprobs.to(old_logprobs.device)
        # one process: the vllm backend refuses several (see rollout_backends)
        figures = {
            f"rollout_logprob_diff_{name}": value
            for name, value in logprob_mismatch(engine_logprobs, old_logprobs, mask).items()
        }
        if not is_cap:
            return figures, None
        weights = truncated_is_weights(
            old_logprobs, engine_logprobs, mask, is_cap, per_sequence=method.sequence_weights()
        )
        return figures, weights

    started = time.time()
    for step in range(start_step, config.steps):
        batch_indices = method.rows(order[step * per_step : (step + 1) * per_step][rank::world])
        with launch.for_generation(accelerator, model) as unwrapped, accelerator.autocast():
            if stale:
                backend.sync(unwrapped.policy)
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
                seed=derive_seed(seed, f"{method.name} rollout", step, rank),
                backend=backend,
            )
        rollout, mask = batch.rollout, batch.rollout.response_mask
        with torch.no_grad():
            old_logprobs, ref_logprobs, old_values, entropies = [], [], [], []
            for start in range(0, len(batch_indices), config.micro_batch_size):
                chunk = rollout.rows(slice(start, start + config.micro_batch_size))
                ref_logprobs.append(P.token_logprobs(reference_logits(chunk), chunk.response_ids))
                if fused:
                    continue
                forward = model(chunk, config.temperature)
                logits, values = forward if value_model is not None else (forward, None)
                old_logprobs.append(P.token_logprobs(logits, chunk.response_ids))
                entropies.append(P.entropy(logits))
                if values is not None:
                    old_values.append(values)
            ref_logprobs = torch.cat(ref_logprobs)
            if fused:
                # filled row by row by the update's forward, which runs before any weight changes
                old_logprobs, entropies = (
                    torch.zeros_like(ref_logprobs),
                    torch.zeros_like(mask, dtype=ref_logprobs.dtype),
                )
                # the advantages do not read the old log-probabilities (advantages_use_old_logprobs)
                prepared = method.prepare(batch, ref_logprobs, ref_logprobs, None, reduce_sum)
                engine_figures, weights = {}, None  # measured after the update
            else:
                old_logprobs, entropies = torch.cat(old_logprobs), torch.cat(entropies)
                old_values = torch.cat(old_values) * mask if old_values else None
                prepared = method.prepare(batch, old_logprobs, ref_logprobs, old_values, reduce_sum)
                engine_figures, weights = engine_mismatch(batch, old_logprobs, mask)
        totals: dict[str, float] = {}
        for epoch in range(config.ppo_epochs):
            generator = torch.Generator().manual_seed(
                derive_seed(seed, f"{method.name} minibatches", step, epoch)
            )
            permutation = torch.randperm(len(batch_indices), generator=generator)
            for start in range(0, len(batch_indices), local_minibatch):
                rows = permutation[start : start + local_minibatch]
                responses = len(rows)
                tokens = mask[rows].sum().clamp(min=1)
                for micro in range(0, len(rows), config.micro_batch_size):
                    index = rows[micro : micro + config.micro_batch_size].to(mask.device)
                    chunk = rollout.rows(index)
                    with accelerator.accumulate(model):
                        forward = model(chunk, config.temperature)
                        logits, values = forward if value_model is not None else (forward, None)
                        logprobs = P.token_logprobs(logits, chunk.response_ids)
                        if fused:
                            with torch.no_grad():
                                old_logprobs[index] = logprobs.detach()
                                entropies[index] = P.entropy(logits.detach())
                        micro_batch = MicroBatch(
                            logprobs,
                            values,
                            index,
                            chunk.response_mask,
                            old_logprobs[index],
                            ref_logprobs[index],
                            responses,
                            tokens,
                            None if weights is None else weights[index],
                        )
                        loss, figures = method.loss(micro_batch, prepared)
                        # the loss is already divided by the whole minibatch: undo the launcher's
                        # division by the number of micro-batches
                        accelerator.backward(loss * accumulation)
                        if accelerator.sync_gradients:
                            accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
                        optimizer.step()  # a no-op until the minibatch's last micro-batch
                        optimizer.zero_grad()
                    for name, value in figures.items():
                        totals[name] = (
                            totals.get(name, 0.0) + float(value.detach()) / updates_per_step
                        )
                scheduler.step()
        C.check_finite(step + 1, model=model)  # before the next rollout samples from it
        stale = True  # the policy moved: the engine (if it has its own weights) needs them
        if fused:  # the KL figures from the log-probabilities the update's forward gave
            with torch.no_grad():
                prepared = method.prepare(batch, old_logprobs, ref_logprobs, None, reduce_sum)
                engine_figures, _ = engine_mismatch(batch, old_logprobs, mask)

        local = {
            "reward": batch.rewards.sum(),
            "score": batch.scores.sum(),
            "kl": prepared.kl.sum(),
            "response_length": mask.sum(),
            "unfinished": (~rollout.finished).float().sum(),
            **prepared.sums,
            "prompt_tokens": rollout.prompt_mask.sum(),
        }
        summed = {name: float(reduce_sum(value.detach().float())) for name, value in local.items()}
        count = float(reduce_sum(torch.tensor(float(len(batch_indices)), device=mask.device)))
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
            **method.step_figures(summed, count),
            **{
                name: float(reduce_sum(torch.tensor(value, device=mask.device))) / world
                for name, value in totals.items()
            },
            **engine_figures,
            "learning_rate": scheduler.get_last_lr()[0],
            "elapsed_s": round(time.time() - started, 2),
            **budget.row(),
        }
        if gold is not None and C.checkpoint_step(done, config):
            with launch.for_generation(accelerator, model) as unwrapped:
                last.update(gold.evaluate(unwrapped.policy, tokenizer, f"step-{done}"))
        C.check_finite(done, method.total_loss(last))
        last = metrics_row(method.name, last.pop("step"), method.total_loss(last), **last)
        message = f"step {done}/{config.steps}  " + method.message(last)
        record.end_step(last, message, model, optimizer, scheduler, tokenizer, gold)
    record.save(model, tokenizer, output, gold)
    backend.close()
    return last
