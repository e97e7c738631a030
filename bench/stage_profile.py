"""The CPU time of examples/Makefile's pipeline (`make demo`, `make study`) stage by stage.

    python bench/stage_profile.py RUN               # a finished run folder (examples/runs/demo)
    python bench/stage_profile.py --run [--size demo] [--out DIR]   # run the pipeline, then profile it
    python bench/stage_profile.py RUN --json        # the stages as JSON lines (bench/run.py's rows)

A run made through bench/stage_shell.py (what --run and bench/bench_demo.py do) holds stages.jsonl:
every recipe line's user and system CPU seconds, its own processes and whatever they started, so
every stage counts, annotation and evaluation included. A run made with a plain `make demo` has no
such log: the trainers' meta.json still records each training tool's CPU seconds (`cpu_seconds`),
so SFT, the reward model and the trained methods are profiled, and the rest is listed as unknown.

Stages: split, SFT, sampling (the pairs on the pref split), annotation (the pairs' preferences),
reward model, each method (best-of-n's sampling on val is the method), evaluation (every system's
sampling on val, the reference's, the annotations against the reference, the reward-model scores,
leaderboards and correlation).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE_LOG = "stages.jsonl"
METHODS = ("bon", "expiter", "ppo", "quark", "dpo", "feedme", "rc")
ORDER = (
    "split",
    "SFT",
    "sampling (pairs)",
    "annotation (pairs)",
    "reward model",
    *(f"method {m}" for m in METHODS),
    "evaluation: sampling",
    "evaluation: annotation",
    "evaluation: scores",
    "evaluation: leaderboards",
    "other",
)


def stage_of(command: str) -> str | None:
    """The pipeline stage a recipe line belongs to, by its tool and the file it writes (-o); None for
    a line that runs no farm tool (mkdir, touch, make's own calls)."""
    try:
        words = shlex.split(command.replace("\\\n", " "))  # a recipe's continued lines
    except ValueError:
        return "other"
    tools = [w for w in words if w.startswith("farm-") or w.startswith("farmkit.tools.")]
    if not tools and "report.py" not in command:
        return None
    tool = tools[0].removeprefix("farmkit.tools.").replace("_", "-") if tools else "report"
    out = words[words.index("-o") + 1] if "-o" in words[:-1] else ""
    parts = Path(out).parts
    name = Path(out).stem
    if tool == "farm-split":
        return "split"
    if tool in ("farm-sft", "farm-rm-train", "farm-dpo", "farm-expiter", "farm-ppo", "farm-quark"):
        model = parts[-1] if parts else ""
        if model == "sft":
            return "SFT"
        if model == "rm":
            return "reward model"
        return f"method {model}" if model in METHODS else "other"
    if tool == "farm-bon":
        return "method bon"
    if tool == "farm-sample":
        return "sampling (pairs)" if name == "pairs" else "evaluation: sampling"
    if tool == "farm-annotate":
        return "evaluation: annotation" if "--reference" in words else "annotation (pairs)"
    if tool == "farm-score":
        return "evaluation: scores"
    if tool in ("farm-winrate", "farm-correlate", "report"):
        return "evaluation: leaderboards"
    return "other"


def from_log(path: Path) -> dict[str, dict[str, float]]:
    """Stages from a stages.jsonl: CPU (user + system), wall and the number of commands."""
    stages: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "wall_s": 0.0, "n": 0})
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        stage = stage_of(row["command"])
        if stage is None:
            continue
        stages[stage]["cpu_s"] += row["user_s"] + row["sys_s"]
        stages[stage]["wall_s"] += row["wall_s"]
        stages[stage]["n"] += 1
    return dict(stages)


def from_meta(run: Path) -> dict[str, dict[str, float]]:
    """The training stages from each model folder's meta.json (`cpu_seconds`), where recorded."""
    stages: dict[str, dict[str, float]] = {}
    for meta_path in sorted((run / "models").glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        cpu = meta.get("cpu_seconds")
        if cpu is None:
            continue
        name = meta_path.parent.name
        stage = {"sft": "SFT", "rm": "reward model"}.get(name, f"method {name}")
        stages[stage] = {"cpu_s": float(cpu), "wall_s": 0.0, "n": 1}  # no wall time recorded
    return stages


def profile(run: Path) -> tuple[dict[str, dict[str, float]], str]:
    log = run / STAGE_LOG
    if log.is_file():
        return from_log(log), f"{log} (every recipe line, measured by bench/stage_shell.py)"
    return from_meta(run), f"{run}/models/*/meta.json (training tools only; no {STAGE_LOG})"


def table(stages: dict[str, dict[str, float]]) -> str:
    total = sum(s["cpu_s"] for s in stages.values()) or 1.0
    rows = [("stage", "commands", "CPU s", "share", "wall s")]
    for name in sorted(stages, key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER)):
        s = stages[name]
        rows.append(
            (
                name,
                str(int(s["n"])),
                f"{s['cpu_s']:.1f}",
                f"{s['cpu_s'] / total:.1%}",
                f"{s['wall_s']:.1f}",
            )
        )
    rows.append(
        ("total", str(int(sum(s["n"] for s in stages.values()))), f"{total:.1f}", "100%", "")
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def json_rows(stages: dict[str, dict[str, float]], label: str) -> list[dict]:
    total = sum(s["cpu_s"] for s in stages.values()) or 1.0
    return [
        {
            "benchmark": "stages",
            "figure": f"{label}: {name} CPU time (user + system), share of the pipeline's",
            "value": s["cpu_s"],
            "unit": "CPU s",
            "peer": "whole pipeline",
            "peer_value": total,
            "ratio": s["cpu_s"] / total,
            "target": "",
            "met": None,
        }
        for name, s in sorted(stages.items(), key=lambda kv: -kv[1]["cpu_s"])
    ]


def run_pipeline(out: Path, size: str = "demo", jobs: int = 2, env: dict | None = None) -> float:
    """`make demo` (examples/Makefile) into `out` through stage_shell.py, which logs out/stages.jsonl.
    Returns the wall seconds; raises on failure with make's last output."""
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **(env or os.environ),
        "FARMKIT_STAGE_LOG": str(out.resolve() / STAGE_LOG),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
    }
    started = time.perf_counter()
    result = subprocess.run(
        [
            "make",
            "-C",
            str(ROOT / "examples"),
            "demo",
            f"SIZE={size}",
            f"JOBS={jobs}",
            f"OUT={out.resolve()}",
            f"SHELL={ROOT / 'bench' / 'stage_shell.py'}",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"make demo failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    sys.stderr.write(result.stdout)
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a finished run folder (OUT of examples/Makefile)")
    parser.add_argument("--run", dest="do_run", action="store_true", help="run `make demo` first")
    parser.add_argument("--size", default="demo")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="where --run writes (default: examples/runs/SIZE-profile)")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    args = parser.parse_args()
    if args.do_run:
        run = Path(args.out or ROOT / "examples" / "runs" / f"{args.size}-profile")
        if run.exists() and any(run.iterdir()):
            parser.error(f"{run} is not empty: give a new --out")
        wall = run_pipeline(run, args.size, args.jobs)
        print(f"make demo SIZE={args.size}: {wall:.0f} s wall", file=sys.stderr)
    elif args.run:
        run = Path(args.run)
    else:
        parser.error("give a run folder, or --run")
    if not run.is_dir():
        parser.error(f"{run}: not a folder")
    stages, source = profile(run)
    if args.json:
        for row in json_rows(stages, run.name):
            print(json.dumps(row))
        return 0
    print(f"# {source}")
    print(table(stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
