"""farm-winrate: a leaderboard of win rates against a reference, from preference records."""

from __future__ import annotations

from collections import Counter

import click

from farmkit.cli import (
    board_output_option,
    common_options,
    entry_point,
    field_options,
    log,
    on_error_option,
    seed_option,
    tool_config,
)
from farmkit.core.io import FarmError
from farmkit.core.provenance import provenance, stamp
from farmkit.evaluate.boards import write_board
from farmkit.evaluate.length_control import read_instruction_difficulty
from farmkit.evaluate.winrate import (
    TABLE_COLUMNS,
    WinrateConfig,
    WinrateTable,
    item_key,
)


@click.command(name="farm-winrate")
@click.argument("prefs", nargs=-1, type=click.Path(allow_dash=True, dir_okay=False))
@field_options(WinrateConfig)
@board_output_option
@seed_option
@on_error_option
@common_options
def cli(prefs, output, seed, **values):
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
    farm-winrate sim_prefs.jsonl --humans labels.jsonl --format table
    farm-winrate new_judge.jsonl --old-judge old_judge_subset.jsonl --target-se 1 --format table
    farm-winrate prefs.jsonl --baseline sft --adjust holm --bootstrap 1000 --format table
    farm-winrate pilot.jsonl --plan --baseline sft --detect 5 --power 0.8 --format table
    farm-winrate nightly_prefs.jsonl --bootstrap 1000 --history winrates.jsonl -q > /dev/null
    farm-winrate --ledger spend.jsonl -o spend_by_day.jsonl
    """
    config = tool_config(WinrateConfig, values)
    if config.ledger:
        if prefs:
            raise click.UsageError("--ledger totals a ledger; leave PREFS out")
        from farmkit.annotate.ledger import totals

        write_board(totals(config.ledger), config.fmt, output)
        return
    if config.canaries:
        _canaries(prefs, output, config)
        return
    if config.reference and config.swap:
        raise click.UsageError(
            "--reference-generator orients each record by itself; it cannot be combined with --swap"
        )
    if config.history and config.compare:
        raise click.UsageError(
            "--history keeps leaderboard rows; --compare writes comparisons instead"
        )
    if config.difficulty_file and config.no_length_control:
        raise click.UsageError(
            "--instruction-difficulty is for the length-controlled win rate; drop --no-length-control"
        )
    if config.sort_by == "lc" and config.no_length_control:
        raise click.UsageError(
            "--sort-by lc orders by the length-controlled win rate; drop --no-length-control"
        )
    if config.humans and config.fmt == "alpaca-eval":
        raise click.UsageError(
            "--humans adds columns to a leaderboard; --format alpaca-eval has none for them"
        )
    if config.fmt == "alpaca-eval" and config.compare:
        raise click.UsageError(
            "--format alpaca-eval writes a leaderboard; --compare writes comparisons instead"
        )
    if config.old_judge and config.humans:
        raise click.UsageError(
            "--old-judge is --humans with the old judge as the humans; give one of them"
        )
    humans = config.old_judge or config.humans
    if config.target_se is not None and not humans:
        raise click.UsageError("--target-se plans labels for PPI; add --humans or --old-judge")
    modes = [
        name
        for name, on in (
            ("--compare", config.compare),
            ("--baseline", config.baseline and not config.plan),
            ("--plan", config.plan),
        )
        if on
    ]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)} each write their own rows; choose one")
    if modes and (config.history or config.plot or config.fmt == "alpaca-eval"):
        raise click.UsageError(
            f"{modes[0]} writes no leaderboard; --history, --plot and --format alpaca-eval are for "
            "leaderboard rows"
        )
    difficulty = (
        (config.difficulty_file, read_instruction_difficulty(config.difficulty_file, item_key))
        if config.difficulty_file
        else None
    )
    table = WinrateTable(
        reference=config.reference,
        swap=config.swap,
        bootstrap=config.bootstrap > 0,
        length_control=not config.no_length_control,
        compare=config.compare,
        dedupe=config.dedupe,
        difficulty=difficulty,
        humans=humans is not None,
        keep_items=bool(config.baseline or config.plan),
    )
    for path in prefs or ("-",):
        table.add_file(path)
    if config.include_screened and not config.humans:
        raise click.UsageError("--include-screened is about --humans' labels; add --humans")
    if humans:
        _read_humans(table, humans, config.include_screened)
    if table.skipped:
        log.warning(
            f"farm-winrate: skipped {table.skipped} records that do not involve the reference {config.reference!r}"
        )
    _report_guards(table)
    if config.compare:
        known = sorted({model for _, model in table.tallies})
        for model in {name for pair in config.compare for name in pair}:
            if not table.items.get(model):
                raise FarmError(
                    f"--compare: no verdicts on {model!r} in the input; the models are {', '.join(known)}"
                )
        rows = [table.comparison(a, b, config.confidence) for a, b in config.compare]
        columns = None
        _report_small_samples(rows, "model_a")
    elif config.plan:
        rows, columns = _plan(table, config), None
    elif config.baseline:
        rows, columns = _against_baseline(table, config, seed), None
    else:
        rows = table.rows(
            seed=seed,
            resamples=config.bootstrap,
            confidence=config.confidence,
            sort_by=config.sort_by,
            target_se=config.target_se,
        )
        if config.old_judge:
            rows = [_old_judge_columns(row) for row in rows]
        references = sorted({str(row["reference"]) for row in rows})
        if config.fmt == "alpaca-eval" and len(references) > 1:
            raise FarmError(
                f"--format alpaca-eval writes one reference's board; the rows are against "
                f"{len(references)} ({', '.join(references)}): choose one with --reference-generator"
            )
        columns = TABLE_COLUMNS
        dropped = sum(row["n_dropped"] for row in rows)
        if dropped:
            log.warning(f"farm-winrate: {dropped} null verdicts dropped (see n_dropped)")
        _report_ranking(table, rows)
        _report_small_samples(rows, "generator")
    info = provenance(
        "farm-winrate",
        seed if config.bootstrap else None,
        reference=config.reference,
        swap=config.swap or None,
        bootstrap=config.bootstrap or None,
        confidence=config.confidence if config.bootstrap or humans else None,
    )
    for row in rows:
        stamp(row, "farm-winrate", info)
    if config.plot and rows and not config.compare:
        from farmkit.evaluate.plots import winrate_board

        winrate_board(config.plot, rows)
    if config.history and rows:
        from farmkit.evaluate import history as win_rate_history

        win_rate_history.append(config.history, win_rate_history.stamped(rows, prefs or ("-",)))
    write_board(rows, config.fmt, output, columns)


def _canaries(prefs, output: str, config) -> None:
    """--canaries: tonight's canary verdicts against the frozen ones; exit 4 on a drift."""
    from farmkit.evaluate.canary import compare, drift_line, fingerprint_line

    others = [
        name
        for name, on in (
            ("--compare", config.compare),
            ("--baseline", config.baseline),
            ("--plan", config.plan),
            ("--humans", config.humans),
            ("--old-judge", config.old_judge),
        )
        if on
    ]
    if others:
        raise click.UsageError(
            f"--canaries checks the judge; it cannot be combined with {others[0]}"
        )
    if len(prefs) != 1:
        raise click.UsageError("--canaries compares one file of tonight's canary verdicts (PREFS)")
    row = compare(config.canaries, prefs[0], config.drift_level)
    stamp(row, "farm-winrate", provenance("farm-winrate", None, drift_level=config.drift_level))
    if config.history:
        from farmkit.evaluate import history as win_rate_history

        win_rate_history.append(
            config.history, win_rate_history.stamped([row], (config.canaries, prefs[0]))
        )
    write_board([row], config.fmt, output)
    if row["judge_fingerprint_changed"]:
        log.warning(fingerprint_line(row))
    if row["judge_drift"]:
        log.error(drift_line(row))
        raise click.exceptions.Exit(4)
    log.warning(
        f"farm-winrate: canaries agree on {row['canary_agreement']:.0f}% of {row['n_canaries']} "
        f"(self-agreement when frozen {row['canary_baseline']:.0f}%); no drift"
    )


