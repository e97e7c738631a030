"""The rollout PPO and Quark share: it samples exactly softmax(logits / temperature), whatever the
model's generation_config says, and the log-probabilities the methods recompute are those generate()
sampled from; prompt order, the unfinished penalty and the shared loader (policy and reference in one
precision)."""

from __future__ import annotations

import pytest
import torch
from policy_fixtures import (
    keyword_reward_model,
    pretend_bf16_gpu,
    prompt_records,
    sampled_logprobs,
    spy_generate,
    tiny_sft,
    variant,
)

from farmkit.train import policy as P
from farmkit.train.rollouts import (
    load_policy_and_reference,
    penalize_unfinished,
    prompt_order,
    sample_and_score,
)


@pytest.fixture(scope="module")
def sft(tiny_model_path, tmp_path_factory):
    return tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def fussy_sft(sft, tmp_path_factory):
    """The SFT model with a generation_config that would reshape sampling if it were obeyed."""
    return variant(
        sft,
        tmp_path_factory.mktemp("fussy") / "model",
        generation={"repetition_penalty": 1.3, "top_k": 5, "do_sample": True},
    )


def sample_with_scores(folder, calls, temperature, lora=False):
    from farmkit.lm.models import PromptFormat, load_causal_lm

    model, tokenizer = load_causal_lm(folder, device="cpu", dtype="float32")
    if lora:
        model = P.add_lora(model, 4, 8)
    fmt = PromptFormat.for_model(folder)
    prompts = [fmt.prompt(tokenizer, record["instruction"]) for record in prompt_records(16)]
    torch.manual_seed(0)
    rollout = P.sample_rollout(model, tokenizer, prompts, temperature, 4)
    recomputed = P.token_logprobs(
        P.response_logits(model, rollout, temperature), rollout.response_ids
    )
    return rollout, recomputed, sampled_logprobs(calls[-1])


@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_recomputed_logprobs_are_what_generate_sampled_from(
    sft, fussy_sft, monkeypatch, temperature
):
    calls = spy_generate(monkeypatch)
    for folder in (sft, fussy_sft):
        rollout, recomputed, generated = sample_with_scores(folder, calls, temperature)
        mask = rollout.response_mask.bool()
        assert mask.sum() > 16
        assert torch.allclose(recomputed[mask], generated[mask], atol=1e-4), folder


def test_a_lora_policy_samples_the_same_distribution(fussy_sft, monkeypatch):
    calls = spy_generate(monkeypatch)
    rollout, recomputed, generated = sample_with_scores(fussy_sft, calls, 0.7, lora=True)
    mask = rollout.response_mask.bool()
    assert torch.allclose(recomputed[mask], generated[mask], atol=1e-4)


def test_the_models_generation_config_is_left_as_it_was(fussy_sft, monkeypatch):
    from farmkit.lm.models import load_causal_lm

    model, tokenizer = load_causal_lm(fussy_sft, device="cpu")
    P.sample_rollout(model, tokenizer, ["Hello"], 0.7, 2)
    assert model.generation_config.repetition_penalty == 1.3 and model.generation_config.top_k == 5


def test_reference_loads_in_the_policys_precision(sft, tmp_path, monkeypatch):
    bf16 = variant(sft, tmp_path / "bf16", config={"torch_dtype": "bfloat16", "dtype": "bfloat16"})
    pretend_bf16_gpu(monkeypatch)
    for folder in (sft, bf16):
        policy, reference, _ = load_policy_and_reference(folder, "cpu")
        assert policy.dtype == reference.dtype == torch.float32
        assert all(
            torch.equal(a, b)
            for a, b in zip(policy.parameters(), reference.parameters(), strict=True)
        )
        assert not any(p.requires_grad for p in reference.parameters())


def test_prompt_order_is_seeded_and_covers_every_prompt_per_pass():
    order = prompt_order(5, 12, seed=3)
    assert order == prompt_order(5, 12, seed=3) and order != prompt_order(5, 12, seed=4)
    assert len(order) >= 12 and sorted(order[:5]) == sorted(order[5:10]) == list(range(5))


