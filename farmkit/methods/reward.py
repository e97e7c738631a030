"""Reward models: Bradley-Terry training on preference comparisons (soft labels allowed). Training
reads text as scoring does (farmkit.train.scoring): the policy's prompt, the response, end-of-sequence.

Training is a compact loop on `accelerate` rather than TRL's RewardTrainer, because the targets are
probabilities (P(output_2 better): fractional verdicts and kept ties) and RewardTrainer only takes
hard chosen/rejected pairs. The loop runs on one CPU, one GPU, or many under `accelerate launch`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from farmkit.core.io import FarmError
from farmkit.core.records import Comparison
from farmkit.core.runs import METRICS_FILE
from farmkit.core.values import AT_LEAST_ONE, NON_NEGATIVE, Bounds
from farmkit.lm.models import PromptFormat, resolve
from farmkit.train import tracking
from farmkit.train.checkpoints import resume_field, save_steps_field
from farmkit.train.config import ModelArgs, TrackingArgs, help_field, shared_field
from farmkit.train.metrics import MetricsWriter
from farmkit.train.precision import PRECISIONS
from farmkit.train.scoring import reward_format, reward_text, sequence_rewards, tail_token_ids

log = logging.getLogger("farmkit")


@dataclass
class RewardConfig(ModelArgs, TrackingArgs):
    """Hyperparameters of reward-model training; farm-rm-train's options carry the same help text."""

    eval_fraction: float = help_field(
        0.1,
        "Share of prompts held out to report pairwise accuracy (every pair of a held-out prompt goes with it).",
        bounds=Bounds(0, 1, max_open=True),
    )
    ties: str = help_field(
        "drop",
        "Ties (preference 1.5): drop them, or train on them with target 0.5.",
        choices=("drop", "half"),
    )
    epochs: int = shared_field("epochs", 1)
    max_steps: int = shared_field("max_steps", -1)
    learning_rate: float = shared_field("learning_rate", 1e-5)  # linear warmup, linear decay to 0
    batch_size: int = help_field(
        8,
        "Pairs per optimizer step per process (each pair is two sequences).",
        bounds=AT_LEAST_ONE,
    )
    max_length: int = help_field(
        512,
        "Tokens per text; a longer text loses its beginning, never the response end.",
        bounds=Bounds(min=8),
    )
    warmup_ratio: float = shared_field("warmup_ratio", 0.03)
    weight_decay: float = shared_field("weight_decay", 0.0)
    lora: bool = shared_field("lora", False)  # the head trains in full
    lora_rank: int = shared_field("lora_rank", 16)
    lora_alpha: int = shared_field("lora_alpha", 32)
    train_layers: int = help_field(
        -1,
        "Train only the head and the top K transformer blocks (0: the head alone; -1: every weight).",
        bounds=Bounds(min=-1),
    )
    eval_every: int = help_field(
        0, "Held-out evaluation every K steps (0: at the end only).", bounds=NON_NEGATIVE
    )
    save_steps: int = save_steps_field()
    resume: bool = resume_field()
    device: str = shared_field("device", "auto")
    precision: str = shared_field("precision", "auto", PRECISIONS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ties not in ("drop", "half"):
            raise ValueError("ties must be 'drop' or 'half'")
        if self.lora and self.train_layers >= 0:
            raise ValueError(
                "--lora and --train-layers are two ways of training fewer weights; pick one"
            )


# ---------------------------------------------------------------------------------------------
# Training


def split_held_out(
    items: Sequence[Comparison], fraction: float, seed: int
) -> tuple[list[Comparison], list[Comparison]]:
    """Hold out a seeded share of the prompts (every comparison of a held-out prompt goes with it, so
    held-out accuracy measures prompts the model has not seen)."""
    prompts = sorted({(item.instruction, item.input) for item in items})
    random.Random(seed).shuffle(prompts)
    count = math.ceil(len(prompts) * fraction) if fraction > 0 and len(prompts) > 1 else 0
    held = set(prompts[: min(count, len(prompts) - 1)])
    train = [item for item in items if (item.instruction, item.input) not in held]
    held_out = [item for item in items if (item.instruction, item.input) in held]
    return train, held_out


def bradley_terry_loss(reward_1: Any, reward_2: Any, target: Any) -> Any:
    """Cross-entropy of P(output_2 better) = sigmoid(r2 - r1) against a (possibly soft) target."""
    import torch.nn.functional as F

    return F.binary_cross_entropy_with_logits(reward_2 - reward_1, target)


def _pair_stats(reward_1: Any, reward_2: Any, target: Any) -> tuple[int, int]:
    """(correct, decided) over the pairs whose target is not a tie."""
    decided = target != 0.5
    correct = ((reward_2 > reward_1) == (target > 0.5)) & decided
    return int(correct.sum()), int(decided.sum())


class _Pairs:
    """Tokenized comparisons; a batch is the output_1 texts followed by the output_2 texts."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_format: PromptFormat,
        items: Sequence[Comparison],
        max_length: int,
    ):
        first = [
            reward_text(
                tokenizer, prompt_format, c.instruction, c.input, c.output_1, messages=c.messages
            )
            for c in items
        ]
        second = [
            reward_text(
                tokenizer, prompt_format, c.instruction, c.input, c.output_2, messages=c.messages
            )
            for c in items
        ]
        self.first = tail_token_ids(tokenizer, first, max_length)
        self.second = tail_token_ids(tokenizer, second, max_length)
        self.targets = [c.target for c in items]
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> int:
        return index

    def collate(self, indices: list[int]) -> dict[str, Any]:
        import torch

        batch = self.tokenizer.pad(
            {"input_ids": [self.first[i] for i in indices] + [self.second[i] for i in indices]},
            padding=True,
            return_tensors="pt",
        )
        batch["target"] = torch.tensor([self.targets[i] for i in indices], dtype=torch.float32)
        return dict(batch)


def _rewards(network: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    logits = sequence_rewards(network, batch["input_ids"], batch["attention_mask"]).float()
    half = logits.shape[0] // 2
    return logits[:half], logits[half:]


def _evaluate(accelerator: Any, network: Any, loader: Any) -> dict[str, float]:
    import torch

    network.eval()
    losses, correct, decided, pairs = [], 0, 0, 0
    # no_grad, not inference_mode: ZeRO-3 gathers weights into tensors that training then reuses
    with torch.no_grad():
        for batch in loader:
            reward_1, reward_2 = _rewards(network, batch)
            reward_1, reward_2, target = accelerator.gather_for_metrics(
                (reward_1, reward_2, batch["target"])
            )
            losses.append(float(bradley_terry_loss(reward_1, reward_2, target)) * len(target))
            right, counted = _pair_stats(reward_1, reward_2, target)
            correct, decided, pairs = correct + right, decided + counted, pairs + len(target)
    network.train()
    return {
        "eval_loss": sum(losses) / max(pairs, 1),
        "eval_accuracy": correct / decided if decided else float("nan"),
        "eval_pairs": pairs,
    }


def train_reward_model(
    model: str | os.PathLike,
    items: Sequence[Comparison],
    output_dir: str | os.PathLike,
    config: RewardConfig,
    meta_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train a Bradley-Terry reward model from `model`'s backbone and write it to `output_dir`
    (weights, tokenizer, meta.json, metrics.jsonl), whole or not at all. Returns the summary."""
    import torch
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import AutoModelForSequenceClassification

    from farmkit.core.console import progress
    from farmkit.lm.modelio import model_folder, model_meta
    from farmkit.lm.models import load_tokenizer, write_meta
    from farmkit.train import checkpoints as C
    from farmkit.train import launch
    from farmkit.train import policy as P
    from farmkit.train import schedule as schedules
    from farmkit.train.precision import resolve_precision

    if not items:
        raise FarmError("no comparisons to train on")
    gpu = launch.check_device(config.device).startswith("cuda")
    # joins the launcher's processes and honours a DeepSpeed launch (see launch.use_cpu)
    accelerator = launch.make_accelerator(
        cpu=config.device == "cpu",
        mixed_precision=resolve_precision(config.precision, gpu),
        **tracking.accelerator_kwargs(config.report_to, output_dir),
    )
    launch.refuse_lora_under_zero3(accelerator, config.lora)
    set_seed(config.seed)
    path = resolve(model)
    tokenizer = load_tokenizer(path, padding_side="right")
    prompt_format = reward_format(path, tokenizer, config.template)
    train_items, held_out = split_held_out(items, config.eval_fraction, config.seed)
    try:
        # the load report lists the new head as missing, which is the point: silence it
        with _transformers_quiet():
            network = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=torch.float32
            )
    except OSError as exc:
        raise FarmError(f"{model}: cannot load the backbone ({exc})") from None
    network.config.pad_token_id = tokenizer.pad_token_id
    if config.lora:
        from peft import LoraConfig, get_peft_model

        # the scalar head is new: it trains in full beside the adapters (peft keeps it for SEQ_CLS)
        lora = LoraConfig(
            task_type="SEQ_CLS",
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            target_modules="all-linear",
        )
        network = get_peft_model(network, lora)
    elif config.train_layers >= 0:
        _freeze_below(network, config.train_layers)

    train_pairs = _Pairs(tokenizer, prompt_format, train_items, config.max_length)
    eval_pairs = _Pairs(tokenizer, prompt_format, held_out, config.max_length)
    shuffler = torch.Generator().manual_seed(config.seed)
    train_loader = DataLoader(
        train_pairs,
        batch_size=config.batch_size,
        shuffle=True,
        generator=shuffler,
        collate_fn=train_pairs.collate,
    )
    eval_loader = DataLoader(
        eval_pairs, batch_size=config.batch_size, collate_fn=eval_pairs.collate
    )
    steps_per_epoch = math.ceil(len(train_pairs) / (config.batch_size * accelerator.num_processes))
    total_steps = (
        config.max_steps
        if config.max_steps > 0
        else max(1, math.ceil(config.epochs * steps_per_epoch))
    )
    optimizer = P.adamw(
        [p for p in network.parameters() if p.requires_grad],
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )
    schedule = schedules.scheduler(  # the first step already has a learning rate
        "linear", optimizer, schedules.warmup_steps(config.warmup_ratio, total_steps), total_steps
    )
    # DeepSpeed's batch size is the loop's; no gradient clipping, as in the plain loop
    launch.configure_deepspeed(accelerator, config.batch_size, 1, 0.0)
    network, optimizer, train_loader, eval_loader, schedule = accelerator.prepare(
        network, optimizer, train_loader, eval_loader, schedule
    )
    checkpoints = C.checkpoint_folder(output_dir, config)
    state, carried = C.resume_state(checkpoints, config)
    if state is not None:  # weights, optimizer, scheduler and random states as they were
        accelerator.load_state(str(state))

    if not accelerator.is_main_process:  # one process reports for all
        log.setLevel(logging.WARNING)
    log.info(
        "training a reward model on %d pairs (%d held out), %d steps",
        len(train_pairs),
        len(eval_pairs),
        total_steps,
    )
    summary: dict[str, Any] = {
        "train_pairs": len(train_pairs),
        "eval_pairs": len(eval_pairs),
        "steps": total_steps,
    }
    tracking.start(accelerator, "farm-rm-train", asdict(config))
    with contextlib.ExitStack() as stack:
        main = accelerator.is_main_process
        folder = stack.enter_context(model_folder(output_dir, main_process=main))
        metrics = stack.enter_context(MetricsWriter(folder / METRICS_FILE, "reward", enabled=main))
        rows: list[dict[str, Any]] = carried.get("rows", [])
        for row in rows:  # the resumed run's metrics so far, as it wrote them
            metrics.write(**{key: value for key, value in row.items() if key != "method"})
        step, window = len(rows), [row["loss"] for row in rows]
        started = time.time() - (rows[-1]["elapsed_s"] if rows else 0.0)
        network.train()
        bar = (
            progress(total=total_steps, initial=step, desc="reward model")
            if accelerator.is_main_process
            else None
        )
        # a resumed run draws the same shuffled batches: the ones done are drawn and passed over
        done = step
        while step < total_steps:
            for batch in train_loader:
                if done:
                    done -= 1
                    continue
                reward_1, reward_2 = _rewards(network, batch)
                loss = bradley_terry_loss(reward_1, reward_2, batch["target"])
                accelerator.backward(loss)
                rate = schedule.get_last_lr()[0]  # this step's, before the scheduler moves on
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                step += 1
                C.check_finite(step, loss, network)
                right, counted = _pair_stats(reward_1.detach(), reward_2.detach(), batch["target"])
                row = {
                    "step": step,
                    "epoch": round(step / steps_per_epoch, 4),
                    "loss": float(loss.detach()),
                    "accuracy": right / counted if counted else None,
                    "learning_rate": rate,
                    "elapsed_s": round(time.time() - started, 2),
                }
                window.append(row["loss"])
                if (
                    config.eval_every
                    and step % config.eval_every == 0
                    and step < total_steps
                    and len(eval_pairs)
                ):
                    row.update(_evaluate(accelerator, network, eval_loader))
                if step == total_steps and len(eval_pairs):
                    row.update(_evaluate(accelerator, network, eval_loader))
                    summary.update({k: row[k] for k in ("eval_loss", "eval_accuracy")})
                rows.append(metrics.write(**row))
                tracking.log(accelerator, row, step)
                if C.saves_now(step, total_steps, config.save_steps):
                    C.save_resume_state(accelerator, checkpoints, step, config, {"rows": rows})
                if bar is not None:
                    bar.update(1)
                if step >= total_steps:
                    break
        if bar is not None:
            bar.close()
        summary["first_loss"], summary["final_loss"] = (
            window[0],
            sum(window[-10:]) / len(window[-10:]),
        )
        summary["seconds"] = round(time.time() - started, 1)
        tracking.finish(accelerator)
        accelerator.wait_for_everyone()
        # every process takes part: under ZeRO-3 each holds a shard, gathered whole to save
        with launch.full_weights(accelerator, network) as trained:
            if main:
                metrics.close()
                if config.lora:
                    trained = trained.merge_and_unload()
                trained.save_pretrained(folder)
        if main:
            tokenizer.save_pretrained(folder)
            meta = model_meta(
                "farm-rm-train",
                "reward_model",
                model,
                prompt_format.template,
                config.seed,
                asdict(config),
                {},
                training=summary,
                launch=launch.launch_record(accelerator),
            )
            meta.update(meta_extra or {})
            write_meta(folder, meta)
    if accelerator.is_main_process:  # the run is done: its resume states are not needed
        shutil.rmtree(checkpoints, ignore_errors=True)
    if "eval_accuracy" in summary:
        log.info(
            "held-out pairwise accuracy %.3f on %d pairs (loss %.4f)",
            summary["eval_accuracy"],
            len(eval_pairs),
            summary["eval_loss"],
        )
    return summary


def _freeze_below(network: Any, keep: int) -> None:
    """Train only the scalar head and the top `keep` transformer blocks; the rest stays as loaded."""
    backbone = getattr(network, network.base_model_prefix, None)
    blocks = getattr(backbone, "layers", None)
    if blocks is None:
        raise FarmError(
            f"{type(network).__name__}: no `layers` list of transformer blocks; use --lora instead of --train-layers"
        )
    network.requires_grad_(False)
    network.score.requires_grad_(True)
    if keep > 0:
        for block in list(blocks)[-keep:]:
            block.requires_grad_(True)
        if (
            getattr(backbone, "norm", None) is not None
        ):  # the final norm sits between the top block and the head
            backbone.norm.requires_grad_(True)


@contextlib.contextmanager
def _transformers_quiet() -> Any:
    from transformers.utils import logging as transformers_logging

    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(level)
