"""PNG plots for the tools: leaderboard bars with intervals, a labelled scatter of two leaderboards,
a model's win rate over time, training curves and the reward over-optimization figure. matplotlib is
imported only when a plot is drawn (Agg backend, no display needed); every function writes its file
atomically and returns the path."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from farmkit.core.fields import help_field
from farmkit.core.io import FarmError, atomic_path

DPI = 120


def named_values(values: Sequence[str]) -> dict[str, str]:
    """RM=VALUE texts (farm-plot overopt --ppo-run, --label) by RM."""
    pairs = {}
    for value in values:
        name, separator, text = value.partition("=")
        if not separator or not name:
            raise ValueError(f"{value!r}: expected RM=VALUE")
        pairs[name] = text
    return pairs


# farm-plot's subcommands' settings (their options; -o is the shared figure output)


@dataclass
class HistoryPlot:
    generators: tuple[str, ...] = help_field(
        (),
        "Draw this model only (repeatable). Default: all.",
        flags=("--generator",),
        multiple=True,
        metavar="NAME",
        show_default=False,
    )
    length_controlled: bool = help_field(
        False,
        "Draw the length-controlled win rate instead of the raw one.",
        flag=True,
        show_default=False,
    )


@dataclass
class CurvesPlot:
    fields: tuple[str, ...] = help_field(
        (),
        "Draw only this metric (repeatable). Default: every numeric one but bookkeeping "
        "(epoch, elapsed_s, round, n, num_tokens, labels_used, tokens_sampled, training_tokens).",
        flags=("--field",),
        multiple=True,
        metavar="NAME",
        show_default=False,
    )
    x: str = help_field(
        "step",
        "The metric on the horizontal axis: e.g. gold_kl or reward with --field gold_win_rate "
        "(over-optimization from any run with --gold), tokens_sampled or labels_used (budget).",
        metavar="NAME",
    )


@dataclass
class OveroptPlot:
    scored: tuple[str, ...] = help_field(
        (),
        "A reward model's scores of the whole best-of-n sampling pass (repeatable): adds its agreement with gold.",
        multiple=True,
        path={"dir_okay": False},
        metavar="FILE",
        show_default=False,
    )
    ppo_runs: dict[str, str] = help_field(
        (),
        "The PPO run against reward model RM (its metrics.jsonl gives each checkpoint's KL). Repeatable.",
        flags=("--ppo-run",),
        multiple=True,
        parse=named_values,
        metavar="RM=DIR",
        show_default=False,
    )
    labels: dict[str, str] = help_field(
        (),
        "Panel title of a reward model.",
        flags=("--label",),
        multiple=True,
        parse=named_values,
        metavar="RM=TEXT",
        show_default=False,
    )


LABEL_CHARACTERS = (
    36  # longer bar labels are shortened in the middle, so that they cannot squeeze the bars
)
SCATTER_ALL = 25  # a scatter with up to this many points labels every point
SCATTER_LABELS = (
    15  # above it, only this many: the extremes and the largest departures from the trend
)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise FarmError("plots need matplotlib: pip install 'farmkit[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: str | os.PathLike, layout: bool = True) -> str:
    plt = _pyplot()
    if layout:
        figure.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        figure.savefig(tmp, format="png", dpi=DPI)
    plt.close(figure)
    return str(path)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1)))


def line_styles(count: int) -> list[dict[str, Any]]:
    """Plot keywords for `count` lines that share an axes, so that lines with identical values stay
    visible: each later line is drawn narrower and with a smaller marker of another shape on top of
    the earlier ones, with its own dash pattern (the earlier line shows as a border around it)."""
    if count <= 1:
        return [{"marker": "o", "markersize": 5, "linewidth": 1.5, "linestyle": "-"}]
    styles = []
    for index in range(count):
        wider = min(4, count - 1 - index)  # how many narrower lines may lie on top of this one
        styles.append(
            {
                "marker": MARKERS[index % len(MARKERS)],
                "markersize": 4.0 + 1.0 * wider,
                "linewidth": 1.2 + 0.5 * wider,
                "linestyle": DASHES[index % len(DASHES)],
                "zorder": 2 + index / 100,
            }
        )
    return styles


def shorten(label: str, width: int = LABEL_CHARACTERS) -> str:
    """`label`, or its start and end around an ellipsis when it is longer than `width` characters."""
    if len(label) <= width:
        return label
    head = (width - 1) // 2
    return f"{label[:head]}\u2026{label[len(label) - (width - 1 - head) :]}"


@dataclass
class Bars:
    """One panel of a leaderboard: a value per label (None: not available) and its interval."""

    name: str
    values: Sequence[float | None]
    lows: Sequence[float | None] | None = None
    highs: Sequence[float | None] | None = None


def leaderboard(
    path: str | os.PathLike,
    labels: Sequence[str],
    panels: Sequence[Bars],
    title: str = "",
    reference_line: float | None = None,
    limits: tuple[float, float] = (0.0, 100.0),
    groups: Sequence[str] | None = None,
) -> str:
    """Horizontal bars (first label at the top), one panel per figure side by side on a common axis,
    with interval whiskers [low, high]. A value of 0 still shows as a sliver; a missing one says n/a.
    groups: a heading per label (consecutive equal ones form a group): each group gets its heading in
    bold above its rows and a line between groups, so that labels need not repeat it."""
    plt = _pyplot()
    shown = [shorten(label) for label in labels]
    # each group's heading takes a row of its own, above the group's rows
    slots: list[int] = []  # the row (top = 0) of each label
    headings: list[tuple[int, str]] = []  # (row, heading)
    for i in range(len(labels)):
        if groups is not None and (i == 0 or groups[i] != groups[i - 1]):
            headings.append((len(slots) + len(headings), shorten(str(groups[i]))))
        slots.append(len(slots) + len(headings))
    rows = len(slots) + len(headings)
    label_inches = 0.6 + 0.075 * max(
        (len(label) for label in [*shown, *(h for _, h in headings)]), default=0
    )
    figure, axes = plt.subplots(
        1,
        len(panels),
        sharex=True,
        sharey=True,
        squeeze=False,
        dpi=DPI,
        layout="constrained",
        figsize=(label_inches + 4.2 * len(panels), 1.3 + 0.3 * rows),
    )
    low = min([limits[0], *(v for p in panels for v in (p.lows or ()) if v is not None)])
    high = max([limits[1], *(v for p in panels for v in (p.highs or ()) if v is not None)])
    sliver = (high - low) * 0.004
    positions = [rows - 1 - slot for slot in slots]
    for panel, bars in zip(axes[0], panels, strict=True):
        drawn = [i for i, value in enumerate(bars.values) if value is not None]
        panel.barh(
            [positions[i] for i in drawn],
            [max(bars.values[i] - low, sliver) for i in drawn],
            left=low,
            color="#4C72B0",
            edgecolor="#2B4A7E",
            linewidth=0.5,
        )
        for i, value in enumerate(bars.values):
            if value is None:
                panel.text(
                    low + sliver, positions[i], " n/a", va="center", fontsize=8, color="grey"
                )
        if bars.lows is not None and bars.highs is not None:
            whiskers = [i for i in drawn if bars.lows[i] is not None and bars.highs[i] is not None]
            centers = [bars.values[i] for i in whiskers]
            errors = [
                [max(c - bars.lows[i], 0) for c, i in zip(centers, whiskers, strict=True)],
                [max(bars.highs[i] - c, 0) for c, i in zip(centers, whiskers, strict=True)],
            ]
            panel.errorbar(
                centers,
                [positions[i] for i in whiskers],
                xerr=errors,
                fmt="none",
                ecolor="black",
                capsize=3,
                linewidth=1,
            )
        if reference_line is not None:
            panel.axvline(reference_line, color="grey", linestyle="--", linewidth=1)
        panel.set_xlim(low, high)
        panel.set_title(bars.name, fontsize=10)
        panel.grid(axis="x", color="#dddddd", linewidth=0.5)
        panel.set_axisbelow(True)
        for row, _ in headings[1:]:  # a line above each group after the first
            panel.axhline(rows - 0.5 - row, color="#555555", linewidth=0.8)
    ticks = sorted(
        [(position, label, False) for position, label in zip(positions, shown, strict=True)]
        + [(rows - 1 - row, heading, True) for row, heading in headings],
        reverse=True,
    )
    axes[0][0].set_yticks([tick[0] for tick in ticks])
    axes[0][0].set_yticklabels([tick[1] for tick in ticks])
    for text, (_, _, heading) in zip(axes[0][0].get_yticklabels(), ticks, strict=True):
        if heading:
            text.set_fontweight("bold")
    for panel in axes[0]:
        for tick, (_, _, heading) in zip(panel.yaxis.get_major_ticks(), ticks, strict=True):
            if heading:
                tick.tick1line.set_visible(False)
    axes[0][0].set_ylim(-0.7, rows - 0.3)
    if title:
        figure.suptitle(title, fontsize=11, wrap=True)
    return _save(figure, path, layout=False)


def comparable_scales(x: Sequence[float], y: Sequence[float]) -> bool:
    """Whether two scores share a scale, so that y = x means something: their ranges overlap over at
    least half of the range they span together."""
    if not x or not y:
        return False
    overlap = min(max(x), max(y)) - max(min(x), min(y))
    union = max(max(x), max(y)) - min(min(x), min(y))
    return union == 0 or overlap >= 0.5 * union


def _errors(
    values: Sequence[float], intervals: Sequence[tuple[float, float] | None] | None
) -> list[list[float]] | None:
    if intervals is None or all(interval is None for interval in intervals):
        return None
    return [
        [
            0.0 if iv is None else max(v - iv[0], 0.0)
            for v, iv in zip(values, intervals, strict=True)
        ],
        [
            0.0 if iv is None else max(iv[1] - v, 0.0)
            for v, iv in zip(values, intervals, strict=True)
        ],
    ]


def scatter(
    path: str | os.PathLike,
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str] | None = None,
    x_intervals: Sequence[tuple[float, float] | None] | None = None,
    y_intervals: Sequence[tuple[float, float] | None] | None = None,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    diagonal: bool | None = None,
    max_labels: int | None = None,
) -> str:
    """One point per item with its intervals; the y = x diagonal when asked for, by default only when
    both scores share a scale. Labels: every point up to SCATTER_ALL points, else the SCATTER_LABELS
    most telling ones (`max_labels` sets the number; see `telling_points`), each placed inside the axes
    where it overlaps no other label, no point and no leader line (a label with no such place is left
    out)."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7.5, 6.5), dpi=DPI)
    xerr, yerr = _errors(x, x_intervals), _errors(y, y_intervals)
    if xerr or yerr:
        axes.errorbar(
            x,
            y,
            xerr=xerr,
            yerr=yerr,
            fmt="none",
            ecolor="#9AA9C6",
            elinewidth=1,
            capsize=2,
            zorder=2,
        )
    axes.scatter(x, y, color="#4C72B0", s=18, zorder=3)
    if (comparable_scales(x, y) if diagonal is None else diagonal) and len(x):
        low, high = min(min(x), min(y)), max(max(x), max(y))
        axes.plot(
            [low, high],
            [low, high],
            color="grey",
            linestyle="--",
            linewidth=1,
            zorder=1,
            label="y = x",
        )
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.margins(0.12)
    figure.tight_layout()
    if labels:
        chosen = telling_points(x, y, max_labels)
        place_labels(figure, axes, x, y, [labels[i] for i in chosen], chosen)
    return _save(figure, path, layout=False)


