"""farm-rloo and farm-grpo: the group advantages checked by hand (each group sums to 0, the
leave-one-out baseline leaves the sample out, Dr.GRPO drops the standard deviation and the length
normalization), then RLOO, GRPO and Dr.GRPO on the tiny model with the reward model that pays for
"blue": the reward rises, the output and checkpoints load, a resumed run matches an unbroken one, and
the command lines write a policy folder that farm-sample loads."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from policy_fixtures import (
    GROUP_SETTINGS,
    check_budget,
    keyword_probability,
    keyword_reward_model,
    prompt_records,
    sampled_rewards,
    tiny_sft,
    write_jsonl,
)

from farmkit.core.validate import problems
from farmkit.methods.group import (
    GRPOConfig,
    RLOOConfig,
    grpo_advantages,
    rloo_advantages,
    train_group,
)
from farmkit.train.estimators import policy_loss

SCORES = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.5, 0.5, 0.5, 2.5])  # two groups of k = 4


def test_rloo_advantage_is_the_score_minus_the_mean_of_the_others():
    advantages = rloo_advantages(SCORES, 4)
    # by hand: first group, sample 0: 1 - (2 + 3 + 6) / 3; sample 3: 6 - (1 + 2 + 3) / 3
    expected = torch.tensor(
        [
            1 - 11 / 3,
            2 - 10 / 3,
            3 - 9 / 3,
            6 - 6 / 3,
            0.5 - 3.5 / 3,
            0.5 - 3.5 / 3,
            0.5 - 3.5 / 3,
            2.5 - 1.5 / 3,
        ]
    )
    assert torch.allclose(advantages, expected)
    assert torch.allclose(advantages.reshape(2, 4).sum(dim=1), torch.zeros(2), atol=1e-6)


def test_the_leave_one_out_baseline_excludes_the_sample_itself():
    """Raising one score by d moves its own advantage by exactly d (its baseline does not see it) and
    every other advantage of its group by -d / (k - 1); the other group does not move."""
    raised = SCORES.clone()
    raised[1] += 3.0
    change = rloo_advantages(raised, 4) - rloo_advantages(SCORES, 4)
    assert torch.allclose(change, torch.tensor([-1.0, 3.0, -1.0, -1.0, 0, 0, 0, 0]))
    # a baseline that included the sample (the plain group mean) would move it by only 3 * 3/4
    included = raised - raised.reshape(2, 4).mean(1).repeat_interleave(4)
    assert not torch.allclose(included[1] - (SCORES[1] - 3.0), change[1])


def test_grpo_advantages_are_standardized_per_group_and_sum_to_zero():
    advantages = grpo_advantages(SCORES, 4)
    std = (14 / 3) ** 0.5  # sample std of 1, 2, 3, 6 around their mean 3
    assert torch.allclose(advantages[:4], (SCORES[:4] - 3.0) / (std + 1e-4))
    assert torch.allclose(advantages.reshape(2, 4).sum(dim=1), torch.zeros(2), atol=1e-5)
    assert torch.allclose(advantages.reshape(2, 4).std(dim=1), torch.ones(2), atol=1e-3)
    # a group whose scores are all equal carries no signal: zeros, not NaN
    assert torch.equal(grpo_advantages(torch.full((4,), 0.7), 4), torch.zeros(4))


def test_dr_grpo_keeps_the_scale_and_drops_the_length_normalization():
    dr = grpo_advantages(SCORES, 4, scale=False)
    assert torch.allclose(dr, SCORES - SCORES.reshape(2, 4).mean(1).repeat_interleave(4))
    assert not torch.allclose(dr, grpo_advantages(SCORES, 4))
    assert torch.allclose(dr.reshape(2, 4).sum(dim=1), torch.zeros(2), atol=1e-6)
    # RLOO's advantage is the centred score scaled by k / (k - 1)
    assert torch.allclose(rloo_advantages(SCORES, 4), dr * 4 / 3)
    # GRPO averages each response over its own tokens; Dr.GRPO divides by a constant
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])

    def response_weights(config):
        """What each response's tokens weigh together in the config's loss (and KL term)."""
        aggregate = policy_loss(config.policy_loss).aggregate
        return torch.stack(
            [aggregate(row, row, responses=1, tokens=row.sum(), norm=8) for row in mask[:, None]]
        )

    grpo = response_weights(GRPOConfig(max_new_tokens=8))
    drgrpo = response_weights(GRPOConfig(max_new_tokens=8, dr_grpo=True))
    assert torch.allclose(grpo, torch.ones(2))  # every response weighs the same
    assert torch.allclose(drgrpo, torch.tensor([2 / 8, 4 / 8]))  # longer weighs more
    assert torch.equal(response_weights(RLOOConfig()), mask.sum(dim=1))  # one action: summed


def _method(config):
    from farmkit.methods.group import GroupMethod

    return GroupMethod(config)


def _micro(logprobs, old_logprobs, ref_logprobs):
    from farmkit.train.onpolicy import MicroBatch

    mask = torch.ones_like(old_logprobs)
    return MicroBatch(
        logprobs=logprobs,
        values=None,
        index=torch.arange(old_logprobs.shape[0]),
        mask=mask,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        responses=old_logprobs.shape[0],
        tokens=mask.sum(),
    )


def test_grpo_config_standardizes_and_dr_grpo_does_not():
    """The method's own prepare step (not only the estimator) divides by each group's sample std for
    GRPO and not for Dr.GRPO; the figures are worked out by hand (statistics.stdev)."""
    import statistics
    from types import SimpleNamespace

    batch = SimpleNamespace(rollout=SimpleNamespace(response_mask=torch.ones(8, 3)), scores=SCORES)
    zeros = torch.zeros(8, 3)
    groups = [SCORES[:4].tolist(), SCORES[4:].tolist()]
    centred = [x - statistics.mean(g) for g in groups for x in g]
    scaled = [(x - statistics.mean(g)) / (statistics.stdev(g) + 1e-4) for g in groups for x in g]
    for dr_grpo, expected in ((False, scaled), (True, centred)):
        config = GRPOConfig(samples_per_prompt=4, kl_coef=0.0, dr_grpo=dr_grpo)
        prepared = _method(config).prepare(batch, zeros, zeros, None, None)
        assert torch.allclose(prepared.advantages, torch.tensor(expected), atol=1e-5), dr_grpo


@pytest.mark.parametrize(
    "config", [GRPOConfig(kl_coef=0.0), RLOOConfig(kl_coef=0.0)], ids=["grpo", "rloo"]
)
def test_group_loss_clips_the_ratio(config):
    """Every token's ratio is e (far above 1 + clip) and every advantage positive: the pessimistic
    surrogate is the clipped one, -(1 + clip) x the mean advantage, and carries no gradient."""
    old = torch.full((4, 3), -2.0)
    logprobs = (old + 1.0).requires_grad_()
    advantages = torch.tensor([0.5, 1.0, 1.5, 2.0])
    from farmkit.train.onpolicy import Prepared

    prepared = Prepared(advantages, torch.zeros(4, 3))
    loss, _ = _method(config).loss(_micro(logprobs, old, old), prepared)
    expected = -(1 + config.clip_range) * advantages.mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert torch.count_nonzero(logprobs.grad) == 0


def test_group_loss_adds_the_kl_term():
    """GRPO's kl_in=loss: with zero advantages the loss is kl_coef x the k3 estimate of the current
    policy against the reference, averaged over each response's tokens and the responses."""
    import math

    from farmkit.train.onpolicy import Prepared

    old = torch.full((2, 3), -2.0)
    ref = old - 0.5  # log pi - log pi_ref = 0.5 on every token
    config = GRPOConfig(kl_coef=0.3, kl_in="loss", kl_estimator="k3")
    prepared = Prepared(torch.zeros(2), torch.zeros(2, 3))
    loss, figures = _method(config).loss(_micro(old.clone(), old, ref), prepared)
    k3 = math.expm1(-0.5) + 0.5
    assert loss.item() == pytest.approx(0.3 * k3, rel=1e-5)
    assert figures["kl_loss"].item() == pytest.approx(k3, rel=1e-5)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(samples_per_prompt=1), "at least 2"),
        (dict(rollout_batch_size=10, samples_per_prompt=4), "multiple of num-samples"),
        (dict(rollout_batch_size=16, minibatch_size=6), "multiple of minibatch-size"),
        (dict(kl_coef=-0.1), "kl-coef"),
        # RLOO's one ratio per response takes a correction per response only
        (dict(rollout_correction="token-mask"), "takes sequence-truncate or sequence-mask"),
        (dict(overlong="penalty", overlong_cache=300), "overlong-cache must be below"),
        (dict(async_rollouts=True, dynamic_sampling=True), "do not go together"),
    ],
)
def test_bad_settings_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        RLOOConfig(**values)


