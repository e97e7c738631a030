"""farm-annotate: pairs of outputs -> preference records, from a pool of simulated annotators
(LLM judges over an OpenAI-compatible endpoint, an in-process judge model, a gold oracle) or human labels."""

from __future__ import annotations

import logging

import click
import orjson

from farmkit.annotate.batch import BatchConfig
from farmkit.annotate.pools import AnnotateConfig
from farmkit.cli import (
    BatchCommand,
    common_options,
    entry_point,
    field_options,
    input_argument,
    judge_options,
    on_error_option,
    output_option,
    reference_option,
    seed_option,
    shared_option,
    split_option,
    verdict_cache,
)
from farmkit.core.io import RecordWriter, records_stdout


@click.command(name="farm-annotate", cls=BatchCommand)
@input_argument("inputs", nargs=-1)
@output_option
@field_options(AnnotateConfig, "pool")
@reference_option
@field_options(AnnotateConfig, "generators", "skip_missing", "labels")
@seed_option
@judge_options(
    max_cost_help="The run refuses to start, or stops asking, before it would spend more.",
    both_orders_help="A pair costs two requests.",
)
@field_options(
    AnnotateConfig,
    "assign_by",
    "estimate",
    "concurrency",
    "timeout",
    "max_retries",
    "max_reply_bytes",
    "retry_failed",
)
@field_options(BatchConfig)
@shared_option("device")  # of the local and reward-model judges
@field_options(AnnotateConfig, "progress", "list_pools")
@on_error_option
@split_option
@common_options
def cli(
    inputs,
    output,
    pool,
    reference,
    generators,
    skip_missing,
    labels,
    seed,
    flip_rate,
    assign_by,
    both_orders,
    models,
    cache_path,
    no_cache,
    max_cost,
    estimate,
    prices,
    concurrency,
    timeout,
    max_retries,
    batch,
    batch_mode,
    batch_wait,
    batch_fallback,
    ledger,
    max_reply_bytes,
    retry_failed,
    device,
    progress,
    list_pools,
) -> None:
    """Judge pairs of outputs and write preference records (1: output_1 better, 2: output_2, 1.5: tie,
    null: no verdict, with preference_reason).

    Each INPUT file (default: stdin) holds pair records (output_1, output_2), or output records
    where consecutive outputs for the same instruction form a pair (farm-sample -n 2), or, with
    --reference, output records to compare with the reference. Several files are annotated as one
    run (pairs never span two files): a nightly evaluation passes every checkpoint's outputs and
    pays only for pairs the cache has not seen. Example:

        farm-sample sft/ prompts.jsonl -n 2 | farm-annotate --pool sim_ann > prefs.jsonl
    """
    from farmkit.annotate import pools as pool_module

    if list_pools:
        for name in pool_module.shipped_pools():
            records_stdout().write(orjson.dumps(pool_module.load_pool(name).listing()) + b"\n")
        return
    cache = verdict_cache(cache_path, no_cache)
    if skip_missing and not reference:
        raise click.UsageError(
            "--skip-missing skips records the --reference lacks; give --reference"
        )
    if labels and pool:
        raise click.UsageError("--labels replaces the pool; leave --pool out")
    chosen = (
        pool_module.pool_from_dict(
            {
                "name": "labels",
                "description": f"labels from {labels}",
                "judges": [{"name": "file", "backend": "file", "path": labels}],
            },
            "--labels",
        )
        if labels
        else pool_module.load_pool(pool or ("sim_eval" if reference else "sim_ann"))
    )
    chosen = chosen.with_models(list(models))
    for name, value in (
        ("concurrency", concurrency),
        ("timeout", timeout),
        ("max_retries", max_retries),
        ("max_reply_bytes", max_reply_bytes),
    ):
        if value is not None:
            chosen.settings[name] = value
    if flip_rate is not None:
        chosen.flip_rate = flip_rate
    if reference and chosen.flip_rate > 0:
        logging.getLogger("farmkit").warning(
            "farm-annotate: pool %s adds label noise (flip rate %g) to an evaluation against --reference, which blurs "
            "win rates; evaluate with sim_eval (or sim_eval_offline), or pass --flip-rate 0",
            chosen.name,
            chosen.flip_rate,
        )

    from farmkit.annotate.pairs import read_items
    from farmkit.annotate.run import Run

    # everything is read and checked before anything is asked
    items = read_items(inputs or ("-",), reference, generators, skip_missing)
    if not items:
        return
    with Run(
        chosen,
        seed=seed,
        both_orders=both_orders,
        cache_path=cache,
        prices_path=prices,
        max_cost=max_cost,
        device=device,
        show_progress=progress,
        assign_by=assign_by,
        batch=BatchConfig(batch, batch_mode, batch_wait, batch_fallback, ledger),
        retry_failed=retry_failed,
    ) as run:
        if estimate:
            records_stdout().write(orjson.dumps(run.estimate(items)) + b"\n")
            return

        def write(records) -> None:
            with RecordWriter(output) as writer:
                writer.write_all(records)

        status = run.annotate(items, write)
    if status:
        raise SystemExit(status)


main = entry_point(cli)

if __name__ == "__main__":
    main()
