"""The one on-policy trainer (farmkit.train.onpolicy) and its registered estimators and losses:
the registry holds what each method uses, importance weights reach the loss, and a rollout engine
with weights of its own (here a spy that samples from its own copy of the policy, so it needs the
same pushes vLLM needs) gets the policy's weights before every rollout after the first: the
trainer's recomputed log-probabilities then equal the engine's, and metrics.jsonl says so. The
vLLM engine itself is tested in tests/lm/test_sampling_vllm.py (`make test-vllm`)."""

from __future__ import annotations

import json

import pytest
import torch
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft

from farmkit.core.io import FarmError
from farmkit.methods.group import GRPOConfig, RLOOConfig, train_group
from farmkit.methods.ppo import PPOConfig, train_ppo
from farmkit.train import estimators as E
from farmkit.train import rollout_backends as RB

SMALL = dict(
    rollout_batch_size=16,
    minibatch_size=8,
    micro_batch_size=4,
    ppo_epochs=2,
    learning_rate=2e-3,
    temperature=1.0,
    max_new_tokens=4,
    checkpoint_every=0,
)


def test_the_registry_holds_every_methods_estimator_and_loss():
    assert set(E.ADVANTAGE_ESTIMATORS) == {"gae", "rloo", "grpo", "dr_grpo"}
    assert set(E.POLICY_LOSSES) == {
        "token-mean",
        "sequence-ratio",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
        "dapo",
        "bnpo",
        "gspo",
        "cispo",
        "sapo",
        "luspo",
        "vespo",
    }
    # each method's defaults are what it ran before it chose them by name
    chosen = {
        "ppo": PPOConfig(),
        "rloo": RLOOConfig(),
        "grpo": GRPOConfig(),
        "dr-grpo": GRPOConfig(dr_grpo=True),
    }
    assert {name: (c.advantage_estimator, c.policy_loss) for name, c in chosen.items()} == {
        "ppo": ("gae", "token-mean"),
        "rloo": ("rloo", "sequence-ratio"),
        "grpo": ("grpo", "seq-mean-token-mean"),
        "dr-grpo": ("dr_grpo", "seq-mean-token-sum-norm"),
    }
    # --dr-grpo changes the defaults only: a name given wins
    given = GRPOConfig(dr_grpo=True, advantage_estimator="rloo", policy_loss="sequence-ratio")
    assert (given.advantage_estimator, given.policy_loss) == ("rloo", "sequence-ratio")
    with pytest.raises(ValueError, match="unknown policy loss"):
        E.policy_loss("token-sum")
    scores = torch.tensor([1.0, 2.0, 4.0, 4.0])
    assert torch.allclose(
        E.advantage_estimator("dr_grpo")(scores, 2), torch.tensor([-0.5, 0.5, 0, 0])
    )


PER_TOKEN = "per-token advantages from a value model (farm-ppo)"
PER_RESPONSE = "one advantage per response from its group of k samples (farm-rloo, farm-grpo)"
GROUP_LOSSES = (
    "sequence-ratio, seq-mean-token-mean, seq-mean-token-sum-norm, dapo, bnpo, gspo, cispo, "
    "sapo, luspo, vespo"
)


@pytest.mark.parametrize(
    ("tool", "option", "message"),
    [
        (
            "farm_grpo",
            "--advantage-estimator gae",
            f"--advantage-estimator gae is for {PER_TOKEN}; farm-grpo takes rloo, grpo, dr_grpo",
        ),
        (
            "farm_rloo",
            "--policy-loss token-mean",
            f"--policy-loss token-mean is for {PER_TOKEN}; farm-rloo takes {GROUP_LOSSES}",
        ),
        (
            "farm_ppo",
            "--advantage-estimator rloo",
            f"--advantage-estimator rloo is for {PER_RESPONSE}; farm-ppo takes gae",
        ),
        (
            "farm_ppo",
            "--policy-loss seq-mean-token-mean",
            f"--policy-loss seq-mean-token-mean is for {PER_RESPONSE}; farm-ppo takes token-mean",
        ),
    ],
)
def test_an_estimator_or_loss_of_another_kind_is_a_usage_error_before_any_work(
    tool, option, message, tmp_path
):
    """Every registered name is a choice of every on-policy tool; one whose kind of advantages
    the tool's method does not make is refused before anything is loaded, naming the tools it is
    for and what this one takes."""
    import importlib

    from click.testing import CliRunner
    from policy_fixtures import write_jsonl

    cli = importlib.import_module(f"farmkit.tools.{tool}").cli
    params = {param.name: param for param in cli.params}
    assert tuple(params["advantage_estimator"].type.choices) == tuple(E.ADVANTAGE_ESTIMATORS)
    assert tuple(params["policy_loss"].type.choices) == tuple(E.POLICY_LOSSES)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(2))
    output = tmp_path / "out"
    args = ["no-sft/", "no-rm/", str(prompts), "-o", str(output), *option.split()]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output.endswith(f"Error: {message}\n")
    assert not output.exists()


