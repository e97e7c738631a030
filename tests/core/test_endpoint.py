"""The endpoint client (farmkit/core/endpoint.py) through both of its users, farm-annotate's `openai` judges
and farm-sample's `openai` backend, against the real local server in tests/openai_server.py:
malformed 200 replies, errors that retrying cannot fix, keys echoed in part, usage of every attempt."""

from __future__ import annotations

import importlib.resources
import json
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool
from farmkit.tools.farm_annotate import cli as annotate_cli
from farmkit.tools.farm_sample import cli as sample_cli
from openai_server import (
    MALFORMED,
    OpenAIServer,
    count_tokens,
    echo,
    judge_longer,
    secret_forms,
    shown_pairs,
)

from farmkit.core.endpoint import redact
from farmkit.lm.tokens import estimate_tokens

KEY = "AUDITKEY-zz91-MARKER-77c4e1"
FAST = "settings: {timeout: 2.0, backoff: 0.01, max_retries: 8, concurrency: 8}\n"
BIN = Path(sys.executable).parent


def _jsonl(records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _pairs(n: int) -> list[dict]:
    return [
        {
            "instruction": f"Question {i}?",
            "output_1": f"Answer {i}.",
            "output_2": f"Answer {i}, " + "longer " * (1 + i % 5),
        }
        for i in range(n)
    ]


def _pool(tmp_path: Path, source: str = "single", settings: str = FAST) -> str:
    text = (
        importlib.resources.files("farmkit.annotate")
        .joinpath("pools", f"{source}.yaml")
        .read_text()
    )
    path = tmp_path / f"{source}.yaml"
    path.write_text(text.replace("judges:", settings + "judges:", 1))
    return str(path)


def _env(server: OpenAIServer, key: str = KEY) -> dict:
    return {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": key}


def _annotate(*args: str, input: bytes, env: dict):
    return CliRunner().invoke(
        annotate_cli, list(args), input=input, env=env, catch_exceptions=False
    )


def _prompts(tmp_path: Path, n: int) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(_jsonl({"instruction": f"Say {i}.", "id": str(i)} for i in range(n)))
    return str(path)


def _free_port() -> int:
    with socket.socket() as probe:  # bound, never listening: connections are refused
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_reply_to_a_judge_is_retried_not_a_crash(tmp_path, kind):
    pairs = _pairs(6)
    with OpenAIServer(respond=judge_longer, script=[kind]) as server:
        result = _annotate(
            "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(pairs), env=_env(server)
        )
    assert result.exit_code == 0, result.output
    records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    assert [r["preference"] for r in records] == [2] * 6  # the longer answer, once retried
    assert server.outcomes[kind] == 1 and server.outcomes["ok"] == 6


def test_a_judge_whose_replies_are_all_malformed_gets_a_null_verdict_with_the_reason(tmp_path):
    settings = "settings: {backoff: 0.01, max_retries: 2}\n"
    with OpenAIServer(respond=judge_longer, script=["plain"] * 3) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, settings=settings),
            "--no-cache",
            "--concurrency",
            "1",
            input=_jsonl(_pairs(2)),
            env=_env(server),
        )
    assert result.exit_code == 0, result.output
    first, second = (orjson.loads(line) for line in result.stdout_bytes.splitlines())
    assert first["preference"] is None and "malformed reply" in first["preference_reason"]
    assert second["preference"] == 2


@pytest.mark.parametrize("template", ["chat", "alpaca"])
@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_reply_to_farm_sample_is_retried_not_a_crash(tmp_path, kind, template):
    with OpenAIServer(script=[kind]) as server:
        result = CliRunner().invoke(
            sample_cli,
            [
                "m",
                _prompts(tmp_path, 3),
                "--backend",
                "openai",
                "-n",
                "1",
                "-q",
                "--template",
                template,
            ],
            env=_env(server),
        )
    assert result.exit_code == 0, (result.output, result.exception)
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in records] == ["0", "1", "2"] and all(
        r["output"].startswith("Reply to: ") for r in records
    )
    assert server.outcomes[kind] == 1 and server.outcomes["ok"] == 3
    assert all(("prompt" in body) == (template == "alpaca") for body in server.bodies)


