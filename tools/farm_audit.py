"""farm-audit: a judge audited in one command: position, length and style preferences, self-preference,
consistency across runs and, with human labels, agreement and calibration, each with its interval."""

from __future__ import annotations

import click

from farmkit.annotate.pools import AnnotateConfig
from farmkit.cli import (
    board_output_option,
    common_options,
    entry_point,
    field_options,
    input_argument,
    log,
    reference_option,
    seed_option,
    shared_option,
    verdict_cache,
)
from farmkit.core.io import write_text
from farmkit.evaluate.audit import FAIL_EXIT, AuditConfig


@click.command(name="farm-audit")
@input_argument("inputs", nargs=-1)
@field_options(AnnotateConfig, "pool")
@reference_option
@field_options(AuditConfig)
@seed_option
@shared_option("cache", dest="cache_path")
@shared_option("no_cache")
@shared_option(
    "max_cost",
    more_help="Over the whole audit (both orders, every run): it refuses to start, or stops asking, before it would spend more.",
)
@shared_option("prices")
@shared_option("device")  # of the local and reward-model judges
@board_output_option
@common_options
def cli(
    inputs,
    pool,
    reference,
    repeats,
    humans,
    include_screened,
    families,
    judge_family,
    fail_on,
    report,
    plot,
    bootstrap,
    min_length_difference,
    epsilon,
    fmt,
    seed,
    cache_path,
    no_cache,
    max_cost,
    prices,
    device,
    output,
):
    """Audit a judge (--pool: a pool name, a pool YAML file or a learned judge folder, as
    farm-annotate takes it) on pairs: every pair is asked in both orders, --repeats times where the
    judge samples, through farm-annotate's cache and budget. The report (markdown, or one JSONL row per
    figure with --format jsonl) gives each figure with its 95% bootstrap interval: flip rate and
    P(prefers first); P(prefers longer) and P(prefers lists) as AlpacaEval's evaluators' leaderboard
    computes them, and the length term of its length-controlled GLM; the variance across runs; with
    generator families, the judge's self-preference; with --humans, agreement, Cohen's kappa, the
    alternative annotator test and calibration (Brier, ECE; the reliability curve in --plot).
    --fail-on turns figures into an exit code (3) for CI and cron. Definitions in
    farmkit/evaluate/audit.py.

    INPUTS: pair records, consecutive output records (farm-sample -n 2), or output records with
    --reference, as farm-annotate reads them.

    \b
    farm-audit pairs.jsonl --pool sim_eval_offline --repeats 3 --plot audit.png
    farm-audit outputs.jsonl --reference ref.jsonl --pool judge.yaml --fail-on 'flip_rate>0.2'
    farm-audit pairs.jsonl --pool weighted_gpt4_turbo --humans labels.jsonl --max-cost 2
    """
    from farmkit.annotate import audit as asking
    from farmkit.annotate import pools as pool_module
    from farmkit.annotate.pairs import read_items
    from farmkit.evaluate import audit as audit_module

    if include_screened and not humans:
        raise click.UsageError("--include-screened is about --humans' labels; add --humans")
    cache = verdict_cache(cache_path, no_cache)
    try:
        checks = [audit_module.parse_check(text) for text in fail_on]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--fail-on") from None
    try:
        family_map = audit_module.parse_families(families)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--families") from None
    chosen = pool_module.load_pool(pool or ("sim_eval" if reference else "sim_ann"))
    items = read_items(inputs or ("-",), reference, (), False)
    if not items:
        return
    if judge_family is None and family_map:
        names = [str(chosen.model_for(judge) or judge.name) for judge in chosen.judges]
        found = {family_map[name] for name in [*names, chosen.name] if name in family_map}
        if len(found) == 1:
            judge_family = found.pop()
    humans_labels = human_names = None
    if humans:
        humans_labels, human_names, unmatched, screened = audit_module.read_humans(
            humans, items, include_screened
        )
        if screened:
            log.warning(
                f"farm-audit: {screened} human label{'s' if screened > 1 else ''} of annotators "
                "screened out by their check answers (screened_out: farm-label --min-check-score) "
                "left out; --include-screened counts them"
            )
        if unmatched:
            log.warning(
                f"farm-audit: {unmatched} record(s) of {humans} match no audited pair and were left out"
            )
    runs = repeats if asking.samples(chosen) else 1
    if runs < repeats:
        log.info(f"farm-audit: pool {chosen.name} does not sample: asked once, not {repeats} times")
    asked = asking.ask(
        chosen,
        items,
        runs,
        seed=seed,
        cache=cache,
        prices=prices,
        max_cost=max_cost,
        device=device,
    )
    result = audit_module.audit(
        items,
        asked,
        chosen.name,
        humans=humans_labels,
        human_names=human_names,
        judge_family=judge_family,
        families=family_map,
        resamples=bootstrap,
        seed=seed,
        min_length_difference=min_length_difference,
        epsilon=epsilon,
    )
    failed = result.failures(checks)
    text = result.markdown(failed)
    if report:
        write_text(text, report)
    if plot:
        audit_module.plot_audit(plot, result)
    if fmt == "jsonl":
        from farmkit.evaluate.boards import write_board

        write_board(result.rows(), "jsonl", output)
    else:
        write_text(text, output)
    for line in failed:
        log.error(f"farm-audit: --fail-on: {line}")
    if failed:
        raise SystemExit(FAIL_EXIT)


main = entry_point(cli)

if __name__ == "__main__":
    main()