def telling_points(x: Sequence[float], y: Sequence[float], count: int | None = None) -> list[int]:
    """The indices of the points worth a label, most telling first: all of them when there are at most
    `count` (default: SCATTER_ALL, else SCATTER_LABELS are kept), else the highest and lowest on each
    axis, then the largest residuals from the least-squares line of y on x."""
    n = len(x)
    if count is None:
        count = n if n <= SCATTER_ALL else SCATTER_LABELS
    if count >= n:
        return list(range(n))
    mean_x, mean_y = sum(x) / n, sum(y) / n
    spread = sum((v - mean_x) ** 2 for v in x)
    slope = (
        sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y, strict=True)) / spread
        if spread
        else 0.0
    )
    residual = [abs(b - mean_y - slope * (a - mean_x)) for a, b in zip(x, y, strict=True)]
    order = [
        pick(range(n), key=values.__getitem__) for values in (x, y) for pick in (max, min)
    ] + sorted(range(n), key=lambda i: -residual[i])
    return list(dict.fromkeys(order))[:count]


# a label moved this far (points) from its point or farther gets a leader line to it
LEADER_AT = 8


def _offsets() -> list[tuple[float, float, str, str]]:
    """Candidate label positions around a point (offset in points, alignment), nearest first."""
    directions = [
        (1, 1, "left", "bottom"),
        (1, -1, "left", "top"),
        (-1, 1, "right", "bottom"),
        (-1, -1, "right", "top"),
        (0, 1, "center", "bottom"),
        (0, -1, "center", "top"),
        (1, 0, "left", "center"),
        (-1, 0, "right", "center"),
    ]
    return [
        (dx * radius, dy * radius, ha, va)
        for radius in (3, 8, 14, 22, 32, 44, 60)
        for dx, dy, ha, va in directions
    ]


