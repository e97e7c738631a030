"""PPO as AlpacaFarm ran it: maximize the reward model's score minus a fixed-coefficient, per-token
KL penalty to the SFT model.

Four networks: the policy and a frozen reference (both from the SFT model, in one precision), the
frozen reward model, and a value model whose body is the reward model (its scalar head, or a zero
head, read at every token). The score is added at the last response token (the KL estimate is k1,
AlpacaFarm's clamped k1, or k3), rewards are optionally whitened, advantages come from GAE with
gamma = lambda = 1 and are whitened over the whole rollout batch with padding left out (on every
process together under accelerate). Clipped policy and value losses, gradient clipping, a learning
rate that warms up and decays linearly to 0. A step = one rollout batch (farmkit.methods.rollouts),
then `ppo_epochs` passes over it in minibatches. Checkpoints every K steps are policy folders; the
newest also holds what `--resume` needs (under LoRA, the adapters, which go back onto the SFT model).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.io import FarmError
from farmkit.methods.config import (
    KL_ESTIMATORS,
    GoldArgs,
    RolloutConfig,
    TrackingArgs,
    config_dict,
    help_field,
    require_positive,
    shared_field,
)
from farmkit.metrics import dumps as metrics_dumps
from farmkit.metrics import metrics_row
from farmkit.seeds import derive_seed

log = logging.getLogger("farmkit")
VALUE_HEADS = ("reward", "zero")
METRICS_FILE = "metrics.jsonl"
TRAINER_STATE = "trainer"
ENGINE_STATE = "engine"  # under DeepSpeed: the engine's own checkpoint, in the trainer state


@dataclass
class PPOConfig(RolloutConfig, TrackingArgs, GoldArgs):
    steps: int = help_field(
        100, "PPO steps: each samples one rollout batch and trains `ppo-epochs` passes over it."
    )
    rollout_batch_size: int = help_field(
        64, "Prompts sampled per step, over all processes (AlpacaFarm: 512)."
    )
    minibatch_size: int = help_field(
        16, "Rollouts per optimizer step, over all processes (AlpacaFarm: 256)."
    )
    micro_batch_size: int = help_field(
        4,
        "Rollouts per forward/backward pass on one process; gradients accumulate up to a minibatch. Lower it to save memory.",
    )
    ppo_epochs: int = help_field(2, "Passes over each rollout batch.")
    # of the policy and the value model; decays linearly to 0 by the last step
    learning_rate: float = shared_field("learning_rate", 1e-5)
    kl_coef: float = help_field(
        0.0067,
        "Fixed coefficient of the per-token KL penalty to the SFT model (AlpacaFarm: 0.002-0.0067 with simulated preferences, 0.02 with human ones, at temperature 1).",
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
    gamma: float = help_field(1.0, "Discount of GAE (AlpacaFarm: 1).")
    lam: float = help_field(1.0, "Lambda of GAE (AlpacaFarm: 1).")
    clip_range: float = help_field(0.2, "PPO clipping of the probability ratio: 1 +/- this.")
    value_clip_range: float = help_field(
        0.2, "Clipping of the value prediction around its rollout value."
    )
    value_loss_coef: float = help_field(0.1, "Weight of the value loss in the total loss.")
    offload_frozen: bool = help_field(
        False,
        "Keep the frozen reference and reward models in CPU memory and copy each layer's weights to the GPU only while it runs (accelerate's cpu_offload): they then take about one layer of GPU memory each, at the price of copying their weights in every forward pass (see README, Scaling out).",
    )
    checkpoint_every: int = help_field(
        20,
        "Write a policy checkpoint every K steps (0: none). Performance often peaks early, then over-optimization sets in.",
    )
    checkpoint_dir: str | None = help_field(
        None,
        "Folder of checkpoints and metrics.jsonl. Default: OUTPUT-checkpoints beside the output.",
    )
    resume: bool = help_field(
        False, "Continue from the newest checkpoint in the checkpoint folder."
    )
    # LoRA adapters on the policy and the value model; the KL reference is the policy without them
    lora: bool = shared_field("lora", False)
    lora_rank: int = shared_field("lora_rank", 16)
    lora_alpha: int = shared_field("lora_alpha", 32)

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
        if self.rollout_batch_size % self.minibatch_size:
            raise ValueError("rollout-batch-size must be a multiple of minibatch-size")
        if self.learning_rate <= 0:
            raise ValueError("learning-rate must be positive")
        if self.kl_coef < 0 or self.clip_range <= 0 or self.value_clip_range <= 0:
            raise ValueError("kl-coef must be >= 0; clip-range and value-clip-range > 0")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError("gamma and lam must lie in [0, 1]")
        if self.checkpoint_every < 0:
            raise ValueError("checkpoint-every must be >= 0")


def checkpoint_folder(output: str, config: Any) -> Path:
    return (
        Path(config.checkpoint_dir)
        if config.checkpoint_dir
        else Path(f"{str(output).rstrip('/')}-checkpoints")
    )


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest step-N folder that still holds a trainer state."""
    found = sorted(
        path for path in folder.glob("step-*") if (path / TRAINER_STATE / "state.json").is_file()
    )
    return found[-1] if found else None


