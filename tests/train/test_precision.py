"""--precision (farmkit.train.precision): auto picks bf16 autocast exactly on a CPU whose flags name
native bf16 (faked /proc/cpuinfo here) or from FARMKIT_PRECISION; a bf16 run trains with its loss
falling, keeps float32 weights and records its precision in meta.json; sampling stays unautocast.

The suite itself runs under FARMKIT_PRECISION=fp32 (tests/conftest.py): its exact figures are fp32's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farmkit.core.io import FarmError
from farmkit.train.precision import ENV, cpu_supports_bf16, launch_precision, resolve_precision

FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 avx avx2 avx512f avx512bw"


def cpuinfo(tmp_path: Path, *extra: str) -> str:
    """A /proc/cpuinfo of two processors whose flags are FLAGS plus `extra`."""
    block = "processor\t: {n}\nmodel name\t: Fake CPU\nflags\t\t: {flags}\n\n"
    flags = " ".join([FLAGS, *extra])
    path = tmp_path / f"cpuinfo-{len(extra)}"
    path.write_text("".join(block.format(n=n, flags=flags) for n in range(2)))
    return str(path)


@pytest.fixture
def no_switch(monkeypatch):
    """Neither the suite's FARMKIT_PRECISION pin nor a launcher's settings."""
    for name in (ENV, "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("avx512_bf16",), "bf16"),
        (("amx_bf16", "amx_tile"), "bf16"),
        ((), "no"),
        (("avx512_vnni", "avx512_fp16"), "no"),  # no bf16 among them
    ],
)
def test_auto_picks_bf16_exactly_when_the_cpu_flags_say_so(tmp_path, no_switch, extra, expected):
    info = cpuinfo(tmp_path, *extra)
    assert cpu_supports_bf16(info) == (expected == "bf16")
    assert resolve_precision("auto", on_gpu=False, cpuinfo=info) == expected


def test_an_unreadable_cpuinfo_means_no_bf16(tmp_path, no_switch):
    assert resolve_precision("auto", on_gpu=False, cpuinfo=str(tmp_path / "absent")) == "no"


def test_explicit_choices_and_the_env_switch_win_over_the_flags(tmp_path, no_switch, monkeypatch):
    with_bf16, without = cpuinfo(tmp_path, "avx512_bf16"), cpuinfo(tmp_path)
    assert resolve_precision("fp32", on_gpu=False, cpuinfo=with_bf16) == "no"
    assert resolve_precision("bf16", on_gpu=False, cpuinfo=without) == "bf16"
    monkeypatch.setenv(ENV, "fp32")
    assert resolve_precision("auto", on_gpu=False, cpuinfo=with_bf16) == "no"
    monkeypatch.setenv(ENV, "bf16")
    assert resolve_precision("auto", on_gpu=False, cpuinfo=without) == "bf16"
    assert resolve_precision("fp32", on_gpu=False) == "no"  # the option given beats the env
    monkeypatch.setenv(ENV, "half")
    with pytest.raises(FarmError, match=r"FARMKIT_PRECISION='half': expected one of auto, fp32"):
        resolve_precision("auto", on_gpu=False)


def test_launches_keep_their_own_precision_under_auto(tmp_path, no_switch, monkeypatch):
    monkeypatch.setattr("farmkit.train.precision.CPUINFO", cpuinfo(tmp_path, "avx512_bf16"))
    # the on-policy loop alone on a CPU: the Accelerator is told
    assert launch_precision("auto", on_gpu=False) == {"mixed_precision": "bf16"}
    assert launch_precision("fp32", on_gpu=False) == {"mixed_precision": "no"}
    assert launch_precision("bf16", on_gpu=False) == {"mixed_precision": "bf16"}
    # on a GPU (the policy loads in bf16 itself) or under accelerate launch: the launch decides
    assert launch_precision("auto", on_gpu=True) == {}
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert launch_precision("auto", on_gpu=False) == {}
    assert launch_precision("bf16", on_gpu=False) == {"mixed_precision": "bf16"}
    # DeepSpeed on CPUs stays fp32 unless asked
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert resolve_precision("auto", on_gpu=False) == "no"


# ---------------------------------------------------------------------------------------------
# Training under bf16 autocast, on the tiny model


def _weights_dtypes(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        return {str(weights.get_slice(name).get_dtype()) for name in weights.keys()}  # noqa: SIM118


def test_bf16_sft_trains_with_the_loss_falling_and_float32_weights(tiny_model_path, tmp_path):
    from test_sft import DEMOS, quick

    from farmkit.methods.sft import train_sft

    folder = tmp_path / "sft"
    summary = train_sft(str(tiny_model_path), DEMOS, folder, quick(max_steps=4, precision="bf16"))
    losses = summary["losses"]
    # here: 10.91, 10.63, 10.41, 10.24 (on the embedded model the bf16 and fp32 curves agree step
    # by step to a few hundredths: bench/README.md, "precision")
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.3, losses
    assert _weights_dtypes(folder) == {"F32"}  # the master weights stayed float32
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["launch"]["mixed_precision"] == "bf16"
    assert meta["config"]["precision"] == "bf16"


def test_bf16_reward_model_trains_and_records_it(tiny_model_path, tmp_path):
    from test_reward import train_keyword_rm

    # (the loss falling under bf16 is SFT's test above: here the wiring of farm-rm-train's own loop)
    train_keyword_rm(tiny_model_path, tmp_path / "rm", pairs=40, max_steps=2, precision="bf16")
    assert _weights_dtypes(tmp_path / "rm") == {"F32"}
    meta = json.loads((tmp_path / "rm" / "meta.json").read_text())
    assert meta["launch"]["mixed_precision"] == "bf16"


def test_bf16_dpo_records_it_and_starts_at_log_2(tiny_model_path, tmp_path):
    """farm-dpo (and farm-online-dpo's rounds) under bf16: the policy and its reference autocast
    alike, so the first step's margin is 0 and its loss log 2, as in fp32."""
    import math

    from farmkit.methods.dpo import DPOConfig, train_dpo

    pairs = [
        {"instruction": f"Name colour {n}.", "input": "", "chosen": "Blue.", "rejected": "Red."}
        for n in range(4)
    ]
    config = DPOConfig(max_steps=1, batch_size=4, learning_rate=1e-4, precision="bf16")
    last = train_dpo(str(tiny_model_path), pairs, str(tmp_path / "dpo"), config)
    assert last["loss"] == pytest.approx(math.log(2), rel=1e-4)
    assert _weights_dtypes(tmp_path / "dpo") == {"F32"}
    meta = json.loads((tmp_path / "dpo" / "meta.json").read_text())
    assert meta["launch"]["mixed_precision"] == "bf16"


def test_sampling_is_not_autocast(tiny_model_path):
    """A rollout sampled inside a bf16 autocast context (as the trainers' sampling runs) computes in
    the weights' float32, prefill and decoding alike, and draws the tokens it draws without one."""
    import torch

    from farmkit.lm.models import load_causal_lm
    from farmkit.train import policy as P

    model, tokenizer = load_causal_lm(tiny_model_path)
    computed = []  # the dtype of every forward's logits
    model.lm_head.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
    prompts = [tokenizer("Name a colour.")["input_ids"], tokenizer("Count to three.")["input_ids"]]
    drawn = []
    for autocast in (False, True):
        torch.manual_seed(5)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            drawn.append(P.sample_rollout(model, tokenizer, prompts, 1.0, 8).response_ids)
    assert set(computed) == {torch.float32} and len(computed) >= 2 * 8
    assert torch.equal(drawn[0], drawn[1])
    # the trainers' own forward passes (the update, the reference) still autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.tensor([prompts[0]]))
    assert computed[-1] == torch.bfloat16
