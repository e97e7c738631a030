"""farm-quark on the tiny model with a reward model that pays for answering "blue": training on the
top quantile raises the reward, the saved policy samples with its control token, and --keep all
trains every quantile behind its own token."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from policy_fixtures import (
    keyword_probability,
    keyword_reward_model,
    prompt_records,
    sampled_rewards,
    tiny_sft,
    write_jsonl,
)

from farmkit.methods.quark import QuarkConfig, quantile_token, train_quark

SMALL = dict(prompts_per_round=16, samples_per_prompt=4, num_quantiles=4, learning_rate=3e-3, kl_coef=0.05,
             temperature=1.0, max_response_tokens=4, batch_size=16, epochs_per_round=2)


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
            keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")))


def test_top_quantile_training_raises_the_reward(models, tmp_path):
    sft, rm = models
    output = tmp_path / "quark"
    history = train_quark(str(sft), str(rm), prompt_records(16), str(output), QuarkConfig(rounds=3, **SMALL), seed=0)
    assert [entry["round"] for entry in history] == [1, 2, 3]
    assert all(entry["trained_on"] == 16 for entry in history)  # 64 samples, the best of 4 quantiles
    assert all(entry["top_quantile_score"] >= entry["score"] for entry in history)
    assert history[-1]["reward"] > history[0]["reward"] + 0.1  # round 1 samples the SFT model itself
    meta = json.loads((output / "meta.json").read_text())
    assert meta["kind"] == "policy" and meta["tool"] == "farm-quark"
    assert meta["sampling_control_token"] == quantile_token(0)
    assert [json.loads(line)["round"] for line in (output / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    # sampled the way farm-sample samples (PromptFormat.for_model adds the control token)
    assert keyword_probability(output) > keyword_probability(sft) + 0.1
    sft_texts, sft_rewards = sampled_rewards(sft, rm)
    texts, rewards = sampled_rewards(output, rm)
    assert sum(rewards) / len(rewards) > sum(sft_rewards) / len(sft_rewards) + 0.1
    assert not any("reward_quantile" in text for text in texts)


def test_keep_all_trains_every_quantile_with_its_token(models, tmp_path):
    from farmkit.tools.farm_quark import cli

    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    output = tmp_path / "quark-all"
    args = [str(sft), str(rm), str(prompts), "-o", str(output), "--keep", "all", "--rounds", "1", "--prompts-per-round", "8",
            "--samples-per-prompt", "2", "--num-quantiles", "4", "--max-response-tokens", "3", "--learning-rate", "1e-3", "-q"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    round_metrics = json.loads((output / "metrics.jsonl").read_text().splitlines()[0])
    assert round_metrics["trained_on"] == 16
    from farmkit.models import load_tokenizer

    tokenizer = load_tokenizer(output)
    ids = tokenizer.convert_tokens_to_ids([quantile_token(q) for q in range(4)])
    assert len(set(ids)) == 4 and tokenizer.unk_token_id not in ids


def test_config_rejects_more_quantiles_than_samples():
    with pytest.raises(ValueError, match="at least one response per quantile"):
        QuarkConfig(prompts_per_round=1, samples_per_prompt=2, num_quantiles=5)