def resume_point(output: str, config: Any) -> tuple[Path, Path | None, int, Path | None]:
    """(checkpoint folder, checkpoint resumed from or None, its step or 0, its trainer state or None)
    for a config with steps, checkpoint_dir, resume and lora (farm-ppo, farm-rloo, farm-grpo).

    LoRA trains adapters on the SFT weights, which stay the KL reference (adapters off), also on
    resume: the adapters are restored onto SFT, never added afresh to a merged checkpoint, so a run
    resumes the way it was started (with or without --lora)."""
    checkpoints = checkpoint_folder(output, config)
    resume_from = latest_checkpoint(checkpoints) if config.resume else None
    if config.resume and resume_from is None:
        raise FarmError(f"--resume: no checkpoint with a trainer state in {checkpoints}")
    start_step = (
        json.loads((resume_from / TRAINER_STATE / "state.json").read_text())["step"]
        if resume_from
        else 0
    )
    if start_step > config.steps:
        raise FarmError(
            f"--resume: {resume_from} is at step {start_step}, past --steps {config.steps}"
        )
    state = resume_from / TRAINER_STATE if resume_from else None
    if state is not None:
        written = json.loads((state / "state.json").read_text())
        # under DeepSpeed the engine's own checkpoint holds the adapters too
        lora = written.get("lora", (state / "policy-adapter").is_dir())
        if config.lora != lora:
            raise FarmError(
                f"--resume: {resume_from} was written by a run {'without' if config.lora else 'with'} --lora; resume it the same way"
            )
    return checkpoints, resume_from, start_step, state


def engine_state(state: Path | None, stage: int) -> Path | None:
    """The DeepSpeed engine's checkpoint in a trainer state (None without one), refusing a state of
    the other kind: a DeepSpeed run resumes only what a DeepSpeed run wrote, and the other way round
    (the engine splits the optimizer state its own way)."""
    if state is None:
        return None
    engine = state / ENGINE_STATE
    if bool(stage) != engine.is_dir():
        written_by, resumed_by = (
            ("a DeepSpeed launch", "without DeepSpeed")
            if engine.is_dir()
            else ("a run without DeepSpeed", "under DeepSpeed")
        )
        raise FarmError(
            f"--resume: {state.parent} was written by {written_by}; it cannot be resumed {resumed_by}"
        )
    return engine if stage else None


