"""What keeping freed memory in the process buys (farmkit/core/allocator.py): one farm-dpo run on the
embedded model with the tools' allocator settings against the same run with glibc's defaults
(FARMKIT_KEEP_FREED_MEMORY=0), in one run of this script (target: ratio kept / default <= 1 in
wall time, CPU time and page faults).

Each run is its own process, one torch thread, started one after the other, alternating which goes
first (`BENCH_ALLOCATOR_ROUNDS` rounds, 1: default then kept, 2 adds kept then default). The figures
are the child's wall time, its CPU time (user + system, from wait4's rusage) and its minor page
faults, summed over the rounds, and its peak resident memory (the largest; target: at most 1.25
times the default's, since a process that keeps freed memory holds its peak, and fragments of it,
until it exits). The run: 16 preference pairs (short instructions, two one-sentence answers),
batch 8, `BENCH_ALLOCATOR_STEPS` (4) optimizer steps.
Prints a table on stderr and one JSON line per figure on stdout (bench/run.py's format).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = int(os.environ.get("BENCH_ALLOCATOR_STEPS", "4"))
ROUNDS = int(os.environ.get("BENCH_ALLOCATOR_ROUNDS", "1"))
THINGS = ["kettle", "harbour", "violin", "lantern", "glacier", "orchard", "compass", "meadow"]


def pairs(path: Path) -> Path:
    with path.open("w") as file:
        for i in range(16):
            thing = THINGS[i % len(THINGS)]
            record = {
                "instruction": f"Describe a {thing} in one sentence ({i}).",
                "input": "",
                "output_1": f"A {thing} is a familiar thing that people notice and use every day.",
                "output_2": f"{thing}.",
                "preference": 1,
            }
            file.write(json.dumps(record) + "\n")
    return path


def run(folder: Path, prefs: Path, kept: bool, number: int) -> dict:
    tool = str(Path(sys.executable).parent / "farm-dpo")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FARMKIT_KEEP_FREED_MEMORY": "1" if kept else "0"}
    for name in (
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GLIBC_TUNABLES",
        "LD_PRELOAD",
    ):
        env.pop(name, None)
    argv = [tool, "embedded", str(prefs), "-o", str(folder / f"dpo-{number}")]
    argv += ["--max-steps", str(STEPS), "--batch-size", "8", "-q"]
    began = time.monotonic()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(
            f"farm-dpo failed ({process.returncode}): {process.stderr.read().decode()[-2000:]}"
        )
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "system_s": usage.ru_stime,
        "page_faults": usage.ru_minflt,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def main() -> None:
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-allocator-") as tmp:
        folder = Path(tmp)
        prefs = pairs(folder / "prefs.jsonl")
        order = [False, True, True, False][: 2 * ROUNDS]
        for number, kept in enumerate(order):
            runs[kept].append(run(folder, prefs, kept, number))
    total = {kept: {k: sum(r[k] for r in rows) for k in rows[0]} for kept, rows in runs.items()}
    for kept, rows in runs.items():  # the largest, not the sum
        total[kept]["peak_rss_mib"] = max(r["peak_rss_mib"] for r in rows)
    units = {
        "wall_s": "s",
        "cpu_s": "s",
        "system_s": "s",
        "page_faults": "faults",
        "peak_rss_mib": "MiB",
    }
    for key, unit in units.items():
        value, peer = total[True][key], total[False][key]
        ratio = value / peer if peer else None
        row = {
            "benchmark": "allocator",
            "figure": f"farm-dpo {STEPS} steps, embedded: {key}",
            "value": value,
            "unit": unit,
            "peer": "glibc defaults",
            "peer_value": peer,
            "ratio": ratio,
        }
        if key == "peak_rss_mib":  # what keeping freed memory costs: the peak, a little more
            row["target"] = "<= 1.25"
            row["met"] = ratio is not None and ratio <= 1.25
        elif key != "system_s":
            row["target"] = "<= 1"
            row["met"] = ratio is not None and ratio <= 1
        print(json.dumps(row), flush=True)
        print(
            f"{key:12s} kept {value:12.1f}  default {peer:12.1f}  ratio {ratio:.3f}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
