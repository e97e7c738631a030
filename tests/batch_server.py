"""A loopback fake of an OpenAI-compatible Batch API, for tests and the batch benchmark: /v1/files
(a multipart upload), /v1/batches (create, list with metadata), /v1/batches/{id}, /v1/files/{id}/content,
and /v1/chat/completions for direct requests, answering farm-annotate's prompts as
openai_server.judge_longer does (the longer answer wins) with usage counted by count_tokens.

    with BatchServer(polls=1) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test-key"}
        ...
        server.answered   # batch lines answered (billed), by custom_id
        server.direct     # direct chat completions answered
        server.calls      # Counter of "METHOD /path" (ids replaced by {id})

Knobs:
- `polls`: how many looks at a batch report it in_progress before it is done (0: done at once).
- `outcomes`: what happens to the batches created, in order (then "completed"): "completed",
  "expired_half" (the first half of its lines answered, the batch expired), "errors_half" (the second
  half of its lines in the error file, HTTP 500), "failed" (no line answered), and the faults of a
  hostile or broken endpoint, each billed as the real one would be:
  "duplicate" (every line answered twice, the second reply inverting the verdicts), "unknown" (a
  line of a custom_id never sent, billed, beside the real ones), "no_usage" (replies without
  `usage`), "malformed" (the first half of the lines cut short: not JSON), "gone" (the output file
  answers 404), "null_id" (the create reply's id is null; the batch runs and is billed all the same),
  "bomb" (every look at the batch answers a gzip bomb: 50 MB once decompressed), "endless" (every
  look answers a chunked body that never ends), "bomb_create" (the create is answered with the
  bomb; the batch is made all the same). The last four finish (and bill) the batch at once.
- `upload_faults`: HTTP statuses the first uploads get (500: retried by the client);
  `create_faults`: the same for the first creates (no batch made; the client lists the batches
  before it creates again).
- `hang_create`: "before" (a create request is never answered and no batch made) or "after" (the
  batch is made, its reply never sent); `create_seen` is set when a create arrives.
- `unreadable`: a request whose prompt holds this text is answered with prose no parser reads.
- `echo_request`: every error reply's message quotes the request as it arrived
  (openai_server.request_echo: credentials, query, headers, target, body), as a gateway that
  echoes what it was sent.
- `targets` lists every request's target (path and query), `authorizations` its Authorization header.
- `listing`: False: GET /v1/batches answers 404 (an endpoint without a batch listing).
- `content_barrier`: N: a file's content is sent only once N requests for contents are waiting (at
  most 10 s), so that N clients collecting one batch at once read it together.

`billed_price(model rates)` totals what the fake billed, for comparing with a client's ledger.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import threading
import time
from collections import Counter
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openai_server import count_tokens, judge_longer, request_echo, shown_pairs, verdict_text

_ID = re.compile(r"/(file|batch)-[0-9a-z]+")


class BatchServer:
    def __init__(
        self,
        polls: int = 0,
        outcomes: list[str] | None = None,
        upload_faults: list[int] | None = None,
        hang_create: str | None = None,
        unreadable: str | None = None,
        echo_request: bool = False,
        create_faults: list[int] | None = None,
        listing: bool = True,
        content_barrier: int = 0,
    ):
        self.create_faults = list(create_faults or [])
        self.echo_request = echo_request
        self.targets: list[str] = []
        self.authorizations: list[str | None] = []
        self.polls, self.outcomes = polls, list(outcomes or [])
        self.upload_faults, self.hang_create = list(upload_faults or []), hang_create
        self.unreadable, self.listing = unreadable, listing
        self.barrier = threading.Barrier(content_barrier) if content_barrier else None
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.looks: Counter = Counter()
        self.answered: Counter = Counter()  # custom_id -> times answered (billed)
        self.direct = 0
        self.billed: list[tuple[int, int]] = []  # (prompt, completion) of every reply
        self.calls: Counter = Counter()
        self.create_seen = threading.Event()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> BatchServer:
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids):06d}"

    def billed_price(
        self, prompt_rate: float, completion_rate: float, factor: float = 0.5
    ) -> float:
        """What every reply billed costs (USD) at these rates per million tokens, at `factor`."""
        with self._lock:
            tokens = [sum(counts) for counts in zip(*self.billed, strict=True)] or [0, 0]
        return factor * (tokens[0] * prompt_rate + tokens[1] * completion_rate) / 1e6

    def completion(self, body: dict[str, Any], inverted: bool = False) -> dict[str, Any]:
        """A chat completion answering `body`, billed (`inverted`: the shorter answer wins)."""
        prompt_text = "".join(m.get("content") or "" for m in body["messages"])
        if self.unreadable is not None and self.unreadable in prompt_text:
            text = "Both answers have their merits and I would rather not choose."
        elif inverted:
            format, pairs = shown_pairs(body)
            text = verdict_text(format, ["A" if len(b) > len(a) else "B" for a, b in pairs])
        else:
            text = judge_longer(body)
        prompt = sum(count_tokens(m.get("content") or "") for m in body["messages"])
        completion = min(count_tokens(text), body.get("max_tokens") or 10**9)
        with self._lock:
            self.billed.append((prompt, completion))
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            outcome = self.outcomes.pop(0) if self.outcomes else "completed"
        batch = {
            "id": self.new_id("batch"),
            "object": "batch",
            "endpoint": request["endpoint"],
            "input_file_id": request["input_file_id"],
            "completion_window": request["completion_window"],
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(time.time()),
            "metadata": request.get("metadata") or {},
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "_outcome": outcome,
        }
        self.batches[batch["id"]] = batch
        if outcome in (
            "null_id",
            "bomb",
            "endless",
            "bomb_create",
        ):  # it runs and bills whatever the client sees
            with self._lock:
                self._finish(batch)
        return batch

    def look(self, batch_id: str) -> dict[str, Any]:
        """The batch as a client sees it now: in progress for `polls` looks, then done."""
        batch = self.batches[batch_id]
        with self._lock:
            self.looks[batch_id] += 1
            if batch["status"] in ("validating", "in_progress"):
                if self.looks[batch_id] <= self.polls:
                    batch["status"] = "in_progress"
                else:
                    self._finish(batch)
        return {k: v for k, v in batch.items() if not k.startswith("_")}

    def _finish(self, batch: dict[str, Any]) -> None:
        lines = [json.loads(line) for line in self.files[batch["input_file_id"]].splitlines()]
        outcome = batch["_outcome"]
        half = len(lines) // 2
        output, errors = [], []
        for number, line in enumerate(lines):
            if outcome == "failed" or (outcome == "expired_half" and number >= half):
                continue
            if outcome == "malformed" and number < half:
                self.answered[line["custom_id"]] += 1
                body = self.completion(line["body"])
                entry = {
                    "custom_id": line["custom_id"],
                    "response": {"status_code": 200, "body": body},
                }
                output.append(json.dumps(entry)[:60])  # billed, and cut short
                continue
            if outcome == "errors_half" and number >= half:
                errors.append(
                    {
                        "id": f"batch_req_{number}",
                        "custom_id": line["custom_id"],
                        "response": {
                            "status_code": 500,
                            "body": {"error": {"message": "internal error"}},
                        },
                        "error": None,
                    }
                )
                continue
            custom_ids = [line["custom_id"]]
            if outcome == "unknown" and number == 0:
                custom_ids.append("farmkit-" + "0" * 48)  # a line this batch never held
            if outcome == "duplicate":
                custom_ids.append(line["custom_id"])
            for copy, custom_id in enumerate(custom_ids):
                self.answered[custom_id] += 1
                body = self.completion(line["body"], inverted=outcome == "duplicate" and copy > 0)
                if outcome == "no_usage":
                    del body["usage"]
                output.append(
                    {
                        "id": f"batch_req_{number}_{copy}",
                        "custom_id": custom_id,
                        "response": {"status_code": 200, "body": body},
                        "error": None,
                    }
                )
        # the output file lists replies in no particular order: matched by custom_id (a duplicate's
        # two replies stay in the order they were made)
        if outcome != "duplicate":
            output.reverse()
        for name, entries in (("output_file_id", output), ("error_file_id", errors)):
            if entries:
                file_id = self.new_id("file")
                if outcome != "gone" or name != "output_file_id":
                    self.files[file_id] = b"".join(
                        (entry if isinstance(entry, str) else json.dumps(entry)).encode() + b"\n"
                        for entry in entries
                    )
                batch[name] = file_id
        batch["status"] = {"expired_half": "expired", "failed": "failed"}.get(outcome, "completed")
        batch["request_counts"] = {
            "total": len(lines),
            "completed": len(output),
            "failed": len(errors),
        }


def _handler(server: BatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any) -> None:
            if status >= 400 and server.echo_request and isinstance(payload, dict):
                body = self._body[:200].decode("utf-8", "replace")
                echo = f" ({request_echo(self.command, self.path, self.headers.items(), body)})"
                payload = {"error": {"message": payload["error"]["message"] + echo}}
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        _body = b""  # the request's body, for echo_request

        def _hostile(self, outcome: str) -> None:
            """A gzip bomb, or a chunked body that never ends, as the reply."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if outcome == "bomb":
                body = _bomb()
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b" " * 65536
            try:
                while True:  # until the client hangs up
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                self.close_connection = True

        def _count(self) -> str:
            path = self.path.split("?")[0]
            with server._lock:
                server.targets.append(self.path)
                server.authorizations.append(self.headers.get("Authorization"))
                server.calls[f"{self.command} {_ID.sub('/{id}', path)}"] += 1
            return path

        def do_GET(self) -> None:
            path = self._count()
            if path == "/v1/batches" and not server.listing:
                self._send(404, {"error": {"message": f"no route {path}"}})
            elif path == "/v1/batches":
                listed = sorted(server.batches, reverse=True)
                query = dict(
                    part.split("=", 1) for part in self.path.partition("?")[2].split("&") if part
                )
                if "after" in query:
                    listed = listed[listed.index(query["after"]) + 1 :]
                page = listed[: int(query.get("limit", 20))]
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [server.look(i) for i in page],
                        "has_more": len(listed) > len(page),
                    },
                )
            elif path.startswith("/v1/batches/") and path[12:] in server.batches:
                outcome = server.batches[path[12:]]["_outcome"]
                if outcome in ("bomb", "endless"):
                    self._hostile(outcome)
                else:
                    self._send(200, server.look(path[12:]))
            elif path.endswith("/content") and path[10:-8] in server.files:
                if server.barrier is not None:
                    try:
                        server.barrier.wait(10)
                    except threading.BrokenBarrierError:
                        pass
                self._send(200, server.files[path[10:-8]])
            else:
                self._send(404, {"error": {"message": f"no such object {path}"}})

        def do_POST(self) -> None:
            path = self._count()
            content = self._body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if path == "/v1/chat/completions":
                with server._lock:
                    server.direct += 1
                self._send(200, server.completion(json.loads(content)))
            elif path == "/v1/files":
                with server._lock:
                    fault = server.upload_faults.pop(0) if server.upload_faults else None
                if fault:
                    self._send(fault, {"error": {"message": "upload failed"}})
                    return
                head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
                parts = {
                    part.get_param("name", header="content-disposition"): part.get_payload(
                        decode=True
                    )
                    for part in BytesParser().parsebytes(head + content).get_payload()
                }
                assert parts["purpose"] == b"batch", parts["purpose"]
                file_id = server.new_id("file")
                server.files[file_id] = parts["file"]
                self._send(200, {"id": file_id, "object": "file", "purpose": "batch"})
            elif path == "/v1/batches":
                request = json.loads(content)
                assert request["input_file_id"] in server.files
                with server._lock:
                    fault = server.create_faults.pop(0) if server.create_faults else None
                if fault:
                    self._send(fault, {"error": {"message": "create failed"}})
                    return
                server.create_seen.set()
                if server.hang_create == "before":
                    time.sleep(3600)
                batch = server.create(request)
                if server.hang_create == "after":
                    time.sleep(3600)
                if batch["_outcome"] == "bomb_create":
                    self._hostile("bomb")
                    return
                reply = server.look(batch["id"])
                if batch["_outcome"] == "null_id":
                    reply["id"] = None
                self._send(200, reply)
            else:
                self._send(404, {"error": {"message": f"no route {path}"}})

    return Handler


_BOMB: list[bytes] = []


def _bomb() -> bytes:
    """50 MB of blanks, gzipped to about 50 KB (made once)."""
    if not _BOMB:
        _BOMB.append(gzip.compress(b" " * (50 * 2**20), compresslevel=9))
    return _BOMB[0]
