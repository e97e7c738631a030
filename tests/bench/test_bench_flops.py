"""bench/bench_flops.py's arithmetic (not its timings): the FLOPs it counts for a training step, the
parameters that take part in products, the KV cache a token holds (against a tiny model's own
cache), the roofline bound of decoding, the theoretical peak read from /proc/cpuinfo, and the
sampled tokens it counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_flops", ROOT / "bench" / "bench_flops.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )


def test_the_parameters_of_the_products(tiny_config):
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(0)
    tied = LlamaForCausalLM(tiny_config)
    total = sum(p.numel() for p in tied.parameters())
    embedding = tiny_config.vocab_size * tiny_config.hidden_size
    # tied: the one matrix is the head's product, counted once
    assert bench.matmul_parameters(tied) == total
    tiny_config.tie_word_embeddings = False
    untied = LlamaForCausalLM(tiny_config)
    tiny_config.tie_word_embeddings = True
    # untied: the head counts, the input embedding (a lookup) does not
    assert (
        bench.matmul_parameters(untied) == sum(p.numel() for p in untied.parameters()) - embedding
    )
    classifier = LlamaForSequenceClassification(tiny_config)
    assert (
        bench.matmul_parameters(classifier)
        == sum(p.numel() for p in classifier.parameters()) - embedding
    )


def test_a_training_step_is_six_flops_per_parameter_and_token():
    assert bench.training_flops(1000, 50) == 6 * 1000 * 50


def test_the_kv_bytes_of_a_token_are_the_model_cache(tiny_config):
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_config)
    tokens = 7
    with torch.no_grad():
        cache = model(torch.arange(tokens)[None], use_cache=True).past_key_values
    held = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    assert bench.kv_bytes_per_token(tiny_config, 4) * tokens == held


def test_the_decoding_bound():
    # memory-bound: 1 row, weights 1,000 bytes, 10 bytes of KV a token, 100 bytes/s
    # prefill: 2 x 50 x 1 x 4 FLOPs at 1e6 FLOP/s; steps 1 and 2 read 1000 + 10 x (4 + step)
    seconds = bench.decode_bound_seconds([(1, 4, 3)], 50, 1000, 10, 100.0, 1e6)
    assert seconds == pytest.approx(400 / 1e6 + (1050 + 1060) / 100)
    # compute-bound: 1,000 rows at a slow peak; the reads (1,000 + 10 x 1,000 x 5 bytes at 1e9)
    # are far below the products (2 x 50 x 1,000 FLOPs at 1e3 FLOP/s)
    seconds = bench.decode_bound_seconds([(1000, 4, 2)], 50, 1000, 10, 1e9, 1e3)
    assert seconds == pytest.approx(2 * 50 * 1000 * 4 / 1e3 + 2 * 50 * 1000 / 1e3)
    # a call that samples one token is its prefill alone; calls add up
    one = bench.decode_bound_seconds([(2, 3, 1)], 50, 1000, 10, 100.0, 1e6)
    assert one == pytest.approx(2 * 50 * 2 * 3 / 1e6)
    assert bench.decode_bound_seconds([(2, 3, 1), (1, 4, 3)], 50, 1000, 10, 100.0, 1e6) == (
        pytest.approx(one + 400 / 1e6 + (1050 + 1060) / 100)
    )


ZEN4 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC
cpu MHz		: 2596.148
flags		: fpu avx2 avx512f avx512_bf16 avx512_vnni
"""


def test_the_theoretical_peak_of_a_known_core_and_none_for_others():
    peak = bench.theoretical_peak(ZEN4)
    assert peak["core"] == "AMD Zen 4"
    assert peak["fp32"] == pytest.approx(2596.148e6 * 32)
    assert peak["bf16"] == pytest.approx(2596.148e6 * 64)
    assert bench.theoretical_peak(ZEN4.replace("AuthenticAMD", "GenuineIntel")) is None
    assert bench.theoretical_peak(ZEN4.replace(" avx512_bf16", "")) is None
    assert bench.theoretical_peak(ZEN4.replace("model\t\t: 17", "model\t\t: 1")) is None
    assert bench.theoretical_peak("") is None


def test_sampled_tokens_end_at_the_first_end_token():
    import torch

    completions = torch.tensor([[5, 6, 2, 2], [7, 8, 9, 3], [2, 2, 2, 2]])
    assert bench.useful_tokens(completions, eos_id=2) == 3 + 4 + 1
