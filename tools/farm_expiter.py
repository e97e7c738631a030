"""farm-expiter: expert iteration (best-of-n with a reward model, then SFT on the winners)."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    decoding_options,
    entry_point,
    field_options,
    input_argument,
    long_prompts_option,
    model_dir_option,
    model_options,
    seed_option,
    shared_option,
    tool_config,
)
from farmkit.core import distributed
from farmkit.core.io import FarmError, display_name, read_numbered
from farmkit.methods.expiter import SFT_ROUND_FIELDS, ExpertIterationConfig
from farmkit.methods.sft import SFTConfig

log = logging.getLogger("farmkit")


@click.command(name="farm-expiter")
@click.argument("policy")
@click.argument("rm")
@input_argument("prompts")
@model_dir_option("output_dir")  # the last round's policy; its meta.json has every round
@shared_option("num_samples", 16, dest="n", more_help="The best one becomes a demonstration.")
@field_options(ExpertIterationConfig)
@decoding_options(
    temperature=1.0,
    generation_batch_size=16,
    batch_aliases=("--sample-batch-size",),
    batch_dest="sample_batch_size",
)
@shared_option("rollout_backend")
@shared_option("reward_batch_size")
@field_options(SFTConfig, *SFT_ROUND_FIELDS, defaults={"epochs": 1})
@model_options
@shared_option(
    "resume",
    more_help="Every round but the last is a checkpoint in DIR-checkpoints/ (removed when the run "
    "ends); from the newest complete round; with none (killed in its first round), the run starts "
    "from the beginning.",
)
@shared_option("report_to")
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
    output_dir,
    n,
    rounds,
    temperature,
    top_p,
    max_new_tokens,
    sample_batch_size,
    rollout_backend,
    reward_batch_size,
    template,
    device,
    resume,
    report_to,
    gold,
    gold_prompts,
    gold_size,
    long_prompts,
    seed,
    **sft_values,
):
    """Expert iteration: sample N outputs per prompt of PROMPTS from POLICY, keep the one the reward
    model RM scores highest, fine-tune POLICY on those winners; --rounds repeats it from the new
    policy. Writes the final policy to -o DIR; its meta.json has the run's budget (labels used
    through RM, tokens sampled, training tokens, wall time), and with --gold DIR/metrics.jsonl has
    each round's gold figures on the round's last row."""
    if distributed.launched() and prompts == "-":
        raise click.UsageError(
            "under a launcher every process reads the prompts: give a file, not stdin"
        )
    name = display_name(prompts)
    numbered = read_numbered(prompts, "instruction")
    if not numbered:
        raise FarmError(f"{name}: no prompts to run expert iteration on")
    from farmkit.lm.sampling import screen_long_prompts

    records = screen_long_prompts(policy, numbered, template, max_new_tokens, long_prompts)
    if not records:
        raise FarmError(f"{name}: every prompt is over-long; nothing to sample")
    from farmkit.lm.models import check_reward_model

    check_reward_model(rm)  # before any work: any other model scores at random
    from farmkit.methods.bon import BestOfNConfig
    from farmkit.methods.expiter import expert_iteration
    from farmkit.train.tracking import check

    check(report_to)
    from farmkit.lm.models import file_sha256

    try:
        sampling = BestOfNConfig(
            ns=(n,),
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            batch_size=sample_batch_size,
            score_batch_size=reward_batch_size,
            template=template,
            seed=seed,
            backend=rollout_backend,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sft_config = tool_config(
        SFTConfig,
        {
            **sft_values,
            "template": template,
            "device": device,
            "seed": seed,
            "report_to": report_to,
        },
    )
    from farmkit.annotate.run import gold_pool
    from farmkit.train.gold import GoldRequest, make_gold

    request = GoldRequest(
        gold,
        gold_prompts,
        gold_size,
        tool="farm-expiter",
        pools=gold_pool,
        **sampling.gold_sampling(),
    )
    judge = make_gold(request, records, policy, device=device)
    result = expert_iteration(
        policy,
        rm,
        records,
        output_dir,
        sampling,
        sft_config,
        rounds=rounds,
        meta_extra={"inputs": {name: file_sha256(prompts)}},
        device=device,
        gold=judge,
        resume=resume,
    )
    last = result["rounds"][-1]
    log.info(
        "wrote %s after %d round(s); last round: mean reward %.4f first sample, %.4f best of %d",
        output_dir,
        rounds,
        last["mean_reward_first_sample"],
        last[f"mean_reward_best_of_{n}"],
        n,
    )


main = entry_point(cli)

if __name__ == "__main__":
    main()
