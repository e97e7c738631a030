"""farm-winrate --history: each run's rows appended with its time and inputs, under a lock, so that
runs at the same time lose nothing; farm-plot history reads it back."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools import farm_plot, farm_winrate

from farmkit.evaluate import history
from farmkit.lm.models import file_sha256

PROCESSES, APPENDS, ROWS = 4, 15, 3


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def prefs(model, values):
    return [
        {
            "instruction": f"task {i}",
            "generator_1": "ref",
            "generator_2": model,
            "annotator": "judge",
            "preference": value,
        }
        for i, value in enumerate(values)
    ]


def test_each_run_appends_its_rows_stamped(tmp_path):
    first = write_jsonl(
        tmp_path / "monday.jsonl", prefs("A", [2, 2, 1, 2]) + prefs("B", [1, 1, 2, 1])
    )
    second = write_jsonl(
        tmp_path / "tuesday.jsonl", prefs("A", [2, 1, 1, 1]) + prefs("B", [1, 2, 2, 2])
    )
    log = tmp_path / "history.jsonl"
    for path in (first, second):
        result = CliRunner().invoke(
            farm_winrate.cli, [str(path), "--no-length-control", "--history", str(log), "-q"]
        )
        assert result.exit_code == 0, result.output
    entries = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert [(e["generator"], e["win_rate"]) for e in entries] == [
        ("A", 75.0),
        ("B", 25.0),
        ("B", 75.0),
        ("A", 25.0),
    ]
    assert [e["inputs"] for e in entries[::2]] == [
        [{"path": str(first), "sha256": file_sha256(first)}],
        [{"path": str(second), "sha256": file_sha256(second)}],
    ]
    assert (
        entries[0]["run_id"] == entries[1]["run_id"] != entries[2]["run_id"] == entries[3]["run_id"]
    )
    assert all(
        datetime.fromisoformat(e["evaluated_at"].replace("Z", "+00:00")).tzinfo is not None
        for e in entries
    )
    assert entries[0]["annotator"] == "judge"
    assert history.read(log) == entries
    refused = CliRunner().invoke(
        farm_winrate.cli, [str(first), "--compare", "A", "B", "--history", str(log)]
    )
    assert refused.exit_code == 2 and "--history keeps leaderboard rows" in refused.output


def append_many(path, worker, start):
    start.wait()
    for run in range(APPENDS):
        rows = [
            {"generator": f"w{worker}", "run": run, "row": row, "win_rate": 50.0}
            for row in range(ROWS)
        ]
        history.append(path, history.stamped(rows, []))


@pytest.mark.heavy
def test_concurrent_runs_lose_no_rows(tmp_path):
    path = tmp_path / "history.jsonl"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    workers = [
        context.Process(target=append_many, args=(path, worker, start))
        for worker in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(entries) == PROCESSES * APPENDS * ROWS
    assert sorted((e["generator"], e["run"], e["row"]) for e in entries) == sorted(
        (f"w{w}", run, row)
        for w in range(PROCESSES)
        for run in range(APPENDS)
        for row in range(ROWS)
    )
    for worker in range(PROCESSES):  # each worker's runs appear in the order it made them
        runs = [e["run"] for e in entries if e["generator"] == f"w{worker}"]
        assert runs == sorted(runs)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".history.jsonl.lock", "history.jsonl"]


def test_a_truncated_history_is_refused(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_bytes(b'{"generator": "A", "win_rate": 50')
    with pytest.raises(history.FarmError, match="last line is incomplete"):
        history.append(path, [{"generator": "B"}])
    assert path.read_bytes() == b'{"generator": "A", "win_rate": 50'


def entry(model, when, rate, reference="ref"):
    return {
        "evaluated_at": when,
        "run_id": when,
        "generator": model,
        "reference": reference,
        "annotator": "judge",
        "win_rate": rate,
        "standard_error": 2.0,
    }


def test_plot_history_draws_a_model_over_time_with_its_band(tmp_path, figures):
    path = write_jsonl(
        tmp_path / "h.jsonl",
        [entry("A", f"2026-01-0{day}T00:00:00Z", 40 + day) for day in (3, 1, 2)]
        + [entry("B", "2026-01-01T00:00:00Z", 30)],
    )
    result = CliRunner().invoke(
        farm_plot.cli, ["history", str(path), "--generator", "A", "-o", str(tmp_path / "h.png")]
    )
    assert result.exit_code == 0, result.output
    (axes,) = figures[0].axes
    (line,) = [line for line in axes.lines if line.get_label() == "A"]
    assert list(line.get_ydata()) == [41, 42, 43]  # in time order
    assert [d.day for d in line.get_xdata()] == [1, 2, 3] and line.get_xdata()[0].tzinfo == UTC
    (band,) = axes.collections
    assert band.get_paths()[0].vertices[:, 1].min() == pytest.approx(41 - 1.96 * 2)
    title = figures[0].get_suptitle()  # the figure's title, above the layout
    assert "judge" in title and "ref" in title
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_history_reads_cleanly(tmp_path, figures):
    """Dates written concisely in UTC, the axis says so, and the legend sits outside the data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import ConciseDateFormatter

    path = write_jsonl(
        tmp_path / "h.jsonl",
        [
            entry(f"step-{k}", f"2026-03-{day:02d}T02:30:00Z", 20 + 8 * k)
            for day in range(1, 11)
            for k in range(1, 7)
        ],
    )
    result = CliRunner().invoke(
        farm_plot.cli, ["history", str(path), "-o", str(tmp_path / "h.png")]
    )
    assert result.exit_code == 0, result.output
    (figure,) = figures
    (axes,) = figure.axes
    assert axes.get_xlabel() == "evaluated at (UTC)"
    formatter = axes.xaxis.get_major_formatter()
    assert isinstance(formatter, ConciseDateFormatter)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    assert axes.xaxis.get_offset_text().get_text() == "2026-Mar"  # the month once, days on ticks
    assert all(len(t.get_text()) <= 5 for t in axes.get_xticklabels())
    (legend,) = figure.legends + ([axes.get_legend()] if axes.get_legend() else [])
    assert len(legend.get_texts()) == 6
    assert not legend.get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))


