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
(rollout_logprob_diff_mean and _max, rollout_kl), and --importance-sampling-cap turns on the
rollout correction (--rollout-correction: each token's surrogate weighted by min(pi_trainer /
pi_engine, cap), by the response's ratio, or masked above the cap). DAPO's dynamic sampling and
overlong penalty or filter act on the rollout; the off-policy mask on the loss. Rollouts sampled
with --top-p/--top-k carry each token's kept count (recorded by the hf sampler, or computed here by
the same rule before the update: record_kept), and every log-probability the step takes is
renormalised over that many tokens (policy.replayed_logits; docs/methods.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from farmkit.core.devices import torch_device_peak
from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed
from farmkit.train.config import config_dict
from farmkit.train.metrics import StepWork, metrics_row, parameter_count, step_throughput

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
    # the whole minibatch's rows and response tokens (what per-response and per-token losses
    # divide by), over every process and divided by their number (minibatch_counts)
    responses: Any
    tokens: Any
    weights: Any = None  # these rows' weights: the rollout correction (None: off)
    sampling_logprobs: Any = None  # [rows, tokens] the engine's, where it has its own (else None)
    off_policy_threshold: float | None = None  # --off-policy-mask-threshold

    def rows(self, tensor: Any) -> Any:
        """This micro-batch's rows of a rollout-batch tensor."""
        return tensor[self.index]

    def surrogate(
        self,
        loss: str,
        advantages: Any,
        clip: float | tuple[float, float],
        norm: int | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """The clipped surrogate of these rows aggregated as the registered policy loss `loss` says
        (farmkit.train.estimators), weighted when weights are on, responses too far off-policy
        dropped when a threshold is set (its share in the figures). `clip`: one range or
        (low, high); `params`: the loss's own parameters by name."""
        from farmkit.train.estimators import combined_weights, policy_loss
        from farmkit.train.rollout_backends import off_policy_keep

        advantages, weights, dropped = self.rows(advantages), None, {}
        if self.off_policy_threshold is not None:
            sampling = (
                self.old_logprobs if self.sampling_logprobs is None else self.sampling_logprobs
            )
            keep = off_policy_keep(
                advantages, self.logprobs, sampling, self.mask, self.off_policy_threshold
            )
            weights = combined_weights(weights, keep)
            count = self.tokens if keep.dim() == 2 else self.responses
            outside = 1 - keep if keep.dim() == 1 else (1 - keep) * self.mask
            dropped = {"off_policy_masked_fraction": outside.sum() / count}
        loss, figures = policy_loss(loss)(
            self.logprobs,
            self.old_logprobs,
            advantages,
            self.mask,
            clip,
            responses=self.responses,
            tokens=self.tokens,
            norm=norm,
            weights=weights,
            rollout_weights=self.weights,
            params=params,
        )
        return loss, {**figures, **dropped}


def minibatch_counts(mask: Any, reduce_sum: Any) -> tuple[Any, Any]:
    """(responses, response tokens) that a minibatch's losses divide by, from this process's rows
    of it (`mask`, all its micro-batches): the minibatch's counts over every process, divided by
    the number of processes, as TRL's GRPOTrainer does, since DDP (and DeepSpeed) average the
    processes' gradients. So every token (and response) of the minibatch weighs the same however
    many processes share it (tests/train/gradient_parity.py)."""
    import torch

    local = torch.tensor([1.0, mask.shape[0], float(mask.sum())], device=mask.device)
    world, responses, tokens = reduce_sum(local)
    return responses / world, tokens.clamp(min=1) / world


class OnPolicyMethod:
    """What one on-policy method adds to the shared loop. Subclasses set `name` (metrics' method
    and the seeds' label), `tool`, `value_model`, and implement prepare, loss and message."""

    name = ""
    tool = ""
    value_model = False  # PPO: a value model trains beside the policy, as one module
    group_size = 1  # rows sampled per prompt, consecutive (--dynamic-sampling drops whole groups)

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


# ---------------------------------------------------------------------------------------------
# The set-up the on-policy loop and Quark share: the launch, the models, the rollout prompts, the
# gold judge, the reference in the trained precision and the rollout engine.


def start_run(config: Any, tool: str, output: str, **accelerator_kwargs: Any) -> Any:
    """The run's accelerator on --device, its trackers started (--gold refused first under several
    processes); only the main process logs from here on."""
    from farmkit.train import launch, tracking
    from farmkit.train.gold import check_processes
    from farmkit.train.precision import launch_precision

    on_gpu = launch.check_device(config.device).startswith("cuda")
    accelerator = launch.device_accelerator(
        config.device,
        **launch_precision(config.precision, on_gpu),
        **accelerator_kwargs,
        **tracking.accelerator_kwargs(config.report_to, output),
    )
    if config.gold:
        check_processes()
    tracking.start(accelerator, tool, config_dict(config))
    if not accelerator.is_main_process:
        log.setLevel(logging.ERROR)  # one process speaks for all
    return accelerator


def load_models(
    accelerator: Any,
    config: Any,
    sft: str,
    reward_model: Any,
    device: str,
    *,
    reference: bool = True,
    start_from: Any = None,
    offload: bool = False,
) -> tuple[Any, Any, Any, Any]:
    """(policy, frozen reference or None, tokenizer, scorer), loaded whole: the engine splits
    only what it trains. `reward_model`: a reward model's folder, or a judge of pairs that scores
    each group (pairwise.PairJudge, --pool). `offload`: the frozen models' weights kept in CPU
    memory."""
    from farmkit.train import launch
    from farmkit.train.pairwise import PairwiseScorer
    from farmkit.train.rollouts import load_policy_and_reference
    from farmkit.train.scoring import RewardScorer

    with launch.no_zero3_init(accelerator):
        policy, frozen, tokenizer = load_policy_and_reference(
            sft,
            device,
            reference=reference,
            start_from=start_from,
            reference_device="cpu" if offload else None,
        )
        if not isinstance(reward_model, str | os.PathLike):
            return policy, frozen, tokenizer, PairwiseScorer(reward_model, config)
        scorer = RewardScorer(
            reward_model, device=device, batch_size=config.reward_batch_size, offload=offload
        )
    scorer.network.requires_grad_(False)
    return policy, frozen, tokenizer, scorer


def without_dropout(*networks: Any) -> None:
    """No dropout: rollout and update see the same function."""
    from farmkit.train import policy as P

    for network in networks:
        if network is not None:
            P.disable_dropout(network)
            network.eval()


def rollout_prompts(
    policy: Any,
    tokenizer: Any,
    fmt: Any,
    prompts: list[dict[str, Any]],
    max_new_tokens: int,
    reserve: int = 0,
) -> list[list[int]]:
    """The prompts' token ids, each cut to what the context holds beside max_new_tokens and
    `reserve` tokens appended later (warned once)."""
    from farmkit.train import policy as P

    return P.fit_rollout_prompts(
        policy,
        tokenizer,
        [fmt.prompt(tokenizer, r["instruction"], r.get("input")) for r in prompts],
        max_new_tokens,
        reserve=reserve,
    )


def match_reference(accelerator: Any, model: Any, reference: Any) -> Any:
    """The trained precision (DeepSpeed's mixed precision casts the policy), the reference cast to
    it: the KL compares like with like."""
    trained_dtype = next(accelerator.unwrap_model(model).parameters()).dtype
    if reference is not None and reference.dtype != trained_dtype:
        reference.to(trained_dtype)
    return trained_dtype


def start_backend(kind: str, sft: str, seed: int, device: str, config: Any, dtype: Any) -> Any:
    """The rollout engine (farmkit.train.rollout_backends) of the run, said on stderr."""
    from farmkit.train.rollout_backends import make_backend

    backend = make_backend(
        kind,
        sft,
        seed=seed,
        device=device,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        dtype=str(dtype).removeprefix("torch."),
        compiled=config.compile_generation,
    )
    log.info("rollouts: %s backend", backend.name)
    return backend


def sample(
    config: Any,
    sampler: Any,
    tokenizer: Any,
    scorer: Any,
    prompts: list[dict[str, Any]],
    prompt_ids: list[list[int]],
    rows: list[int],
    seed: int,
    backend: Any,
    suppress: Any = (),
) -> Any:
    """The rollout phase: one response to each row's prompt, sampled by `backend` from `sampler` as
    the config says, scored by the reward model (rollouts.sample_and_score)."""
    from farmkit.train.rollouts import sample_and_score

    return sample_and_score(
        sampler,
        tokenizer,
        scorer,
        prompts,
        prompt_ids,
        rows,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        unfinished=config.unfinished,
        unfinished_penalty=config.unfinished_penalty,
        seed=seed,
        suppress=suppress,
        backend=backend,
        # the on-policy methods' truncated sampling (Quark's config has none)
        top_p=getattr(config, "top_p", 1.0),
        top_k=getattr(config, "top_k", 0),
    )


# ---------------------------------------------------------------------------------------------
# The loop.


def run_method(
    method_class: type[OnPolicyMethod],
    sft: str,
    reward_model: Any,
    prompts: list[dict[str, Any]],
    output: str,
    config: Any,
    seed: int = 0,
    inputs: list[str] | None = None,
    gold_pools: Any = None,
) -> dict[str, Any]:
    """train_on_policy with a method made from `config` (what train_ppo and train_group call)."""
    return train_on_policy(
        method_class(config),
        sft,
        reward_model,
        prompts,
        output,
        seed=seed,
        inputs=inputs,
        gold_pools=gold_pools,
    )


def train_on_policy(
    method: OnPolicyMethod,
    sft: str,
    reward_model: Any,
    prompts: list[dict[str, Any]],
    output: str,
    seed: int = 0,
    inputs: list[str] | None = None,
    gold_pools: Any = None,
) -> dict[str, Any]:
    """Train a policy with `method` and write it to `output`; returns the last step's metrics.
    `reward_model`: a reward model's folder, or a pairwise.PairJudge that scores each group (the
    run stops before a step whose comparisons --max-cost does not pay for).
    `gold_pools`: the loader of annotator pools a --gold name is looked up in
    (farmkit.annotate.run.gold_pool; farmkit.train.gold.PoolLoader)."""
    from farmkit.train.pairwise import BudgetSpent

    trainer = OnPolicyTrainer(method, sft, reward_model, prompts, output, seed, inputs, gold_pools)
    last = trainer.record.last  # a resumed run with no step left returns the step it resumed
    try:
        for number in range(trainer.start_step, method.config.steps):
            try:
                step = trainer.rollout(number)
            except BudgetSpent as spent:
                trainer.stop(number, str(spent))
                break
            trainer.score(step)
            trainer.advantages(step)
            trainer.update(step)
            last = trainer.log(step)
            trainer.checkpoint(step)
    finally:
        if trainer.ahead is not None:
            trainer.ahead.close()
    trainer.save()
    return last


@dataclass
class Step:
    """What one step of the loop has made so far, phase by phase (rows of this process)."""

    number: int  # 0-based; the step is `number + 1` once done
    rows: list[int]  # the rollout's prompt indices
    batch: Any  # the sampled and scored rollout (rollouts.ScoredRollout)
    old_logprobs: Any = None  # [rows, tokens] under the sampling policy
    ref_logprobs: Any = None  # [rows, tokens] under the frozen reference
    old_values: Any = None  # [rows, tokens] (PPO's value model)
    entropies: Any = None  # [rows, tokens]
    prepared: Prepared | None = None
    engine_figures: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)  # the rollout's own (dynamic sampling)
    discarded_tokens: float = 0.0  # sampled, then left out of the batch (dynamic sampling)
    weights: Any = None  # the rollout correction's (None: off)
    loss_mask: Any = None  # the response mask of the loss (--overlong filter: unfinished rows 0)
    staleness: int | None = None  # --async-rollouts: steps the sampling weights lag the policy
    totals: dict[str, float] = field(default_factory=dict)  # the updates' figures, averaged
    row: dict[str, Any] = field(default_factory=dict)  # its metrics row, once logged

    @property
    def mask(self) -> Any:
        return self.batch.rollout.response_mask


class OnPolicyTrainer:
    """One on-policy run of a method: the set-up (__init__), the phases of a step (rollout, score,
    advantages, update, log, checkpoint) and the trained policy's save."""

    def __init__(
        self,
        method: OnPolicyMethod,
        sft: str,
        reward_model: str,
        prompts: list[dict[str, Any]],
        output: str,
        seed: int,
        inputs: list[str] | None,
        gold_pools: Any,
    ) -> None:
        import torch

        from farmkit.lm.models import PromptFormat
        from farmkit.train import checkpoints as C
        from farmkit.train import launch
        from farmkit.train.gold import GoldRequest, make_gold
        from farmkit.train.rollout_backends import resolve_backend
        from farmkit.train.rollouts import prompt_order

        config = self.config = method.config
        self.method, self.prompts, self.output, self.seed = method, prompts, output, seed
        self.steps_done, self.stopped = config.steps, None
        # vllm asked for and missing: say so before any work
        kind = resolve_backend(config.rollout_backend)
        truncated = getattr(config, "top_p", 1.0) < 1 or getattr(config, "top_k", 0) > 0
        if config.async_rollouts and kind == "vllm" and truncated:
            raise FarmError(
                "--async-rollouts with the vllm rollout backend samples without --top-p/--top-k for "
                "now (the engine does not say which tokens it kept, and the trainer can replay the "
                "truncation only on the weights that sampled, which a stale batch's are not): "
                "leave them out, or use --rollout-backend hf"
            )
        accelerator = self.accelerator = start_run(config, method.tool, output)
        self.device = str(accelerator.device)
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        method.check_processes(self.world)
        if not isinstance(reward_model, str | os.PathLike) and self.world > 1:
            # every process would pay for its own groups out of one budget it cannot see whole
            raise FarmError(
                "--pool runs as one process: launch it without torchrun or accelerate launch"
            )
        self.local_minibatch = max(1, config.minibatch_size // self.world)
        # a minibatch is this many micro-batches; gradients accumulate over them (accelerate, or
        # DeepSpeed's engine)
        self.accumulation = -(-self.local_minibatch // config.micro_batch_size)
        accelerator.gradient_accumulation_steps = self.accumulation
        stage = launch.zero_stage(accelerator)
        if stage == 3 and config.async_rollouts:
            raise FarmError(
                "--async-rollouts under ZeRO-3 is not supported (its copy of the policy would be "
                "a copy of this process's shards): use ZeRO-2 or DDP"
            )
        if stage == 3 and config.lora:
            raise FarmError(
                "--lora under ZeRO-3 is not supported (merging split adapters is untested): use ZeRO-2 or DDP"
            )
        checkpoints, resume_from, self.start_step, state = C.resume_point(output, config)
        engine = C.engine_state(state, stage)
        torch.manual_seed(seed)
        policy, value_model = self._load_models(sft, reward_model, state, engine, resume_from)
        self.peak = torch_device_peak(self.device)[0]  # for the steps' MFU (None: unknown)
        self.policy_parameters = parameter_count(policy)
        self.fmt = PromptFormat.for_model(sft, config.template)
        self.prompt_ids = rollout_prompts(
            policy, self.tokenizer, self.fmt, prompts, config.max_new_tokens
        )
        self.gold = make_gold(
            GoldRequest.of(
                config,
                seed=seed,
                batch_size=config.reward_batch_size,
                tool=method.tool,
                pools=gold_pools,
            ),
            prompts,
            sft,
            device=self.device,
            start_network=self.reference,
        )
        self._prepare_training(policy, value_model, state, engine)
        self.backend = start_backend(
            config.rollout_backend, sft, seed, self.device, config, self.trained_dtype
        )
        self.record = C.RunRecord(
            accelerator,
            config,
            checkpoints,
            self.start_step,
            reward_model,
            dict(
                tool=method.tool,
                base_model=sft,
                template=self.fmt.resolved(self.tokenizer),
                seed=seed,
                inputs=list(inputs or []),
            ),
        )
        self.asks = self.scorer if self.scorer.network is None else None  # --pool: it asks a judge
        if self.asks is not None:
            self.asks.resume(self.record.last)
        self.order = prompt_order(len(prompts), config.steps * method.prompts_per_step, seed)
        # the engine starts from the SFT folder: it needs the policy's weights once they differ
        self.stale = resume_from is not None or state is not None
        self.ahead = None
        if config.async_rollouts:
            from farmkit.train.async_rollouts import AheadSampler

            self.ahead = AheadSampler(
                config.max_staleness,
                config.steps,
                self.sample_ahead,
                config.temperature,
                config.micro_batch_size,
                accelerator.autocast,
                # the engine is the sampling copy: handed the weights before it samples ahead
                push=None if self.backend.name == "hf" else self.push_weights,
            )
            self.ahead.restore(state, self.rank, accelerator.device)
        correcting = bool(config.importance_sampling_cap)
        if config.async_rollouts:
            # stale batches carry the sampling weights' log-probabilities: the correction acts
            # on them (with no staleness allowed there is none, and nothing to correct, unless an
            # engine samples: its mismatch is corrected as in the synchronous run)
            correcting = config.max_staleness > 0 or self.backend.name != "hf"
        elif correcting and self.backend.name == "hf":
            log.warning(
                "--importance-sampling-cap does nothing with the hf rollout backend: the policy "
                "samples itself, so there is no engine mismatch to correct (it acts with vllm)"
            )
            correcting = False
        # one epoch of one minibatch: the update's forward runs before any weight changes, so it
        # gives the old log-probabilities (the ratio's denominator, detached) and no pass of their
        # own is needed, as TRL's GRPOTrainer does. PPO's value model and truncated importance
        # sampling (whose weights are needed before the update) keep the pass
        self.fused = (
            self.updates_per_step == 1
            and value_model is None
            and not correcting
            and not method.advantages_use_old_logprobs()
        )
        self.started = self.step_began = time.time()

    # -- set-up ----------------------------------------------------------------------------------

    def _load_models(
        self, sft: str, reward_model: str, state: Any, engine: Any, resume_from: Any
    ) -> tuple[Any, Any]:
        """(policy, value model or None); the reference, tokenizer and scorer kept on self."""
        from farmkit.train import launch
        from farmkit.train import policy as P

        config, method = self.config, self.method
        offload = getattr(config, "offload_frozen", False)
        policy, self.reference, self.tokenizer, self.scorer = load_models(
            self.accelerator,
            config,
            sft,
            reward_model,
            self.device,
            reference=not config.lora,
            start_from=None if config.lora else resume_from,
            offload=offload,
        )
        value_model = None
        if method.value_model:
            with launch.no_zero3_init(self.accelerator):
                value_model = method.load_value_model(
                    reward_model, self.scorer, self.tokenizer, state, engine, self.device
                )
            value_model.config.pad_token_id = self.tokenizer.pad_token_id
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
        without_dropout(policy, self.reference, self.scorer.network, value_model)
        return policy, value_model

    def _prepare_training(self, policy: Any, value_model: Any, state: Any, engine: Any) -> None:
        """The optimizer and its schedule (a resumed run's put back), the trained module prepared
        by accelerate (one module, one optimizer: DeepSpeed prepares a single model)."""
        from farmkit.train import checkpoints as C
        from farmkit.train import launch
        from farmkit.train import policy as P

        config, accelerator = self.config, self.accelerator
        parameters = [
            p
            for model in (policy, value_model)
            if model is not None
            for p in model.parameters()
            if p.requires_grad
        ]
        optimizer = P.adamw(parameters, lr=config.learning_rate, eps=config.adam_eps)
        local_rollouts = config.rollout_batch_size // self.world
        self.updates_per_step = config.ppo_epochs * (local_rollouts // self.local_minibatch)
        self.scheduler = C.linear_scheduler(optimizer, config, self.updates_per_step)
        C.load_trainer_state(state, engine, optimizer, self.scheduler)
        # the scheduler stays unprepared: accelerate would step it once per process
        launch.configure_deepspeed(
            accelerator, config.micro_batch_size, self.accumulation, config.max_grad_norm
        )
        module = (
            P.PolicyAndValue(policy, value_model)
            if value_model is not None
            else P.PolicyOnly(policy)
        )
        self.model, self.optimizer = accelerator.prepare(module, optimizer)
        self.has_values = value_model is not None
        C.load_engine_state(self.model, engine)
        self.trained_dtype = match_reference(accelerator, self.model, self.reference)
        if self.reference is not None and getattr(config, "offload_frozen", False):
            launch.offload_frozen(self.reference, self.device)  # in the precision it compares in
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]

    def reduce_sum(self, tensor: Any) -> Any:
        return self.accelerator.reduce(tensor, reduction="sum") if self.world > 1 else tensor

    # under a mixed-precision launch the prepared module's forward runs under autocast: the
    # reference's forward and the sampling must too, or the KL is not 0 before the first update
    # and the rollout is not drawn from the function the update's ratio assumes
    def reference_logits(self, chunk: Any) -> Any:
        from farmkit.train import policy as P

        with self.accelerator.autocast():
            if self.reference is not None:
                logits = P.response_logits(self.reference, chunk, self.config.temperature)
            else:
                policy = self.accelerator.unwrap_model(self.model).policy
                with policy.disable_adapter():
                    logits = P.response_logits(policy, chunk, self.config.temperature)
        return P.replayed_logits(logits, chunk)

    def forward(self, chunk: Any) -> tuple[Any, Any]:
        """(logits, values or None) of the trained module on some rollout rows; the logits
        truncated as the rollout was sampled (policy.replayed_logits)."""
        from farmkit.train import policy as P

        forward = self.model(chunk, self.config.temperature)
        logits, values = forward if self.has_values else (forward, None)
        return P.replayed_logits(logits, chunk), values

    def record_kept(self, step: Step) -> None:
        """Where the rollout was sampled with top-k/top-p by an engine that does not say what it
        kept (vllm): each token's kept count from truncation_mask's rule on the policy's own logits,
        before any update (the engine holds the same weights), one micro-batch at a time."""
        import torch

        from farmkit.train import policy as P

        config, rollout = self.config, step.batch.rollout
        if rollout.kept is not None or not P.truncates(config.top_p, config.top_k):
            return
        kept, size = [], config.micro_batch_size
        with torch.no_grad():
            for start in range(0, len(step.rows), size):
                chunk = rollout.rows(slice(start, start + size))
                forward = self.model(chunk, config.temperature)
                logits = forward[0] if self.has_values else forward
                keep = P.truncation_mask(logits, config.top_p, config.top_k)
                kept.append(keep.sum(dim=-1) * chunk.response_mask.long())
        rollout.kept = torch.cat(kept)

    def engine_mismatch(self, step: Step) -> tuple[dict[str, Any], Any]:
        """The engine/trainer log-probability figures (the mismatch, the engine-vs-trainer KL, the
        share the correction truncated or masked) and the rollout correction's weights."""
        from farmkit.train.rollout_backends import engine_kl, logprob_mismatch, rollout_correction

        batch, old_logprobs, mask = step.batch, step.old_logprobs, step.mask
        if batch.engine_logprobs is None:
            return {}, None
        engine_logprobs = batch.engine_logprobs.to(old_logprobs.device)
        # one process: the vllm backend refuses several (see rollout_backends)
        figures = {
            f"rollout_logprob_diff_{name}": value
            for name, value in logprob_mismatch(engine_logprobs, old_logprobs, mask).items()
        }
        figures["rollout_kl"] = engine_kl(engine_logprobs, old_logprobs, mask)
        cap = self.config.importance_sampling_cap
        if not cap:
            return figures, None
        weights, shares = rollout_correction(
            old_logprobs, engine_logprobs, mask, self.config.rollout_correction, cap
        )
        return {**figures, **shares}, weights

    # -- the phases of a step ----------------------------------------------------------------------

    def step_prompts(self, number: int) -> list[int]:
        """This process's prompts of step `number` (a seeded order)."""
        per_step = self.method.prompts_per_step
        return self.order[number * per_step : (number + 1) * per_step][self.rank :: self.world]

    def rollout(self, number: int) -> Step:
        """This process's prompts of the step, sampled and scored (with DAPO's overlong penalty
        when asked); under --dynamic-sampling, groups without signal replaced; under
        --async-rollouts, the batch sampled ahead (farmkit.train.async_rollouts), scored now."""
        prompts = self.step_prompts(number)
        if self.ahead is not None:
            return self.rollout_ahead(number)
        batch = self.sample_rows(self.method.rows(prompts), number, "rollout")
        step = Step(number, batch.prompt_indices, batch)
        if getattr(self.config, "dynamic_sampling", False):
            self.dynamic_sampling(step, len(prompts))
        return step

    def rollout_ahead(self, number: int) -> Step:
        """Step `number`'s batch as the sampler has it (asking for the next ones from the
        weights now), scored, with its staleness."""
        from farmkit.train import launch
        from farmkit.train.rollouts import score_rollout

        with launch.for_generation(self.accelerator, self.model) as unwrapped:
            sampled = self.ahead.take(number, unwrapped.policy)
        rows, config = self.method.rows(self.step_prompts(number)), self.config
        batch = score_rollout(
            self.tokenizer,
            self.scorer,
            self.prompts,
            rows,
            sampled.rollout,
            sampled.behaviour_logprobs,
            unfinished=config.unfinished,
            unfinished_penalty=config.unfinished_penalty,
        )
        step = Step(number, batch.prompt_indices, self.penalize_overlong(batch))
        step.staleness = sampled.staleness
        return step

    def sample_ahead(self, policy: Any, number: int) -> tuple[Any, Any]:
        """Step `number`'s rollout sampled by `policy` (a copy of the weights; with vllm, the
        engine given the weights earlier) in the sampler's thread, as sample_rows samples it: the
        same rows, seed and settings; with the engine's log-probabilities (None with hf)."""
        config = self.config
        rows = self.method.rows(self.step_prompts(number))
        return self.backend.sample(
            policy,
            self.tokenizer,
            [self.prompt_ids[i] for i in rows],
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
            seed=derive_seed(self.seed, f"{self.method.name} rollout", number, self.rank),
            top_p=getattr(config, "top_p", 1.0),
            top_k=getattr(config, "top_k", 0),
        )

    def push_weights(self, policy: Any) -> None:
        """The policy's weights into the rollout engine where they moved since the last push
        (--async-rollouts with vllm: in the trainer's thread, no batch in flight)."""
        if self.stale:
            self.backend.sync(policy)
            self.stale = False

    def sample_rows(self, rows: list[int], number: int, label: str) -> Any:
        """One response to each row's prompt, scored."""
        from farmkit.train import launch

        method, config = self.method, self.config
        with (
            launch.for_generation(self.accelerator, self.model) as unwrapped,
            self.accelerator.autocast(),
        ):
            if self.stale:
                self.backend.sync(unwrapped.policy)
                self.stale = False
            batch = sample(
                config,
                unwrapped.policy,
                self.tokenizer,
                self.scorer,
                self.prompts,
                self.prompt_ids,
                rows,
                derive_seed(self.seed, f"{method.name} {label}", number, self.rank),
                self.backend,
            )
        return self.penalize_overlong(batch)

    def penalize_overlong(self, batch: Any) -> Any:
        """DAPO's overlong penalty added to the scores, under --overlong penalty."""
        from farmkit.train import rl_common

        config = self.config
        if config.overlong == "penalty":
            lengths = batch.rollout.response_mask.sum(dim=1)
            batch.scores = batch.scores + rl_common.overlong_penalty(
                lengths, config.max_new_tokens, config.overlong_cache
            )
        return batch

    def dynamic_sampling(self, step: Step, groups: int) -> None:
        """DAPO's dynamic sampling: the step's groups whose scores are all equal are dropped and
        more prompts drawn (seeded by step and draw; every process draws as long as any process
        misses groups, at most --max-extra-draws times) until `groups` are kept; dropped groups
        fill what is still missing. The counts go to the step's figures."""
        import random

        import torch

        from farmkit.train.rollouts import join

        k, config = self.method.group_size, self.config
        kept, dropped, discarded, draws, batch = [], [], 0.0, 0, step.batch
        while True:
            scores = batch.scores.reshape(-1, k)
            signal = (scores.max(dim=1).values > scores.min(dim=1).values).tolist()
            for group, informative in enumerate(signal):
                part = batch.rows(range(group * k, (group + 1) * k))
                (kept if informative else dropped).append(part)
            missing = torch.tensor(float(max(0, groups - len(kept))), device=step.mask.device)
            if float(self.reduce_sum(missing)) == 0 or draws == config.max_extra_draws:
                break
            draws += 1
            rng = random.Random(
                derive_seed(self.seed, "dynamic sampling", step.number, draws, self.rank)
            )
            prompts = [rng.randrange(len(self.prompts)) for _ in range(groups)]
            batch = self.sample_rows(self.method.rows(prompts), step.number, f"draw {draws}")
        chosen = (kept + dropped)[:groups]  # dropped groups only where the draws ran out
        for part in (kept + dropped)[groups:]:
            discarded += float(part.rollout.response_mask.sum())
        step.batch = join(chosen, self.tokenizer.pad_token_id)
        step.rows = step.batch.prompt_indices
        count = torch.tensor(float(len(dropped)), device=step.mask.device)
        step.figures = {
            "dropped_groups": float(self.reduce_sum(count)),
            "extra_draws": float(draws),
        }
        step.discarded_tokens = discarded

    def score(self, step: Step) -> None:
        """The sampled tokens' log-probabilities under the frozen reference and (unless the update's
        own forward gives them: fused) under the sampling policy, with entropies and values."""
        import torch

        from farmkit.train import policy as P

        self.record_kept(step)
        rollout, size = step.batch.rollout, self.config.micro_batch_size
        with torch.no_grad():
            old_logprobs, ref_logprobs, old_values, entropies = [], [], [], []
            for start in range(0, len(step.rows), size):
                chunk = rollout.rows(slice(start, start + size))
                ref_logprobs.append(
                    P.token_logprobs(self.reference_logits(chunk), chunk.response_ids)
                )
                if self.fused:
                    continue
                logits, values = self.forward(chunk)
                old_logprobs.append(P.token_logprobs(logits, chunk.response_ids))
                entropies.append(P.entropy(logits))
                if values is not None:
                    old_values.append(values)
            step.ref_logprobs = torch.cat(ref_logprobs)
            if self.fused:  # filled row by row by the update's forward, before any weight changes
                step.old_logprobs = torch.zeros_like(step.ref_logprobs)
                step.entropies = torch.zeros_like(step.mask, dtype=step.ref_logprobs.dtype)
            else:
                step.old_logprobs, step.entropies = torch.cat(old_logprobs), torch.cat(entropies)
                step.old_values = torch.cat(old_values) * step.mask if old_values else None

    def advantages(self, step: Step) -> None:
        """The method's advantages (and KL, returns) of the batch, and the engine's figures."""
        import torch

        with torch.no_grad():
            if self.fused:
                # the advantages do not read the old log-probabilities (advantages_use_old_logprobs);
                # the engine's figures are measured after the update
                step.prepared = self.method.prepare(
                    step.batch, step.ref_logprobs, step.ref_logprobs, None, self.reduce_sum
                )
            else:
                step.prepared = self.method.prepare(
                    step.batch,
                    step.old_logprobs,
                    step.ref_logprobs,
                    step.old_values,
                    self.reduce_sum,
                )
                step.engine_figures, step.weights = self.engine_mismatch(step)
            step.loss_mask = step.mask
            if self.config.overlong == "filter":
                # unfinished responses leave the loss, the token count that divides it and the KL
                # term (TRL's mask_truncated_completions)
                finished = step.batch.rollout.finished.to(step.mask.device, step.mask.dtype)
                step.loss_mask = step.mask * finished[:, None]

    def update(self, step: Step) -> None:
        """ppo_epochs passes over the batch in minibatches of micro-batches; the weights checked."""
        import torch

        from farmkit.train import checkpoints as C
        from farmkit.train import policy as P

        config, accelerator, method = self.config, self.accelerator, self.method
        mask = step.mask if step.loss_mask is None else step.loss_mask
        rollout = step.batch.rollout
        engine = step.batch.engine_logprobs
        engine = None if engine is None else engine.to(mask.device)
        for epoch in range(config.ppo_epochs):
            generator = torch.Generator().manual_seed(
                derive_seed(self.seed, f"{method.name} minibatches", step.number, epoch)
            )
            permutation = torch.randperm(len(step.rows), generator=generator)
            for start in range(0, len(step.rows), self.local_minibatch):
                rows = permutation[start : start + self.local_minibatch]
                responses, tokens = minibatch_counts(mask[rows], self.reduce_sum)
                for micro in range(0, len(rows), config.micro_batch_size):
                    index = rows[micro : micro + config.micro_batch_size].to(mask.device)
                    chunk = rollout.rows(index)
                    with accelerator.accumulate(self.model):
                        logits, values = self.forward(chunk)
                        logprobs = P.token_logprobs(logits, chunk.response_ids)
                        if self.fused:
                            with torch.no_grad():
                                step.old_logprobs[index] = logprobs.detach()
                                step.entropies[index] = P.entropy(logits.detach())
                        micro_batch = MicroBatch(
                            logprobs,
                            values,
                            index,
                            mask[index],
                            step.old_logprobs[index],
                            step.ref_logprobs[index],
                            responses,
                            tokens,
                            None if step.weights is None else step.weights[index],
                            None if engine is None else engine[index],
                            config.off_policy_mask_threshold,
                        )
                        loss, figures = method.loss(micro_batch, step.prepared)
                        # the loss is already divided by the whole minibatch (and multiplied by the
                        # processes, whose gradients are averaged: minibatch_counts): undo the
                        # launcher's division by the number of micro-batches
                        accelerator.backward(loss * self.accumulation)
                        if accelerator.sync_gradients:
                            accelerator.clip_grad_norm_(self.parameters, config.max_grad_norm)
                        self.optimizer.step()  # a no-op until the minibatch's last micro-batch
                        self.optimizer.zero_grad()
                    for name, value in figures.items():
                        step.totals[name] = (
                            step.totals.get(name, 0.0)
                            + float(value.detach()) / self.updates_per_step
                        )
                self.scheduler.step()
        C.check_finite(step.number + 1, model=self.model)  # before the next rollout samples from it
        self.stale = True  # the policy moved: the engine (if it has its own weights) needs them
        if self.fused:  # the KL figures from the log-probabilities the update's forward gave
            with torch.no_grad():
                step.prepared = method.prepare(
                    step.batch, step.old_logprobs, step.ref_logprobs, None, self.reduce_sum
                )
                step.engine_figures, _ = self.engine_mismatch(step)

    def throughput(self, summed: dict[str, float]) -> dict[str, float]:
        """The step's time, sampled tokens per second and MFU (metrics.StepWork counts the passes:
        generation, the reference's log-probabilities and, unless fused, the old policy's)."""
        prompt, response = summed["prompt_tokens"], summed["response_length"]
        work = StepWork(
            self.policy_parameters,
            generated=response,
            forward=prompt + (prompt + response) * (1 if self.fused else 2),
            trained=(prompt + response) * self.config.ppo_epochs,
        )
        now = time.time()
        seconds, self.step_began = now - self.step_began, now
        return step_throughput(work, seconds, self.peak, self.world)

    def log(self, step: Step) -> dict[str, Any]:
        """The step's metrics row (reduced over processes; the gold judge's figures at a
        checkpoint), written with its log line; returned."""
        import torch

        from farmkit.train import checkpoints as C
        from farmkit.train import launch, rl_common

        config, method, reduce_sum = self.config, self.method, self.reduce_sum
        batch, mask, rollout = step.batch, step.mask, step.batch.rollout
        local = {
            "reward": batch.rewards.sum(),
            "score": batch.scores.sum(),
            "kl": step.prepared.kl.sum(),
            "response_length": mask.sum(),
            "unfinished": (~rollout.finished).float().sum(),
            **step.prepared.sums,
            "prompt_tokens": rollout.prompt_mask.sum(),
            "discarded_tokens": torch.tensor(step.discarded_tokens, device=mask.device),
        }
        summed = {name: float(reduce_sum(value.detach().float())) for name, value in local.items()}
        count = float(reduce_sum(torch.tensor(float(len(step.rows)), device=mask.device)))
        budget = self.record.budget
        budget.add(
            sampled=summed["response_length"] + summed["discarded_tokens"],
            trained=(summed["prompt_tokens"] + summed["response_length"]) * config.ppo_epochs,
        )
        done = step.number + 1
        row = {
            **self.throughput(summed),
            "reward": summed["reward"] / count,
            "score": summed["score"] / count,
            "kl": summed["kl"] / count,
            "entropy": float(rl_common.masked_mean(step.entropies, mask, reduce_sum)),
            "response_length": summed["response_length"] / count,
            "unfinished_fraction": summed["unfinished"] / count,
            **method.step_figures(summed, count),
            **{
                name: float(reduce_sum(torch.tensor(value, device=mask.device))) / self.world
                for name, value in step.totals.items()
            },
            **step.engine_figures,
            **step.figures,
            **({} if step.staleness is None else {"staleness": step.staleness}),
            "learning_rate": self.scheduler.get_last_lr()[0],
            "elapsed_s": round(time.time() - self.started, 2),
            **self.labelled(budget),
        }
        if self.gold is not None and C.checkpoint_step(done, config):
            # the gold judge samples from torch's global generator, as the sampler's thread does
            sampling = self.ahead.lock if self.ahead is not None else contextlib.nullcontext()
            with launch.for_generation(self.accelerator, self.model) as unwrapped, sampling:
                row.update(self.gold.evaluate(unwrapped.policy, self.tokenizer, f"step-{done}"))
        C.check_finite(done, method.total_loss(row))
        step.row = metrics_row(method.name, done, method.total_loss(row), **row)
        message = f"step {done}/{config.steps}  " + method.message(step.row)
        self.record.log_step(step.row, message)
        return step.row

    def labelled(self, budget: Any) -> dict[str, Any]:
        """The budget's running totals (with --pool, the labels and their cost so far)."""
        if self.asks is not None:
            budget.labelled(self.asks.labels_used, **self.asks.totals)
        return budget.row()

    def stop(self, number: int, reason: str) -> None:
        """The budget pays for no more steps: the policy after step `number` is the output (none
        trained: an error, as nothing would be written)."""
        if number == self.start_step == 0:
            raise FarmError(f"{self.output}: no step was trained ({reason})")
        log.warning("%s; stopping before step %d", reason, number + 1)
        self.steps_done, self.stopped = number, reason

    def checkpoint(self, step: Step) -> None:
        """Every --save-steps steps: a policy folder that --resume continues from."""
        ahead = None
        if self.ahead is not None:  # the batches sampled ahead, saved beside the optimizer's
            ahead = lambda state: self.ahead.save(state, self.rank)  # noqa: E731
        self.record.checkpoint(
            step.number + 1,
            self.model,
            self.optimizer,
            self.scheduler,
            self.tokenizer,
            self.gold,
            ahead,
        )

    def save(self) -> None:
        """The trained policy as the output folder; the rollout engine closed."""
        if self.asks is not None:
            self.labelled(self.record.budget)
            self.record.budget.asked.update(max_cost=self.asks.judge.max_cost, stopped=self.stopped)
        self.record.save(self.model, self.tokenizer, self.output, self.gold, self.steps_done)
        self.backend.close()