def test_a_mixed_run_of_transient_faults_and_malformed_replies_loses_and_duplicates_nothing(
    tmp_path,
):
    faults = {
        "429": 0.05,
        "500": 0.05,
        "drop": 0.05,
        "garbage": 0.03,
        **{kind: 0.024 for kind in MALFORMED},
    }
    pairs = _pairs(80)
    script = [
        *MALFORMED,
        "429",
        "500",
        "drop",
        "garbage",
    ]  # each met at least once, then random draws
    with OpenAIServer(respond=judge_longer, faults=faults, seed=3, script=script) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, source="sim_eval"),
            "--no-cache",
            input=_jsonl(pairs),
            env=_env(server),
        )
    assert result.exit_code == 0, result.output
    assert all(server.outcomes[kind] > 0 for kind in faults), server.outcomes
    records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    assert [r["instruction"] for r in records] == [p["instruction"] for p in pairs]
    assert [r["preference"] for r in records] == [2] * len(pairs)
    answered = Counter(frozenset(pair) for body in server.bodies for pair in shown_pairs(body)[1])
    assert sorted(answered.values()) == [1] * len(pairs)


@pytest.mark.heavy
def test_farm_sample_through_transient_faults_and_malformed_replies_loses_and_duplicates_nothing(
    tmp_path,
):
    faults = {"429": 0.1, "500": 0.05, "drop": 0.05, **{kind: 0.02 for kind in MALFORMED}}
    with OpenAIServer(faults=faults, seed=4, script=["500", "plain"]) as server:
        result = CliRunner().invoke(
            sample_cli,
            ["m", _prompts(tmp_path, 12), "--backend", "openai", "-n", "2", "-q"],
            env=_env(server),
        )
    assert result.exit_code == 0, (result.output, result.exception)
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["id"], r["sample_index"]) for r in records] == [
        (str(i), k) for i in range(12) for k in (0, 1)
    ]
    assert server.outcomes["ok"] == 24  # one delivered reply per sample


@pytest.mark.parametrize("tool", ["farm-annotate", "farm-sample"])
def test_a_refused_connection_stops_at_once_without_retrying(tmp_path, tool):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    if tool == "farm-annotate":
        # backoff long enough that a single retry would outlast the subprocess timeout
        pool = _pool(tmp_path, settings="settings: {backoff: 500, max_retries: 6}\n")
        command = [str(BIN / tool), "--pool", pool, "--no-cache"]
        stdin = _jsonl(_pairs(5))
    else:
        command, stdin = (
            [str(BIN / tool), "m", _prompts(tmp_path, 3), "--backend", "openai", "-q"],
            b"",
        )
    result = subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OPENAI_BASE_URL": url, "OPENAI_API_KEY": KEY},
    )
    assert result.returncode == 1 and result.stdout == b""
    assert f"cannot connect to {url}".encode() in result.stderr, result.stderr.decode()[-500:]


def test_farm_sample_stops_at_once_on_a_key_the_endpoint_rejects(tmp_path):
    with OpenAIServer(api_key="the-right-key-123456") as server:
        result = CliRunner().invoke(
            sample_cli,
            ["m", _prompts(tmp_path, 6), "--backend", "openai", "-n", "1", "--concurrency", "1"],
            env=_env(server),
        )
    assert result.exit_code == 1 and "HTTP 401" in str(result.exception)
    assert server.outcomes["401"] == 1  # no retries, nothing more sent


def test_a_key_echoed_in_part_by_the_endpoint_is_redacted_everywhere(tmp_path):
    with OpenAIServer(respond=judge_longer, script=["400"]) as server:
        result = _annotate(
            "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(_pairs(3)), env=_env(server)
        )
    reasons = [
        orjson.loads(line).get("preference_reason") or ""
        for line in result.stdout_bytes.splitlines()
    ]
    assert sum("HTTP 400" in reason for reason in reasons) == 1
    with OpenAIServer(respond=judge_longer, api_key="another-key") as server:
        refused = subprocess.run(
            [str(BIN / "farm-annotate"), "--pool", _pool(tmp_path), "--no-cache"],
            input=_jsonl(_pairs(3)),
            capture_output=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", **_env(server)},
        )
        sampled = CliRunner().invoke(
            sample_cli, ["m", _prompts(tmp_path, 2), "--backend", "openai"], env=_env(server)
        )
    assert refused.returncode == 1 and b"HTTP 401" in refused.stderr
    for text in (result.output, refused.stderr.decode(), str(sampled.exception) + sampled.output):
        assert "AUDITKEY-zz91" not in text and "MARKER" not in text, text


