"""farm-ppo on the tiny model with a reward model that pays for answering "blue": a few steps raise
the reward, the KL starts at zero and grows, checkpoints load, a resumed run matches an unbroken
one, and the command line reads --config files and rejects bad combinations."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from click.testing import CliRunner
from policy_fixtures import (
    check_budget,
    keyword_probability,
    keyword_reward_model,
    pretend_bf16_gpu,
    prompt_records,
    sampled_logprobs,
    sampled_rewards,
    spy_adamw,
    spy_generate,
    spy_loads,
    tiny_sft,
    variant,
    write_jsonl,
)

from farmkit.lm.models import load_tokenizer
from farmkit.methods.ppo import PPOConfig, train_ppo

SMALL = dict(
    rollout_batch_size=32,
    minibatch_size=16,
    micro_batch_size=16,
    ppo_epochs=2,
    learning_rate=2e-3,
    kl_coef=0.05,
    temperature=1.0,
    max_new_tokens=4,
)


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (
        tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")),
    )


@pytest.fixture(scope="module")
def trained(models, tmp_path_factory):
    sft, rm = models
    output = tmp_path_factory.mktemp("ppo-run") / "ppo"
    train_ppo(
        str(sft),
        str(rm),
        prompt_records(16),
        str(output),
        PPOConfig(steps=6, checkpoint_every=3, **SMALL),
        seed=0,
    )
    return output


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ppo_raises_the_reward_and_the_kl_grows_from_zero(models, trained):
    sft, rm = models
    metrics = read_metrics(trained / "metrics.jsonl")
    assert [entry["step"] for entry in metrics] == list(range(1, 7))
    assert abs(metrics[0]["kl"]) < 1e-6  # the policy is the reference before the first update
    assert max(entry["kl"] for entry in metrics[1:]) > 0.05
    vocabulary = len(load_tokenizer(sft))
    for entry in metrics:  # each figure a mean over the step, within what it can be
        assert 0 < entry["entropy"] < math.log(vocabulary), entry
        assert 1 <= entry["response_length"] <= SMALL["max_new_tokens"], entry
        assert entry["value_loss"] > 0 and 0 <= entry["clip_fraction"] <= 1, entry
    assert all(
        entry["score"] == entry["reward"] for entry in metrics
    )  # --unfinished truncate: scores as they are
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
    assert (
        checkpoint / "trainer" / "optimizer.pt"
    ).is_file()  # the newest checkpoint can be resumed
    assert [entry["step"] for entry in read_metrics(checkpoint / "metrics.jsonl")] == [1, 2, 3]
    from safetensors.torch import load_file

    # the step-3 policy: neither the SFT model it started from nor the policy of step 6
    weights = [load_file(folder / "model.safetensors") for folder in (checkpoint, sft, trained)]
    middle, start, end = weights
    assert any(not torch.equal(middle[name], start[name]) for name in middle)
    assert any(not torch.equal(middle[name], end[name]) for name in middle)
    texts, _ = sampled_rewards(checkpoint, models[1], n=1)
    assert len(texts) == 16 and any(texts)


def test_the_budget_counts_what_the_run_sampled_and_trained_on(models, trained):
    """meta.json's budget and the metrics rows' running totals (farmkit.train.budget): the
    rollouts' response tokens sampled, and prompt + response tokens read by ppo-epochs passes."""
    rm = models[1]
    budget = check_budget(trained, "ppo", None)  # the test reward model says nothing of its labels
    rows = read_metrics(trained / "metrics.jsonl")
    assert budget["tokens_sampled"] == sum(round(row["response_length"] * 32) for row in rows)
    # every pass reads each prompt and response (2 passes): more than twice the responses alone
    assert budget["training_tokens"] > 2 * budget["tokens_sampled"]
    checkpoint = trained.parent / "ppo-checkpoints" / "step-000003"
    partway = json.loads((checkpoint / "meta.json").read_text())["budget"]
    assert partway["tokens_sampled"] == rows[2]["tokens_sampled"] < budget["tokens_sampled"]
    assert rm.is_dir()