def place_labels(
    figure: Any,
    axes: Any,
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str],
    which: Sequence[int] | None = None,
) -> int:
    """Label the points `which` (all by default; labels[k] goes with point which[k]) in that order:
    each at the nearest candidate position whose box stays inside the axes and overlaps no label
    placed so far and no point (labelled or not), and whose leader (point to label centre) crosses no
    other leader nor label; a label with no such position is left out. A label moved away from its
    point gets a thin leader line. Returns the number of labels placed."""
    which = list(range(len(labels))) if which is None else list(which)
    renderer = figure.canvas.get_renderer()
    points = axes.transData.transform(list(zip(x, y, strict=True))) if len(x) else []
    inside = axes.get_window_extent(renderer)
    frame = (inside.x0, inside.y0, inside.x1, inside.y1)
    marker = 4.0  # pixels around a point kept clear
    dots = [(px - marker, py - marker, px + marker, py + marker) for px, py in points]
    taken: list[tuple[float, float, float, float]] = []
    leaders: list[tuple[tuple[float, float], tuple[float, float]]] = []
    for label, i in zip(labels, which, strict=True):
        start = (float(points[i][0]), float(points[i][1]))
        text = axes.annotate(
            label, (x[i], y[i]), textcoords="offset points", xytext=(3, 3), fontsize=7, zorder=4
        )
        found = None
        for dx, dy, ha, va in _offsets():
            text.set_position((dx, dy))
            text.set_ha(ha)
            text.set_va(va)
            box = text.get_window_extent(renderer)
            corners = (box.x0, box.y0, box.x1, box.y1)
            if _outside(corners, frame) > 0:
                continue
            if any(_overlap(corners, other) > 0 for other in taken):
                continue
            if any(_overlap(corners, dot) > 0 for j, dot in enumerate(dots) if j != i):
                continue
            # a label without a leader is read as naming the point nearest to it: it must be its own
            near = _distance(start, corners)
            if max(abs(dx), abs(dy)) < LEADER_AT and any(
                _distance((float(px), float(py)), corners) <= near
                for j, (px, py) in enumerate(points)
                if j != i
            ):
                continue
            leader = (start, ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2))
            if any(_crosses(leader, other) for other in leaders):
                continue
            if any(_hits(leader, other) for other in taken) or any(
                _hits(other, corners) for other in leaders
            ):
                continue
            found = (dx, dy, ha, va, corners, leader)
            break
        text.remove()
        if found is None:
            continue
        dx, dy, ha, va, corners, leader = found
        style = {
            "arrowstyle": "-",
            "color": "#aaaaaa",
            "linewidth": 0.5,
            "shrinkA": 0,
            "shrinkB": 3,
        }
        axes.annotate(
            label,
            (x[i], y[i]),
            textcoords="offset points",
            xytext=(dx, dy),
            ha=ha,
            va=va,
            fontsize=7,
            zorder=4,
            arrowprops=style if max(abs(dx), abs(dy)) >= LEADER_AT else None,
        )
        taken.append(corners)
        leaders.append(leader)
    return len(taken)


