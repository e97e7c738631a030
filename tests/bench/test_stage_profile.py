"""bench/stage_shell.py and bench/stage_profile.py: make run through the stage shell logs each recipe
line's CPU time (the processes it started included), and the profile adds them up by the pipeline's
stages; a run without the log is profiled from its model folders' meta.json."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("stage_profile", ROOT / "bench" / "stage_profile.py")
stage_profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stage_profile)

# a stand-in farm tool: spends CPU_S of CPU in a child process of its own, then exits
CPU_S = 0.15
BURN = (
    "import time\nstart = time.process_time()\n"
    f"while time.process_time() - start < {CPU_S}:\n    pass\n"
)


def test_make_through_the_stage_shell_logs_each_stage_cpu_time(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("farm-sft", "farm-annotate"):
        tool = tools / name
        tool.write_text(f"#!/bin/sh\n'{sys.executable}' -c '{BURN}'\n")
        tool.chmod(0o755)
    run = tmp_path / "run"
    (tmp_path / "Makefile").write_text(
        "all:\n"
        f"\t@mkdir -p {run}\n"
        f"\tfarm-sft embedded sft.jsonl -o {run}/models/sft --max-steps 2\n"
        f"\tfarm-annotate --pool p --reference ref.jsonl x.jsonl -o {run}/eval/sim/sft.jsonl\n"
    )
    env = {
        **os.environ,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "FARMKIT_STAGE_LOG": str(run / "stages.jsonl"),
    }
    shell = ROOT / "bench" / "stage_shell.py"
    subprocess.run(["make", "-s", "-C", str(tmp_path), f"SHELL={shell}"], env=env, check=True)
    lines = [json.loads(line) for line in (run / "stages.jsonl").read_text().splitlines()]
    assert [line["command"].split()[0] for line in lines] == ["mkdir", "farm-sft", "farm-annotate"]
    stages, source = stage_profile.profile(run)
    assert "stages.jsonl" in source and set(stages) == {"SFT", "evaluation: annotation"}
    for stage in stages.values():
        # the tool's child process spent CPU_S, counted through the shell that waited for it
        assert CPU_S <= stage["cpu_s"] < CPU_S + 5 and stage["n"] == 1
    table = stage_profile.table(stages)
    assert table.splitlines()[1].startswith("SFT") and "100%" in table.splitlines()[-1]


def test_a_failing_line_keeps_its_exit_code(tmp_path):
    (tmp_path / "Makefile").write_text("all:\n\texit 3\n")
    shell = ROOT / "bench" / "stage_shell.py"
    env = {**os.environ, "FARMKIT_STAGE_LOG": str(tmp_path / "stages.jsonl")}
    result = subprocess.run(
        ["make", "-s", "-C", str(tmp_path), f"SHELL={shell}"], env=env, capture_output=True
    )
    assert (
        result.returncode == 2 and json.loads((tmp_path / "stages.jsonl").read_text())["exit"] == 3
    )


def test_a_run_without_the_log_is_profiled_from_meta_json(tmp_path):
    for name, cpu in (("sft", 120.5), ("rm", 60.0), ("ppo", 300.0), ("old", None)):
        (tmp_path / "models" / name).mkdir(parents=True)
        meta = {"tool": "farm-x"} | ({"cpu_seconds": cpu} if cpu is not None else {})
        (tmp_path / "models" / name / "meta.json").write_text(json.dumps(meta))
    stages, source = stage_profile.profile(tmp_path)
    assert "meta.json" in source
    assert {k: v["cpu_s"] for k, v in stages.items()} == {
        "SFT": 120.5,
        "reward model": 60.0,
        "method ppo": 300.0,
    }


def test_each_recipe_of_the_pipeline_has_its_stage():
    """Every farm command `make -n demo` prints falls in a stage of the table (none in `other`)."""
    result = subprocess.run(
        [
            "make",
            "-s",
            "-n",
            "-C",
            str(ROOT / "examples"),
            "results",
            "SIZE=ci",
            "OUT=/nonexistent",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    commands = result.stdout.replace("\\\n", " ").splitlines()  # continued lines joined
    stages = {stage_profile.stage_of(command) for command in commands} - {None}
    assert stages == {
        "split",
        "SFT",
        "sampling (pairs)",
        "annotation (pairs)",
        "reward model",
        *(f"method {m}" for m in stage_profile.METHODS),
        "evaluation: sampling",
        "evaluation: annotation",
        "evaluation: scores",
        "evaluation: leaderboards",
    }
