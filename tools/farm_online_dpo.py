"""farm-online-dpo: online DPO, a farm-annotate pool labelling fresh pairs from the policy each round."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    config_options,
    entry_point,
    field_options,
    input_argument,
    judge_options,
    output_dir_option,
    pool_labeller,
    resolve_config,
    verdict_cache,
)
from farmkit.core.io import FarmError, display_name, read_records
from farmkit.methods.online_dpo import Annotation, OnlineDPOConfig

log = logging.getLogger("farmkit")


@click.command(name="farm-online-dpo")
@click.argument("sft")
@input_argument("prompts")
@output_dir_option
# a rerun of the same command is what resumes online DPO: its rounds are the checkpoints
@config_options(OnlineDPOConfig, leave_out=("save_steps", "resume"))
@field_options(Annotation, "pool")
@judge_options(
    max_cost_help="It covers the whole run (every round, reruns included): a round gets only the "
    "pairs the rest pays for, and the run stops there.",
    both_orders_help="Ties are left out of DPO.",
)
@common_options
def cli(
    sft: str,
    prompts: str,
    output: str,
    config_file: str | None,
    pool: str,
    flip_rate: float | None,
    both_orders: bool,
    models: tuple[str, ...],
    cache_path: str | None,
    no_cache: bool,
    max_cost: float | None,
    prices: str | None,
    **values,
) -> None:
    """Online DPO from SFT on PROMPTS (instruction records); write the policy to -o DIR, the
    rounds to DIR-checkpoints/.

    Each round samples two answers per prompt from the current policy (--temperature), has
    --pool label the pairs through farm-annotate's engine (cache, prices, --max-cost), writes the
    labels to DIR-checkpoints/round_<r>/preferences.jsonl, and trains DPO steps on them from the
    current policy, the SFT model staying the frozen reference. metrics.jsonl has a line a round
    (labels used, annotator requests, cache hits, price, DPO loss and reward margin; with --gold
    the gold judge's figures); meta.json the budget. Rerun the same command after an
    interruption: finished rounds and saved labels are reused and the cache answers what was
    asked, so nothing is paid twice.

    \b
    Example:
      farm-online-dpo sft/ unlabeled.jsonl -o odpo/ --pool sim_ann_offline \\
          --rounds 4 --prompts-per-round 128 --max-new-tokens 128 --max-cost 5
    """
    cache = verdict_cache(cache_path, no_cache)
    config = resolve_config(OnlineDPOConfig, config_file, values)
    records = list(read_records(prompts, "instruction"))
    if not records:
        raise FarmError(f"{display_name(prompts)}: no prompts to train on")
    from farmkit.annotate.run import gold_pool
    from farmkit.methods.online_dpo import Annotation, train_online_dpo

    annotation = Annotation(
        pool=pool,
        cache=cache,
        max_cost=max_cost,
        prices=prices,
        flip_rate=flip_rate,
        both_orders=both_orders,
        models=models,
        device=config.device,
    )
    # the budget is the run's (annotation.max_cost): each round gets what is left of it
    label = pool_labeller(
        pool,
        flip_rate=flip_rate,
        both_orders=both_orders,
        models=models,
        cache_path=cache_path,
        no_cache=no_cache,
        max_cost=None,
        prices=prices,
        device=config.device,
    )
    budget = train_online_dpo(
        sft,
        records,
        output,
        config,
        annotation,
        label,
        seed=config.seed,
        inputs=[prompts],
        gold_pools=gold_pool,
    )
    log.info(
        "%d rounds, %d labels used (%d trained on), %d annotator requests, %d cache hits, "
        "$%.4f spent%s",
        budget["rounds"],
        budget["labels_used"],
        budget["pairs_trained"],
        budget["annotator_requests"],
        budget["cache_hits"],
        budget["spent"],
        f" (stopped: {budget['stopped']})" if budget["stopped"] else "",
    )
    log.info("wrote %s", output)


main = entry_point(cli)

if __name__ == "__main__":
    main()
