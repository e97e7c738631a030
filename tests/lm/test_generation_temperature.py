"""The sampling temperature reaches the model at each place it is used: generation.generate (farm-sample,
best-of-n, expert iteration, online DPO), the RL rollouts (policy.sample_rollout) and the log-probs the
RL methods recompute (policy.response_logits). Measured on the tiny random model, whose logits are
nearly flat: near 0 it decodes its greedy answer every time, at 1 and above almost never."""

from __future__ import annotations

import pytest
import torch

from farmkit.lm.generation import DecodingConfig, generate
from farmkit.lm.models import load_causal_lm
from farmkit.train import policy as P

PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello."]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model, tokenizer = load_causal_lm(tiny_model_path, device="cpu")
    model.eval()
    return model, tokenizer


def greedy_ids(model, tokenizer, prompt: str) -> list[int]:
    """The argmax continuation, computed by hand one token at a time."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] == tokenizer.eos_token_id:
                break
    return out


def texts(tokenizer, ids: list[int]) -> str:
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def sampled(tiny, temperature: float, seed: int = 0) -> list[list[str]]:
    model, tokenizer = tiny
    config = DecodingConfig(n=4, temperature=temperature, max_new_tokens=NEW_TOKENS, batch_size=16)
    return [[s.text for s in row] for row in generate(model, tokenizer, PROMPTS, config, seed=seed)]


def test_generate_follows_the_temperature(tiny):
    """At T=0.01 nearly all 12 samples are the greedy answer (the random model's top logits lie so
    close that one may still differ); at T=1 and T=5 (same seed) almost none is."""
    model, tokenizer = tiny
    greedy = [texts(tokenizer, greedy_ids(model, tokenizer, p)) for p in PROMPTS]
    cold = sampled(tiny, 0.01)
    assert sum(text == g for row, g in zip(cold, greedy, strict=True) for text in row) >= 10
    for temperature in (1.0, 5.0):
        warm = sampled(tiny, temperature)
        same = sum(text == g for row, g in zip(warm, greedy, strict=True) for text in row)
        assert same <= 1, (temperature, same)
        assert len({text for row in warm for text in row}) >= 10


def test_generate_at_temperature_zero_is_greedy(tiny):
    """T=0 decodes greedily: the hand-computed argmax answer, whatever the seed."""
    model, tokenizer = tiny
    greedy = [texts(tokenizer, greedy_ids(model, tokenizer, p)) for p in PROMPTS]
    config = DecodingConfig(n=1, temperature=0.0, max_new_tokens=NEW_TOKENS)
    for seed in (0, 1):
        out = generate(model, tokenizer, PROMPTS, config, seed=seed)
        assert [row[0].text for row in out] == greedy


def test_rollout_sampling_follows_the_temperature(tiny):
    """The RL rollout at T=0.01 is the greedy continuation of every prompt; at T=1 (same seed) it
    is not."""
    model, tokenizer = tiny
    greedy = [greedy_ids(model, tokenizer, p) for p in PROMPTS]

    def rollout(temperature: float) -> list[list[int]]:
        torch.manual_seed(0)
        result = P.sample_rollout(model, tokenizer, PROMPTS, temperature, NEW_TOKENS)
        return [
            row[mask.bool()].tolist()
            for row, mask in zip(result.response_ids, result.response_mask, strict=True)
        ]

    assert rollout(0.01) == greedy
    warm = rollout(1.0)
    assert sum(ids == g for ids, g in zip(warm, greedy, strict=True)) == 0


def test_response_logits_are_divided_by_the_temperature(tiny):
    """The log-probs PPO, GRPO and Quark recompute are those of softmax(logits / T)."""
    model, tokenizer = tiny
    torch.manual_seed(0)
    rollout = P.sample_rollout(model, tokenizer, PROMPTS, 1.0, NEW_TOKENS)
    with torch.no_grad():
        plain = P.response_logits(model, rollout, 1.0)
        tempered = P.response_logits(model, rollout, 0.5)
    assert plain.abs().max() > 0.01
    torch.testing.assert_close(tempered, plain / 0.5)
