"""farm-label: pairs -> preference records from a team's own annotators, through a local page."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from farmkit.annotate.label import LabelConfig
from farmkit.cli import (
    common_options,
    entry_point,
    field_options,
    input_argument,
    log,
    reference_option,
    seed_option,
    tool_config,
)
from farmkit.core.io import PENDING_EXIT, FarmError, display_name, records_stdout


@click.command(name="farm-label")
@input_argument("pairs")
@field_options(LabelConfig, "output")
@reference_option
@field_options(
    LabelConfig,
    "annotators",
    "overlap",
    "checks",
    "min_check_score",
    "judge",
    "budget",
    "guidelines",
    "host",
    "port",
    "public_url",
    "status",
)
@seed_option
@common_options
def cli(pairs, reference, seed, **values):
    """Serve PAIRS (pair records, or output records with --reference) to human annotators through
    a local page and write their answers to LABELS as preference records (preference 1, 2 or 1.5,
    strength much/slightly, annotator, shown, seconds, time, comment). A pair an annotator skips
    (it comes back after the rest of their queue) or flags (can't judge, or a problem) is a record
    with a null preference and skipped or flag, which no estimate counts.

    It prints one link per annotator and one to the organiser's status page on stderr (whatever
    -q says) and serves until Ctrl-C or SIGTERM, then prints each annotator's progress and check
    score. Each answer is on disk before the page moves on; stopped (even by kill -9) and started
    again with the same command, it resumes every annotator where they were, with the same links.
    LABELS is complete when every annotator's progress is at its total (the status page says so).

    \b
    farm-label pairs.jsonl -o labels.jsonl --annotators alice,bob,carol --overlap 0.2
    farm-label outputs.jsonl --reference ref.jsonl -o labels.jsonl --annotators 3 --checks known.jsonl
    farm-label sim_prefs.jsonl --judge sim_prefs.jsonl --budget 200 -o labels.jsonl --annotators 2
    """
    config = tool_config(LabelConfig, values)
    if config.output == "-" or config.output.endswith(".gz"):
        raise click.BadParameter(
            "LABELS is a plain JSONL file that is rewritten as answers come (not - or .gz)",
            param_hint="-o",
        )
    try:
        from farmkit.annotate.label import server
    except ImportError:
        raise FarmError("farm-label needs its web server: pip install 'farmkit[label]'") from None
    from farmkit.annotate.label.store import open_store, read_checks, remembered_port
    from farmkit.annotate.pairs import read_items

    # every input is read and checked, and the port taken, before anything is written
    items = [item.record for item in read_items(pairs, reference)]
    if not items:
        raise FarmError(
            f"{display_name(pairs)}: no pairs to label; expected pair records (instruction, output_1, "
            "output_2), or output records with --reference"
        )
    items = _merge_repeats(items, display_name(pairs))
    if (config.judge is None) != (config.budget is None):
        raise click.UsageError(
            "--judge and --budget go together: the verdicts, and how many labels"
        )
    if config.judge:
        from farmkit.annotate.label.active import draw

        items = draw(items, config.judge, config.budget, seed)
        log.info(
            f"farm-label: {len(items)} pairs drawn where {display_name(config.judge)} is least sure "
            f"(--budget {config.budget} expected)"
        )
    if config.min_check_score is not None and not config.checks:
        raise click.UsageError(
            "--min-check-score screens annotators by their answers to --checks: give --checks"
        )
    checks = read_checks(config.checks) if config.checks else []
    guidelines = Path(config.guidelines or server.GUIDELINES).read_text(encoding="utf-8")

    def opened():  # LABELS' store, for --status and for serving alike
        return open_store(
            config.output,
            items,
            checks,
            config.annotators,
            config.overlap,
            seed,
            config.judge is not None,
            config.min_check_score,
        )

    if config.status:
        with opened() as store:
            report = server.status(store)
        records_stdout().write(orjson.dumps(report) + b"\n")
        raise click.exceptions.Exit(0 if report["complete"] else PENDING_EXIT)
    listener, moved = _listen(config.host, config.port, remembered_port(config.output))
    url = server.base_url(listener, config.host)
    if config.public_url:  # the proxy's address is the annotators'
        click.echo(f"farm-label: serving {url} as {config.public_url}", err=True)
        url = config.public_url
    with opened() as store:
        if moved:
            log.warning("farm-label: %s", moved)
        store.remember_port(listener.getsockname()[1])
        for name, token in store.tokens.items():
            click.echo(f"farm-label: {name} {url}/a/{token}", err=True)
        click.echo(f"farm-label: status {url}/status/{store.admin}", err=True)
        app = server.create_app(store, guidelines, public_url=config.public_url)
        server.serve(app, listener)
        for line in server.summary(store):
            log.info("farm-label: %s", line)


def _listen(host: str, port: int, remembered: int | None):
    """The listening socket: on --port, or with --port 0 on the port LABELS' links carried last
    (the same links after a restart), else a free one. (socket, what to say when the remembered
    port was taken and the links change.)"""
    from farmkit.annotate.label import server

    if port or remembered is None:
        return server.bind(host, port), None
    try:
        return server.bind(host, remembered), None
    except FarmError as exc:
        listener = server.bind(host, 0)
        return listener, (
            f"{str(exc).split(';')[0]}, the port the links carried last: serving on port "
            f"{listener.getsockname()[1]} instead, so the links below are NEW (send them again, "
            f"or free port {remembered} and restart to keep the old ones)"
        )


def _merge_repeats(items: list[dict], name: str) -> list[dict]:
    """Each pair once: a pair given again (the same instruction, input and outputs, in either order)
    is left out and said, since one annotator's two labels of it would count as two humans agreeing."""
    first: dict[tuple, int] = {}
    kept, repeats = [], []
    for position, item in enumerate(items, 1):
        outputs = sorted((str(item.get("output_1")), str(item.get("output_2"))))
        key = (item.get("instruction"), item.get("input") or "", *outputs)
        if key in first:
            repeats.append(f"pair {position} repeats pair {first[key]}")
            continue
        first[key] = position
        kept.append(item)
    if repeats:
        shown = "; ".join(repeats[:3]) + ("; ..." if len(repeats) > 3 else "")
        log.warning(
            f"farm-label: {name}: {len(repeats)} pair{'s' if len(repeats) > 1 else ''} given again, "
            f"labelled once ({shown})"
        )
    return kept


main = entry_point(cli)

if __name__ == "__main__":
    main()
