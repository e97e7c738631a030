"""Drift canaries (farm-winrate --canaries FROZEN): a fixed set of pairs whose first verdicts were
frozen, asked again each scheduled run past the cache, to notice a judge that changed under the user
(an endpoint's model updated silently).

Definitions:
    a verdict is the text (or, for records without texts, the generator) of the output preferred,
        "tie" for 1.5 (and AlpacaEval's legacy 0); a pair is known by its instruction, input and
        its two outputs in either order (else by its id or instruction and its two generators)
    baseline self-agreement p0: FROZEN holds each canary asked twice or more (two runs of
        farm-annotate --no-cache); of the m canaries with two verdicts, a agree (first two),
        p0 = (a + 0.5) / (m + 1) (a perfectly consistent freeze does not make one flip a drift)
    tonight: of the n canaries in both, k agree with their first frozen verdict (a canary without
        a verdict tonight counts as a disagreement)
    drift: the one-sided exact binomial test of k against Binomial(n, p0),
        p = P(X <= k) < level (--drift-level, 0.01)
    fingerprint: what answered a verdict as the endpoint's reply said it (farm-annotate's provenance
        reply_model and system_fingerprint, where the endpoint gives them), "MODEL FINGERPRINT";
        the fingerprint changed when tonight's canaries were answered by one never seen when frozen
        (None where either side has none); reported, never a drift by itself
"""

from __future__ import annotations

from typing import Any

from farmkit.core.io import FarmError, display_name

TIE = "tie"


def _key(record: dict[str, Any]) -> Any:
    texts = (record.get("output_1"), record.get("output_2"))
    question = (record.get("instruction"), record.get("input") or "")
    if all(isinstance(text, str) for text in texts):
        return ("texts", *question, *sorted(texts))
    item = record.get("id", record.get("instruction_index", record.get("instruction")))
    generators = (record.get("generator_1"), record.get("generator_2"))
    if item is None or None in generators:
        return None
    return ("generators", item, *sorted(map(str, generators)))


def _verdict(record: dict[str, Any]) -> str | None:
    preference = record.get("preference")
    if preference is None:
        return None
    if preference in (0, 1.5):
        return TIE
    position = "1" if preference < 1.5 else "2"
    text = record.get(f"output_{position}")
    return text if isinstance(text, str) else str(record.get(f"generator_{position}"))


def _fingerprint(record: dict[str, Any]) -> str | None:
    provenance = record.get("provenance")
    details = provenance.get("farm-annotate") if isinstance(provenance, dict) else None
    if not isinstance(details, dict):
        return None
    said = [details.get(name) for name in ("reply_model", "system_fingerprint")]
    said = [str(value) for value in said if value is not None]
    return " ".join(said) if said else None


def read_verdicts(path: str, fingerprints: set[str] | None = None) -> dict[Any, list[str | None]]:
    """Every canary's verdicts in a preference file, in order; the fingerprints of what answered
    them are added to `fingerprints`."""
    from farmkit.evaluate.winrate import _checked_chunks

    name = display_name(path)
    verdicts: dict[Any, list[str | None]] = {}
    for numbers, records in _checked_chunks(path, name):
        for number, record in zip(numbers, records, strict=True):
            key = _key(record)
            if key is None:
                raise FarmError(
                    f"{name}:{number}: a canary needs output_1 and output_2 (or an id and "
                    "generator_1 and generator_2) to be found again"
                )
            verdicts.setdefault(key, []).append(_verdict(record))
            if fingerprints is not None and (found := _fingerprint(record)) is not None:
                fingerprints.add(found)
    return verdicts


def compare(frozen_path: str, tonight_path: str, level: float) -> dict[str, Any]:
    """The canary row: tonight's agreement with the frozen verdicts, the baseline, the test."""
    from scipy import stats

    then, now = set[str](), set[str]()
    frozen, tonight = read_verdicts(frozen_path, then), read_verdicts(tonight_path, now)
    repeated = [verdicts[:2] for verdicts in frozen.values() if len(verdicts) > 1]
    if not repeated:
        raise FarmError(
            f"{display_name(frozen_path)}: no canary was asked twice; freeze the canaries with two "
            "runs of farm-annotate --no-cache (their verdicts in one file) so that the judge's own "
            "self-agreement is the baseline"
        )
    consistent = sum(first == second and first is not None for first, second in repeated)
    baseline = (consistent + 0.5) / (len(repeated) + 1)
    common = [key for key in tonight if key in frozen]
    if not common:
        raise FarmError(
            f"{display_name(tonight_path)}: none of its pairs is a canary of "
            f"{display_name(frozen_path)}; expected the frozen canaries asked again"
        )
    agree = sum(tonight[key][0] is not None and tonight[key][0] == frozen[key][0] for key in common)
    p_value = float(stats.binom.cdf(agree, len(common), baseline))
    return {
        "generator": "judge canaries",
        "kind": "canary",
        "win_rate": None,
        "n_canaries": len(common),
        "canary_agreement": 100 * agree / len(common),
        "canary_baseline": 100 * baseline,
        "n_frozen_repeats": len(repeated),
        "canary_p_value": p_value,
        "drift_level": level,
        "judge_drift": p_value < level,
        "frozen_fingerprints": sorted(then),
        "tonight_fingerprints": sorted(now),
        "judge_fingerprint_changed": bool(now - then) if then and now else None,
    }


def drift_line(row: dict[str, Any]) -> str:
    """The one line a drift prints."""
    agree = round(row["canary_agreement"] * row["n_canaries"] / 100)
    return (
        f"farm-winrate: judge drift: the canaries agree with their frozen verdicts on {agree} of "
        f"{row['n_canaries']} ({row['canary_agreement']:.0f}%) against a self-agreement of "
        f"{row['canary_baseline']:.0f}% when frozen (one-sided exact binomial test p = "
        f"{row['canary_p_value']:.2g} < {row['drift_level']:g}); the judge has changed: "
        "re-freeze the canaries or start a new history"
    )


def fingerprint_line(row: dict[str, Any]) -> str:
    """The line a changed fingerprint prints (not a drift: the verdicts decide that)."""
    return (
        "farm-winrate: the judge's fingerprint changed: frozen with "
        f"{', '.join(row['frozen_fingerprints'])}, tonight {', '.join(row['tonight_fingerprints'])} "
        "(the endpoint's reply model and system_fingerprint); not a drift by itself: the "
        "canaries' agreement decides that"
    )
