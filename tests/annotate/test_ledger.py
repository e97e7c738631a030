"""The cost ledger: farm-annotate --ledger appends one line per run (batch or direct), appends from
processes at once never interleave, and farm-winrate --ledger totals it by day and judge as rows
that farm-plot curves reads."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from batch_server import BatchServer
from click.testing import CliRunner
from farmkit.tools.farm_annotate import cli as annotate
from farmkit.tools.farm_winrate import cli as winrate
from test_batch import POOL, _env, _pairs

from farmkit.annotate.ledger import append, totals
from farmkit.core.io import FarmError
from farmkit.core.runs import read_metrics

WRITER = """
import sys
from farmkit.annotate.ledger import append
name = sys.argv[2]
for number in range(int(sys.argv[3])):
    append(sys.argv[1], {"date": "2026-01-01T00:00:00+00:00", "writer": name, "n": number,
                         "padding": name * 3000})
"""


def test_processes_appending_at_once_never_interleave_their_lines(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(ledger), name, "300"])
        for name in ("a", "b", "c")
    ]
    assert [writer.wait(120) for writer in writers] == [0, 0, 0]
    lines = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
    assert len(lines) == 900
    for name in ("a", "b", "c"):
        assert [line["n"] for line in lines if line["writer"] == name] == list(range(300))


def test_totals_by_day_and_judge(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    runs = [
        ("2026-03-01T02:30:00+00:00", "batch", {"m1": 1.0, "m2": 0.5}),
        ("2026-03-01T14:00:00+00:00", "direct", {"m1": 2.0}),
        ("2026-03-03T02:30:00+00:00", "batch", {"m2": 0.25}),
    ]
    for date, mode, judges in runs:
        append(
            ledger,
            {
                "date": date,
                "mode": mode,
                "pairs": 10,
                "requests": 4,
                "cached": 6,
                "price": sum(judges.values()),
                "judges": {m: {"price": p, "pairs": 5} for m, p in judges.items()},
            },
        )
    rows = totals(ledger)
    assert [(row["date"], row["step"], row["runs"]) for row in rows] == [
        ("2026-03-01", 0, 2),
        ("2026-03-03", 2, 1),
    ]
    first, second = rows
    assert first["price"] == 3.5 and first["price_batch"] == 1.5 and first["price_direct"] == 2.0
    assert first["price:m1"] == 3.0 and first["price:m2"] == 0.5 and first["pairs:m1"] == 10
    assert second["price:m2"] == 0.25 and "price:m1" not in second
    assert first["requests"] == 8 and first["cached"] == 12


def test_a_bad_ledger_line_names_its_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"date": "2026-03-01T00:00:00+00:00", "price": 1}\n{"price": 2}\n')
    with pytest.raises(FarmError, match=r"ledger.jsonl:2: expected a farm-annotate --ledger line"):
        totals(ledger)


def test_farm_annotate_books_each_run_and_farm_winrate_totals_them(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    ledger, board = tmp_path / "spend.jsonl", tmp_path / "by_day.jsonl"
    base = ["--pool", str(pool), "--cache", str(tmp_path / "c.sqlite"), "--ledger", str(ledger)]
    runner = CliRunner()
    with BatchServer() as server:
        env = _env(server)
        batch = runner.invoke(annotate, [*base, "--batch"], input=_pairs(6), env=env)
        direct = runner.invoke(annotate, base, input=_pairs(10), env=env)
    assert batch.exit_code == 0 and direct.exit_code == 0, (batch.stderr, direct.stderr)
    # the batch, booked as it was collected; the batch run; the direct run
    collected, first, second = (orjson.loads(line) for line in ledger.read_bytes().splitlines())
    assert collected["mode"] == "batch" and collected["collected"].startswith("batch-")
    assert collected["price"] > 0 and set(collected["judges"]) == {"gpt-4o-mini"}
    assert collected["judges"]["gpt-4o-mini"]["pairs"] == 6 and collected["estimated"] == 0
    assert first["mode"] == "batch" and second["mode"] == "direct"
    assert (first["pairs"], second["pairs"], second["cached"]) == (6, 10, 6)
    assert second["requests"] == server.direct  # the 4 new pairs, asked directly
    assert first["requests"] == sum(server.answered.values())
    assert first["price"] == 0 and first["judges"] == {}  # booked in the line before
    assert second["judges"]["gpt-4o-mini"]["pairs"] == 4
    assert second["judges"]["gpt-4o-mini"]["price"] == pytest.approx(second["price"])
    done = runner.invoke(winrate, ["--ledger", str(ledger), "-o", str(board)])
    assert done.exit_code == 0, done.output
    (row,) = read_metrics(board)  # what farm-plot curves reads
    assert row["runs"] == 2 and row["step"] == 0  # a batch's booking is not a run
    assert row["price"] == pytest.approx(collected["price"] + second["price"])
    assert row["price_batch"] == pytest.approx(collected["price"])
    assert row["pairs:gpt-4o-mini"] == 10
    refused = runner.invoke(winrate, ["--ledger", str(ledger), str(board)])
    assert refused.exit_code == 2 and "leave PREFS out" in refused.output
