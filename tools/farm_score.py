"""farm-score: add a reward model's score to output records."""

from __future__ import annotations

import click

from farmkit.cli import (
    common_options,
    entry_point,
    input_argument,
    output_option,
    progress,
    provenance,
    stamp,
)
from farmkit.io import RecordWriter, read_records


@click.command(name="farm-score")
@click.argument("rm")
@input_argument("outputs")
@output_option
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(min=1), help="Texts per forward pass.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, ...")
@common_options
def cli(rm, outputs, output, batch_size, device):
    """Score OUTPUTS (output records) with the reward model RM: each record gets `reward` and
    `reward_model`, in the input order. The text scored is formatted like the policy's prompt."""
    records = list(read_records(outputs, "output"))
    if not records:
        return
    from farmkit.methods.reward import RewardScorer

    scorer = RewardScorer(rm, device=device, batch_size=batch_size)
    with progress(total=len(records), desc="scoring") as bar:
        rewards = scorer.score([(r["instruction"], r.get("input"), r["output"]) for r in records], progress=bar)
    info = provenance("farm-score", reward_model=scorer.path)
    with RecordWriter(output) as writer:
        for record, reward in zip(records, rewards, strict=True):
            record["reward"] = reward
            record["reward_model"] = scorer.name
            writer.write(stamp(record, "farm-score", info))


main = entry_point(cli)

if __name__ == "__main__":
    main()