def test_redact_blanks_fragments_of_the_key_and_common_key_shapes():
    assert redact("bad key AUDITKEY-zz91-MARKE*** here", KEY) == "bad key ****** here"
    assert redact("suffix 91-MARKER-77c4e1.", KEY) == "suffix ***."
    assert redact("sk-proj-abcdef123456 and Bearer xyz.123", KEY) == "*** and ***"
    assert (
        redact("Incorrect model AUDIT", KEY) == "Incorrect model AUDIT"
    )  # too short to be the key's


PASSWORD = "PaSsW0rd-TOPSECRET"
QUERY_SECRET = "QuErY-5ecret-4d1f9e"


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_secrets_a_gateway_echoes_reach_no_record_cache_nor_stderr(tmp_path, auth):
    # the gateway quotes the whole request (Authorization header, URL with its query, body) in its
    # 400 errors and in replies no parser reads (kept as `raw`, in records and in the cache)
    script = ["400", "garbage", "garbage", "garbage"]
    with OpenAIServer(respond=judge_longer, echo_request=True, script=script) as server:
        userinfo = f"alice:{PASSWORD}@" if auth == "basic" else ""
        host = server.url.removeprefix("http://")
        url = f"http://{userinfo}{host}?api-version=2024-06-01&api-key={QUERY_SECRET}"
        key = KEY if auth == "bearer" else ""
        cache = tmp_path / "cache.sqlite"
        done = run_tool(
            "farm-annotate",
            *("--pool", _pool(tmp_path, settings=FAST.replace("concurrency: 8", "concurrency: 1"))),
            *("--cache", str(cache), "-v"),
            input=_jsonl(_pairs(4)),
            env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": key},
        )
    assert done.returncode == 0, done.stderr.decode()
    records = [orjson.loads(line) for line in done.stdout.splitlines()]
    reasons = [r.get("preference_reason") or "" for r in records]
    assert sum("HTTP 400" in reason and "credentials ***" in reason for reason in reasons) == 1
    assert sum("raw" in r["provenance"]["farm-annotate"] for r in records) == 1, reasons
    assert sum(r["preference"] is not None for r in records) == 2
    written = {"records": done.stdout, "stderr": done.stderr}
    written.update({path.name: path.read_bytes() for path in tmp_path.glob("cache.sqlite*")})
    forms = secret_forms(PASSWORD, user="alice") + secret_forms(QUERY_SECRET, KEY)
    for name, content in written.items():
        text = content.decode("utf-8", "replace")
        assert not [form for form in forms if form in text], (name, text[-2000:])
        assert "TOPSECRET" not in text and "5ecret" not in text and "MARKER" not in text, name


@pytest.mark.parametrize("way", ["chunked", "proxy"])
def test_chunked_replies_and_a_proxy_are_understood(tmp_path, way):
    with OpenAIServer(
        respond=judge_longer, chunked=way == "chunked", script=["plain", "500"]
    ) as server:
        # the server stands in for the proxy: it answers requests in a proxy's absolute form too
        proxy = (
            {"HTTP_PROXY": server.url.removesuffix("/v1"), "NO_PROXY": "", "no_proxy": ""}
            if way == "proxy"
            else {}
        )
        result = _annotate(
            "--pool",
            _pool(tmp_path),
            "--no-cache",
            input=_jsonl(_pairs(5)),
            env={**_env(server), **proxy},
        )
    assert result.exit_code == 0, result.output
    assert [orjson.loads(line)["preference"] for line in result.stdout_bytes.splitlines()] == [
        2
    ] * 5
    assert server.outcomes["ok"] == 5 and server.outcomes["plain"] == server.outcomes["500"] == 1
    assert server.outcomes["proxied"] == (7 if way == "proxy" else 0)


def test_usage_of_every_attempt_is_counted_in_the_verdict(tmp_path):
    # null_choice replies report 10 prompt and 4 completion tokens: billed, though they carry no verdict
    with OpenAIServer(respond=judge_longer, script=["null_choice"]) as server:
        result = _annotate(
            "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(_pairs(1)), env=_env(server)
        )
    assert result.exit_code == 0, result.output
    details = orjson.loads(result.stdout_bytes)["provenance"]["farm-annotate"]
    delivered = server.bodies[0]
    assert details["prompt_tokens"] == 10 + sum(
        count_tokens(m["content"]) for m in delivered["messages"]
    )
    assert details["completion_tokens"] == 4 + count_tokens("Pair 1: B")


