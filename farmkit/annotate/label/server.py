"""farm-label's web server (Starlette, served by uvicorn): the labelling page and its JSON API, one
link per annotator, and the organiser's status page. Every route past the static assets needs a
token; model outputs leave the server as JSON strings, for the page to set as text, and as HTML
rendered here from their markdown with raw HTML off (render.py), the only HTML the page sets."""

from __future__ import annotations

import hmac
import html
import json
import logging
import math
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from farmkit.annotate.label import origin_of
from farmkit.annotate.label.assign import ACTIONS
from farmkit.annotate.label.render import markdown_html
from farmkit.annotate.label.store import NotSaved, Store
from farmkit.core.io import FarmError

log = logging.getLogger("farmkit")
STATIC = Path(__file__).parent / "static"
GUIDELINES = Path(__file__).parent / "guidelines.md"  # --guidelines replaces them
MAX_BODY = 16 * 1024
MAX_COMMENT = 2000  # characters of an annotator's comment on a pair
# the page has no inline script or style, loads nothing from elsewhere and cannot be framed
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the token is in the URL
}
FORBIDDEN = "forbidden\n"  # the one reply to every unknown token or path: it tells nothing
# what a reverse proxy must pass for the page's origin to be known (docs/humans.md)
PROXY_HINT = (
    "pass the public Host and X-Forwarded-Proto (nginx: proxy_set_header Host $host; "
    "proxy_set_header X-Forwarded-Proto $scheme), or give --public-url"
)


class _Refused(Exception):
    """A request refused: `response` is the reply, `reason` what the server's log says of it."""

    def __init__(self, response: Response, reason: str):
        self.response, self.reason = response, reason


def _forbidden() -> _Refused:
    return _Refused(PlainTextResponse(FORBIDDEN, status_code=403), "a wrong token or no such page")


def _refusal(status: int, message: str, reason: str | None = None) -> _Refused:
    return _Refused(_error(status, message), reason or message)


def _error(status: int, message: str, **more: Any) -> Response:
    return JSONResponse({"error": message, **more}, status_code=status)


def _not_saved(error: NotSaved) -> Response:
    """507 Insufficient Storage: the page keeps the answer and offers to send it again."""
    log.error("farm-label: %s", error)
    return _error(507, f"not saved ({error.reason}); nothing of it was kept")


def _forwarded(request: Request) -> tuple[set[str], set[str]]:
    """The schemes and hosts a reverse proxy says the request was made to (X-Forwarded-Proto,
    X-Forwarded-Host, Forwarded), beside the request's own. A browser cannot add these headers to a
    request from another site's page (they would need a CORS preflight, which is never granted), so
    they widen nothing for a page elsewhere."""
    schemes, hosts = {request.url.scheme}, {request.headers.get("host", "")}
    for name, into in (("x-forwarded-proto", schemes), ("x-forwarded-host", hosts)):
        value = request.headers.get(name, "").split(",")[0].strip()
        if value:
            into.add(value)
    first = request.headers.get("forwarded", "").split(",")[0]
    for pair in first.split(";"):
        key, _, value = pair.partition("=")
        value = value.strip().strip('"')
        if key.strip().lower() == "proto" and value:
            schemes.add(value)
        elif key.strip().lower() == "host" and value:
            hosts.add(value)
    return schemes, hosts


def _printable(text: str, limit: int = 200) -> str:
    """For the log: one line, of bounded length, whatever a request held."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _seconds(value: Any) -> bool:
    """Whether `value` is a time a page can send: a finite number >= 0 (not a bool, not an integer
    too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:
        return False


class _Headers:
    """ASGI middleware: the security headers on every reply, and no caching of anything but the
    page's assets (the API's state changes with every answer; the page's URL holds a token)."""

    def __init__(self, app: Callable):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cacheable = scope["path"].startswith("/static/")

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if not cacheable:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)


def same_token(known: str, given: str) -> bool:
    """In constant time (a timing cannot tell how much of a guess was right); as bytes, since a
    guess may hold any character."""
    return hmac.compare_digest(known.encode(), given.encode("utf-8", "surrogatepass"))


