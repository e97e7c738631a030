"""Two machines, simulated on one (`make test-dist`): farm-grpo launched as README "Scaling out" tells
a user of several machines, `accelerate launch --config_file accelerate_multi_gpu.yaml --num_machines
2 --machine_rank R --main_process_ip HEAD --main_process_port P --num_processes 2`, once per "node"
(ranks 0 and 1, one process each, rendezvous on 127.0.0.1 at a free port, gloo on the CPU). Both
launchers report joining the two-node group under their own rank and exit 0, the one output folder
says two processes ran, node 1 neither reports nor writes, and the policy equals that of the same
two processes started by one launcher on one machine. Every launch is bounded in time: a node that
fails or hangs ends the test, its partner killed with it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

TIMEOUT = 300  # seconds for both nodes together; the tiny run takes about 30 under load

GRPO_ARGS = [
    *("--steps", "2", "--rollout-batch-size", "8", "--num-samples", "2"),
    *("--minibatch-size", "4", "--micro-batch-size", "2", "--max-new-tokens", "4"),
    *("--learning-rate", "2e-3", "--temperature", "1.0", "--save-steps", "1", "--seed", "5"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment() -> dict[str, str]:
    """Without a launcher's variables (a test may run under one); LOGLEVEL=INFO makes each torchrun
    agent log the rendezvous it completed (group_rank, global_ranks, world sizes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def start(command: list[str], logs: Path, name: str) -> subprocess.Popen:
    """The launcher in a session of its own (to kill it with its workers), output to files."""
    return subprocess.Popen(
        command,
        stdout=(logs / f"{name}.out").open("wb"),
        stderr=(logs / f"{name}.err").open("wb"),
        env=environment(),
        start_new_session=True,
    )


def finish(launches: list[subprocess.Popen], timeout: float) -> None:
    """Wait for every launch; when one fails or time runs out, kill whatever still runs (each
    launcher's process group: its workers too), so that no node waits on its partner for ever."""
    deadline = time.monotonic() + timeout
    while any(launch.poll() is None for launch in launches):
        failed = any(launch.returncode not in (None, 0) for launch in launches)
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for launch in launches:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()


def tail(logs: Path, name: str) -> str:
    path = logs / f"{name}.err"
    text = path.read_bytes().decode(errors="replace")[-3000:] if path.exists() else "(no log)"
    return f"--- {name}:\n{text}"


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def test_two_nodes_train_one_policy_together(tmp_path, tiny_model_path):
    from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl

    from farmkit.methods.sft import SHIPPED_CONFIGS

    sft = tiny_sft(tiny_model_path, tmp_path / "sft")
    rm = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(16))
    tool = ["-m", "farmkit.tools.farm_grpo", str(sft), str(rm), str(prompts), *GRPO_ARGS]
    logs, nodes, single = tmp_path / "logs", tmp_path / "nodes", tmp_path / "single"
    for folder in (logs, nodes, single):
        folder.mkdir()

    port = free_port()
    launches = [
        start(
            [
                *(sys.executable, "-m", "accelerate.commands.launch"),
                *("--config_file", str(SHIPPED_CONFIGS / "accelerate_multi_gpu.yaml")),
                *("--num_machines", "2", "--machine_rank", str(rank), "--num_processes", "2"),
                *("--main_process_ip", "127.0.0.1", "--main_process_port", str(port)),
                *("--mixed_precision", "no", "--dynamo_backend", "no"),
                *tool,
                *("-o", str(nodes / "out")),
            ],
            logs,
            f"node{rank}",
        )
        for rank in (0, 1)
    ]
    finish(launches, TIMEOUT)
    report = tail(logs, "node0") + "\n" + tail(logs, "node1")
    assert [launch.returncode for launch in launches] == [0, 0], report

    for rank in (0, 1):
        # each launcher joined the two-node group as its own node and saw its worker finish
        agent = (logs / f"node{rank}.err").read_text(errors="replace")
        for line in (
            f"group_rank={rank}",
            "group_world_size=2",
            f"global_ranks=[{rank}]",
            "global_world_sizes=[2]",
            "worker group successfully finished",
        ):
            assert line in agent, (rank, line, report)
        assert (logs / f"node{rank}.out").read_bytes() == b""
    node0 = (logs / "node0.err").read_text(errors="replace")
    node1 = (logs / "node1.err").read_text(errors="replace")
    # rank 0 reports and writes; rank 1, on the other node, does neither
    assert node0.count("step 2/2") == 1 and "step 2/2" not in node1, report
    assert f"wrote {nodes / 'out'}" in node0 and "wrote" not in node1, report
    assert sorted(path.name for path in nodes.iterdir()) == ["out", "out-checkpoints"]
    meta = json.loads((nodes / "out" / "meta.json").read_text())
    assert meta["launch"] == {
        "distributed_type": "MULTI_CPU",
        "num_processes": 2,
        "zero_stage": 0,
        "mixed_precision": "no",
    }
    rows = [json.loads(line) for line in (nodes / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]

    # the same two processes from one launcher on one machine: the same ranks, seeds and sums, so
    # the same policy to float32 rounding (measured: identical); node 1 did its share of the work
    reference = start(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
            *("--nproc_per_node", "2", *tool, "-o", str(single / "out")),
        ],
        logs,
        "single",
    )
    finish([reference], TIMEOUT)
    assert reference.returncode == 0, tail(logs, "single")
    trained, expected, start_weights = weights(nodes / "out"), weights(single / "out"), weights(sft)
    assert sum(not torch.equal(trained[n], start_weights[n]) for n in trained) > len(trained) // 2
    for name in expected:
        torch.testing.assert_close(trained[name], expected[name], atol=1e-6, rtol=1e-5)
