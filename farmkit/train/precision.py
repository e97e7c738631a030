"""The precision a trainer computes in (--precision, env FARMKIT_PRECISION): fp32, or bf16 autocast
over float32 master weights (the weights, the optimizer's state and the loss stay float32; the
matrix products run in bfloat16).

`auto` is bf16 on a GPU that supports it (as before) and on a CPU whose flags say it has bf16
arithmetic (avx512_bf16 or amx_bf16: the products then run at about 2.8 times fp32's rate on an
avx512_bf16 CPU, and a training step of the embedded model takes about 0.6 of its fp32 CPU time,
bench/bench_precision.py), else fp32. Without those flags bf16 is emulated and slower: fp32.

No torch at import: the option's help must stay fast."""

from __future__ import annotations

import os

PRECISIONS = ("auto", "fp32", "bf16")
ENV = "FARMKIT_PRECISION"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = "/proc/cpuinfo"


def cpu_supports_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU's flags (Linux's /proc/cpuinfo) name native bf16 arithmetic."""
    try:
        with open(cpuinfo or CPUINFO, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return any(flag in value.split() for flag in BF16_FLAGS)
    except OSError:
        pass
    return False


def resolve_precision(asked: str, on_gpu: bool, cpuinfo: str | None = None) -> str:
    """accelerate's mixed_precision for --precision `asked`: "bf16" or "no". `auto` takes
    FARMKIT_PRECISION when set, then the device's support (see the module's text)."""
    from farmkit.core.io import FarmError

    if asked == "auto":
        asked = os.environ.get(ENV, "").strip().lower() or "auto"
        if asked not in PRECISIONS:
            raise FarmError(f"{ENV}={asked!r}: expected one of {', '.join(PRECISIONS)}")
    if asked == "fp32":
        return "no"
    if on_gpu:
        import torch

        supported = torch.cuda.is_bf16_supported()
        if asked == "bf16" and not supported:
            raise FarmError("--precision bf16: this GPU does not support bfloat16")
        return "bf16" if supported else "no"
    if asked == "bf16":
        return "bf16"
    # a DeepSpeed launch on CPUs keeps fp32 (its engine runs bf16 only where its config says so)
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return "no"
    return "bf16" if cpu_supports_bf16(cpuinfo) else "no"


def launch_precision(asked: str, on_gpu: bool) -> dict[str, str]:
    """The Accelerator keyword of the on-policy loop and Quark: none where `auto` leaves the choice
    to the launch (a GPU: the policy loads in bf16 itself; `accelerate launch`: its config or
    --mixed_precision, over FARMKIT_PRECISION too), else the mixed precision asked for or found
    (resolve_precision)."""
    if asked == "auto" and (on_gpu or "ACCELERATE_MIXED_PRECISION" in os.environ):
        return {}
    return {"mixed_precision": resolve_precision(asked, on_gpu)}
