"""Audit of what a killed farm-annotate run costs (not a test): runs against a loopback server that
counts the requests it answers, each stopped mid-run by SIGKILL, SIGTERM or SIGINT at a random
moment, then resumed with the same command; the requests answered beyond one per pair were paid twice.

    .venv/bin/python bench/audit_signals.py [--cases 12] [--seed 5] [--src DIR]

Prints one line per case (signal, concurrency, exit status, requests paid twice) and, per signal, the
most paid twice and whether it stayed within --concurrency. `--src DIR` runs another tree's farmkit.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import OpenAIServer, judge_longer  # noqa: E402


def cached(path: Path) -> int:
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--src")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    worst: dict[str, tuple[int, bool]] = {}
    command = [sys.executable, "-c", "from farmkit.tools.farm_annotate import cli; cli()"]
    env = dict(os.environ, OPENAI_API_KEY="audit")
    if args.src:
        env["PYTHONPATH"] = args.src
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for case in range(args.cases):
            kind = ["SIGKILL", "SIGTERM", "SIGINT"][case % 3]
            concurrency, n = rng.choice([2, 3, 5, 8]), rng.randint(30, 50)
            latency, after = rng.uniform(0.1, 0.4), rng.randint(3, 20)
            pool = tmp / f"pool{case}.yaml"
            pool.write_text(
                f"name: audit\nflip_rate: 0.0\nsettings: {{concurrency: {concurrency}, timeout: 30}}\n"
                "judges:\n  - {name: j, backend: openai, model: m, prompt: plain, batch_size: 1, "
                "temperature: 0.0, max_tokens: 20}\n"
            )
            pairs = tmp / f"pairs{case}.jsonl"
            pairs.write_bytes(
                b"".join(
                    orjson.dumps(
                        {
                            "instruction": f"C{case} Q{i}",
                            "output_1": "no",
                            "output_2": "yes" * (i % 5 + 1),
                        }
                    )
                    + b"\n"
                    for i in range(n)
                )
            )
            cache = tmp / f"c{case}.sqlite"
            args_ = [
                "--pool",
                str(pool),
                "--cache",
                str(cache),
                "-q",
                "-o",
                str(tmp / f"o{case}.jsonl"),
                str(pairs),
            ]
            with OpenAIServer(respond=judge_longer, latency=latency, seed=case) as server:
                env["OPENAI_BASE_URL"] = server.url
                process = subprocess.Popen(
                    command + args_,
                    env=env,
                    cwd=args.src or ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                deadline = time.time() + 60
                while cached(cache) < after and time.time() < deadline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0, latency))
                os.kill(process.pid, getattr(signal, kind))
                process.wait(timeout=120)
                time.sleep(latency + 0.3)
                subprocess.run(
                    command + args_, env=env, cwd=args.src or ROOT, capture_output=True, timeout=300
                )
                twice = server.outcomes["ok"] - n
            within = twice <= concurrency
            best = worst.get(kind, (0, True))
            worst[kind] = (max(best[0], twice), best[1] and within)
            print(
                f"case {case:2d} {kind:7s} concurrency={concurrency} exit={process.returncode} "
                f"paid twice={twice}",
                flush=True,
            )
    for kind, (most, within) in worst.items():
        print(
            f"SUMMARY {kind}: at most {most} request(s) paid twice per kill; within --concurrency: {within}"
        )


if __name__ == "__main__":
    main()
