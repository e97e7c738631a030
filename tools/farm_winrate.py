"""farm-winrate: a leaderboard of win rates against a reference, from preference records."""

from __future__ import annotations

from collections import Counter

import click

from farmkit.cli import (
    AliasedOption,
    FiniteFloat,
    WholeNumber,
    common_options,
    entry_point,
    log,
    on_error_option,
    provenance,
    seed_option,
    stamp,
)
from farmkit.core.io import FarmError
from farmkit.evaluate.boards import BOARD_FORMATS, write_board
from farmkit.evaluate.length_control import read_instruction_difficulty
from farmkit.evaluate.winrate import (
    SORT_BY,
    TABLE_COLUMNS,
    WinrateTable,
    item_key,
)


@click.command(name="farm-winrate")
@click.argument("prefs", nargs=-1, type=click.Path(allow_dash=True, dir_okay=False))
@click.option(
    "--reference-generator",
    "reference",
    cls=AliasedOption,
    aliases=("--reference",),
    metavar="NAME",
    help="The generator that is the reference (the name in generator_1/generator_2; farm-annotate "
    "--reference FILE puts it in position 1): records are oriented so that it is in position 1 "
    "(records with it in position 2 are swapped); records without it are skipped.",
)
@click.option(
    "--swap",
    is_flag=True,
    help="The model is in position 1 and the reference in position 2 in every record.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(tuple(BOARD_FORMATS)),
    default="jsonl",
    show_default=True,
    help="jsonl: leaderboard rows (records); table, csv, markdown: for people and spreadsheets; "
    "alpaca-eval: the CSV AlpacaEval publishes its leaderboards in (its column names and order, the "
    "model as the unnamed first column; one reference).",
)
@click.option(
    "--sort-by",
    type=click.Choice(tuple(SORT_BY)),
    default="win_rate",
    show_default=True,
    help="Order each reference's rows by the raw win rate or by the length-controlled one (lc), best first.",
)
@click.option(
    "--bootstrap",
    type=WholeNumber(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Add a percentile bootstrap confidence interval (ci_low, ci_high) from N resamples of the items.",
)
@click.option(
    "--confidence",
    type=FiniteFloat(0, 1, min_open=True, max_open=True),
    default=0.95,
    show_default=True,
    help="Level of the bootstrap interval.",
)
@click.option(
    "--compare",
    nargs=2,
    multiple=True,
    metavar="MODEL_A MODEL_B",
    help="Instead of the leaderboard, compare two models on the items both were judged on: "
    "difference of win rates, its paired standard error and p-value. Repeatable.",
)
@click.option(
    "--no-length-control",
    is_flag=True,
    help="Skip the length-controlled win rate (faster, and memory "
    "that does not grow with the records).",
)
@click.option(
    "--instruction-difficulty",
    "difficulty_file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Instruction difficulties for the length-controlled win rate (AlpacaEval's instruction_difficulty.csv, "
    "or records with instruction_difficulty and an id, instruction_index or instruction). Default: "
    "estimated from the input when it holds two models or more against a reference.",
)
@click.option(
    "--dedupe",
    is_flag=True,
    help="Count only the first verdict on each instruction per model and "
    "reference (repeats are reported either way).",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Also draw the win rates (and the length-controlled ones) "
    "with their intervals as a PNG bar chart.",
)
@click.option(
    "--history",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also append the rows to this JSONL "
    "history, stamped with the time, a run id and each input's SHA-256 (safe from concurrent runs); "
    "`farm-plot history FILE` draws it.",
)
@click.option(
    "-o",
    "--output",
    default="-",
    type=click.Path(allow_dash=True, dir_okay=False),
    help="Write to this file (atomically). Default: stdout.",
)
@seed_option
@on_error_option
@common_options
def cli(
    prefs,
    reference,
    swap,
    fmt,
    sort_by,
    bootstrap,
    confidence,
    compare,
    no_length_control,
    difficulty_file,
    dedupe,
    plot,
    history,
    output,
    seed,
):
    """Rank the models in PREFS (preference records; files, `-` for stdin, .gz, AlpacaEval's JSON
    annotations) by their win rate against the reference, as AlpacaEval computes it: ties and the
    legacy 0 count half, fractional preferences count fractionally, null verdicts are dropped and
    counted (n_dropped). By default the model is generator_2 and its reference generator_1.

    Besides AlpacaEval's columns each row has AlpacaEval 2's length-controlled win rate (its GLM:
    a model term, a length term and an instruction difficulty term, read with the length term at
    zero; see farmkit/evaluate/length_control.py). A model judged against itself is reported, not ranked; rows against
    several references are ranked apart, one group after the other, and said so on stderr.

    \b
    farm-winrate prefs.jsonl --format table
    farm-winrate annotations.json --reference-generator text_davinci_003 --bootstrap 1000 --plot board.png
    farm-winrate prefs.jsonl --compare ppo sft
    farm-winrate nightly_prefs.jsonl --bootstrap 1000 --history winrates.jsonl -q > /dev/null
    """
    if reference and swap:
        raise click.UsageError(
            "--reference-generator orients each record by itself; it cannot be combined with --swap"
        )
    if history and compare:
        raise click.UsageError(
            "--history keeps leaderboard rows; --compare writes comparisons instead"
        )
    if difficulty_file and no_length_control:
        raise click.UsageError(
            "--instruction-difficulty is for the length-controlled win rate; drop --no-length-control"
        )
    if sort_by == "lc" and no_length_control:
        raise click.UsageError(
            "--sort-by lc orders by the length-controlled win rate; drop --no-length-control"
        )
    if fmt == "alpaca-eval" and compare:
        raise click.UsageError(
            "--format alpaca-eval writes a leaderboard; --compare writes comparisons instead"
        )
    difficulty = (
        (difficulty_file, read_instruction_difficulty(difficulty_file, item_key))
        if difficulty_file
        else None
    )
    table = WinrateTable(
        reference=reference,
        swap=swap,
        bootstrap=bootstrap > 0,
        length_control=not no_length_control,
        compare=compare,
        dedupe=dedupe,
        difficulty=difficulty,
    )
    for path in prefs or ("-",):
        table.add_file(path)
    if table.skipped:
        log.warning(
            f"farm-winrate: skipped {table.skipped} records that do not involve the reference {reference!r}"
        )
    _report_guards(table)
    if compare:
        known = sorted({model for _, model in table.tallies})
        for model in {name for pair in compare for name in pair}:
            if not table.items.get(model):
                raise FarmError(
                    f"--compare: no verdicts on {model!r} in the input; the models are {', '.join(known)}"
                )
        rows = [table.comparison(a, b) for a, b in compare]
        columns = None
    else:
        rows = table.rows(seed=seed, resamples=bootstrap, confidence=confidence, sort_by=sort_by)
        references = sorted({str(row["reference"]) for row in rows})
        if fmt == "alpaca-eval" and len(references) > 1:
            raise FarmError(
                f"--format alpaca-eval writes one reference's board; the rows are against "
                f"{len(references)} ({', '.join(references)}): choose one with --reference-generator"
            )
        columns = TABLE_COLUMNS
        dropped = sum(row["n_dropped"] for row in rows)
        if dropped:
            log.warning(f"farm-winrate: {dropped} null verdicts dropped (see n_dropped)")
        _report_ranking(table, rows)
    info = provenance(
        "farm-winrate",
        seed if bootstrap else None,
        reference=reference,
        swap=swap or None,
        bootstrap=bootstrap or None,
        confidence=confidence if bootstrap else None,
    )
    for row in rows:
        stamp(row, "farm-winrate", info)
    if plot and rows and not compare:
        from farmkit.evaluate.plots import winrate_board

        winrate_board(plot, rows)
    if history and rows:
        from farmkit.evaluate import history as win_rate_history

        win_rate_history.append(history, win_rate_history.stamped(rows, prefs or ("-",)))
    write_board(rows, fmt, output, columns)


def _report_guards(table: WinrateTable) -> None:
    """Say what would silently distort the ranking: repeated verdicts, rows filed under another
    system's results folder, and self-judged models."""
    for (_, model), (count, first) in table.duplicates.items():
        log.warning(
            f"farm-winrate: {model}: {count} verdicts repeat an instruction already judged (the first at {first}); "
            "--dedupe keeps the first of each"
        )
    if table.dedupe and table.duplicates:
        log.warning(
            f"farm-winrate: {sum(c for c, _ in table.duplicates.values())} repeated verdicts left out (--dedupe)"
        )
    for (folder, model), (count, first) in table.misfiled.items():
        log.warning(
            f"farm-winrate: {count} verdicts from results_dir {folder!r} are generator {model!r}'s "
            f"(the first at {first}): a results folder holding another system's annotations (an "
            f"upstream copy?); they are ranked as {model!r}"
        )
    for model, tally in table.self_judged():
        share = f"{100 * tally.total / tally.n:.1f}%" if tally.n else "no verdict"
        log.warning(
            f"farm-winrate: {tally.n} verdicts judge {model} against itself (position 2 preferred in {share}); not ranked"
        )


def _report_ranking(table: WinrateTable, rows: list[dict]) -> None:
    for note in table.lc_notes:
        log.warning(f"farm-winrate: instruction difficulty {note}")
    for row in rows:
        if row.get("lc_extreme_change"):
            log.warning(
                f"farm-winrate: {row['generator']}: the length-controlled win rate "
                f"({row['length_controlled_win_rate']:.1f}%) is very different from the raw one "
                f"({row['win_rate']:.1f}%); the length model may have failed for it"
            )
    sizes = Counter(row["reference"] for row in rows)
    if len(sizes) > 1:
        groups = ", ".join(
            f"{name}: {count} model{'s' if count > 1 else ''}" for name, count in sizes.items()
        )
        log.warning(
            f"farm-winrate: the rows are against {len(sizes)} references ({groups}); each reference's rows are "
            "ranked apart, one group after the other"
        )


main = entry_point(cli)

if __name__ == "__main__":
    main()