def _known(table: WinrateTable, model: str, option: str) -> None:
    if not table.items.get(model):
        known = sorted({name for _, name in table.tallies})
        raise FarmError(
            f"{option}: no verdicts on {model!r} in the input; the models are {', '.join(known)}"
        )


def _against_baseline(table: WinrateTable, config, seed: int) -> list[dict]:
    """Every model against --baseline (paired, adjusted), and the board's separability on stderr."""
    from farmkit.evaluate.board_stats import against_baseline, separability

    _known(table, config.baseline, "--baseline")
    models = sorted(name for name in table.items if name != config.baseline)
    rows = against_baseline(
        [table.comparison(model, config.baseline) for model in models],
        config.adjust,
        config.confidence,
    )
    board = table.rows(seed=seed, resamples=config.bootstrap, confidence=config.confidence)
    for reference in dict.fromkeys(row["reference"] for row in board):
        share, pairs = separability(
            [row for row in board if row["reference"] == reference], config.confidence
        )
        if share is not None:
            kind = "bootstrap" if config.bootstrap else "normal"
            log.warning(
                f"farm-winrate: separability against {reference}: {100 * share:.0f}% of the "
                f"{pairs} model pairs have {kind} {100 * config.confidence:g}% intervals that do not overlap"
            )
    significant = sum(bool(row["significant"]) for row in rows)
    log.warning(
        f"farm-winrate: {significant} of {len(rows)} models differ from {config.baseline} at "
        f"{1 - config.confidence:.3g} after {'Holm' if config.adjust == 'holm' else 'Benjamini-Hochberg'}"
    )
    return rows


