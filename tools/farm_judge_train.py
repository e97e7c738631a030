"""farm-judge-train: learn a judge (a Bradley-Terry reward over n-grams and hand features) from real
preference pairs, validated with whole systems held out."""

from __future__ import annotations

import logging

import click

from farmkit.annotate.learned import JudgeConfig
from farmkit.annotate.validation import JudgeTrainConfig, read_pairs, train_judge
from farmkit.cli import (
    common_options,
    entry_point,
    field_options,
    input_argument,
    model_dir_option,
    seed_option,
    tool_config,
)
from farmkit.core.io import FarmError, display_name

log = logging.getLogger("farmkit")

ALPACA_EVAL_LICENSE = "CC BY-NC 4.0"


@click.command(name="farm-judge-train")
@input_argument("prefs")
@model_dir_option("output_dir")
@field_options(JudgeTrainConfig, "alpaca_eval", "leaderboard", "human", "folds")
@field_options(JudgeConfig, "features", "l2", "buckets")
@field_options(JudgeTrainConfig, "data_license", "source")
@seed_option
@common_options
def cli(
    prefs,
    output_dir,
    alpaca_eval,
    leaderboard,
    human,
    folds,
    data_license,
    source,
    seed,
    **values,
):
    """Learn a judge from PREFS: a reward r(x, y), linear in hashed word 1-2-grams of the answer and
    13 hand features, fitted as Bradley-Terry on the pairs (soft labels kept, null verdicts skipped).
    PREFS is any preference file the tools read (farmkit records, TRL rows) or AlpacaEval's compact
    annotations with --alpaca-eval FOLDER. Writes DIR/meta.json (data, sizes, held-out figures, license) and
    DIR/weights.npz; `reward: DIR` in an oracle judge of a pool uses it."""
    config = tool_config(JudgeConfig, values)
    name = display_name(prefs)
    pairs, counts = read_pairs(prefs, alpaca_eval)
    if not pairs:
        raise FarmError(f"{name}: no usable preferences to learn from ({counts})")
    skipped = {k: v for k, v in counts.items() if k != "used" and v}
    if skipped:
        log.info("%s: left out %s", name, ", ".join(f"{v} {k}" for k, v in skipped.items()))
    systems = len({p.system for p in pairs})
    if 1 < folds and systems < folds:
        raise FarmError(
            f"{name}: holding systems out {folds} ways needs {folds} systems; found {systems} "
            "(pairs name their system in generator_2); use --folds 0 to skip validation"
        )
    data = {
        "file": name,
        "source": source or ("AlpacaEval (tatsu-lab/alpaca_eval)" if alpaca_eval else None),
        "license": data_license or (ALPACA_EVAL_LICENSE if alpaca_eval else "unknown"),
        "counts": counts,
    }
    meta = train_judge(
        pairs,
        output_dir,
        config,
        folds=folds,
        seed=seed,
        leaderboard=leaderboard,
        human=human,
        data=data,
        inputs=[prefs] if prefs != "-" else [],
    )
    for part, figures in meta["validation"].items():
        log.info("%s: %s", part, figures)
    log.info("wrote %s (%d pairs, %d systems)", output_dir, len(pairs), systems)


main = entry_point(cli)

if __name__ == "__main__":
    main()
