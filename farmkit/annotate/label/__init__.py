"""farm-label: pairs served to a team's own annotators through a local page, their answers written as
preference records (the assignment, the durable store, the server and the organiser's status page)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from farmkit.core.fields import EXISTING_FILE, help_field
from farmkit.core.values import AT_LEAST_ONE, FRACTION, Bounds

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_annotators(text: str) -> tuple[str, ...]:
    """`alice,bob` (names) or `3` (annotator-1..annotator-3)."""
    text = str(text).strip()
    if text.isdigit():
        count = int(text)
        if count < 1:
            raise ValueError("expected at least one annotator")
        return tuple(f"annotator-{number}" for number in range(1, count + 1))
    names = tuple(part.strip() for part in text.split(","))
    for name in names:
        if not _NAME.match(name):
            raise ValueError(
                f"{name!r} is not an annotator name; expected names of letters, digits, '_', '.' or "
                "'-' separated by commas (alice,bob), or a count (3)"
            )
        if name.lower() == "status":
            raise ValueError(
                f"{name!r} names the organiser's link (farm-label: status URL); choose another "
                "annotator name"
            )
    if len(set(names)) != len(names):
        raise ValueError("an annotator is named twice")
    return names


def origin_of(url: str) -> str | None:
    """The origin of an http(s) URL as a browser sends it (scheme://host[:port], the default port
    left out, lower case), or None when it has none."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in ("http", "https") or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def parse_public_url(text: str | None) -> str | None:
    """--public-url: an http(s) address at the root of its host (the page's assets are at /static),
    returned as its origin (the links are built on it)."""
    if text is None:
        return None
    origin = origin_of(text)
    parts = urlsplit(text.strip())
    if origin is None:
        raise ValueError(
            f"{text!r}: expected the page's public address, http(s)://HOST[:PORT] "
            "(https://labels.example.org)"
        )
    if parts.path.strip("/") or parts.query or parts.fragment or parts.username:
        raise ValueError(
            f"{text!r}: the proxy must serve farm-label at the root of its address (the page loads "
            f"/static/...); give {origin}, on a host name of its own"
        )
    return origin


@dataclass
class LabelConfig:
    """farm-label's settings (its options; --reference and --seed are the shared ones)."""

    output: str = help_field(
        None,
        "The preference records (LABELS), rewritten whole after every answer and undo; its journal, "
        "the links' tokens and port and the check answers are kept beside it (LABELS.journal.jsonl, "
        "LABELS.session.json, LABELS.checks.jsonl). The same command again resumes, with the same "
        "links.",
        flags=("-o", "--output"),
        required=True,
        path={"dir_okay": False},
        show_default=False,
    )
    annotators: tuple[str, ...] = help_field(
        "1",
        "Names (alice,bob) or a count (3: annotator-1..annotator-3); one link each.",
        parse=parse_annotators,
        metavar="NAMES|N",
    )
    overlap: float = help_field(
        0.0,
        "The fraction of the pairs that every annotator labels (for agreement); each other pair goes "
        "to one annotator.",
        bounds=FRACTION,
    )
    checks: str | None = help_field(
        None,
        "Known-answer pairs (preference records) mixed into every annotator's queue at seeded "
        "places; their answers go to LABELS.checks.jsonl, never to LABELS, and each annotator's "
        "score is on the status page and in the summary.",
        path=EXISTING_FILE,
        show_default=False,
    )
    min_check_score: float | None = help_field(
        None,
        "With --checks: an annotator whose share of checks answered right is below this (0.8) is "
        "screened out: their labels in LABELS carry screened_out: true, which farm-winrate --humans "
        "and farm-correlate leave out unless given --include-screened; said on the status page, in "
        "--status and in the summary. An annotator who has answered no check yet is not screened.",
        bounds=FRACTION,
        metavar="SHARE",
        show_default=False,
    )
    judge: str | None = help_field(
        None,
        "The simulated verdicts on every pair of PAIRS (SIM: preference records, a pool's several "
        "verdicts or soft preferences in [1, 2]): with --budget, people label a sample drawn where "
        "the judge is least sure, with known probabilities (each label's sampling_probability, which "
        "farm-winrate --humans weighs by), the most informative first. PAIRS must be every pair SIM "
        "judged (farm-label SIM --judge SIM).",
        path=EXISTING_FILE,
        metavar="SIM",
        show_default=False,
    )
    budget: int | None = help_field(
        None,
        "With --judge: how many pairs to label, in expectation (each pair is drawn by a coin of its "
        "own).",
        bounds=AT_LEAST_ONE,
        metavar="N",
        show_default=False,
    )
    guidelines: str | None = help_field(
        None,
        "A markdown file of guidelines shown on the page (rendered, raw HTML shown as text), "
        "instead of farmkit's own.",
        path=EXISTING_FILE,
        show_default=False,
    )
    host: str = help_field(
        "127.0.0.1", "The address to listen on (another than 127.0.0.1 opens the page to others)."
    )
    public_url: str | None = help_field(
        None,
        "The address annotators open when a reverse proxy serves the page (https://labels.example.org, "
        "at the root of its host name): the printed links use it, and answers from pages served there "
        "are accepted whatever Host header the proxy sends.",
        parse=parse_public_url,
        metavar="URL",
        show_default=False,
    )
    port: int = help_field(
        0,
        "The port to listen on; 0 picks a free one the first time and the same one again at a "
        "restart, when it is free (the printed links carry it).",
        bounds=Bounds(0, 65535),
    )
    status: bool = help_field(
        False,
        "Serve nothing: print LABELS' progress (one JSON record: each annotator's done and total, "
        "labelled, flagged, skipped and comments, whether LABELS is complete) and exit 0 when it is "
        "complete, 75 when not yet.",
    )
