"""farm-grpo and farm-rloo --pool: group rewards from an annotator pool's verdicts within each group
(farmkit.train.pairwise), composed by the tool. With a judge that prefers the answer "blue" the
policy learns to say blue; the offline pool sim_ann_offline trains through the command line with
no key, its labels counted on every metrics row and in meta.json, with --gold beside it; --max-cost
stops the run cleanly; and the command line takes exactly one of RM and --pool."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from click.testing import CliRunner
from policy_fixtures import (
    GROUP_SETTINGS,
    KEYWORD,
    FakePairJudge,
    check_budget,
    keyword_probability,
    prompt_records,
    tiny_sft,
    write_jsonl,
)

from farmkit.core.io import FarmError
from farmkit.methods.group import GRPOConfig, RLOOConfig, train_group

# 4 groups of 4 a step
SMALL = {**GROUP_SETTINGS, "rollout_batch_size": 16, "checkpoint_every": 0}


@pytest.fixture(scope="module")
def sft(tiny_model_path, tmp_path_factory):
    return tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))


def says_blue(a: str, b: str) -> bool:
    """a beats b when a starts with the keyword and b does not."""
    return a.strip().startswith(KEYWORD) and not b.strip().startswith(KEYWORD)


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def weights_moved(folder, sft) -> bool:
    from safetensors.torch import load_file

    trained, original = (
        load_file(folder / "model.safetensors"),
        load_file(sft / "model.safetensors"),
    )
    return any(not torch.equal(trained[key], original[key]) for key in trained)


@pytest.mark.parametrize(
    ("config_class", "reward"),
    [
        (GRPOConfig, "win-rate"),
        # the mapping of Bradley-Terry rewards is checked in tests/train/test_pairwise.py
        pytest.param(RLOOConfig, "bradley-terry", marks=pytest.mark.slow),
    ],
)
def test_the_judge_s_preference_is_learned(sft, tmp_path, config_class, reward):
    judge = FakePairJudge(says_blue)
    config = config_class(
        steps=4,
        pool="blue",
        opponents="2",
        pool_reward=reward,
        **{**SMALL, "rollout_batch_size": 32},
    )
    output = tmp_path / "out"
    train_group(str(sft), judge, prompt_records(16), str(output), config, seed=0)
    # 8 groups of 4 a step, each response against 2 others: 4 comparisons a group
    assert [len(pairs) for pairs in judge.asked] == [32] * 4
    rows = metrics(output)
    assert [row["labels_used"] for row in rows] == [32, 64, 96, 128]
    assert keyword_probability(output) > keyword_probability(sft) + 0.1
    budget = check_budget(output, config.method, 128)
    assert budget["annotator_requests"] == 128 and budget["spent"] == 0.0
    assert budget["stopped"] is None


def test_max_cost_stops_before_a_step_it_cannot_pay_for(sft, tmp_path):
    small = {**SMALL, "rollout_batch_size": 8, "minibatch_size": 8, "micro_batch_size": 8}
    config = GRPOConfig(steps=3, pool="blue", opponents="1", **small)
    # 2 groups of 4 a step, 2 comparisons a group, at $0.1: $0.9 pays for two steps, not a third
    judge = FakePairJudge(says_blue, price=0.1, max_cost=0.9)
    output = tmp_path / "out"
    last = train_group(str(sft), judge, prompt_records(16), str(output), config, seed=0)
    assert len(judge.asked) == 2 and last["step"] == 2
    meta = json.loads((output / "meta.json").read_text())
    assert meta["step"] == 2 and [row["step"] for row in metrics(output)] == [1, 2]
    assert meta["budget"]["spent"] == pytest.approx(0.8) and meta["budget"]["labels_used"] == 8
    assert "--max-cost" in meta["budget"]["stopped"] and meta["budget"]["max_cost"] == 0.9
    assert weights_moved(output, sft)

    poor = FakePairJudge(says_blue, price=0.1, max_cost=0.3)
    with pytest.raises(FarmError, match="no step was trained"):
        train_group(str(sft), poor, prompt_records(16), str(tmp_path / "poor"), config, seed=0)
    assert poor.asked == [] and not (tmp_path / "poor").exists()


def cli(tool: str):
    return importlib.import_module(f"farmkit.tools.{tool}").cli


def test_an_offline_pool_trains_from_the_command_line_with_gold(sft, tmp_path):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    output = tmp_path / "grpo"
    args = [str(sft), str(prompts), "-o", str(output), "--pool", "sim_ann_offline"]
    args += ["--opponents", "1", "--steps", "2", "--rollout-batch-size", "8", "--num-samples", "4"]
    args += ["--minibatch-size", "8", "--micro-batch-size", "8", "--max-new-tokens", "4"]
    args += ["--learning-rate", "2e-3", "--cache", str(tmp_path / "verdicts.sqlite")]
    args += ["--gold", "gold", "--gold-size", "4", "--save-steps", "1", "-q"]
    result = CliRunner().invoke(cli("farm_grpo"), args, env={"OPENAI_API_KEY": ""})
    assert result.exit_code == 0, result.output
    rows = metrics(output)
    # 2 groups of 4 a step, each response against one other: 2 comparisons a group
    assert [row["labels_used"] for row in rows] == [4, 8]
    assert all(row["gold_win_rate"] is not None for row in rows)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["config"]["pool"] == "sim_ann_offline" and meta["config"]["opponents"] == "1"
    budget = check_budget(output, "grpo", 8)
    assert budget["spent"] == 0.0 and budget["max_cost"] is None
    assert weights_moved(output, sft)


@pytest.mark.parametrize("tool", ["farm_grpo", "farm_rloo"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rm/", "prompts.jsonl", "--pool", "sim_ann_offline"], "give one of them"),
        ([], "missing RM: give a reward model folder, or --pool POOL"),
        (["rm/", "prompts.jsonl", "--max-cost", "1"], "--max-cost: only with --pool"),
        (["rm/", "prompts.jsonl", "--opponents", "2"], "--opponents: only with --pool"),
        (["prompts.jsonl", "--pool", "sim_ann_offline", "--opponents", "4"], "must be below"),
        (["prompts.jsonl", "--pool", "sim_ann_offline", "--opponents", "x"], "positive count"),
        (
            [
                "prompts.jsonl",
                "--pool",
                "sim_ann_offline",
                "-n",
                "3",
                "--rollout-batch-size",
                "9",
                "--minibatch-size",
                "9",
                "--opponents",
                "1",
            ],
            "must be even",
        ),
    ],
)
def test_the_command_line_takes_exactly_one_of_rm_and_pool(tmp_path, tool, args, message):
    result = CliRunner().invoke(cli(tool), ["no-sft/", *args, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()
