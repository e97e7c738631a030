"""Warm-up and step logging in every trainer: the first optimizer step already has a non-zero
learning rate (a 1-step run once trained nothing: warm-up 0.03 of 1 step rounded up to a whole step
whose rate was 0), the warm-up still reaches the full rate and the schedule still ends as before,
and a short run logs every step (a 3-step farm-sft run once logged step 1 alone)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

DEMOS = [
    {"instruction": "Name the colour of a clear daytime sky.", "input": "", "output": "Blue."},
    {"instruction": "Translate the word into French.", "input": "cat", "output": "Chat."},
    {"instruction": "What is three plus four?", "input": "", "output": "Seven."},
    {"instruction": "Give the opposite of the word.", "input": "hot", "output": "Cold."},
]
PREFERENCES = [
    {"instruction": d["instruction"], "input": d["input"], "output_1": d["output"],
     "output_2": "I do not know.", "preference": 1 + i % 2}
    for i, d in enumerate(DEMOS)
]  # fmt: skip


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ---------------------------------------------------------------------------------------------
# The schedule itself


@pytest.mark.parametrize("ratio", [0.0, 0.03, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("total", [1, 2, 3, 10, 34, 100, 1000])
@pytest.mark.parametrize("kind", ["linear", "cosine", "constant_with_warmup", "constant"])
def test_every_step_of_a_schedule_has_a_learning_rate(kind, total, ratio):
    """Step 1 > 0, the warm-up rises to the full rate at its last step, the rest is transformers'
    schedule unchanged (linear and cosine still end near 0, never at 0 before the last step)."""
    from transformers import get_scheduler

    from farmkit.train import schedule

    warmup = schedule.warmup_steps(ratio, total)
    assert warmup == math.ceil(
        round(ratio * total, 9)
    )  # transformers' count, without 0.03 * 100 > 3
    rates = schedule.learning_rates(kind, warmup, total)
    assert len(rates) == total
    assert all(rate > 0 for rate in rates), rates[:5]
    if warmup:
        assert rates[warmup - 1] == pytest.approx(1.0)
        assert rates[:warmup] == sorted(rates[:warmup])
    # after the warm-up: transformers' own factors
    reference = get_scheduler(
        kind,
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
        num_warmup_steps=warmup,
        num_training_steps=total,
    )
    theirs = []
    for _ in range(total):
        theirs.append(reference.get_last_lr()[0])
        reference.optimizer.step()
        reference.step()
    assert rates[warmup:] == pytest.approx(theirs[warmup:])


def test_the_on_policy_schedule_starts_above_zero():
    """PPO, RLOO, GRPO (checkpoints.linear_scheduler) and Quark (rl_common.linear_schedule)."""
    from types import SimpleNamespace

    from farmkit.train import checkpoints, rl_common

    for warmup, steps in [(0, 1), (5, 1), (5, 3), (1, 10)]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        config = SimpleNamespace(warmup_steps=warmup, steps=steps)
        scheduler = checkpoints.linear_scheduler(optimizer, config, 2)
        assert scheduler.get_last_lr()[0] > 0
        assert rl_common.linear_schedule(warmup, steps)(0) > 0


@pytest.mark.parametrize(
    ("configured", "total", "every"),
    [(10, 1, 1), (10, 3, 1), (10, 20, 2), (10, 100, 10), (10, 1000, 10), (1, 1000, 1), (50, 30, 3)],
)
def test_logging_adapts_to_a_short_run(configured, total, every):
    from farmkit.train import schedule

    assert schedule.logging_steps(configured, total) == every


# ---------------------------------------------------------------------------------------------
# The trainers


@pytest.fixture
def first_rates():
    """The learning rate of each optimizer step taken while the test runs (any optimizer)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    rates: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: rates.append(optimizer.param_groups[0]["lr"])
    )
    yield rates
    handle.remove()


def _invoke(command, *args: str) -> None:
    result = CliRunner().invoke(command, [*args, "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_one_sft_step_changes_the_weights(tiny_model_path, tmp_path):
    """farm-sft --max-steps 1 with the default warm-up (0.03) and schedule (cosine) trains."""
    from farmkit.tools.farm_sft import cli

    data = _write(tmp_path / "demos.jsonl", DEMOS)
    _invoke(cli, str(tiny_model_path), str(data), "-o", str(tmp_path / "sft"), "--max-steps", "1")
    before, after = _weights(tiny_model_path), _weights(tmp_path / "sft")
    changed = [name for name, tensor in after.items() if not torch.equal(tensor, before[name])]
    assert changed, "one step of farm-sft left every weight as it was"


@pytest.mark.parametrize("tool", ["farm-sft", "farm-dpo", "farm-rm-train"])
def test_the_first_optimizer_step_of_each_trainer_has_a_learning_rate(
    tool, tiny_model_path, tmp_path, first_rates
):
    """With a warm-up of half the run, step 1 still moves the weights (rate > 0)."""
    import importlib

    command = importlib.import_module(f"farmkit.tools.{tool.replace('-', '_')}").cli
    records = DEMOS if tool == "farm-sft" else PREFERENCES
    data = _write(tmp_path / "data.jsonl", records)
    _invoke(
        command, str(tiny_model_path), str(data), "-o", str(tmp_path / "out"),
        "--max-steps", "4", "--batch-size", "2", "--warmup-ratio", "0.5",
    )  # fmt: skip
    assert len(first_rates) == 4, first_rates
    assert first_rates[0] > 0, first_rates
    assert first_rates[1] == pytest.approx(max(first_rates)), first_rates  # warm-up over 2 steps


@pytest.mark.parametrize("tool", ["farm-sft", "farm-dpo", "farm-rm-train"])
def test_a_three_step_run_logs_every_step(tool, tiny_model_path, tmp_path):
    import importlib

    command = importlib.import_module(f"farmkit.tools.{tool.replace('-', '_')}").cli
    records = DEMOS if tool == "farm-sft" else PREFERENCES
    data = _write(tmp_path / "data.jsonl", records)
    out = tmp_path / "out"
    _invoke(command, str(tiny_model_path), str(data), "-o", str(out), "--max-steps", "3",
            "--batch-size", "2")  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["loss"] is not None for row in rows)
