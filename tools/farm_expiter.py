"""farm-expiter: expert iteration (best-of-n with a reward model, then SFT on the winners)."""

from __future__ import annotations

import dataclasses
import logging

import click

from farmkit.cli import common_options, entry_point, input_argument, seed_option
from farmkit.io import FarmError, display_name, read_records
from farmkit.methods.sft import SFTConfig

log = logging.getLogger("farmkit")
HELP = {field.name: field.metadata.get("help", "") for field in dataclasses.fields(SFTConfig)}


@click.command(name="farm-expiter")
@click.argument("policy")
@click.argument("rm")
@input_argument("prompts")
@click.option("-o", "--output", "output_dir", required=True, type=click.Path(file_okay=False), help="Model folder to write (the last round's policy, meta.json with every round).")
@click.option("-n", default=16, show_default=True, type=click.IntRange(min=1), help="Samples per prompt; the best one becomes a demonstration.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(min=1), help="Rounds of best-of-n + SFT, each starting from the previous round's policy.")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--max-new-tokens", default=300, show_default=True, type=click.IntRange(min=1))
@click.option("--sample-batch-size", default=16, show_default=True, type=click.IntRange(min=1), help="Sequences per generation pass (and texts per scoring pass).")
@click.option("--epochs", type=float, default=1.0, show_default=True, help=HELP["epochs"])
@click.option("--max-steps", type=int, default=-1, show_default=True, help=HELP["max_steps"])
@click.option("--learning-rate", type=float, default=2e-5, show_default=True, help=HELP["learning_rate"])
@click.option("--batch-size", type=int, default=8, show_default=True, help=HELP["batch_size"])
@click.option("--max-length", type=int, default=512, show_default=True, help=HELP["max_length"])
@click.option("--lora", is_flag=True, help=HELP["lora"])
@click.option("--template", type=click.Choice(["auto", "chat", "alpaca"]), default="auto", show_default=True, help=HELP["template"])
@click.option("--device", default="auto", show_default=True, help=HELP["device"])
@seed_option
@common_options
def cli(policy, rm, prompts, output_dir, n, rounds, temperature, top_p, max_new_tokens, sample_batch_size, epochs, max_steps,
        learning_rate, batch_size, max_length, lora, template, device, seed):
    """Expert iteration: sample N outputs per prompt of PROMPTS from POLICY, keep the one the reward
    model RM scores highest, fine-tune POLICY on those winners; --rounds repeats it from the new
    policy. Writes the final policy to -o DIR."""
    name = display_name(prompts)
    records = list(read_records(prompts, "instruction"))
    if not records:
        raise FarmError(f"{name}: no prompts to run expert iteration on")
    from farmkit.methods.bon import BestOfNConfig
    from farmkit.methods.expiter import expert_iteration
    from farmkit.models import file_sha256

    try:
        sampling = BestOfNConfig(ns=(n,), temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                 batch_size=sample_batch_size, score_batch_size=sample_batch_size, template=template, seed=seed)
        sft_config = SFTConfig(epochs=epochs, max_steps=max_steps, learning_rate=learning_rate, batch_size=batch_size,
                               max_length=max_length, lora=lora, template=template, device=device, seed=seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    result = expert_iteration(policy, rm, records, output_dir, sampling, sft_config, rounds=rounds,
                              meta_extra={"inputs": {name: file_sha256(prompts)}}, device=device)
    last = result["rounds"][-1]
    log.info("wrote %s after %d round(s); last round: mean reward %.4f first sample, %.4f best of %d", output_dir, rounds,
             last["mean_reward_first_sample"], last[f"mean_reward_best_of_{n}"], n)


main = entry_point(cli)

if __name__ == "__main__":
    main()
