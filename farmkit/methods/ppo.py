"""PPO as AlpacaFarm ran it: maximize the reward model's score minus a fixed-coefficient, per-token
KL penalty to the SFT model.

Four networks: the policy and a frozen reference (both from the SFT model), the frozen reward model,
and a value model initialized from the reward model (its scalar head read at every token). The score
is added at the last response token, advantages come from GAE with gamma = lambda = 1 and are
whitened over the whole rollout batch with padding left out (on every process together under
accelerate). Clipped policy and value losses, gradient clipping, a learning rate that decays
linearly to 0. A step = one rollout batch, then `ppo_epochs` passes over it in minibatches.
Checkpoints every K steps are policy folders; the newest also holds what `--resume` needs.
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
from farmkit.methods.config import config_dict, help_field
from farmkit.models import TEMPLATES

log = logging.getLogger("farmkit")
UNFINISHED = ("truncate", "penalty")
METRICS_FILE = "metrics.jsonl"
TRAINER_STATE = "trainer"


@dataclass
class PPOConfig:
    steps: int = help_field(100, "PPO steps: each samples one rollout batch and trains `ppo-epochs` passes over it.")
    rollout_batch_size: int = help_field(64, "Prompts sampled per step, over all processes (AlpacaFarm: 512).")
    minibatch_size: int = help_field(16, "Rollouts per optimizer step, over all processes (AlpacaFarm: 256).")
    micro_batch_size: int = help_field(4, "Rollouts per forward/backward pass on one process; gradients accumulate up to a minibatch. Lower it to save memory.")
    ppo_epochs: int = help_field(2, "Passes over each rollout batch.")
    learning_rate: float = help_field(1e-5, "Peak learning rate of the policy and the value model (AdamW); decays linearly to 0 by the last step.")
    kl_coef: float = help_field(0.0067, "Fixed coefficient of the per-token KL penalty to the SFT model (AlpacaFarm: 0.002-0.0067 with simulated preferences, 0.02 with human ones).")
    temperature: float = help_field(0.7, "Sampling temperature of the rollouts (log-probabilities use the same temperature).")
    max_response_tokens: int = help_field(300, "Longest response sampled, in tokens.")
    unfinished: str = help_field("truncate", "A response that hits max-response-tokens without its end token: 'truncate' (AlpacaFarm's default) scores the truncated text as it is; 'penalty' replaces its score with unfinished-penalty.", UNFINISHED)
    unfinished_penalty: float = help_field(-1.0, "The score given to an unfinished response under --unfinished penalty.")
    gamma: float = help_field(1.0, "Discount of GAE (AlpacaFarm: 1).")
    lam: float = help_field(1.0, "Lambda of GAE (AlpacaFarm: 1).")
    clip_range: float = help_field(0.2, "PPO clipping of the probability ratio: 1 +/- this.")
    value_clip_range: float = help_field(0.2, "Clipping of the value prediction around its rollout value.")
    value_loss_coef: float = help_field(0.1, "Weight of the value loss in the total loss.")
    max_grad_norm: float = help_field(1.0, "Gradient clipping: largest total gradient norm.")
    checkpoint_every: int = help_field(20, "Write a policy checkpoint every K steps (0: none). Performance often peaks early, then over-optimization sets in.")
    checkpoint_dir: str | None = help_field(None, "Folder of checkpoints and metrics.jsonl. Default: OUTPUT-checkpoints beside the output.")
    resume: bool = help_field(False, "Continue from the newest checkpoint in the checkpoint folder.")
    reward_batch_size: int = help_field(16, "Texts per reward-model forward pass.")
    lora: bool = help_field(False, "Train LoRA adapters (policy and value model) instead of all weights; the saved policy has them merged.")
    lora_rank: int = help_field(16, "LoRA rank.")
    lora_alpha: int = help_field(32, "LoRA alpha.")
    template: str = help_field("auto", "Prompt template (auto: what the SFT model's meta.json says, else chat if its tokenizer has one).", TEMPLATES)

    def __post_init__(self) -> None:
        for name in ("steps", "rollout_batch_size", "minibatch_size", "micro_batch_size", "ppo_epochs", "max_response_tokens", "reward_batch_size", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.rollout_batch_size % self.minibatch_size:
            raise ValueError("rollout-batch-size must be a multiple of minibatch-size")
        if self.learning_rate <= 0 or self.temperature <= 0:
            raise ValueError("learning-rate and temperature must be positive")
        if self.kl_coef < 0 or self.clip_range <= 0 or self.value_clip_range <= 0 or self.max_grad_norm <= 0:
            raise ValueError("kl-coef must be >= 0; clip-range, value-clip-range and max-grad-norm > 0")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError("gamma and lam must lie in [0, 1]")
        if self.checkpoint_every < 0:
            raise ValueError("checkpoint-every must be >= 0")


def checkpoint_folder(output: str, config: PPOConfig) -> Path:
    return Path(config.checkpoint_dir) if config.checkpoint_dir else Path(f"{str(output).rstrip('/')}-checkpoints")


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest step-N folder that still holds a trainer state."""
    found = sorted(path for path in folder.glob("step-*") if (path / TRAINER_STATE / "state.json").is_file())
    return found[-1] if found else None


