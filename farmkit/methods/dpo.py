"""Direct Preference Optimization on preference records with TRL's DPOTrainer: the SFT model is both
the starting point and the frozen reference; prompts are formatted exactly as sampling formats them
(PromptFormat), ties and null verdicts are dropped and counted, and TRL's loss variants pass through.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.io import FarmError
from farmkit.methods.config import config_dict, help_field
from farmkit.models import TEMPLATES

log = logging.getLogger("farmkit")

# TRL 1.16's DPO losses (DPOConfig.loss_type); several may be combined with loss weights
LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)


@dataclass
class DPOConfig:
    beta: float = help_field(0.1, "Strength of the implicit KL constraint to the SFT model (higher: stay closer). For ipo it is the regularization tau.")
    loss_type: str = help_field("sigmoid", f"DPO loss, passed to TRL: one of {', '.join(LOSS_TYPES)}; several comma-separated ones are summed (weights: --loss-weights).")
    loss_weights: str | None = help_field(None, "Comma-separated weights, one per loss in --loss-type.")
    label_smoothing: float = help_field(0.0, "Assumed label-flip rate for the robust loss (and epsilon of exo_pair).")
    epochs: float = help_field(2.0, "Passes over the preference pairs (AlpacaFarm: 2).")
    max_steps: int = help_field(-1, "Stop after this many optimizer steps (-1: run all epochs).")
    learning_rate: float = help_field(1e-6, "Peak learning rate (AlpacaFarm: 1e-6); linear decay to 0.")
    batch_size: int = help_field(8, "Pairs per device per step.")
    gradient_accumulation_steps: int = help_field(1, "Steps whose gradients are summed before an update.")
    warmup_ratio: float = help_field(0.0, "Fraction of steps spent warming the learning rate up.")
    max_length: int = help_field(1024, "Longest prompt + response in tokens; longer pairs are cut from the end.")
    lora: bool = help_field(False, "Train LoRA adapters instead of all weights (the adapters off give the reference); the saved policy has them merged.")
    lora_rank: int = help_field(16, "LoRA rank.")
    lora_alpha: int = help_field(32, "LoRA alpha.")
    template: str = help_field("auto", "Prompt template (auto: what the SFT model's meta.json says, else chat if its tokenizer has one).", TEMPLATES)

    def __post_init__(self) -> None:
        losses = self.losses
        unknown = [loss for loss in losses if loss not in LOSS_TYPES]
        if not losses or unknown:
            raise ValueError(f"unknown loss type {', '.join(unknown) or repr(self.loss_type)}; expected one of {', '.join(LOSS_TYPES)}")
        if self.weights is not None and len(self.weights) != len(losses):
            raise ValueError("--loss-weights needs one weight per loss in --loss-type")
        if self.beta <= 0:
            raise ValueError("beta must be positive")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError("label-smoothing must lie in [0, 0.5)")
        if self.label_smoothing and not {"robust", "exo_pair"} & set(losses):
            raise ValueError("label-smoothing only applies to the robust and exo_pair losses")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError("warmup-ratio must lie in [0, 1)")
        if self.epochs <= 0 or self.learning_rate <= 0 or self.batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ValueError("epochs, learning-rate, batch-size and gradient-accumulation-steps must be positive")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError("max-steps must be a positive number of steps, or -1")

    @property
    def losses(self) -> list[str]:
        return [loss.strip() for loss in self.loss_type.split(",") if loss.strip()]

    @property
    def weights(self) -> list[float] | None:
        if self.loss_weights is None:
            return None
        try:
            return [float(weight) for weight in self.loss_weights.split(",")]
        except ValueError:
            raise ValueError(f"--loss-weights {self.loss_weights!r}: expected comma-separated numbers") from None


def dpo_pairs(records: list[dict[str, Any]], source: str) -> tuple[list[dict[str, str]], Counter]:
    """Preference records -> instruction/input/chosen/rejected pairs, with counts of what was dropped."""
    from farmkit.records import chosen_rejected, comparisons

    kept, counts = comparisons(records, source=source, ties="drop")
    return list(chosen_rejected(kept)), counts


def train_dpo(sft: str, pairs: list[dict[str, str]], output: str, config: DPOConfig, seed: int = 0,
              inputs: list[str] | None = None, counts: dict[str, int] | None = None) -> dict[str, Any]:
    """Train with DPO from `sft` on chosen/rejected pairs and write the policy folder to `output`.
    Returns the last logged training metrics (loss, reward margins, accuracies)."""
    import torch
    from datasets import Dataset
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    from farmkit import cli
    from farmkit.methods.policy import policy_meta, save_policy
    from farmkit.models import PromptFormat, load_causal_lm

    if not pairs:
        raise FarmError("no usable preference pairs (all ties or null verdicts)")
    on_gpu = torch.cuda.is_available()
    torch.manual_seed(seed)
    # loaded on the CPU in fp32: the trainer places it (and mixes precision on a GPU)
    model, tokenizer = load_causal_lm(sft, device="cpu", dtype="float32")
    fmt = PromptFormat.for_model(sft, config.template)
    rows = [{"prompt": fmt.prompt(tokenizer, pair["instruction"], pair["input"]), "chosen": pair["chosen"], "rejected": pair["rejected"]}
            for pair in pairs]
    reference = None
    peft_config = None
    if config.lora:
        from peft import LoraConfig

        # "all-linear" leaves the output layer out, as TRL requires (it reads lm_head.weight directly)
        peft_config = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                 task_type="CAUSAL_LM", target_modules="all-linear")
    else:
        reference, _ = load_causal_lm(sft, device="cpu", dtype="float32")
    with tempfile.TemporaryDirectory(prefix="farm-dpo-") as scratch:
        args = TRLConfig(
            output_dir=scratch,
            beta=config.beta,
            loss_type=config.losses,
            loss_weights=config.weights,
            label_smoothing=config.label_smoothing,
            num_train_epochs=config.epochs,
            max_steps=config.max_steps,
            learning_rate=config.learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=float(config.warmup_ratio),  # transformers 5: a float below 1 is a fraction of the steps
            per_device_train_batch_size=config.batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            max_length=config.max_length,
            seed=seed,
            data_seed=seed,
            use_cpu=not on_gpu,
            bf16=on_gpu and torch.cuda.is_bf16_supported(),
            activation_checkpointing=False,
            save_strategy="no",
            report_to=[],
            logging_steps=1,
            disable_tqdm=cli.quiet(),
        )
        trainer = DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, peft_config=peft_config)
        if cli.quiet():  # with tqdm off the Trainer prints every log dict instead; -q means silence
            from transformers import PrinterCallback

            trainer.remove_callback(PrinterCallback)
        with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its logs; stdout is for records only
            trainer.train()
        history = [entry for entry in trainer.state.log_history if "loss" in entry]
        metrics_path = Path(scratch) / "metrics.jsonl"
        metrics_path.write_text("".join(json.dumps(entry) + "\n" for entry in history))
        if trainer.accelerator.is_main_process:
            meta = policy_meta("farm-dpo", sft, fmt.resolved(tokenizer), seed, config_dict(config), inputs or [],
                               pairs={"used": len(pairs), **{key: value for key, value in (counts or {}).items() if key != "used"}})
            save_policy(trainer.accelerator.unwrap_model(trainer.model), tokenizer, output, meta, extra_files=[metrics_path])
    return history[-1] if history else {}