def _prices(tmp_path: Path) -> str:
    # a dollar per completion token and prompts free, so prices are exact small numbers
    path = tmp_path / "prices.yaml"
    path.write_text("gpt-4.1: {prompt: 0.0, completion: 1000000.0}\n")
    return str(path)


def test_a_request_that_fails_for_good_is_priced_for_what_its_attempts_were_billed(tmp_path):
    # every reply malformed (null_choice reports 4 completion tokens): three billed attempts, no verdict
    settings = "settings: {backoff: 0.01, max_retries: 2}\n"
    with OpenAIServer(respond=judge_longer, script=["null_choice"] * 3) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, settings=settings),
            "--no-cache",
            "--prices",
            _prices(tmp_path),
            input=_jsonl(_pairs(1)),
            env=_env(server),
        )
    assert result.exit_code == 0, result.output
    record = orjson.loads(result.stdout_bytes)
    details = record["provenance"]["farm-annotate"]
    assert record["preference"] is None and "malformed reply" in record["preference_reason"]
    assert details["prompt_tokens"] == 3 * 10 and details["completion_tokens"] == 3 * 4
    assert details["price"] == 3 * 4.0
    assert "$12.0000" in result.stderr  # the run's spend, which --max-cost counts against


def test_a_reply_that_could_not_be_parsed_is_priced_when_the_retry_then_fails(tmp_path):
    # a 200 whose text holds no verdict (billed), then the retry meets server errors until it gives up
    settings = "settings: {backoff: 0.01, max_retries: 2, parse_retries: 2}\n"
    garbage = "I am not able to compare these two answers."
    with OpenAIServer(respond=judge_longer, script=["garbage", "500", "500", "500"]) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, settings=settings),
            "--no-cache",
            "--prices",
            _prices(tmp_path),
            input=_jsonl(_pairs(1)),
            env=_env(server),
        )
        assert server.outcomes == {"garbage": 1, "500": 3}
    assert result.exit_code == 0, result.output
    record = orjson.loads(result.stdout_bytes)
    details = record["provenance"]["farm-annotate"]
    assert record["preference"] is None and "HTTP 500" in record["preference_reason"]
    assert details["completion_tokens"] == count_tokens(garbage) > 0
    assert details["prompt_tokens"] > 0 and details["price"] == float(count_tokens(garbage))


def test_max_cost_counts_what_failed_requests_were_billed(tmp_path):
    # ten pairs, every reply malformed: each pair's request is billed 4 attempts x 4 tokens = $16 and
    # fails. Expected $8 a pair (the plain format's estimate), so $100 passes the pre-flight check;
    # each attempt holds its worst case, $20 (max_tokens), on top of what was billed: five requests
    # pay $80, the sixth is billed $4 and its retry ($4 + $20 more) no longer fits: $84
    settings = "settings: {backoff: 0.01, max_retries: 3, concurrency: 1}\n"
    with OpenAIServer(respond=judge_longer, faults={"null_choice": 1.0}) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, settings=settings),
            "--no-cache",
            "--prices",
            _prices(tmp_path),
            "--max-cost",
            "100",
            input=_jsonl(_pairs(10)),
            env=_env(server),
        )
        billed = 4.0 * server.outcomes["null_choice"]
    assert result.exit_code == 0, result.output
    records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    spent = sum(r["provenance"]["farm-annotate"].get("price", 0.0) for r in records)
    assert spent == billed <= 100
    unasked = [r for r in records if "max-cost" in (r.get("preference_reason") or "")]
    assert billed == 84 and len(unasked) == 5
    assert sum("not retried" in r["preference_reason"] for r in unasked) == 1


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (made with the openssl command)."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.parametrize("tool", ["farm-annotate", "farm-sample"])
def test_a_tls_error_in_the_middle_of_a_reply_is_a_dropped_connection_retried(
    tmp_path, certificate, tool
):
    # ssl.SSLError is an OSError, not a ConnectionError: it must be retried like any dropped connection
    respond = judge_longer if tool == "farm-annotate" else None
    kwargs = {"respond": respond} if respond else {}
    with OpenAIServer(tls=certificate, script=["tls_garbage"], **kwargs) as server:
        env = {**_env(server), "SSL_CERT_FILE": certificate[0]}
        if tool == "farm-annotate":
            result = _annotate(
                "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(_pairs(4)), env=env
            )
        else:
            result = CliRunner().invoke(
                sample_cli,
                ["m", _prompts(tmp_path, 4), "--backend", "openai", "-n", "1", "-q"],
                env=env,
            )
    assert result.exit_code == 0, (result.output, result.exception)
    records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    assert len(records) == 4
    if tool == "farm-annotate":
        assert [r["preference"] for r in records] == [2] * 4
    assert server.outcomes == {"tls_garbage": 1, "ok": 4}