def train_ppo(sft: str, reward_model: str, prompts: list[dict[str, Any]], output: str, config: PPOConfig,
              seed: int = 0, inputs: list[str] | None = None) -> dict[str, Any]:
    """Train a policy with PPO and write it to `output`; returns the last step's metrics."""
    import torch
    from accelerate import Accelerator

    from farmkit.methods import policy as P
    from farmkit.methods.reward import RewardScorer
    from farmkit.methods.rl_common import (
        clipped_policy_loss,
        clipped_value_loss,
        generalized_advantages,
        kl_penalized_rewards,
        masked_mean,
        masked_whiten,
    )
    from farmkit.models import PromptFormat, load_causal_lm, load_reward_model

    accelerator = Accelerator()
    device = str(accelerator.device)
    world, rank = accelerator.num_processes, accelerator.process_index
    if not accelerator.is_main_process:
        log.setLevel(logging.ERROR)  # one process speaks for all
    if config.rollout_batch_size % world or config.minibatch_size % world:
        raise FarmError("rollout-batch-size and minibatch-size must be multiples of the number of processes")
    local_rollouts, local_minibatch = config.rollout_batch_size // world, max(1, config.minibatch_size // world)

    checkpoints = checkpoint_folder(output, config)
    resume_from = latest_checkpoint(checkpoints) if config.resume else None
    if config.resume and resume_from is None:
        raise FarmError(f"--resume: no checkpoint with a trainer state in {checkpoints}")
    torch.manual_seed(seed)

    policy, tokenizer = load_causal_lm(resume_from or sft, device=device, dtype="float32")
    reference = None
    if not config.lora:
        reference, _ = load_causal_lm(sft, device=device)
        reference.requires_grad_(False)
    scorer = RewardScorer(reward_model, device=device, batch_size=config.reward_batch_size)
    scorer.network.requires_grad_(False)
    value_source = resume_from / TRAINER_STATE / "value" if resume_from else reward_model
    value_model, _ = load_reward_model(value_source, device=device, dtype="float32")
    if scorer.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise FarmError("the value model starts from the reward model, so the reward model and the SFT model must share a tokenizer")
    value_model.config.pad_token_id = tokenizer.pad_token_id
    if config.lora:
        policy = P.add_lora(policy, config.lora_rank, config.lora_alpha)
        value_model = P.add_lora(value_model, config.lora_rank, config.lora_alpha, task_type="SEQ_CLS")
    for network in (policy, reference, scorer.network, value_model):
        if network is not None:
            P.disable_dropout(network)
            network.eval()  # no dropout: rollout and update see the same function

    fmt = PromptFormat.for_model(sft, config.template)
    policy_prompts = [fmt.prompt(tokenizer, r["instruction"], r.get("input")) for r in prompts]

    parameters = [p for model in (policy, value_model) for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate)
    updates_per_step = config.ppo_epochs * (local_rollouts // local_minibatch)
    total_updates = config.steps * updates_per_step
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: max(0.0, 1.0 - update / total_updates))
    start_step = 0
    if resume_from is not None:
        state = json.loads((resume_from / TRAINER_STATE / "state.json").read_text())
        start_step = state["step"]
        if not config.lora:  # fresh adapters on merged weights cannot reuse the old optimizer moments
            optimizer.load_state_dict(torch.load(resume_from / TRAINER_STATE / "optimizer.pt", weights_only=True))
        scheduler.load_state_dict(torch.load(resume_from / TRAINER_STATE / "scheduler.pt", weights_only=True))
        log.info("resuming from %s (step %d)", resume_from, start_step)
    # the scheduler stays unprepared: accelerate would step it once per process
    policy, value_model, optimizer = accelerator.prepare(policy, value_model, optimizer)

    def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        return accelerator.reduce(tensor, reduction="sum") if world > 1 else tensor

    def reference_logits(chunk: P.Rollout) -> torch.Tensor:
        if reference is not None:
            return P.response_logits(reference, chunk, config.temperature)
        with accelerator.unwrap_model(policy).disable_adapter():
            return P.response_logits(policy, chunk, config.temperature)

    meta_common = dict(tool="farm-ppo", base_model=sft, template=fmt.resolved(tokenizer), seed=seed,
                       config=config_dict(config), inputs=[*(inputs or [])])
    metrics_path = checkpoints / METRICS_FILE
    if accelerator.is_main_process:
        checkpoints.mkdir(parents=True, exist_ok=True)
        _truncate_metrics(metrics_path, start_step)
    order = _prompt_order(len(prompts), config.steps * local_rollouts * world, seed)
    started = time.time()
    last: dict[str, Any] = {}
    for step in range(start_step, config.steps):
        batch_indices = order[step * config.rollout_batch_size : (step + 1) * config.rollout_batch_size][rank::world]
        torch.manual_seed((seed * 1_000_003 + step * 1_009 + rank) % 2**63)
        rollout = P.sample_rollout(accelerator.unwrap_model(policy), tokenizer, [policy_prompts[i] for i in batch_indices],
                                   config.temperature, config.max_response_tokens)
        mask = rollout.response_mask
        with torch.no_grad():
            old_logprobs, ref_logprobs, old_values, entropies = [], [], [], []
            for start in range(0, len(batch_indices), config.micro_batch_size):
                chunk = rollout.rows(slice(start, start + config.micro_batch_size))
                logits = P.response_logits(policy, chunk, config.temperature)
                old_logprobs.append(P.token_logprobs(logits, chunk.response_ids))
                entropies.append(P.entropy(logits))
                ref_logprobs.append(P.token_logprobs(reference_logits(chunk), chunk.response_ids))
                old_values.append(P.response_values(value_model, chunk))
            old_logprobs, ref_logprobs = torch.cat(old_logprobs), torch.cat(ref_logprobs)
            old_values, entropies = torch.cat(old_values) * mask, torch.cat(entropies)
            texts = P.decode_responses(tokenizer, rollout)
            raw_scores = torch.tensor(scorer.score([(prompts[i]["instruction"], prompts[i].get("input"), text)
                                                    for i, text in zip(batch_indices, texts, strict=True)]), device=mask.device)
            scores = raw_scores.clone()
            if config.unfinished == "penalty":
                scores[~rollout.finished] = config.unfinished_penalty
            rewards, kl = kl_penalized_rewards(scores, old_logprobs, ref_logprobs, mask, config.kl_coef)
            advantages, returns = generalized_advantages(rewards, old_values, mask, config.gamma, config.lam)
            advantages = masked_whiten(advantages, mask, reduce=reduce_sum)

        totals: dict[str, float] = {}
        for epoch in range(config.ppo_epochs):
            generator = torch.Generator().manual_seed(seed * 7_919 + step * 31 + epoch)
            permutation = torch.randperm(len(batch_indices), generator=generator)
            for start in range(0, len(batch_indices), local_minibatch):
                rows = permutation[start : start + local_minibatch]
                tokens = mask[rows].sum().clamp(min=1)
                optimizer.zero_grad()
                for micro in range(0, len(rows), config.micro_batch_size):
                    index = rows[micro : micro + config.micro_batch_size].to(mask.device)
                    chunk = rollout.rows(index)
                    logprobs = P.token_logprobs(P.response_logits(policy, chunk, config.temperature), chunk.response_ids)
                    values = P.response_values(value_model, chunk)
                    policy_loss, policy_stats = clipped_policy_loss(logprobs, old_logprobs[index], advantages[index], chunk.response_mask, config.clip_range, tokens)
                    value_loss, value_stats = clipped_value_loss(values, old_values[index], returns[index], chunk.response_mask, config.value_clip_range, tokens)
                    accelerator.backward(policy_loss + config.value_loss_coef * value_loss)
                    for name, value in {"policy_loss": policy_loss, "value_loss": value_loss, **policy_stats, **value_stats}.items():
                        totals[name] = totals.get(name, 0.0) + float(value.detach()) / updates_per_step
                accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
                optimizer.step()
                scheduler.step()

        sequences = torch.ones_like(raw_scores)
        local = {
            "reward": raw_scores.sum(), "score": scores.sum(), "kl": kl.sum(),
            "response_length": mask.sum(), "unfinished": (~rollout.finished).float().sum(),
        }
        summed = {name: float(reduce_sum(value.detach().float())) for name, value in local.items()}
        count = float(reduce_sum(sequences.sum()))
        last = {
            "step": step + 1,
            "reward": summed["reward"] / count,
            "score": summed["score"] / count,
            "kl": summed["kl"] / count,
            "entropy": float(masked_mean(entropies, mask, reduce_sum)),
            "response_length": summed["response_length"] / count,
            "unfinished_fraction": summed["unfinished"] / count,
            **{name: float(reduce_sum(torch.tensor(value, device=mask.device))) / world for name, value in totals.items()},
            "learning_rate": scheduler.get_last_lr()[0],
            "elapsed_s": round(time.time() - started, 2),
        }
        if accelerator.is_main_process:
            with open(metrics_path, "a") as handle:
                handle.write(json.dumps(last) + "\n")
            log.info("step %d/%d  reward %.4f  kl %.4f  entropy %.3f  length %.1f  value loss %.4f  clip %.3f",
                     step + 1, config.steps, last["reward"], last["kl"], last["entropy"], last["response_length"],
                     last["value_loss"], last["clip_fraction"])
        done = step + 1
        if config.checkpoint_every and done % config.checkpoint_every == 0 and done < config.steps:
            _write_checkpoint(accelerator, policy, value_model, optimizer, scheduler, tokenizer,
                              checkpoints / f"step-{done:06d}", P.policy_meta(**meta_common, step=done), done)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        P.save_policy(accelerator.unwrap_model(policy), tokenizer, output,
                      P.policy_meta(**meta_common, step=config.steps), extra_files=[metrics_path])
    return last


