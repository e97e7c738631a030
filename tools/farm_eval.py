"""farm-eval: model outputs (or a model) + a reference -> leaderboard rows, placed on a published board.
A convenience over farm-sample, farm-annotate and farm-winrate: it composes farm-sample's command,
farm-annotate's run and the evaluation's rows (farmkit/evaluate/run.py)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import click

from farmkit.annotate.batch import BatchConfig
from farmkit.cli import (
    BatchCommand,
    common_options,
    decoding_options,
    entry_point,
    field_options,
    input_argument,
    judge_options,
    log,
    model_options,
    on_error_option,
    output_option,
    reference_option,
    seed_option,
    split_option,
    verdict_cache,
)
from farmkit.core.io import display_name
from farmkit.evaluate.boards import write_board
from farmkit.evaluate.run import DEFAULT_POOL, EvalConfig

TOOL = "farm-eval"


def sample(model: str, reference: str, output: str, *, seed: int, settings: dict[str, Any]) -> None:
    """farm-sample MODEL REFERENCE -n 1 -o OUTPUT: the model's outputs for the reference's
    instructions, by farm-sample's own command (run in this process). `settings`: farm-sample's
    options by flag (--device, --temperature, ...); None leaves farm-sample's default."""
    from farmkit.tools.farm_sample import cli as sample_cli

    import farmkit.core.io as farm_io

    split = farm_io._split  # farm-sample's --split resets it when it ends: keep ours
    args = [model, reference, "-n", "1", "-o", output, "--seed", str(seed)]
    if split is not None:
        args += ["--split", split]
    for flag, value in settings.items():
        if value is not None:
            args += [flag, str(value)]
    if not log.isEnabledFor(logging.WARNING):
        args.append("-q")
    log.info("farm-eval: farm-sample %s", " ".join(args))
    try:
        sample_cli.main(args=args, standalone_mode=False)
    finally:
        farm_io.set_split(split)


@click.command(name=TOOL, cls=BatchCommand)
@input_argument("outputs", nargs=-1)
@reference_option  # required
@field_options(EvalConfig)
@model_options  # --device: also the local and reward-model judges', as in farm-annotate
@decoding_options(temperature=0.7, generation_batch_size=32)
@output_option
@seed_option
@judge_options(
    max_cost_help="The run refuses to start, or stops asking, before it would spend more.",
    both_orders_help="A pair costs two requests.",
)
@field_options(BatchConfig)
@on_error_option
@split_option
@common_options
def cli(
    outputs,
    reference,
    pool,
    labels,
    leaderboard,
    sort_by,
    instruction_difficulty,
    context,
    bootstrap,
    fmt,
    min_verdicts,
    template,
    device,
    temperature,
    top_p,
    max_new_tokens,
    generation_batch_size,
    output,
    seed,
    flip_rate,
    both_orders,
    models,
    cache_path,
    no_cache,
    max_cost,
    prices,
    batch,
    batch_mode,
    batch_wait,
    batch_fallback,
    ledger,
):
    """Evaluate models against a reference as AlpacaEval does, in one command: judge each output
    against the reference's output for its instruction, rank the models by raw and length-controlled
    win rate (with intervals), and place them on a published leaderboard.

    OUTPUTS (default: stdin) are model outputs (AlpacaEval's JSON, farmkit JSONL, a Hugging Face
    dataset), or a model (a model folder, embedded, a .gguf file) that first answers the reference's
    instructions. It is the same as this pipe (the sampling step only for a model):

    \b
        farm-sample MODEL REF -n 1 \\
        | farm-annotate - --reference REF --pool weighted_gpt4_turbo \\
        | farm-winrate --bootstrap 1000 --format table

    \b
    farm-eval outputs.json --reference gpt4_turbo.json --leaderboard board.csv --format table
    farm-eval sft/ --reference ref.jsonl --pool single_offline  # offline, nearest AlpacaEval 2's judge
    farm-eval model_outputs.json --reference ref.json --labels annotations.json --sort-by win_rate
    """
    from farmkit.annotate.pools import labels_pool, load_pool
    from farmkit.annotate.run import judge_against_reference
    from farmkit.evaluate import run as evaluate

    if not reference:
        raise click.UsageError("give the reference's outputs: --reference FILE")
    if labels and pool:
        raise click.UsageError("--labels replaces the pool; leave --pool out")
    # the judges: the --labels file's verdicts, else --pool, with --model and --flip-rate applied
    chosen = labels_pool(labels) if labels else load_pool(pool or DEFAULT_POOL)
    chosen = chosen.with_models(list(models))
    if flip_rate is not None:
        chosen.flip_rate = flip_rate
    cache = verdict_cache(cache_path, no_cache)
    with tempfile.TemporaryDirectory(prefix="farm-eval-") as folder:
        inputs = []
        for index, path in enumerate(outputs or ("-",)):
            if evaluate.is_model(path):
                sampled = str(Path(folder) / f"outputs-{index}.jsonl")
                sample(
                    path,
                    reference,
                    sampled,
                    seed=seed,
                    settings={
                        "--template": template,
                        "--device": device,
                        "--temperature": temperature,
                        "--top-p": top_p,
                        "--max-new-tokens": max_new_tokens,
                        "--generation-batch-size": generation_batch_size,
                    },
                )
                path = sampled
            inputs.append(path)
        preferences = judge_against_reference(
            inputs,
            reference,
            chosen,
            seed=seed,
            both_orders=both_orders,
            cache=cache,
            prices=prices,
            max_cost=max_cost,
            device=device,
            batch=BatchConfig(batch, batch_mode, batch_wait, batch_fallback, ledger),
        )
    if isinstance(preferences, int):  # questions pending in batches: no board yet
        raise SystemExit(preferences)
    if (
        not preferences
    ):  # exit 0 as every tool's empty input, but said: an empty pipe is easy to miss
        log.warning(
            "farm-eval: no output records in %s; nothing to evaluate",
            ", ".join(display_name(path) for path in inputs),
        )
    evaluate.check_verdicts(preferences, min_verdicts)
    rows = evaluate.leaderboard(
        preferences,
        difficulty=instruction_difficulty,
        bootstrap=bootstrap,
        seed=seed,
        context=context,
    )
    board = evaluate.read_board(leaderboard) if leaderboard else []
    rows = evaluate.place(board, rows, sort_by) if rows or board else []
    write_board(rows, fmt, output, evaluate.TABLE_COLUMNS)


main = entry_point(cli)

if __name__ == "__main__":
    main()
