"""--report-to tensorboard on the policy trainers that tests/test_cli.py (farm-sft,
farm-rm-train) and tests/methods/test_group.py (farm-rloo, farm-grpo) do not run: each writes
TensorBoard event files with its own metrics beside the output folder, offline, and none inside the
model folder. farm-ppo and farm-quark go through accelerate's trackers, farm-dpo through the
Trainer's report_to, farm-expiter and farm-online-dpo through the SFT and DPO Trainers of each
round."""

from __future__ import annotations

import importlib

import pytest
import tomllib
from click.testing import CliRunner
from conftest import ROOT
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl
from test_cli import _scalar_tags

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
PAIRS = [
    {"instruction": q["instruction"], "output_1": "blue", "output_2": "red", "preference": 1}
    for q in prompt_records(8)
]
ROLLOUT = ["--max-new-tokens", "3", "--learning-rate", "1e-4"]
CASES = {
    "farm-ppo": (
        "reward",
        ["RM", "PROMPTS", *ROLLOUT, "--steps", "1", "--rollout-batch-size", "8"]
        + ["--minibatch-size", "8", "--micro-batch-size", "8", "--save-steps", "0"],
    ),
    "farm-quark": (
        "reward",
        ["RM", "PROMPTS", *ROLLOUT, "--rounds", "1", "--prompts-per-round", "8"]
        + ["--num-samples", "2", "--num-quantiles", "2"],
    ),
    "farm-dpo": ("train/loss", ["PAIRS", "--max-steps", "2", "--batch-size", "4"]),
    "farm-expiter": (
        "train/loss",
        ["RM", "PROMPTS", *ROLLOUT, "-n", "2", "--rounds", "1", "--max-steps", "2"]
        + ["--batch-size", "4"],
    ),
    "farm-online-dpo": (
        "train/loss",
        ["PROMPTS", *ROLLOUT, "--pool", "gold", "--rounds", "1", "--prompts-per-round", "8"]
        + ["--max-steps", "2", "--batch-size", "4", "--no-cache"],
    ),
}


@pytest.fixture(scope="module")
def world(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("report-to")
    return {
        "SFT": tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        "RM": keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")),
        "PROMPTS": write_jsonl(folder / "prompts.jsonl", prompt_records(8)),
        "PAIRS": write_jsonl(folder / "pairs.jsonl", PAIRS),
    }


@pytest.mark.parametrize("tool", sorted(CASES))
def test_every_policy_trainer_reports_to_tensorboard_offline(tool, world, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tag, args = CASES[tool]
    command = importlib.import_module(SCRIPTS[tool].split(":")[0]).cli
    output = tmp_path / "policy"
    args = [str(world.get(arg, arg)) for arg in args]
    result = CliRunner().invoke(
        command,
        [str(world["SFT"]), *args, "-o", str(output), "--report-to", "tensorboard", "-q"],
    )
    assert result.exit_code == 0, result.output
    runs = tmp_path / "policy.runs"
    assert tag in _scalar_tags(runs), sorted(runs.rglob("*"))
    assert (output / "meta.json").is_file()
    assert not list(output.rglob("events.out.tfevents.*"))  # the model folder stays a model folder
