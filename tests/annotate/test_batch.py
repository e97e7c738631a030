"""farm-annotate --batch against a loopback fake of the Batch API (tests/batch_server.py): submit then
collect, wait, expired and failed lines asked again, a 5xx on upload, kill points, batch and direct
sharing one cache, --max-cost, --estimate and the summary's counts."""

from __future__ import annotations

import base64
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from batch_server import BatchServer
from click.testing import CliRunner
from conftest import run_tool
from farmkit.tools.farm_annotate import cli
from openai_server import secret_forms

from farmkit.annotate.batch import PENDING_EXIT
from farmkit.annotate.cache import VerdictCache
from farmkit.annotate.cost import PriceTable
from farmkit.core.io import FarmError

KEY = "sk-test-batch-DO-NOT-LEAK-41c2"
# two judges on one model (one pair per request, and two), so every run is one batch
POOL = """name: batchpool
description: two endpoint judges for the batch tests
flip_rate: 0.0
settings: {timeout: 5.0, backoff: 0.01, max_retries: 2, concurrency: 4}
judges:
  - {name: one, backend: openai, model: gpt-4o-mini, prompt: plain, batch_size: 1}
  - {name: two, backend: openai, model: gpt-4o-mini, prompt: plain, batch_size: 2}
"""


def _pairs(n: int) -> bytes:
    """Pairs whose longer answer (what the fake prefers) is known, on either side."""
    records = []
    for i in range(n):
        short, long = (
            f"Answer {i}.",
            f"Answer {i}, because " + "it holds " * (1 + i % 5) + "always.",
        )
        pair = (short, long) if i % 2 else (long, short)
        records.append({"instruction": f"Question {i}?", "output_1": pair[0], "output_2": pair[1]})
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _longer(record: dict) -> int:
    return 2 if len(record["output_2"]) > len(record["output_1"]) else 1


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    """Look at a batch every 50 ms (1 s at first, in real runs): the fake finishes in a few looks."""
    from farmkit.annotate import batch

    monkeypatch.setattr(batch, "FIRST_POLL", 0.05)