def _crosses(
    a: tuple[tuple[float, float], tuple[float, float]],
    b: tuple[tuple[float, float], tuple[float, float]],
) -> bool:
    """Whether two segments cross (touching ends do not count)."""

    def side(p: tuple[float, float], q: tuple[float, float], r: tuple[float, float]) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    (p, q), (r, t) = a, b
    return side(p, q, r) * side(p, q, t) < 0 and side(r, t, p) * side(r, t, q) < 0


def _hits(
    segment: tuple[tuple[float, float], tuple[float, float]],
    box: tuple[float, float, float, float],
) -> bool:
    """Whether a segment passes through a box (Liang-Barsky clipping)."""
    (x0, y0), (x1, y1) = segment
    low, high = 0.0, 1.0
    for delta, distance in (
        (-(x1 - x0), x0 - box[0]),
        (x1 - x0, box[2] - x0),
        (-(y1 - y0), y0 - box[1]),
        (y1 - y0, box[3] - y0),
    ):
        if delta == 0:
            if distance < 0:
                return False
            continue
        ratio = distance / delta
        if delta < 0:
            low = max(low, ratio)
        else:
            high = min(high, ratio)
        if low > high:
            return False
    return True


def _distance(point: tuple[float, float], box: tuple[float, float, float, float]) -> float:
    """From a point to the nearest part of a box (0 inside it)."""
    dx = max(box[0] - point[0], 0.0, point[0] - box[2])
    dy = max(box[1] - point[1], 0.0, point[1] - box[3])
    return math.hypot(dx, dy)


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    return width * height if width > 0 and height > 0 else 0.0


