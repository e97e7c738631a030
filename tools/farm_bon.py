"""farm-bon: best-of-n sampling with a reward model, for one n or a sweep of n from one sampling pass."""

from __future__ import annotations

import dataclasses
import logging
import time

import click

from farmkit.cli import (
    SAMPLE_COUNTS,
    common_options,
    decoding_options,
    entry_point,
    field_options,
    input_argument,
    long_prompts_option,
    model_options,
    output_option,
    seed_option,
    shared_option,
)
from farmkit.core import distributed
from farmkit.core.io import FarmError, RecordWriter, display_name, read_numbered
from farmkit.core.provenance import provenance, stamp
from farmkit.methods.bon import BestOfNOutputs

log = logging.getLogger("farmkit")


@click.command(name="farm-bon")
@click.argument("policy")
@click.argument("rm")
@input_argument("prompts")
@output_option
@shared_option(
    "num_samples",
    "16",
    dest="ns",
    param_type=SAMPLE_COUNTS,
    more_help="A sweep (1,4,16,64) keeps the best of the first n for each n, from one pass.",
)
@decoding_options(
    temperature=1.0,
    generation_batch_size=16,
    batch_aliases=("--batch-size",),
    batch_dest="batch_size",
)
@shared_option("reward_batch_size")
@model_options
@field_options(BestOfNOutputs)
@shared_option("gold")
@shared_option("gold_prompts")
@shared_option("gold_size")
@long_prompts_option
@seed_option
@common_options
def cli(
    policy,
    rm,
    prompts,
    output,
    ns,
    temperature,
    top_p,
    max_new_tokens,
    batch_size,
    reward_batch_size,
    template,
    device,
    generator,
    all_samples,
    metrics_path,
    gold,
    gold_prompts,
    gold_size,
    long_prompts,
    seed,
):
    """Sample n outputs per prompt of PROMPTS from POLICY, score them with the reward model RM and
    write the best as an output record (reward, best_of, generator "<policy>-best-of-<n>"). With a
    sweep, the records of every n follow each other in one stream, smallest n first.

    The budget (labels used through RM, read from its meta.json; tokens sampled; wall time) is
    summed up on stderr and, per n, in the --metrics rows. With --gold, each n's best outputs to the
    gold prompts are judged against POLICY's own answers (one sample each, another seed)."""
    if distributed.launched() and prompts == "-":
        raise click.UsageError(
            "under a launcher every process reads the prompts: give a file, not stdin"
        )
    numbered = read_numbered(prompts, "instruction")
    if not numbered:
        return
    from farmkit.lm.sampling import screen_long_prompts

    records = screen_long_prompts(policy, numbered, template, max_new_tokens, long_prompts)
    if not records:
        raise FarmError(f"{display_name(prompts)}: every prompt is over-long; nothing to sample")
    from farmkit.lm.models import check_reward_model

    check_reward_model(rm)  # before any work: any other model scores at random
    from farmkit.annotate.run import gold_pool
    from farmkit.core.seeds import derive_seed
    from farmkit.lm.sampling import generator_name
    from farmkit.methods.bon import (
        BestOfNConfig,
        ScoredPrompt,
        all_sample_records,
        best_records,
        sample_and_score,
        sweep_rows,
    )
    from farmkit.train.budget import reward_model_labels
    from farmkit.train.gold import GoldRequest, describe, make_gold, prompt_key
    from farmkit.train.metrics import write_metrics
    from farmkit.train.scoring import RewardScorer

    try:
        config = BestOfNConfig(
            ns=ns,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            score_batch_size=reward_batch_size,
            template=template,
            seed=seed,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    started = time.perf_counter()
    request = GoldRequest(
        gold, gold_prompts, gold_size, tool="farm-bon", pools=gold_pool, **config.gold_sampling()
    )
    judge = make_gold(request, records, policy, device=device)
    scorer = RewardScorer(rm, device=device, batch_size=reward_batch_size)
    # under a launcher each process samples and scores its share; the main process alone writes
    scored = sample_and_score(policy, scorer, records, config, device=device)
    if not distributed.is_main():
        return
    gold_scored = []
    if judge is not None:
        by_prompt: dict[str, ScoredPrompt] = {}
        for prompt in scored:
            by_prompt.setdefault(prompt_key(prompt.record), prompt)
        keys = [prompt_key(record) for record in judge.prompts]
        if all(key in by_prompt for key in keys):  # the gold prompts are among PROMPTS: reuse
            gold_scored = [by_prompt[key] for key in keys]
        else:  # prompts of their own: a sampling pass of their own
            gold_config = dataclasses.replace(config, seed=derive_seed(seed, "gold answers"))
            gold_scored = sample_and_score(
                policy, scorer, judge.prompts, gold_config, device=device
            )
    name = generator or generator_name(policy)
    info = provenance(
        "farm-bon",
        seed,
        policy=str(policy),
        reward_model=scorer.path,
        n=list(config.ns),
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        template=template,
    )
    if all_samples:
        with RecordWriter(all_samples) as writer:
            for record in all_sample_records(scored, name, scorer.name, config):
                writer.write(stamp(record, "farm-bon", info))
    with RecordWriter(output) as writer:
        for record in best_records(scored, name, scorer.name, config):
            writer.write(stamp(record, "farm-bon", info))
    labels = reward_model_labels(rm)
    rows = sweep_rows(scored, config.ns, labels, time.perf_counter() - started, judge, gold_scored)
    for row in rows:
        log.info(
            "best of %d: mean reward %.4f over %d prompts%s",
            row["n"],
            row["reward"],
            len(scored),
            f"; gold: {describe(row)}" if judge is not None else "",
        )
    if metrics_path:
        write_metrics(metrics_path, rows)
    log.info(
        "budget: %s labels used (through the reward model), %d tokens sampled, 0 training "
        "tokens, %.1f s%s",
        "?" if labels is None else labels,
        rows[-1]["tokens_sampled"],
        time.perf_counter() - started,
        f" (gold judge: {judge.tokens_sampled} tokens sampled)" if judge is not None else "",
    )


main = entry_point(cli)

if __name__ == "__main__":
    main()
