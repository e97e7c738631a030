"""Accelerators' peak dense bf16 FLOPs and memory bandwidth, for model FLOPs utilization (MFU) and
the memory-bandwidth bound of decoding. A device not in the table has no figures (None, and why):
nothing is guessed.

Figures from NVIDIA's datasheets (the SXM form factor unless named): the bf16 tensor-core figure
printed "with sparsity" halved to the dense one, memory bandwidth in bytes per second.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    name: str
    bf16_flops: float  # dense bf16 tensor-core FLOPs per second
    memory_bandwidth: float  # bytes per second
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021)"

# (lower-case pattern found in torch.cuda.get_device_name, peak): the first match wins, so the more
# specific names come first
DEVICES: tuple[tuple[str, DevicePeak], ...] = (
    ("h200 nvl", DevicePeak("H200 NVL", 835.5e12, 4.8e12, _H200)),
    ("h200", DevicePeak("H200 SXM", 989.5e12, 4.8e12, _H200)),
    ("h100 nvl", DevicePeak("H100 NVL", 835.5e12, 3.9e12, _H100)),
    ("h100 pcie", DevicePeak("H100 PCIe", 756e12, 2.0e12, _H100)),
    ("h100", DevicePeak("H100 SXM", 989.5e12, 3.35e12, _H100)),
    ("a100-sxm4-80gb", DevicePeak("A100 80GB SXM", 312e12, 2.039e12, _A100)),
    ("a100 80gb pcie", DevicePeak("A100 80GB PCIe", 312e12, 1.935e12, _A100)),
    ("a100", DevicePeak("A100 40GB", 312e12, 1.555e12, _A100)),
    ("l40s", DevicePeak("L40S", 366e12, 0.864e12, "NVIDIA L40S GPU datasheet (2023)")),
    ("l4", DevicePeak("L4", 121e12, 0.3e12, "NVIDIA L4 Tensor Core GPU datasheet (2023)")),
)


def device_peak(
    name: str, table: tuple[tuple[str, DevicePeak], ...] = DEVICES
) -> tuple[DevicePeak | None, str | None]:
    """(the peak figures of the device torch names `name`, None) or (None, why there are none)."""
    if name.lower().startswith("cpu"):
        return None, "no peak figures for the CPU (cores, clocks and vector units vary)"
    for pattern, peak in table:
        if pattern in name.lower():
            return peak, None
    return None, f"{name!r} is not in farmkit.core.devices.DEVICES"


def torch_device_peak(device: str) -> tuple[DevicePeak | None, str | None]:
    """device_peak of a torch device string ("cuda", "cuda:1", "cpu")."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return device_peak(device)
    return device_peak(torch.cuda.get_device_name(torch.device(device)))
