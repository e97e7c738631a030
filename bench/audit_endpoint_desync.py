"""Audit (issue 22 part 1), not a test: farm-annotate against a local server that sends, on some
kept-alive connections, a second reply nobody asked for. Counts verdicts that differ from what the
server's judge answered (the longer output wins). Cases differ from the test's: other pools, batch
sizes, fault rates, seeds, concurrency, and pairs whose longer output is on either side.

    .venv/bin/python bench/audit_endpoint_desync.py
"""

from __future__ import annotations

import importlib.resources
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import OpenAIServer, judge_longer  # noqa: E402

# (pool, extra-reply rate, seed, chunked, concurrency, pairs)
CASES = [
    ("sim_eval", 0.10, 11, False, 6, 150),
    ("single", 0.05, 12, False, 16, 200),
    ("single", 0.20, 13, True, 3, 120),
    ("sim_ann", 0.10, 14, False, 8, 150),
]


def pairs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        short, long = f"Reply {i}.", f"Reply {i}, " + "with more words " * rng.randint(1, 6)
        first, second = (short, long) if rng.random() < 0.5 else (long, short)
        rows.append({"instruction": f"Task {seed}-{i}?", "output_1": first, "output_2": second})
    return rows


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="audit-desync-"))
    total_wrong = total = 0
    for pool, rate, seed, chunked, concurrency, n in CASES:
        text = importlib.resources.files("farmkit.annotate").joinpath("pools", f"{pool}.yaml")
        settings = f"settings: {{timeout: 10.0, backoff: 0.01, max_retries: 4, concurrency: {concurrency}}}\n"
        path = folder / f"{pool}-{seed}.yaml"
        path.write_text(text.read_text().replace("judges:", settings + "judges:", 1))
        rows = pairs(n, seed)
        with OpenAIServer(
            respond=judge_longer, faults={"extra_reply": rate}, seed=seed, chunked=chunked
        ) as server:
            env = dict(os.environ, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="audit")
            done = subprocess.run(
                [
                    str(Path(sys.executable).parent / "farm-annotate"),
                    "--pool",
                    str(path),
                    "--no-cache",
                    "-q",
                ],
                input="".join(json.dumps(r) + "\n" for r in rows).encode(),
                capture_output=True,
                env=env,
                timeout=600,
            )
        records = [json.loads(line) for line in done.stdout.splitlines()]
        judged = [r for r in records if not r["provenance"]["farm-annotate"].get("noised")]
        wrong = sum(
            r["preference"] != (2 if len(r["output_2"]) > len(r["output_1"]) else 1) for r in judged
        )
        total_wrong, total = total_wrong + wrong, total + len(judged)
        print(
            json.dumps(
                {
                    "pool": pool,
                    "extra_reply_rate": rate,
                    "chunked": chunked,
                    "concurrency": concurrency,
                    "judged": len(judged),
                    "wrong": wrong,
                    "wrong_fraction": round(wrong / max(1, len(judged)), 3),
                    "extra_replies_sent": server.outcomes["extra_reply"],
                    "connections": server.connections,
                    "exit": done.returncode,
                }
            ),
            flush=True,
        )
    print(json.dumps({"total_judged": total, "total_wrong": total_wrong}))


if __name__ == "__main__":
    main()
