"""A real local HTTP server that speaks the OpenAI chat-completions protocol, for tests and benchmarks:
scripted replies, a fixed latency, and injected faults. Nothing here is mocked: clients talk HTTP/1.1
to a socket on 127.0.0.1.

    from openai_server import OpenAIServer, judge_longer
    with OpenAIServer(respond=judge_longer, latency=0.05, faults={"429": 0.1, "drop": 0.05}) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test-key"}
        ...
        server.connections  # TCP connections accepted
        server.outcomes   # Counter of what each request got: ok, 429, 500, timeout, garbage, drop, 401, 404
                          # (and "proxied" for each request sent to it as to a proxy)
        server.bodies     # the JSON body of every request that got a real reply (not a fault)

API:
- `respond(body) -> str`: the assistant's reply to a request body (`echo` by default;
  `judge_longer` answers farm-annotate's prompts, preferring the longer answer in every pair).
- `latency`: seconds each request takes before it is answered (all faults included).
- `faults`: {kind: probability}, drawn per request from a seeded generator. Kinds:
  "429" (rate limited, with Retry-After and retry-after-ms headers set to `retry_after`),
  "500" (server error), "400" (a rejected request whose message quotes the start of the key, as
  some endpoints do), "timeout" (answers only after `hang` seconds), "garbage" (a 200 whose text
  is not a verdict), "drop" (closes the connection without answering), and malformed 200 replies:
  "plain" (a text/plain body), "bytes" (a body that is not UTF-8), "null_choice" (`{"choices": [null]}`),
  "list_content" (the message content a list), "string_usage" (token counts as strings); real
  replies with odd usage: "null_usage" (token counts null), "float_usage" (counts with a fraction,
  the billed count + 0.4); and, with `tls`, "tls_garbage" (bytes written beneath the TLS layer in
  place of a reply: the client's TLS layer fails, as on a corrupted connection); "extra_reply" (the
  real reply and, in the same write, a second, unrequested 200 on the same kept-alive connection whose
  verdict names the other answer: a client that reads it as the reply to its next request is misled).
- `script`: fault kinds (or None for a normal reply) for the first requests, in order, before the
  random draws start: a way to be sure each fault is met.
- `models`: the model names it serves (None: any); others get a 404 `model_not_found`.
- `api_key`: the key it accepts (None: any); others get a 401.
- `echo_key`: every error message quotes the key the client presented, whole and as its
  Authorization header, and every reply carries it in an `X-Echo-Key` header (endpoints and proxies
  that echo what they were sent): what a client writes must still never hold it.
- `echo_request`: every error message, and every "garbage" reply's text, quotes the whole request as
  it arrived (`request_echo`): the credentials of its Authorization header (Bearer or Basic), its
  query's parameters as JSON, every header, its target (the URL's path and query) and the body (a
  gateway that echoes what it was sent, secrets and all).
- `headers`: headers sent with every reply, errors included (e.g. a rate limit's
  `x-ratelimit-remaining-requests: 0` with `x-ratelimit-reset-requests: inf`). A "429" fault's
  Retry-After is `retry_after` seconds (one that is not a finite, non-negative number is sent as
  Python writes it: "inf", "-30.0").
- `chunked`: bodies go out with chunked transfer encoding instead of a Content-Length.
- `tls`: (certificate file, key file): serve HTTPS (`url` starts with https).
- `serial`: answer one request at a time, the others waiting their turn (a small model on a busy
  machine); a request whose client gave up is still worked on, as such servers do.
- `billing(text) -> int`: the token count each reply's usage reports for a text (`count_tokens` by
  default; `len` bills a token per character, far more than a client's estimate); completion tokens
  are capped at the request's max_tokens, as a real endpoint stops there. `billed` lists the
  (prompt, completion) tokens of every reply that reported usage, malformed ones included.
- `top_logprobs(body) -> {token: probability}`: the distribution of the reply's first token, for
  requests that ask `logprobs: true` (the reply then carries `choices[0].logprobs` as OpenAI's does:
  the `top_logprobs` most likely tokens of that position); None (the default) ignores the request's
  `logprobs`, as an endpoint without log-probabilities does. `weigh_longer` answers farm-annotate's
  single-pair prompts with P(B) = len(B) / (len(A) + len(B)) among A and B.
- `system_fingerprint`: the `system_fingerprint` every real reply carries (None, the default: the
  field is left out, as endpoints without one do); an attribute a test may change between runs, as
  a provider's silent update of the model behind a name does. `reply_model`: the `model` replies
  name (None: the request's, as an alias's endpoint that does not say its dated model does).
- A request in absolute form (`POST http://host/v1/chat/completions`, as clients send to a proxy) is
  answered too, so the server can stand in for a proxy.
- `limits`: {"requests": N, "tokens": M, "window": seconds}: a provider's rate limits over a sliding
  window. Each request is counted when it arrives, with the tokens its reply bills (prompt and
  completion); one that would pass either limit gets a 429. Every reply carries OpenAI's headers
  (x-ratelimit-remaining-requests/-tokens, and x-ratelimit-reset-requests/-tokens: the time until
  the window is empty again, in OpenAI's form, e.g. "1.5s", "20ms"). `admitted` lists when each
  request was let through (monotonic seconds), `over` counts those refused.
- `python tests/openai_server.py --latency 0.2 [--judge longer|echo] [--reply TEXT] [--port P]` runs it
  alone and prints its URL on stdout (for benchmarks that need the server in another process);
  `--reply` answers prompts that are not farm-annotate's (another annotator's, for comparisons).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MALFORMED = ("plain", "bytes", "null_choice", "list_content", "string_usage")
# well-formed replies whose usage is odd: counts that are null, or fractional
ODD_USAGE = ("null_usage", "float_usage")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_OTHER_ANSWER = re.compile(r"\b[AB]\b")


def count_tokens(text: str) -> int:
    """The server's token count: words and punctuation marks (a stand-in for a real tokenizer)."""
    return len(_TOKEN.findall(text))


