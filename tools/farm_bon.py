"""farm-bon: best-of-n sampling with a reward model, for one n or a sweep of n from one sampling pass."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    entry_point,
    input_argument,
    output_option,
    provenance,
    seed_option,
    stamp,
)
from farmkit.io import RecordWriter, read_records

log = logging.getLogger("farmkit")


def parse_ns(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        ns = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a number or a comma-separated list such as 1,4,16,64") from None
    if not ns or min(ns) < 1:
        raise click.BadParameter(f"{value!r}: every n must be at least 1")
    return ns


@click.command(name="farm-bon")
@click.argument("policy")
@click.argument("rm")
@input_argument("prompts")
@output_option
@click.option("-n", "ns", default="16", show_default=True, callback=parse_ns, help="Samples per prompt, or a sweep (1,4,16,64): best of the first n for each, from one pass.")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--max-new-tokens", default=300, show_default=True, type=click.IntRange(min=1))
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(min=1), help="Sequences per generation pass (and texts per scoring pass).")
@click.option("--template", type=click.Choice(["auto", "chat", "alpaca"]), default="auto", show_default=True, help="The policy's prompt template (auto: its own).")
@click.option("--generator", default=None, help="Name of the policy in generator fields (default: its folder name); '-best-of-N' is appended.")
@click.option("--all-samples", type=click.Path(dir_okay=False, allow_dash=False), help="Also write every scored sample to this file (output records with reward).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, ...")
@seed_option
@common_options
def cli(policy, rm, prompts, output, ns, temperature, top_p, max_new_tokens, batch_size, template, generator, all_samples, device, seed):
    """Sample n outputs per prompt of PROMPTS from POLICY, score them with the reward model RM and
    write the best as an output record (reward, best_of, generator "<policy>-best-of-<n>"). With a
    sweep, the records of every n follow each other in one stream, smallest n first."""
    records = list(read_records(prompts, "instruction"))
    if not records:
        return
    from farmkit.methods.bon import (
        BestOfNConfig,
        all_sample_records,
        best_records,
        mean_rewards,
        sample_and_score,
    )
    from farmkit.methods.reward import RewardScorer
    from farmkit.sampling import generator_name

    config = BestOfNConfig(ns=ns, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           score_batch_size=batch_size, template=template, seed=seed)
    scorer = RewardScorer(rm, device=device, batch_size=batch_size)
    scored = sample_and_score(policy, scorer, records, config, device=device)
    name = generator or generator_name(policy)
    info = provenance("farm-bon", seed, policy=str(policy), reward_model=scorer.path, n=list(config.ns), temperature=temperature,
                      top_p=top_p, max_new_tokens=max_new_tokens, template=template)
    if all_samples:
        with RecordWriter(all_samples) as writer:
            for record in all_sample_records(scored, name, scorer.name, config):
                writer.write(stamp(record, "farm-bon", info))
    with RecordWriter(output) as writer:
        for record in best_records(scored, name, scorer.name, config):
            writer.write(stamp(record, "farm-bon", info))
    for n, reward in mean_rewards(scored, config.ns).items():
        log.info("best of %d: mean reward %.4f over %d prompts", n, reward, len(scored))


main = entry_point(cli)

if __name__ == "__main__":
    main()