def load_trainer_state(
    state: Path | None, engine: Path | None, optimizer: Any, scheduler: Any
) -> None:
    """Put a checkpoint's optimizer and scheduler state back (without DeepSpeed; under DeepSpeed the
    engine restores its optimizer itself, load_engine_state, and the scheduler is farmkit's)."""
    import torch

    if state is None:
        return
    if engine is None:
        optimizer.load_state_dict(torch.load(state / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(state / "scheduler.pt", weights_only=True))


def load_engine_state(engine_model: Any, engine: Path | None) -> None:
    """Under DeepSpeed: the trained modules' weights and the engine's (split) optimizer state, as the
    checkpoint's engine saved them; every process loads its own part."""
    if engine is None:
        return
    loaded, _ = engine_model.load_checkpoint(
        str(engine), tag=ENGINE_STATE, load_module_strict=True, load_lr_scheduler_states=False
    )
    if loaded is None:
        raise FarmError(f"--resume: DeepSpeed could not load its checkpoint from {engine}")


def train_ppo(
    sft: str,
    reward_model: str,
    prompts: list[dict[str, Any]],
    output: str,
    config: PPOConfig,
    seed: int = 0,
    inputs: list[str] | None = None,
) -> dict[str, Any]:
    """Train a policy with PPO and write it to `output`; returns the last step's metrics."""
    import torch

    from farmkit.methods import launch, rl_common, tracking
    from farmkit.methods import policy as P
    from farmkit.methods.gold import check_processes
    from farmkit.methods.reward import RewardScorer
    from farmkit.methods.rollouts import load_policy_and_reference, prompt_order, sample_and_score
    from farmkit.models import PromptFormat

    accelerator = launch.make_accelerator(**tracking.accelerator_kwargs(config.report_to, output))
    if config.gold:
        check_processes()
    tracking.start(accelerator, "farm-ppo", config_dict(config))
    device = str(accelerator.device)
    world, rank = accelerator.num_processes, accelerator.process_index
    if not accelerator.is_main_process:
        log.setLevel(logging.ERROR)  # one process speaks for all
    if config.rollout_batch_size % world or config.minibatch_size % world:
        raise FarmError(
            "rollout-batch-size and minibatch-size must be multiples of the number of processes"
        )
    local_rollouts, local_minibatch = (
        config.rollout_batch_size // world,
        max(1, config.minibatch_size // world),
    )
    # a minibatch is this many micro-batches; gradients accumulate over them (accelerate, or DeepSpeed's engine)
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
            sft,
            device,
            reference=not config.lora,
            start_from=None if config.lora else resume_from,
            reference_device="cpu" if config.offload_frozen else None,
        )
        scorer = RewardScorer(
            reward_model,
            device=device,
            batch_size=config.reward_batch_size,
            offload=config.offload_frozen,
        )
        if scorer.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise FarmError(
                "the value model starts from the reward model, so the reward model and the SFT model must share a tokenizer"
            )
        if state is not None and engine is None and not config.lora:
            value_model = load_value_model(state / "value", device, "reward")
        else:
            value_model = load_value_model(reward_model, device, config.value_head)
    scorer.network.requires_grad_(False)
    value_model.config.pad_token_id = tokenizer.pad_token_id
    if config.lora:
        policy = P.add_lora(
            policy,
            config.lora_rank,
            config.lora_alpha,
            adapter=state / "policy-adapter" if state and engine is None else None,
        )
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
        config, policy, tokenizer, fmt, prompts, sft, seed, device, reference, "farm-ppo"
    )

    parameters = [
        p for model in (policy, value_model) for p in model.parameters() if p.requires_grad
    ]
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, eps=config.adam_eps)
    updates_per_step = config.ppo_epochs * (local_rollouts // local_minibatch)
    scheduler = linear_scheduler(optimizer, config, updates_per_step)
    load_trainer_state(state, engine, optimizer, scheduler)
    # one module, one optimizer: DeepSpeed prepares a single model. The scheduler stays unprepared:
    # accelerate would step it once per process
    launch.configure_deepspeed(
        accelerator, config.micro_batch_size, accumulation, config.max_grad_norm
    )
    model, optimizer = accelerator.prepare(P.PolicyAndValue(policy, value_model), optimizer)
    load_engine_state(model, engine)
    if state is not None:
        log.info("resuming from %s (step %d)", resume_from, start_step)
    trained_dtype = next(accelerator.unwrap_model(model).parameters()).dtype
    if reference is not None and reference.dtype != trained_dtype:
        reference.to(
            trained_dtype
        )  # DeepSpeed's mixed precision casts the policy: the KL compares like with like
    if reference is not None and config.offload_frozen:
        launch.offload_frozen(reference, device)  # in the precision it compares in
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
            tool="farm-ppo",
            base_model=sft,
            template=fmt.resolved(tokenizer),
            seed=seed,
            inputs=list(inputs or []),
        ),
    )
    last, budget = record.last, record.budget
    order = prompt_order(len(prompts), config.steps * local_rollouts * world, seed)
    started = time.time()
    for step in range(start_step, config.steps):
        batch_indices = order[
            step * config.rollout_batch_size : (step + 1) * config.rollout_batch_size
        ][rank::world]
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
                seed=derive_seed(seed, "ppo rollout", step, rank),
            )
        rollout, mask = batch.rollout, batch.rollout.response_mask
        with torch.no_grad():
            old_logprobs, ref_logprobs, old_values, entropies = [], [], [], []
            for start in range(0, len(batch_indices), config.micro_batch_size):
                chunk = rollout.rows(slice(start, start + config.micro_batch_size))
                logits, values = model(chunk, config.temperature)
                old_logprobs.append(P.token_logprobs(logits, chunk.response_ids))
                entropies.append(P.entropy(logits))
                ref_logprobs.append(P.token_logprobs(reference_logits(chunk), chunk.response_ids))
                old_values.append(values)
            old_logprobs, ref_logprobs = torch.cat(old_logprobs), torch.cat(ref_logprobs)
            old_values, entropies = torch.cat(old_values) * mask, torch.cat(entropies)
            rewards, kl = rl_common.kl_penalized_rewards(
                batch.scores, old_logprobs, ref_logprobs, mask, config.kl_coef, config.kl_estimator
            )
            if config.whiten_rewards:
                rewards = rl_common.masked_whiten(
                    rewards, mask, shift_mean=False, reduce=reduce_sum
                )
            advantages, returns = rl_common.generalized_advantages(
                rewards, old_values, mask, config.gamma, config.lam
            )
            advantages = rl_common.masked_whiten(advantages, mask, reduce=reduce_sum)

        totals: dict[str, float] = {}
        for epoch in range(config.ppo_epochs):
            generator = torch.Generator().manual_seed(
                derive_seed(seed, "ppo minibatches", step, epoch)
            )
            permutation = torch.randperm(len(batch_indices), generator=generator)
            for start in range(0, len(batch_indices), local_minibatch):
                rows = permutation[start : start + local_minibatch]
                tokens = mask[rows].sum().clamp(min=1)
                for micro in range(0, len(rows), config.micro_batch_size):
                    index = rows[micro : micro + config.micro_batch_size].to(mask.device)
                    chunk = rollout.rows(index)
                    with accelerator.accumulate(model):
                        logits, values = model(chunk, config.temperature)
                        logprobs = P.token_logprobs(logits, chunk.response_ids)
                        policy_loss, policy_stats = rl_common.clipped_policy_loss(
                            logprobs,
                            old_logprobs[index],
                            advantages[index],
                            chunk.response_mask,
                            config.clip_range,
                            tokens,
                        )
                        value_loss, value_stats = rl_common.clipped_value_loss(
                            values,
                            old_values[index],
                            returns[index],
                            chunk.response_mask,
                            config.value_clip_range,
                            tokens,
                        )
                        # the losses are already divided by the whole minibatch's tokens: undo the
                        # launcher's division by the number of micro-batches
                        accelerator.backward(
                            (policy_loss + config.value_loss_coef * value_loss) * accumulation
                        )
                        if accelerator.sync_gradients:
                            accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
                        optimizer.step()  # a no-op until the minibatch's last micro-batch
                        optimizer.zero_grad()
                    for name, value in {
                        "policy_loss": policy_loss,
                        "value_loss": value_loss,
                        **policy_stats,
                        **value_stats,
                    }.items():
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
        last = metrics_row(
            "ppo",
            last.pop("step"),
            last["policy_loss"] + config.value_loss_coef * last["value_loss"]
            if "policy_loss" in last
            else None,
            **last,
        )
        message = (
            f"step {done}/{config.steps}  reward {last['reward']:.4f}  kl {last['kl']:.4f}  "
            f"entropy {last['entropy']:.3f}  length {last['response_length']:.1f}  "
            f"value loss {last['value_loss']:.4f}  clip {last['clip_fraction']:.3f}"
        )
        record.end_step(last, message, model, optimizer, scheduler, tokenizer, gold)
    record.save(model, tokenizer, output, gold)
    return last


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
    once), and the run's gold judge (None without --gold), for farm-ppo, farm-rloo and farm-grpo."""
    from farmkit.methods import policy as P
    from farmkit.methods.gold import make_gold

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