def test_unfinished_answers_are_penalized_only_when_asked():
    rewards, finished = torch.tensor([0.5, 2.0, -0.3]), torch.tensor([True, False, False])
    assert torch.equal(penalize_unfinished(rewards, finished, "truncate", -1.0), rewards)
    assert torch.equal(
        penalize_unfinished(rewards, finished, "penalty", -1.0), torch.tensor([0.5, -1.0, -1.0])
    )


def test_sample_and_score_pairs_each_response_with_its_prompt(sft, tiny_model_path, tmp_path):
    from farmkit.lm.models import PromptFormat, load_causal_lm
    from farmkit.train.scoring import RewardScorer

    rm = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    model, tokenizer = load_causal_lm(sft, device="cpu", dtype="float32")
    records = prompt_records(8)
    prompts = [PromptFormat("chat").prompt(tokenizer, record["instruction"]) for record in records]
    scorer = RewardScorer(rm, device="cpu")
    batch = sample_and_score(
        model,
        tokenizer,
        scorer,
        records,
        prompts,
        [3, 1, 3],
        temperature=1.0,
        max_new_tokens=4,
        unfinished="penalty",
        unfinished_penalty=-7.0,
        seed=11,
    )
    again = sample_and_score(
        model,
        tokenizer,
        scorer,
        records,
        prompts,
        [3, 1, 3],
        temperature=1.0,
        max_new_tokens=4,
        unfinished="penalty",
        unfinished_penalty=-7.0,
        seed=11,
    )
    assert batch.texts == again.texts and batch.prompt_indices == [3, 1, 3]
    items = [
        (records[i]["instruction"], "", text)
        for i, text in zip([3, 1, 3], batch.texts, strict=True)
    ]
    expected = scorer.score(items, finished=batch.rollout.finished.tolist())
    assert batch.rewards.tolist() == pytest.approx(expected, abs=1e-5)
    assert torch.equal(
        batch.scores, penalize_unfinished(batch.rewards, batch.rollout.finished, "penalty", -7.0)
    )


class SpyScorer:
    """A RewardScorer that records the finished flags it is given."""

    def __init__(self, scorer):
        self.scorer, self.calls = scorer, []

    def score(self, items, progress=None, finished=None):
        self.calls.append(None if finished is None else list(finished))
        return self.scorer.score(items, progress, finished)


@pytest.mark.parametrize("unfinished", ["truncate", "penalty"])
def test_the_reward_model_is_told_which_answers_were_cut_off(
    sft, tiny_model_path, tmp_path, unfinished
):
    """A cut-off answer is scored without an end-of-sequence token (what --unfinished truncate relies
    on): the rollout's finished flags must reach the scorer, in both unfinished modes."""
    from farmkit.lm.models import PromptFormat, load_causal_lm
    from farmkit.train.scoring import RewardScorer

    rm = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    model, tokenizer = load_causal_lm(sft, device="cpu", dtype="float32")
    records = prompt_records(8)
    prompts = [PromptFormat("chat").prompt(tokenizer, record["instruction"]) for record in records]
    spy = SpyScorer(RewardScorer(rm, device="cpu"))
    batch = sample_and_score(
        model,
        tokenizer,
        spy,
        records,
        prompts,
        list(range(8)),
        temperature=1.0,
        max_new_tokens=3,
        unfinished=unfinished,
        unfinished_penalty=-7.0,
        seed=5,
    )
    flags = batch.rollout.finished.tolist()
    assert spy.calls == [flags] and not all(flags)  # 3 tokens leave some answers unfinished
    items = [(records[i]["instruction"], "", text) for i, text in enumerate(batch.texts)]
    assert batch.rewards.tolist() == pytest.approx(
        spy.scorer.score(items, finished=flags), abs=1e-5
    )