@pytest.mark.parametrize("tool", ["farm-annotate", "farm-sample"])
def test_usage_counts_that_are_null_or_fractional_do_not_reject_the_reply(tmp_path, tool):
    # a well-formed reply with odd token counts is an answer, not a fault: no retry; a null count
    # is estimated, a fractional one rounded
    respond = judge_longer if tool == "farm-annotate" else echo
    with OpenAIServer(respond=respond, script=["null_usage", "float_usage"]) as server:
        if tool == "farm-annotate":
            result = _annotate(
                "--pool",
                _pool(tmp_path),
                "--no-cache",
                "--concurrency",
                "1",
                input=_jsonl(_pairs(2)),
                env=_env(server),
            )
            records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
            assert [r["preference"] for r in records] == [2, 2]
        else:
            result = CliRunner().invoke(
                sample_cli,
                [
                    "m",
                    _prompts(tmp_path, 2),
                    "--backend",
                    "openai",
                    "-n",
                    "1",
                    "--concurrency",
                    "1",
                ],
                env=_env(server),
            )
            records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
            assert [r["output"] for r in records] == ["Reply to: Say 0.", "Reply to: Say 1."]
    assert result.exit_code == 0, (result.output, result.exception)
    assert server.outcomes == {"null_usage": 1, "float_usage": 1}  # nothing asked twice
    if tool == "farm-annotate":
        estimated, rounded = (r["provenance"]["farm-annotate"] for r in records)
        assert estimated["prompt_tokens"] > 0 and estimated["completion_tokens"] > 0
        assert (rounded["prompt_tokens"], rounded["completion_tokens"]) == server.billed[1]
    else:  # the summary's completion tokens: the first reply's estimated, the second's rounded
        expected = estimate_tokens("Reply to: Say 0.") + server.billed[1][1]
        assert f" {expected} tokens in " in result.stderr, result.stderr