def test_plot_history_names_an_unknown_model_and_a_bad_line(tmp_path):
    path = write_jsonl(
        tmp_path / "h.jsonl", [entry("A", "2026-01-01T00:00:00Z", 40), {"generator": "B"}]
    )
    result = CliRunner().invoke(
        farm_plot.cli, ["history", str(path), "-o", str(tmp_path / "h.png")]
    )
    assert (
        result.exit_code == 1
    )  # CliRunner sees the FarmError that entry_point turns into one line
    assert (
        str(result.exception)
        == f"{path}:2: no evaluated_at, win_rate; expected a row written by farm-winrate --history"
    )
    path = write_jsonl(tmp_path / "h.jsonl", [entry("A", "2026-01-01T00:00:00Z", 40)])
    result = CliRunner().invoke(
        farm_plot.cli, ["history", str(path), "--generator", "Z", "-o", str(tmp_path / "h.png")]
    )
    assert (
        result.exit_code == 1
        and str(result.exception) == "no entries for Z in the history; its models are A"
    )
    assert not (tmp_path / "h.png").exists()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"generator": 12345}, "generator is 12345; expected the model's name (a string)"),
        ({"generator": None}, "generator is None; expected the model's name (a string)"),
        ({"win_rate": "40%"}, "win_rate is '40%'; expected a number or null"),
        ({"win_rate": True}, "win_rate is True; expected a number or null"),
        ({"evaluated_at": "last tuesday"}, "evaluated_at is 'last tuesday'; expected an ISO 8601"),
        ({"evaluated_at": 1767225600}, "evaluated_at is 1767225600; expected an ISO 8601"),
    ],
)
def test_a_history_entry_of_the_wrong_type_names_file_and_line(tmp_path, bad, message):
    good = {"evaluated_at": "2026-01-01T00:00:00Z", "generator": "A", "win_rate": 40.0}
    path = write_jsonl(tmp_path / "h.jsonl", [good, {**good, **bad}])
    with pytest.raises(history.RecordError) as error:
        history.read(path)
    assert str(error.value).startswith(f"{path}:2: {message}")
    result = CliRunner().invoke(
        farm_plot.cli, ["history", str(path), "-o", str(tmp_path / "h.png")]
    )
    assert result.exit_code == 1 and str(result.exception).startswith(f"{path}:2: {message}")
    assert not (tmp_path / "h.png").exists()
