"""The table of devices' peak bf16 FLOPs and memory bandwidth (farmkit.core.devices): names as torch
reports them find their entry, the most specific pattern first; an unknown device gets None and why."""

from __future__ import annotations

import pytest

from farmkit.core.devices import DEVICES, DevicePeak, device_peak


@pytest.mark.parametrize(
    ("reported", "flops", "bandwidth"),
    [
        ("NVIDIA H100 80GB HBM3", 989.5e12, 3.35e12),
        ("NVIDIA H100 PCIe", 756e12, 2.0e12),
        ("NVIDIA H200", 989.5e12, 4.8e12),
        ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
        ("NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
        ("NVIDIA A100 80GB PCIe", 312e12, 1.935e12),
        ("NVIDIA L4", 121e12, 0.3e12),
    ],
)
def test_a_known_gpu_finds_its_datasheet_figures(reported, flops, bandwidth):
    peak, reason = device_peak(reported)
    assert reason is None
    assert peak.bf16_flops == pytest.approx(flops, rel=1e-3)
    assert peak.memory_bandwidth == pytest.approx(bandwidth, rel=1e-3)
    assert peak.source


def test_an_unknown_device_is_none_with_a_reason():
    assert device_peak("cpu") == (
        None,
        "no peak figures for the CPU (cores, clocks and vector units vary)",
    )
    peak, reason = device_peak("NVIDIA GeForce GTX 1080")
    assert peak is None
    assert reason == "'NVIDIA GeForce GTX 1080' is not in farmkit.core.devices.DEVICES"


def test_the_first_matching_pattern_wins_in_the_table_given():
    loose = DevicePeak("any A100", 1.0, 2.0, "test")
    tight = DevicePeak("A100 80GB", 3.0, 4.0, "test")
    table = (("a100-sxm4-80gb", tight), ("a100", loose))
    assert device_peak("NVIDIA A100-SXM4-80GB", table) == (tight, None)
    assert device_peak("NVIDIA A100-PCIE-40GB", table) == (loose, None)
    # the patterns of the real table are lower case, as the lookup compares them
    assert all(pattern == pattern.lower() for pattern, _ in DEVICES)