SMALL = GROUP_SETTINGS


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (
        tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")),
    )


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


METHODS = {
    "rloo": lambda **extra: RLOOConfig(**SMALL, **extra),
    "grpo": lambda **extra: GRPOConfig(**SMALL, **extra),
    "dr-grpo": lambda **extra: GRPOConfig(dr_grpo=True, **SMALL, **extra),
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_reward_rises_and_the_policy_says_blue_more(models, tmp_path, method):
    sft, rm = models
    output = tmp_path / method
    config = METHODS[method](steps=4, checkpoint_every=2)
    train_group(str(sft), str(rm), prompt_records(16), str(output), config, seed=0)
    metrics = read_metrics(output / "metrics.jsonl")
    assert [entry["step"] for entry in metrics] == list(range(1, 5))
    assert abs(metrics[0]["kl"]) < 1e-6  # the policy is the reference before the first update
    assert max(entry["kl"] for entry in metrics[1:]) > 0.01
    assert ("kl_loss" in metrics[0]) == (method != "rloo")  # GRPO's KL is in the loss by default
    early = sum(entry["reward"] for entry in metrics[:2]) / 2
    late = sum(entry["reward"] for entry in metrics[-2:]) / 2
    print(method, "reward per step", [round(entry["reward"], 3) for entry in metrics])
    assert late > early + 0.1, (early, late)
    assert keyword_probability(output) > keyword_probability(sft) + 0.1
    _, sft_rewards = sampled_rewards(sft, rm)
    _, trained_rewards = sampled_rewards(output, rm)
    print(method, "sampled reward", sum(sft_rewards) / 64, "->", sum(trained_rewards) / 64)
    assert sum(trained_rewards) > sum(sft_rewards) + 0.1 * len(sft_rewards)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["tool"] == f"farm-{method.split('-')[-1]}" and meta["kind"] == "policy"
    assert meta["step"] == 4 and meta["config"]["samples_per_prompt"] == 4
    checkpoint = tmp_path / f"{method}-checkpoints" / "step-000002"
    assert json.loads((checkpoint / "meta.json").read_text())["step"] == 2
    assert (checkpoint / "trainer" / "optimizer.pt").is_file()
    assert not (checkpoint / "trainer" / "value").exists()  # no value model
    budget = check_budget(output, method.removeprefix("dr-"), None)
    assert budget["tokens_sampled"] == sum(round(e["response_length"] * 32) for e in metrics)


def test_groups_are_k_samples_of_one_prompt(models, tmp_path, monkeypatch):
    """Every row of a group answers the same prompt, so the baseline compares like with like."""
    from farmkit.train import rollouts

    sft, rm = models
    seen = []
    original = rollouts.sample_and_score

    def spy(*args, **kwargs):
        seen.append(list(args[5]))
        return original(*args, **kwargs)

    monkeypatch.setattr(rollouts, "sample_and_score", spy)
    config = RLOOConfig(steps=1, checkpoint_every=0, **{**SMALL, "samples_per_prompt": 8})
    train_group(str(sft), str(rm), prompt_records(16), str(tmp_path / "out"), config, seed=0)
    (indices,) = seen
    groups = [indices[i : i + 8] for i in range(0, 32, 8)]
    assert all(len(set(group)) == 1 for group in groups) and len({g[0] for g in groups}) == 4


def test_resume_continues_exactly_where_the_run_stopped(models, tmp_path):
    sft, rm = models
    whole = tmp_path / "whole"
    config = dict(steps=2, checkpoint_every=1, **{**SMALL, "rollout_batch_size": 16})
    train_group(str(sft), str(rm), prompt_records(16), str(whole), GRPOConfig(**config), seed=3)
    resumed = tmp_path / "resumed"
    again = GRPOConfig(resume=True, checkpoint_dir=str(tmp_path / "whole-checkpoints"), **config)
    last = train_group(str(sft), str(rm), prompt_records(16), str(resumed), again, seed=3)
    assert last["step"] == 2
    assert [entry["step"] for entry in read_metrics(resumed / "metrics.jsonl")] == [1, 2]
    from safetensors.torch import load_file

    first, second = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.allclose(first[key], second[key], atol=1e-6) for key in first)
    original = load_file(sft / "model.safetensors")
    assert any(not torch.equal(first[key], original[key]) for key in first)


