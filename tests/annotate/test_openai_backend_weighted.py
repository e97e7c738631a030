"""Logprob-weighted verdicts: an openai judge whose pool asks `top_logprobs` turns the verdict token's
log-probabilities into a fractional preference (1 + P(output_2 better)). End to end against the
loopback server (tests/openai_server.py) returning logprobs: the fractions, the cache, the cost, and
the error an endpoint without logprobs gets."""

from __future__ import annotations

import importlib.resources
import math
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool
from farmkit.tools.farm_annotate import cli
from openai_server import OpenAIServer, weigh_longer

KEY = "sk-test-loopback-4d1e0b77"
FAST = "settings: {timeout: 2.0, backoff: 0.02, max_retries: 3, concurrency: 4}\n"
PRICE = (10.0, 30.0)  # gpt-4-1106-preview, USD per million tokens


def _jsonl(records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _records(stdout: bytes) -> list[dict]:
    return [orjson.loads(line) for line in stdout.splitlines()]


def _pairs(n: int) -> list[dict]:
    """Pairs of answers of different lengths, the longer on either side."""
    pairs = []
    for i in range(n):
        short, long = f"Yes ({i}).", f"Yes ({i}), because " + "it holds " * (1 + i % 5) + "always."
        first, second = (short, long) if i % 2 else (long, short)
        pairs.append({"instruction": f"Is {i} a number?", "output_1": first, "output_2": second})
    return pairs


def _expected(record: dict) -> float:
    """What weigh_longer's distribution means for the pair as given: 1 + P(output_2 better)."""
    one, two = len(record["output_1"]), len(record["output_2"])
    return 1 + two / (one + two)


def _pool(tmp_path: Path) -> str:
    text = (
        importlib.resources.files("farmkit.annotate")
        .joinpath("pools", "weighted_gpt4_turbo.yaml")
        .read_text()
    )
    path = tmp_path / "weighted.yaml"
    path.write_text(text.replace("judges:", FAST + "judges:", 1))
    return str(path)


def _env(server: OpenAIServer) -> dict:
    return {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY}


def _annotate(*args: str, input: bytes, env: dict) -> SimpleNamespace:
    result = CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)
    return SimpleNamespace(
        returncode=result.exit_code, stdout=result.stdout_bytes, stderr=result.stderr_bytes
    )


def _pick(body: dict) -> str:
    """The reply text: the likelier verdict token."""
    distribution = weigh_longer(body)
    return "B" if distribution["B"] > distribution["A"] else "A"


def test_weighted_judge_gives_fractions_caches_them_and_counts_their_cost(tmp_path):
    pool, cache, pairs = _pool(tmp_path), str(tmp_path / "c.sqlite"), _pairs(12)
    with OpenAIServer(respond=_pick, top_logprobs=weigh_longer) as server:
        first = _annotate("--pool", pool, "--cache", cache, input=_jsonl(pairs), env=_env(server))
        asked = sum(server.outcomes.values())
        second = _annotate("--pool", pool, "--cache", cache, input=_jsonl(pairs), env=_env(server))
        assert sum(server.outcomes.values()) == asked  # the re-run asked nothing
    assert first.returncode == 0, first.stderr.decode()
    assert second.returncode == 0, second.stderr.decode()
    records = _records(first.stdout)
    assert [r["instruction"] for r in records] == [p["instruction"] for p in pairs]
    # fractions, not hard labels: P(output_2 better) among the two verdict tokens, order undone
    for record in records:
        assert record["preference"] == pytest.approx(_expected(record), abs=1e-6)
        assert 1 < record["preference"] < 2 and record["preference"] != 1.5
    # every request asked for the first token's log-probabilities, one pair at a time
    assert asked == len(pairs) == len(server.bodies)
    for body in server.bodies:
        assert body["logprobs"] is True and body["top_logprobs"] == 5
        assert body["max_tokens"] == 1 and body["model"] == "gpt-4-1106-preview"
    # both orders were shown (the order is randomized per item) and undone
    orders = {r["provenance"]["farm-annotate"]["order_shown"] for r in records}
    assert orders == {"1,2", "2,1"}
    # the cache holds the fraction: the re-run gives the same preferences from it
    again = _records(second.stdout)
    assert [r["preference"] for r in again] == [r["preference"] for r in records]
    assert b"12 cache hits" in second.stderr and b"0 requests" in second.stderr
    with sqlite3.connect(cache) as db:
        assert db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == len(pairs)
    # cost as for any call: each record is priced at what the server billed for its request
    billed = sum(p * PRICE[0] + c * PRICE[1] for p, c in server.billed) / 1e6
    spent = sum(r["provenance"]["farm-annotate"]["price"] for r in records)
    assert billed > 0 and spent == pytest.approx(billed, rel=1e-6)
    assert all(r["provenance"]["farm-annotate"]["completion_tokens"] == 1 for r in records)
    assert KEY.encode() not in first.stdout + first.stderr + Path(cache).read_bytes()


