"""--async-rollouts (farmkit.train.async_rollouts): the next step's batch sampled by a copy of the
policy while the current one trains. On the tiny policy (tests/policy_fixtures.py), farm-grpo's
loop: each step's staleness is logged as designed (0 for the first batch, then 1); a stale batch's
behaviour log-probabilities are those of the weights that sampled it (the previous step's
checkpoint), not the current ones, and the rollout correction's weights are the capped ratio
between the two; staleness 0 trains exactly as the synchronous run; a run resumed from a
checkpoint trains the batch the uninterrupted run sampled ahead."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft
from safetensors.torch import load_file

from farmkit.core.io import FarmError
from farmkit.lm.models import load_causal_lm
from farmkit.methods.group import GRPOConfig, train_group
from farmkit.train import onpolicy
from farmkit.train import policy as P
from farmkit.train import rollout_backends as RB
from farmkit.train.metrics import CLOCK_FIELDS

# one minibatch of 8 rows, one pass, 4 new tokens: about a second a run
TINY = dict(
    rollout_batch_size=8,
    minibatch_size=8,
    micro_batch_size=8,
    ppo_epochs=1,
    learning_rate=2e-3,
    temperature=1.0,
    max_new_tokens=4,
)


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (
        tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")),
    )


def rows_of(output):
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def without_clock(row):
    return {key: value for key, value in row.items() if key not in CLOCK_FIELDS}


@pytest.fixture(scope="module")
def async_run(models, tmp_path_factory):
    """Three steps with one step of staleness, a checkpoint after each; every step's batch as the
    trainer corrected it (behaviour and trainer log-probabilities, the correction's weights)."""
    sft, rm = models
    output = tmp_path_factory.mktemp("async") / "grpo"
    seen = {}
    mismatch = onpolicy.OnPolicyTrainer.engine_mismatch

    def spy(self, step):
        figures, weights = mismatch(self, step)
        seen[step.number] = (step.batch, step.old_logprobs.clone(), weights)
        return figures, weights

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onpolicy.OnPolicyTrainer, "engine_mismatch", spy)
        config = GRPOConfig(steps=3, checkpoint_every=1, async_rollouts=True, **TINY)
        train_group(str(sft), str(rm), prompt_records(8), str(output), config)
    return output, seen


def test_each_steps_staleness_is_logged_as_designed(async_run):
    output, _ = async_run
    assert [row["staleness"] for row in rows_of(output)] == [0, 1, 1]


def test_a_stale_batch_carries_the_sampling_weights_logprobs_and_the_ratio_corrects_it(
    async_run,
):
    """Step 3's batch was sampled by the weights after step 1 (its checkpoint) while step 2
    trained: its behaviour log-probabilities are those weights' own, not the policy's after step 2
    (the trainer's), and each token's weight is min(pi_trainer / pi_behaviour, 3)."""
    output, seen = async_run
    batch, trainer, weights = seen[2]
    rollout, mask = batch.rollout, batch.rollout.response_mask
    behaviour = batch.engine_logprobs
    assert behaviour is not None and seen[0][0].engine_logprobs is None  # step 1: not stale
    sampler, _ = load_causal_lm(
        output.parent / "grpo-checkpoints" / "step-000001", device="cpu", dtype="float32"
    )
    with torch.no_grad():
        own = P.token_logprobs(P.response_logits(sampler, rollout, 1.0), rollout.response_ids)
    assert torch.allclose(behaviour, own * mask, atol=1e-5)
    assert float(((trainer - behaviour).abs() * mask).max()) > 1e-3  # the policy moved since
    expected = torch.exp((trainer - behaviour) * mask).clamp(max=3.0) * mask
    assert torch.allclose(weights, expected, atol=1e-6)


