"""Supervised fine-tuning with TRL's SFTTrainer, the loss on the response only.

Demonstrations (instruction, input, output, optional control) become token sequences built here:
the prompt is exactly what `farmkit.lm.models.PromptFormat` gives for sampling, tokenized alone as
farm-sample tokenizes it, and the completion is the output followed by the end-of-sequence token.
Binary FeedME and binary reward conditioning are ways of turning preference pairs into such
demonstrations (`feedme_examples`, `conditioning_examples`); expert iteration calls `train_sft` too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from farmkit.core import distributed
from farmkit.core.io import FarmError
from farmkit.core.records import Comparison
from farmkit.core.runs import METRICS_FILE
from farmkit.core.values import AT_LEAST_ONE, Bounds
from farmkit.train.checkpoints import resume_field, save_steps_field
from farmkit.train.config import ModelArgs, TrackingArgs, help_field, shared_field
from farmkit.train.metrics import from_trainer_log, write_metrics
from farmkit.train.precision import PRECISIONS

log = logging.getLogger("farmkit")

POSITIVE_TOKEN = "<|preferred|>"
NEGATIVE_TOKEN = "<|not_preferred|>"
SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@dataclass
class SFTData:
    """What farm-sft's DEMOS are: demonstrations, or preference records trained on in one of two
    modes (its options; they are no training setting, so no --config key)."""

    from_preferences: bool = help_field(
        False,
        "Binary FeedME: DEMOS are preference records; train on the preferred output of each pair.",
        flag=True,
    )
    reward_conditioning: bool = help_field(
        False,
        "DEMOS are preference records; train on both outputs, each behind a control token for "
        "preferred / not preferred. farm-sample then adds the positive token by itself.",
        flag=True,
    )
    positive_token: str = help_field(POSITIVE_TOKEN, "Control token of preferred outputs.")
    negative_token: str = help_field(NEGATIVE_TOKEN, "Control token of the other outputs.")

    def __post_init__(self) -> None:
        if self.from_preferences and self.reward_conditioning:
            raise ValueError(
                "--from-preferences and --reward-conditioning are two different modes; pick one"
            )
        if self.positive_token == self.negative_token:
            raise ValueError("--positive-token and --negative-token must differ")


@dataclass
class SFTConfig(ModelArgs, TrackingArgs):
    """Every setting of an SFT run; farm-sft's options carry the same help text."""

    epochs: int = shared_field("epochs", 3)  # AlpacaFarm's SFT: 3
    max_steps: int = shared_field("max_steps", -1)
    learning_rate: float = shared_field("learning_rate", 2e-5)  # AlpacaFarm's SFT: 2e-5
    batch_size: int = help_field(8, "Sequences per device per forward pass.", bounds=AT_LEAST_ONE)
    gradient_accumulation_steps: int = shared_field("gradient_accumulation_steps", 1)
    warmup_ratio: float = shared_field("warmup_ratio", 0.03)
    lr_scheduler: str = shared_field(
        "lr_scheduler_type",
        "cosine",
        more_help="A transformers scheduler name: cosine, linear, constant...",
    )
    weight_decay: float = shared_field("weight_decay", 0.0)
    max_length: int = help_field(
        512,
        "Longest training sequence in tokens (prompt + response); longer ones are cut at the end.",
        bounds=Bounds(min=8),
    )
    lora: bool = shared_field("lora", False)
    lora_rank: int = shared_field("lora_rank", 16)
    lora_alpha: int = shared_field("lora_alpha", 32)
    lora_dropout: float = help_field(
        0.05, "Dropout on the LoRA adapter's input.", bounds=Bounds(0, 1, max_open=True)
    )
    save_steps: int = save_steps_field()
    resume: bool = resume_field()
    logging_steps: int = help_field(
        10,
        "Log the training loss every this many steps (a short run more often: at least every steps/10, and the last step).",
        bounds=AT_LEAST_ONE,
    )
    device: str = shared_field("device", "auto")
    precision: str = shared_field("precision", "auto", PRECISIONS)
    deepspeed: str | None = field(
        default=None,
        metadata={
            "help": "DeepSpeed config: zero2, zero3 (shipped) or a JSON file; use with accelerate launch."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.template not in ("auto", "chat", "alpaca"):
            raise ValueError("template must be auto, chat or alpaca")


# ---------------------------------------------------------------------------------------------
# Turning records into demonstrations


def _example(item: Comparison, output: str, **extra: str) -> dict:
    """One SFT example from a comparison; a multi-turn prompt's messages only where it has them."""
    example = {"instruction": item.instruction, "input": item.input, "output": output, **extra}
    if item.messages:
        example["messages"] = item.messages
    return example


def feedme_examples(items: Iterable[Comparison]) -> list[dict[str, str]]:
    """Binary FeedME: the preferred output of each comparison as a demonstration (ties left out)."""
    return [_example(item, item.chosen) for item in items if item.target != 0.5]


def conditioning_examples(
    items: Iterable[Comparison], positive: str = POSITIVE_TOKEN, negative: str = NEGATIVE_TOKEN
) -> list[dict[str, str]]:
    """Binary reward conditioning: both outputs, each behind the control token for its verdict."""
    examples = []
    for item in items:
        if item.target == 0.5:
            continue
        examples.append(_example(item, item.chosen, control=positive))
        examples.append(_example(item, item.rejected, control=negative))
    return examples


def training_text(tokenizer: Any, prompt_format: Any, example: dict[str, Any]) -> tuple[str, str]:
    """(prompt, completion) for one demonstration: the prompt farm-sample would use, and the output
    followed by the end-of-sequence token so that the model learns to stop."""
    from farmkit.lm.models import response_end

    prompt = prompt_format.prompt(
        tokenizer,
        example["instruction"],
        example.get("input") or "",
        control=example.get("control"),
        messages=example.get("messages"),
    )
    return prompt, example["output"] + response_end(tokenizer)


def training_ids(
    tokenizer: Any, prompt_format: Any, example: dict[str, Any]
) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of one demonstration. The prompt is tokenized on its own and without
    special tokens, exactly as generation tokenizes it, so a method trains on the very context the
    model later samples from; the completion is the output and its end token. SFT and DPO use this."""
    prompt, completion = training_text(tokenizer, prompt_format, example)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"], tokenizer(
        completion, add_special_tokens=False
    )["input_ids"]


def packed_batches() -> bool:
    """Whether farm-sft trains on padding-free batches (FARMKIT_PACKED_SFT=1; padded by default): the
    demonstrations of a batch concatenated into one row, their positions restarting at each, so that
    attention stays within each one (transformers reads the boundaries from position_ids) and the
    logits are the padded batch's to float rounding (tests/methods/test_sft.py). Off by default: on
    the CPU the packed step's time was within the measurement's noise of the padded one's
    (bench/README.md, `padding`), and a model whose attention ignores position_ids would read across
    the demonstrations."""
    return os.environ.get("FARMKIT_PACKED_SFT", "0") == "1"


def tokenize_examples(
    tokenizer: Any, prompt_format: Any, examples: Sequence[dict[str, Any]], max_length: int
) -> list[dict[str, list[int]]]:
    """Token ids and completion masks (see `training_ids`); a sequence is cut at max_length."""
    rows = []
    for example in examples:
        prompt_ids, completion_ids = training_ids(tokenizer, prompt_format, example)
        input_ids = (prompt_ids + completion_ids)[:max_length]
        mask = ([0] * len(prompt_ids) + [1] * len(completion_ids))[:max_length]
        if any(mask):
            rows.append({"input_ids": input_ids, "completion_mask": mask})
    return rows


def completion_loss(
    model: Any,
    tokenizer: Any,
    prompt_format: Any,
    examples: Sequence[dict[str, Any]],
    max_length: int = 512,
) -> float:
    """Mean cross-entropy per response token of `model` on the demonstrations (prompt tokens excluded)."""
    import torch

    device = next(model.parameters()).device
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for row in tokenize_examples(tokenizer, prompt_format, examples, max_length):
            ids = torch.tensor([row["input_ids"]], device=device)
            labels = ids.clone()
            labels[0, torch.tensor(row["completion_mask"], device=device) == 0] = -100
            logits = model(input_ids=ids).logits[:, :-1]
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            total += float(losses)
            count += int((labels[:, 1:] != -100).sum())
    return total / max(count, 1)


# ---------------------------------------------------------------------------------------------
# Training


def _deepspeed_config(name: str | None) -> str | None:
    if name is None:
        return None
    shipped = SHIPPED_CONFIGS / f"deepspeed_{name}.json"
    if shipped.is_file():
        return str(shipped)
    if Path(name).is_file():
        return name
    raise FarmError(f"DeepSpeed config {name!r}: expected zero2, zero3 or a JSON file")


def trained_tokens(trainer: Any) -> int | None:
    """Tokens TRL's trainer read in its training forward passes (prompt and response, padding left
    out, every epoch counted): its running total, else the last logged num_tokens."""
    total = getattr(trainer, "_total_train_tokens", None)
    if isinstance(total, int | float) and total > 0:
        return int(total)
    logged = [entry["num_tokens"] for entry in trainer.state.log_history if "num_tokens" in entry]
    return int(logged[-1]) if logged else None


def _add_control_tokens(model: Any, tokenizer: Any, examples: Sequence[dict[str, Any]]) -> None:
    """Register the examples' control tokens as special tokens (one id each, never split) and grow the
    embeddings to match."""
    controls = sorted({example["control"] for example in examples if example.get("control")})
    vocabulary = tokenizer.get_vocab()
    new = [token for token in controls if token not in vocabulary]
    if new:
        tokenizer.add_special_tokens(
            {"extra_special_tokens": new}, replace_extra_special_tokens=False
        )
        model.resize_token_embeddings(len(tokenizer))


def train_sft(
    model: str,
    examples: list[dict[str, Any]],
    output_dir: str | os.PathLike,
    config: SFTConfig,
    meta_extra: dict[str, Any] | None = None,
    tracker_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Fine-tune `model` on demonstrations and write an HF folder with meta.json at `output_dir`.

    Examples carry instruction, input, output and optionally `control` (a token placed where the
    response begins; new ones are added to the tokenizer as special tokens). `meta_extra` is merged
    into meta.json (a caller names itself with "tool", its inputs with "inputs", and the token
    sampling must use with "sampling_control_token"). Returns a summary: steps, losses, paths.
    """
    from datasets import Dataset
    from transformers import PrinterCallback, set_seed
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    from farmkit.lm.modelio import model_folder, model_meta
    from farmkit.lm.models import (
        PromptFormat,
        choose_device,
        load_causal_lm,
        read_meta,
        resolve,
        write_meta,
    )
    from farmkit.train import launch
    from farmkit.train.policy import trainer_optim

    if not examples:
        raise FarmError("no demonstrations to train on")
    path = resolve(model)
    device = choose_device(config.device)
    on_gpu = device.startswith("cuda")
    from farmkit.train.precision import resolve_precision

    # fp32 master weights on the CPU; the Trainer moves them to this process's device (one GPU per rank)
    # loaded whole even where an earlier round's Trainer set up ZeRO-3 in this process
    with launch.whole_models():
        network, tokenizer = load_causal_lm(path, device="cpu", dtype="float32")
    tokenizer.padding_side = "right"
    # a base model's own sampling control token must not leak into demonstrations that carry none
    prompt_format = replace(PromptFormat.for_model(path, config.template), control=None)
    template = prompt_format.resolved(tokenizer)
    set_seed(config.seed)  # the rows of new control tokens are drawn at random: seed them too
    _add_control_tokens(network, tokenizer, examples)
    rows = tokenize_examples(tokenizer, prompt_format, examples, config.max_length)
    packed = packed_batches()
    if not rows:
        raise FarmError(
            f"every demonstration's prompt is longer than max_length={config.max_length}"
        )

    peft_config = None
    if config.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            task_type="CAUSAL_LM",
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules="all-linear",
        )
        # New control tokens keep their initial embeddings under LoRA: TRL computes the loss from the
        # output embedding matrix directly, which peft's trainable-token wrappers do not support. The
        # initial rows are distinct random draws, so the adapters still learn to tell them apart.

    from farmkit.train import checkpoints as C

    checkpoints = C.checkpoint_folder(str(output_dir), config)
    had_checkpoints = checkpoints.exists()
    quiet = log.getEffectiveLevel() > logging.INFO
    from farmkit.train import tracking

    report_to, callbacks = tracking.trainer_reporting(
        config.report_to,
        tracker_dir or tracking.tracker_dir(output_dir),
        main_process=distributed.is_main(),
    )
    with warnings.catch_warnings():
        # TRL's own config still sets transformers' deprecated gradient_checkpointing alias
        warnings.filterwarnings(
            "ignore", message=".*gradient_checkpointing.*", category=FutureWarning
        )
        args = TRLConfig(
            output_dir=str(checkpoints),
            num_train_epochs=config.epochs,
            max_steps=config.max_steps,
            learning_rate=config.learning_rate,
            per_device_train_batch_size=config.batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            warmup_steps=float(config.warmup_ratio),  # a float below 1 is a fraction of the steps
            lr_scheduler_type=config.lr_scheduler,
            weight_decay=config.weight_decay,
            # the rows are cut at max_length already (tokenize_examples); TRL refuses a max_length
            # it would not enforce on padding-free batches
            max_length=None if packed else config.max_length,
            completion_only_loss=True,
            seed=config.seed,
            data_seed=config.seed,
            logging_steps=config.logging_steps,
            logging_first_step=True,  # metrics.jsonl gets a row even from a short run
            save_strategy="steps" if config.save_steps else "no",
            save_steps=config.save_steps or 500,
            report_to=report_to,
            disable_tqdm=quiet,
            use_cpu=launch.use_cpu(on_gpu),  # never drops a DeepSpeed launch
            bf16=resolve_precision(config.precision, on_gpu) == "bf16",
            optim=trainer_optim(device),  # FARMKIT_FUSED_ADAMW=0: the per-tensor loop
            # FARMKIT_PACKED_SFT=1: a batch's demonstrations as one row, each attending to itself
            # only (position_ids), no padding computed (bench/bench_padding.py)
            padding_free=packed,
            gradient_checkpointing=False,
            deepspeed=_deepspeed_config(config.deepspeed),
            dataset_num_proc=None,
            # several DeepSpeed processes on CPUs: keep the process count accelerate was given
            **launch.trainer_state_config(),
        )
    from farmkit.train.schedule import step_logging_callback, warm_trainer

    trainer = warm_trainer(SFTTrainer)(  # the first step already has a learning rate
        model=network,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[
            *(callbacks or []),
            step_logging_callback(config.logging_steps),
            C.checkpoint_rule(config),
            C.finite_guard(),
        ],
    )
    accelerator = trainer.accelerator
    try:
        launch.refuse_lora_under_zero3(accelerator, config.lora)
    except FarmError:
        if not had_checkpoints:  # the Trainer made its output folder: a refused run leaves nothing
            shutil.rmtree(checkpoints, ignore_errors=True)
        raise
    if quiet:
        trainer.remove_callback(PrinterCallback)
    resume_from = C.trainer_checkpoint(checkpoints, config, accelerator.is_main_process)
    # the Trainer prints its loss logs on stdout, which belongs to records (farm-expiter streams there)
    with contextlib.redirect_stdout(sys.stderr):
        result = trainer.train(resume_from_checkpoint=resume_from)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]

    # Every rank takes part in saving (ZeRO-3 gathers shards); rank 0 alone finishes the folder.
    target = Path(output_dir)
    if config.lora:
        trainer.model = trainer.model.merge_and_unload()
    summary = {
        "output_dir": str(target),
        "examples": len(rows),
        "steps": trainer.state.global_step,
        "train_loss": result.training_loss,
        "losses": losses,
        "prompt_template": template,
        "training_tokens": trained_tokens(trainer),
    }
    main = accelerator.is_main_process
    with model_folder(target, main_process=main) as folder:
        if launch.zero_stage(accelerator) == 3:
            # the Trainer's own save writes a ZeRO checkpoint, not weights, unless the config asks
            # for gathered weights: gather them here whatever the config says
            with launch.full_weights(accelerator, trainer.model_wrapped) as whole:
                if main:
                    whole.save_pretrained(folder)
        else:
            trainer.save_model(str(folder))
        if main:
            tokenizer.padding_side = "left"
            tokenizer.save_pretrained(folder)
            meta = model_meta(
                "farm-sft",
                "policy",
                model,
                template,
                config.seed,
                asdict(config),
                {},
                base_model_meta=read_meta(path) or None,
                training={key: summary[key] for key in ("examples", "steps", "train_loss")},
                launch=launch.launch_record(accelerator),
            )
            meta.update(meta_extra or {})
            write_meta(folder, meta)
            write_metrics(folder / METRICS_FILE, from_trainer_log("sft", trainer.state.log_history))
    if main:
        shutil.rmtree(checkpoints, ignore_errors=True)
    # no process reads the folder (expert iteration's next round) before the main one has renamed it
    accelerator.wait_for_everyone()
    return summary
