"""farm-rm-train: train a Bradley-Terry reward model on preference records."""

from __future__ import annotations

import logging

import click

from farmkit.cli import common_options, entry_point, input_argument, seed_option
from farmkit.io import FarmError, display_name, read_records

log = logging.getLogger("farmkit")


@click.command(name="farm-rm-train")
@click.argument("model")
@input_argument("prefs")
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Model folder to write (weights, tokenizer, meta.json, metrics.jsonl).")
@click.option("--eval-fraction", default=0.1, show_default=True, type=click.FloatRange(0, 1, max_open=True), help="Share of prompts held out to report pairwise accuracy.")
@click.option("--ties", type=click.Choice(["drop", "half"]), default="drop", show_default=True, help="Ties (preference 1.5): leave out, or train with target 0.5.")
@click.option("--epochs", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Passes over the training pairs.")
@click.option("--max-steps", default=-1, show_default=True, type=int, help="Optimizer steps; > 0 overrides --epochs.")
@click.option("--learning-rate", default=1e-5, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1), help="Pairs per step (per process).")
@click.option("--max-length", default=512, show_default=True, type=click.IntRange(min=8), help="Tokens per text; longer texts lose their beginning.")
@click.option("--lora", is_flag=True, help="Train LoRA adapters and the head instead of every weight (merged when saved).")
@click.option("--lora-r", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--train-layers", default=-1, show_default=True, type=click.IntRange(min=-1), help="Train only the head and the top K blocks (0: the head alone); -1: every weight.")
@click.option("--template", type=click.Choice(["auto", "chat", "alpaca"]), default="auto", show_default=True, help="Prompt template; auto: the model's own (meta.json, else chat if it has one).")
@click.option("--eval-every", default=0, show_default=True, type=click.IntRange(min=0), help="Held-out evaluation every K steps (0: at the end only).")
@seed_option
@common_options
def cli(model, prefs, output_dir, eval_fraction, ties, epochs, max_steps, learning_rate, batch_size, max_length, lora, lora_r,
        train_layers, template, eval_every, seed):
    """Train a reward model (MODEL's backbone + a scalar head on the last token) on PREFS by
    maximizing the Bradley-Terry likelihood. Fractional preferences are soft labels; null verdicts are
    skipped and counted. Reports held-out pairwise accuracy; per-step metrics go to DIR/metrics.jsonl."""
    from farmkit.models import file_sha256
    from farmkit.records import comparisons

    source = display_name(prefs)
    records = list(read_records(prefs, "preference"))
    items, counts = comparisons(records, source=source, ties=ties)
    skipped = ", ".join(f"{counts[k]} {k}" for k in ("null", "tie") if counts[k])
    if skipped:
        log.info("%s: skipped %s verdict(s)", source, skipped)
    if not items:
        raise FarmError(f"{source}: no usable preferences to train on ({len(records)} records{'; skipped ' + skipped if skipped else ''})")

    from farmkit.methods.reward import RewardConfig, train_reward_model

    try:
        config = RewardConfig(eval_fraction=eval_fraction, ties=ties, epochs=epochs, max_steps=max_steps, learning_rate=learning_rate,
                              batch_size=batch_size, max_length=max_length, lora=lora, lora_r=lora_r, lora_alpha=2 * lora_r, train_layers=train_layers,
                              template=template, eval_every=eval_every, seed=seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    meta = {"inputs": {prefs: file_sha256(prefs)}, "preferences": {"records": len(records), **counts}}
    summary = train_reward_model(model, items, output_dir, config, meta_extra=meta)
    log.info("wrote %s (%d steps, %.0f s)", output_dir, summary["steps"], summary["seconds"])


main = entry_point(cli)

if __name__ == "__main__":
    main()
