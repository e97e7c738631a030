"""The verdict cache (farmkit/annotate/cache.py) through farm-annotate against the local server in
tests/openai_server.py: rows checked as they are read, and replies that could not be read cached and
re-read, never paid for twice unless asked (--retry-failed) or the parser changed and still fails."""

from __future__ import annotations

import importlib.resources
import sqlite3
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_annotate import cli
from openai_server import OpenAIServer, judge_longer

KEY = "sk-cache-test-NOT-A-KEY-5e1b"
SETTINGS = (
    "settings: {timeout: 2.0, backoff: 0.01, max_retries: 2, concurrency: 4, parse_retries: 1}\n"
)
UNREADABLE = "I cannot decide; both have merit."


def _jsonl(records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _pairs(n: int) -> list[dict]:
    return [
        {
            "instruction": f"Question {i}?",
            "output_1": f"Answer {i}.",
            "output_2": f"Answer {i}, with more " + "detail " * (1 + i % 4),
        }
        for i in range(n)
    ]


def _pool(tmp_path: Path) -> str:
    text = (
        importlib.resources.files("farmkit.annotate").joinpath("pools", "single.yaml").read_text()
    )
    path = tmp_path / "single.yaml"
    path.write_text(text.replace("judges:", SETTINGS + "judges:", 1))
    return str(path)


def _run(server: OpenAIServer, *args: str, pairs: int = 4):
    result = CliRunner().invoke(
        cli,
        list(args),
        input=_jsonl(_pairs(pairs)),
        env={"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY},
        catch_exceptions=False,
    )
    return result, [orjson.loads(line) for line in result.stdout_bytes.splitlines()]


def _rows(cache: Path) -> dict[str, dict]:
    with sqlite3.connect(cache) as db:
        return {
            key: orjson.loads(value) for key, value in db.execute("SELECT key, value FROM verdicts")
        }


def _edit(cache: Path, key: str, value: bytes) -> None:
    with sqlite3.connect(cache) as db:
        db.execute("UPDATE verdicts SET value = ? WHERE key = ?", (value, key))


def _longer(record: dict) -> int:
    return 2 if len(record["output_2"]) > len(record["output_1"]) else 1


@pytest.mark.parametrize(
    "change",
    [
        {"soft": 9.5},
        {"choice": "C"},
        "{}",
        {"price": "free"},
        {"prompt_tokens": -3},
        {"probability": 2.0},
        "not json",
    ],
)
def test_a_bad_cache_row_is_asked_again_and_counted_with_the_cache_path(tmp_path, change):
    pool, cache = _pool(tmp_path), tmp_path / "c.sqlite"
    with OpenAIServer(respond=judge_longer) as server:
        first, _ = _run(server, "--pool", pool, "--cache", str(cache))
        assert first.exit_code == 0, first.stderr
        key, row = next(iter(_rows(cache).items()))
        value = change.encode() if isinstance(change, str) else orjson.dumps({**row, **change})
        _edit(cache, key, value)
        asked = server.outcomes["ok"]
        again, records = _run(server, "--pool", pool, "--cache", str(cache))
        assert server.outcomes["ok"] == asked + 1  # the bad row only
    assert again.exit_code == 0, again.stderr
    assert [r["preference"] for r in records] == [_longer(r) for r in records]
    assert f"1 cache row(s) in {cache} could not be read" in again.stderr
    assert _rows(cache)[key]["choice"] in ("A", "B")  # the row is repaired


def _unreadable_for(count: int):
    """A judge that cannot be read on the first `count` pairs (by their question), and prefers the
    longer answer on the others."""

    def respond(body: dict) -> str:
        text = body["messages"][-1]["content"]
        if any(f"Question {i}?" in text for i in range(count)):
            return UNREADABLE
        return judge_longer(body)

    return respond


def test_a_reply_that_could_not_be_read_is_cached_and_the_rerun_sends_nothing(tmp_path):
    pool, cache = _pool(tmp_path), tmp_path / "c.sqlite"
    with OpenAIServer(respond=_unreadable_for(2)) as server:
        first, records = _run(server, "--pool", pool, "--cache", str(cache))
        sent = sum(server.outcomes.values())
        assert sent == 2 * 2 + 2  # two unreadable pairs asked twice (parse_retries 1), two read
        again, rerun = _run(server, "--pool", pool, "--cache", str(cache))
        assert sum(server.outcomes.values()) == sent  # nothing paid twice
    assert first.exit_code == again.exit_code == 0
    assert [r["preference"] for r in rerun] == [None, None, 2, 2]
    assert rerun[0]["preference_reason"] == records[0]["preference_reason"]
    assert "0 requests" in again.stderr
    assert "2 pair(s) answered from cached failures" in again.stderr
    failures = [row for row in _rows(cache).values() if row["choice"] is None]
    assert len(failures) == 2
    assert all(row["raw"] == UNREADABLE and isinstance(row["parser"], int) for row in failures)


def test_retry_failed_asks_the_cached_failures_again(tmp_path):
    pool, cache = _pool(tmp_path), tmp_path / "c.sqlite"
    with OpenAIServer(respond=_unreadable_for(2)) as server:
        _run(server, "--pool", pool, "--cache", str(cache))
        sent = sum(server.outcomes.values())
        server.respond = judge_longer  # the judge now answers
        again, records = _run(server, "--pool", pool, "--cache", str(cache), "--retry-failed")
        assert sum(server.outcomes.values()) == sent + 2
    assert again.exit_code == 0, again.stderr
    assert [r["preference"] for r in records] == [_longer(r) for r in records]
    assert all(row["choice"] in ("A", "B") for row in _rows(cache).values())


def test_a_cached_failure_is_re_read_by_a_newer_parser_for_free(tmp_path, monkeypatch):
    from farmkit.annotate import parse

    pool, cache = _pool(tmp_path), tmp_path / "c.sqlite"
    with OpenAIServer(respond=_unreadable_for(2)) as server:
        _run(server, "--pool", pool, "--cache", str(cache))
        sent = sum(server.outcomes.values())
        # a newer parser that reads the reply: the cached failures become verdicts, without a request
        original = parse.parse_verdicts

        def reads_it(format, text, count, template=None):
            if text == UNREADABLE:
                return ["B"] * count, None
            return original(format, text, count, template)

        monkeypatch.setattr(parse, "parse_verdicts", reads_it)
        monkeypatch.setattr(parse, "PARSER_VERSION", parse.PARSER_VERSION + 1)
        again, records = _run(server, "--pool", pool, "--cache", str(cache))
        assert sum(server.outcomes.values()) == sent
    assert again.exit_code == 0, again.stderr
    assert [r["preference"] for r in records] == [2, 2, 2, 2]
    assert all(row["choice"] in ("A", "B") for row in _rows(cache).values())  # upgraded


def test_a_newer_parser_that_still_cannot_read_it_asks_again(tmp_path, monkeypatch):
    from farmkit.annotate import parse

    pool, cache = _pool(tmp_path), tmp_path / "c.sqlite"
    with OpenAIServer(respond=_unreadable_for(2)) as server:
        _run(server, "--pool", pool, "--cache", str(cache))
        sent = sum(server.outcomes.values())
        monkeypatch.setattr(parse, "PARSER_VERSION", parse.PARSER_VERSION + 1)
        again, _ = _run(server, "--pool", pool, "--cache", str(cache))
        assert (
            sum(server.outcomes.values()) == sent + 2 * 2
        )  # both pairs, each with its parse retry
        # asked under the new parser: the next run reads the failures from the cache again
        third, _ = _run(server, "--pool", pool, "--cache", str(cache))
        assert sum(server.outcomes.values()) == sent + 2 * 2
    assert again.exit_code == third.exit_code == 0


def test_a_transport_failure_is_not_cached(tmp_path):
    pool, cache = _pool(tmp_path), tmp_path / "c.sqlite"
    with OpenAIServer(respond=judge_longer, script=["500"] * 3) as server:
        first, records = _run(server, "--pool", pool, "--cache", str(cache), "--concurrency", "1")
        assert records[0]["preference"] is None
        again, rerun = _run(server, "--pool", pool, "--cache", str(cache))
    assert first.exit_code == again.exit_code == 0
    assert rerun[0]["preference"] == _longer(rerun[0])
    assert "cached failures" not in again.stderr
