"""n samples per prompt from one prefill (farmkit.lm.generation.prefill_once, the default) against n
prefills (FARMKIT_SHARED_PREFILL=0, transformers' num_return_sequences): the model reads each prompt
once, and the samples are the same draws (bench/bench_prefill.py measures the CPU time saved)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from farmkit.lm.generation import DecodingConfig, generate

PROMPTS = ["Name a colour.", "Tell me, in a few words, something about rivers and the sea."]


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return (
        AutoModelForCausalLM.from_pretrained(tiny_model_path),
        AutoTokenizer.from_pretrained(tiny_model_path),
    )


def sample_reading(model, tokenizer, config, seed=1):
    """The samples, and the (rows, tokens) of every forward pass that read prompt tokens (more than
    one position at a time: the prefills; a decoding step reads one)."""
    reads: list[tuple[int, int]] = []

    def hook(module, args):
        rows, width = args[0].shape
        if width > 1:
            reads.append((rows, width))

    handle = model.get_input_embeddings().register_forward_pre_hook(hook)
    try:
        samples = generate(model, tokenizer, PROMPTS, config, seed=seed)
    finally:
        handle.remove()
    return samples, reads


def test_n_samples_come_from_one_prefill_of_each_prompt(tiny, monkeypatch):
    model, tokenizer = tiny
    n = 4
    config = DecodingConfig(n=n, temperature=1.0, max_new_tokens=6, batch_size=8)
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    width = max(lengths)  # both prompts in one batch, padded on the left to the longer

    monkeypatch.setenv("FARMKIT_SHARED_PREFILL", "0")
    each, each_reads = sample_reading(model, tokenizer, config)
    monkeypatch.delenv("FARMKIT_SHARED_PREFILL")  # the default
    shared, shared_reads = sample_reading(model, tokenizer, config)

    # n prefills: every prompt read n times; one: each prompt read once (but its last token, which
    # the n samples' first decoding step reads)
    assert each_reads == [(n * len(PROMPTS), width)]
    assert shared_reads == [(len(PROMPTS), width - 1)]
    # n samples of each prompt, counted against the prompt's own tokens, and they vary
    assert [len(s) for s in shared] == [n, n]
    assert [[s.prompt_tokens for s in per] for per in shared] == [[m] * n for m in lengths]
    assert all(len({s.text for s in per}) > 1 for per in shared)
    assert all(0 < s.completion_tokens <= 6 for per in shared for s in per)
    # the same seed draws the same random numbers: the same samples both ways
    assert [[s.text for s in per] for per in shared] == [[s.text for s in per] for per in each]
    # and another seed draws others
    other, _ = sample_reading(model, tokenizer, config, seed=2)
    assert [[s.text for s in per] for per in other] != [[s.text for s in per] for per in shared]


def test_one_sample_per_prompt_is_generated_as_before(tiny):
    """n = 1 has nothing to share: generate reads the batch as it always did."""
    model, tokenizer = tiny
    config = DecodingConfig(n=1, temperature=1.0, max_new_tokens=4, batch_size=8)
    samples, reads = sample_reading(model, tokenizer, config)
    width = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS)
    assert reads == [(len(PROMPTS), width)] and [len(s) for s in samples] == [1, 1]


def test_a_group_of_k_copies_of_a_prompt_is_prefilled_once_in_rollouts(tiny, monkeypatch):
    """The group methods (RLOO, GRPO...) and Quark sample k responses of a prompt as k copies side
    by side (policy.sample_rollout): the copies share one prefill, and the rollout is the one that
    k prefills give under the same seed."""
    import torch

    from farmkit.train.policy import sample_rollout

    model, tokenizer = tiny
    k = 3
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    grouped = [prompt for prompt in ids for _ in range(k)]
    width = max(len(p) for p in ids)

    def rollout(shared: bool):
        monkeypatch.setenv("FARMKIT_SHARED_PREFILL", "1" if shared else "0")
        reads: list[tuple[int, int]] = []

        def hook(module, args):
            if args[0].shape[1] > 1:
                reads.append(tuple(args[0].shape))

        handle = model.get_input_embeddings().register_forward_pre_hook(hook)
        try:
            torch.manual_seed(5)
            return sample_rollout(model, tokenizer, grouped, 1.0, 5), reads
        finally:
            handle.remove()

    each, each_reads = rollout(False)
    shared, shared_reads = rollout(True)
    assert each_reads == [(k * len(PROMPTS), width)]
    assert shared_reads == [(len(PROMPTS), width - 1)]
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "finished"):
        assert torch.equal(getattr(shared, name), getattr(each, name)), name
    # the k responses of a prompt vary
    assert all(
        len({tuple(r) for r in shared.response_ids[g * k : (g + 1) * k].tolist()}) > 1
        for g in range(2)
    )
