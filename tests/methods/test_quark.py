"""farm-quark on the tiny model with a reward model that pays for answering "blue": training on the
top quantile raises the reward, the saved policy samples with its control token, and --keep all
trains every quantile behind its own token."""

from __future__ import annotations

import json

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
    write_jsonl,
)
from torch.optim.optimizer import register_optimizer_step_pre_hook

from farmkit.methods.quark import QuarkConfig, quantile_token, train_quark

SMALL = dict(
    prompts_per_round=16,
    samples_per_prompt=4,
    num_quantiles=4,
    learning_rate=3e-3,
    kl_coef=0.05,
    temperature=1.0,
    max_new_tokens=4,
    batch_size=16,
    epochs_per_round=2,
)


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (
        tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")),
    )


def test_top_quantile_training_raises_the_reward(models, tmp_path):
    sft, rm = models
    output = tmp_path / "quark"
    history = train_quark(
        str(sft), str(rm), prompt_records(16), str(output), QuarkConfig(rounds=3, **SMALL), seed=0
    )
    assert [entry["round"] for entry in history] == [1, 2, 3]
    assert all(
        entry["trained_on"] == 16 for entry in history
    )  # 64 samples, the best of 4 quantiles
    for entry in (
        history
    ):  # quantiles ranked best first, equal-sized: their means average to the round's mean
        quantiles = entry["quantile_scores"]
        assert (
            len(quantiles) == 4
            and quantiles == sorted(quantiles, reverse=True)
            and quantiles[0] > quantiles[-1]
        )
        assert quantiles[0] == pytest.approx(entry["top_quantile_score"])
        assert sum(quantiles) / 4 == pytest.approx(entry["score"])
    assert (
        history[-1]["reward"] > history[0]["reward"] + 0.1
    )  # round 1 samples the SFT model itself
    meta = json.loads((output / "meta.json").read_text())
    assert meta["kind"] == "policy" and meta["tool"] == "farm-quark"
    assert meta["sampling_control_token"] == quantile_token(0)
    assert [
        json.loads(line)["round"] for line in (output / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2, 3]
    # sampled the way farm-sample samples (PromptFormat.for_model adds the control token)
    assert keyword_probability(output) > keyword_probability(sft) + 0.1
    sft_texts, sft_rewards = sampled_rewards(sft, rm)
    texts, rewards = sampled_rewards(output, rm)
    assert sum(rewards) / len(rewards) > sum(sft_rewards) / len(sft_rewards) + 0.1
    assert not any("reward_quantile" in text for text in texts)
    budget = check_budget(output, "quark", None)
    assert budget["tokens_sampled"] == sum(round(e["response_length"] * 64) for e in history)


def spy_conditioned_prompts(monkeypatch) -> list[list[int]]:
    """Every prompt (token ids) that Quark's training builds a batch from, control token included."""
    from farmkit.train import policy as P

    original, seen = P.rollout_from_lists, []

    def rollout_from_lists(prompts, *args, **kwargs):
        seen.extend(list(prompt) for prompt in prompts)
        return original(prompts, *args, **kwargs)

    monkeypatch.setattr(P, "rollout_from_lists", rollout_from_lists)
    return seen


def test_keep_all_trains_every_quantile_with_its_token(models, tmp_path, monkeypatch):
    from farmkit.tools.farm_quark import cli

    trained = spy_conditioned_prompts(monkeypatch)
    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    output = tmp_path / "quark-all"
    args = [
        str(sft),
        str(rm),
        str(prompts),
        "-o",
        str(output),
        "--keep",
        "all",
        "--rounds",
        "1",
        "--prompts-per-round",
        "8",
        "--num-samples",
        "2",
        "--num-quantiles",
        "4",
        "--max-new-tokens",
        "3",
        "--learning-rate",
        "1e-3",
        "-q",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    round_metrics = json.loads((output / "metrics.jsonl").read_text().splitlines()[0])
    assert round_metrics["trained_on"] == 16
    from farmkit.lm.models import load_tokenizer

    tokenizer = load_tokenizer(output)
    ids = tokenizer.convert_tokens_to_ids([quantile_token(q) for q in range(4)])
    assert len(set(ids)) == 4 and tokenizer.unk_token_id not in ids
    # each kept response is trained behind its own quantile's token: all four of them are used
    assert {prompt[-1] for prompt in trained} & set(ids) == set(ids)


def test_later_rounds_sample_behind_the_top_quantile_token(models, monkeypatch, tmp_path):
    """Round 1 samples the SFT model on the plain prompt; every later round asks the policy for its
    best quantile: each prompt it samples from ends with quantile 0's control token."""
    from farmkit.train import rollouts

    original, sampled = rollouts.sample_and_score, []

    def sample_and_score(policy, tokenizer, scorer, records, prompts, indices, **kwargs):
        sampled.append(([list(prompts[i]) for i in indices], list(kwargs["suppress"])))
        return original(policy, tokenizer, scorer, records, prompts, indices, **kwargs)

    monkeypatch.setattr(rollouts, "sample_and_score", sample_and_score)
    sft, rm = models
    small = {**SMALL, "prompts_per_round": 4, "epochs_per_round": 1}
    train_quark(
        str(sft), str(rm), prompt_records(8), str(tmp_path / "q"), QuarkConfig(rounds=2, **small)
    )
    assert len(sampled) == 2  # one generation batch a round
    (first, tokens), (second, same_tokens) = sampled
    assert tokens == same_tokens and len(tokens) == 4
    top = tokens[0]
    assert not any(set(prompt) & set(tokens) for prompt in first)
    assert all(prompt[-1] == top and prompt.count(top) == 1 for prompt in second)


def test_config_rejects_more_quantiles_than_samples():
    with pytest.raises(ValueError, match="at least one response per quantile"):
        QuarkConfig(prompts_per_round=1, samples_per_prompt=2, num_quantiles=5)


def weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_the_kl_term_changes_the_result(models, tmp_path):
    """Without control tokens, so that the KL compares the policy and SFT on the same prompt: behind a
    new token the random tiny model's KL is about 2 nats from the token alone, more than four
    optimizer steps move either way."""
    sft, rm = models
    runs = {}
    for kl_coef in (0.0, 2.0):
        output = tmp_path / f"kl-{kl_coef}"
        config = QuarkConfig(rounds=2, control_token="none", **{**SMALL, "kl_coef": kl_coef})
        runs[kl_coef] = (
            train_quark(str(sft), str(rm), prompt_records(16), str(output), config, seed=4),
            weights(output),
        )
    (free, free_weights), (held, held_weights) = runs[0.0], runs[2.0]
    assert any(not torch.equal(free_weights[key], held_weights[key]) for key in free_weights)
    assert held[-1]["kl"] < free[-1]["kl"] - 0.01, (free[-1]["kl"], held[-1]["kl"])


def test_the_kl_is_exactly_zero_before_any_update_under_bf16_mixed_precision(
    models, tmp_path, monkeypatch, fresh_accelerate_state
):
    """Under `accelerate launch --mixed_precision bf16` the policy's forward runs under autocast, so
    the reference's must too, or Quark's KL term is not 0 where policy and SFT are the same model.
    One optimizer step on the plain prompt (no control tokens: with them the policy reads a token
    SFT never saw): its KL is measured before the step, so it is exactly 0. The control below shows
    the test can fail: without autocast on the reference the KL is not 0."""
    from contextlib import nullcontext

    from accelerate import Accelerator

    sft, rm = models
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    config = QuarkConfig(
        rounds=1,
        control_token="none",
        keep="top",
        steps_per_round=1,
        **{**SMALL, "epochs_per_round": 1},
    )
    output = tmp_path / "bf16"
    rows = train_quark(str(sft), str(rm), prompt_records(16), str(output), config, seed=0)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["launch"]["mixed_precision"] == "bf16"
    assert rows[0]["optimizer_steps"] == 1
    assert rows[0]["kl"] == 0.0

    # the same run with the reference's autocast taken away (the defect this test is for)
    calls = {"n": 0}
    autocast = Accelerator.autocast

    def reference_without_autocast(self, *args, **kwargs):
        calls["n"] += 1
        # the sampling's autocast comes first, the reference's second
        return autocast(self, *args, **kwargs) if calls["n"] == 1 else nullcontext()

    monkeypatch.setattr(Accelerator, "autocast", reference_without_autocast)
    skewed = train_quark(
        str(sft), str(rm), prompt_records(16), str(tmp_path / "skewed"), config, seed=0
    )
    assert calls["n"] >= 2 and skewed[0]["kl"] != 0.0


def test_reference_shares_the_policy_precision(models, tmp_path, monkeypatch):
    sft, rm = models
    pretend_bf16_gpu(monkeypatch)
    loaded = spy_loads(monkeypatch)
    config = QuarkConfig(rounds=1, **{**SMALL, "prompts_per_round": 4})
    train_quark(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    assert len(loaded) == 2 and {network.dtype for network in loaded} == {torch.float32}


def test_training_logprobs_are_what_generate_sampled_from(models, tmp_path, monkeypatch):
    """As AlpacaFarm: the likelihood and the KL are those of the tempered policy that sampled. Without
    control tokens the first batch is scored by the very policy that sampled it, on the same prompts,
    so its log-probabilities are generate()'s processed scores."""
    from farmkit.train import policy as P

    sft, rm = models
    calls = spy_generate(monkeypatch)
    seen = []
    original = P.response_logits

    def spy(model, rollout, temperature):
        logits = original(model, rollout, temperature)
        seen.append((rollout, temperature, P.token_logprobs(logits, rollout.response_ids).detach()))
        return logits

    monkeypatch.setattr(P, "response_logits", spy)
    config = QuarkConfig(
        rounds=1, control_token="none", **{**SMALL, "prompts_per_round": 4, "temperature": 0.7}
    )
    train_quark(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    assert (
        calls
        and {call["temperature"] for call in calls} == {0.7}
        and {entry[1] for entry in seen} == {0.7}
    )
    from farmkit.lm.models import load_tokenizer

    eos = load_tokenizer(sft).eos_token_id
    sampled = {}
    for call in calls:
        generated = sampled_logprobs(call)
        for row in range(len(call["tokens"])):
            prompt = tuple(call["prompts"][row][call["prompt_mask"][row].bool()].tolist())
            tokens = call["tokens"][row].tolist()
            length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            sampled[prompt, tuple(tokens[:length])] = generated[row, :length]
    rollout, _, trained = seen[0]  # the policy's first forward pass: the first training batch
    matched = 0
    for row in range(len(rollout.response_ids)):
        prompt = tuple(rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist())
        length = int(rollout.response_mask[row].sum())
        response = tuple(rollout.response_ids[row][:length].tolist())
        assert torch.allclose(trained[row, :length], sampled[prompt, response], atol=1e-4)
        matched += 1
    assert matched >= 4


def test_alpacafarm_schedule_without_control_tokens(models, tmp_path):
    """--control-token none, one optimizer step per round, a learning rate decaying over the rounds."""
    from farmkit.tools.farm_quark import cli

    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    output = tmp_path / "quark-plain"
    args = [
        str(sft),
        str(rm),
        str(prompts),
        "-o",
        str(output),
        "--control-token",
        "none",
        "--steps-per-round",
        "1",
        "--rounds",
        "2",
        "--prompts-per-round",
        "8",
        "--num-samples",
        "2",
        "--num-quantiles",
        "4",
        "--max-new-tokens",
        "3",
        "--learning-rate",
        "1e-3",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "-q",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [entry["optimizer_steps"] for entry in metrics] == [1, 1]
    assert [entry["learning_rate"] for entry in metrics] == pytest.approx([1e-3, 5e-4])
    meta = json.loads((output / "meta.json").read_text())
    assert "sampling_control_token" not in meta and meta["config"]["control_token"] == "none"
    from farmkit.lm.models import load_tokenizer

    assert quantile_token(0) not in load_tokenizer(output).get_vocab()


def test_config_rejects_keep_all_without_control_tokens():
    with pytest.raises(ValueError, match="needs --control-token condition"):
        QuarkConfig(keep="all", control_token="none")


def test_two_processes_share_a_round_and_only_the_main_one_writes(models, tmp_path):
    """torchrun, two gloo processes: each samples its share of the round (the seeds one process uses
    for the same generation batches), both rank the whole gathered round, rank 0 alone writes."""
    import os
    import subprocess
    import sys

    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    args = [
        str(sft),
        str(rm),
        str(prompts),
        "--rounds",
        "1",
        "--prompts-per-round",
        "8",
        "--num-samples",
        "2",
        "--num-quantiles",
        "4",
        "--generation-batch-size",
        "4",
        "--batch-size",
        "4",
        "--max-new-tokens",
        "4",
        "--temperature",
        "1.0",
        "--seed",
        "3",
    ]
    single = train_quark(
        str(sft),
        str(rm),
        prompt_records(8),
        str(tmp_path / "one" / "quark"),
        QuarkConfig(
            rounds=1,
            prompts_per_round=8,
            samples_per_prompt=2,
            num_quantiles=4,
            generation_batch_size=4,
            batch_size=4,
            max_new_tokens=4,
            temperature=1.0,
        ),
        seed=3,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    out = tmp_path / "two"
    out.mkdir()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "farmkit.tools.farm_quark",
        *args,
        "-o",
        str(out / "quark"),
    ]
    result = subprocess.run(command, capture_output=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    assert result.stderr.decode().count("round 1/1") == 1  # one process reports
    assert sorted(path.name for path in out.iterdir()) == [
        "quark"
    ]  # one folder, no second writer's leftovers
    meta = json.loads((out / "quark" / "meta.json").read_text())
    assert (
        meta["launch"]["num_processes"] == 2 and meta["launch"]["distributed_type"] == "MULTI_CPU"
    )
    [metrics] = [
        json.loads(line) for line in (out / "quark" / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["trained_on"] == 4  # 16 samples over both processes, the best of 4 quantiles
    # the round both processes sampled together is the round one process samples
    assert metrics["quantile_scores"] == pytest.approx(single[0]["quantile_scores"], abs=1e-5)
    # the folder holds a trained policy that loads and samples
    from safetensors.torch import load_file

    trained, start = (
        load_file(out / "quark" / "model.safetensors"),
        load_file(sft / "model.safetensors"),
    )
    same_shape = [name for name in start if trained[name].shape == start[name].shape]
    assert any(not torch.equal(trained[name], start[name]) for name in same_shape)
    # and it is, up to how the two processes split the batches' token means, the policy one
    # process trains from the same round (measured: 0.18242 and 0.18241; the SFT model's 0.18386)
    assert keyword_probability(out / "quark") == pytest.approx(
        keyword_probability(tmp_path / "one" / "quark"), abs=3e-4
    )


def test_a_deepspeed_launch_with_a_fixed_device_is_refused_not_ignored(monkeypatch, tmp_path):
    """--device cpu would make accelerate drop the DeepSpeed launch without a word (ZeRO-2 itself runs:
    tests/train/test_launch_deepspeed.py, ZeRO-3 is refused there)."""
    from farmkit.core.io import FarmError

    monkeypatch.setenv(
        "ACCELERATE_USE_DEEPSPEED", "true"
    )  # what `accelerate launch --use_deepspeed` sets
    with pytest.raises(FarmError, match="under DeepSpeed the engine places the model"):
        train_quark(
            "no-sft",
            "no-rm",
            prompt_records(4),
            str(tmp_path / "quark"),
            QuarkConfig(device="cpu"),
            seed=0,
        )
    assert not (tmp_path / "quark").exists()


@pytest.mark.parametrize("tied", [True, False])
def test_a_control_token_is_read_as_the_prompts_last_token_and_written_as_the_average(
    tiny_model_path, tied
):
    """What keeps the embedded model's answers whole behind a control token (the slow test below):
    its input row starts as a copy of the token it follows (the end of the prompt), an input the
    model has read, not transformers' mean row; an untied output row starts as the average output
    row (an average logit: rarely sampled). The rows the model had are untouched."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from farmkit.train.policy import add_control_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    before_in = model.get_input_embeddings().weight.detach().clone()
    before_out = model.get_output_embeddings().weight.detach().clone()
    like = tokenizer("Name a colour.")["input_ids"][-1]
    ids = add_control_tokens(model, tokenizer, ["<|q0|>", "<|q1|>"], like)
    rows_in = model.get_input_embeddings().weight.detach()
    rows_out = model.get_output_embeddings().weight.detach()
    old = before_in.shape[0]
    assert ids == [old, old + 1] and rows_in.shape[0] == old + 2
    assert torch.equal(rows_in[:old], before_in)
    for token in ids:
        assert torch.equal(rows_in[token], before_in[like])
        if not tied:
            assert torch.allclose(rows_out[token], before_out.mean(dim=0))
    if not tied:
        assert torch.equal(rows_out[:old], before_out)


@pytest.mark.slow
def test_control_tokens_do_not_collapse_the_embedded_models_answers(
    embedded_path, tiny_model_path, tmp_path_factory, tmp_path
):
    """(Slow lane: 40 s of the embedded model; the test above checks the rows that keep it so.)
    Round 1 samples the SFT model itself; round 2 samples it behind the new best-quantile token
    after one round of training. A control token that starts as transformers' default row (the mean
    embedding) is an input the model has never read: SmolLM2 then answers in fragments (24 prompts x
    2 samples, 32 new tokens, temperature 0.7: 79 characters without a token, 23 behind a mean row,
    100 behind a copy of the prompt's last token), and it samples control tokens into responses,
    which the reference model cannot read. Round 2's answers must keep most of their length."""
    from conftest import ROOT

    records = [
        json.loads(line)
        for line in (ROOT / "examples" / "data" / "instructions.jsonl").read_text().splitlines()
    ][:8]
    rm = keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm-embedded"))
    config = QuarkConfig(
        rounds=2,
        prompts_per_round=8,
        samples_per_prompt=2,
        num_quantiles=4,
        temperature=0.7,
        max_new_tokens=32,
        batch_size=4,
        epochs_per_round=1,
        generation_batch_size=16,
        device="cpu",
    )
    history = train_quark(str(embedded_path), str(rm), records, str(tmp_path / "q"), config)
    first, second = (entry["response_length"] for entry in history)
    assert first > 10 and second > 0.6 * first, (first, second)


def test_adamw_takes_the_configured_eps(models, tmp_path, monkeypatch):
    sft, rm = models
    created = spy_adamw(monkeypatch)
    config = QuarkConfig(rounds=1, adam_eps=3e-7, **{**SMALL, "prompts_per_round": 4})
    train_quark(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    assert len(created) == 1
    assert [group["eps"] for group in created[0].param_groups] == [3e-7]
    assert created[0].defaults["fused"] is True  # torch's fused kernel (bench/bench_optim.py)


def test_gradients_are_clipped_at_the_configured_norm(models, tmp_path):
    """Every optimizer step takes a gradient clipped to --max-grad-norm, whatever clips it: at 0.05,
    below what the tiny model's gradients measure, the norm that reaches each step is exactly 0.05.
    Measured at the step (torch's global optimizer pre-hook), not by spying on a clipping function:
    accelerate 1.16 clips through a function of its own."""
    sft, rm = models
    norms = []

    def at_step(optimizer, args, kwargs):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    hook = register_optimizer_step_pre_hook(at_step)
    try:
        config = QuarkConfig(rounds=1, max_grad_norm=0.05, **{**SMALL, "prompts_per_round": 4})
        history = train_quark(
            str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0
        )
    finally:
        hook.remove()
    assert len(norms) == history[-1]["optimizer_steps"] > 0
    assert norms == pytest.approx([0.05] * len(norms), rel=1e-3)


def test_vllm_rollouts_are_refused_with_control_tokens_and_auto_samples_with_hf(
    monkeypatch, tmp_path
):
    """--control-token condition grows the vocabulary a vLLM engine built from the SFT folder serves:
    --rollout-backend vllm is refused before any model is read (not after the first round, when
    the first push failed), and auto (which picks vllm on a GPU with vLLM installed) samples with
    hf; --control-token none adds no token and keeps vllm."""
    import importlib.util

    from farmkit.core.io import FarmError
    from farmkit.methods.quark import rollout_backend_kind

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rollout_backend_kind(QuarkConfig()) == "hf"  # auto, control tokens
    assert rollout_backend_kind(QuarkConfig(control_token="none")) == "vllm"
    assert rollout_backend_kind(QuarkConfig(rollout_backend="vllm", control_token="none")) == "vllm"
    assert rollout_backend_kind(QuarkConfig(rollout_backend="hf", control_token="none")) == "hf"
    output = tmp_path / "quark"
    with pytest.raises(FarmError, match="cannot sample Quark's control tokens"):
        train_quark(
            "no-such-sft",
            "no-such-rm",
            prompt_records(4),
            str(output),
            QuarkConfig(rollout_backend="vllm", **SMALL),
        )
    assert not output.exists()