def secret_forms(*secrets: str, user: str | None = None) -> list[str]:
    """The forms a secret travels in, to look for in what a client wrote: as given, URL-encoded,
    base64 (standard and URL-safe), and with `user`, base64 of `user:secret` (a Basic header)."""
    import base64
    from urllib.parse import quote

    forms = []
    for secret in secrets:
        encoded = [secret.encode()] + ([f"{user}:{secret}".encode()] if user else [])
        forms += [secret, quote(secret, safe="")]
        forms += [
            code(raw).decode()
            for raw in encoded
            for code in (base64.b64encode, base64.urlsafe_b64encode)
        ]
    return sorted(set(forms))


def request_echo(method: str, target: str, headers: Any, body: str) -> str:
    """A request quoted back as a gateway may quote it: the credentials of its Authorization header
    (less the scheme), the query's parameters as JSON, every header, the target, the body."""
    from urllib.parse import parse_qsl

    headers = dict(headers)
    credentials = (headers.get("Authorization") or "").partition(" ")[2]
    query = json.dumps(dict(parse_qsl(target.partition("?")[2])))
    quoted = "; ".join(f"{name}: {value}" for name, value in headers.items())
    return f"credentials {credentials}; query {query}; {quoted}; {method} {target}; body {body}"


def echo(body: dict[str, Any]) -> str:
    """Reply with the start of the last user message (or of a text completion's prompt): a stand-in for
    a generating model."""
    last = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
    return f"Reply to: {last[:60]}"


_BLOCKS = {
    "plain": re.compile(
        r"<answer A>\n(.*?)\n</answer A>\n\n<answer B>\n(.*?)\n</answer B>", re.DOTALL
    ),
    "json": re.compile(r'Response A:\n"""\n(.*?)\n"""\nResponse B:\n"""\n(.*?)\n"""', re.DOTALL),
    "ranking": re.compile(
        r"\[Reply A\]\n(.*?)\n\[End of reply A\]\n\[Reply B\]\n(.*?)\n\[End of reply B\]", re.DOTALL
    ),
}


def prompt_format(text: str) -> str:
    """Which of farm-annotate's formats a prompt asks for, told by how its pairs are marked up."""
    marks = {
        "plain": text.find("<answer A>\n"),
        "json": text.find('Response A:\n"""'),
        "ranking": text.find("[Reply A]\n"),
    }
    found = {name: at for name, at in marks.items() if at >= 0}
    return min(found, key=found.get) if found else "plain"