@pytest.mark.parametrize(
    "truncation, steps", [({}, 2), (dict(top_p=0.9, top_k=3), 1)], ids=["full", "top-p-k"]
)
def test_staleness_0_trains_exactly_as_the_synchronous_run(models, tmp_path, truncation, steps):
    """With K = 0 the batches are sampled by a copy in the thread, as the synchronous loop samples
    them: the same weights and metrics, truncated sampling (--top-p, --top-k) included (one step
    shows it: the first batch was sampled without them)."""
    sft, rm = models
    runs = {}
    for name, extra in (("sync", {}), ("async", dict(async_rollouts=True, max_staleness=0))):
        output = tmp_path / name
        config = GRPOConfig(steps=steps, checkpoint_every=0, **TINY, **truncation, **extra)
        train_group(str(sft), str(rm), prompt_records(8), str(output), config)
        runs[name] = (load_file(output / "model.safetensors"), rows_of(output))
    (weights, rows), (async_weights, async_rows) = runs["sync"], runs["async"]
    assert all(torch.equal(weights[key], async_weights[key]) for key in weights)
    assert [row.pop("staleness") for row in async_rows] == [0] * steps
    assert [without_clock(row) for row in rows] == [without_clock(row) for row in async_rows]


@pytest.mark.slow
def test_a_resumed_run_trains_the_batch_sampled_ahead_before_the_interruption(
    models, async_run, tmp_path
):
    """The step-2 checkpoint holds step 3's batch, sampled by the weights after step 1: resumed
    there, the run ends where the uninterrupted one did."""
    sft, rm = models
    done, _ = async_run
    output = tmp_path / "grpo"
    shutil.copytree(done.parent / "grpo-checkpoints", tmp_path / "grpo-checkpoints")
    config = GRPOConfig(steps=3, checkpoint_every=1, async_rollouts=True, resume=True, **TINY)
    train_group(str(sft), str(rm), prompt_records(8), str(output), config)
    expected, resumed = (
        load_file(done / "model.safetensors"),
        load_file(output / "model.safetensors"),
    )
    assert all(torch.equal(expected[key], resumed[key]) for key in expected)
    assert without_clock(rows_of(output)[-1]) == without_clock(rows_of(done)[-1])


def test_the_correction_is_on_with_its_default_cap():
    assert GRPOConfig(async_rollouts=True).importance_sampling_cap == 3.0
    assert (
        GRPOConfig(async_rollouts=True, importance_sampling_cap=1.5).importance_sampling_cap == 1.5
    )
    assert GRPOConfig().importance_sampling_cap == 0.0


@pytest.mark.parametrize("truncation", [dict(top_p=0.9), dict(top_k=3)], ids=["top-p", "top-k"])
def test_vllm_with_truncated_sampling_is_refused_before_any_work(tmp_path, monkeypatch, truncation):
    """The engine does not say which tokens top-p/top-k kept, and a stale batch's sampling weights
    are not the trainer's, so the truncation cannot be replayed: refused, nothing written."""
    monkeypatch.setattr(RB, "vllm_installed", lambda: True)
    config = GRPOConfig(steps=1, async_rollouts=True, rollout_backend="vllm", **TINY, **truncation)
    with pytest.raises(FarmError, match="--async-rollouts with the vllm rollout backend"):
        train_group("no-such-sft", "no-such-rm", prompt_records(8), str(tmp_path / "out"), config)
    assert not (tmp_path / "out").exists()


def test_vllm_without_truncation_is_not_refused(models, tmp_path, monkeypatch):
    """--async-rollouts with the vllm rollout backend goes past the checks to the engine (the
    vllm lane runs it: tests/lm/test_sampling_vllm.py); here the engine's start is stood in for
    by a failure of its own, reached only where no check refused the run."""

    def engine(*args, **kwargs):
        raise FarmError("the engine would start here")

    monkeypatch.setattr(RB, "vllm_installed", lambda: True)
    monkeypatch.setattr(onpolicy, "start_backend", engine)
    config = GRPOConfig(steps=1, async_rollouts=True, rollout_backend="vllm", **TINY)
    with pytest.raises(FarmError, match="the engine would start here"):
        train_group(
            str(models[0]), str(models[1]), prompt_records(8), str(tmp_path / "out"), config
        )