def test_resume_continues_exactly_where_the_run_stopped(models, tmp_path):
    sft, rm = models
    whole = tmp_path / "whole"
    train_ppo(
        str(sft),
        str(rm),
        prompt_records(16),
        str(whole),
        PPOConfig(steps=2, checkpoint_every=1, **SMALL),
        seed=3,
    )
    # a second run finds step 1's trainer state in the same checkpoint folder and trains step 2 only
    resumed = tmp_path / "resumed"
    config = PPOConfig(
        steps=2,
        checkpoint_every=1,
        resume=True,
        checkpoint_dir=str(tmp_path / "whole-checkpoints"),
        **SMALL,
    )
    last = train_ppo(str(sft), str(rm), prompt_records(16), str(resumed), config, seed=3)
    assert last["step"] == 2
    assert [entry["step"] for entry in read_metrics(resumed / "metrics.jsonl")] == [1, 2]
    from safetensors.torch import load_file

    first, second = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.allclose(first[key], second[key], atol=1e-6) for key in first)
    original = load_file(sft / "model.safetensors")
    assert any(not torch.equal(first[key], original[key]) for key in first)


def test_unfinished_responses_can_be_penalized(models, tmp_path, monkeypatch):
    calls = spy_generate(monkeypatch)
    sft, rm = models
    config = PPOConfig(
        steps=1,
        checkpoint_every=0,
        unfinished="penalty",
        unfinished_penalty=-3.0,
        **{**SMALL, "max_new_tokens": 1},
    )
    last = train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    # one token cannot be a word and its end token: only empty answers finish, the rest score -3
    unfinished = last["unfinished_fraction"]
    eos = load_tokenizer(sft).eos_token_id
    first_tokens = torch.cat([call["tokens"][:, 0] for call in calls])
    assert len(first_tokens) == SMALL["rollout_batch_size"]
    assert unfinished == pytest.approx((first_tokens != eos).float().mean().item())
    assert unfinished > 0.3
    assert last["reward"] > -1.0  # the reward model's own scores lie near 0 here
    assert abs(last["score"] - (-3.0 * unfinished)) < 0.5


def test_resume_without_a_checkpoint_starts_from_the_beginning(models, tmp_path, caplog):
    """A job on a preemptible machine passes --resume from its first start."""
    with caplog.at_level(logging.INFO, logger="farmkit"):
        train_ppo(
            str(models[0]),
            str(models[1]),
            prompt_records(4),
            str(tmp_path / "out"),
            PPOConfig(
                resume=True,
                steps=1,
                **{**SMALL, "rollout_batch_size": 4, "minibatch_size": 4, "micro_batch_size": 4},
            ),
        )
    assert (
        f"no complete checkpoint in {tmp_path / 'out'}-checkpoints: starting from the beginning"
        in caplog.text
    )
    assert (tmp_path / "out" / "meta.json").is_file()


def test_lora_trains_and_saves_a_merged_policy(models, tmp_path):
    sft, rm = models
    output = tmp_path / "lora"
    config = PPOConfig(
        steps=1, checkpoint_every=0, lora=True, lora_rank=4, **{**SMALL, "rollout_batch_size": 16}
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(output), config, seed=0)
    from safetensors.torch import load_file

    weights, original = (
        load_file(output / "model.safetensors"),
        load_file(sft / "model.safetensors"),
    )
    assert weights.keys() == original.keys()  # merged: no adapter tensors left
    assert any(not torch.equal(weights[key], original[key]) for key in weights)