def create_app(
    store: Store, guidelines: str, static: Path = STATIC, public_url: str | None = None
) -> _Headers:
    """The application over an open store. `static`: the folder of the page (label.html) and its
    assets. `public_url`: where annotators open the page when a reverse proxy stands in front (its
    origin is accepted for answers, whatever Host the proxy sends). Handlers are coroutines that
    touch the store without awaiting, so the event loop runs one answer at a time to its end: writes
    never interleave, whoever sends them. The security headers wrap it all, Starlette's own 500
    included; every refusal is logged with its reason (tokens left out)."""
    public = origin_of(public_url) if public_url else None

    def annotator_of(request: Request) -> str:
        given = request.path_params["token"]
        found = [name for name, known in store.tokens.items() if same_token(known, given)]
        if not found:
            raise _forbidden()
        return found[0]

    def admin(request: Request) -> None:
        if not same_token(store.admin, request.path_params["token"]):
            raise _forbidden()

    def same_origin(request: Request) -> None:
        """A POST comes from the page itself: its Origin (when the browser sends one) is this
        server's, as the request or a reverse proxy names it, or --public-url's."""
        origin = request.headers.get("origin")
        if origin is None:
            return
        schemes, hosts = _forwarded(request)
        accepted = {origin_of(f"{scheme}://{host}") for scheme in schemes for host in hosts}
        accepted = {found for found in accepted | {public} if found}
        if origin_of(origin) in accepted:  # "null" (a sandboxed or file: page) has no origin
            return
        shown = _printable(origin)
        raise _refusal(
            403,
            "cross-origin request refused",
            f"cross-origin request: the page is at {shown}, this server is "
            f"{' or '.join(sorted(_printable(found) for found in accepted))} as the request names "
            f"it; if that is this server behind a reverse proxy, {PROXY_HINT} {shown}",
        )

    def shown_path(request: Request) -> str:
        """The request's path for the log, with every token, right or wrong, left out."""
        path = re.sub(r"^/(a|status)/[^/]*", r"/\1/...", request.url.path)
        for token in (*store.tokens.values(), store.admin):
            path = path.replace(token, "...")
        return _printable(path)

    guidelines_html = markdown_html(guidelines)

    def shown(annotator: str, item_id: str) -> dict[str, Any]:
        item = store.item(annotator, item_id)
        item.update(
            left_html=markdown_html(item["left"]),
            right_html=markdown_html(item["right"]),
            skipped_before=store.skipped_before(annotator, item_id),
        )
        return item

    def state(annotator: str) -> dict[str, Any]:
        item_id = store.current(annotator)
        done, total = store.progress(annotator)
        return {
            "annotator": annotator,
            "item": None if item_id is None else shown(annotator, item_id),
            "progress": {
                "done": done,
                "total": total,
                "skipped": store.counts(annotator)["skipped"],
            },
            "can_undo": bool(store.answers[annotator]),
            "guidelines": guidelines,
            "guidelines_html": guidelines_html,
        }

    async def posted(request: Request) -> dict[str, Any]:
        """The JSON body of a POST from the page itself: same origin, JSON, at most MAX_BODY."""
        same_origin(request)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _refusal(415, "expected Content-Type: application/json")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            raise _refusal(413, f"request body over {MAX_BODY} bytes")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise _refusal(413, f"request body over {MAX_BODY} bytes")
        try:
            value = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            raise _refusal(400, "the body is not JSON") from None
        if not isinstance(value, dict):
            raise _refusal(400, "expected a JSON object")
        return value

    async def page(request: Request) -> Response:
        annotator_of(request)
        return FileResponse(static / "label.html", media_type="text/html; charset=utf-8")

    async def get_state(request: Request) -> Response:
        return JSONResponse(state(annotator_of(request)))

    async def answer(request: Request) -> Response:
        annotator = annotator_of(request)
        body = await posted(request)
        item_id, choice, seconds = body.get("item_id"), body.get("choice"), body.get("seconds")
        comment = body.get("comment")
        if not isinstance(item_id, str):
            raise _refusal(400, "expected item_id, a string")
        if choice not in ACTIONS:
            raise _refusal(400, f"expected choice, one of {', '.join(ACTIONS)}")
        if not _seconds(seconds):
            raise _refusal(400, "expected seconds, a number >= 0")
        if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
            raise _refusal(400, f"expected comment, a text of at most {MAX_COMMENT} characters")
        comment = (comment or "").strip() or None
        if choice == "problem" and comment is None:
            raise _refusal(400, "a problem needs a comment saying what it is")
        if store.current(annotator) != item_id:
            return _error(409, "not your current item", state=state(annotator))
        try:
            store.answer(annotator, item_id, choice, seconds, comment)
        except NotSaved as error:
            return _not_saved(error)
        return JSONResponse(state(annotator))

    async def undo(request: Request) -> Response:
        annotator = annotator_of(request)
        await posted(request)
        if not store.answers[annotator]:
            return _error(409, "nothing to undo", state=state(annotator))
        try:
            store.undo(annotator)
        except NotSaved as error:
            return _not_saved(error)
        return JSONResponse(state(annotator))

    async def status_json(request: Request) -> Response:
        admin(request)
        return JSONResponse(status(store))

    async def status_page(request: Request) -> Response:
        admin(request)
        return HTMLResponse(status_html(status(store)))

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)  # no icon: browsers ask for one on every page

    async def refused(request: Request, exc: Exception) -> Response:
        refusal = exc if isinstance(exc, _Refused) else _forbidden()
        given = request.path_params.get("token", "")
        who = [name for name, known in store.tokens.items() if given and same_token(known, given)]
        log.warning(
            "farm-label: refused %s %s%s: %d %s",
            request.method,
            shown_path(request),
            f" ({who[0]})" if who else "",
            refusal.response.status_code,
            refusal.reason,
        )
        return refusal.response

    routes = [
        Route("/a/{token}", page),
        Route("/a/{token}/api/state", get_state),
        Route("/a/{token}/api/answer", answer, methods=["POST"]),
        Route("/a/{token}/api/undo", undo, methods=["POST"]),
        Route("/status/{token}.json", status_json),
        Route("/status/{token}", status_page),
        Route("/favicon.ico", favicon),
        Mount("/static", StaticFiles(directory=static, check_dir=False)),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={_Refused: refused, 404: refused, 405: refused},
    )
    return _Headers(app)


