"""Audit (issue 22 part 2), not a test: farm-annotate against local servers that answer one request at
a time (the others queued, and a request whose client gave up still worked on), with latencies near
the timeout. Reports wall time, retries, pairs without a verdict and the requests the server worked
on (those abandoned by the client included). Cases differ from the test's.

    .venv/bin/python bench/audit_endpoint_adapt.py      (PYTHONPATH=<old checkout> for the baseline)
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import OpenAIServer, judge_longer  # noqa: E402

# (pool, latency s, timeout s, pairs, concurrency)
CASES = [
    ("single", 0.7, 1.0, 12, 16),
    ("single", 0.3, 1.0, 20, 8),
    ("sim_eval", 1.2, 2.0, 16, 16),
    ("single", 0.45, 1.0, 16, 4),
]


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="audit-adapt-"))
    for pool, latency, timeout, n, concurrency in CASES:
        text = importlib.resources.files("farmkit.annotate").joinpath("pools", f"{pool}.yaml")
        settings = (
            f"settings: {{timeout: {timeout}, backoff: 0.2, max_retries: 6, "
            f"concurrency: {concurrency}}}\n"
        )
        path = folder / f"{pool}-{latency}.yaml"
        path.write_text(text.read_text().replace("judges:", settings + "judges:", 1))
        rows = [
            {"instruction": f"Item {i}?", "output_1": f"Short {i}.", "output_2": f"Long {i} " * 4}
            for i in range(n)
        ]
        with OpenAIServer(respond=judge_longer, latency=latency, serial=True) as server:
            env = dict(os.environ, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="audit")
            started = time.time()
            done = subprocess.run(
                [
                    str(Path(sys.executable).parent / "farm-annotate"),
                    "--pool",
                    str(path),
                    "--no-cache",
                ],
                input="".join(json.dumps(r) + "\n" for r in rows).encode(),
                capture_output=True,
                env=env,
                timeout=900,
            )
            seconds = time.time() - started
        records = [json.loads(line) for line in done.stdout.splitlines()]
        summary = [line for line in done.stderr.decode().splitlines() if "items (" in line] or [
            done.stderr.decode()[-300:]
        ]
        retries = re.search(r"\+(\d+) retries", summary[-1])
        print(
            json.dumps(
                {
                    "pool": pool,
                    "latency": latency,
                    "timeout": timeout,
                    "pairs": n,
                    "concurrency": concurrency,
                    "seconds": round(seconds, 1),
                    "retries": int(retries[1]) if retries else 0,
                    "without_verdict": sum(r["preference"] is None for r in records),
                    "wrong": sum(r["preference"] not in (None, 2) for r in records),
                    "server_worked_on": server.outcomes["ok"],
                    "summary": summary[-1][:400],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