def shown_pairs(body: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """(format, [(answer A, answer B), ...]) of a farm-annotate prompt, worked examples left out."""
    user = body["messages"][-1]["content"]
    format = prompt_format(user)
    task = user.rsplit("Now the real task.", 1)[-1]
    return format, [(match.group(1), match.group(2)) for match in _BLOCKS[format].finditer(task)]


def verdict_text(format: str, winners: list[str]) -> str:
    """A reply in the prompt's format naming `winners` ("A" or "B") for pairs 1, 2, ..."""
    if format == "json":
        return json.dumps(
            {
                "verdicts": [
                    {"pair": i, "rationale": "It is more complete.", "better": w}
                    for i, w in enumerate(winners, start=1)
                ]
            }
        )
    if format == "ranking":
        return "\n".join(
            f"Pair {i}: {w} > {'B' if w == 'A' else 'A'}" for i, w in enumerate(winners, start=1)
        )
    return "\n".join(f"Pair {i}: {w}" for i, w in enumerate(winners, start=1))


def judge_longer(body: dict[str, Any]) -> str:
    """A scripted judge for farm-annotate's prompts: in every pair the longer answer wins (A on equal length)."""
    format, pairs = shown_pairs(body)
    return verdict_text(format, ["B" if len(b) > len(a) else "A" for a, b in pairs])


def weigh_longer(body: dict[str, Any]) -> dict[str, float]:
    """The first token's distribution for a one-pair prompt: the verdict tokens A and B share 0.9 in
    proportion to their answers' lengths (the longer more likely), another token the rest."""
    _, pairs = shown_pairs(body)
    a, b = pairs[0]
    share_b = len(b) / (len(a) + len(b))
    return {"A": 0.9 * (1 - share_b), "B": 0.9 * share_b, "The": 0.1}


def _logprobs(distribution: dict[str, float], text: str, top: int) -> dict[str, Any]:
    """`choices[0].logprobs` as OpenAI writes it: the first token with its `top` likeliest tokens."""
    import math

    ranked = sorted(
        ((token, math.log(p) if p > 0 else -9999.0) for token, p in distribution.items()),
        key=lambda entry: -entry[1],
    )

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    first = text[:1] or ranked[0][0]
    chosen = dict(ranked).get(first, -9999.0)
    return {
        "content": [
            {**entry(first, chosen), "top_logprobs": [entry(t, lp) for t, lp in ranked[:top]]}
        ],
        "refusal": None,
    }


class OpenAIServer:
    def __init__(
        self,
        respond: Callable[[dict[str, Any]], str] = echo,
        latency: float = 0.0,
        faults: dict[str, float] | None = None,
        models: set[str] | None = None,
        api_key: str | None = None,
        retry_after: float = 0.05,
        hang: float = 5.0,
        seed: int = 0,
        port: int = 0,
        script: list[str | None] | None = None,
        chunked: bool = False,
        billing: Callable[[str], int] | None = None,
        tls: tuple[str, str] | None = None,
        echo_key: bool = False,
        serial: bool = False,
        top_logprobs: Callable[[dict[str, Any]], dict[str, float]] | None = None,
        limits: dict[str, float] | None = None,
        echo_request: bool = False,
        headers: dict[str, str] | None = None,
        system_fingerprint: str | None = None,
        reply_model: str | None = None,
    ):
        self.system_fingerprint, self.reply_model = system_fingerprint, reply_model
        self.echo_request, self.headers = echo_request, dict(headers or {})
        self.top_logprobs = top_logprobs
        self.limits, self.over = limits, 0
        self.admitted: list[float] = []
        self._window: list[
            tuple[float, int]
        ] = []  # (arrival, tokens) of the requests in the window
        self.respond, self.latency, self.faults = respond, latency, dict(faults or {})
        self.script, self.chunked, self.echo_key = list(script or []), chunked, echo_key
        self.billing, self.dense = billing or count_tokens, billing is not None
        self.billed: list[tuple[int, int]] = []
        # the same, per key presented (Authorization header without "Bearer "): what each client was billed
        self.billed_by: dict[str, list[tuple[int, int]]] = {}
        self.models, self.api_key, self.retry_after, self.hang = models, api_key, retry_after, hang
        unknown = (set(self.faults) | set(self.script)) - {
            "400",
            "429",
            "500",
            "timeout",
            "garbage",
            "drop",
            "tls_garbage",
            "extra_reply",
            None,
            *MALFORMED,
            *ODD_USAGE,
        }
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.outcomes: Counter = Counter()
        self.connections = 0
        self.bodies: list[dict[str, Any]] = []
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.serial, self._turn = serial, threading.Lock()
        self._httpd = _Server(("127.0.0.1", port), _handler(self))
        self.tls = tls is not None
        if tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> OpenAIServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def draw_fault(self) -> str | None:
        with self._lock:
            if self.script:
                return self.script.pop(0)
            point = self._random.random()
        for kind, probability in self.faults.items():
            if point < probability:
                return kind
            point -= probability
        return None

    def usage(self, body: dict[str, Any], text: str, who: str = "") -> tuple[int, int]:
        """(prompt, completion) tokens billed for replying `text` to `body`, recorded in `billed` (and
        in `billed_by[who]`, `who` being the key the client presented)."""
        if "prompt" in body:
            prompt = self.billing(body["prompt"])
        else:
            prompt = sum(self.billing(m.get("content") or "") for m in body.get("messages", []))
        completion = self.billing(text)
        if isinstance(body.get("max_tokens"), int):
            completion = min(completion, body["max_tokens"])
        with self._lock:
            self.billed.append((prompt, completion))
            self.billed_by.setdefault(who, []).append((prompt, completion))
        return prompt, completion

    def admit(self, tokens: int) -> tuple[bool, dict[str, str]]:
        """Whether a request of `tokens` passes the limits now, and the headers its reply carries."""
        assert self.limits is not None
        with self._lock:
            now = time.monotonic()
            window = self.limits["window"]
            self._window = [(at, cost) for at, cost in self._window if at > now - window]
            used = sum(cost for _, cost in self._window)
            fits = (
                len(self._window) + 1 <= self.limits["requests"]
                and used + tokens <= self.limits["tokens"]
            )
            if fits:
                self._window.append((now, tokens))
                self.admitted.append(now)
                used += tokens
            else:
                self.over += 1
            newest = max((at for at, _ in self._window), default=now)
            reset = f"{max(0.0, window - (now - newest)) * 1000:.0f}ms"
            headers = {
                "x-ratelimit-remaining-requests": str(
                    int(self.limits["requests"]) - len(self._window)
                ),
                "x-ratelimit-remaining-tokens": str(int(self.limits["tokens"] - used)),
                "x-ratelimit-reset-requests": reset,
                "x-ratelimit-reset-tokens": reset,
            }
        return fits, headers

    def record(self, outcome: str, body: dict[str, Any] | None = None) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            if body is not None:
                self.bodies.append(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # a real endpoint's listen backlog: socketserver's 5 drops the connections of a burst of clients,
    # whose retransmitted SYN then waits a second
    request_queue_size = 128


def _handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real endpoints do
        # headers and body go out in separate writes; without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK hold the body back for tens of milliseconds per request
        disable_nagle_algorithm = True
        _body_text = ""  # the request's body, for echo_request

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            with server._lock:
                server.connections += 1
            super().setup()

        def _send(
            self,
            status: int,
            payload: dict[str, Any] | bytes,
            headers: dict[str, str] | None = None,
            content_type: str = "application/json",
            then: bytes = b"",
        ) -> None:
            """Send a reply; `then`: bytes that follow it in the same write (a reply nobody asked for)."""
            data = _body(payload, server.chunked)
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                if server.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if server.echo_key:
                    self.send_header("X-Echo-Key", self._key())
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data + then)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to deliver

        def _error(
            self,
            status: int,
            message: str,
            kind: str,
            code: str | None = None,
            headers: dict[str, str] | None = None,
        ) -> None:
            if server.echo_key:
                message += f" (key {self._key()}; Authorization: Bearer {self._key()})"
            if server.echo_request:
                message += f" ({self._request_echo()})"
            self._send(status, {"error": {"message": message, "type": kind, "code": code}}, headers)

        def _request_echo(self) -> str:
            """The request as it arrived, as gateways quote it: its credentials (the Authorization
            header less its scheme), the query's parameters, the headers, the target and the body."""
            return request_echo(self.command, self.path, self.headers.items(), self._body_text)

        def _key(self) -> str:
            return (self.headers.get("Authorization") or "").removeprefix("Bearer ")

        def _key_quoted(self) -> str:
            """The start of the key the client sent, as OpenAI's own messages quote it."""
            presented = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            return presented[:19] + "***"

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                names = sorted(server.models or {"any"})
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [{"id": n, "object": "model", "owned_by": "test"} for n in names],
                    },
                )
            else:
                self._error(404, f"no route {self.path}", "invalid_request_error")

        def do_POST(self) -> None:
            if server.serial:  # one at a time, the rest queued: a small model on a busy machine
                with server._turn:
                    self._post()
            else:
                self._post()

        def _post(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            self._body_text = raw.decode("utf-8", "replace")
            body = json.loads(raw or b"{}")
            if self.path.startswith("http"):
                server.record("proxied")  # absolute form: sent as to a proxy
            route = self.path.partition("?")[0].rstrip("/")
            if not route.endswith("/completions"):  # chat, or text with "prompt"
                self._error(404, f"no route {self.path}", "invalid_request_error")
                return
            if (
                server.api_key is not None
                and self.headers.get("Authorization") != f"Bearer {server.api_key}"
            ):
                server.record("401")
                self._error(
                    401,
                    f"Incorrect API key provided: {self._key_quoted()}.",
                    "invalid_request_error",
                    "invalid_api_key",
                )
                return
            if server.models is not None and body.get("model") not in server.models:
                server.record("404")
                self._error(
                    404,
                    f"The model {body.get('model')!r} does not exist.",
                    "invalid_request_error",
                    "model_not_found",
                )
                return
            limited: dict[str, str] = {}
            if server.limits is not None:
                prompt = sum(
                    server.billing(m.get("content") or "") for m in body.get("messages", [])
                )
                fits, limited = server.admit(prompt + server.billing(server.respond(body)))
                if not fits:
                    server.record("429")
                    self._error(429, "Rate limit reached.", "rate_limit_error", None, limited)
                    return
            fault = server.draw_fault()
            time.sleep(server.latency)
            if fault == "drop":
                server.record("drop")
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault == "429":
                server.record("429")
                wait = server.retry_after
                self._error(
                    429,
                    "Rate limit reached.",
                    "rate_limit_error",
                    "rate_limit_exceeded",
                    {
                        "Retry-After": str(max(1, round(wait))),
                        "retry-after-ms": str(int(wait * 1000)),
                    }
                    if math.isfinite(wait) and wait >= 0
                    else {"Retry-After": str(wait), "retry-after-ms": str(wait * 1000)},
                )
                return
            if fault == "400":
                server.record("400")
                self._error(
                    400, f"Request rejected for key {self._key_quoted()}.", "invalid_request_error"
                )
                return
            if fault == "500":
                server.record("500")
                self._error(
                    500, "The server had an error while processing your request.", "server_error"
                )
                return
            if fault in MALFORMED:
                server.record(fault)
                # malformed replies that report usage bill 10 + 4 tokens, or, with `billing` given, the
                # request's own count (a retried malformed reply then costs as much as a real one)
                usage = (10, 4)
                if fault in ("null_choice", "list_content", "string_usage"):
                    if server.dense:
                        usage = server.usage(body, "Pair 1: A", self._key())
                    else:
                        with server._lock:
                            server.billed.append(usage)
                            server.billed_by.setdefault(self._key(), []).append(usage)
                self._send(200, *_malformed(fault, body, usage))
                return
            if fault == "tls_garbage":
                server.record("tls_garbage")
                # a TLS application-data record the client cannot decrypt, under the TLS layer
                with socket.socket(fileno=os.dup(self.connection.fileno())) as raw:
                    raw.sendall(b"\x17\x03\x03\x00\x20" + bytes(range(32)))
                self.close_connection = True
                return
            if fault == "timeout":
                server.record("timeout")
                time.sleep(server.hang)
            text = (
                "I am not able to compare these two answers."
                if fault == "garbage"
                else server.respond(body)
            )
            if fault == "garbage" and server.echo_request:
                text += f" You sent: {self._request_echo()}"
            if fault == "garbage":
                server.record("garbage")
            elif fault in ODD_USAGE:
                server.record(fault, body)
            elif fault == "extra_reply":
                server.record("ok", body)
                server.record("extra_reply")
            elif fault != "timeout":
                server.record("ok", body)
            prompt_tokens, completion_tokens = server.usage(body, text, self._key())
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
            if "prompt" in body:
                choice = {"index": 0, "text": text, "finish_reason": "stop"}
            elif body.get("logprobs") and server.top_logprobs is not None:
                top = int(body.get("top_logprobs") or 0)
                choice["logprobs"] = _logprobs(server.top_logprobs(body), text, top)
            reply = {
                "id": f"chatcmpl-{sum(server.outcomes.values())}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": server.reply_model or body.get("model"),
                "choices": [choice],
                "usage": _usage(fault, prompt_tokens, completion_tokens),
            }
            if server.system_fingerprint is not None:
                reply["system_fingerprint"] = server.system_fingerprint
            extra = b""
            if fault == "extra_reply":
                stale = json.loads(json.dumps(reply))
                message = stale["choices"][0].get("message") or stale["choices"][0]
                key = "content" if "content" in message else "text"
                message[key] = _OTHER_ANSWER.sub(lambda m: "B" if m[0] == "A" else "A", text)
                framing = (
                    b"Transfer-Encoding: chunked"
                    if server.chunked
                    else b"Content-Length: %d" % len(json.dumps(stale).encode())
                )
                extra = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s\r\n\r\n" % framing
                    + _body(stale, server.chunked)
                )
            self._send(200, reply, limited, then=extra)

    return Handler


