"""farm-judge-train: learn a judge (a Bradley-Terry reward over n-grams and hand features) from real
preference pairs, validated with whole systems held out."""

from __future__ import annotations

import logging

import click

from farmkit.cli import (
    FiniteFloat,
    WholeNumber,
    common_options,
    entry_point,
    input_argument,
    model_dir_option,
    seed_option,
)
from farmkit.core.io import FarmError, display_name

log = logging.getLogger("farmkit")

ALPACA_EVAL_LICENSE = "CC BY-NC 4.0"


@click.command(name="farm-judge-train")
@input_argument("prefs")
@model_dir_option("output_dir")
@click.option(
    "--alpaca-eval",
    "alpaca_eval",
    type=click.Path(exists=True, file_okay=False),
    help="AlpacaEval's data folder (eval_set.jsonl, model_outputs/): joins compact AlpacaEval annotations to the outputs they judged.",
)
@click.option(
    "--leaderboard",
    type=click.Path(exists=True, dir_okay=False),
    help="The published leaderboard of the judge PREFS come from (AlpacaEval CSV or farm-winrate rows): held-out systems' predicted win rates are ranked against it (Spearman).",
)
@click.option(
    "--human",
    type=click.Path(exists=True, dir_okay=False),
    help="Pairs with three human labels (PandaLM's test set JSON): agreement with the human majority, beside length alone and the heuristic gold.",
)
@click.option(
    "--folds",
    type=WholeNumber(min=0),
    default=5,
    show_default=True,
    help="Validate holding systems out this many ways (k-fold over generator_2, never over rows); 0 or 1 skips validation.",
)
@click.option(
    "--features",
    type=click.Choice(["ngrams+hand", "hand", "length"]),
    default="ngrams+hand",
    show_default=True,
    help="Hashed word 1-2-grams plus hand features, the hand features alone, or length alone (a baseline).",
)
@click.option(
    "--l2", type=FiniteFloat(min=0), default=3e-6, show_default=True, help="Ridge penalty."
)
@click.option(
    "--buckets",
    type=WholeNumber(min=2),
    default=2**18,
    show_default=True,
    help="Hashed n-gram features (a power of two); weights.npz holds two bytes per bucket.",
)
@click.option(
    "--license",
    "data_license",
    help="License of PREFS, recorded in meta.json (default: CC BY-NC 4.0 for AlpacaEval annotations, else unknown).",
)
@click.option("--source", help="Where PREFS come from, recorded in meta.json.")
@seed_option
@common_options
def cli(
    prefs,
    output_dir,
    alpaca_eval,
    leaderboard,
    human,
    folds,
    features,
    l2,
    buckets,
    data_license,
    source,
    seed,
):
    """Learn a judge from PREFS: a reward r(x, y), linear in hashed word 1-2-grams of the answer and
    13 hand features, fitted as Bradley-Terry on the pairs (soft labels kept, null verdicts skipped).
    PREFS is any preference file the tools read (farmkit records, TRL rows) or AlpacaEval's compact
    annotations with --alpaca-eval FOLDER. Writes DIR/meta.json (data, sizes, held-out figures, license) and
    DIR/weights.npz; `reward: DIR` in an oracle judge of a pool uses it."""
    from farmkit.annotate.validation import read_pairs, train_judge

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
        judge_config(features, l2, buckets),
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


def judge_config(features: str, l2: float, buckets: int):
    from farmkit.annotate.learned import JudgeConfig

    try:
        return JudgeConfig(features=features, l2=l2, buckets=buckets)
    except ValueError as error:
        raise click.UsageError(str(error)) from None


main = entry_point(cli)

if __name__ == "__main__":
    main()