def test_cli_reads_config_file_and_flags_win(models, tmp_path):
    from farmkit.tools.farm_ppo import cli

    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    (tmp_path / "ppo.yaml").write_text(
        "steps: 5\nkl-coef: 0.02\nrollout_batch_size: 8\nminibatch-size: 8\nmicro-batch-size: 8\n"
        "max-new-tokens: 3\ncheckpoint-every: 0\n"
    )
    output = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            str(sft),
            str(rm),
            str(prompts),
            "-o",
            str(output),
            "--config",
            str(tmp_path / "ppo.yaml"),
            "--steps",
            "1",
            "--kl-estimator",
            "clamped",
            "--whiten-rewards",
            "--value-head",
            "zero",
            "--warmup-steps",
            "5",
            "--adam-eps",
            "1e-6",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((output / "meta.json").read_text())
    assert (
        meta["config"]["steps"] == 1
        and meta["config"]["kl_coef"] == 0.02
        and meta["config"]["max_new_tokens"] == 3
    )
    assert {
        key: meta["config"][key]
        for key in ("kl_estimator", "whiten_rewards", "value_head", "warmup_steps", "adam_eps")
    } == {
        "kl_estimator": "clamped",
        "whiten_rewards": True,
        "value_head": "zero",
        "warmup_steps": 5,
        "adam_eps": 1e-6,
    }
    # warm-up over 5 steps x 2 updates; after 2 updates the rate is that of the third: 3/10 of the peak
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["learning_rate"] == pytest.approx(1e-5 * 3 / 10)
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
    result = CliRunner().invoke(
        cli, ["no-such-sft/", "no-such-rm/", str(prompts), "-o", str(tmp_path / "out"), *args]
    )
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_cli_rejects_unknown_config_keys(tmp_path):
    from farmkit.tools.farm_ppo import cli

    (tmp_path / "bad.yaml").write_text("kl_coeff: 0.1\n")
    result = CliRunner().invoke(
        cli,
        ["sft/", "rm/", "-", "-o", str(tmp_path / "out"), "--config", str(tmp_path / "bad.yaml")],
    )
    assert result.exit_code == 2
    assert "unknown option 'kl_coeff'" in result.output


def weights_equal(first_folder, second_folder, atol=1e-6):
    from safetensors.torch import load_file

    first, second = (
        load_file(first_folder / "model.safetensors"),
        load_file(second_folder / "model.safetensors"),
    )
    return first.keys() == second.keys() and all(
        torch.allclose(first[key], second[key], atol=atol) for key in first
    )


def test_lora_resume_keeps_measuring_kl_against_the_sft_model(models, tmp_path):
    """The reference of a LoRA run is the policy with its adapters off; a resumed run must restore
    the adapters on the SFT weights, not add fresh ones to the merged checkpoint."""
    sft, rm = models
    lora = dict(lora=True, lora_rank=4, checkpoint_every=1, **{**SMALL, "rollout_batch_size": 16})
    whole = tmp_path / "whole"
    train_ppo(str(sft), str(rm), prompt_records(16), str(whole), PPOConfig(steps=2, **lora), seed=5)
    resumed = tmp_path / "resumed"
    config = PPOConfig(
        steps=2, resume=True, checkpoint_dir=str(tmp_path / "whole-checkpoints"), **lora
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(resumed), config, seed=5)
    whole_kl = [entry["kl"] for entry in read_metrics(whole / "metrics.jsonl")]
    resumed_kl = [entry["kl"] for entry in read_metrics(resumed / "metrics.jsonl")]
    assert whole_kl[1] > 1e-3
    assert resumed_kl == pytest.approx(whole_kl, abs=1e-5), (whole_kl, resumed_kl)
    assert weights_equal(whole, resumed)


def test_resume_from_a_checkpoint_at_the_last_step_finishes_the_run(models, tmp_path):
    """A checkpoint written exactly at the step the resumed run ends on (here also the end of a pass
    over the prompts) leaves nothing to train: the output is that checkpoint's policy, the metrics are
    complete and the last step's metrics come back."""
    sft, rm = models
    first = tmp_path / "first"
    config = dict(checkpoint_every=2, lora=True, lora_rank=4, **{**SMALL, "rollout_batch_size": 16})
    train_ppo(
        str(sft), str(rm), prompt_records(16), str(first), PPOConfig(steps=3, **config), seed=2
    )
    checkpoint = tmp_path / "first-checkpoints" / "step-000002"
    output = tmp_path / "resumed"
    resumed = PPOConfig(
        steps=2, resume=True, checkpoint_dir=str(tmp_path / "first-checkpoints"), **config
    )
    last = train_ppo(str(sft), str(rm), prompt_records(16), str(output), resumed, seed=2)
    assert last["step"] == 2 and last == read_metrics(checkpoint / "metrics.jsonl")[-1]
    assert [entry["step"] for entry in read_metrics(output / "metrics.jsonl")] == [1, 2]
    assert json.loads((output / "meta.json").read_text())["step"] == 2
    assert weights_equal(checkpoint, output)