def _prompt_order(n_prompts: int, needed: int, seed: int) -> list[int]:
    """Prompt indices for all steps: successive seeded shuffles of the prompts (epochs)."""
    import random

    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < needed:
        epoch = list(range(n_prompts))
        rng.shuffle(epoch)
        order.extend(epoch)
    return order


def _truncate_metrics(path: Path, step: int) -> None:
    """Forget metrics past the step a run restarts from (they belong to the run that crashed)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def _write_checkpoint(accelerator: Any, policy: Any, value_model: Any, optimizer: Any, scheduler: Any, tokenizer: Any,
                      folder: Path, meta: dict[str, Any], step: int) -> None:
    """A loadable policy folder; its trainer/ subfolder (value model, optimizer, scheduler, step) is
    what --resume reads, and is removed from the previous checkpoint to save disk."""
    import torch

    from farmkit.methods.policy import plain_model, save_policy

    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return

    def trainer_state(tmp: Path) -> None:
        state = tmp / TRAINER_STATE
        plain_model(accelerator.unwrap_model(value_model)).save_pretrained(state / "value")
        tokenizer.save_pretrained(state / "value")
        torch.save(optimizer.state_dict(), state / "optimizer.pt")
        torch.save(scheduler.state_dict(), state / "scheduler.pt")
        (state / "state.json").write_text(json.dumps({"step": step}) + "\n")

    previous = latest_checkpoint(folder.parent)
    save_policy(accelerator.unwrap_model(policy), tokenizer, folder, meta, extra_files=[folder.parent / METRICS_FILE], extra=trainer_state)
    if previous is not None and previous != folder:
        shutil.rmtree(previous / TRAINER_STATE, ignore_errors=True)
    log.info("checkpoint: %s", folder)
