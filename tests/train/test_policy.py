"""farmkit.train.policy's AdamW: torch's fused kernel where the device has one (the default), the
per-tensor loop with FARMKIT_FUSED_ADAMW=0, the same update either way (bench/bench_optim.py times
them on the embedded model)."""

from __future__ import annotations

import pytest
import torch

from farmkit.train import policy as P


def stepped(fused_env: str | None, monkeypatch) -> tuple[torch.optim.AdamW, list[torch.Tensor]]:
    """Three AdamW steps on fixed gradients from a fixed start, under FARMKIT_FUSED_ADAMW=fused_env."""
    if fused_env is None:
        monkeypatch.delenv("FARMKIT_FUSED_ADAMW", raising=False)
    else:
        monkeypatch.setenv("FARMKIT_FUSED_ADAMW", fused_env)
    draw = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=draw)) for shape in [(64, 32), (32,)]]
    optimizer = P.adamw(params, lr=1e-2, eps=1e-5, weight_decay=0.01)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=draw)
        optimizer.step()
    return optimizer, [p.detach() for p in params]


def test_adamw_is_fused_by_default_and_the_switch_gives_the_same_update(monkeypatch):
    fused, fused_weights = stepped(None, monkeypatch)
    loop, loop_weights = stepped("0", monkeypatch)
    assert fused.defaults["fused"] is True
    assert not loop.defaults["fused"]
    assert not loop.defaults["foreach"]  # torch's CPU default: the single-tensor loop
    for a, b in zip(fused_weights, loop_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    start = torch.randn((64, 32), generator=torch.Generator().manual_seed(0))
    assert (fused_weights[0] - start).abs().max() > 1e-3  # the steps moved the weights


@pytest.mark.parametrize(
    ("device", "env", "expected"),
    [
        ("cpu", None, "adamw_torch_fused"),
        ("cuda:1", None, "adamw_torch_fused"),
        ("mps", None, "adamw_torch"),  # no fused kernel asked for where torch may lack one
        ("cpu", "0", "adamw_torch"),
        ("cpu", "1", "adamw_torch_fused"),
    ],
)
def test_the_trainer_tools_take_the_same_optimizer(device, env, expected, monkeypatch):
    if env is None:
        monkeypatch.delenv("FARMKIT_FUSED_ADAMW", raising=False)
    else:
        monkeypatch.setenv("FARMKIT_FUSED_ADAMW", env)
    assert P.trainer_optim(device) == expected