@pytest.mark.parametrize("name", sorted(E.POLICY_LOSSES))
def test_importance_weights_scale_each_terms_share_of_the_loss(name):
    """Weights of 1 change nothing; a weight of 0 on a row removes that row's gradient."""
    torch.manual_seed(0)
    logprobs = torch.randn(4, 5, requires_grad=True)
    old = logprobs.detach() + 0.05 * torch.randn(4, 5)
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    loss = E.policy_loss(name)  # what it declares says what it takes
    advantages = torch.randn(4) if loss.kind == E.RESPONSE else torch.randn(4, 5)
    kwargs = dict(tokens=mask.sum(), responses=4, norm=5)
    plain, _ = loss(logprobs, old, advantages, mask, 0.2, **kwargs)
    ones = torch.ones(4) if loss.per_response_weights else torch.ones(4, 5)
    same, _ = loss(logprobs, old, advantages, mask, 0.2, weights=ones, **kwargs)
    assert torch.allclose(plain, same)
    dropped = ones.clone()
    dropped[2] = 0
    weighted, _ = loss(logprobs, old, advantages, mask, 0.2, weights=dropped, **kwargs)
    (gradient,) = torch.autograd.grad(weighted, logprobs)
    assert torch.all(gradient[2] == 0)
    assert gradient[0].abs().sum() > 0


def test_truncated_importance_weights_are_capped_ratios():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.0]])
    engine = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -3.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weights, _ = RB.rollout_correction(trainer, engine, mask, "token-truncate", cap=2.0)
    expected = torch.tensor([[0.5, -1.0, 0.0], [1.9, 0.0, 0.0]]).exp().clamp(max=2.0) * mask
    assert torch.allclose(weights, expected)
    sequence, _ = RB.rollout_correction(trainer, engine, mask, "sequence-truncate", cap=2.0)
    assert torch.allclose(sequence, torch.tensor([0.5 - 1.0, 1.9]).exp().clamp(max=2.0))
    figures = RB.logprob_mismatch(engine, trainer, mask)
    assert figures["max"] == pytest.approx(1.9)
    assert figures["mean"] == pytest.approx((0.5 + 1.0 + 0 + 1.9 + 0) / 5)


def test_vllm_asked_for_without_vllm_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(RB, "vllm_installed", lambda: False)
    with pytest.raises(FarmError, match="needs vLLM"):
        train_ppo(
            "no-such-sft",
            "no-such-rm",
            prompt_records(4),
            str(tmp_path / "out"),
            PPOConfig(steps=1, rollout_backend="vllm", **SMALL),
        )
    assert RB.resolve_backend("auto") == "hf"
    assert not (tmp_path / "out").exists()


