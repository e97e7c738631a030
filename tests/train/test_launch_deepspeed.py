"""farm-ppo, farm-rloo and farm-grpo under DeepSpeed for real, in one CPU process (`make
test-deepspeed` builds a venv with DeepSpeed; the normal suite skips these): ZeRO-2 and ZeRO-3
train the policy (PPO: the policy and the value model as one engine), with micro-batches accumulated
into minibatches, and the saved policy folder holds full weights equal to those of the same run
without DeepSpeed; a run resumes from the engine's own checkpoint to the same weights. What DeepSpeed
cannot honour (--lora under ZeRO-3, a checkpoint of the other kind) is refused with an error before
any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import assert_no_stdout_from_the_tool
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

PPO_ARGS = [
    "--steps",
    "2",
    "--rollout-batch-size",
    "8",
    "--minibatch-size",
    "4",
    "--micro-batch-size",
    "2",
    "--max-new-tokens",
    "4",
    "--learning-rate",
    "2e-3",
    "--temperature",
    "1.0",
    "--save-steps",
    "1",
    "--seed",
    "5",
]


@pytest.fixture(scope="module")
def files(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepspeed")
    prompts = write_jsonl(folder / "prompts.jsonl", prompt_records(16))
    return (
        folder,
        prompts,
        tiny_sft(tiny_model_path, folder / "sft"),
        keyword_reward_model(tiny_model_path, folder / "rm"),
    )


@pytest.fixture(scope="module")
def plain_run(files):
    """The same run as one process without DeepSpeed, for the weights to compare against."""
    folder, prompts, sft, rm = files
    output = folder / "plain"
    result = launch(["--num_processes", "1", "--cpu"], sft, rm, prompts, output)
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    assert_no_stdout_from_the_tool(result, deepspeed_launcher=False)
    assert b"DEEPSPEED" not in (output / "meta.json").read_bytes()
    return output


GROUP_ARGS = [
    *("--steps", "2", "--rollout-batch-size", "8", "--num-samples", "2"),
    *("--minibatch-size", "4", "--micro-batch-size", "2", "--max-new-tokens", "4"),
    *("--learning-rate", "2e-3", "--temperature", "1.0", "--save-steps", "1", "--seed", "5"),
]


def launch(
    launcher_args: list[str],
    sft,
    rm,
    prompts,
    output,
    tool: str = "farm_ppo",
    args: list[str] = PPO_ARGS,
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launcher_args,
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        f"farmkit.tools.{tool}",
        str(sft),
        str(rm),
        str(prompts),
        "-o",
        str(output),
        *args,
    ]
    return subprocess.run(command, capture_output=True, timeout=900, env=env)


def weights(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


@pytest.mark.parametrize("stage", [2, 3])
def test_ppo_under_deepspeed_saves_the_trained_full_weights(files, plain_run, stage):
    folder, prompts, sft, rm = files
    output = folder / f"zero{stage}"
    result = launch(
        ["--use_deepspeed", "--zero_stage", str(stage), "--num_processes", "1"],
        sft,
        rm,
        prompts,
        output,
    )
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    assert_no_stdout_from_the_tool(result, deepspeed_launcher=True)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["launch"] == {
        "distributed_type": "DEEPSPEED",
        "num_processes": 1,
        "zero_stage": stage,
        "mixed_precision": "no",
    }
    assert [
        json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]
    assert (folder / f"zero{stage}-checkpoints" / "step-000001" / "meta.json").is_file()

    trained, start, reference = weights(output), weights(sft), weights(plain_run)
    assert trained.keys() == start.keys()
    assert all(
        trained[name].shape == start[name].shape for name in start
    )  # whole tensors, not ZeRO shards
    changed = [name for name in start if not torch.equal(trained[name], start[name])]
    assert len(changed) > len(start) // 2
    # the engine trained what the plain loop trains: same rollouts, same accumulated updates
    for name in start:
        torch.testing.assert_close(trained[name], reference[name], atol=1e-4, rtol=1e-3)


ZERO = ["--use_deepspeed", "--num_processes", "1", "--zero_stage"]


@pytest.fixture(scope="module")
def plain_group_runs(files):
    """farm-rloo and farm-grpo as one process without DeepSpeed, for the weights to compare against."""
    folder, prompts, sft, rm = files
    runs = {}
    for tool in ("farm_rloo", "farm_grpo"):
        output = folder / f"{tool}-plain"
        result = launch(
            ["--num_processes", "1", "--cpu"], sft, rm, prompts, output, tool, GROUP_ARGS
        )
        assert result.returncode == 0, result.stderr.decode()[-4000:]
        assert_no_stdout_from_the_tool(result, deepspeed_launcher=False)
        runs[tool] = output
    return runs


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("tool", ["farm_rloo", "farm_grpo"])
def test_group_methods_under_deepspeed_save_the_trained_full_weights(
    files, plain_group_runs, tool, stage
):
    """RLOO and GRPO share PPO's engine handling (policy alone as one module, gathered whole under
    ZeRO-3 to generate and to save): two steps, a checkpoint, and the plain run's weights."""
    folder, prompts, sft, rm = files
    output = folder / f"{tool}-zero{stage}"
    result = launch([*ZERO, str(stage)], sft, rm, prompts, output, tool, GROUP_ARGS)
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    assert_no_stdout_from_the_tool(result, deepspeed_launcher=True)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["launch"] == {
        "distributed_type": "DEEPSPEED",
        "num_processes": 1,
        "zero_stage": stage,
        "mixed_precision": "no",
    }
    assert [
        json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]
    assert (folder / f"{tool}-zero{stage}-checkpoints" / "step-000001" / "meta.json").is_file()
    trained, start, reference = weights(output), weights(sft), weights(plain_group_runs[tool])
    assert trained.keys() == start.keys()
    assert all(trained[name].shape == start[name].shape for name in start)
    changed = [name for name in start if not torch.equal(trained[name], start[name])]
    assert len(changed) > len(start) // 2
    for name in start:
        torch.testing.assert_close(trained[name], reference[name], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("tool", ["farm_ppo", "farm_grpo"])
def test_a_deepspeed_run_resumes_from_its_checkpoint_to_the_same_weights(files, tool, stage):
    """A run under DeepSpeed checkpoints the engine's own state (trained modules, split optimizer
    state) beside the scheduler; a second launch with --resume on that checkpoint folder trains the
    last step only and ends with the weights of the unbroken run."""
    folder, prompts, sft, rm = files
    args = PPO_ARGS if tool == "farm_ppo" else GROUP_ARGS
    straight = folder / f"{tool}-resume-straight-zero{stage}"
    result = launch([*ZERO, str(stage)], sft, rm, prompts, straight, tool, args)
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    checkpoint = folder / f"{straight.name}-checkpoints" / "step-000001"
    state = checkpoint / "trainer"
    assert json.loads((state / "state.json").read_text()) == {"step": 1, "lora": False}
    assert (state / "engine").is_dir() and not (state / "optimizer.pt").exists()
    resumed = folder / f"{tool}-resumed-zero{stage}"
    result = launch(
        [*ZERO, str(stage)],
        sft,
        rm,
        prompts,
        resumed,
        tool,
        [*args, "--resume", "--checkpoint-dir", str(checkpoint.parent), "-v"],
    )
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    assert f"resuming from {checkpoint} (step 1)".encode() in result.stderr
    steps = [
        json.loads(line)["step"] for line in (resumed / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]  # step 1 from the checkpoint's metrics, step 2 trained again
    trained, start, reference = weights(resumed), weights(sft), weights(straight)
    assert any(not torch.equal(trained[name], start[name]) for name in start)
    for name in start:
        torch.testing.assert_close(trained[name], reference[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "tool, stage, extra, message",
    [
        ("farm_ppo", 3, ["--lora"], "--lora under ZeRO-3"),
        ("farm_rloo", 3, ["--lora"], "--lora under ZeRO-3"),
    ],
)
def test_what_deepspeed_cannot_honour_is_refused_before_any_work(
    files, tmp_path, tool, stage, extra, message
):
    """--lora under ZeRO-3 (merging split adapters) ends with exit 1 and the reason, before a model
    is trained or a file written."""
    _, prompts, sft, rm = files
    output = tmp_path / "out"
    args = PPO_ARGS if tool == "farm_ppo" else GROUP_ARGS
    result = launch([*ZERO, str(stage)], sft, rm, prompts, output, tool, [*args, *extra])
    assert result.returncode != 0
    assert f"error: {message}".encode() in result.stderr, result.stderr.decode()[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_is_resumed_only_by_a_run_of_its_kind(files, plain_run, tmp_path):
    """A checkpoint written without DeepSpeed (optimizer.pt) is refused under DeepSpeed, before any
    training, and the other way round: the engine splits its optimizer state its own way."""
    folder, prompts, sft, rm = files
    plain_checkpoints = folder / "plain-checkpoints"
    result = launch(
        [*ZERO, "2"],
        sft,
        rm,
        prompts,
        tmp_path / "a",
        "farm_ppo",
        [*PPO_ARGS, "--resume", "--checkpoint-dir", str(plain_checkpoints)],
    )
    assert result.returncode == 1, result.stderr.decode()[-3000:]
    assert b"was written by a run without DeepSpeed; it cannot be resumed under DeepSpeed" in (
        result.stderr
    )
    engine_checkpoints = folder / "farm_ppo-resume-straight-zero2-checkpoints"
    if not engine_checkpoints.is_dir():
        made = launch(
            [*ZERO, "2"],
            sft,
            rm,
            prompts,
            engine_checkpoints.with_name("farm_ppo-resume-straight-zero2"),
        )
        assert made.returncode == 0, made.stderr.decode()[-3000:]
    result = launch(
        ["--num_processes", "1", "--cpu"],
        sft,
        rm,
        prompts,
        tmp_path / "b",
        "farm_ppo",
        [*PPO_ARGS, "--resume", "--checkpoint-dir", str(engine_checkpoints)],
    )
    assert result.returncode == 1, result.stderr.decode()[-3000:]
    assert b"was written by a DeepSpeed launch; it cannot be resumed without DeepSpeed" in (
        result.stderr
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


QUARK_ARGS = [
    *("--rounds", "2", "--prompts-per-round", "8", "--num-samples", "2"),
    *("--num-quantiles", "2", "--batch-size", "4", "--generation-batch-size", "8"),
    *("--max-new-tokens", "4", "--learning-rate", "2e-3", "--temperature", "1.0", "--seed", "5"),
]


@pytest.mark.parametrize("stage", [2, 3])
def test_quark_under_deepspeed_saves_the_trained_full_weights(files, stage):
    """Quark under ZeRO-2 (weights whole on the process, optimizer state partitioned) and ZeRO-3
    (weights partitioned: gathered whole for each round's sampling and for the save): two rounds,
    the second sampling behind the new control token, and the plain run's weights (the control
    tokens' rows included)."""
    folder, prompts, sft, rm = files
    plain, zero = folder / "quark-plain", folder / f"quark-zero{stage}"
    for launcher, output in (
        (["--num_processes", "1", "--cpu"], plain),
        ([*ZERO, str(stage)], zero),
    ):
        if output == plain and (plain / "meta.json").exists():
            continue  # one plain run serves both stages
        result = launch(launcher, sft, rm, prompts, output, "farm_quark", QUARK_ARGS)
        assert result.returncode == 0, result.stderr.decode()[-4000:]
        assert_no_stdout_from_the_tool(result, deepspeed_launcher=output == zero)
    meta = json.loads((zero / "meta.json").read_text())
    assert meta["launch"] == {
        "distributed_type": "DEEPSPEED",
        "num_processes": 1,
        "zero_stage": stage,
        "mixed_precision": "no",
    }
    assert meta["sampling_control_token"] == "<|reward_quantile_0|>"
    assert json.loads((plain / "meta.json").read_text())["launch"]["distributed_type"] == "NO"
    rounds = [
        [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        for path in (zero, plain)
    ]
    assert [r["round"] for r in rounds[0]] == [1, 2]
    # the same samples were drawn in both rounds (the second from round 1's policy)
    assert [q for r in rounds[0] for q in r["quantile_scores"]] == pytest.approx(
        [q for r in rounds[1] for q in r["quantile_scores"]], abs=1e-5
    )
    trained, start, reference = weights(zero), weights(sft), weights(plain)
    assert trained.keys() == reference.keys()
    assert all(trained[name].shape == reference[name].shape for name in reference)
    same_shape = [name for name in start if trained[name].shape == start[name].shape]
    changed = [name for name in same_shape if not torch.equal(trained[name], start[name])]
    assert len(changed) > len(same_shape) // 2
    for name in reference:
        torch.testing.assert_close(trained[name], reference[name], atol=1e-4, rtol=1e-3)
