"""farm-plot: figures from what the other tools leave behind: a win-rate history, training curves,
reward over-optimization."""

from __future__ import annotations

import click

from farmkit.cli import common_options, entry_point, field_options, figure_output_option, log
from farmkit.core.io import FarmError, RecordWriter
from farmkit.evaluate.plots import CurvesPlot, HistoryPlot, OveroptPlot


@click.group(name="farm-plot")
def cli():
    """Draw a PNG from records the other tools write. Each subcommand has its own --help.

    \b
    farm-plot history winrates.jsonl --generator ppo -o ppo_over_time.png
    farm-plot curves runs/rm runs/dpo runs/ppo -o curves.png
    farm-plot overopt leaderboard_gold.jsonl bon_pool.jsonl ppo_pool.jsonl --ppo-run pool=ppo_pool -o overopt.png
    """


@cli.command(short_help="A model's win rate over time, from a farm-winrate --history file.")
@click.argument("history", type=click.Path(allow_dash=True, dir_okay=False))
@field_options(HistoryPlot)
@figure_output_option
@common_options
def history(history, generators, length_controlled, output):
    """A model's win rate over time, with its interval as a band, from a `farm-winrate --history` file
    (one line per model and reference)."""
    from farmkit.evaluate import history as win_rate_history
    from farmkit.evaluate.plots import win_rate_history as draw

    entries = win_rate_history.read(history)
    if not entries:
        log.warning(f"farm-plot: {history} holds no entries; nothing drawn")
        return
    draw(
        output,
        entries,
        generators,
        "length_controlled_win_rate" if length_controlled else "win_rate",
    )


@cli.command(short_help="Every numeric metric of training runs against step.")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@field_options(CurvesPlot)
@figure_output_option
@common_options
def curves(runs, fields, x, output):
    """Training curves: every numeric field of each run's metrics.jsonl against step (or --x), one
    panel per field and one line per run. RUNS are model folders (PPO's, RLOO's, GRPO's and online
    DPO's: their -checkpoints folder is looked in too) or metrics files (farm-bon --metrics)."""
    from farmkit.core.runs import read_metrics, run_names
    from farmkit.evaluate.plots import training_curves

    metrics = {
        name: read_metrics(run) for name, run in zip(run_names(list(runs)), runs, strict=True)
    }
    if not any(metrics.values()):
        log.warning("farm-plot: the runs have no metrics; nothing drawn")
        return
    if x != "step" and not any(x in row for rows in metrics.values() for row in rows):
        raise FarmError(f"--x {x}: no run has that metric")
    training_curves(output, metrics, fields, x)


@cli.command(short_help="Gold win rate against surrogate reward, KL and n (best-of-n, PPO).")
@click.argument("leaderboard", type=click.Path(allow_dash=True, dir_okay=False))
@click.argument("outputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@field_options(OveroptPlot)
@figure_output_option
@common_options
def overopt(leaderboard, outputs, scored, ppo_runs, labels, output):
    """Reward over-optimization: the gold win rate of each best-of-n and PPO system (LEADERBOARD:
    farm-winrate over gold annotations) against the mean surrogate reward of its OUTPUTS (reward
    records, systems named RM-best-of-N and ppo-RM-step-K), against the KL to the SFT policy, and
    against n. Prints the rows as JSONL: per system its surrogate and gold reward, gold win rate and
    KL; paired bootstrap comparisons of the best-of-n systems; each --scored model's agreement with gold."""
    # a record without its gold reward is judged by the offline simulation's gold oracle
    from farmkit.annotate.oracle import gold_reward
    from farmkit.core.runs import read_metrics
    from farmkit.evaluate import overopt as study
    from farmkit.evaluate.plots import over_optimization

    answers = study.load_outputs(list(outputs), gold_reward)
    rows = study.curves(
        leaderboard, answers, {model: read_metrics(run) for model, run in ppo_runs.items()}
    )
    if not rows:
        raise FarmError(
            f"{leaderboard}: no best-of-n or PPO systems with outputs in {', '.join(outputs)}"
        )
    over_optimization(output, rows, labels)
    with RecordWriter("-") as writer:
        writer.write_all(rows)
        writer.write_all(study.comparisons(answers))
        writer.write_all(study.agreement(path, gold_reward) for path in scored)


main = entry_point(cli)

if __name__ == "__main__":
    main()