def test_reference_shares_the_policy_precision(models, tmp_path, monkeypatch):
    """On a bf16 GPU an automatic dtype loads the reference in bf16 beside an fp32 policy, so the KL
    is not 0 before the first update; the model's own config saying bf16 must not matter either."""
    sft, rm = models
    bf16_sft = variant(
        sft, tmp_path / "bf16-sft", config={"torch_dtype": "bfloat16", "dtype": "bfloat16"}
    )
    pretend_bf16_gpu(monkeypatch)
    loaded = spy_loads(monkeypatch)
    config = PPOConfig(steps=1, checkpoint_every=0, **{**SMALL, "rollout_batch_size": 16})
    last = train_ppo(
        str(bf16_sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0
    )
    assert len(loaded) == 2 and {network.dtype for network in loaded} == {torch.float32}
    assert abs(last["kl"]) < 1e-6


def test_old_logprobs_are_what_generate_sampled_from(models, tmp_path, monkeypatch):
    """At a temperature other than 1 the log-probabilities PPO's ratio and KL start from are those of
    the distribution generate() sampled (its processed scores)."""
    from farmkit.train import rl_common

    sft, rm = models
    calls = spy_generate(monkeypatch)
    seen = []
    original = rl_common.kl_penalized_rewards
    monkeypatch.setattr(
        rl_common, "kl_penalized_rewards", lambda *args: seen.append(args) or original(*args)
    )
    config = PPOConfig(
        steps=1, checkpoint_every=0, **{**SMALL, "rollout_batch_size": 16, "temperature": 0.7}
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    (call,), ((_, old_logprobs, _, mask, *_),) = calls, seen
    assert call["temperature"] == 0.7
    generated = sampled_logprobs(call)[:, : mask.shape[1]]
    assert mask.sum() > 16
    assert torch.allclose(old_logprobs[mask.bool()], generated[mask.bool()], atol=1e-4)


def test_the_first_minibatch_ratio_is_exactly_one(models, tmp_path):
    """One epoch over one minibatch: the policy that is updated is the one that sampled, so the
    ratio is 1 everywhere (approx_kl 0, nothing clipped)."""
    sft, rm = models
    config = PPOConfig(
        steps=1,
        checkpoint_every=0,
        **{
            **SMALL,
            "rollout_batch_size": 16,
            "minibatch_size": 16,
            "micro_batch_size": 16,
            "ppo_epochs": 1,
            "temperature": 0.7,
        },
    )
    last = train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=1)
    assert last["approx_kl"] < 1e-10 and last["clip_fraction"] == 0.0
    # and the reference, not yet moved from, is the same tempered distribution: no KL at all
    assert abs(last["kl"]) < 1e-6, last["kl"]


def test_raising_the_kl_coefficient_lowers_the_kl(models, tmp_path):
    """Both runs make the same first update (no KL yet); afterwards the penalised run stays near the
    SFT model. The per-step KL estimate is noisy (16 rollouts of a few tokens), so the runs last 8
    steps and the last 4 are averaged (measured over seeds 0-4: 0.41-1.83 unpenalised, 0.00-0.14 at 1.0)."""
    sft, rm = models
    late_kl = {}
    for kl_coef in (0.0, 1.0):
        config = PPOConfig(
            steps=8, checkpoint_every=0, **{**SMALL, "rollout_batch_size": 16, "kl_coef": kl_coef}
        )
        train_ppo(
            str(sft), str(rm), prompt_records(16), str(tmp_path / f"kl-{kl_coef}"), config, seed=0
        )
        metrics = read_metrics(tmp_path / f"kl-{kl_coef}" / "metrics.jsonl")
        assert len(metrics) == 8
        late_kl[kl_coef] = sum(entry["kl"] for entry in metrics[-4:]) / 4
    assert late_kl[1.0] < late_kl[0.0] / 2 and late_kl[1.0] < late_kl[0.0] - 0.15, late_kl


@pytest.mark.parametrize("head", ["reward", "zero"])
def test_the_value_model_starts_from_the_reward_model(models, tmp_path, head):
    """The value model checkpointed after one step at a negligible learning rate is still what it
    started as: the reward model, with its scoring head or with a zero head."""
    from safetensors.torch import load_file

    sft, rm = models
    config = PPOConfig(
        steps=2,
        checkpoint_every=1,
        value_head=head,
        **{**SMALL, "rollout_batch_size": 16, "learning_rate": 1e-12},
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    value = load_file(
        tmp_path / "out-checkpoints" / "step-000001" / "trainer" / "value" / "model.safetensors"
    )
    reward = load_file(rm / "model.safetensors")
    assert value.keys() == reward.keys()
    for key in reward:
        expected = (
            torch.zeros_like(reward[key])
            if head == "zero" and key.startswith("score.")
            else reward[key]
        )
        assert torch.allclose(value[key], expected, atol=1e-6), key


def test_resume_refuses_a_checkpoint_of_the_other_kind(models, tmp_path):
    """A full-weight checkpoint has no adapters to put back on SFT, and the other way round."""
    from farmkit.core.io import FarmError

    sft, rm = models
    config = dict(checkpoint_every=1, **{**SMALL, "rollout_batch_size": 16})
    train_ppo(
        str(sft),
        str(rm),
        prompt_records(16),
        str(tmp_path / "full"),
        PPOConfig(steps=2, **config),
        seed=0,
    )
    resumed = PPOConfig(
        steps=2, resume=True, lora=True, checkpoint_dir=str(tmp_path / "full-checkpoints"), **config
    )
    with pytest.raises(FarmError, match="without --lora"):
        train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), resumed, seed=0)


