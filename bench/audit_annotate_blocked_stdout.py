"""Audit (issue 22 part 3), not a test: run A writes into a pipe nobody reads (it fills and A blocks
writing); run B, on the same cache, asks for the same or overlapping pairs. Reports B's wall time
against the claims' lease, and questions asked twice (paid twice) across both runs. Cases differ from
the test's: other pools, sizes, overlap and latency.

    .venv/bin/python bench/audit_annotate_blocked_stdout.py   (PYTHONPATH=<old checkout> for the baseline)
"""

from __future__ import annotations

import importlib.resources
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import OpenAIServer, judge_longer, shown_pairs  # noqa: E402

# (pool, A's pairs, B's pairs (range), concurrency, latency s)
CASES = [
    ("sim_eval", range(0, 300), range(0, 300), 4, 0.1),
    ("single", range(0, 200), range(30, 230), 8, 0.05),
    ("single", range(0, 250), range(249, -1, -1), 6, 0.08),  # B asks in the reverse order
]
B_LIMIT = 240  # seconds B is given (the old lease here: 5 s x 4 x 3 + 60 = 120 s)


def pair(i: int) -> dict:
    short, long = f"Answer {i}." + " " * 500, f"Answer {i}, longer " * 3 + " " * 500
    return {"instruction": f"Case {i}?", "output_1": short, "output_2": long}


def verdicts(cache: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(cache, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="audit-blocked-"))
    binary = str(Path(sys.executable).parent / "farm-annotate")
    for number, (pool, a_range, b_range, concurrency, latency) in enumerate(CASES):
        text = importlib.resources.files("farmkit.annotate").joinpath("pools", f"{pool}.yaml")
        settings = (
            f"settings: {{timeout: 5, max_retries: 2, backoff: 0.05, concurrency: {concurrency}}}\n"
        )
        pool_path = folder / f"{pool}.yaml"
        pool_path.write_text(text.read_text().replace("judges:", settings + "judges:", 1))
        inputs = []
        for name, indices in (("a", a_range), ("b", b_range)):
            path = folder / f"{number}-{name}.jsonl"
            path.write_text("".join(json.dumps(pair(i)) + "\n" for i in indices))
            inputs.append(str(path))
        cache = folder / f"{number}.sqlite"
        with OpenAIServer(respond=judge_longer, latency=latency) as server:
            env = dict(os.environ, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="audit")
            command = [binary, "--pool", str(pool_path), "--cache", str(cache), "-q"]
            first = subprocess.Popen(
                [*command, inputs[0]], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            # B starts once A has stopped answering for a second: blocked on its full pipe (before the
            # fix), or done (after it)
            deadline, seen, since = time.time() + 60, -1, time.time()
            while time.time() < deadline and (seen <= 0 or time.time() - since < 1.0):
                count = verdicts(cache)
                if count != seen:
                    seen, since = count, time.time()
                time.sleep(0.05)
            started = time.time()
            try:
                second = subprocess.run(
                    [*command, inputs[1]], env=env, capture_output=True, timeout=B_LIMIT
                )
                b_exit = second.returncode
            except subprocess.TimeoutExpired:
                b_exit = "killed at the limit"
            b_seconds = time.time() - started
            a_blocked = first.poll() is None
            a_out, _ = first.communicate(timeout=300)
        asked = Counter(frozenset(p) for body in server.bodies for p in shown_pairs(body)[1])
        print(
            json.dumps(
                {
                    "pool": pool,
                    "a_pairs": len(a_range),
                    "b_pairs": len(b_range),
                    "concurrency": concurrency,
                    "a_verdicts_when_b_started": seen,
                    "b_seconds": round(b_seconds, 1),
                    "b_exit": b_exit,
                    "a_still_blocked_when_b_ended": a_blocked,
                    "a_records": len(a_out.splitlines()),
                    "questions": len(asked),
                    "asked_twice": sum(count - 1 for count in asked.values()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
