"""farm-ppo on the tiny model with a reward model that pays for answering "blue": a few steps raise
the reward, the KL starts at zero and grows, checkpoints load, a resumed run matches an unbroken
one, and the command line reads --config files and rejects bad combinations."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from policy_fixtures import (
    keyword_probability,
    keyword_reward_model,
    prompt_records,
    sampled_rewards,
    tiny_sft,
    write_jsonl,
)

from farmkit.methods.ppo import PPOConfig, train_ppo

SMALL = dict(rollout_batch_size=32, minibatch_size=16, micro_batch_size=16, ppo_epochs=2, learning_rate=2e-3,
             kl_coef=0.05, temperature=1.0, max_response_tokens=4)


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
            keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")))


@pytest.fixture(scope="module")
def trained(models, tmp_path_factory):
    sft, rm = models
    output = tmp_path_factory.mktemp("ppo-run") / "ppo"
    train_ppo(str(sft), str(rm), prompt_records(16), str(output), PPOConfig(steps=6, checkpoint_every=3, **SMALL), seed=0)
    return output


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ppo_raises_the_reward_and_the_kl_grows_from_zero(models, trained):
    sft, rm = models
    metrics = read_metrics(trained / "metrics.jsonl")
    assert [entry["step"] for entry in metrics] == list(range(1, 7))
    assert abs(metrics[0]["kl"]) < 1e-6  # the policy is the reference before the first update
    assert max(entry["kl"] for entry in metrics[1:]) > 0.05
    for name in ("reward", "entropy", "response_length", "value_loss", "clip_fraction"):
        assert all(isinstance(entry[name], float) for entry in metrics), name
    assert all(entry["score"] == entry["reward"] for entry in metrics)  # --unfinished truncate: scores as they are
    early = sum(entry["reward"] for entry in metrics[:2]) / 2
    late = sum(entry["reward"] for entry in metrics[-2:]) / 2
    assert late > early + 0.1, (early, late)
    # the saved policy, sampled as farm-sample samples it, says "blue" more and earns more reward
    assert keyword_probability(trained) > keyword_probability(sft) + 0.1
    sft_texts, sft_rewards = sampled_rewards(sft, rm)
    ppo_texts, ppo_rewards = sampled_rewards(trained, rm)
    assert sum(ppo_rewards) / len(ppo_rewards) > sum(sft_rewards) / len(sft_rewards) + 0.1
    assert ppo_texts.count("blue") > sft_texts.count("blue")


def test_output_and_checkpoints_are_policy_folders(models, trained):
    sft, _ = models
    meta = json.loads((trained / "meta.json").read_text())
    assert meta["tool"] == "farm-ppo" and meta["kind"] == "policy" and meta["step"] == 6
    assert meta["base_model"] == str(sft) and meta["prompt_template"] == "chat"
    assert meta["config"]["kl_coef"] == 0.05 and "torch" in meta["versions"]
    checkpoint = trained.parent / "ppo-checkpoints" / "step-000003"
    assert json.loads((checkpoint / "meta.json").read_text())["step"] == 3
    assert (checkpoint / "trainer" / "optimizer.pt").is_file()  # the newest checkpoint can be resumed
    assert [entry["step"] for entry in read_metrics(checkpoint / "metrics.jsonl")] == [1, 2, 3]
    texts, _ = sampled_rewards(checkpoint, models[1], n=1)
    assert len(texts) == 16 and all(isinstance(text, str) for text in texts)


def test_resume_continues_exactly_where_the_run_stopped(models, tmp_path):
    sft, rm = models
    whole = tmp_path / "whole"
    train_ppo(str(sft), str(rm), prompt_records(16), str(whole), PPOConfig(steps=2, checkpoint_every=1, **SMALL), seed=3)
    # a second run finds step 1's trainer state in the same checkpoint folder and trains step 2 only
    resumed = tmp_path / "resumed"
    config = PPOConfig(steps=2, checkpoint_every=1, resume=True, checkpoint_dir=str(tmp_path / "whole-checkpoints"), **SMALL)
    last = train_ppo(str(sft), str(rm), prompt_records(16), str(resumed), config, seed=3)
    assert last["step"] == 2
    assert [entry["step"] for entry in read_metrics(resumed / "metrics.jsonl")] == [1, 2]
    from safetensors.torch import load_file

    first, second = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.allclose(first[key], second[key], atol=1e-6) for key in first)
    original = load_file(sft / "model.safetensors")
    assert any(not torch.equal(first[key], original[key]) for key in first)


def test_unfinished_responses_can_be_penalized(models, tmp_path):
    sft, rm = models
    config = PPOConfig(steps=1, checkpoint_every=0, unfinished="penalty", unfinished_penalty=-3.0,
                       **{**SMALL, "max_response_tokens": 1})
    last = train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    # one token cannot be a word and its end token: only empty answers finish, the rest score -3
    unfinished = last["unfinished_fraction"]
    assert 0.3 < unfinished <= 1.0
    assert last["reward"] > -1.0  # the reward model's own scores lie near 0 here
    assert abs(last["score"] - (-3.0 * unfinished)) < 0.5


def test_resume_without_a_checkpoint_fails_clearly(models, tmp_path):
    from farmkit.io import FarmError

    with pytest.raises(FarmError, match="no checkpoint"):
        train_ppo(str(models[0]), str(models[1]), prompt_records(4), str(tmp_path / "out"), PPOConfig(resume=True, **SMALL))


def test_lora_trains_and_saves_a_merged_policy(models, tmp_path):
    sft, rm = models
    output = tmp_path / "lora"
    config = PPOConfig(steps=1, checkpoint_every=0, lora=True, lora_rank=4, **{**SMALL, "rollout_batch_size": 16})
    train_ppo(str(sft), str(rm), prompt_records(16), str(output), config, seed=0)
    from safetensors.torch import load_file

    weights, original = load_file(output / "model.safetensors"), load_file(sft / "model.safetensors")
    assert weights.keys() == original.keys()  # merged: no adapter tensors left
    assert any(not torch.equal(weights[key], original[key]) for key in weights)


def test_cli_reads_config_file_and_flags_win(models, tmp_path):
    from farmkit.tools.farm_ppo import cli

    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    (tmp_path / "ppo.yaml").write_text("steps: 5\nkl-coef: 0.02\nrollout_batch_size: 8\nminibatch-size: 8\nmicro-batch-size: 8\n"
                                       "max-response-tokens: 3\ncheckpoint-every: 0\n")
    output = tmp_path / "out"
    result = CliRunner().invoke(cli, [str(sft), str(rm), str(prompts), "-o", str(output), "--config", str(tmp_path / "ppo.yaml"),
                                      "--steps", "1", "-q"])
    assert result.exit_code == 0, result.output
    meta = json.loads((output / "meta.json").read_text())
    assert meta["config"]["steps"] == 1 and meta["config"]["kl_coef"] == 0.02 and meta["config"]["max_response_tokens"] == 3
    assert list(meta["inputs"]) == [str(prompts)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rollout-batch-size", "10", "--minibatch-size", "4"], "multiple of minibatch-size"),
        (["--unfinished", "ignore"], "ignore"),
        (["--kl-coef", "-1"], "kl-coef"),
    ],
)
def test_cli_rejects_bad_combinations_before_loading_anything(tmp_path, args, message):
    from farmkit.tools.farm_ppo import cli

    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(2))
    result = CliRunner().invoke(cli, ["no-such-sft/", "no-such-rm/", str(prompts), "-o", str(tmp_path / "out"), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_cli_rejects_unknown_config_keys(tmp_path):
    from farmkit.tools.farm_ppo import cli

    (tmp_path / "bad.yaml").write_text("kl_coeff: 0.1\n")
    result = CliRunner().invoke(cli, ["sft/", "rm/", "-", "-o", str(tmp_path / "out"), "--config", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 2
    assert "unknown option 'kl_coeff'" in result.output