class SpyEngine:
    """A rollout engine with weights of its own, as vLLM has: a copy of the SFT model that samples
    with transformers and reports its log-probabilities of the sampled tokens (plus `offset`, a
    fixed per-position mismatch). Only `sync` brings the policy's weights in."""

    name = "spy"

    def __init__(
        self, sft: str, offset: float = 0.0, push: bool = True, says_kept: bool = True
    ) -> None:
        from farmkit.lm.models import load_causal_lm

        self.model, _ = load_causal_lm(sft, device="cpu", dtype="float32")
        self.offset, self.push, self.syncs = offset, push, 0
        self.says_kept = says_kept  # False: it does not record what top-k/top-p kept (as vllm)

    def sync(self, policy) -> None:
        self.syncs += 1
        if self.push:
            self.model.load_state_dict(policy.state_dict())

    def sample(
        self,
        policy,
        tokenizer,
        prompts,
        *,
        temperature,
        max_new_tokens,
        seed,
        suppress=(),
        top_p=1.0,
        top_k=0,
    ):
        """Its log-probabilities are those of the distribution it sampled from: with top-k/top-p,
        over the tokens the truncation kept (vLLM's processed log-probabilities)."""
        from farmkit.train import policy as P

        torch.manual_seed(seed % 2**63)
        rollout = P.sample_rollout(
            self.model,
            tokenizer,
            prompts,
            temperature,
            max_new_tokens,
            suppress,
            top_p=top_p,
            top_k=top_k,
        )
        if not self.says_kept:
            rollout.kept = None
        with torch.no_grad():
            logits = P.response_logits(self.model, rollout, temperature)
            if P.truncates(top_p, top_k):
                kept = P.truncation_mask(logits, top_p, top_k)
                logits = logits.masked_fill(~kept, float("-inf"))
            logprobs = P.token_logprobs(logits, rollout.response_ids)
        width = rollout.response_mask.shape[1]
        shift = self.offset * torch.linspace(-1, 1, width)  # differs by position
        return rollout, (logprobs + shift) * rollout.response_mask

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    return (
        tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")),
    )


def run_with(engine, monkeypatch, train, output, config, models):
    sft, rm = models
    monkeypatch.setattr(RB, "make_backend", lambda *args, **kwargs: engine)
    train(str(sft), str(rm), prompt_records(16), str(output), config)
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["ppo", "grpo"])
def test_the_engine_gets_the_policys_weights_before_every_rollout(
    models, tmp_path, monkeypatch, method
):
    """The engine's log-probabilities equal the trainer's at every step (fp32, same function): the
    weights it samples with are the policy's after the previous step's updates. Without the push
    the two part from step 2 on, which the metrics show."""
    train, config = (
        (train_ppo, PPOConfig(steps=3, kl_coef=0.05, **SMALL))
        if method == "ppo"
        else (train_group, GRPOConfig(steps=3, **SMALL))
    )
    engine = SpyEngine(str(models[0]))
    rows = run_with(engine, monkeypatch, train, tmp_path / "pushed", config, models)
    assert engine.syncs == 2  # before steps 2 and 3; step 1 samples the SFT weights it loaded
    for row in rows:
        assert row["rollout_logprob_diff_max"] < 1e-4, row
    stale = SpyEngine(str(models[0]), push=False)
    rows = run_with(stale, monkeypatch, train, tmp_path / "stale", config, models)
    assert rows[0]["rollout_logprob_diff_max"] < 1e-4
    assert min(row["rollout_logprob_diff_mean"] for row in rows[1:]) > 1e-3


def test_truncated_importance_sampling_reweights_the_updates(models, tmp_path, monkeypatch):
    """A known mismatch is measured as it is; the cap turns the correction on, which changes what
    the policy learns, and off (0) it changes nothing."""
    from safetensors.torch import load_file

    config = dict(steps=2, kl_coef=0.05, **SMALL)
    runs = {}
    for name, offset, cap in (("exact", 0.0, 0.0), ("off", 0.3, 0.0), ("on", 0.3, 2.0)):
        engine = SpyEngine(str(models[0]), offset=offset)
        rows = run_with(
            engine,
            monkeypatch,
            train_ppo,
            tmp_path / name,
            PPOConfig(importance_sampling_cap=cap, **config),
            models,
        )
        runs[name] = load_file(tmp_path / name / "model.safetensors")
        if offset:
            assert rows[0]["rollout_logprob_diff_max"] == pytest.approx(offset, abs=1e-4)
    names = sorted(runs["exact"])
    assert all(torch.equal(runs["exact"][k], runs["off"][k]) for k in names)
    assert any(not torch.allclose(runs["exact"][k], runs["on"][k], atol=1e-6) for k in names)


