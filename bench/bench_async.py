"""Steps per hour of farm-grpo with --async-rollouts (the next batch sampled by a copy of the policy
in a thread while the current one trains, one step of staleness) against the same run synchronous,
in one run of this script (no target is promised on the CPU: the ratio async / sync is reported,
above 1 where the overlap pays).

Set-up: bench/bench_rl.py's (the embedded model as policy and reference, its body with a fresh
score head as reward model, the same prompts and GRPO settings), smaller by default: 2 prompts x
4 samples a step, 32 new tokens, 1 + 3 steps (BENCH_ASYNC_STEPS timed steps). Each run is its own
farm-grpo process, one after the other (sync first), with BENCH_ASYNC_THREADS (1) torch threads:
each Python thread's kernels run on that thread, so with one torch thread the synchronous run
uses one core and the asynchronous one up to two (the sampler's thread beside the trainer's); with
BENCH_ASYNC_THREADS=2 both may use both cores, and the overlap has only the cores' idle time to
fill. Timed: the wall time between the ends of consecutive steps after the first (metrics.jsonl's
elapsed_s), as bench_rl times them; the first step has nothing to overlap with. The async run's
metrics rows must log staleness 0, then 1.

Prints a table on stderr and one JSON line per figure on stdout (bench/run.py's format).
`make gpu-check` measures the same on a GPU (its async-rollouts section).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_rl import (  # noqa: E402
    Settings,
    build_reward_model,
    farmkit_args,
    prompt_records,
)

STEPS = int(os.environ.get("BENCH_ASYNC_STEPS", "3"))
THREADS = os.environ.get("BENCH_ASYNC_THREADS", "1")


def run(settings: Settings, paths: dict[str, str], folder: Path, asynchronous: bool) -> dict:
    output = str(folder / ("async" if asynchronous else "sync"))
    argv = [str(Path(sys.executable).parent / "farm-grpo")]
    argv += farmkit_args("grpo", settings, paths["policy"], paths["rm"], paths["prompts"], output)
    argv += ["-q"] + (["--async-rollouts"] if asynchronous else [])
    env = {**os.environ, "OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS}
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"farm-grpo failed ({result.returncode}): {result.stderr[-2000:]}")
    metrics = Path(output + "-checkpoints") / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    ends = [row["elapsed_s"] for row in rows]
    timed = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {
        "step_s": timed,
        "steps_per_hour": 3600 * len(timed) / sum(timed),
        "staleness": [row.get("staleness") for row in rows],
    }


def main() -> None:
    from farmkit.lm.models import resolve

    settings = Settings(prompts_per_step=2, samples=4, max_new_tokens=32, warmup=1, steps=STEPS)
    settings.check()
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        folder = Path(tmp)
        policy = str(resolve("embedded"))
        prompts = folder / "prompts.jsonl"
        prompts.write_text(
            "".join(json.dumps(r) + "\n" for r in prompt_records(settings.total_steps * 2))
        )
        rm = build_reward_model(policy, folder / "reward-model", settings.seed)
        paths = {"policy": policy, "rm": str(rm), "prompts": str(prompts)}
        sync = run(settings, paths, folder, asynchronous=False)
        ahead = run(settings, paths, folder, asynchronous=True)
    if ahead["staleness"] != [0] + [1] * STEPS:
        sys.exit(f"--async-rollouts logged staleness {ahead['staleness']}, not 0 then 1")
    ratio = ahead["steps_per_hour"] / sync["steps_per_hour"]
    print(
        f"farm-grpo, {settings.rollout} rollouts x {settings.max_new_tokens} tokens a step, "
        f"{THREADS} torch thread(s): sync {sync['steps_per_hour']:.1f} steps/h "
        f"({[round(s, 2) for s in sync['step_s']]} s), async {ahead['steps_per_hour']:.1f} "
        f"steps/h ({[round(s, 2) for s in ahead['step_s']]} s), ratio {ratio:.3f}",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "benchmark": "async",
                "figure": f"farm-grpo steps per hour with --async-rollouts ({THREADS} torch thread(s))",
                "value": round(ahead["steps_per_hour"], 1),
                "unit": "steps/h",
                "peer": "synchronous",
                "peer_value": round(sync["steps_per_hour"], 1),
                "ratio": round(ratio, 3),
                "target": "",
                "met": None,
            }
        )
    )


if __name__ == "__main__":
    main()
