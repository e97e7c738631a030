"""Slow end-to-end runs of farm-ppo, farm-quark and farm-dpo on the embedded model (SmolLM2-135M)
through their console scripts, each result sampled by farm-sample. The reward model is the tiny
keyword model (it shares the embedded tokenizer, as PPO's value model requires)."""

from __future__ import annotations

import json

import orjson
import pytest
from conftest import run_tool
from policy_fixtures import QUESTIONS, keyword_reward_model, prompt_records, write_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("embedded-runs")
    prompts = write_jsonl(folder / "prompts.jsonl", prompt_records(8))
    prefs = write_jsonl(
        folder / "prefs.jsonl",
        [
            {
                "instruction": question,
                "output_1": "Blue.",
                "output_2": "I would rather not say which colour I like.",
                "preference": 1,
            }
            for question in QUESTIONS[:8]
        ],
    )
    return folder, prompts, prefs, keyword_reward_model(tiny_model_path, folder / "rm")


def sample(policy, prompts) -> list[dict]:
    result = run_tool(
        "farm-sample",
        str(policy),
        str(prompts),
        "-n",
        "1",
        "--max-new-tokens",
        "8",
        "--backend",
        "hf",
        "-q",
    )
    assert result.returncode == 0, result.stderr.decode()
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 8 and all(isinstance(record["output"], str) for record in records)
    return records


def test_ppo_on_the_embedded_model(embedded_path, files):
    folder, prompts, _, rm = files
    output = folder / "ppo"
    result = run_tool(
        "farm-ppo",
        "embedded",
        str(rm),
        str(prompts),
        "-o",
        str(output),
        "--steps",
        "2",
        "--rollout-batch-size",
        "4",
        "--minibatch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--max-new-tokens",
        "16",
        "--save-steps",
        "1",
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b""  # a training command writes no records
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in metrics] == [1, 2] and abs(metrics[0]["kl"]) < 1e-4
    assert (folder / "ppo-checkpoints" / "step-000001" / "meta.json").is_file()
    sample(output, prompts)


def test_quark_on_the_embedded_model(embedded_path, files):
    folder, prompts, _, rm = files
    output = folder / "quark"
    result = run_tool(
        "farm-quark",
        "embedded",
        str(rm),
        str(prompts),
        "-o",
        str(output),
        "--rounds",
        "1",
        "--prompts-per-round",
        "4",
        "--num-samples",
        "2",
        "--num-quantiles",
        "4",
        "--max-new-tokens",
        "16",
        "--batch-size",
        "2",
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b""
    assert (
        json.loads((output / "meta.json").read_text())["sampling_control_token"]
        == "<|reward_quantile_0|>"
    )
    sample(output, prompts)


def test_dpo_on_the_embedded_model(embedded_path, files):
    folder, prompts, prefs, _ = files
    output = folder / "dpo"
    result = run_tool(
        "farm-dpo",
        "embedded",
        str(prefs),
        "-o",
        str(output),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b""  # TRL's printed logs go to stderr
    assert json.loads((output / "meta.json").read_text())["pairs"]["used"] == 8
    sample(output, prompts)
