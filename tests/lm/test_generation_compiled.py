"""Compiled generation (--compile-generation): a static KV cache with the decoding step compiled by
torch.compile, through farm-sample's engine (farmkit.lm.generation.generate) and the rollouts
(farmkit.train.policy.sample_rollout). Compiled with torch.compile's eager backend here (the graph
capture, without inductor's minute of code generation on a CPU): greedy decoding gives the eager
path's tokens, and a graph was captured."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from farmkit.lm import generation
from farmkit.lm.generation import DecodingConfig, generate
from farmkit.train import policy as P

PROMPTS = ["Name a colour.", "Write one word about rivers, please, and then stop."]


@pytest.fixture
def tiny(tiny_model_path, monkeypatch):
    monkeypatch.setattr(generation, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path, padding_side="left")
    return model, tokenizer


def _spy(model, monkeypatch) -> list[dict]:
    calls: list[dict] = []
    original = model.generate

    def spy(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(model, "generate", spy)
    return calls


def test_compiled_generation_decodes_what_eager_decodes_through_a_static_cache(tiny, monkeypatch):
    model, tokenizer = tiny
    config = DecodingConfig(temperature=0, max_new_tokens=6, batch_size=2)
    eager = generate(model, tokenizer, PROMPTS, config)
    calls = _spy(model, monkeypatch)
    captured = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = generate(model, tokenizer, PROMPTS, config, compiled=True)
    assert [[s.text for s in row] for row in compiled] == [[s.text for s in row] for row in eager]
    (call,) = calls
    assert call["cache_implementation"] == "static"
    assert call["compile_config"].backend == "eager"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > captured


def test_the_rollouts_sample_through_the_compiled_path_when_asked(tiny, monkeypatch):
    model, tokenizer = tiny
    calls = _spy(model, monkeypatch)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    P.sample_rollout(model, tokenizer, ids, 1.0, 3)
    P.sample_rollout(model, tokenizer, ids, 1.0, 3, compiled=True)
    assert "cache_implementation" not in calls[0]
    assert calls[1]["cache_implementation"] == "static"
    assert calls[1]["compile_config"].backend == "eager"