class RunRecord:
    """What a policy-gradient run (farm-ppo, farm-rloo, farm-grpo) writes beside its training: the
    checkpoint folder's metrics.jsonl (a line a step, past a resumed step forgotten), a checkpoint
    every --checkpoint-every steps, and the output folder at the end. Every process calls it; the
    main one writes."""

    def __init__(
        self,
        accelerator: Any,
        config: Any,
        checkpoints: Path,
        start_step: int,
        reward_model: str,
        meta_common: dict[str, Any],
    ) -> None:
        """meta_common: what every policy folder's meta.json of the run holds (policy_meta's tool,
        base_model, template, seed and inputs); the config and the launch are added here."""
        from farmkit.methods import launch
        from farmkit.methods.budget import Budget, reward_model_labels

        self.accelerator, self.config, self.checkpoints = accelerator, config, checkpoints
        self.meta_common = {
            **meta_common,
            "config": config_dict(config),
            "launch": launch.launch_record(accelerator),
        }
        self.metrics_path = checkpoints / METRICS_FILE
        # the metrics row of the step resumed from: its budget totals go on
        self.last: dict[str, Any] = (
            _last_metrics(self.metrics_path, start_step) if start_step else {}
        )
        self.budget = Budget(reward_model_labels(reward_model), self.last)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            checkpoints.mkdir(parents=True, exist_ok=True)
            _truncate_metrics(self.metrics_path, start_step)

    def meta(self, step: int, gold: Any) -> dict[str, Any]:
        from farmkit.methods.policy import policy_meta

        return policy_meta(**self.meta_common, step=step, **run_blocks(self.budget, gold))

    def end_step(
        self,
        row: dict[str, Any],
        message: str,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        tokenizer: Any,
        gold: Any,
    ) -> None:
        """Step `row["step"]` is done: its metrics line, its log line, the trackers, a checkpoint."""
        from farmkit.methods import tracking

        done = row["step"]
        if self.accelerator.is_main_process:
            with open(self.metrics_path, "a") as handle:
                handle.write(metrics_dumps(row))
            log.info(message)
        tracking.log(self.accelerator, row, done)
        if checkpoint_step(done, self.config) and done < self.config.steps:
            _write_checkpoint(
                self.accelerator,
                model,
                optimizer,
                scheduler,
                tokenizer,
                self.checkpoints / f"step-{done:06d}",
                self.meta(done, gold),
                done,
            )

    def save(self, model: Any, tokenizer: Any, output: str, gold: Any) -> None:
        """The trained policy as the output folder (gathered whole under ZeRO-3), with the metrics."""
        from farmkit.methods import launch, tracking
        from farmkit.methods.policy import save_policy

        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        with launch.full_weights(accelerator, model) as whole:
            if accelerator.is_main_process:
                save_policy(
                    whole.policy,
                    tokenizer,
                    output,
                    self.meta(self.config.steps, gold),
                    extra_files=[self.metrics_path],
                )
        tracking.finish(accelerator)
        accelerator.wait_for_everyone()


