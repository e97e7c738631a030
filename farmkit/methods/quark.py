"""Quark, in the top-quantile form AlpacaFarm found best.

Each round: sample responses to a fresh set of prompts (round 0 from the SFT model as it is, later
rounds from the policy conditioned on the best-quantile control token), score them with the reward
model, rank them into quantiles, and train on them: the log-likelihood of each kept response given
its prompt and its quantile's control token, minus kl_coef * KL(policy || SFT) per token, both of the
policy at the rollout temperature (as AlpacaFarm). The pool is emptied after every round (AlpacaFarm's
choice over Quark's growing pool). With keep=top only the best quantile is trained on (AlpacaFarm's
variant); keep=all trains on every quantile with its own token, as the original Quark does. The saved
policy samples with the best-quantile token, which meta.json records as `sampling_control_token`
(farm-sample adds it through PromptFormat). Under `accelerate launch` each process samples its share
of a round; every process ranks the whole round and trains on its share of each batch.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed
from farmkit.core.values import AT_LEAST_ONE, NON_NEGATIVE, Bounds
from farmkit.train.checkpoints import resume_field, save_steps_field
from farmkit.train.config import (
    GoldArgs,
    Preset,
    RolloutConfig,
    TrackingArgs,
    config_dict,
    help_field,
    preset_field,
    shared_field,
)
from farmkit.train.metrics import metrics_row, write_metrics
from farmkit.train.precision import PRECISIONS

log = logging.getLogger("farmkit")
KEEP = ("top", "all")
CONTROL = ("condition", "none")
LR_SCHEDULES = ("linear", "constant")

# AlpacaFarm's Quark run: the values of examples/scripts/rlhf_quark.sh (tatsu-lab/alpaca_farm at
# 12a7a93) and, for what the script does not set, of the code it runs (rl/quark_utils.py's
# TrainingArguments, rl/quark_trainer.py). README, farm-quark, cites each line.
QUARK_PRESETS = {
    "alpacafarm": Preset(
        "AlpacaFarm's examples/scripts/rlhf_quark.sh and the defaults of the code it runs "
        "(docs/tools/farm-quark.md, its table)",
        {
            "prompts_per_round": 512,  # rollout_batch_size, one sample each
            "samples_per_prompt": 1,
            "batch_size": 256,  # step_batch_size
            "steps_per_round": 1,  # num_gradient_steps_per_step
            "learning_rate": 3e-6,
            "warmup_steps": 5,
            "lr_schedule": "linear",
            "kl_coef": 0.05,
            # total_epochs 10 over the 20,000 prompts of the unlabeled split, 512 a round
            "rounds": 390,
            "num_quantiles": 4,  # num_reward_tokens
            "keep": "top",  # train_on_best_quantile
            "control_token": "none",  # its top-quantile training injects no token
            "adam_eps": 1e-5,
            "max_grad_norm": 1.0,
            "temperature": 1.0,
            "max_new_tokens": 300,  # response_len
            "unfinished": "truncate",
        },
    )
}


def quantile_token(quantile: int) -> str:
    """Control token of a reward quantile; quantile 0 is the best."""
    return f"<|reward_quantile_{quantile}|>"


@dataclass
class QuarkConfig(RolloutConfig, TrackingArgs, GoldArgs):
    preset: str | None = preset_field(QUARK_PRESETS)
    rounds: int = help_field(
        4,
        "Rounds of sample, score, rank, train; the rollout pool is reset every round.",
        bounds=AT_LEAST_ONE,
    )
    prompts_per_round: int = help_field(
        64,
        "Prompts sampled per round, over all processes (AlpacaFarm: 512, one sample each).",
        bounds=AT_LEAST_ONE,
    )
    samples_per_prompt: int = shared_field("num_samples", 4, more_help="Sampled every round.")
    num_quantiles: int = help_field(
        5,
        "Reward quantiles the responses of a round are ranked into (the Quark paper's 5; AlpacaFarm: 4, its num_reward_tokens default).",
        bounds=Bounds(min=2),
    )
    keep: str = help_field(
        "top",
        "Train on the top quantile only (AlpacaFarm's variant) or on all quantiles, each with its own control token (original Quark).",
        KEEP,
    )
    control_token: str = help_field(
        "condition",
        "'condition': train each kept response behind its quantile's control token and sample later rounds (and the saved policy) behind the best one (Quark); 'none': no control tokens at all, the top quantile is trained on the plain prompt (what AlpacaFarm's top-quantile code trains on; needs --keep top).",
        CONTROL,
    )
    epochs_per_round: int = help_field(
        2,
        "Passes over a round's kept responses (when steps-per-round is 0).",
        bounds=AT_LEAST_ONE,
    )
    steps_per_round: int = help_field(
        0,
        "Optimizer steps per round, each on batch-size kept responses drawn in a shuffled cycle (AlpacaFarm: 1 step of 256); 0: epochs-per-round passes instead.",
        bounds=NON_NEGATIVE,
    )
    learning_rate: float = shared_field("learning_rate", 1e-5)
    lr_schedule: str = shared_field(
        "lr_scheduler_type",
        "linear",
        LR_SCHEDULES,
        more_help="Over the rounds: 'linear' decays it to 0 by the end, after warmup-steps rounds of warm-up (AlpacaFarm); 'constant' keeps it.",
    )
    batch_size: int = help_field(
        8, "Responses per optimizer step, over all processes.", bounds=AT_LEAST_ONE
    )
    kl_coef: float = help_field(
        0.05,
        "Weight of the per-token KL(policy || SFT) penalty (AlpacaFarm's script: 0.05).",
        bounds=NON_NEGATIVE,
    )
    generation_batch_size: int = shared_field("generation_batch_size", 16)
    device: str = shared_field("device", "auto")
    precision: str = shared_field("precision", "auto", PRECISIONS)
    # LoRA adapters on the policy (and the control tokens' embedding rows); the KL reference stays
    # the SFT model, a frozen copy
    lora: bool = shared_field("lora", False)
    lora_rank: int = shared_field("lora_rank", 16)
    lora_alpha: int = shared_field("lora_alpha", 32)
    save_steps: int = save_steps_field("Steps are rounds here")
    resume: bool = resume_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompts_per_round * self.samples_per_prompt < self.num_quantiles:
            raise ValueError(
                "a round needs at least one response per quantile: raise prompts-per-round or num-samples"
            )
        if self.control_token == "none" and self.keep == "all":
            raise ValueError(
                "--keep all trains each quantile behind its own control token: it needs --control-token condition"
            )


def assign_quantiles(scores: list[float], num_quantiles: int) -> list[int]:
    """Quantile of each score within its round (0 = best), equal-sized up to rounding; ties keep
    their sampling order so that the split is deterministic."""
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    quantiles = [0] * len(scores)
    for rank, index in enumerate(order):
        quantiles[index] = rank * num_quantiles // len(scores)
    return quantiles


def training_batches(
    kept: list, batch_size: int, epochs: int, steps: int, rng: random.Random
) -> list[list]:
    """The round's batches: `epochs` shuffled passes, or with `steps` > 0 exactly that many batches
    drawn from a shuffled cycle over the kept responses."""
    batches: list[list] = []
    pool: list = []
    if steps == 0:
        for _ in range(epochs):
            pool = rng.sample(kept, len(kept))
            batches.extend(
                pool[start : start + batch_size] for start in range(0, len(pool), batch_size)
            )
        return batches
    while len(batches) < steps:
        batch: list = []
        while len(batch) < batch_size:
            if not pool:
                pool = rng.sample(kept, len(kept))
            batch.append(pool.pop())
        batches.append(batch)
    return batches


def rollout_backend_kind(config: QuarkConfig) -> str:
    """hf or vllm for a Quark run, decided before any model is loaded. The control tokens of
    --control-token condition grow the policy's vocabulary after the SFT folder is read, and a vLLM
    engine built from that folder cannot take the grown policy's weights (rollout_backends refuses
    the push): --rollout-backend vllm is refused with them, and auto samples with hf."""
    from farmkit.train.rollout_backends import resolve_backend

    kind = resolve_backend(config.rollout_backend, config.device)
    if kind != "vllm" or config.control_token != "condition":
        return kind
    if config.rollout_backend == "vllm":
        raise FarmError(
            "--rollout-backend vllm cannot sample Quark's control tokens: --control-token condition "
            "adds them to the policy's vocabulary, which the vLLM engine (built from the SFT folder) "
            "does not have. Use --control-token none (AlpacaFarm's top-quantile training on the "
            "plain prompt) or --rollout-backend hf"
        )
    log.info("rollouts: hf backend (the control tokens grow the vocabulary a vLLM engine serves)")
    return "hf"


def train_quark(
    sft: str,
    reward_model: str,
    prompts: list[dict[str, Any]],
    output: str,
    config: QuarkConfig,
    seed: int = 0,
    inputs: list[str] | None = None,
    gold_pools: Any = None,
) -> list[dict[str, Any]]:
    """Train with Quark and write the policy folder to `output`; returns the per-round metrics.
    `gold_pools`: the loader of annotator pools a --gold name is looked up in
    (farmkit.annotate.run.gold_pool)."""
    trainer = QuarkTrainer(sft, reward_model, prompts, output, config, seed, inputs, gold_pools)
    for number in range(len(trainer.history), config.rounds):  # a resumed run: the rounds left
        pool = trainer.rollout(number)
        kept, quantile_scores = trainer.rank(pool)
        losses, kls, learning_rate = trainer.update(number, kept)
        trainer.log(number, pool, kept, quantile_scores, losses, kls, learning_rate)
        trainer.checkpoint(number)
    trainer.save()
    return trainer.history


class QuarkTrainer:
    """One Quark run: the on-policy set-up (farmkit.train.onpolicy's), then per round the rollout
    of a pool, its ranking into quantiles, the update on the kept responses, the log and the
    checkpoint; the policy saved at the end."""

    def __init__(
        self,
        sft: str,
        reward_model: str,
        prompts: list[dict[str, Any]],
        output: str,
        config: QuarkConfig,
        seed: int,
        inputs: list[str] | None,
        gold_pools: Any,
    ) -> None:
        import torch

        from farmkit.lm.models import PromptFormat, choose_device
        from farmkit.train import checkpoints as C
        from farmkit.train import launch, rl_common
        from farmkit.train import policy as P
        from farmkit.train.budget import Budget, reward_model_labels
        from farmkit.train.gold import GoldRequest, make_gold
        from farmkit.train.onpolicy import (
            load_models,
            match_reference,
            rollout_prompts,
            start_backend,
            start_run,
            without_dropout,
        )
        from farmkit.train.rollouts import prompt_order

        self.config, self.prompts, self.output, self.seed = config, prompts, output, seed
        self.sft, self.inputs = sft, inputs
        backend_kind = rollout_backend_kind(config)  # vllm refused with control tokens, first
        accelerator = self.accelerator = start_run(
            config, "farm-quark", output, device_placement=False
        )
        self.world, self.process = accelerator.num_processes, accelerator.process_index
        device = self.device = (
            str(accelerator.device) if self.world > 1 else choose_device(config.device)
        )
        torch.manual_seed(seed)
        model, self.reference, self.tokenizer, self.scorer = load_models(
            accelerator, config, sft, reward_model, device
        )
        self.tokens = (
            [quantile_token(q) for q in range(config.num_quantiles)]
            if config.control_token == "condition"
            else []
        )
        self.fmt = PromptFormat.for_model(sft, config.template)
        # each prompt cut to what the context holds beside max_new_tokens and the control token
        # that follows it
        self.plain_prompts = rollout_prompts(
            model,
            self.tokenizer,
            self.fmt,
            prompts,
            config.max_new_tokens,
            reserve=1 if self.tokens else 0,
        )
        # each control token starts as the token it follows, the last of the prompt (see
        # add_control_tokens)
        prompt_end = self.plain_prompts[0][-1]
        self.token_ids = (
            P.add_control_tokens(model, self.tokenizer, self.tokens, prompt_end)
            if self.tokens
            else []
        )
        if config.lora:
            launch.refuse_lora_under_zero3(accelerator, True)
            model = P.add_lora(
                model, config.lora_rank, config.lora_alpha, trainable_tokens=self.token_ids
            )
        self.reference_vocab = self.reference.get_output_embeddings().weight.shape[0]
        without_dropout(model, self.reference, self.scorer.network)
        self.gold = make_gold(
            GoldRequest.of(
                config,
                seed=seed,
                batch_size=config.generation_batch_size,
                tool="farm-quark",
                pools=gold_pools,
            ),
            prompts,
            sft,
            device=device,
            start_network=self.reference,
        )
        optimizer = P.adamw(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.learning_rate,
            eps=config.adam_eps,
        )
        schedule = (
            rl_common.linear_schedule(config.warmup_steps, config.rounds)
            if config.lr_schedule == "linear"
            else (lambda _: 1.0)
        )
        # stepped once per round, as AlpacaFarm
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        # under DeepSpeed the engine's batch is this process's share of a training batch, one step
        launch.configure_deepspeed(
            accelerator, -(-config.batch_size // self.world), 1, config.max_grad_norm
        )
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        accelerator.register_for_checkpointing(self.scheduler)
        self.checkpoints = C.checkpoint_folder(output, config)
        state, carried = C.resume_state(self.checkpoints, config)
        if state is not None:  # the policy, optimizer, scheduler and random states after its round
            accelerator.load_state(str(state))
        self.history: list[dict[str, Any]] = carried.get("history", [])
        if self.gold is not None and "gold" in carried:  # what judging the rounds done cost goes on
            self.gold.restore(carried["gold"])
        self.budget = Budget(
            reward_model_labels(reward_model), self.history[-1] if self.history else None
        )
        trained_dtype = match_reference(accelerator, self.model, self.reference)
        self.backend = start_backend(backend_kind, sft, seed, device, config, trained_dtype)
        self.order = prompt_order(len(prompts), config.rounds * config.prompts_per_round, seed)
        self.started = time.time() - (self.history[-1]["elapsed_s"] if self.history else 0.0)

    def prompt_length(self, index: int) -> int:
        return len(self.plain_prompts[index])  # token ids, already fitted to the context

    def rollout(self, number: int) -> list[dict[str, Any]]:
        """The round's pool: its prompts' responses, sampled (round 0 from the SFT model itself,
        later rounds behind the best quantile's token) and scored; in the order one process would
        have sampled them."""
        from accelerate.utils import gather_object

        from farmkit.train import launch

        config, accelerator = self.config, self.accelerator
        chosen = self.order[
            number * config.prompts_per_round : (number + 1) * config.prompts_per_round
        ]
        chosen = [index for index in chosen for _ in range(config.samples_per_prompt)]
        control = self.token_ids[:1] if number > 0 and self.tokens else []
        conditioned_prompts = [prompt + control for prompt in self.plain_prompts]
        # under ZeRO-3 the policy is gathered whole for the round's sampling (launch.for_generation)
        with launch.for_generation(accelerator, self.model) as sampler, accelerator.autocast():
            if number > 0:  # the engine, if it has weights of its own, gets the policy's
                self.backend.sync(sampler)
            pool = self.sample_share(sampler, chosen, conditioned_prompts, number)
        if self.world > 1:  # every process ranks the whole round
            pool = sorted(gather_object(pool), key=lambda item: item["position"])
        return pool

    def sample_share(
        self, sampler: Any, chosen: list[int], conditioned_prompts: list[list[int]], number: int
    ) -> list[dict[str, Any]]:
        """This process's share of the round: every world-th generation batch, sampled and scored."""
        from farmkit.train.onpolicy import sample

        config, size = self.config, self.config.generation_batch_size
        pool = []
        for start in range(self.process * size, len(chosen), self.world * size):
            indices = chosen[start : start + size]
            batch = sample(
                config,
                sampler,
                self.tokenizer,
                self.scorer,
                self.prompts,
                conditioned_prompts,
                indices,
                derive_seed(self.seed, "quark rollout", number, start),
                self.backend,
                suppress=self.token_ids,  # a response never holds a control token
            )
            rollout = batch.rollout
            for row, index in enumerate(indices):
                pool.append(
                    {
                        "position": start + row,
                        "prompt": index,
                        "reward": float(batch.rewards[row]),
                        "score": float(batch.scores[row]),
                        "response": rollout.response_ids[row][
                            rollout.response_mask[row].bool()
                        ].tolist(),
                    }
                )
        return pool

    def rank(self, pool: list[dict[str, Any]]) -> tuple[list[tuple[dict, int]], list[float]]:
        """(the kept responses with their quantiles, the mean score of each quantile)."""
        config = self.config
        quantiles = assign_quantiles([item["score"] for item in pool], config.num_quantiles)
        kept = [
            (item, q)
            for item, q in zip(pool, quantiles, strict=True)
            if config.keep == "all" or q == 0
        ]
        by_quantile = [
            [item["score"] for item, q in zip(pool, quantiles, strict=True) if q == quantile]
            for quantile in range(config.num_quantiles)
        ]
        return kept, [sum(scores) / len(scores) for scores in by_quantile]

    def update(
        self, number: int, kept: list[tuple[dict, int]]
    ) -> tuple[list[float], list[float], float]:
        """The round's optimizer steps on the kept responses: each response's log-likelihood behind
        its quantile's token minus kl_coef * KL(policy || SFT); (losses, KLs) of each step and the
        round's learning rate. The schedule steps once a round, as AlpacaFarm's."""
        import torch

        from farmkit.train import checkpoints as C
        from farmkit.train import policy as P
        from farmkit.train import rl_common

        config, accelerator, model, token_ids = (
            self.config,
            self.accelerator,
            self.model,
            self.token_ids,
        )
        pad, device = self.tokenizer.pad_token_id, self.device
        losses, kls = [], []
        rng = random.Random(derive_seed(self.seed, "quark batches", number))
        for batch_items in training_batches(
            kept, config.batch_size, config.epochs_per_round, config.steps_per_round, rng
        ):
            self.budget.add(
                trained=sum(
                    self.prompt_length(item["prompt"]) + bool(token_ids) + len(item["response"])
                    for item, _ in batch_items
                )
            )
            # a process left without rows repeats one, so that every process joins the gradient
            # all-reduce
            local = batch_items[self.process :: self.world] or batch_items[:1]
            prompt_ids = [self.plain_prompts[item["prompt"]] for item, _ in local]
            responses = [item["response"] for item, _ in local]
            conditioned = P.rollout_from_lists(
                [ids + token_ids[q : q + 1] for ids, (_, q) in zip(prompt_ids, local, strict=True)],
                responses,
                pad,
                device,
            )
            plain = P.rollout_from_lists(prompt_ids, responses, pad, device)
            mask = conditioned.response_mask
            # responses are sampled over the SFT model's vocabulary (control tokens suppressed), and
            # scored over it: the likelihood and the KL are those of the policy that sampled
            logits = P.response_logits(model, conditioned, config.temperature)[
                ..., : self.reference_vocab
            ]
            nll = -rl_common.masked_mean(P.token_logprobs(logits, conditioned.response_ids), mask)
            # under a mixed-precision launch the policy's forward runs under autocast: so does the
            # reference's (and the sampling), or the KL is not 0 where the two agree
            with torch.no_grad(), accelerator.autocast():
                reference_logp = torch.log_softmax(
                    P.response_logits(self.reference, plain, config.temperature), dim=-1
                )
            policy_logp = torch.log_softmax(logits, dim=-1)
            kl = rl_common.masked_mean(
                (policy_logp.exp() * (policy_logp - reference_logp)).sum(-1), mask
            )
            self.optimizer.zero_grad()
            accelerator.backward(nll + config.kl_coef * kl)
            accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            self.optimizer.step()
            losses.append(float(nll.detach()))
            kls.append(float(kl.detach()))
        learning_rate = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        # a step of Quark is a round: --save-steps counts rounds
        C.check_finite(number + 1, sum(losses) + config.kl_coef * sum(kls), model)
        return losses, kls, learning_rate

    def log(
        self,
        number: int,
        pool: list[dict[str, Any]],
        kept: list[tuple[dict, int]],
        quantile_scores: list[float],
        losses: list[float],
        kls: list[float],
        learning_rate: float,
    ) -> None:
        """The round's metrics row (with the gold judge's figures), its log line and trackers."""
        from farmkit.train import launch, tracking

        config, history = self.config, self.history
        self.budget.add(sampled=sum(len(item["response"]) for item in pool))
        metrics = {
            "round": number + 1,
            "reward": sum(item["reward"] for item in pool) / len(pool),
            "score": sum(item["score"] for item in pool) / len(pool),
            "top_quantile_score": quantile_scores[0],
            "quantile_scores": quantile_scores,
            "response_length": sum(len(item["response"]) for item in pool) / len(pool),
            "trained_on": len(kept),
            "optimizer_steps": len(losses),
            "learning_rate": learning_rate,
            "nll": sum(losses) / max(1, len(losses)),
            "kl": sum(kls) / max(1, len(kls)),
            "elapsed_s": round(time.time() - self.started, 2),
            **self.budget.row(),
        }
        if self.gold is not None:  # each round's policy, sampled as the saved one samples
            with launch.for_generation(self.accelerator, self.model) as sampler:
                metrics.update(
                    self.gold.evaluate(
                        sampler,
                        self.tokenizer,
                        f"round-{number + 1}",
                        control=self.tokens[0] if self.tokens else None,
                        suppress=self.token_ids,
                    )
                )
        # step: optimizer steps over all rounds; loss: the round's mean objective
        metrics = metrics_row(
            "quark",
            sum(entry["optimizer_steps"] for entry in history) + len(losses),
            metrics["nll"] + config.kl_coef * metrics["kl"] if losses else None,
            **metrics,
        )
        history.append(metrics)
        tracking.log(self.accelerator, metrics, number + 1)
        log.info(
            "round %d/%d  reward %.4f  top quantile %.4f  nll %.4f  kl %.4f",
            number + 1,
            config.rounds,
            metrics["reward"],
            metrics["top_quantile_score"],
            metrics["nll"],
            metrics["kl"],
        )

    def checkpoint(self, number: int) -> None:
        """Every --save-steps rounds: accelerate's state of the run, with its history."""
        from farmkit.train import checkpoints as C

        config = self.config
        if C.saves_now(number + 1, config.rounds, config.save_steps):
            carry: dict[str, Any] = {"history": self.history}
            if self.gold is not None:
                carry["gold"] = self.gold.counters()
            C.save_resume_state(self.accelerator, self.checkpoints, number + 1, config, carry)

    def save(self) -> None:
        """The policy folder (meta.json naming the control token it samples behind), with the
        metrics; the checkpoints removed: the run is done."""
        from farmkit.train import launch, tracking
        from farmkit.train import policy as P

        accelerator, tokens = self.accelerator, self.tokens
        self.backend.close()
        tracking.finish(accelerator)
        accelerator.wait_for_everyone()
        # every process enters: under ZeRO-3 gathering the weights whole is collective
        with launch.full_weights(accelerator, self.model) as whole:
            if accelerator.is_main_process:
                meta = P.policy_meta(
                    "farm-quark",
                    self.sft,
                    self.fmt.resolved(self.tokenizer),
                    self.seed,
                    config_dict(self.config),
                    self.inputs or [],
                    sampling_control_token=tokens[0] if tokens else None,
                    control_tokens=tokens or None,
                    launch=launch.launch_record(accelerator),
                    budget=self.budget.block(rounds=len(self.history)),
                    gold=self.gold.block() if self.gold is not None else None,
                )
                with tempfile.TemporaryDirectory(prefix="farm-quark-") as scratch:
                    metrics_path = Path(scratch) / "metrics.jsonl"
                    write_metrics(metrics_path, self.history)
                    P.save_policy(
                        whole, self.tokenizer, self.output, meta, extra_files=[metrics_path]
                    )
                # the run is done: no need to resume it
                shutil.rmtree(self.checkpoints, ignore_errors=True)