@pytest.mark.parametrize(
    "says_kept",
    # the recorded counts' replay is checked without training in test_rollout_backends.py
    [pytest.param(True, marks=pytest.mark.slow), False],
    ids=["recorded", "recomputed"],
)
def test_top_p_top_k_rollouts_are_scored_over_the_tokens_the_sampler_kept(
    models, tmp_path, monkeypatch, says_kept
):
    """An engine that samples with --top-p 0.9 --top-k 3 reports the log-probabilities of the
    truncated distribution it sampled from; the trainer's, with the same weights, are the same
    (metrics.jsonl's rollout_logprob_diff_max): it renormalises over each token's kept set,
    recorded by the sampler (as the hf backend does) or, where the engine does not say (vllm), by
    the same rule on the policy's logits before the update. Over the whole vocabulary they would
    differ by the log of the kept mass (about 0.3 where the tiny policy names one of its four
    colours, top-k keeping three)."""
    small = {**SMALL, "rollout_batch_size": 4, "minibatch_size": 4, "micro_batch_size": 4}
    config = GRPOConfig(steps=1, top_p=0.9, top_k=3, **{**small, "ppo_epochs": 1})
    engine = SpyEngine(str(models[0]), says_kept=says_kept)
    (row,) = run_with(engine, monkeypatch, train_group, tmp_path / "run", config, models)
    assert row["rollout_logprob_diff_max"] < 1e-4, row


@pytest.mark.parametrize("method", ["ppo", "rloo", "grpo", "grpo-one-update"])
def test_the_kl_is_exactly_zero_before_any_update_under_bf16_mixed_precision(
    models, tmp_path, monkeypatch, fresh_accelerate_state, method
):
    """Under `accelerate launch --mixed_precision bf16` the policy's forward runs under autocast; the
    reference's and the sampling's must too, or the KL before the first update is not 0 (it was
    3.6e-4 for PPO and 7e-7 for GRPO's k3 in the GPU check's dry run)."""
    sft, rm = models
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    small = {**SMALL, "rollout_batch_size": 8, "minibatch_size": 8, "micro_batch_size": 8}
    train, config = {
        "ppo": (train_ppo, PPOConfig(steps=1, kl_estimator="k1", **small)),
        "rloo": (train_group, RLOOConfig(steps=1, **small)),
        "grpo": (train_group, GRPOConfig(steps=1, kl_estimator="k1", kl_in="reward", **small)),
        # one epoch of one minibatch: the old log-probabilities come from the update's forward
        "grpo-one-update": (
            train_group,
            GRPOConfig(steps=1, kl_estimator="k1", **{**small, "ppo_epochs": 1}),
        ),
    }[method]
    output = tmp_path / method
    train(str(sft), str(rm), prompt_records(8), str(output), config)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["launch"]["mixed_precision"] == "bf16"
    row = json.loads((output / "metrics.jsonl").read_text().splitlines()[0])
    assert row["kl"] == 0.0


