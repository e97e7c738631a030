"""farm-plot's figures read as a person expects (issue 22, "Figures"): a history of one day's runs has
times on its ticks, identical lines stay visible, the legend keeps off a title that wraps, curves
leave out bookkeeping panels and show whole steps, and a best-of-n sweep is titled as one. Each test
inspects the matplotlib objects of the figure written (the `figures` fixture keeps them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from farmkit.tools import farm_plot


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _history(path: Path, times, models, rate, annotator="judge") -> Path:
    return _jsonl(
        path,
        [
            {
                "evaluated_at": when.isoformat().replace("+00:00", "Z"),
                "generator": model,
                "reference": "ref",
                "annotator": annotator,
                "win_rate": rate(i, model),
                "standard_error": 2.0,
            }
            for i, when in enumerate(times)
            for model in models
        ],
    )


def _plot(*args: str) -> None:
    result = CliRunner().invoke(farm_plot.cli, list(args))
    assert result.exit_code == 0, result.output


def _drawn(figure):
    """A canvas with the figure drawn as saved (the figure is closed once written)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas


def _pixels_of(canvas, axes, colour) -> int:
    from matplotlib.colors import to_rgb

    image = np.asarray(canvas.buffer_rgba())[:, :, :3].astype(float) / 255
    box = axes.get_window_extent()
    top = image.shape[0]
    crop = image[int(top - box.y1) : int(top - box.y0), int(box.x0) : int(box.x1)]
    return int((np.abs(crop - np.array(to_rgb(colour))).sum(axis=2) < 0.12).sum())


# ---------------------------------------------------------------------------------------------
# farm-plot history


@pytest.mark.parametrize(
    ("step", "count", "offset"),
    [
        (timedelta(seconds=15), 6, "2026-Nov-26"),  # the audit's "15 30 45 05:28"
        (timedelta(minutes=7), 6, "2026-Nov-26"),
        (timedelta(hours=2), 5, "2026-Nov-26"),
    ],
)
def test_history_ticks_of_one_day_are_times_with_the_date_once(
    step, count, offset, tmp_path, figures
):
    start = datetime(2026, 11, 26, 5, 27, 40, tzinfo=UTC)
    path = _history(
        tmp_path / "h.jsonl", [start + step * i for i in range(count)], ["A"], lambda i, m: 40 + i
    )
    _plot("history", str(path), "-o", str(tmp_path / "h.png"))
    (figure,) = figures
    _drawn(figure)
    (axes,) = figure.axes
    labels = [t.get_text() for t in axes.get_xticklabels() if t.get_text()]
    assert len(labels) >= 2
    assert all(":" in label for label in labels), labels  # 05:28:00, 05:35 or 06:00: times
    if step < timedelta(minutes=1):
        assert all(label.count(":") == 2 for label in labels), labels
    assert axes.xaxis.get_offset_text().get_text() == offset


def test_identical_history_lines_stay_visible(tmp_path, figures):
    """Three checkpoints with the same win rates: each line's colour still shows in the axes."""
    times = [datetime(2026, 4, 2, 2, 30, tzinfo=UTC) + timedelta(days=d) for d in range(5)]
    models = ["ckpt-1", "ckpt-2", "ckpt-3"]
    path = _history(tmp_path / "h.jsonl", times, models, lambda i, m: 48.0 + 2 * i)
    _plot("history", str(path), "-o", str(tmp_path / "h.png"))
    (figure,) = figures
    canvas = _drawn(figure)
    (axes,) = figure.axes
    lines = [line for line in axes.lines if line.get_label() in models]
    assert len(lines) == 3
    assert len({line.get_marker() for line in lines}) == 3
    assert len({str(line.get_linestyle()) for line in lines}) == 3
    seen = {line.get_label(): _pixels_of(canvas, axes, line.get_color()) for line in lines}
    assert min(seen.values()) > 100, seen


def test_the_legend_keeps_off_a_title_that_wraps(tmp_path, figures):
    judges = ", ".join(f"a-judge-with-a-rather-long-name-{k}" for k in range(5))
    times = [datetime(2026, 6, 1, tzinfo=UTC) + timedelta(days=d) for d in range(3)]
    path = _history(
        tmp_path / "h.jsonl", times, ["policy-a", "policy-b"], lambda i, m: 50 + i, judges
    )
    _plot("history", str(path), "-o", str(tmp_path / "h.png"))
    (figure,) = figures
    renderer = _drawn(figure).get_renderer()
    title = figure._suptitle
    assert judges in title.get_text().replace("\n", " ")
    assert len(title._get_wrapped_text().splitlines()) >= 2  # the case that once went wrong
    title_box = title.get_window_extent(renderer)
    (legend,) = figure.legends
    (axes,) = figure.axes
    assert not legend.get_window_extent(renderer).overlaps(title_box)
    assert not legend.get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))
    assert title_box.y1 <= figure.bbox.y1 + 1 and title_box.x0 >= -1  # whole, inside the figure