@pytest.mark.parametrize("tool", ["farm_rloo", "farm_grpo"])
def test_cli_writes_a_policy_folder_that_farm_sample_loads(models, tmp_path, tool):
    import importlib

    cli = importlib.import_module(f"farmkit.tools.{tool}").cli
    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    (tmp_path / "run.yaml").write_text("steps: 5\nkl-coef: 0.02\ncheckpoint-every: 0\n")
    output = tmp_path / "out"
    extra = ["--dr-grpo"] if tool == "farm_grpo" else []
    result = CliRunner().invoke(
        cli,
        [
            str(sft),
            str(rm),
            str(prompts),
            "-o",
            str(output),
            "--config",
            str(tmp_path / "run.yaml"),
            "--steps",
            "1",
            "--rollout-batch-size",
            "16",
            "--num-samples",
            "2",
            "--minibatch-size",
            "8",
            "--micro-batch-size",
            "8",
            "--max-new-tokens",
            "3",
            "--kl-in",
            "loss",
            "--report-to",
            "tensorboard",
            *extra,
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    # --report-to: the step's metrics also went to TensorBoard, beside the output folder
    from test_cli import _scalar_tags

    assert {"reward", "kl"} <= _scalar_tags(tmp_path / "out.runs")
    assert not list(output.rglob("events.out.tfevents.*"))
    meta = json.loads((output / "meta.json").read_text())
    assert meta["tool"] == tool.replace("_", "-")
    assert meta["config"]["steps"] == 1 and meta["config"]["kl_coef"] == 0.02
    assert meta["config"]["kl_in"] == "loss" and meta["config"]["samples_per_prompt"] == 2
    assert meta["config"].get("dr_grpo", False) == bool(extra)
    assert list(meta["inputs"]) == [str(prompts)]
    rows = read_metrics(output / "metrics.jsonl")
    assert [entry["step"] for entry in rows] == [1]
    # the one metrics schema of every trainer
    assert rows[0]["method"] == tool.removeprefix("farm_")
    assert rows[0]["loss"] == rows[0]["policy_loss"]  # no value model: the loss is the policy's
    assert problems(rows[0], "metrics") is None
    texts, rewards = sampled_rewards(output, rm, n=1)
    assert len(texts) == len(rewards) == 16


@pytest.mark.parametrize("tool", ["farm_rloo", "farm_grpo"])
def test_cli_rejects_bad_combinations_before_loading_anything(tmp_path, tool):
    import importlib

    cli = importlib.import_module(f"farmkit.tools.{tool}").cli
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(2))
    result = CliRunner().invoke(
        cli,
        [
            "no-sft/",
            "no-rm/",
            str(prompts),
            "-o",
            str(tmp_path / "out"),
            "--num-samples",
            "1",
        ],
    )
    assert result.exit_code == 2 and "at least 2" in result.output
    assert not (tmp_path / "out").exists()


# A new estimator and a new loss, each one registered function, as farmkit.train.estimators' own
# are: a constant advantage no group baseline can give (each group's advantages sum to 0), and
# GRPO's loss that also counts its calls in the metrics.
TOY_REGISTRY = """
import torch

from farmkit.train import estimators as E


@E.register_advantage("constant", E.RESPONSE)
def constant_advantages(scores, k):
    return torch.full_like(scores, 0.25)


@E.register_policy_loss("counted", E.RESPONSE, E.seq_mean_token_mean)
def counted_terms(logprobs, old_logprobs, advantages, mask, low, high):
    terms, figures = E.per_token_clipped(logprobs, old_logprobs, advantages, mask, low, high)
    # 1 on every token: its average over each minibatch's tokens is 1 wherever it was called
    return terms, {**figures, "counted_calls": torch.ones_like(terms)}
"""


def test_a_registered_estimator_and_loss_run_in_farm_grpo_by_name(models, tmp_path):
    """Registered before the command is built (a fresh process imports the module first), they are
    choices of the real farm-grpo, which trains with them: its metrics show the constant advantage
    and one counted call per update, and meta.json records both names."""
    import os
    import subprocess
    import sys

    (tmp_path / "toy_registry.py").write_text(TOY_REGISTRY)
    sft, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(4))
    output = tmp_path / "out"
    code = "import sys, toy_registry\nfrom farmkit.tools.farm_grpo import main\nmain(sys.argv[1:])"
    args = "--steps 1 --rollout-batch-size 4 --num-samples 2 --minibatch-size 2 "
    args += "--micro-batch-size 2 --max-new-tokens 3 --kl-coef 0 --save-steps 0 -q"
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code, str(sft), str(rm), str(prompts), "-o", str(output)]
        + ["--advantage-estimator", "constant", "--policy-loss", "counted", *args.split()],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr.decode()
    meta = json.loads((output / "meta.json").read_text())
    assert (meta["config"]["advantage_estimator"], meta["config"]["policy_loss"]) == (
        "constant",
        "counted",
    )
    (row,) = read_metrics(output / "metrics.jsonl")
    assert row["advantage_abs"] == 0.25
    assert row["counted_calls"] == 1.0  # every update (2 minibatches x 2 epochs) called it