def test_each_step_logs_its_time_tokens_per_second_and_mfu_where_the_peak_is_known(
    models, tmp_path, monkeypatch
):
    """On the CPU no peak is known: no mfu. With a device peak (a fake table entry) the row's mfu is
    metrics.StepWork's FLOPs (2N per token of each forward pass: generation, the prompts' prefill,
    the reference's and the old policy's log-probabilities; 6N per token trained) over the step's
    time x the peak."""
    from farmkit.core.devices import DevicePeak
    from farmkit.lm.models import load_causal_lm
    from farmkit.train import onpolicy

    sft, rm = models
    small = {**SMALL, "rollout_batch_size": 8, "minibatch_size": 8, "micro_batch_size": 8}
    config = GRPOConfig(steps=2, **small)
    train_group(str(sft), str(rm), prompt_records(8), str(tmp_path / "cpu"), config)
    rows = [
        json.loads(line) for line in (tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all("mfu" not in row for row in rows)
    sampled = [rows[0]["tokens_sampled"], rows[1]["tokens_sampled"] - rows[0]["tokens_sampled"]]
    for row, tokens in zip(rows, sampled, strict=True):
        assert 0 < row["step_s"] <= row["elapsed_s"] + 0.01  # elapsed_s is rounded to 0.01 s
        assert row["tokens_per_s"] == pytest.approx(tokens / row["step_s"], rel=0.01)

    peak = DevicePeak("fake", bf16_flops=1e9, memory_bandwidth=1e9, source="test")
    monkeypatch.setattr(onpolicy, "torch_device_peak", lambda device: (peak, None))
    config = GRPOConfig(steps=1, **small)
    train_group(str(sft), str(rm), prompt_records(8), str(tmp_path / "peak"), config)
    row = json.loads((tmp_path / "peak" / "metrics.jsonl").read_text().splitlines()[0])
    parameters = sum(p.numel() for p in load_causal_lm(str(sft), device="cpu")[0].parameters())
    response = row["tokens_sampled"]
    prompt = row["training_tokens"] / config.ppo_epochs - response
    flops = (
        2 * parameters * (response + prompt + 2 * (prompt + response))
        + 6 * parameters * (prompt + response) * config.ppo_epochs
    )
    assert row["mfu"] == pytest.approx(flops / (row["step_s"] * 1e9), rel=0.02)


def test_one_update_per_step_takes_the_old_logprobs_from_the_updates_forward(
    models, tmp_path, monkeypatch
):
    """With one epoch of one minibatch and advantages that do not read the old log-probabilities
    (GRPO, KL in the loss), the no-gradient policy pass before the update is redundant: its
    log-probabilities equal the update's own forward's. Skipping it saves one policy forward per
    micro-batch and changes neither the weights nor the figures."""
    from safetensors.torch import load_file

    from farmkit.methods.group import GroupMethod
    from farmkit.train import policy as P

    sft, rm = models
    calls = {"n": 0}
    forward = P.PolicyOnly.forward

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(P.PolicyOnly, "forward", counting)
    small = {**SMALL, "rollout_batch_size": 8, "minibatch_size": 8, "ppo_epochs": 1}
    config = GRPOConfig(steps=2, kl_coef=0.1, **small)  # micro-batches of 4: 2 per step
    runs = {}
    for name, pass_of_their_own in (("one-update", False), ("own-pass", True)):
        monkeypatch.setattr(
            GroupMethod, "advantages_use_old_logprobs", lambda self, flag=pass_of_their_own: flag
        )
        calls["n"] = 0
        output = tmp_path / name
        train_group(str(sft), str(rm), prompt_records(8), str(output), config)
        rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (calls["n"], load_file(output / "model.safetensors"), rows)
    (fused_calls, fused, fused_rows), (own_calls, own, own_rows) = (
        runs["one-update"],
        runs["own-pass"],
    )
    assert own_calls - fused_calls == 2 * 2  # 2 steps x 2 micro-batches
    assert any(not torch.equal(own[k], load_file(sft / "model.safetensors")[k]) for k in own)
    for key in own:
        assert torch.allclose(fused[key], own[key], atol=1e-6), key
    for a, b in zip(fused_rows, own_rows, strict=True):
        for figure in ("reward", "kl", "entropy", "policy_loss", "clip_fraction"):
            assert a[figure] == pytest.approx(b[figure], rel=1e-4, abs=1e-7), figure
    assert fused_rows[1]["kl"] != 0.0  # step 2's KL is measured, not left at its stand-in


# one minibatch of 8 rows, one pass: the new trainer tests' shape (a few seconds a run)
TINY = {
    **SMALL,
    "rollout_batch_size": 8,
    "minibatch_size": 8,
    "micro_batch_size": 8,
    "ppo_epochs": 1,
}


class RaisedEngine(SpyEngine):
    """The spy engine with every sampled token's log-probability `raise_by` above the trainer's."""

    def __init__(self, sft: str, raise_by: float) -> None:
        super().__init__(sft)
        self.raise_by = raise_by

    def sample(self, policy, tokenizer, prompts, **kwargs):
        rollout, logprobs = super().sample(policy, tokenizer, prompts, **kwargs)
        return rollout, logprobs + self.raise_by * rollout.response_mask


def test_rollout_correction_masks_what_the_perturbed_engine_puts_beyond_the_cap(
    models, tmp_path, monkeypatch
):
    """A perturbed engine (log-probabilities shifted by up to 0.3 per position): token-mask with a
    cap of 1.2 leaves some tokens out of the loss (their gradient is 0:
    test_estimators_trl.py's mask modes), and the KL between engine and trainer is measured. The
    off-policy mask drops the negative-advantage responses of an engine 0.5 nats above the
    trainer on every token."""
    config = dict(steps=1, kl_coef=0.0, **TINY)
    (row,) = run_with(
        SpyEngine(str(models[0]), offset=0.3),
        monkeypatch,
        train_group,
        tmp_path / "masked",
        GRPOConfig(importance_sampling_cap=1.2, rollout_correction="token-mask", **config),
        models,
    )
    assert 0 < row["rollout_masked_fraction"] < 1
    assert row["rollout_kl"] > 0 and row["policy_loss"] != 0
    (row,) = run_with(
        RaisedEngine(str(models[0]), raise_by=0.5),
        monkeypatch,
        train_group,
        tmp_path / "off-policy",
        GRPOConfig(off_policy_mask_threshold=0.3, **config),
        models,
    )
    assert row["rollout_kl"] > 0 and "rollout_masked_fraction" not in row  # no cap: no correction
    assert 0 < row["off_policy_masked_fraction"] < 1


def test_dynamic_sampling_replaces_groups_without_signal(models, tmp_path, monkeypatch):
    """A reward model that scores every answer alike: every group has equal scores, so every
    group is dropped and each extra draw (bounded) finds none either; the batch is then filled
    with dropped groups and trains on nothing (zero advantages). With the keyword reward model
    (scores of 0 or 1, some groups all alike), the dropped groups are replaced by drawn ones."""
    from farmkit.train import rollouts

    config = GRPOConfig(steps=1, kl_coef=0.0, dynamic_sampling=True, max_extra_draws=2, **TINY)
    sft, rm = models
    original = rollouts.sample_and_score

    def flat(*args, **kwargs):
        scored = original(*args, **kwargs)
        scored.scores = torch.zeros_like(scored.scores)
        return scored

    draws = []
    monkeypatch.setattr(
        rollouts, "sample_and_score", lambda *a, **k: draws.append(1) or flat(*a, **k)
    )
    train_group(str(sft), str(rm), prompt_records(16), str(tmp_path / "flat"), config)
    (row,) = [
        json.loads(line) for line in (tmp_path / "flat" / "metrics.jsonl").read_text().splitlines()
    ]
    assert (row["extra_draws"], len(draws)) == (2, 3)
    assert row["dropped_groups"] == 3 * 8 / 4  # 2 groups per draw, all dropped
    assert row["advantage_abs"] == 0.0
    assert row["tokens_sampled"] > row["response_length"] * 8  # the extra draws were paid for
    monkeypatch.setattr(rollouts, "sample_and_score", original)
    train_group(str(sft), str(rm), prompt_records(16), str(tmp_path / "signal"), config)
    (row,) = [
        json.loads(line)
        for line in (tmp_path / "signal" / "metrics.jsonl").read_text().splitlines()
    ]
    # groups without signal were drawn again, and the batch trained on has none left
    assert row["dropped_groups"] > 0 and row["extra_draws"] >= 1
    assert row["zero_std_group_fraction"] == 0.0


def test_dynamic_sampling_keeps_the_informative_groups_of_extra_draws(tmp_path):
    """The join of kept groups from batches of different widths is the batch sample_rollout would
    have built: prompts padded on the left, responses on the right, rows in order."""
    from farmkit.train import policy as P
    from farmkit.train.rollouts import ScoredRollout, join

    def scored(prompts, responses, scores):
        rollout = P.Rollout(
            torch.tensor(prompts),
            torch.ones(len(prompts), len(prompts[0]), dtype=torch.long),
            torch.tensor(responses),
            torch.ones(len(responses), len(responses[0])),
            torch.tensor([True] * len(responses)),
        )
        n = len(prompts)
        return ScoredRollout(
            rollout, list(range(n)), ["x"] * n, torch.tensor(scores), torch.tensor(scores)
        )

    a = scored([[5, 6]], [[7]], [1.0])
    b = scored([[8]], [[9, 10]], [2.0])
    joined = join([a, b.rows([0])], pad_token_id=0)
    assert joined.rollout.prompt_ids.tolist() == [[5, 6], [0, 8]]
    assert joined.rollout.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert joined.rollout.response_ids.tolist() == [[7, 0], [9, 10]]
    assert joined.rollout.response_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert joined.scores.tolist() == [1.0, 2.0]


def test_overlong_penalty_lowers_the_score_and_the_filter_leaves_cut_answers_out(
    models, tmp_path, monkeypatch, caplog
):
    """Answers of at most 2 tokens: --overlong penalty (cache 1) takes 1 from the score of each
    answer of 2 tokens (its length, the end token included), nothing from those of 1; --overlong
    filter leaves the cut answers out of the loss, of the token count that divides it and of the KL
    term (TRL's mask_truncated_completions): their rows of the loss's mask are empty. The filter's
    run also asks for --importance-sampling-cap, which the hf backend has nothing to correct with:
    one warning, and the update's forward still gives the old log-probabilities (one policy pass
    per micro-batch, as without the cap)."""
    from farmkit.methods.group import GroupMethod
    from farmkit.train import policy as P

    sft, rm = models
    seen, calls = [], {"n": 0}
    loss, forward = GroupMethod.loss, P.PolicyOnly.forward

    def spy(self, micro, prepared):
        seen.append((micro.mask.clone(), micro.weights, float(micro.tokens)))
        return loss(self, micro, prepared)

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GroupMethod, "loss", spy)
    monkeypatch.setattr(P.PolicyOnly, "forward", counting)
    small = {**TINY, "max_new_tokens": 2, "kl_coef": 0.1, "kl_in": "loss"}
    rows, passes = {}, {}
    for overlong, cap in (("penalty", 0.0), ("filter", 2.0)):
        seen.clear()
        calls["n"] = 0
        config = GRPOConfig(
            steps=1, overlong=overlong, overlong_cache=1, importance_sampling_cap=cap, **small
        )
        train_group(str(sft), str(rm), prompt_records(8), str(tmp_path / overlong), config)
        (rows[overlong],) = [
            json.loads(line)
            for line in (tmp_path / overlong / "metrics.jsonl").read_text().splitlines()
        ]
        passes[overlong] = calls["n"]
    penalty, filtered = rows["penalty"], rows["filter"]
    long_share = penalty["response_length"] - 1  # the share of answers of 2 tokens
    assert 0 < long_share < 1
    # the score is the reward model's (--unfinished truncate) less the penalty
    assert penalty["score"] == pytest.approx(penalty["reward"] - long_share)
    # each row once (one pass): the cut ones have no tokens in the loss, nor in its count
    (mask, weights, tokens), cut = seen[0], round(filtered["unfinished_fraction"] * 8)
    assert len(seen) == 1 and mask.shape[0] == 8 and 0 < cut < 8
    assert int((mask.sum(dim=1) == 0).sum()) == cut and weights is None
    assert tokens == float(mask.sum()) < filtered["response_length"] * 8
    warnings = [r for r in caplog.records if "--importance-sampling-cap" in r.getMessage()]
    assert len(warnings) == 1 and "hf" in warnings[0].getMessage()
    assert passes["filter"] == passes["penalty"]  # the single pass kept


def assert_same_update(result: dict) -> None:
    assert set(result["max_abs_diff"]) == set(E.POLICY_LOSSES)
    for name, difference in result["max_abs_diff"].items():
        moved = result["moved"][name]
        assert moved > 1e-4  # something to compare
        # float32 sums in another order: 1e-5 of the step, where a process's own count moves it
        # 8e-2 to 1e-1 of it (token-mean, dapo, cispo)
        assert difference < 1e-5 * moved, (name, result)


def test_two_processes_share_of_a_minibatch_update_each_loss_as_one_process():
    """The same minibatch (8 responses, 16 tokens on one process and 19 on the other, micro-batches
    of 2), split between two stand-in processes (threads whose counts are reduced between them, the
    gradients averaged as DDP does) and whole in one: every registered loss, its KL term (--kl-in
    loss) and PPO's value loss move their weights alike, because the token and response counts
    that divide them are the minibatch's over every process (tests/train/gradient_parity.py; under
    torchrun: the next test; under ZeRO-2: test_launch_deepspeed.py)."""
    import gradient_parity

    assert_same_update(gradient_parity.in_threads(2))


@pytest.mark.slow
def test_two_processes_update_each_loss_as_one_process_does(tmp_path):
    """The check above with two real processes: torchrun, DDP over gloo."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "parity.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    script = Path(__file__).with_name("gradient_parity.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*command, "--nproc_per_node", "2", str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["processes"] == 2
    assert_same_update(result)