@pytest.fixture
def blackhole():
    """The URL of a listening socket whose backlog is full: connections to it are never accepted
    (the SYN is dropped), as with a firewalled or blackholed host."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    filler = socket.create_connection(address)  # takes the one place in the backlog
    probe = socket.socket()
    probe.settimeout(0.3)
    try:
        probe.connect(address)
        hangs = False
    except TimeoutError:
        hangs = True
    finally:
        probe.close()
    try:
        if not hangs:
            pytest.skip("this system answers connections to a full backlog")
        yield f"http://127.0.0.1:{address[1]}/v1"
    finally:
        filler.close()
        listener.close()


def test_a_connect_timeout_before_the_endpoint_ever_answered_stops_at_once(blackhole):
    import asyncio

    from farmkit.core.endpoint import EndpointClient, EndpointFailed, EndpointFatal

    async def ask(answered_before: bool):
        client = EndpointClient(blackhole, KEY, timeout=0.5, max_retries=3, backoff=0.01)
        if answered_before:  # the endpoint answered earlier in the run: a passing fault, retried
            client.stats["answered"] = 1
        try:
            await client.complete({"model": "m", "messages": []})
        finally:
            await client.close()
        return client.stats

    with pytest.raises(EndpointFatal, match="cannot connect to .* within 0.5 s") as fatal:
        asyncio.run(ask(answered_before=False))
    assert KEY not in str(fatal.value)
    with pytest.raises(EndpointFailed, match=r"after 4 attempts"):
        asyncio.run(ask(answered_before=True))


def test_farm_annotate_stops_at_once_on_an_endpoint_that_never_accepts(tmp_path, blackhole):
    # retrying would take max_retries x timeout per pair (a minute and more at the defaults)
    pool = _pool(tmp_path, settings="settings: {timeout: 0.5, backoff: 0.01, max_retries: 6}\n")
    result = CliRunner().invoke(
        annotate_cli,
        ["--pool", pool, "--no-cache"],
        input=_jsonl(_pairs(3)),
        env={"OPENAI_BASE_URL": blackhole, "OPENAI_API_KEY": KEY},
    )
    assert result.exit_code == 1 and result.stdout_bytes == b""
    assert f"cannot connect to {blackhole} (no connection within 0.5 s)" in str(result.exception)


@pytest.mark.parametrize("chunked", [False, True])
def test_an_unrequested_extra_reply_is_never_read_as_the_answer_to_the_next_request(
    tmp_path, chunked
):
    # a server that, on some kept-alive connections, sends a second reply nobody asked for: a client
    # that reuses the connection without looking for unread bytes reads it as its next answer, and
    # every later answer on that connection is the one before
    pairs = _pairs(120)
    settings = "settings: {timeout: 5.0, backoff: 0.01, max_retries: 4, concurrency: 4}\n"
    with OpenAIServer(
        respond=judge_longer, faults={"extra_reply": 0.1}, seed=5, chunked=chunked
    ) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, settings=settings),
            "--no-cache",
            input=_jsonl(pairs),
            env=_env(server),
        )
    assert result.exit_code == 0, result.output
    assert server.outcomes["extra_reply"] >= 5, server.outcomes
    records = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    wrong = [r["instruction"] for r in records if r["preference"] != 2]
    assert len(records) == len(pairs) and wrong == []
    # each connection spoilt by an extra reply was left, not the whole pool: it was kept alive before
    assert server.connections <= 4 + server.outcomes["extra_reply"]


@pytest.mark.heavy
@pytest.mark.parametrize("latency, most", [(0.6, 1), (0.2, 4)])
def test_an_endpoint_that_serves_one_request_at_a_time_is_not_overrun(tmp_path, latency, most):
    # each request takes `latency` of a 1 s timeout and the server works on one at a time, even on
    # those whose client gave up: eight sent at once time out and are retried while it is still busy
    # with them. Sent as fast as it answers them, they all finish without a retry. `most` is what
    # such a server answers within the timeout (0.2 s: four, the fifth would end at the limit):
    # where the concurrency settles below it depends on the client's clock (under load requests
    # leave later and their replies look quicker: 3 of 8 was seen at 0.2 s beside a training run)
    pairs = _pairs(8)
    settings = "settings: {timeout: 1.0, backoff: 0.05, max_retries: 6, concurrency: 8}\n"
    with OpenAIServer(respond=judge_longer, latency=latency, serial=True) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path, settings=settings),
            "--no-cache",
            input=_jsonl(pairs),
            env=_env(server),
        )
    assert result.exit_code == 0, result.output
    assert [orjson.loads(line)["preference"] for line in result.stdout_bytes.splitlines()] == [
        2
    ] * 8
    summary = result.stderr.splitlines()[-1]
    settled = re.search(r"openai concurrency (\d+) of 8,", summary)
    assert "retries" not in summary and settled and 1 <= int(settled[1]) <= most, summary
    assert server.outcomes["ok"] == 8  # no work done for a client that had given up


def test_rate_limited_replies_make_the_client_back_off(tmp_path):
    with OpenAIServer(respond=judge_longer, script=["429"] * 4) as server:
        result = _annotate(
            "--pool", _pool(tmp_path), "--no-cache", input=_jsonl(_pairs(12)), env=_env(server)
        )
    assert result.exit_code == 0, result.output
    summary = result.stderr.splitlines()[-1]
    assert "+4 retries" in summary and "(backed off" in summary, summary
    assert server.outcomes["ok"] == 12


def test_a_reply_claiming_absurd_usage_is_malformed_and_booked_at_the_worst_case(tmp_path):
    # 1e30 tokens is no bill any model runs up: the reply is malformed (retried, then no verdict),
    # and its attempts are booked at their worst case, not at $1e23
    with OpenAIServer(respond=judge_longer, billing=lambda text: 1e30) as server:
        result = _annotate(
            "--pool",
            _pool(tmp_path),
            "--no-cache",
            input=_jsonl(_pairs(1)),
            env=_env(server),
        )
    assert result.exit_code == 0, (result.output, result.exception)
    (record,) = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    assert record["preference"] is None
    assert "usage is not token counts" in record["preference_reason"]
    spent = record["provenance"]["farm-annotate"]
    assert spent["tokens_estimated"] and 0 < spent["price"] < 1