def test_an_endpoint_that_returns_no_logprobs_stops_the_run_with_a_clear_error(tmp_path):
    with OpenAIServer(respond=_pick) as server:  # ignores `logprobs`: no log-probabilities
        result = run_tool(
            "farm-annotate",
            "--pool",
            _pool(tmp_path),
            "--no-cache",
            input=_jsonl(_pairs(6)),
            env=_env(server),
        )
    stderr = result.stderr.decode()
    assert result.returncode == 1 and result.stdout == b"", stderr
    assert "returned no log-probabilities" in stderr and "top_logprobs" in stderr
    assert "Traceback" not in stderr and KEY not in stderr
    assert sum(server.outcomes.values()) <= 4  # the requests in flight, then it stopped


def _top(*entries: tuple[str, float]) -> dict:
    """`choices[0].logprobs` with one position whose top tokens are `entries` (token, probability)."""
    top = [{"token": t, "logprob": math.log(p) if p else -9999.0} for t, p in entries]
    return {
        "content": [{"token": entries[0][0], "logprob": top[0]["logprob"], "top_logprobs": top}]
    }


@pytest.mark.parametrize(
    ("logprobs", "soft"),
    [
        (_top(("A", 0.6), ("B", 0.2), ("The", 0.2)), 0.25),
        (_top((" B", 0.5), ("B", 0.25), ("A", 0.25)), 0.75),  # spellings of one verdict add up
        (_top(("A", 0.9), ("Sure", 0.1)), 0.0),  # B below the listed ones: no mass
        (_top(("B", 0.5), ("A", 0.5)), 0.5),
    ],
)
def test_the_fraction_is_the_share_of_the_second_verdict_token(logprobs, soft):
    from farmkit.annotate.openai_backend import weighted_verdict

    verdict = weighted_verdict(logprobs)
    assert verdict.soft == pytest.approx(soft)
    assert verdict.probability == pytest.approx(1 - soft)
    assert verdict.choice == ("tie" if soft == 0.5 else "B" if soft > 0.5 else "A")


@pytest.mark.parametrize(
    "logprobs",
    [None, {"content": None}, {"content": []}, {"content": [{"token": "A"}]}, "garbage"],
)
def test_no_log_probabilities_in_a_reply_is_an_error_not_a_hard_label(logprobs):
    from farmkit.annotate.base import FatalBackendError
    from farmkit.annotate.openai_backend import weighted_verdict

    with pytest.raises(FatalBackendError, match="no log-probabilities"):
        weighted_verdict(logprobs)


