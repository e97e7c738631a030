"""farm-sft, farm-rm-train, farm-dpo and farm-expiter under `accelerate launch --use_deepspeed
--zero_stage 3` (and 2), one CPU process (`make test-deepspeed` installs DeepSpeed; the normal suite
skips these): each tool really trains under ZeRO (meta.json's `launch` says so) and the folder it
saves holds full weights equal to those of the same run without DeepSpeed, not an empty or split
model; --lora under ZeRO-3 is refused; and with DeepSpeed installed, stdout carries records only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_no_stdout_from_the_tool
from policy_fixtures import (
    COLOURS,
    KEYWORD,
    QUESTIONS,
    keyword_reward_model,
    prompt_records,
    tiny_sft,
    write_jsonl,
)

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

ZERO3 = {
    "distributed_type": "DEEPSPEED",
    "num_processes": 1,
    "zero_stage": 3,
    "mixed_precision": "no",
}
PLAIN = {"distributed_type": "NO", "num_processes": 1, "zero_stage": 0, "mixed_precision": "no"}


@pytest.fixture(scope="module")
def files(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepspeed-tools")
    others = [colour for colour in COLOURS if colour != KEYWORD]
    preferences = [
        {
            "instruction": question,
            "input": "",
            "output_1": KEYWORD if i % 2 else others[i % 3],
            "output_2": others[i % 3] if i % 2 else KEYWORD,
            "preference": 1 if i % 2 else 2,
        }
        for i, question in enumerate(QUESTIONS)
    ]
    demos = [{"instruction": q, "input": "", "output": KEYWORD} for q in QUESTIONS[:8]]
    return {
        "folder": folder,
        "tiny": tiny_model_path,
        "sft": tiny_sft(tiny_model_path, folder / "sft"),
        "rm": keyword_reward_model(tiny_model_path, folder / "rm"),
        "prefs": write_jsonl(folder / "prefs.jsonl", preferences),
        "demos": write_jsonl(folder / "demos.jsonl", demos),
        "prompts": write_jsonl(folder / "prompts.jsonl", prompt_records(8)),
    }


def environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def launched(deepspeed: bool, module: str, *args, stage: int = 3) -> subprocess.CompletedProcess:
    """The tool under `accelerate launch --use_deepspeed --zero_stage STAGE`, or as a plain process."""
    launcher = [
        "-m",
        "accelerate.commands.launch",
        "--use_deepspeed",
        "--zero_stage",
        str(stage),
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    command = [sys.executable, *(launcher if deepspeed else []), "-m", module, *map(str, args)]
    return subprocess.run(command, capture_output=True, timeout=1200, env=environment())


def run(deepspeed: bool, module: str, *args, stage: int = 3) -> subprocess.CompletedProcess:
    """`launched`, which must succeed."""
    done = launched(deepspeed, module, *args, stage=stage)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    # the tool writes to -o: nothing on stdout, not even a library's notice
    assert_no_stdout_from_the_tool(done, deepspeed)
    return done


def weights(folder: Path, kind: str = "policy") -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    loader = AutoModelForSequenceClassification if kind == "reward_model" else AutoModelForCausalLM
    return loader.from_pretrained(folder, dtype=torch.float32).state_dict()


def check_same_training(
    zero3: Path, plain: Path, start: Path, kind: str = "policy", stage: int = 3
) -> None:
    """The ZeRO folder: launched at that stage, whole tensors, trained (most tensors moved from the
    start), and the very weights the plain run trained."""
    assert json.loads((zero3 / "meta.json").read_text())["launch"] == {**ZERO3, "zero_stage": stage}
    assert json.loads((plain / "meta.json").read_text())["launch"] == PLAIN
    trained, reference, initial = weights(zero3, kind), weights(plain, kind), weights(start, kind)
    assert trained.keys() == reference.keys()
    assert all(trained[name].shape == reference[name].shape for name in reference)
    common = [name for name in trained if name in initial]
    changed = [name for name in common if not torch.equal(trained[name], initial[name])]
    assert len(changed) > len(common) // 2, changed
    for name in reference:
        torch.testing.assert_close(trained[name], reference[name], atol=1e-4, rtol=1e-3)


def test_sft_under_zero3_saves_the_trained_full_weights(files):
    args = ["--max-steps", "2", "--batch-size", "4", "--learning-rate", "1e-3", "--seed", "1"]
    out = files["folder"]
    run(
        False,
        "farmkit.tools.farm_sft",
        files["sft"],
        files["demos"],
        "-o",
        out / "sft-plain",
        *args,
    )
    run(True, "farmkit.tools.farm_sft", files["sft"], files["demos"], "-o", out / "sft-z3", *args)
    assert not list((out / "sft-z3").glob("global_step*"))  # weights, not a ZeRO checkpoint
    check_same_training(out / "sft-z3", out / "sft-plain", files["sft"])


def test_reward_model_under_zero3_saves_the_trained_full_weights(files):
    args = ["--max-steps", "3", "--batch-size", "4", "--learning-rate", "1e-3"]
    out = files["folder"]
    tool = "farmkit.tools.farm_rm_train"
    run(False, tool, files["tiny"], files["prefs"], "-o", out / "rm-plain", *args)
    run(True, tool, files["tiny"], files["prefs"], "-o", out / "rm-z3", *args)
    # the new head and the backbone both come back whole and trained
    check_same_training(out / "rm-z3", out / "rm-plain", files["tiny"], "reward_model")


def test_dpo_under_zero3_saves_the_trained_full_weights(files):
    args = ["--max-steps", "2", "--batch-size", "4", "--learning-rate", "1e-3"]
    out = files["folder"]
    run(
        False,
        "farmkit.tools.farm_dpo",
        files["sft"],
        files["prefs"],
        "-o",
        out / "dpo-plain",
        *args,
    )
    run(True, "farmkit.tools.farm_dpo", files["sft"], files["prefs"], "-o", out / "dpo-z3", *args)
    check_same_training(out / "dpo-z3", out / "dpo-plain", files["sft"])


def test_expert_iteration_under_zero3_saves_the_trained_full_weights(files):
    """Two rounds: the second samples from the first round's policy after a ZeRO-3 Trainer ran in
    the process, which must still load whole."""
    args = [
        *("-n", "2", "--rounds", "2", "--max-new-tokens", "4", "--sample-batch-size", "8"),
        *("--max-steps", "2", "--batch-size", "4", "--learning-rate", "1e-3"),
    ]
    out = files["folder"]
    tool = "farmkit.tools.farm_expiter"
    run(False, tool, files["sft"], files["rm"], files["prompts"], "-o", out / "ei-plain", *args)
    run(True, tool, files["sft"], files["rm"], files["prompts"], "-o", out / "ei-z3", *args)
    rounds = [
        json.loads((out / name / "meta.json").read_text())["expert_iteration"]["rounds"]
        for name in ("ei-z3", "ei-plain")
    ]
    # the same samples were drawn and scored in both rounds (the second from round 1's policy)
    for key in ("mean_reward_first_sample", "mean_reward_best_of_2"):
        assert [r[key] for r in rounds[0]] == pytest.approx([r[key] for r in rounds[1]], abs=1e-4)
    check_same_training(out / "ei-z3", out / "ei-plain", files["sft"])


@pytest.mark.parametrize(
    "module, inputs, kind, args",
    [
        ("farm_sft", ["sft", "demos"], "policy", ["--max-steps", "2", "--seed", "1"]),
        ("farm_rm_train", ["tiny", "prefs"], "reward_model", ["--max-steps", "3"]),
        ("farm_dpo", ["sft", "prefs"], "policy", ["--max-steps", "2"]),
        (
            "farm_expiter",
            ["sft", "rm", "prompts"],
            "policy",
            [*("-n", "2", "--rounds", "2", "--max-new-tokens", "4", "--sample-batch-size", "8")],
        ),
    ],
)
def test_zero2_saves_the_trained_weights(files, module, inputs, kind, args):
    """ZeRO-2 (optimizer states and gradients partitioned, weights whole on every rank): the same
    weights as a plain run, and meta.json says ZeRO-2 ran (expert iteration: both rounds' SFT under
    the engine, the second sampling round 1's policy)."""
    args = [*args, "--batch-size", "4", "--learning-rate", "1e-3"]
    if module == "farm_expiter":
        args += ["--max-steps", "2"]
    out, tool, start = files["folder"], f"farmkit.tools.{module}", files[inputs[0]]
    given = [files[name] for name in inputs]
    run(False, tool, *given, "-o", out / f"{module}-z2-plain", *args)
    run(True, tool, *given, "-o", out / f"{module}-z2", *args, stage=2)
    check_same_training(out / f"{module}-z2", out / f"{module}-z2-plain", start, kind, 2)


@pytest.mark.parametrize(
    "module, inputs",
    [
        ("farm_sft", ["sft", "demos"]),
        ("farm_rm_train", ["tiny", "prefs"]),
        ("farm_dpo", ["sft", "prefs"]),
    ],
)
def test_lora_under_zero3_is_refused(files, tmp_path, module, inputs):
    """Merging LoRA adapters into weights ZeRO-3 has split is not supported: exit 1 with the reason,
    and no folder written."""
    done = launched(
        True,
        f"farmkit.tools.{module}",
        *[files[name] for name in inputs],
        *("-o", tmp_path / "out", "--lora", "--max-steps", "1", "--batch-size", "4"),
        stage=3,
    )
    assert done.returncode != 0
    assert b"error: --lora under ZeRO-3 is not supported" in done.stderr, done.stderr.decode()[
        -3000:
    ]
    assert list(tmp_path.iterdir()) == []


def test_farm_sample_stdout_carries_records_only_with_deepspeed_installed(tmp_path):
    """The run that converts the embedded model (a fresh cache) imports DeepSpeed, which announces
    `[WARNING] [real_accelerator.py:...] Setting accelerator to CPU` through a handler bound to stdout;
    it once went to stdout before the records and broke `farm-sample | farm-annotate`. Every stdout
    line must be a record, and the notice must be on stderr (so this test sees it, wherever it goes)."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(3))
    env = {**environment(), "FARMKIT_CACHE": str(tmp_path / "cache")}  # nothing converted yet
    command = [sys.executable, "-m", "farmkit.tools.farm_sample", "embedded", str(prompts)]
    command += ["-n", "1", "--max-new-tokens", "4"]
    done = subprocess.run(command, capture_output=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    records = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(records) == 3 and all(isinstance(r["output"], str) for r in records)
    assert b"real_accelerator.py" in done.stderr and b"Setting accelerator to CPU" in done.stderr
    assert list((tmp_path / "cache").iterdir())  # the run converted the model into the fresh cache