def _outside(
    box: tuple[float, float, float, float], frame: tuple[float, float, float, float]
) -> float:
    area = (box[2] - box[0]) * (box[3] - box[1])
    return area - _overlap(box, frame)


def _interval(
    row: Mapping[str, Any], value: str, error: str, low: str | None = None, high: str | None = None
) -> tuple[Any, Any]:
    """A row's interval around `value`: its bootstrap bounds when it has them, else the normal 95%
    interval from its standard error; (None, None) when it has neither."""
    if low and row.get(low) is not None and row.get(high) is not None:
        return row[low], row[high]
    if row.get(value) is None or row.get(error) is None:
        return None, None
    return row[value] - 1.96 * row[error], row[value] + 1.96 * row[error]


def winrate_board(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> str:
    """farm-winrate's rows as bars: the win rate, and beside it on the same axis the length-controlled
    win rate when the rows have one; the references and the judges in the title, and with several
    references (farm-winrate groups the rows by reference) a heading "vs REFERENCE" per group."""
    several = len({row["reference"] for row in rows}) > 1
    labels = [str(row["generator"]) for row in rows]
    groups = [f"vs {row['reference']}" for row in rows] if several else None
    raw = [_interval(row, "win_rate", "standard_error", "ci_low", "ci_high") for row in rows]
    panels = [
        Bars(
            "win rate (%)",
            [row["win_rate"] for row in rows],
            [lo for lo, _ in raw],
            [hi for _, hi in raw],
        )
    ]
    if any(row.get("length_controlled_win_rate") is not None for row in rows):
        controlled = [
            _interval(row, "length_controlled_win_rate", "lc_standard_error") for row in rows
        ]
        panels.append(
            Bars(
                "length-controlled win rate (%)",
                [row.get("length_controlled_win_rate") for row in rows],
                [lo for lo, _ in controlled],
                [hi for _, hi in controlled],
            )
        )
    references = ", ".join(sorted({str(row["reference"]) for row in rows}))
    judges = ", ".join(
        sorted(
            {name for row in rows if row.get("annotator") for name in row["annotator"].split(", ")}
        )
    )
    title = f"Win rate against {references}" + (f", judged by {judges}" if judges else "")
    return leaderboard(path, labels, panels, title=title, reference_line=50.0, groups=groups)


def board_scatter(
    path: str | os.PathLike, x: Any, y: Any, title: str = "", max_labels: int | None = None
) -> str:
    """farm-correlate's figure: the models two leaderboards (farmkit.evaluate.correlate.Board) share, one
    against the other, with the boards' intervals; axes named by file stem, score and judge (see
    `scatter` for the labels)."""
    common = sorted(set(x.scores) & set(y.scores))
    xlabel, ylabel = x.axis_label or x.label, y.axis_label or y.label
    if xlabel == ylabel:
        xlabel, ylabel = x.label, y.label
    return scatter(
        path,
        [x.scores[m] for m in common],
        [y.scores[m] for m in common],
        labels=common,
        x_intervals=[x.intervals.get(m) for m in common],
        y_intervals=[y.intervals.get(m) for m in common],
        xlabel=xlabel,
        ylabel=ylabel,
        title=title,
        max_labels=max_labels,
    )


def _mark_drifts(axes: Any, canaries: Sequence[Mapping[str, Any]]) -> None:
    """A red dashed line at each run whose canaries found the judge drifted (farm-winrate --canaries),
    labelled with the canaries' agreement."""
    from datetime import datetime

    for entry in canaries:
        if not entry.get("judge_drift"):
            continue
        when = datetime.fromisoformat(str(entry["evaluated_at"]).replace("Z", "+00:00"))
        axes.axvline(when, color="tab:red", linestyle="--", linewidth=1.2)
        axes.annotate(
            f"judge drift: canaries agree {entry.get('canary_agreement', 0):.0f}%",
            xy=(when, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-4, -4),
            textcoords="offset points",
            rotation=90,
            ha="right",
            va="top",
            color="tab:red",
            fontsize=8,
        )


def win_rate_history(
    path: str | os.PathLike,
    entries: Sequence[Mapping[str, Any]],
    generators: Sequence[str] = (),
    score: str = "win_rate",
) -> str:
    """farm-winrate --history entries: each (model, reference)'s win rate over time, with its interval
    as a band; only the given models when any are named."""
    from datetime import UTC, datetime

    plt = _pyplot()
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    canaries = [entry for entry in entries if entry.get("kind") == "canary"]
    entries = [entry for entry in entries if entry.get("kind") != "canary"]
    known = sorted({str(entry["generator"]) for entry in entries})
    missing = [name for name in generators if name not in known]
    if missing:
        raise FarmError(
            f"no entries for {', '.join(missing)} in the history; its models are {', '.join(known)}"
        )
    wanted = set(generators or known)
    lines: dict[tuple[str, str], list[tuple[datetime, float, Any, Any]]] = {}
    error = "standard_error" if score == "win_rate" else "lc_standard_error"
    for entry in entries:
        if entry["generator"] not in wanted or entry.get(score) is None:
            continue
        low, high = _interval(
            entry, score, error, *(("ci_low", "ci_high") if score == "win_rate" else ())
        )
        when = datetime.fromisoformat(str(entry["evaluated_at"]).replace("Z", "+00:00"))
        lines.setdefault((str(entry["generator"]), str(entry.get("reference"))), []).append(
            (when, entry[score], low, high)
        )
    several = len({reference for _, reference in lines}) > 1
    figure, axes = plt.subplots(figsize=(8, 4.8), dpi=DPI, layout="constrained")
    styles = line_styles(len(lines))
    for (model, reference), points in sorted(lines.items()):
        points.sort(key=lambda point: point[0])
        times, values = [p[0] for p in points], [p[1] for p in points]
        (line,) = axes.plot(
            times,
            values,
            label=f"{model} (vs {reference})" if several else model,
            **styles.pop(0),
        )
        banded = [p for p in points if p[2] is not None and p[3] is not None]
        if banded:
            axes.fill_between(
                [p[0] for p in banded],
                [p[2] for p in banded],
                [p[3] for p in banded],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    _mark_drifts(axes, canaries)
    references = ", ".join(sorted({reference for _, reference in lines}))
    judges = sorted(
        {
            name
            for entry in entries
            if entry.get("annotator")
            for name in str(entry["annotator"]).split(", ")
        }
    )
    # the figure's title, above everything the layout places (the legend beside the axes included),
    # so that a title wrapped over several lines never runs under the legend
    figure.suptitle(
        f"{score.replace('_', ' ')} against {references} over time"
        + (f", judged by {', '.join(judges)}" if judges else ""),
        fontsize=10,
        wrap=True,
    )
    axes.set_ylabel(f"{score.replace('_', ' ')} (%)")
    axes.set_xlabel("evaluated at (UTC)")
    locator = AutoDateLocator(tz=UTC)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(
        ConciseDateFormatter(
            locator,
            tz=UTC,
            # ticks seconds apart read as whole times (21:14:20), never as bare seconds ("20 40
            # 21:15"); the date goes once into the offset below the axis
            formats=["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"],
            zero_formats=["", "%Y", "%b", "%b-%d", "%H:%M", "%H:%M:%S"],
            offset_formats=["", "%Y", "%Y-%b", "%Y-%b-%d", "%Y-%b-%d", "%Y-%b-%d"],
        )
    )
    axes.axhline(50.0, color="grey", linestyle="--", linewidth=1)
    axes.grid(color="#dddddd", linewidth=0.5)
    if lines:  # below the axes: never over a line, nor under a title that wraps
        figure.legend(fontsize=8, loc="outside lower center", ncols=min(len(lines), 4))
    return _save(figure, path, layout=False)


def training_curves(
    path: str | os.PathLike,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    fields: Sequence[str] = (),
    x: str = "step",
) -> str:
    """Every numeric field of the runs' metrics against `step` (or the field `x`: gold_win_rate
    against gold_kl, say), one panel per field (the given ones when named) and one line per run; a
    run without a field is left out of its panel, a row without both values out of its line."""
    plt = _pyplot()
    titles: dict[str, str] = {}
    if not fields:
        numeric = list(
            dict.fromkeys(
                name
                for rows in runs.values()
                for row in rows
                for name, value in row.items()
                if name not in ("step", x) and _number(value)
            )
        )
        fields = [name for name in numeric if name not in BOOKKEEPING] or numeric
        fields, titles = _same_curves(runs, fields, x)
    if not fields:
        raise FarmError("the metrics have no numeric field besides step")
    methods = list(
        dict.fromkeys(
            str(row["method"]) for rows in runs.values() for row in rows if row.get("method")
        )
    )
    sweep = bool(methods) and set(methods) == {"bon"}  # farm-bon --metrics: step is n
    columns = min(3, len(fields))
    rows_of_panels = math.ceil(len(fields) / columns)
    figure, axes = plt.subplots(
        rows_of_panels,
        columns,
        figsize=(4.2 * columns, 3.0 * rows_of_panels),
        dpi=DPI,
        squeeze=False,
        layout="constrained",
    )
    from matplotlib.ticker import MaxNLocator

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = line_styles(len(runs))
    for style, color in zip(styles, colors * len(runs), strict=False):
        style["color"] = color
    what = (
        "best-of-n sweep"
        if sweep
        else (
            ", ".join(METHOD_NAMES.get(m, m) for m in methods) + " training curves"
            if methods
            else "Training curves"
        )
    )
    figure.suptitle(shorten(f"{what}: " + ", ".join(runs), 120), fontsize=11)
    for index, name in enumerate(fields):
        panel = axes[index // columns][index % columns]
        for number, (run, rows) in enumerate(runs.items()):
            points = [
                (row[x], row[name])
                for row in rows
                if _number(row.get(name)) and _number(row.get(x))
            ]
            if points:
                style = dict(styles[number])
                if len(points) >= 20:
                    style["marker"] = None
                panel.plot([p[0] for p in points], [p[1] for p in points], label=run, **style)
        panel.set_title(titles.get(name, name), fontsize=10, pad=12)  # room for a "1e-5" above
        panel.set_xlabel("n" if sweep and x == "step" else x)
        if x == "step":  # whole steps, even for a panel with one point
            panel.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        panel.ticklabel_format(axis="y", useOffset=False)
        panel.grid(color="#dddddd", linewidth=0.5)
    for index in range(len(fields), rows_of_panels * columns):
        axes[index // columns][index % columns].set_visible(False)
    if len(runs) > 1:
        handles = [
            plt.Line2D([], [], **{k: v for k, v in style.items() if k != "zorder"})
            for style in styles
        ]
        figure.legend(
            handles, list(runs), loc="outside lower center", ncols=min(len(runs), 4), fontsize=8
        )
    return _save(figure, path, layout=False)


# Figures every trainer writes that say where a run is rather than how it learns: left out of the
# default panels of farm-plot curves (--field NAME still draws one, --x NAME puts one on the axis).
BOOKKEEPING = frozenset(
    {
        "epoch",
        "elapsed_s",
        "round",
        "n",
        "num_tokens",
        "labels_used",
        "tokens_sampled",
        "training_tokens",
        "sampling_seed",
        "training_seed",
    }
)
METHOD_NAMES = {
    "sft": "SFT",
    "reward": "reward model",
    "dpo": "DPO",
    "online-dpo": "online DPO",
    "ppo": "PPO",
    "rloo": "RLOO",
    "grpo": "GRPO",
    "quark": "Quark",
    "expiter": "expert iteration",
    "bon": "best-of-n",
}


def _same_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], fields: Sequence[str], x: str
) -> tuple[list[str], dict[str, str]]:
    """Fields whose curves are the same in every run (PPO's reward and score) share one panel, titled
    with both names. Returns the fields to draw and the titles of the shared panels."""

    def curves(name: str) -> tuple:
        return tuple(
            tuple((row.get(x), row.get(name)) for row in rows if _number(row.get(name)))
            for rows in runs.values()
        )

    kept: dict[tuple, str] = {}
    titles: dict[str, str] = {}
    for name in fields:
        key = curves(name)
        if key in kept and any(key):
            first = kept[key]
            titles[first] = f"{titles.get(first, first)} = {name}"
        else:
            kept.setdefault(key, name)
    return list(kept.values()), titles


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def over_optimization(
    path: str | os.PathLike,
    rows: Sequence[Mapping[str, Any]],
    labels: Mapping[str, str] | None = None,
) -> str:
    """The over-optimization figure from farmkit.evaluate.overopt's rows: per reward model, the gold win rate
    against the mean surrogate reward for best-of-n and PPO; the gold win rate against the KL to the
    SFT policy when the rows have it; and the best-of-n sweep against n."""
    plt = _pyplot()
    from matplotlib.text import OffsetFrom

    labels = labels or {}
    models = sorted({row["reward_model"] for row in rows})
    with_kl = any(row.get("kl") is not None for row in rows)
    count = len(models) + 1 + with_kl
    figure, axes = plt.subplots(
        1, count, figsize=(4.6 * count, 4.2), squeeze=False, dpi=DPI, layout="constrained"
    )
    markers = {"best-of-n": "o", "ppo": "s"}
    for panel, model in zip(axes[0], models, strict=False):
        for method, marker in markers.items():
            points = [
                row for row in rows if row["reward_model"] == model and row["method"] == method
            ]
            if not points:
                continue
            xs, ys = (
                [row["surrogate_reward"] for row in points],
                [row["gold_win_rate"] for row in points],
            )
            panel.errorbar(
                xs,
                ys,
                yerr=[row["gold_standard_error"] or 0 for row in points],
                marker=marker,
                capsize=2,
                label=method,
            )
            # checkpoints that barely moved lie on each other: their labels stand in a column
            # right of the cluster, top to bottom in the points' order, each tied to its point
            column = OffsetFrom(panel.transData, (max(xs), sum(ys) / len(ys)))
            rank = {i: r for r, i in enumerate(sorted(range(len(ys)), key=lambda i: -ys[i]))}
            for index, (row, x, y) in enumerate(zip(points, xs, ys, strict=True)):
                if method == "best-of-n":  # spread along the curve: labels alternate above, below
                    text, offset = f"n={row['n']}", (3, 3 if index % 2 == 0 else -9)
                    place, arrow = "offset points", None
                else:
                    text, offset = (
                        f"step {row['step']}",
                        (18, 11 * ((len(ys) - 1) / 2 - rank[index])),
                    )
                    place, arrow = column, {"arrowstyle": "-", "linewidth": 0.5, "color": "grey"}
                panel.annotate(
                    text,
                    (x, y),
                    textcoords=place,
                    xytext=offset,
                    fontsize=7,
                    va="center",
                    arrowprops=arrow,
                )
        panel.set_title(f"reward model: {labels.get(model, model)}", fontsize=10)
        panel.set_xlabel("mean surrogate reward")
        panel.set_ylabel("gold win rate (%)")
        panel.legend(fontsize=8)
    if with_kl:
        panel = axes[0][len(models)]
        for model in models:
            for method, marker in markers.items():
                points = sorted(
                    (row["kl"], row["gold_win_rate"])
                    for row in rows
                    if row["reward_model"] == model
                    and row["method"] == method
                    and row.get("kl") is not None
                )
                if points:
                    panel.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        marker=marker,
                        label=f"{method}, {labels.get(model, model)}",
                    )
        panel.set_xlabel("KL to the SFT policy (nats; best-of-n: log n - (n-1)/n)")
        panel.set_ylabel("gold win rate (%)")
        panel.set_title("gold against KL", fontsize=10)
        panel.legend(fontsize=8)
    sweep = axes[0][-1]
    for model in models:
        points = sorted(
            (row["n"], row["gold_win_rate"])
            for row in rows
            if row["reward_model"] == model and row["method"] == "best-of-n"
        )
        sweep.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            label=labels.get(model, model),
        )
    sweep.set_xscale("log", base=2)
    sweep.set_xlabel("n (best-of-n)")
    sweep.set_ylabel("gold win rate (%)")
    sweep.set_title("best-of-n sweep", fontsize=10)
    sweep.legend(fontsize=8)
    return _save(figure, path, layout=False)
