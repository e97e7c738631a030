"""farm-correlate: rank correlation between leaderboards, and a judge's labels against human labels."""

from __future__ import annotations

import itertools

import click

from farmkit.cli import (
    board_output_option,
    common_options,
    entry_point,
    field_options,
    log,
    seed_option,
)
from farmkit.core.io import FarmError, write_text
from farmkit.core.provenance import provenance, stamp
from farmkit.evaluate.boards import indexed_csv, write_board
from farmkit.evaluate.correlate import (
    ALPACA_EVAL_EVALUATORS,
    Annotations,
    CorrelateConfig,
    alpaca_eval_contains_list,
    alpaca_eval_evaluators,
    annotation_markdown,
    annotation_rows,
    board_stem,
    correlate_boards,
    read_board,
)


@click.command(name="farm-correlate")
@click.argument("boards", nargs=-1, type=click.Path(allow_dash=True, dir_okay=False))
@field_options(CorrelateConfig)
@board_output_option
@seed_option
@common_options
def cli(
    boards,
    names,
    scores,
    plot,
    max_labels,
    judges,
    humans,
    include_screened,
    key,
    judge_label,
    human_label,
    outputs,
    min_length_difference,
    human_board,
    judge_boards,
    bootstrap,
    epsilon,
    fmt,
    output,
    seed,
):
    """Leaderboard mode (BOARDS): correlate two or more leaderboards joined by model name (farm-winrate
    JSONL, or CSVs with a name and a score column): Spearman, Kendall, Pearson and R^2 with n, and
    the models missing from either side; one record per pair of boards.

    Annotation mode (--judge/--humans): one row per judge: its agreement with the humans under
    AlpacaFarm's (leave-one-out) and AlpacaEval's (mode of all, ties half) definitions, the rate its
    verdict flips when the order is swapped, price and seconds per 1,000 verdicts (from the records'
    provenance), bias, variance over runs, preference for longer outputs, lists and the first
    position. On the pairs two humans or more labelled, as AlpacaFarm reports agreement: each
    judge's and each human's agreement with the other humans' majority (a row per human), the
    alternative annotator test of each judge (winning rate, advantage probability, pass, at
    --epsilon; three humans or more), and between the humans pairwise agreement, Fleiss' kappa and,
    per two annotators, agreement and Cohen's kappa; each with a 95% bootstrap interval over the
    pairs (--bootstrap, --seed). Definitions in farmkit/evaluate/correlate.py.

    \b
    farm-correlate sim.jsonl human.jsonl --plot sim_vs_human.png
    farm-correlate benchmarks.csv benchmarks.csv --score 'Arena Elo' --score 'LC AlpacaEval 2.0'
    farm-correlate --judge run0.jsonl --judge run1.jsonl --humans human_labels.jsonl
    farm-correlate --judge sim_eval.jsonl --humans labels.jsonl --format markdown
    farm-correlate --humans pandalm_testset_v1.json --key idx --outputs response1,response2 \\
        --human-label annotator1,annotator2,annotator3
    """
    if boards and (judges or humans):
        raise click.UsageError(
            "give leaderboards (leaderboard mode) or --judge/--humans (annotation mode), not both"
        )
    if (human_board or judge_boards or fmt == "alpaca-eval") and not (judges or humans):
        raise click.UsageError(
            "--human-board, --judge-board and --format alpaca-eval are for annotation mode (--judge/--humans)"
        )
    if judge_boards and not human_board:
        raise click.UsageError(
            "--judge-board needs --human-board, the leaderboard it is compared with"
        )
    if len(outputs) != 2:
        raise click.BadParameter(
            "expected two fields, e.g. output_1,output_2", param_hint="--outputs"
        )
    if judges or humans:
        # AlpacaEval's evaluators table counts lists with its own (looser) detector
        annotations = Annotations(
            key_field=key,
            outputs=outputs,
            list_detector=alpaca_eval_contains_list if fmt == "alpaca-eval" else None,
        )
        for path in judges:
            annotations.add_judge(path, judge_label)
        if judges:
            annotations.require_judge_labels(judges, judge_label)
        for path in humans:
            annotations.add_humans(path, human_label, include_screened)
        for name, count in annotations.screened.items():
            log.warning(
                f"farm-correlate: {name} was screened out by their check answers (screened_out: "
                f"farm-label --min-check-score): {count} label{'s' if count > 1 else ''} left out "
                "of the agreement figures; --include-screened counts them"
            )
        for name, (count, where, first) in annotations.repeated.items():
            log.warning(
                f"farm-correlate: {name} labelled the same pair twice ({count} label"
                f"{'s' if count > 1 else ''} repeat one of theirs, the first at {where}, of the pair "
                f"labelled at {first}); only each human's first label of a pair counts (one human "
                "is not two who agree)"
            )
        for name, (count, first) in annotations.missing.items():
            log.warning(
                f"farm-correlate: {count} records have no {name!r} field and were left out (the first at {first})"
            )
        if annotations.unparsed:
            log.warning(
                f"farm-correlate: {annotations.unparsed} labels are no verdict and were left out, "
                f"the first: {annotations.first_unparsed}"
            )
        rows = annotation_rows(annotations, min_length_difference, bootstrap, seed, epsilon)
        if fmt == "alpaca-eval":
            boards = _judge_boards(judge_boards, [r["annotator"] for r in rows], names, scores)
            human = (
                read_board(human_board, _nth(names, 0), _nth(scores, 0)) if human_board else None
            )
            table = alpaca_eval_evaluators(rows, annotations, human, boards)
            write_text(indexed_csv(table, [c for c, _, _ in ALPACA_EVAL_EVALUATORS]), output)
            return
        info = provenance(
            "farm-correlate",
            seed if bootstrap else None,
            mode="annotations",
            key=key,
            min_length_difference=min_length_difference,
            bootstrap=bootstrap,
            epsilon=epsilon,
        )
    else:
        if len(boards) < 2:
            raise click.UsageError("leaderboard mode needs two leaderboards or more")
        for option, values in (("--name", names), ("--score", scores)):
            if len(values) not in (0, 1, len(boards)):
                raise click.UsageError(
                    f"give {option} once for all boards or once per board ({len(boards)})"
                )
        loaded = [
            read_board(path, _nth(names, i), _nth(scores, i)) for i, path in enumerate(boards)
        ]
        if not any(board.scores for board in loaded):
            return
        rows = [correlate_boards(x, y) for x, y in itertools.combinations(loaded, 2)]
        for row in rows:
            if row["missing_from_x"] or row["missing_from_y"]:
                log.warning(
                    f"farm-correlate: {row['x']} lacks {len(row['missing_from_x'])} models, "
                    f"{row['y']} lacks {len(row['missing_from_y'])} (see missing_from_x / missing_from_y)"
                )
        if plot:
            from farmkit.evaluate.plots import board_scatter

            board_scatter(plot, loaded[0], loaded[1], title=_title(rows[0]), max_labels=max_labels)
        info = provenance(
            "farm-correlate",
            None,
            mode="leaderboards",
            names=list(names) or None,
            scores=list(scores) or None,
        )
    for row in rows:
        stamp(row, "farm-correlate", info)
    if fmt == "markdown" and (judges or humans):
        write_text(annotation_markdown(rows), output)
        return
    write_board(rows, fmt, output)


def _judge_boards(paths, judges: list[str], names, scores) -> dict:
    """Each --judge-board by the judge it is of: the one `annotator` its rows name, else its file's name."""
    boards = {}
    for path in paths:
        board = read_board(path, _nth(names, 0), _nth(scores, 0))
        judge = board.judges[0] if len(board.judges) == 1 else board_stem(path)
        if judge not in judges:
            raise FarmError(
                f"--judge-board {path}: its judge {judge!r} is none of the judges read "
                f"({', '.join(judges)}); name it by its rows' `annotator` or by the file's name"
            )
        boards[judge] = board
    return boards


def _nth(values: tuple[str, ...], index: int) -> str | None:
    if not values:
        return None
    return values[0] if len(values) == 1 else values[index]


def _title(row: dict) -> str:
    if row["spearman"] is None:
        return f"n = {row['n']}"
    return f"Spearman {row['spearman']:.3f}, Pearson {row['pearson']:.3f}, n = {row['n']}"


main = entry_point(cli)

if __name__ == "__main__":
    main()
