"""One metrics.jsonl schema for every trainer (schemas/metrics.json, farmkit.train.metrics): the writer,
and the files two trainers (farm-sft and farm-rm-train, on the tiny model) leave, which farm-plot
curves draws side by side."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from farmkit.core.runs import METRICS_FILE
from farmkit.core.validate import problems
from farmkit.train.metrics import MetricsWriter, from_trainer_log, metrics_row


def _lines(path) -> list[dict]:
    # a strict parser: NaN or Infinity in a line would be an error here
    return [
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} written"))
        for line in path.read_text().splitlines()
    ]


def test_a_row_has_method_step_and_loss_first_and_only_finite_numbers():
    row = metrics_row("ppo", 3, float("nan"), kl=math.inf, reward=0.5, quantiles=[1.0, -math.inf])
    assert list(row)[:3] == ["method", "step", "loss"]
    assert row == {
        "method": "ppo",
        "step": 3,
        "loss": None,
        "kl": None,
        "reward": 0.5,
        "quantiles": [1.0, None],
    }
    assert problems(row, "metrics") is None
    with pytest.raises(ValueError, match="field 'step' is 1.5; expected an integer"):
        metrics_row("dpo", 1.5, 0.1)
    with pytest.raises(ValueError, match="field 'loss' is \"low\"; expected a number or null"):
        metrics_row("dpo", 1, "low")
    with pytest.raises(ValueError, match="field 'accuracy' is 2; expected a number or null"):
        metrics_row("reward", 1, 0.1, accuracy=2)
    assert "missing field 'loss'" in problems({"method": "sft", "step": 1}, "metrics")


def test_the_writer_flushes_each_row_fills_elapsed_time_and_appends_on_resume(tmp_path):
    path = tmp_path / "run" / METRICS_FILE
    with MetricsWriter(path, "reward") as writer:
        first = writer.write(1, 0.7, accuracy=0.5)
        assert _lines(path) == [first]  # on disk before the run ends
        writer.write(step=2, loss=0.6, accuracy=0.75, elapsed_s=9.5)
    rows = _lines(path)
    assert [row["step"] for row in rows] == [1, 2] and rows[1]["elapsed_s"] == 9.5
    assert rows[0]["elapsed_s"] >= 0 and rows[0]["method"] == "reward"
    with MetricsWriter(path, "reward", append=True) as writer:
        writer.write(3, 0.5)
    assert [row["step"] for row in _lines(path)] == [1, 2, 3]
    with MetricsWriter(path, "reward") as writer:  # a fresh run starts the file over
        writer.write(1, 0.9)
    assert [row["step"] for row in _lines(path)] == [1]
    silent = MetricsWriter(tmp_path / "other" / METRICS_FILE, "ppo", enabled=False)
    assert silent.write(1, None)["method"] == "ppo"
    silent.close()
    assert not (tmp_path / "other").exists()  # a rank other than the main one writes nothing


def test_trainer_logs_become_rows_without_the_final_summary():
    log_history = [
        {"loss": 2.0, "grad_norm": 1.5, "learning_rate": 1e-3, "epoch": 0.5, "step": 1},
        {"loss": 1.0, "rewards/margins": 0.3, "epoch": 1.0, "step": 2},
        {"train_runtime": 3.2, "train_loss": 1.5, "epoch": 1.0, "step": 2},
    ]
    rows = from_trainer_log("dpo", log_history, step_offset=10, round=2)
    assert [(r["step"], r["loss"], r["round"]) for r in rows] == [(11, 2.0, 2), (12, 1.0, 2)]
    assert rows[1]["rewards/margins"] == 0.3 and rows[0]["method"] == "dpo"


def test_sft_and_reward_model_runs_write_the_schema_and_farm_plot_draws_both(
    tiny_model_path, tmp_path, figures
):
    from farmkit.tools import farm_plot

    from farmkit.core.records import comparisons
    from farmkit.methods.reward import RewardConfig, train_reward_model
    from farmkit.methods.sft import SFTConfig, train_sft

    demos = [
        {"instruction": f"Name colour number {i}.", "input": "", "output": "Blue."}
        for i in range(8)
    ]
    sft = tmp_path / "sft"
    train_sft(
        str(tiny_model_path),
        demos,
        sft,
        SFTConfig(max_steps=3, batch_size=4, logging_steps=1, warmup_ratio=0.0, max_length=64),
    )
    prefs = [
        {
            "instruction": f"Say thanks number {i}.",
            "input": "",
            "output_1": "thanks" if i % 2 else "no",
            "output_2": "no" if i % 2 else "thanks",
            "preference": 1 if i % 2 else 2,
        }
        for i in range(16)
    ]
    items, _ = comparisons(prefs)
    rm = tmp_path / "rm"
    train_reward_model(
        str(tiny_model_path), items, rm, RewardConfig(max_steps=2, batch_size=8, eval_fraction=0)
    )
    for folder, method, steps in ((sft, "sft", [1, 2, 3]), (rm, "reward", [1, 2])):
        rows = _lines(folder / METRICS_FILE)
        assert [row["step"] for row in rows] == steps
        for row in rows:
            assert problems(row, "metrics") is None, row
            assert row["method"] == method and isinstance(row["loss"], float)
            assert isinstance(row["learning_rate"], float)
    assert all(0 <= row["accuracy"] <= 1 for row in _lines(rm / METRICS_FILE))

    result = CliRunner().invoke(
        farm_plot.cli, ["curves", str(sft), str(rm), "-o", str(tmp_path / "curves.png")]
    )
    assert result.exit_code == 0, result.output
    (figure,) = figures
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    assert {line.get_label() for line in panels["loss"].lines} == {"sft", "rm"}
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_step_throughput_counts_2n_per_forward_token_and_6n_per_trained_token():
    from farmkit.core.devices import DevicePeak
    from farmkit.train.metrics import StepWork, step_throughput

    work = StepWork(parameters=1000, generated=50, forward=100, trained=40)
    assert work.flops() == 2 * 1000 * (50 + 100) + 6 * 1000 * 40
    peak = DevicePeak("fake", bf16_flops=1e6, memory_bandwidth=1e9, source="test")
    figures = step_throughput(work, seconds=2.0, peak=peak, processes=2)
    assert figures == {
        "step_s": 2.0,
        "tokens_per_s": 25.0,
        "mfu": pytest.approx(work.flops() / (2.0 * 1e6 * 2)),
    }
    # no known peak (the CPU): no mfu
    assert step_throughput(work, seconds=2.0, peak=None, processes=1) == {
        "step_s": 2.0,
        "tokens_per_s": 25.0,
    }
    assert problems(metrics_row("grpo", 1, 0.0, **figures), "metrics") is None