def test_neither_verdict_token_among_the_top_ones_is_no_verdict():
    from farmkit.annotate.openai_backend import weighted_verdict

    verdict = weighted_verdict(_top(("I", 0.7), ("The", 0.3)))
    assert verdict.choice is None and "neither verdict token" in verdict.reason


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_size": 2}, "batch_size 1"),
        ({"prompt": "plain"}, "choice"),
        ({"top_logprobs": 21}, "between 1 and 20"),
    ],
)
def test_a_weighted_judge_that_cannot_work_is_refused_when_the_pool_loads(
    tmp_path, change, message
):
    import yaml

    from farmkit.annotate.pools import load_pool
    from farmkit.core.io import FarmError

    judge = {
        "name": "w",
        "backend": "openai",
        "model": "m",
        "prompt": "weighted_choice",
        "top_logprobs": 5,
        "max_tokens": 1,
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "judges": [{**judge, **change}]}))
    with pytest.raises(FarmError, match=message):
        load_pool(str(path))


def test_judges_without_top_logprobs_keep_their_cache_keys():
    from farmkit.annotate.pools import load_pool

    pool = load_pool("single")
    assert "top_logprobs" not in pool.judges[0].key_fields()
    weighted = load_pool("weighted_gpt4_turbo")
    assert weighted.judges[0].key_fields()["top_logprobs"] == 5


def test_both_orders_averages_the_two_fractions(tmp_path):
    pairs = _pairs(4)
    with OpenAIServer(respond=_pick, top_logprobs=weigh_longer) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path),
            "--no-cache",
            "--both-orders",
            input=_jsonl(pairs),
            env=_env(server),
        )
    assert result.returncode == 0, result.stderr.decode()
    assert len(server.bodies) == 2 * len(pairs)
    for record in _records(result.stdout):
        assert record["provenance"]["farm-annotate"]["order_shown"] == "both"
        assert record["preference"] == pytest.approx(_expected(record), abs=1e-6)


def test_a_key_the_endpoint_echoes_as_a_token_is_not_in_the_records(tmp_path):
    def echoes_the_key(body: dict) -> dict[str, float]:
        return {KEY: 0.6, "Sure": 0.4}  # neither letter: no verdict, its reason quoting the tokens

    with OpenAIServer(respond=lambda body: "Sure", top_logprobs=echoes_the_key) as server:
        result = _annotate(
            "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(_pairs(2)), env=_env(server)
        )
    assert result.returncode == 0, result.stderr.decode()
    records = _records(result.stdout)
    assert [r["preference"] for r in records] == [None, None]
    assert all("neither verdict token" in r["preference_reason"] for r in records)
    assert KEY.encode() not in result.stdout + result.stderr


@pytest.mark.parametrize("logprob", [1000.0, 0.5, float("inf"), float("nan")])
def test_a_log_probability_above_zero_is_no_verdict_not_a_crash(logprob):
    """A log-probability is at most 0: 1000 ended the run with an OverflowError (issue 44)."""
    from farmkit.annotate.openai_backend import weighted_verdict

    logprobs = _top(("A", 0.5), ("B", 0.4))
    logprobs["content"][0]["top_logprobs"][1]["logprob"] = logprob
    verdict = weighted_verdict(logprobs)
    assert verdict.choice is None and verdict.soft is None
    assert f"'B' has log-probability {logprob}" in verdict.reason
    assert "a log-probability is at most 0" in verdict.reason


def test_a_reply_with_a_log_probability_of_1000_is_a_pair_without_a_verdict(tmp_path, monkeypatch):
    import openai_server

    listed = openai_server._logprobs

    def absurd(distribution, text, top):
        logprobs = listed(distribution, text, top)
        for entry in logprobs["content"][0]["top_logprobs"]:
            if entry["token"] == "B":
                entry["logprob"] = 1000.0
        return logprobs

    monkeypatch.setattr(openai_server, "_logprobs", absurd)
    pairs = _pairs(4)
    with OpenAIServer(respond=_pick, top_logprobs=weigh_longer) as server:
        result = _annotate(
            "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(pairs), env=_env(server)
        )
    assert result.returncode == 0, result.stderr.decode()
    records = _records(result.stdout)
    assert [r["instruction"] for r in records] == [p["instruction"] for p in pairs]
    for record in records:
        assert record["preference"] is None
        assert "'B' has log-probability 1000.0" in record["preference_reason"]
