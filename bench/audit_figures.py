"""Audit of farm-plot's figures (issue 22, "Figures"), on cases the tests do not use: writes the PNGs
into OUT and prints one JSON line per check with what it measured and whether it is fixed.

    python bench/audit_figures.py OUT [--golden /work/golden/before/runs]

Checks: history ticks for runs within minutes and within one day read as times (no bare "15 30 45");
identical series stay visible (each line's colour shows in the axes); the legend stays off a title
that wraps to two lines; curves leave out bookkeeping panels (epoch, elapsed_s, budget counters);
one-point panels have integer step ticks; best-of-n's figure is not titled "Training curves"."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from farmkit.evaluate import plots

BOOKKEEPING = {"epoch", "elapsed_s", "labels_used", "tokens_sampled", "training_tokens", "round"}
drawn: list = []
_save = plots._save


def _keep(figure, path, *args, **kwargs):
    drawn.append(figure)
    return _save(figure, path, *args, **kwargs)


plots._save = _keep


def report(name: str, fixed: bool, **measured) -> bool:
    print(json.dumps({"check": name, "fixed": fixed, **measured}, default=str))
    return fixed


def history_entries(times, models, rate, judges="judge"):
    return [
        {
            "evaluated_at": when.isoformat().replace("+00:00", "Z"),
            "generator": model,
            "reference": "base",
            "annotator": judges,
            "win_rate": rate(i, model),
            "standard_error": 1.5,
        }
        for i, when in enumerate(times)
        for model in models
    ]


def _agg(figure):
    """An Agg canvas drawn with the saved layout (the figure is closed after saving)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas


def tick_texts(axes) -> list[str]:
    return [t.get_text() for t in axes.get_xticklabels() if t.get_text()]


def colour_pixels(figure, axes, colour) -> int:
    """Pixels inside the axes within a small distance of `colour`."""
    from matplotlib.colors import to_rgb

    canvas = _agg(figure)
    image = np.asarray(canvas.buffer_rgba())[:, :, :3].astype(float) / 255
    box = axes.get_window_extent()
    height = image.shape[0]
    crop = image[int(height - box.y1) : int(height - box.y0), int(box.x0) : int(box.x1)]
    return int((np.abs(crop - np.array(to_rgb(colour))).sum(axis=2) < 0.12).sum())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--golden", default="/work/golden/before/runs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []

    # 1. history: one evening's runs, every 20 seconds
    start = datetime(2026, 11, 26, 21, 14, 5, tzinfo=UTC)
    times = [start + timedelta(seconds=20 * i) for i in range(5)]
    plots.win_rate_history(
        out / "history_minutes.png",
        history_entries(times, ["ckpt-a"], lambda i, m: 40 + 3 * i),
    )
    axes = drawn[-1].axes[0]
    labels = tick_texts(axes)
    results.append(
        report(
            "history ticks within minutes read as times",
            all(":" in label for label in labels),
            ticks=labels,
            offset=axes.xaxis.get_offset_text().get_text(),
        )
    )
    # 1b. within one day, hours apart
    times = [datetime(2026, 2, 3, 1, 0, tzinfo=UTC) + timedelta(hours=3 * i) for i in range(6)]
    plots.win_rate_history(
        out / "history_hours.png", history_entries(times, ["x"], lambda i, m: 50 + i)
    )
    axes = drawn[-1].axes[0]
    labels = tick_texts(axes)
    offset = axes.xaxis.get_offset_text().get_text()
    results.append(
        report(
            "history ticks within a day name the day once",
            all(":" in label for label in labels) and "03" in offset,
            ticks=labels,
            offset=offset,
        )
    )

    # 2. three checkpoints with identical win rates, and a judge list that wraps the title
    times = [datetime(2026, 5, 1, 2, 30, tzinfo=UTC) + timedelta(days=i) for i in range(4)]
    judges = ", ".join(f"judge-{name}-with-a-long-name" for name in "abcdef")
    plots.win_rate_history(
        out / "history_identical.png",
        history_entries(times, ["step-100", "step-200", "step-300"], lambda i, m: 55.0 + i, judges),
    )
    figure = drawn[-1]
    axes = figure.axes[0]
    visible = {
        line.get_label(): colour_pixels(figure, axes, line.get_color())
        for line in axes.lines
        if line.get_label().startswith("step-")
    }
    results.append(
        report(
            "identical history lines stay visible",
            bool(visible) and min(visible.values()) > 30,
            pixels_of_each_line=visible,
        )
    )
    renderer = _agg(figure).get_renderer()
    titles = [t for t in (axes.title, figure._suptitle) if t is not None and t.get_text()]
    legends = figure.legends + ([axes.get_legend()] if axes.get_legend() else [])
    overlap = any(
        legend.get_window_extent(renderer).overlaps(title.get_window_extent(renderer))
        for legend in legends
        for title in titles
    )
    lines_of_title = max(t.get_text().count("\n") + 1 for t in titles)
    wrapped = max(len(t._get_wrapped_text().splitlines()) for t in titles)
    results.append(
        report(
            "legend off a two-line title",
            not overlap,
            title_lines=max(lines_of_title, wrapped),
            overlaps=overlap,
        )
    )

    # 3. curves of real runs (the golden PPO, GRPO and RLOO runs), and one-point panels
    from farmkit.core.runs import read_metrics

    golden = Path(args.golden)
    runs = {
        name: read_metrics(golden / name)
        for name in ("ppo", "grpo", "rloo")
        if (golden / name).exists()
    }
    if runs:
        plots.training_curves(out / "curves_golden.png", runs)
        figure = drawn[-1]
        panels = [a for a in figure.axes if a.get_visible()]
        names = [a.get_title() for a in panels]
        results.append(
            report(
                "curves leave out bookkeeping panels",
                not any(name.split(" ")[0] in BOOKKEEPING for name in names),
                panels=len(panels),
                titles=names,
            )
        )
    one = {"rm-a": [{"method": "reward", "step": 7, "loss": 0.6, "accuracy": 0.5}]}
    plots.training_curves(out / "curves_one_point.png", one)
    ticks = sorted({t for a in drawn[-1].axes if a.get_visible() for t in tick_texts(a)})
    results.append(
        report(
            "one-point panels have integer step ticks",
            all(t.lstrip("\u2212-").isdigit() for t in ticks),
            ticks=ticks,
        )
    )

    # 4. a best-of-n sweep (farm-bon --metrics)
    bon = {
        "bon-sweep": [
            {"method": "bon", "step": n, "loss": None, "n": n, "reward": 0.1 * n, "kl": 0.2 * n,
             "response_length": 30 + n, "tokens_sampled": 100 * n, "training_tokens": 0,
             "elapsed_s": 3.0}
            for n in (1, 2, 4, 8, 16)
        ]
    }  # fmt: skip
    plots.training_curves(out / "curves_bon.png", bon)
    title = drawn[-1]._suptitle.get_text() if drawn[-1]._suptitle else ""
    results.append(
        report(
            "best-of-n's figure names best-of-n",
            "best-of-n" in title.lower() and "training curves" not in title.lower(),
            title=title,
        )
    )
    print(json.dumps({"fixed": sum(results), "checks": len(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
