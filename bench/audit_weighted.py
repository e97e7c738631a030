"""Audit of logprob-weighted verdicts (issue 21, item 2) on fresh cases, against any checkout:

    PYTHONPATH=ROOT python bench/audit_weighted.py ROOT

ROOT's farmkit and its tools/farm_annotate.py are loaded; the loopback server (tests/openai_server.py
of this checkout) is the instrument. Fresh pairs (random texts) get a first-token distribution drawn
per pair from a seeded hash (not the tests' length rule), with verdict letters spelled with and
without a leading space. Measured: whether the weighted pool loads, the share of records whose
preference is the expected fraction 1 + P(output_2 better), requests on a re-run (cache), the price
booked against the price billed, and what an endpoint without logprobs yields (an error, or labels).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import random
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))
from openai_server import OpenAIServer, shown_pairs  # noqa: E402

KEY = "sk-audit-weighted-0c9e71"
PRICE = (10.0, 30.0)


def _tool(root: Path):
    spec = importlib.util.spec_from_file_location(
        "audit_farm_annotate", root / "tools" / "farm_annotate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cli


def _score(text: str) -> float:
    """A per-answer quality drawn from a hash, so that the judge is consistent across orders."""
    return 4 * int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") / 2**32 - 2


def _share_b(a: str, b: str) -> float:
    """P(B better) for answers A, B: a logistic of their score difference (1 - P when swapped)."""
    return 1 / (1 + math.exp(_score(a) - _score(b)))


def distribution(body: dict) -> dict[str, float]:
    _, pairs = shown_pairs(body)
    a, b = pairs[0]
    share = _share_b(a, b)
    # the letters' mass split between two spellings; 15% on other tokens
    return {
        "A": 0.6 * (1 - share),
        " A": 0.25 * (1 - share),
        "B": 0.5 * share,
        " B": 0.35 * share,
        "Well": 0.15,
    }


def reply(body: dict) -> str:
    d = distribution(body)
    return "B" if d["B"] + d[" B"] > d["A"] + d[" A"] else "A"


def pairs(n: int) -> list[dict]:
    rng = random.Random(2121)
    words = "river stone light quiet number garden method signal paper orbit".split()
    out = []
    for i in range(n):
        text = lambda k: " ".join(rng.choice(words) for _ in range(k))  # noqa: E731
        out.append(
            {
                "instruction": f"Describe {text(3)} ({i})",
                "output_1": text(rng.randint(3, 40)),
                "output_2": text(rng.randint(3, 40)),
            }
        )
    return out


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    cli = _tool(root)
    items = pairs(30)
    expected = [1 + _share_b(p["output_1"], p["output_2"]) for p in items]
    data = b"".join(json.dumps(p).encode() + b"\n" for p in items)
    report: dict = {"root": str(root)}
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "c.sqlite")
        with OpenAIServer(respond=reply, top_logprobs=distribution) as server:
            env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY}

            def run(*args: str):
                return CliRunner().invoke(
                    cli, ["--pool", "weighted_gpt4_turbo", *args], input=data, env=env
                )

            first = run("--cache", cache)
            report["pool_loads"] = first.exit_code == 0
            if first.exit_code:
                report["error"] = (
                    (first.stderr or str(first.exception)).strip().splitlines()[-1][:160]
                )
            records = [json.loads(line) for line in first.stdout.splitlines()]
            matches = sum(
                1
                for r, e in zip(records, expected, strict=False)
                if isinstance(r.get("preference"), int | float)
                and math.isclose(r["preference"], e, abs_tol=1e-6)
            )
            report["fractions_right"] = f"{matches}/{len(items)}"
            asked = sum(server.outcomes.values())
            second = run("--cache", cache)
            report["requests_first_run"] = asked
            report["requests_on_rerun"] = sum(server.outcomes.values()) - asked
            again = [json.loads(line)["preference"] for line in second.stdout.splitlines()]
            report["rerun_same_fractions"] = bool(records) and again == [
                r["preference"] for r in records
            ]
            billed = sum(p * PRICE[0] + c * PRICE[1] for p, c in server.billed) / 1e6
            booked = sum(r["provenance"]["farm-annotate"]["price"] for r in records)
            report["price_booked_vs_billed"] = f"{booked:.6f} / {billed:.6f}"
        with OpenAIServer(respond=reply) as bare:  # no logprobs
            env = {"OPENAI_BASE_URL": bare.url, "OPENAI_API_KEY": KEY}
            result = CliRunner().invoke(
                cli, ["--pool", "weighted_gpt4_turbo", "--no-cache"], input=data, env=env
            )
            labels = [json.loads(line)["preference"] for line in result.stdout.splitlines()]
            report["no_logprobs_exit"] = result.exit_code
            report["no_logprobs_hard_labels"] = sum(1 for x in labels if x in (1, 2))
            message = result.stderr or (str(result.exception) if result.exception else "")
            report["no_logprobs_message"] = (
                message.strip().splitlines()[-1][:160] if message.strip() else ""
            )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