def test_offloaded_frozen_models_live_in_cpu_memory_and_change_nothing(
    models, tmp_path, monkeypatch
):
    """--offload-frozen keeps the reference's and the reward model's weights in CPU memory (the
    modules hold placeholders; each layer's weights are copied to the execution device while it
    runs): the same run, metrics and weights as without it."""
    from safetensors.torch import load_file

    from farmkit.train import launch

    sft, rm = models
    offloaded = []
    original = launch.offload_frozen

    def spy(network, execution_device):
        offloaded.append((network, execution_device))
        return original(network, execution_device)

    monkeypatch.setattr(launch, "offload_frozen", spy)
    small = {**SMALL, "rollout_batch_size": 8, "minibatch_size": 8, "micro_batch_size": 8}
    config = dict(steps=2, checkpoint_every=0, **small)
    plain = train_ppo(
        str(sft), str(rm), prompt_records(16), str(tmp_path / "plain"), PPOConfig(**config), seed=2
    )
    assert offloaded == []
    light = train_ppo(
        str(sft),
        str(rm),
        prompt_records(16),
        str(tmp_path / "light"),
        PPOConfig(offload_frozen=True, **config),
        seed=2,
    )
    kinds = sorted(type(network).__name__ for network, _ in offloaded)
    assert kinds == ["LlamaForCausalLM", "LlamaForSequenceClassification"], kinds
    for network, execution_device in offloaded:
        assert execution_device == "cpu"  # this machine's device; a GPU's on a GPU machine
        # the module holds no weights: placeholders on the meta device ...
        assert {p.device.type for p in network.parameters()} == {"meta"}
        # ... the weights are in the hook's CPU copy, and a forward pass still works
        weights_map = network.model.layers[0].self_attn.q_proj._hf_hook.weights_map
        assert weights_map["weight"].device.type == "cpu"
    for key in ("reward", "kl", "score", "policy_loss", "value_loss"):
        assert light[key] == pytest.approx(plain[key], abs=1e-6), key
    assert light["kl"] != 0.0  # the offloaded reference took part in a KL that moved
    first, second = (load_file(tmp_path / n / "model.safetensors") for n in ("plain", "light"))
    assert all(torch.allclose(first[key], second[key], atol=1e-6) for key in first)


