"""A real local HTTP server that speaks the OpenAI chat-completions protocol, for tests and benchmarks:
scripted replies, a fixed latency, and injected faults. Nothing here is mocked: clients talk HTTP/1.1
to a socket on 127.0.0.1.

    from openai_server import OpenAIServer, judge_longer
    with OpenAIServer(respond=judge_longer, latency=0.05, faults={"429": 0.1, "drop": 0.05}) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test-key"}
        ...
        server.outcomes   # Counter of what each request got: ok, 429, 500, timeout, garbage, drop, 401, 404
        server.bodies     # the JSON body of every request that got a real reply (not a fault)

API:
- `respond(body) -> str`: the assistant's reply to a request body (`echo` by default;
  `judge_longer` answers farm-annotate's prompts, preferring the longer answer in every pair).
- `latency`: seconds each request takes before it is answered (all faults included).
- `faults`: {kind: probability}, drawn per request from a seeded generator. Kinds:
  "429" (rate limited, with Retry-After and retry-after-ms headers set to `retry_after`),
  "500" (server error), "timeout" (answers only after `hang` seconds), "garbage" (a 200 whose text
  is not a verdict), "drop" (closes the connection without answering).
- `script`: fault kinds (or None for a normal reply) for the first requests, in order, before the
  random draws start: a way to be sure each fault is met.
- `models`: the model names it serves (None: any); others get a 404 `model_not_found`.
- `api_key`: the key it accepts (None: any); others get a 401.
- `python tests/openai_server.py --latency 0.2 [--judge longer|echo] [--reply TEXT] [--port P]` runs it
  alone and prints its URL on stdout (for benchmarks that need the server in another process);
  `--reply` answers prompts that are not farm-annotate's (another annotator's, for comparisons).
"""

from __future__ import annotations

import argparse
import json
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

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """The server's token count: words and punctuation marks (a stand-in for a real tokenizer)."""
    return len(_TOKEN.findall(text))


def echo(body: dict[str, Any]) -> str:
    """Reply with the start of the last user message: a stand-in for a generating model."""
    last = body["messages"][-1]["content"]
    return f"Reply to: {last[:60]}"


_BLOCKS = {
    "plain": re.compile(r"<answer A>\n(.*?)\n</answer A>\n\n<answer B>\n(.*?)\n</answer B>", re.DOTALL),
    "json": re.compile(r'Response A:\n"""\n(.*?)\n"""\nResponse B:\n"""\n(.*?)\n"""', re.DOTALL),
    "ranking": re.compile(r"\[Reply A\]\n(.*?)\n\[End of reply A\]\n\[Reply B\]\n(.*?)\n\[End of reply B\]", re.DOTALL),
}


def prompt_format(text: str) -> str:
    """Which of farm-annotate's formats a prompt asks for, told by how its pairs are marked up."""
    marks = {"plain": text.find("<answer A>\n"), "json": text.find('Response A:\n"""'), "ranking": text.find("[Reply A]\n")}
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
        return json.dumps({"verdicts": [{"pair": i, "rationale": "It is more complete.", "better": w}
                                        for i, w in enumerate(winners, start=1)]})
    if format == "ranking":
        return "\n".join(f"Pair {i}: {w} > {'B' if w == 'A' else 'A'}" for i, w in enumerate(winners, start=1))
    return "\n".join(f"Pair {i}: {w}" for i, w in enumerate(winners, start=1))


def judge_longer(body: dict[str, Any]) -> str:
    """A scripted judge for farm-annotate's prompts: in every pair the longer answer wins (A on equal length)."""
    format, pairs = shown_pairs(body)
    return verdict_text(format, ["B" if len(b) > len(a) else "A" for a, b in pairs])


class OpenAIServer:
    def __init__(self, respond: Callable[[dict[str, Any]], str] = echo, latency: float = 0.0,
                 faults: dict[str, float] | None = None, models: set[str] | None = None, api_key: str | None = None,
                 retry_after: float = 0.05, hang: float = 5.0, seed: int = 0, port: int = 0,
                 script: list[str | None] | None = None):
        self.respond, self.latency, self.faults = respond, latency, dict(faults or {})
        self.script = list(script or [])
        self.models, self.api_key, self.retry_after, self.hang = models, api_key, retry_after, hang
        unknown = (set(self.faults) | set(self.script)) - {"429", "500", "timeout", "garbage", "drop", None}
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.outcomes: Counter = Counter()
        self.bodies: list[dict[str, Any]] = []
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> OpenAIServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
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

    def record(self, outcome: str, body: dict[str, Any] | None = None) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            if body is not None:
                self.bodies.append(body)


def _handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real endpoints do
        # headers and body go out in separate writes; without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK hold the body back for tens of milliseconds per request
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to deliver

        def _error(self, status: int, message: str, kind: str, code: str | None = None,
                   headers: dict[str, str] | None = None) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": code}}, headers)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                names = sorted(server.models or {"any"})
                self._send(200, {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "test"} for n in names]})
            else:
                self._error(404, f"no route {self.path}", "invalid_request_error")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._error(404, f"no route {self.path}", "invalid_request_error")
                return
            if server.api_key is not None and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                server.record("401")
                self._error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
                return
            if server.models is not None and body.get("model") not in server.models:
                server.record("404")
                self._error(404, f"The model {body.get('model')!r} does not exist.", "invalid_request_error", "model_not_found")
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
                self._error(429, "Rate limit reached.", "rate_limit_error", "rate_limit_exceeded",
                            {"Retry-After": str(max(1, round(wait))), "retry-after-ms": str(int(wait * 1000))})
                return
            if fault == "500":
                server.record("500")
                self._error(500, "The server had an error while processing your request.", "server_error")
                return
            if fault == "timeout":
                server.record("timeout")
                time.sleep(server.hang)
            text = "I am not able to compare these two answers." if fault == "garbage" else server.respond(body)
            if fault == "garbage":
                server.record("garbage")
            elif fault != "timeout":
                server.record("ok", body)
            prompt_tokens = sum(count_tokens(m.get("content") or "") for m in body.get("messages", []))
            self._send(200, {
                "id": f"chatcmpl-{sum(server.outcomes.values())}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": count_tokens(text),
                          "total_tokens": prompt_tokens + count_tokens(text)},
            })

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve OpenAI chat completions locally (scripted replies).")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--judge", choices=("longer", "echo"), default="longer")
    parser.add_argument("--reply", help="with --judge longer: the reply to prompts that are not farm-annotate's "
                                        "(another tool's judge prompt, for comparisons on the same server)")
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