def _plan(table: WinrateTable, config) -> list[dict]:
    """--plan: per model, the prompts needed (and with --humans --target-se the labels)."""
    import numpy as np

    from farmkit.evaluate.board_stats import plan_row

    def means(model: str) -> dict:
        return {key: total / count for key, (count, total) in table.items.get(model, {}).items()}

    if config.baseline:
        _known(table, config.baseline, "--baseline")
    base = means(config.baseline) if config.baseline else {}
    labels = {}
    if table.pairs is not None and config.target_se is not None:
        for row in table.rows(target_se=config.target_se, confidence=config.confidence):
            labels[row["generator"]] = row["ppi_labels_for_target_se"]
    rows = []
    for model in sorted(table.items):
        if model == config.baseline:
            continue
        mine = means(model)
        if config.baseline:
            common = sorted(set(mine) & set(base), key=repr)
            values = np.array([mine[key] - base[key] for key in common])
        else:
            values = np.array(list(mine.values())) - 0.5
        row = plan_row(
            model,
            config.baseline or "50%",
            values,
            config.detect,
            config.confidence,
            config.power,
        )
        if model in labels:
            row["target_se"] = config.target_se
            row["ppi_labels_for_target_se"] = labels[model]
        rows.append(row)
    return rows


def _old_judge_columns(row: dict) -> dict:
    """A --old-judge row: the humans' columns named for the old judge."""
    names = {
        "n_human": "n_old_judge",
        "human_win_rate": "old_judge_win_rate",
        "human_standard_error": "old_judge_standard_error",
    }
    return {names.get(key, key): value for key, value in row.items()}


def _read_humans(table: WinrateTable, path: str, include_screened: bool = False) -> None:
    screened = table.add_human_file(path, include_screened)
    if screened:
        log.warning(
            f"farm-winrate: {screened} human label{'s' if screened > 1 else ''} of annotators "
            "screened out by their check answers (screened_out: farm-label --min-check-score) left "
            "out; --include-screened counts them"
        )
    if table.pairs.null_labels:
        count = table.pairs.null_labels
        log.warning(
            f"farm-winrate: {count} human label{'s' if count > 1 else ''} without a verdict "
            "(null preference) skipped"
        )
    unjudged = table.pairs.unjudged()
    if unjudged:
        log.warning(
            f"farm-winrate: {unjudged} human-labelled pairs have no simulated verdict (all null); "
            "left out of the prediction-powered figures"
        )


def _report_small_samples(rows: list[dict], name: str) -> None:
    """Say which prediction-powered figures rest on too few human labels (small_sample)."""
    from farmkit.evaluate.ppi import MIN_HUMAN_LABELS

    for row in rows:
        if row.get("small_sample") and row.get("n_human"):
            what = row[name] if name == "generator" else f"{row['model_a']} - {row['model_b']}"
            log.warning(
                f"farm-winrate: {what}: {row['n_human']} human labels, fewer than "
                f"{MIN_HUMAN_LABELS}: the prediction-powered interval's coverage falls below its "
                "level on so few (small_sample); label more pairs"
            )


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