def spy_on(monkeypatch, module, name):
    """Replace module.name by a wrapper that records (args, result) of every call."""
    calls = []
    original = getattr(module, name)

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append((args, result))
        return result

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("estimator", ["k1", "clamped", "k3"])
def test_the_configured_kl_estimator_is_the_penalty(models, tmp_path, monkeypatch, estimator):
    """Inside a real PPO step (the second, once the policy has moved from SFT both ways on some
    tokens) the per-token KL in the penalty is the configured estimate of the log-ratio, not another:
    clamped floors it at 0, k3 is (r - 1) - log r, both never negative; k1 is the log-ratio itself."""
    from farmkit.train import rl_common

    sft, rm = models
    calls = spy_on(monkeypatch, rl_common, "kl_penalized_rewards")
    config = PPOConfig(
        steps=2,
        checkpoint_every=0,
        kl_estimator=estimator,
        **{**SMALL, "rollout_batch_size": 16},
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    assert len(calls) == 2
    (scores, logprobs, ref_logprobs, mask, kl_coef, *_), (rewards, kl) = calls[1]
    on = mask.bool()
    log_ratio = (logprobs - ref_logprobs)[on]
    assert (log_ratio < -1e-3).any() and (log_ratio > 1e-3).any(), log_ratio
    formulas = {
        "k1": log_ratio,
        "clamped": log_ratio.clamp(min=0.0),
        "k3": torch.expm1(-log_ratio) + log_ratio,
    }
    assert torch.allclose(kl[on], formulas[estimator], atol=1e-6)
    for other, values in formulas.items():
        if other != estimator:
            assert not torch.allclose(kl[on], values, atol=1e-4), other
    # the rewards carry that estimate: -kl_coef * KL on every token (the configured kl_coef, not
    # whatever the call was handed), the score added at the last
    assert kl_coef == config.kl_coef == SMALL["kl_coef"] > 0
    penalty = rewards.clone()
    penalty[torch.arange(len(scores)), rl_common.last_token_index(mask)] -= scores
    assert torch.allclose(penalty[on], -config.kl_coef * kl[on], atol=1e-6)


@pytest.mark.parametrize("whiten", [True, False])
def test_whitened_rewards_are_what_the_advantages_see(models, tmp_path, monkeypatch, whiten):
    """--whiten-rewards divides the per-token rewards by their standard deviation over the rollout
    batch (mean kept) before GAE; without it GAE sees the KL-penalised rewards as they are."""
    from farmkit.train import rl_common

    sft, rm = models
    penalized = spy_on(monkeypatch, rl_common, "kl_penalized_rewards")
    advantages = spy_on(monkeypatch, rl_common, "generalized_advantages")
    config = PPOConfig(
        steps=1, checkpoint_every=0, whiten_rewards=whiten, **{**SMALL, "rollout_batch_size": 16}
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    [((*_, mask, _, _), (rewards, _))] = penalized
    [((seen, _, seen_mask, *_), _)] = advantages
    assert torch.equal(seen_mask, mask)
    whitened = rl_common.masked_whiten(rewards, mask, shift_mean=False)
    assert not torch.allclose(whitened, rewards, atol=1e-3)  # whitening moves these rewards
    assert torch.allclose(seen, whitened if whiten else rewards, atol=1e-6)


def test_adamw_takes_the_configured_eps(models, tmp_path, monkeypatch):
    sft, rm = models
    created = spy_adamw(monkeypatch)
    config = PPOConfig(
        steps=1, checkpoint_every=0, adam_eps=3e-7, **{**SMALL, "rollout_batch_size": 16}
    )
    train_ppo(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    assert len(created) == 1
    assert [group["eps"] for group in created[0].param_groups] == [3e-7]
