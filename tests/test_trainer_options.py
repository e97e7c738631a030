"""Options every trainer shares (issue 22): --device on each of them (a bad name is a usage error
before any work, a device that is not there a one-line error, --device cpu runs), --save-steps and
--resume on farm-dpo, farm-rm-train and farm-quark (an interrupted run resumed ends with the weights
of an unbroken one), and LoRA on farm-quark and farm-expiter."""

from __future__ import annotations

import importlib
import json

import click
import pytest
import torch
from conftest import run_tool
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl
from test_dpo import preference_records

# the trainers and the arguments that come before their options
HEADS = {
    "farm-sft": ["m", "d", "-o", "o"],
    "farm-rm-train": ["m", "p", "-o", "o"],
    "farm-dpo": ["m", "p", "-o", "o"],
    "farm-online-dpo": ["m", "p", "-o", "o"],
    "farm-ppo": ["s", "r", "p", "-o", "o"],
    "farm-rloo": ["s", "r", "p", "-o", "o"],
    "farm-grpo": ["s", "r", "p", "-o", "o"],
    "farm-quark": ["s", "r", "p", "-o", "o"],
    "farm-expiter": ["s", "r", "p", "-o", "o"],
}


def command(tool: str) -> click.Command:
    return importlib.import_module(f"farmkit.tools.{tool.replace('-', '_')}").cli


@pytest.mark.parametrize("tool", sorted(HEADS))
def test_every_trainer_takes_device(tool):
    cmd = command(tool)
    for device in ("cpu", "cuda", "cuda:1", "auto"):
        with cmd.make_context(tool, [*HEADS[tool], "--device", device]) as context:
            assert context.params["device"] == device
    for bad in ("gpu", "cuda:x", "cuda1"):
        with pytest.raises(click.BadParameter, match="expected auto, cpu, cuda, cuda:N"):
            cmd.make_context(tool, [*HEADS[tool], "--device", bad])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("tool", ["farm-dpo", "farm-rm-train", "farm-grpo"])
def test_a_device_that_is_not_there_is_a_one_line_error(tool, tmp_path):
    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_records())
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(4))
    inputs = ["sft", "rm", str(prompts)] if tool == "farm-grpo" else ["sft", str(prefs)]
    result = run_tool(tool, *inputs, "-o", str(tmp_path / "out"), "--device", "cuda:1")
    assert result.returncode == 1, result.stderr.decode()
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"{tool}: error: --device cuda:1: no CUDA GPU is visible to torch")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    sft = tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))
    return sft, keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm"))


@pytest.mark.parametrize("tool", ["farm-dpo", "farm-rm-train", "farm-grpo"])
def test_device_cpu_trains_and_writes_a_loadable_folder(tool, models, tmp_path):
    from farmkit.models import load_causal_lm

    sft, rm = models
    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_records())
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    output = tmp_path / "out"
    if tool == "farm-grpo":
        args = [str(sft), str(rm), str(prompts), "--steps", "1", "--rollout-batch-size", "8"]
        args += ["-n", "2", "--minibatch-size", "8", "--max-new-tokens", "3", "--save-steps", "0"]
    else:
        args = [str(sft), str(prefs), "--max-steps", "2", "--batch-size", "4"]
    result = run_tool(tool, *args, "-o", str(output), "--device", "cpu", "-q")
    assert result.returncode == 0, result.stderr.decode()
    meta = json.loads((output / "meta.json").read_text())
    assert meta["config"]["device"] == "cpu"
    if tool != "farm-rm-train":
        load_causal_lm(output, device="cpu")