def linear_scheduler(optimizer: Any, config: Any, updates_per_step: int) -> Any:
    """Warm up for --warmup-steps, then decay linearly to 0 at the last step; stepped per update."""
    import torch

    from farmkit.methods import rl_common

    schedule = rl_common.linear_schedule(
        config.warmup_steps * updates_per_step, config.steps * updates_per_step
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def checkpoint_step(done: int, config: Any) -> bool:
    """Whether step `done` ends with a checkpoint (every checkpoint-every steps) or the run."""
    every = config.checkpoint_every
    return done == config.steps or bool(every and done % every == 0)


def run_blocks(budget: Any, gold: Any) -> dict[str, Any]:
    """meta.json's `budget` (and `gold`, with a gold judge) of a run so far."""
    return {"budget": budget.block(), "gold": gold.block() if gold is not None else None}


def load_value_model(source: str | Path, device: str, head: str) -> Any:
    """The value model: the reward model's network (body and, with head 'reward', its scoring head;
    with 'zero', that head's weights set to 0, so every value starts at 0 as in AlpacaFarm)."""
    import torch

    from farmkit.methods.policy import score_head
    from farmkit.methods.rollouts import TRAINING_DTYPE
    from farmkit.models import load_reward_model

    value_model, _ = load_reward_model(source, device=device, dtype=TRAINING_DTYPE)
    if head == "zero":
        with torch.no_grad():
            for parameter in score_head(value_model).parameters():
                parameter.zero_()
    return value_model


def _last_metrics(path: Path, step: int) -> dict[str, Any]:
    """The metrics of `step` as the interrupted run wrote them (a resumed run that has nothing left)."""
    entries = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )
    return next((entry for entry in reversed(entries) if entry["step"] == step), {})


