"""The shipped accelerate configs fix no process count (the launcher gives it) and load in accelerate."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from farmkit.methods.sft import SHIPPED_CONFIGS

ACCELERATE_CONFIGS = sorted(SHIPPED_CONFIGS.glob("accelerate_*.yaml"))


def test_there_are_accelerate_configs():
    assert {path.name for path in ACCELERATE_CONFIGS} >= {
        "accelerate_multi_gpu.yaml",
        "accelerate_zero2.yaml",
        "accelerate_zero3.yaml",
    }


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda path: path.name)
def test_config_leaves_the_process_count_to_the_launcher(path):
    config = yaml.safe_load(path.read_text())
    assert "num_processes" not in config
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(path))
    assert loaded.num_processes == -1  # accelerate's "pass --num_processes" marker
    assert loaded.distributed_type in ("MULTI_GPU", "DEEPSPEED")


@pytest.mark.heavy
def test_launch_without_num_processes_is_refused_with_accelerates_message(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(SHIPPED_CONFIGS / "accelerate_multi_gpu.yaml"),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "--num_processes" in done.stderr
