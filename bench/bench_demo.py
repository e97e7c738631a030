"""The demo's promise: `make demo` (examples/Makefile, SIZE=demo, the embedded model, offline) runs
the whole laboratory in at most 20 minutes on a 2-core CPU.

Runs the demo in a fresh output folder with an empty farmkit cache, so the embedded model's
conversion from GGUF and every annotation are part of the time, as on a fresh clone (the
installation is not). Prints the wall time against the 1,200 s limit, and how loaded the machine
was (the 1-minute load average at the start and the end), since other work on the machine slows
it down. The demo runs through bench/stage_shell.py, so the CPU time of every stage (split, SFT,
sampling, annotation, reward model, each method, evaluation) follows as rows of its own, with its
share of the whole (bench/stage_profile.py prints the same table for any run folder).

    python bench/bench_demo.py [--size demo] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import stage_profile  # noqa: E402

LIMIT_S = 1200.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="demo")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="farmkit-bench-demo-") as scratch:
        env = {
            **os.environ,
            "FARMKIT_CACHE": str(Path(scratch) / "cache"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHON": sys.executable,
            "FARMKIT_STAGE_LOG": f"{scratch}/{stage_profile.STAGE_LOG}",
        }
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        result = subprocess.run(
            [
                "make",
                "-C",
                str(ROOT / "examples"),
                "demo",
                f"SIZE={args.size}",
                f"JOBS={args.jobs}",
                f"OUT={scratch}/run",
                f"SHELL={ROOT / 'bench' / 'stage_shell.py'}",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        load_after = os.getloadavg()[0]
        log = Path(scratch) / stage_profile.STAGE_LOG
        stages = stage_profile.from_log(log) if log.is_file() else {}
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
        sys.exit(1)
    sys.stderr.write(result.stdout)
    sys.stderr.write(stage_profile.table(stages) + "\n")
    for row in stage_profile.json_rows(stages, f"make demo SIZE={args.size}"):
        print(json.dumps(row))
    print(
        json.dumps(
            {
                "benchmark": "demo",
                "figure": f"make demo SIZE={args.size} wall time (load {load_before:.1f} -> {load_after:.1f})",
                "value": wall,
                "unit": "s",
                "peer": "limit",
                "peer_value": LIMIT_S,
                "ratio": wall / LIMIT_S,
                "target": "<= 1",
                "met": wall <= LIMIT_S,
            }
        )
    )


if __name__ == "__main__":
    main()