def _body(payload: dict[str, Any] | bytes, chunked: bool) -> bytes:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    if chunked:  # in two chunks, as servers that stream their bodies send them
        half = len(data) // 2
        data = b"".join(
            b"%x\r\n%s\r\n" % (len(part), part) for part in (data[:half], data[half:], b"")
        )
    return data


def _usage(fault: str | None, prompt: int, completion: int) -> dict[str, Any]:
    if fault == "null_usage":
        return {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}
    if fault == "float_usage":
        return {
            "prompt_tokens": prompt + 0.4,
            "completion_tokens": completion + 0.4,
            "total_tokens": prompt + completion + 0.8,
        }
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _malformed(
    kind: str, body: dict[str, Any], billed: tuple[int, int] = (10, 4)
) -> tuple[dict[str, Any] | bytes, None, str]:
    """A 200 reply of the malformed kind `kind`: (payload, headers, content type)."""
    if kind == "plain":
        return b"Pair 1: A", None, "text/plain"
    if kind == "bytes":
        return (
            b'{"choices": [{"message": {"content": "\xff\xfe Pair 1: A"}}]}',
            None,
            "application/json",
        )
    message = {"role": "assistant", "content": "Pair 1: A"}
    usage: dict[str, Any] = {"prompt_tokens": billed[0], "completion_tokens": billed[1]}
    if kind == "null_choice":
        return {"choices": [None], "usage": usage}, None, "application/json"
    if kind == "list_content":
        message["content"] = ["Pair 1: A"]
    if kind == "string_usage":
        usage = {"prompt_tokens": str(billed[0]), "completion_tokens": str(billed[1])}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    if "prompt" in body:  # a text completion
        choice = {"index": 0, "text": message["content"], "finish_reason": "stop"}
    return (
        {"model": body.get("model"), "choices": [choice], "usage": usage},
        None,
        "application/json",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Serve OpenAI chat completions locally (scripted replies)."
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--judge", choices=("longer", "echo"), default="longer")
    parser.add_argument(
        "--reply",
        help="with --judge longer: the reply to prompts that are not farm-annotate's "
        "(another tool's judge prompt, for comparisons on the same server)",
    )
    args = parser.parse_args()
    if args.judge == "echo":
        respond = echo
    else:

        def respond(body: dict[str, Any]) -> str:
            return judge_longer(body) or args.reply or ""

    server = OpenAIServer(respond=respond, latency=args.latency, port=args.port)
    print(server.url, flush=True)
    try:
        server._httpd.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    main()
