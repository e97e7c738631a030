"""PandaLM's human-labelled test set as farmkit preference records, for farm-judge-train.

    python pandalm_prefs.py PANDALM_JSON OUT.jsonl

Each pair becomes one record whose `preference` is the three humans' mean verdict (1 + the share of
votes for response2, a tie counting half), so a judge learns the humans' agreement, not only their
majority. generator_1/2 are the two models of `cmp_key`; generator_2 names the pair's "system" when
farm-judge-train holds systems out.
"""

from __future__ import annotations

import json
import sys

from farmkit.core.io import write_records


def _text(value: object) -> str:
    """A response as text: a few PandaLM responses are JSON values (true, numbers), kept as written."""
    return value if isinstance(value, str) else json.dumps(value)


def records(pandalm: list[dict]) -> list[dict]:
    out = []
    for number, pair in enumerate(pandalm, start=1):
        votes = [pair.get(f"annotator{i}") for i in (1, 2, 3)]
        if any(vote not in (0, 1, 2) for vote in votes):
            raise SystemExit(f"pandalm_prefs: pair {number}: expected annotator1..3 in 0, 1, 2")
        share = sum({0: 0.5, 1: 0.0, 2: 1.0}[vote] for vote in votes) / len(votes)
        first, _, second = pair["cmp_key"].partition("_")
        out.append(
            {
                "instruction": pair["instruction"],
                "input": pair.get("input") or "",
                "output_1": _text(pair["response1"]),
                "output_2": _text(pair["response2"]),
                "generator_1": first,
                "generator_2": second or first,
                "preference": round(1.0 + share, 6),
                "annotator": "pandalm-humans-mean",
            }
        )
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as handle:
        write_records(records(json.load(handle)), sys.argv[2])