@pytest.fixture(name="setup")
def setup_fixture(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    return SimpleNamespace(pool=str(pool), cache=str(tmp_path / "cache.sqlite"), tmp=tmp_path)


def _env(server: BatchServer) -> dict:
    return {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY}


def _annotate(setup, server, *args: str, input: bytes) -> SimpleNamespace:
    result = CliRunner().invoke(
        cli,
        ["--pool", setup.pool, "--cache", setup.cache, *args],
        input=input,
        env=_env(server),
        catch_exceptions=False,
    )
    return SimpleNamespace(
        code=result.exit_code,
        records=[orjson.loads(line) for line in result.stdout_bytes.splitlines()],
        stderr=result.stderr_bytes.decode(),
    )


def _pending(cache: str) -> int:
    with sqlite3.connect(cache) as db:
        return db.execute("SELECT count(*) FROM batch_keys").fetchone()[0]


def test_submit_exits_0_and_the_same_command_collects_the_records(setup):
    pairs = _pairs(6)
    with BatchServer(polls=1) as server:
        first = _annotate(setup, server, "--batch", "submit", input=pairs)
        assert first.code == 0 and first.records == []
        assert "6 question(s) pending" in first.stderr
        assert _pending(setup.cache) == 6 and not server.answered
        second = _annotate(setup, server, "--batch", "submit", input=pairs)
        assert second.code == 0, second.stderr
        assert [r["preference"] for r in second.records] == [_longer(r) for r in second.records]
        assert len(second.records) == 6 and _pending(setup.cache) == 0
        # every line was answered once, and matched by custom_id though the output is reversed
        assert set(server.answered.values()) == {1}
        assert server.calls["POST /v1/files"] == 1 and server.calls["POST /v1/batches"] == 1
        prices = [r["provenance"]["farm-annotate"]["price"] for r in second.records]
        assert all(price > 0 for price in prices)
        # a direct run of the same pairs pays nothing more: the batch's verdicts are in the cache
        third = _annotate(setup, server, input=pairs)
        assert third.code == 0 and server.direct == 0
        assert [r["preference"] for r in third.records] == [r["preference"] for r in second.records]


def test_a_batch_reply_that_could_not_be_read_is_cached_and_never_paid_for_again(setup):
    pairs = _pairs(4)
    with BatchServer(unreadable="Question 1?") as server:
        first = _annotate(setup, server, "--batch", input=pairs)
        assert first.code == 0, first.stderr
        unread = [r["preference"] is None for r in first.records]
        assert unread[1] and not all(unread)
        billed = sum(server.answered.values())
        again = _annotate(setup, server, "--batch", input=pairs)
        assert again.code == 0, again.stderr
        # re-read from the cache for free: no new batch, no direct request
        assert server.calls["POST /v1/files"] == 1 and sum(server.answered.values()) == billed
        assert server.direct == 0
        assert [r["preference"] is None for r in again.records] == unread
        assert f"{sum(unread)} pair(s) answered from cached failures" in again.stderr


def test_a_second_submit_pays_nothing_and_exits_75_while_pending(setup, tmp_path):
    pairs = _pairs(4)
    with BatchServer(polls=100) as server:
        assert _annotate(setup, server, "--batch", "submit", input=pairs).code == 0
        out = tmp_path / "prefs.jsonl"
        again = _annotate(setup, server, "--batch", "submit", "-o", str(out), input=pairs)
        assert again.code == PENDING_EXIT and not out.exists()
        assert "4 question(s) pending" in again.stderr
        assert server.calls["POST /v1/files"] == 1
        # a direct run does not ask what a batch is asking: null with the reason, nothing sent
        direct = _annotate(setup, server, input=pairs)
        assert server.direct == 0
        assert {r["preference_reason"] for r in direct.records} == {
            "pending in a batch: collect it with --batch"
        }


def test_a_bare_batch_waits_for_the_replies(setup):
    with BatchServer(polls=2) as server:
        done = _annotate(setup, server, "--batch", input=_pairs(5))
        assert done.code == 0, done.stderr
        assert [r["preference"] for r in done.records] == [_longer(r) for r in done.records]
        assert server.calls["GET /v1/batches/{id}"] >= 2 and server.direct == 0
        assert "0 question(s) pending" in done.stderr


def test_a_wait_that_runs_out_exits_75_without_records(setup):
    with BatchServer(polls=1000) as server:
        done = _annotate(setup, server, "--batch", "--batch-wait", "0.5", input=_pairs(3))
    assert done.code == PENDING_EXIT and done.records == []


def test_lines_of_an_expired_batch_are_resubmitted_and_counted(setup):
    with BatchServer(outcomes=["expired_half"]) as server:
        done = _annotate(setup, server, "--batch", input=_pairs(8))
        assert done.code == 0, done.stderr
        assert all(r["preference"] == _longer(r) for r in done.records)
        assert server.calls["POST /v1/batches"] == 2  # the rest, in a new batch
        assert set(server.answered.values()) == {1}  # and nothing paid twice
        lines = sum(server.answered.values())
    # 8 pairs in 1- and 2-pair lines: the half of the lines that expired is resubmitted
    failed = lines - lines // 2
    assert f"{failed} unanswered by their batch" in done.stderr
    assert "question(s) resubmitted, 0 asked directly" in done.stderr


def test_an_error_file_with_fallback_sync_asks_those_directly(setup):
    with BatchServer(outcomes=["errors_half"]) as server:
        done = _annotate(setup, server, "--batch", "--batch-fallback", "sync", input=_pairs(8))
        assert done.code == 0, done.stderr
        assert all(r["preference"] == _longer(r) for r in done.records)
        assert server.calls["POST /v1/batches"] == 1 and server.direct > 0
        assert f"{server.direct} unanswered by their batch" in done.stderr


def test_a_5xx_on_upload_is_retried(setup):
    with BatchServer(upload_faults=[500, 503]) as server:
        done = _annotate(setup, server, "--batch", input=_pairs(3))
        assert done.code == 0 and len(done.records) == 3
        assert server.calls["POST /v1/files"] == 3


def test_an_upload_that_keeps_failing_is_a_clear_error_and_loses_nothing(setup):
    with BatchServer(upload_faults=[500] * 3) as server:
        result = CliRunner().invoke(
            cli,
            ["--pool", setup.pool, "--cache", setup.cache, "--batch"],
            input=_pairs(3),
            env=_env(server),
        )
        message = str(result.exception)
        assert isinstance(result.exception, FarmError)
        assert "uploading the batch file: HTTP 500" in message
        assert "nothing was submitted" in message and KEY not in message
        assert _pending(setup.cache) == 0 and server.calls["POST /v1/batches"] == 0
        again = _annotate(setup, server, "--batch", input=_pairs(3))
        assert again.code == 0 and len(again.records) == 3


PASSWORD = "PaSsW0rd-TOPSECRET"
QUERY_SECRET = "QuErY-5ecret-4d1f9e"


def _secret_url(server: BatchServer) -> str:
    """The fake's URL with a gateway's credentials and Azure's query, a key in it."""
    host = server.url.removeprefix("http://")
    return f"http://alice:{PASSWORD}@{host}?api-version=2024-06-01&api-key={QUERY_SECRET}"


def _leaks(written: dict[str, bytes]) -> list[tuple[str, str]]:
    forms = secret_forms(PASSWORD, user="alice") + secret_forms(QUERY_SECRET)
    return [
        (name, form)
        for name, content in written.items()
        for form in [*forms, "TOPSECRET", "5ecret"]
        if form in content.decode("utf-8", "replace")
    ]


def test_the_batch_path_keeps_the_query_after_the_path_and_writes_no_secret(setup, monkeypatch):
    # a create that fails once makes the client list the batches (with its own query) before it
    # creates again
    with BatchServer(create_faults=[500]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", _secret_url(server))
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        result = CliRunner().invoke(
            cli,
            ["--pool", setup.pool, "--cache", setup.cache, "--batch"],
            input=_pairs(3),
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.output
    assert len(result.stdout_bytes.splitlines()) == 3
    for target in server.targets:
        path, _, query = target.partition("?")
        assert path.startswith("/v1/") and f"api-key={QUERY_SECRET}" in query, target
    assert server.calls["POST /v1/files"] == 1 and server.calls["POST /v1/batches"] == 2
    assert server.calls["GET /v1/batches"] == 1
    assert any("limit=100" in target for target in server.targets)
    basic = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert set(server.authorizations) == {basic}
    written = {"records": result.stdout_bytes, "stderr": result.stderr_bytes}
    written.update({p.name: p.read_bytes() for p in setup.tmp.glob("cache.sqlite*")})
    assert not _leaks(written)


def test_a_batch_error_echoing_the_request_prints_no_secret(setup):
    with BatchServer(upload_faults=[400], echo_request=True) as server:
        done = run_tool(
            "farm-annotate",
            *("--pool", setup.pool, "--cache", setup.cache, "--batch", "-v"),
            input=_pairs(3),
            env={"OPENAI_BASE_URL": _secret_url(server), "OPENAI_API_KEY": ""},
        )
    assert done.returncode == 1, done.stderr.decode()
    assert b"uploading the batch file: HTTP 400" in done.stderr, done.stderr.decode()
    assert b"credentials ***; query" in done.stderr  # what the gateway echoed, less its secrets
    written = {"stderr": done.stderr}
    written.update({p.name: p.read_bytes() for p in setup.tmp.glob("cache.sqlite*")})
    assert not _leaks(written), done.stderr.decode()


@pytest.mark.heavy
def test_one_sigterm_ends_a_batch_wait_at_once_and_the_batch_is_collected_later(setup):
    # --batch wait polls a batch that stays in progress; one SIGTERM ends the run within seconds,
    # with the exit status of a SIGTERM; the batch it paid for is noted, and a rerun sends nothing new
    command = [str(Path(sys.executable).parent / "farm-annotate"), "--pool", setup.pool]
    command += ["--cache", setup.cache, "--batch"]
    with BatchServer(polls=10**6) as server:
        env = {**os.environ, **_env(server)}
        process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            process.stdin.write(_pairs(3))
            process.stdin.close()
            deadline = time.monotonic() + 60
            while not server.looks and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.looks, "the batch was never polled"
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            stderr = process.stderr.read().decode()
            process.wait(timeout=30)
            stopped_in = time.monotonic() - started
        finally:
            process.kill()
            process.wait()
        assert process.returncode == 143 and stopped_in < 5, (process.returncode, stderr)
        assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr
        assert _pending(setup.cache) == 3
        again = _annotate(setup, server, "--batch", "submit", input=_pairs(3))
        assert again.code == PENDING_EXIT and "3 question(s) pending" in again.stderr
        assert server.calls["POST /v1/files"] == 1 and server.calls["POST /v1/batches"] == 1


@pytest.mark.parametrize("point", ["before", "after"])
def test_a_run_killed_around_the_create_never_pays_twice(setup, point):
    """SIGKILL while the batch is being created: `before` the endpoint made it (the upload done),
    or `after` (made, the reply lost). The next run finds the orphaned intent, adopts the batch the
    endpoint made or asks again, and every question is billed once."""
    pairs = _pairs(6)
    with BatchServer(hang_create=point) as server:
        tool = Path(sys.executable).parent / "farm-annotate"
        process = subprocess.Popen(
            [tool, "--pool", setup.pool, "--cache", setup.cache, "--batch", "submit"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **_env(server)},
        )
        process.stdin.write(pairs)
        process.stdin.close()
        assert server.create_seen.wait(60)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert _pending(setup.cache) == 6
        server.hang_create = None
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert all(r["preference"] == _longer(r) for r in done.records)
        assert set(server.answered.values()) == {1}
        assert len(server.batches) == 1  # adopted (after), or made once by the second run (before)
    if point == "before":
        assert "line(s) of a run killed before its batch was created" in done.stderr


def test_max_cost_holds_the_worst_case_of_a_batch_before_it_is_sent(setup):
    pairs = _pairs(20)
    with BatchServer() as server:
        expected = _annotate(setup, server, "--estimate", input=pairs).records[0]["batch_price"]
        # the expected price fits, the worst case (every reply max_tokens long) does not
        cap = f"{2 * expected:.6f}"
        result = CliRunner().invoke(
            cli,
            ["--pool", setup.pool, "--cache", setup.cache, "--batch", "--max-cost", cap],
            input=pairs,
            env=_env(server),
        )
        assert isinstance(result.exception, FarmError)
        assert f"over --max-cost ${float(cap):.4f}; it was not sent" in str(result.exception)
        assert server.calls["POST /v1/files"] == 0 and _pending(setup.cache) == 0
        # a cap that holds the worst case sends it
        done = _annotate(setup, server, "--batch", "--max-cost", "1", input=pairs)
        assert done.code == 0 and len(done.records) == 20


def test_estimate_shows_the_direct_and_the_batch_price(setup, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpt-4o-mini: {prompt: 0.15, completion: 0.6, batch: 0.25}\n")
    with BatchServer() as server:
        plain = _annotate(setup, server, "--estimate", input=_pairs(4)).records[0]
        assert plain["batch_price"] == pytest.approx(plain["price"] / 2, abs=1e-6)
        own = _annotate(setup, server, "--estimate", "--prices", str(prices), input=_pairs(4))
        assert own.records[0]["batch_price"] == pytest.approx(plain["price"] / 4, abs=1e-6)


def test_a_batch_verdict_is_priced_at_half_the_direct_one(setup, tmp_path):
    pairs = _pairs(4)
    with BatchServer() as server:
        batch = _annotate(setup, server, "--batch", input=pairs)
    direct_setup = SimpleNamespace(pool=setup.pool, cache=str(tmp_path / "direct.sqlite"))
    with BatchServer() as server:
        direct = _annotate(direct_setup, server, input=pairs)
    for b, d in zip(batch.records, direct.records, strict=True):
        assert b["provenance"]["farm-annotate"]["price"] == pytest.approx(
            d["provenance"]["farm-annotate"]["price"] / 2, rel=1e-3
        )


def test_the_batch_factor_of_a_prices_file_is_checked():
    assert PriceTable({"m": {"prompt": 1, "completion": 2, "batch": 0.25}}).price(
        "m", 1e6, 0, batch=True
    ) == pytest.approx(0.25)
    assert PriceTable().price("gpt-4o-mini", 1e6, 0, batch=True) == pytest.approx(0.075)
    with pytest.raises(FarmError, match="batch 2: expected the share"):
        PriceTable({"m": {"prompt": 1, "completion": 2, "batch": 2}})


def test_a_schema_1_cache_gains_the_batch_tables_and_keeps_its_verdicts(tmp_path):
    path = tmp_path / "old.sqlite"
    row = {
        "choice": "A",
        "prompt_tokens": 90,
        "completion_tokens": 1,
        "price": 1e-05,
        "seconds": 0.2,
    }
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE verdicts (key TEXT PRIMARY KEY, value BLOB NOT NULL, created REAL NOT NULL)"
        )
        db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('schema', '1')")
        db.execute("INSERT INTO verdicts VALUES ('k', ?, 0)", (orjson.dumps(row),))
    cache = VerdictCache(path)
    assert cache.get_many(["k"]) == {"k": row}
    assert cache.pending_keys(["k"]) == set()
    taken = cache.record_batch("intent", "http://x/v1", [("c1", ["k2"], {})], lambda ids: 0.5)
    assert taken == ["c1"] and cache.pending_keys(["k", "k2"]) == {"k2"}
    cache.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() == ("2",)


def test_farm_eval_passes_batch_through(setup):
    from farmkit.tools.farm_eval import cli as evaluate

    outputs, reference = setup.tmp / "outputs.jsonl", setup.tmp / "reference.jsonl"
    questions = [f"Question {i}?" for i in range(4)]
    reference.write_bytes(
        b"".join(
            orjson.dumps({"instruction": q, "output": "Yes.", "generator": "ref"}) + b"\n"
            for q in questions
        )
    )
    outputs.write_bytes(
        b"".join(
            orjson.dumps({"instruction": q, "output": "Yes, and here is why.", "generator": "m"})
            + b"\n"
            for q in questions
        )
    )
    args = [str(outputs), "--reference", str(reference), "--pool", setup.pool]
    args += ["--cache", setup.cache, "--batch", "submit", "--bootstrap", "0"]
    with BatchServer(polls=1) as server:
        runner = CliRunner()
        first = runner.invoke(evaluate, args, env=_env(server), catch_exceptions=False)
        assert first.exit_code == 0 and first.stdout == ""
        assert _pending(setup.cache) == 4
        second = runner.invoke(evaluate, args, env=_env(server), catch_exceptions=False)
        assert second.exit_code == 0, second.stderr
        (row,) = [orjson.loads(line) for line in second.stdout.splitlines()]
        assert row["generator"] == "m" and row["win_rate"] == 100.0
        assert server.direct == 0 and set(server.answered.values()) == {1}


def test_batches_that_keep_failing_end_in_null_verdicts_not_a_batch_every_poll(setup):
    # the pool's max_retries is 2: a question gets three batches, then no verdict with the reason
    with BatchServer(outcomes=["failed"] * 10) as server:
        done = _annotate(setup, server, "--batch", "--batch-wait", "30", input=_pairs(2))
        assert done.code == 0, done.stderr
        assert server.calls["POST /v1/batches"] == 3 and not server.answered
    assert [r["preference"] for r in done.records] == [None, None]
    assert {r["preference_reason"] for r in done.records} == {
        "no reply in 3 batches: no reply (batch failed)"
    }


def test_a_direct_run_leaves_out_what_a_batch_took_after_its_plan(setup, monkeypatch):
    """A batch recorded by another run between a direct run's plan and its requests: the direct
    run does not ask those questions (the batch pays for them), it gives them no verdict."""
    from farmkit.annotate.pairs import Item
    from farmkit.annotate.pools import load_pool
    from farmkit.annotate.run import Run

    items = [Item(orjson.loads(line)) for line in _pairs(4).splitlines()]
    with BatchServer() as server:
        for name, value in _env(server).items():
            monkeypatch.setenv(name, value)
        with Run(load_pool(setup.pool), cache_path=setup.cache) as run:
            plan = run.annotator.plan(items)
            taken = plan.requests[0]
            other = VerdictCache(setup.cache)
            assert other.record_batch(
                "elsewhere", server.url, [("c", [a.key for a in taken], {})], lambda ids: 0.0
            ) == ["c"]
            records = list(run.annotator.run(items, plan))
            other.close()
        asked = sum(len(request) for request in plan.requests) - len(taken)
        assert server.direct == len(plan.requests) - 1 and asked > 0
    held = [r for r in records if r["preference"] is None]
    assert len(held) == len(taken)
    assert {r["preference_reason"] for r in held} == {"pending in a batch: collect it with --batch"}