# ---------------------------------------------------------------------------------------------
# farm-plot curves


def _run(tmp_path: Path, name: str, rows: list[dict]) -> str:
    (tmp_path / name).mkdir()
    _jsonl(tmp_path / name / "metrics.jsonl", rows)
    return str(tmp_path / name)


def test_curves_leave_out_bookkeeping_panels(tmp_path, figures):
    rows = [
        {"method": "sft", "step": s, "loss": 2.0 / s, "learning_rate": 1e-5, "grad_norm": 1.0 + s,
         "epoch": s / 4, "elapsed_s": 1.5 * s, "num_tokens": 100 * s, "labels_used": None,
         "tokens_sampled": 0, "training_tokens": 90 * s, "round": 1}
        for s in range(1, 5)
    ]  # fmt: skip
    run = _run(tmp_path, "sft", rows)
    _plot("curves", run, "-o", str(tmp_path / "c.png"))
    _plot("curves", run, "--field", "epoch", "--field", "loss", "-o", str(tmp_path / "e.png"))
    default, named = figures
    titles = [a.get_title() for a in default.axes if a.get_visible()]
    assert titles == ["loss", "learning_rate", "grad_norm"]
    assert [a.get_title() for a in named.axes if a.get_visible()] == ["epoch", "loss"]


def test_curves_keep_identical_runs_visible_and_share_identical_fields(tmp_path, figures):
    """Two runs with the same learning rate both show; PPO's reward and score, equal in every row,
    are one panel named after both."""
    runs = [
        _run(tmp_path, name, [
            {"method": "ppo", "step": s, "loss": s * k, "reward": 0.1 * s * k,
             "score": 0.1 * s * k, "learning_rate": 1e-5 * (1 - s / 10)}
            for s in range(1, 6)
        ])
        for name, k in (("ppo-a", 1), ("ppo-b", 2))
    ]  # fmt: skip
    _plot("curves", *runs, "-o", str(tmp_path / "c.png"))
    (figure,) = figures
    canvas = _drawn(figure)
    panels = {a.get_title(): a for a in figure.axes if a.get_visible()}
    assert sorted(panels) == ["learning_rate", "loss", "reward = score"]
    rate = panels["learning_rate"]
    assert [list(line.get_ydata()) for line in rate.lines][0] == list(rate.lines[1].get_ydata())
    for line in rate.lines:
        assert _pixels_of(canvas, rate, line.get_color()) > 50, line.get_label()


def test_a_one_point_panel_has_whole_step_ticks(tmp_path, figures):
    run = _run(tmp_path, "rm", [{"method": "reward", "step": 3, "loss": 0.7, "accuracy": 0.5}])
    _plot("curves", run, "-o", str(tmp_path / "c.png"))
    (figure,) = figures
    _drawn(figure)
    for axes in (a for a in figure.axes if a.get_visible()):
        low, high = axes.get_xlim()
        shown = [t for t in axes.get_xticks() if low <= t <= high]
        assert shown == [3.0], (axes.get_title(), shown)
        labels = [t.get_text() for t in axes.get_xticklabels() if t.get_text()]
        assert "3" in labels and all(label.isdigit() for label in labels), labels


@pytest.mark.parametrize(
    ("method", "title", "xlabel"),
    [
        ("bon", "best-of-n sweep: sweep", "n"),
        ("ppo", "PPO training curves: sweep", "step"),
        ("reward", "reward model training curves: sweep", "step"),
    ],
)
def test_the_curves_title_names_the_method(method, title, xlabel, tmp_path, figures):
    rows = [
        {"method": method, "step": n, "loss": None if method == "bon" else 1.0 / n, "n": n,
         "reward": 0.1 * n, "kl": 0.05 * n, "tokens_sampled": 40 * n, "elapsed_s": 2.0}
        for n in (1, 2, 4, 8)
    ]  # fmt: skip
    _plot("curves", _run(tmp_path, "sweep", rows), "-o", str(tmp_path / "c.png"))
    (figure,) = figures
    assert figure.get_suptitle() == title
    assert "Training curves" not in figure.get_suptitle()
    panels = [a for a in figure.axes if a.get_visible()]
    assert {a.get_xlabel() for a in panels} == {xlabel}
    assert "n" not in [a.get_title() for a in panels]  # step is n already