def status(store: Store) -> dict[str, Any]:
    """The organiser's view: each annotator's progress and check score, and whether LABELS is whole."""
    annotators = []
    for name in store.assignment.queues:
        done, total = store.progress(name)
        right, answered = store.check_score(name)
        annotators.append(
            {
                "annotator": name,
                "done": done,
                "total": total,
                **store.counts(name),
                "checks_right": right,
                "checks_answered": answered,
                "check_score": right / answered if answered else None,
                "screened_out": store.screened(name),
            }
        )
    return {
        "output": str(store.output),
        "complete": store.complete(),
        "min_check_score": store.min_check_score,
        "annotators": annotators,
    }


def status_html(report: dict[str, Any]) -> str:
    rows = "".join(
        "<tr><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "</tr>".format(
            html.escape(row["annotator"]),
            row["done"],
            row["total"],
            row["labelled"],
            row["flagged"],
            row["skipped"],
            row["comments"],
            "-"
            if row["check_score"] is None
            else f"{row['checks_right']} / {row['checks_answered']} ({row['check_score']:.0%})"
            + (
                " screened out: their labels are left out of the estimates"
                if row["screened_out"]
                else ""
            ),
        )
        for row in report["annotators"]
    )
    said = (
        "complete: every annotator has labelled every pair" if report["complete"] else "in progress"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>farm-label status</title>'
        f"</head><body><h1>farm-label status</h1><p>{html.escape(report['output'])}: {said}</p>"
        "<table><thead><tr><th>annotator</th><th>done</th><th>labelled</th><th>flagged</th>"
        "<th>skipped (to come back)</th><th>comments</th><th>checks right</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></body></html>\n"
    )


def summary(store: Store) -> list[str]:
    """The lines printed when the server stops."""
    report = status(store)
    lines = []
    for row in report["annotators"]:
        checks = (
            f", checks {row['checks_right']}/{row['checks_answered']}"
            if row["checks_answered"]
            else ""
        )
        others = [f"{row['flagged']} of them flagged"] if row["flagged"] else []
        others += [f"{row['skipped']} skipped, to come back"] if row["skipped"] else []
        said = f" ({', '.join(others)})" if others else ""
        if row["screened_out"]:
            checks += (
                f", screened out (checks below {report['min_check_score']:.0%}: their labels carry "
                "screened_out and are left out of farm-winrate --humans and farm-correlate)"
            )
        lines.append(f"{row['annotator']}: {row['done']}/{row['total']} labelled{said}{checks}")
    lines.append(
        f"{report['output']} is complete"
        if report["complete"]
        else f"{report['output']} is not complete yet: run the same command to resume"
    )
    return lines


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port), or a FarmError saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        raise FarmError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise FarmError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port "
            "(--port 0 picks a free one)"
        ) from None
    return listener


def base_url(listener: socket.socket, host: str) -> str:
    port = listener.getsockname()[1]
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


class _Stopped(Exception):
    pass


def _stop(number: int, frame: Any) -> None:
    raise _Stopped


def serve(app: Callable, listener: socket.socket) -> None:
    """Serve until SIGINT or SIGTERM (uvicorn finishes the requests in flight, then returns)."""
    # uvicorn re-raises the signal that stopped it once it is done: with these handlers that is an
    # exception caught here, so a SIGTERM ends the command as a Ctrl-C does, with the summary
    previous = {number: signal.signal(number, _stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        uvicorn.Server(config).run(sockets=[listener])
    except _Stopped:
        pass
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
