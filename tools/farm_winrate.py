"""farm-winrate: a leaderboard of win rates against a reference, from preference records."""

from __future__ import annotations

import sys

import click

from farmkit.cli import common_options, entry_point, log, provenance, seed_option, stamp
from farmkit.io import FarmError, RecordWriter, atomic_path
from farmkit.winrate import TABLE_COLUMNS, WinrateTable, render

FORMATS = ("jsonl", "table", "csv", "markdown")


@click.command(name="farm-winrate")
@click.argument("prefs", nargs=-1, type=click.Path(allow_dash=True, dir_okay=False))
@click.option("--reference", metavar="NAME", help="The reference system: records are oriented so that it is "
              "in position 1 (records with it in position 2 are swapped); records without it are skipped.")
@click.option("--swap", is_flag=True, help="The model is in position 1 and the reference in position 2 in every record.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True,
              help="jsonl: leaderboard rows (records); table, csv, markdown: for people and spreadsheets.")
@click.option("--bootstrap", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Add a percentile bootstrap confidence interval (ci_low, ci_high) from N resamples of the items.")
@click.option("--confidence", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95,
              show_default=True, help="Level of the bootstrap interval.")
@click.option("--compare", nargs=2, multiple=True, metavar="MODEL_A MODEL_B",
              help="Instead of the leaderboard, compare two models on the items both were judged on: "
                   "difference of win rates, its paired standard error and p-value. Repeatable.")
@click.option("--no-length-control", is_flag=True, help="Skip the length-controlled win rate (a little faster).")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also draw the win rates with their intervals as a PNG bar chart.")
@click.option("-o", "--output", default="-", type=click.Path(allow_dash=True, dir_okay=False),
              help="Write to this file (atomically). Default: stdout.")
@seed_option
@common_options
def cli(prefs, reference, swap, fmt, bootstrap, confidence, compare, no_length_control, plot, output, seed):
    """Rank the models in PREFS (preference records; files, `-` for stdin, .gz, AlpacaEval's JSON
    annotations) by their win rate against the reference, as AlpacaEval computes it: ties and the
    legacy 0 count half, fractional preferences count fractionally, null verdicts are dropped and
    counted (n_dropped). By default the model is generator_2 and its reference generator_1.

    Besides AlpacaEval's columns each row has a length-controlled win rate (a logistic regression
    of the verdict on the log length ratio, read at equal lengths; see farmkit/winrate.py).

    \b
    farm-winrate prefs.jsonl --format table
    farm-winrate annotations.json --reference text_davinci_003 --bootstrap 1000 --plot board.png
    farm-winrate prefs.jsonl --compare ppo sft
    """
    if reference and swap:
        raise click.UsageError("--reference orients each record by itself; it cannot be combined with --swap")
    table = WinrateTable(reference=reference, swap=swap, bootstrap=bootstrap > 0,
                         length_control=not no_length_control, compare=compare)
    for path in prefs or ("-",):
        table.add_file(path)
    if table.skipped:
        log.warning(f"farm-winrate: skipped {table.skipped} records that do not involve the reference {reference!r}")
    if compare:
        known = sorted({model for _, model in table.tallies})
        for model in {name for pair in compare for name in pair}:
            if not table.items.get(model):
                raise FarmError(f"--compare: no verdicts on {model!r} in the input; the models are {', '.join(known)}")
        rows = [table.comparison(a, b) for a, b in compare]
        columns = None
    else:
        rows = table.rows(seed=seed, resamples=bootstrap, confidence=confidence)
        columns = TABLE_COLUMNS
        dropped = sum(row["n_dropped"] for row in rows)
        if dropped:
            log.warning(f"farm-winrate: {dropped} null verdicts dropped (see n_dropped)")
    info = provenance("farm-winrate", seed if bootstrap else None, reference=reference, swap=swap or None,
                      bootstrap=bootstrap or None, confidence=confidence if bootstrap else None)
    for row in rows:
        stamp(row, "farm-winrate", info)
    if plot and rows and not compare:
        from farmkit.plots import bar_chart

        several = len({row["reference"] for row in rows}) > 1
        labels = [f"{row['generator']} (vs {row['reference']})" if several else row["generator"] for row in rows]
        bar_chart(plot, labels, [row["win_rate"] for row in rows],
                  lows=[row.get("ci_low", _minus_se(row)) for row in rows],
                  highs=[row.get("ci_high", _plus_se(row)) for row in rows],
                  ylabel="win rate (%)", title=f"Win rate against {_references(rows)}", reference_line=50.0)
    if fmt == "jsonl":
        with RecordWriter(output) as writer:
            writer.write_all(rows)
        return
    text = render(rows, fmt, columns)
    if output == "-":
        sys.stdout.write(text)
    else:
        with atomic_path(output) as tmp:
            tmp.write_text(text, encoding="utf-8")


def _minus_se(row: dict) -> float | None:
    # without a bootstrap interval the bars show the normal 95% interval
    return None if row["standard_error"] is None else row["win_rate"] - 1.96 * row["standard_error"]


def _plus_se(row: dict) -> float | None:
    return None if row["standard_error"] is None else row["win_rate"] + 1.96 * row["standard_error"]


def _references(rows: list[dict]) -> str:
    return ", ".join(sorted({row["reference"] for row in rows}))


main = entry_point(cli)

if __name__ == "__main__":
    main()