def _truncate_metrics(path: Path, step: int) -> None:
    """Forget metrics past the step a run restarts from (they belong to the run that crashed)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= step
    ]
    path.write_text("".join(line + "\n" for line in kept))


def _write_checkpoint(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    tokenizer: Any,
    folder: Path,
    meta: dict[str, Any],
    step: int,
) -> None:
    """A loadable policy folder; its trainer/ subfolder is what --resume reads, and is removed from
    the previous checkpoint to save disk. Without DeepSpeed it holds the value model (or the
    adapters), the optimizer and the scheduler, written with the folder. Under DeepSpeed it holds the
    engine's own checkpoint (trainer/engine/: the trained modules and the optimizer state split the
    engine's way, each process writing its part) beside the scheduler. Its state.json, written
    last, marks it whole."""
    import torch

    from farmkit.methods.launch import full_weights, zero_stage

    deepspeed = bool(zero_stage(accelerator))
    accelerator.wait_for_everyone()
    previous = latest_checkpoint(folder.parent)
    state = folder / TRAINER_STATE
    with full_weights(accelerator, model) as whole:
        lora = hasattr(whole.policy, "peft_config")
        if accelerator.is_main_process:
            _save_checkpoint(whole, None if deepspeed else optimizer, tokenizer, folder, meta)
    if deepspeed:
        accelerator.wait_for_everyone()
        model.save_checkpoint(str(state / ENGINE_STATE), tag=ENGINE_STATE)  # collective
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(scheduler.state_dict(), state / "scheduler.pt")
        (state / "state.json").write_text(json.dumps({"step": step, "lora": lora}) + "\n")
        if previous is not None and previous != folder:
            shutil.rmtree(previous / TRAINER_STATE, ignore_errors=True)
        log.info("checkpoint: %s", folder)
    accelerator.wait_for_everyone()


def _save_checkpoint(
    whole: Any, optimizer: Any, tokenizer: Any, folder: Path, meta: dict[str, Any]
) -> None:
    """The policy folder with an empty trainer/ subfolder, or without DeepSpeed (an `optimizer`) one
    that holds the value model (or the adapters) and the optimizer state."""
    import torch

    from farmkit.methods.policy import save_policy

    def trainer_state(tmp: Path) -> None:
        state = tmp / TRAINER_STATE
        state.mkdir(parents=True, exist_ok=True)
        if optimizer is None:  # DeepSpeed: the engine writes its own state in here
            return
        for name, unwrapped in (("policy", whole.policy), ("value", whole.value)):
            if unwrapped is None:  # a method without a value model (farm-rloo, farm-grpo)
                continue
            if hasattr(
                unwrapped, "peft_config"
            ):  # the adapters alone: resume puts them back on SFT / RM
                unwrapped.save_pretrained(state / f"{name}-adapter")
            elif name == "value":
                unwrapped.save_pretrained(state / "value")
                tokenizer.save_pretrained(state / "value")
        torch.save(optimizer.state_dict(), state / "optimizer.pt")

    save_policy(
        whole.policy,
        tokenizer,
        folder,
        meta,
        extra_files=[folder.parent / METRICS_FILE],
        extra=trainer_state,
    )
