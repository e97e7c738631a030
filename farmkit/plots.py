"""PNG plots for the tools: bars with intervals, a scatter with the diagonal and labelled points, and
line plots. matplotlib is imported only when a plot is drawn (Agg backend, no display needed);
every function writes its file atomically and returns the path."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from farmkit.io import FarmError, atomic_path


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise FarmError("plots need matplotlib: pip install 'farmkit[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: str | os.PathLike) -> str:
    plt = _pyplot()
    figure.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        figure.savefig(tmp, format="png", dpi=120)
    plt.close(figure)
    return str(path)


def bar_chart(
    path: str | os.PathLike,
    labels: Sequence[str],
    values: Sequence[float | None],
    lows: Sequence[float | None] | None = None,
    highs: Sequence[float | None] | None = None,
    ylabel: str = "",
    title: str = "",
    reference_line: float | None = None,
) -> str:
    """Horizontal bars (first label at the top) with optional interval whiskers [low, high]."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 0.9 + 0.32 * len(labels)))
    positions = list(range(len(labels)))[::-1]
    heights = [v if v is not None else 0.0 for v in values]
    axes.barh(positions, heights, color="#4C72B0")
    if lows is not None and highs is not None:
        errors = [[max(v - lo, 0) if lo is not None and v is not None else 0 for v, lo in zip(heights, lows, strict=True)],
                  [max(hi - v, 0) if hi is not None and v is not None else 0 for v, hi in zip(heights, highs, strict=True)]]
        axes.errorbar(heights, positions, xerr=errors, fmt="none", ecolor="black", capsize=3, linewidth=1)
    if reference_line is not None:
        axes.axvline(reference_line, color="grey", linestyle="--", linewidth=1)
    axes.set_yticks(positions)
    axes.set_yticklabels(labels)
    axes.set_xlabel(ylabel)
    axes.set_title(title)
    return _save(figure, path)


def scatter(
    path: str | os.PathLike,
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str] | None = None,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    diagonal: bool = True,
) -> str:
    """One point per item, each labelled, with the y = x diagonal over the shared range."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 6))
    axes.scatter(x, y, color="#4C72B0", zorder=3)
    for label, xi, yi in zip(labels or [], x, y, strict=False):
        axes.annotate(label, (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7)
    if diagonal and len(x):
        low, high = min(min(x), min(y)), max(max(x), max(y))
        axes.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1, zorder=1)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    return _save(figure, path)


def line_plot(
    path: str | os.PathLike,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    log_x: bool = False,
) -> str:
    """One line with markers per named series of (x values, y values), with a legend."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, (xs, ys) in series.items():
        axes.plot(xs, ys, marker="o", label=name)
    if log_x:
        axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    if len(series) > 1:
        axes.legend()
    return _save(figure, path)
