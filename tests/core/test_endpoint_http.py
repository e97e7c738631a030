"""The endpoint client (farmkit/core/endpoint.py) against a raw HTTP server on loopback that writes exactly
the bytes each test gives it: interim replies, Content-Length beside chunked encoding, floods, redirects,
credentials and a query in the base URL; on both transports where the case applies."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import tracemalloc
from collections.abc import Callable

import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool
from farmkit.tools.farm_annotate import cli as annotate_cli

from farmkit.core.endpoint import EndpointClient, EndpointFailed, EndpointFatal
from farmkit.core.io import FarmError

COMPLETION = orjson.dumps(
    {
        "choices": [{"message": {"content": "Pair 1: B"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
)


def ok(extra: bytes = b"", body: bytes = COMPLETION) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (
            extra,
            len(body),
            body,
        )
    )


def chunked(body: bytes, pieces: int = 3) -> bytes:
    step = max(1, len(body) // pieces)
    parts = [body[i : i + step] for i in range(0, len(body), step)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class RawServer:
    """Accepts connections on 127.0.0.1 and answers each request with `reply(head)`'s bytes, or lets
    `reply(head, connection)` write to the socket itself. `heads` holds every request's head."""

    def __init__(self, reply: Callable[[bytes], bytes] | Callable[[bytes, socket.socket], None]):
        self.reply, self.heads = reply, []
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(connection,), daemon=True).start()

    def _connection(self, connection: socket.socket) -> None:
        with connection:
            try:
                self._answer(connection)
            except (
                OSError
            ):  # the client closed or reset the connection (a flood it stopped reading)
                pass

    def _answer(self, connection: socket.socket) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = connection.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lengths = [
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ]
            while len(buffer) < sum(lengths):
                buffer += connection.recv(65536)
            buffer = buffer[sum(lengths) :]
            self.heads.append(head.decode("latin-1"))
            if self.reply.__code__.co_argcount == 2:
                self.reply(head, connection)
            else:
                connection.sendall(self.reply(head))

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def raw_server():
    servers = []

    def start(reply) -> RawServer:
        servers.append(RawServer(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def complete(url: str, key: str | None = None, proxy: bool = False, **options):
    async def ask():
        client = EndpointClient(
            url,
            key,
            timeout=options.pop("timeout", 3.0),
            max_retries=options.pop("max_retries", 0),
            backoff=0.01,
            **options,
        )
        try:
            return await client.complete({"model": "m", "messages": []})
        finally:
            await client.close()

    return asyncio.run(ask())


@pytest.fixture(params=["streams", "httpx"])
def transport(request, monkeypatch):
    """Both transports: the httpx one is taken where a proxy is set (NO_PROXY keeps loopback direct)."""
    if request.param == "httpx":
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    return request.param


def test_interim_replies_before_the_final_one_are_skipped(raw_server, transport):
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    server = raw_server(lambda head: interim + ok())
    # the server keeps the connection open and the client does not retry (max_retries 0): a client
    # that took an interim reply for the final one would wait out the timeout and fail, not answer
    reply = complete(server.url, timeout=5.0)
    assert reply.text == "Pair 1: B" and reply.attempts == 1


def test_chunked_encoding_wins_over_a_content_length_beside_it(raw_server):
    # RFC 9112 6.3: Transfer-Encoding overrides Content-Length; a reader that took the length would read
    # 5 bytes of the chunk framing and call the reply malformed
    body = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(
        COMPLETION
    )
    server = raw_server(lambda head: body)
    reply = complete(server.url)
    assert reply.text == "Pair 1: B" and reply.attempts == 1
    complete(server.url)
    assert len(server.heads) == 2  # and the connection was not used again for the next request


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_reply_over_the_size_cap_fails_its_request_unread_in_bounded_memory(
    raw_server, transport, framing
):
    flood = 64 * 2**20  # bytes the server offers; the client reads at most the cap

    def reply(head: bytes, connection: socket.socket) -> None:
        piece = b"x" * 2**20
        if framing == "length":
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % flood)
        elif framing == "chunked":
            connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            piece = b"%x\r\n%s\r\n" % (len(piece), piece)
        else:
            connection.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for _ in range(flood // 2**20):
            connection.sendall(piece)

    if transport == "httpx" and framing == "close":
        pytest.skip(
            "h11 reads a body delimited by the close the same way: covered by the stream case"
        )
    server = raw_server(reply)
    tracemalloc.start()
    try:
        with pytest.raises(EndpointFailed, match="more than 1,048,576 bytes") as failure:
            complete(server.url, max_reply_bytes=2**20, max_retries=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20
    assert len(server.heads) == 1  # not asked again: the same flood would come back
    assert failure.value.unknown == 1  # it may have been billed


def test_credentials_in_the_url_are_basic_auth_never_in_host_nor_printed(raw_server, transport):
    server = raw_server(lambda head: b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}")
    url = f"http://alice:s3cret-pass@127.0.0.1:{server.port}/v1"
    with pytest.raises(EndpointFailed) as failure:
        complete(url)
    head = server.heads[0]
    assert (
        f"\r\nHost: 127.0.0.1:{server.port}" in head or f"\r\nhost: 127.0.0.1:{server.port}" in head
    )
    assert "alice" not in head.split("uthorization")[0] and "s3cret" not in head
    assert "Basic " + base64.b64encode(b"alice:s3cret-pass").decode() in head
    assert "s3cret" not in str(failure.value)


def test_credentials_in_the_url_beside_an_api_key_are_refused(raw_server):
    server = raw_server(lambda head: ok())
    with pytest.raises(FarmError, match="OPENAI_BASE_URL holds credentials") as failure:
        complete(f"http://alice:s3cret@127.0.0.1:{server.port}/v1", key="sk-abcdefghijkl")
    assert "s3cret" not in str(failure.value) and not server.heads


def test_the_query_of_the_base_url_goes_with_every_request_and_is_blanked_in_messages(
    raw_server, transport
):
    answers = iter([ok(), b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}"])
    server = raw_server(lambda head: next(answers))
    url = f"http://127.0.0.1:{server.port}/openai/deployments/judge?api-version=2024-06-01&sig=SECRETSIG"
    complete(url)
    with pytest.raises(EndpointFailed):
        complete(url)
    for head in server.heads:
        target = head.split("\r\n")[0].split()[1]
        assert target.endswith(
            "/openai/deployments/judge/chat/completions?api-version=2024-06-01&sig=SECRETSIG"
        )
    client = EndpointClient(url, None, timeout=1, max_retries=0, backoff=0)
    assert (
        client.base_url
        == f"http://127.0.0.1:{server.port}/openai/deployments/judge?api-version=***&sig=***"
    )


@pytest.mark.parametrize("status", [301, 307, 308])
def test_a_redirect_ends_the_run_with_one_line_naming_its_target(raw_server, transport, status):
    redirect = (
        b"HTTP/1.1 %d Moved\r\nLocation: https://user:pw@elsewhere.example:8443/v1/chat/completions\r\nContent-Length: 0\r\n\r\n"
        % status
    )
    server = raw_server(lambda head: redirect)
    with pytest.raises(EndpointFatal) as fatal:
        complete(server.url, max_retries=3)
    message = str(fatal.value)
    assert f"HTTP {status}" in message and "https://elsewhere.example:8443" in message
    assert "does not follow redirects" in message and "pw" not in message.replace("pwd", "")
    assert len(server.heads) == 1


def test_farm_annotate_stops_at_a_redirect_with_one_line_and_no_null_records(raw_server, tmp_path):
    server = raw_server(
        lambda head: (
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://other.example/v1\r\nContent-Length: 0\r\n\r\n"
        )
    )
    pairs = b"".join(
        orjson.dumps({"instruction": f"Q{i}?", "output_1": "a", "output_2": "a longer one"}) + b"\n"
        for i in range(6)
    )
    result = run_tool(
        "farm-annotate",
        "--pool",
        "single",
        "--no-cache",
        input=pairs,
        env={"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-redirect-test-key"},
    )
    assert result.returncode == 1
    assert result.stdout == b""
    lines = [line for line in result.stderr.decode().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "HTTP 307" in lines[0] and "https://other.example" in lines[0]
    assert (
        len(server.heads) <= 16
    )  # the requests in flight when it came, not one per pair and retry


def test_the_summary_counts_requests_that_failed(raw_server, tmp_path):
    # every request rejected (a 400): each was sent, and the summary says so
    server = raw_server(
        lambda head: (
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 26\r\n\r\n"
            + json.dumps({"error": {"message": "no"}}).encode()
        )
    )
    pairs = b"".join(
        orjson.dumps({"instruction": f"Q{i}?", "output_1": "a", "output_2": "a longer one"}) + b"\n"
        for i in range(3)
    )
    result = CliRunner().invoke(
        annotate_cli,
        ["--pool", "single", "--no-cache"],
        input=pairs,
        env={"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-summary-test-key"},
    )
    assert result.exit_code == 0, result.stderr
    assert len(server.heads) == 3
    assert "3 requests" in result.stderr
