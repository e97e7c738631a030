"""farm-score: add a reward model's score to output records."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    common_options,
    entry_point,
    input_argument,
    output_option,
    shared_option,
)
from farmkit.core import distributed
from farmkit.core.console import progress
from farmkit.core.io import RecordWriter, read_records
from farmkit.core.provenance import provenance, stamp


@click.command(name="farm-score")
@click.argument("rm")
@input_argument("outputs")
@output_option
@shared_option("reward_batch_size", aliases=("--batch-size",), dest="batch_size")
@shared_option("device")
@common_options
def cli(rm, outputs, output, batch_size, device):
    """Score OUTPUTS (output records) with the reward model RM: each record gets `reward` and
    `reward_model`, in the input order. The text scored is formatted like the policy's prompt."""
    if distributed.launched() and outputs == "-":
        raise click.UsageError(
            "under a launcher every process reads the outputs: give a file, not stdin"
        )
    records = list(read_records(outputs, "output"))
    if not records:
        return
    from farmkit.lm.models import check_reward_model

    check_reward_model(rm)  # before any work: any other model scores at random
    from farmkit.train.scoring import RewardScorer

    scorer = RewardScorer(rm, device=device, batch_size=batch_size)
    # under a launcher each process scores every world_size-th record; the main process writes them all
    mine = list(range(distributed.rank(), len(records), distributed.world_size()))
    with progress(total=len(mine), desc="scoring") as bar:
        scores = scorer.score(
            [
                (records[i]["instruction"], records[i].get("input"), records[i]["output"])
                for i in mine
            ],
            progress=bar,
            # an answer cut off at the token limit (farm-bon records say so) is scored without its end
            # token, as the method that chose it scored it
            finished=[records[i].get("finished") is not False for i in mine],
        )
    shares = distributed.gather(list(zip(mine, scores, strict=True)))
    if shares is None:
        return
    logging.getLogger("farmkit").debug(
        "farm-score: sharded over %d processes (records per process: %s)",
        len(shares),
        ", ".join(str(len(share)) for share in shares),
    )
    rewards = [0.0] * len(records)
    for index, reward in (pair for share in shares for pair in share):
        rewards[index] = reward
    info = provenance("farm-score", reward_model=scorer.path)
    with RecordWriter(output) as writer:
        for record, reward in zip(records, rewards, strict=True):
            record["reward"] = reward
            record["reward_model"] = scorer.name
            writer.write(stamp(record, "farm-score", info))


main = entry_point(cli)

if __name__ == "__main__":
    main()
