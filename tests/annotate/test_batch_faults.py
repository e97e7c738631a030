"""farm-annotate --batch against the faults of a broken or hostile Batch API (tests/batch_server.py):
duplicate and unknown custom_ids, replies without usage, malformed lines, an output file that is gone,
a create reply without an id, no batch listing, a gzip bomb and an endless body. Under each, every
line the endpoint billed is booked once in the ledger (at the worst case where its bill is not told)
and no question is stuck: the run, or a rerun, completes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from batch_server import BatchServer
from click.testing import CliRunner
from farmkit.tools.farm_annotate import cli
from test_batch import KEY, POOL, _env, _longer, _pairs, _pending

from farmkit.annotate import ledger

RATES = (0.15, 0.60)  # gpt-4o-mini, USD per million prompt and completion tokens


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    from farmkit.annotate import batch

    monkeypatch.setattr(batch, "FIRST_POLL", 0.05)


@pytest.fixture(name="setup")
def setup_fixture(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    return SimpleNamespace(
        pool=str(pool),
        cache=str(tmp_path / "cache.sqlite"),
        ledger=str(tmp_path / "spend.jsonl"),
        tmp=tmp_path,
    )


def _annotate(setup, server, *args: str, input: bytes, env: dict | None = None):
    result = CliRunner().invoke(
        cli,
        ["--pool", setup.pool, "--cache", setup.cache, "--ledger", setup.ledger, *args],
        input=input,
        env=env or _env(server),
    )
    return SimpleNamespace(
        code=result.exit_code,
        records=[orjson.loads(line) for line in result.stdout_bytes.splitlines()],
        stderr=result.stderr_bytes.decode() + str(result.exception or ""),
    )


def _booked(setup) -> float:
    return sum(row["price"] for row in ledger.totals(setup.ledger))


def _all_longer(records: list[dict], count: int) -> bool:
    return len(records) == count and all(r["preference"] == _longer(r) for r in records)


def test_duplicate_replies_of_a_line_are_booked_and_a_conflict_is_not_taken(setup):
    pairs = _pairs(6)
    with BatchServer(outcomes=["duplicate"]) as server:
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        # the second, inverted reply never wins: the conflicting lines are asked again
        assert _all_longer(done.records, 6)
        assert "2 replies that disagree" in done.stderr
        assert server.calls["POST /v1/batches"] == 2
        assert _booked(setup) == pytest.approx(server.billed_price(*RATES), rel=1e-6)


def test_a_reply_to_a_line_never_sent_is_booked_with_a_warning(setup):
    pairs = _pairs(4)
    with BatchServer(outcomes=["unknown"]) as server:
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        assert "1 reply to a line it never held (farmkit-000000" in done.stderr
        assert _booked(setup) == pytest.approx(server.billed_price(*RATES), rel=1e-6)


def test_replies_without_usage_are_booked_at_their_worst_case(setup):
    pairs = _pairs(4)
    with BatchServer(outcomes=["no_usage"]) as server:
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        billed = server.billed_price(*RATES)
    assert billed > 0 and _booked(setup) >= billed
    assert all(r["provenance"]["farm-annotate"].get("tokens_estimated") for r in done.records)


def test_malformed_lines_are_booked_and_asked_again(setup):
    pairs = _pairs(8)
    with BatchServer(outcomes=["malformed"]) as server:
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 8)
        assert server.calls["POST /v1/batches"] == 2
        billed = server.billed_price(*RATES)
    assert "not a reply (not JSON)" in done.stderr
    # the cut lines at their worst case, the rest at their usage: at least what was billed
    assert _booked(setup) >= billed


@pytest.mark.parametrize(
    ("outcome", "listing"), [("gone", True), ("null_id", False), ("null_id", True)]
)
def test_a_batch_that_cannot_be_collected_is_failed_booked_and_its_questions_asked_again(
    setup, outcome, listing
):
    """An output file that is gone, a create reply without an id (where no listing finds the
    batch by its metadata: with one, the batch is adopted and collected)."""
    pairs = _pairs(4)
    with BatchServer(outcomes=[outcome], listing=listing) as server:
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        assert _pending(setup.cache) == 0
        lost = outcome == "gone" or not listing
        assert ("can no longer be collected" in done.stderr) == lost
        assert server.calls["POST /v1/batches"] == 1 + lost
        if lost:
            assert _booked(setup) >= server.billed_price(*RATES) > 0
        else:
            assert _booked(setup) == pytest.approx(server.billed_price(*RATES), rel=1e-6)
        # a rerun pays nothing more
        again = _annotate(setup, server, "--batch", input=pairs)
        assert again.code == 0 and server.calls["POST /v1/batches"] == 1 + lost


@pytest.mark.parametrize("outcome", ["bomb", "endless"])
def test_every_batch_reply_is_capped_decompressed_size_included(setup, outcome):
    pairs = _pairs(4)
    with BatchServer(outcomes=[outcome]) as server:
        done = _annotate(setup, server, "--batch", "--max-reply-bytes", str(2**20), input=pairs)
        assert done.code == 0, done.stderr
        assert "more than 1,048,576 bytes" in done.stderr
        assert _all_longer(done.records, 4)
        assert _booked(setup) >= server.billed_price(*RATES) > 0


@pytest.mark.parametrize("listing", [True, False])
def test_a_create_answered_with_a_bomb_is_found_or_given_up_never_sent_twice_silently(
    setup, listing
):
    pairs = _pairs(4)
    with BatchServer(outcomes=["bomb_create"], listing=listing) as server:
        done = _annotate(setup, server, "--batch", "--max-reply-bytes", str(2**20), input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        billed = server.billed_price(*RATES)
        if listing:  # found by its metadata, and collected
            assert server.calls["POST /v1/batches"] == 1
            assert _booked(setup) == pytest.approx(billed, rel=1e-6)
        else:  # it may have been made: booked at its worst case, its questions asked again
            assert "can no longer be collected" in done.stderr
            assert "more than 1,048,576 bytes" in done.stderr
            assert server.calls["POST /v1/batches"] == 2 and _booked(setup) >= billed > 0


@pytest.mark.parametrize("outcome", ["gone", "no_usage"])
def test_lines_recorded_without_their_worst_case_are_not_booked_at_0(setup, outcome):
    """Lines pending from before each line kept its worst case (farm-annotate's first --batch):
    a lost batch of them, or their replies without usage, are booked at the worst price recorded
    with the batch (shared among its lines), never at $0."""
    pairs = _pairs(4)
    with BatchServer(polls=1, outcomes=[outcome]) as server:
        assert _annotate(setup, server, "--batch", "submit", input=pairs).code == 0
        with sqlite3.connect(setup.cache) as db:  # the lines as that version wrote them
            for custom_id, spec in db.execute("SELECT custom_id, spec FROM batch_lines").fetchall():
                old = {k: v for k, v in orjson.loads(spec).items() if k not in ("worst", "request")}
                db.execute(
                    "UPDATE batch_lines SET spec = ? WHERE custom_id = ?",
                    (orjson.dumps(old), custom_id),
                )
            ((worst,),) = db.execute("SELECT worst FROM batches").fetchall()
            ((lines,),) = db.execute("SELECT count(*) FROM batch_lines").fetchall()
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        assert ("can no longer be collected" in done.stderr) == (outcome == "gone")
        billed = server.billed_price(*RATES)
    rows = [orjson.loads(line) for line in Path(setup.ledger).read_bytes().splitlines()]
    first = [row for row in rows if "collected" in row][0]  # booked as it was collected or given up
    # every line of it booked at its worst case
    assert worst > 0 and first["price"] == pytest.approx(worst, rel=1e-6), (first, worst)
    assert first["estimated"] == lines
    assert _booked(setup) >= billed > 0


def test_a_run_killed_after_create_without_a_batch_listing_is_not_stuck(setup):
    pairs = _pairs(4)
    with BatchServer(hang_create="after", listing=False) as server:
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
        server.hang_create = None
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        assert "can no longer be collected" in done.stderr
        # the batch the killed run created may be billed: booked at its worst case
        assert _booked(setup) > server.billed_price(*RATES) > 0


def test_a_weighted_judges_batch_without_logprobs_does_not_stick(setup):
    weighted = setup.tmp / "weighted.yaml"
    weighted.write_text(
        POOL.split("judges:")[0]
        + "judges:\n  - {name: w, backend: openai, model: gpt-4o-mini, prompt: weighted_choice, "
        "batch_size: 1, top_logprobs: 5}\n"
    )
    setup.pool = str(weighted)
    pairs = _pairs(3)
    with BatchServer() as server:
        first = _annotate(setup, server, "--batch", input=pairs)
        assert "no log-probabilities" in first.stderr
        assert _pending(setup.cache) == 0
        again = _annotate(setup, server, "--batch", input=pairs)
        assert "listing" not in again.stderr and _pending(setup.cache) == 0
        assert _booked(setup) == pytest.approx(server.billed_price(*RATES), rel=1e-6)
    for run in (first, again):
        assert run.code == 0, run.stderr
        assert [r["preference"] for r in run.records] == [None] * 3
        assert {r["preference_reason"] for r in run.records} == {
            f"{server.url} returned no log-probabilities for the verdict token (judge w asks for "
            "logprobs with top_logprobs: 5); use an endpoint that gives them (OpenAI, vLLM) or a "
            "pool whose judges parse the reply's text"
        }


@pytest.mark.heavy
def test_two_runs_collecting_one_batch_at_once_book_it_once(setup):
    pairs = _pairs(6)
    with BatchServer(content_barrier=2) as server:
        first = _annotate(setup, server, "--batch", "submit", input=pairs)
        assert first.code == 0 and _pending(setup.cache) == 6
        tool = Path(sys.executable).parent / "farm-annotate"
        command = [tool, "--pool", setup.pool, "--cache", setup.cache, "--batch", "submit"]
        (setup.tmp / "pairs.jsonl").write_bytes(pairs)
        runs = [
            subprocess.Popen(
                [*command, "--ledger", setup.ledger, str(setup.tmp / "pairs.jsonl")],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **_env(server)},
            )
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=60) for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs
        assert server.calls["GET /v1/files/{id}/content"] == 2  # both read it
        for stdout, _ in outputs:
            records = [orjson.loads(line) for line in stdout.splitlines()]
            assert _all_longer(records, 6)
        assert _booked(setup) == pytest.approx(server.billed_price(*RATES), rel=1e-6)


def test_a_collected_batch_is_booked_even_when_the_next_upload_fails(setup):
    with BatchServer() as server:
        assert _annotate(setup, server, "--batch", "submit", input=_pairs(4)).code == 0
        server.upload_faults = [500] * 3
        failed = _annotate(setup, server, "--batch", "submit", input=_pairs(8))
        assert failed.code == 1 and "nothing was submitted" in failed.stderr
        billed = server.billed_price(*RATES)
        assert billed > 0 and _booked(setup) == pytest.approx(billed, rel=1e-6)


def test_a_batch_is_known_by_what_was_asked_not_by_the_host_name(setup):
    pairs = _pairs(4)
    with BatchServer(polls=1) as server:
        env = _env(server)
        assert _annotate(setup, server, "--batch", "submit", input=pairs).code == 0
        other = {**env, "OPENAI_BASE_URL": env["OPENAI_BASE_URL"].replace("127.0.0.1", "localhost")}
        done = _annotate(setup, server, "--batch", input=pairs, env=other)
        assert done.code == 0, done.stderr
        assert _all_longer(done.records, 4)
        assert server.calls["POST /v1/batches"] == 1 and server.calls["POST /v1/files"] == 1
        assert set(server.answered.values()) == {1}


def test_the_summary_counts_only_questions_asked_directly(setup):
    with BatchServer(outcomes=["failed"] * 10) as server:
        done = _annotate(setup, server, "--batch", input=_pairs(2))
        assert done.code == 0, done.stderr
        assert server.direct == 0
    assert "0 asked directly" in done.stderr


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("gpt-4o-mini: {prompt: .nan, completion: 0.6}", "prompt .nan"),
        ("gpt-4o-mini: {prompt: 0.15, completion: -0.6}", "completion -0.6"),
        ("gpt-4o-mini: [0.15, .inf]", ".inf"),
    ],
)
def test_a_prices_file_with_a_price_that_is_not_a_price_is_a_usage_error(setup, entry, said):
    prices = setup.tmp / "prices.yaml"
    prices.write_text(f"# prices\n{entry}\n")
    with BatchServer() as server:
        for mode in (["--batch"], []):
            result = CliRunner().invoke(
                cli,
                ["--pool", setup.pool, "--cache", setup.cache, *mode, "--prices", str(prices)]
                + ["--max-cost", "0.00001"],
                input=_pairs(4),
                env=_env(server),
            )
            # the tools' entry point exits with the error's exit_code: 2, a usage error
            assert getattr(result.exception, "exit_code", 1) == 2, result.exception
            assert f"{prices}:2:" in str(result.exception) and said in str(result.exception)
        assert server.calls["POST /v1/files"] == 0 and server.direct == 0


def test_a_batch_reply_claiming_absurd_usage_is_booked_at_the_worst_case(setup, monkeypatch):
    pairs = _pairs(2)
    with BatchServer() as server:
        original = server.completion

        def absurd(body, inverted=False):
            reply = original(body, inverted)
            reply["usage"]["prompt_tokens"] = 1e30
            return reply

        monkeypatch.setattr(server, "completion", absurd)
        done = _annotate(setup, server, "--batch", input=pairs)
        assert done.code == 0, done.stderr
    booked = _booked(setup)
    assert 0 < booked < 1  # the worst case of a few short prompts, not $1e23
    assert "usage is not token counts" in done.stderr


def test_the_old_spelling_of_batch_and_a_bare_batch_before_an_input(setup):
    pairs_file = setup.tmp / "pairs.jsonl"
    pairs_file.write_bytes(_pairs(3))
    with BatchServer() as server:
        bare = _annotate(setup, server, "--batch", str(pairs_file), input=b"")
        assert bare.code == 0, bare.stderr
        assert _all_longer(bare.records, 3)
        pairs_file.write_bytes(_pairs(5))
        old = _annotate(setup, server, "--batch", "submit", str(pairs_file), input=b"")
        assert old.code == 0 and old.records == [] and _pending(setup.cache) == 2
        new = _annotate(
            setup, server, "--batch", "--batch-mode", "wait", str(pairs_file), input=b""
        )
        assert new.code == 0 and _all_longer(new.records, 5)
    assert KEY not in bare.stderr + old.stderr + new.stderr
