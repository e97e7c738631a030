"""farm-label's HTTP API through Starlette's TestClient: state, answer, undo and 409 on a stale item;
the records written; every security rule (tokens, other annotators' items, body cap, origin, content
type, the status page's admin token, the headers)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from farmkit.annotate.label.server import FORBIDDEN, MAX_BODY, create_app  # noqa: E402
from farmkit.annotate.label.store import open_store  # noqa: E402

GUIDELINES = "Prefer the answer that does what was asked."
# the contract's headers, written out: the server's own table could lose one unnoticed
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
INJECTION = '<script>alert(1)</script><img src=x onerror="alert(2)"> [x](javascript:alert(3))'


def pairs(count: int) -> list[dict]:
    return [
        {
            "instruction": f"task {index}",
            "input": "context" if index == 0 else "",
            "output_1": f"first {index}",
            "output_2": f"second {index} {INJECTION}",
            "generator_1": "ref",
            "generator_2": "model",
            "id": f"id-{index}",
        }
        for index in range(count)
    ]


CHECKS = [{"instruction": "2+2?", "input": "", "output_1": "4", "output_2": "5", "preference": 1}]


@pytest.fixture(name="session")
def session_fixture(tmp_path):
    static = tmp_path / "static"
    static.mkdir()
    (static / "label.html").write_text("<!doctype html><title>page</title>\n")
    (static / "label.js").write_text("// the page's script\n")
    store = open_store(str(tmp_path / "labels.jsonl"), pairs(6), CHECKS, ("alice", "bob"), 0.0, 0)
    client = TestClient(create_app(store, GUIDELINES, static))
    yield store, client
    store.close()


def api(store, name: str, route: str) -> str:
    return f"/a/{store.tokens[name]}/api/{route}"


def post(client, url: str, body: dict, **headers) -> object:
    return client.post(
        url, content=json.dumps(body), headers={"Content-Type": "application/json", **headers}
    )


def written(store) -> list[dict]:
    return [json.loads(line) for line in store.output.read_text().splitlines()]


def test_state_shows_the_current_item_in_its_order_progress_and_guidelines(session):
    store, client = session
    reply = client.get(api(store, "alice", "state"))
    assert reply.status_code == 200
    state = reply.json()
    assert set(state) == {
        "annotator",
        "item",
        "progress",
        "can_undo",
        "guidelines",
        "guidelines_html",
    }
    assert state["annotator"] == "alice" and state["guidelines"] == GUIDELINES
    assert state["guidelines_html"] == f"<p>{GUIDELINES}</p>\n"
    total = len(store.assignment.queues["alice"])
    assert state["progress"] == {"done": 0, "total": total, "skipped": 0}
    assert state["can_undo"] is False
    item = state["item"]
    assert set(item) == {
        "item_id",
        "instruction",
        "input",
        "left",
        "right",
        "left_html",
        "right_html",
        "skipped_before",
    }
    assert item["skipped_before"] is False
    pair = store.pairs[item["item_id"]]
    swapped = store.assignment.swapped("alice", item["item_id"])
    assert (item["left"], item["right"]) == (
        (pair["output_2"], pair["output_1"]) if swapped else (pair["output_1"], pair["output_2"])
    )
    assert item["input"] == (pair["input"] or None)


def answer_all(store, client, name: str, choice: str = "A_much") -> list[dict]:
    states = []
    while (state := client.get(api(store, name, "state")).json())["item"] is not None:
        body = {"item_id": state["item"]["item_id"], "choice": choice, "seconds": 2.5}
        reply = post(client, api(store, name, "answer"), body)
        assert reply.status_code == 200, reply.text
        states.append(reply.json())
    return states


def test_answers_become_preference_records_mapped_back_from_the_order_shown(session):
    store, client = session
    states = answer_all(store, client, "alice", "A_slightly")
    assert (
        states[-1]["item"] is None
        and states[-1]["progress"]["done"] == states[-1]["progress"]["total"]
    )
    records = written(store)
    assert len(records) == len(store.assignment.queues["alice"]) - 1  # the check goes elsewhere
    assert {record["shown"][0] for record in records} == {"output_1", "output_2"}  # both orders met
    for record in records:
        left = record["shown"][0]
        assert record["preference"] == (1 if left == "output_1" else 2)
        assert record["strength"] == "slightly" and record["annotator"] == "alice"
        assert record["seconds"] == 2.5 and record["time"].endswith("+00:00")
        assert record["generator_2"] == "model" and record["id"].startswith("id-")
        assert record["output_2"].endswith(INJECTION)  # stored as given, never rewritten
    (check,) = [json.loads(line) for line in store.checks_path.read_text().splitlines()]
    assert check["known_preference"] == 1 and check["annotator"] == "alice"
    assert store.check_score("alice") == (int(check["preference"] == 1), 1)


def test_a_tie_has_preference_one_and_a_half_and_no_strength(session):
    store, client = session
    state = client.get(api(store, "bob", "state")).json()
    body = {"item_id": state["item"]["item_id"], "choice": "tie", "seconds": 1}
    assert post(client, api(store, "bob", "answer"), body).status_code == 200
    (record,) = written(store) or [json.loads(store.checks_path.read_text())]  # or a check
    assert (record["preference"], record["strength"]) == (1.5, None)


def test_a_stale_or_foreign_item_is_409_with_the_state_and_nothing_is_written(session):
    store, client = session
    current = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
    bobs = store.assignment.queues["bob"][0]
    for item_id in (bobs, "p999", store.assignment.queues["alice"][1]):
        reply = post(
            client,
            api(store, "alice", "answer"),
            {"item_id": item_id, "choice": "tie", "seconds": 1},
        )
        assert reply.status_code == 409
        assert reply.json()["state"]["item"]["item_id"] == current
    assert store.journal_path.read_bytes() == b""
    first = post(
        client, api(store, "alice", "answer"), {"item_id": current, "choice": "tie", "seconds": 1}
    )
    assert first.status_code == 200
    again = post(
        client, api(store, "alice", "answer"), {"item_id": current, "choice": "tie", "seconds": 1}
    )
    assert again.status_code == 409  # a double click answers once
    assert len(store.journal_path.read_bytes().splitlines()) == 1


def test_undo_removes_the_last_answer_and_shows_that_item_again(session):
    store, client = session
    assert post(client, api(store, "alice", "undo"), {}).status_code == 409  # nothing to undo
    first = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
    post(
        client, api(store, "alice", "answer"), {"item_id": first, "choice": "B_much", "seconds": 3}
    )
    reply = post(client, api(store, "alice", "undo"), {})
    assert reply.status_code == 200
    state = reply.json()
    assert state["item"]["item_id"] == first and state["progress"]["done"] == 0
    assert state["can_undo"] is False
    assert store.output.read_text() == ""


@pytest.mark.parametrize(
    "body",
    [
        {"choice": "tie", "seconds": 1},
        {"item_id": "p0", "choice": "A", "seconds": 1},
        {"item_id": "p0", "choice": "tie", "seconds": -1},
        {"item_id": "p0", "choice": "tie", "seconds": "1"},
        {"item_id": "p0", "choice": "tie", "seconds": True},
        {"item_id": "p0", "choice": "tie", "seconds": 1, "comment": 3},
        {"item_id": "p0", "choice": "tie", "seconds": 1, "comment": "x" * 2001},
        {"item_id": "p0", "choice": "flag", "seconds": 1, "comment": "broken"},
        [1, 2],
    ],
)
def test_a_malformed_answer_is_400_and_nothing_is_written(session, body):
    store, client = session
    reply = post(client, api(store, "alice", "answer"), body)
    assert reply.status_code == 400 and "expected" in reply.json()["error"]
    assert store.journal_path.read_bytes() == b""


@pytest.mark.parametrize(
    "raw",
    [
        '{"item_id": "p3", "choice": "tie", "seconds": 1' + "0" * 400 + "}",
        '{"item_id": "p3", "choice": "tie", "seconds": 1e999}',
        '{"item_id": "p3", "choice": "tie", "seconds": 1, "x": ' + "[" * 1000 + "]" * 1000 + "}",
        "[" * 8000 + "]" * 8000,
    ],
)
def test_a_malformed_body_is_400_with_the_headers_and_nothing_is_written(session, raw):
    store, client = session
    assert store.current("alice") == "p3"
    reply = client.post(
        api(store, "alice", "answer"), content=raw, headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 400, reply.text
    assert "expected" in reply.json()["error"] or "not JSON" in reply.json()["error"]
    for name, value in HEADERS.items():
        assert reply.headers[name] == value
    assert store.journal_path.read_bytes() == b""


def test_even_an_unexpected_error_is_500_with_the_headers(session, monkeypatch):
    store, _ = session

    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(store, "answer", broken)
    app = create_app(store, GUIDELINES, store.output.parent / "static")
    client = TestClient(app, raise_server_exceptions=False)
    body = {"item_id": "p3", "choice": "tie", "seconds": 1}
    reply = post(client, api(store, "alice", "answer"), body)
    assert reply.status_code == 500 and "a bug" not in reply.text
    for name, value in HEADERS.items():
        assert reply.headers[name] == value
    assert reply.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    "path",
    [
        "/a/{wrong}",
        "/a/{wrong}/api/state",
        "/a/",
        "/a",
        "/",
        "/status/{wrong}",
        "/status/{wrong}.json",
        "/status/{alice}",
        "/a/{admin}/api/state",
    ],
)
@pytest.mark.parametrize("wrong", ["x" * 32, "%C3%A9t%C3%A9", "..%2F..%2Fetc"])
def test_a_wrong_or_missing_token_gets_403_and_the_same_body(session, path, wrong):
    store, client = session
    url = path.format(wrong=wrong, alice=store.tokens["alice"], admin=store.admin)
    reply = client.get(url)
    assert (reply.status_code, reply.text) == (403, FORBIDDEN)
    reply = client.post(
        url + "/api/answer" if path == "/a/{wrong}" else url,
        content="{}",
        headers={"Content-Type": "application/json"},
    )
    assert (reply.status_code, reply.text) == (403, FORBIDDEN)


def test_the_page_and_its_assets_are_served(session):
    store, client = session
    page = client.get(f"/a/{store.tokens['bob']}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert client.get("/static/label.js").status_code == 200
    # the session file (the tokens) is beside the page's folder here: out of reach
    for escape in (
        "/static/../labels.jsonl.session.json",
        "/static/..%2Flabels.jsonl.session.json",
    ):
        reply = client.get(escape)
        assert reply.status_code != 200 and store.admin not in reply.text


def test_every_reply_carries_the_security_headers_and_the_api_is_not_cached(session):
    store, client = session
    for url in (
        f"/a/{store.tokens['bob']}",
        api(store, "bob", "state"),
        "/nowhere",
        f"/status/{store.admin}",
    ):
        reply = client.get(url)
        for name, value in HEADERS.items():
            assert reply.headers[name] == value, (url, name)
        assert reply.headers["cache-control"] == "no-store", url


def test_the_favicon_request_is_an_empty_204_not_a_refusal(session):
    """Every browser asks for /favicon.ico: a 403 for it would be a red line in every console."""
    _, client = session
    reply = client.get("/favicon.ico")
    assert (reply.status_code, reply.content) == (204, b"")
    for name, value in HEADERS.items():
        assert reply.headers[name] == value


def test_a_cross_origin_post_is_refused(session):
    store, client = session
    item = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
    body = {"item_id": item, "choice": "A_much", "seconds": 1}
    reply = post(client, api(store, "alice", "answer"), body, Origin="http://evil.example")
    assert reply.status_code == 403
    assert post(client, api(store, "alice", "undo"), {}, Origin="null").status_code == 403
    assert store.journal_path.read_bytes() == b""
    same = post(client, api(store, "alice", "answer"), body, Origin="http://testserver")
    assert same.status_code == 200


PUBLIC = "https://labels.example.org"


@pytest.mark.parametrize(
    "headers",
    [
        # nginx with proxy_set_header Host $host and X-Forwarded-Proto $scheme
        {"Host": "labels.example.org", "X-Forwarded-Proto": "https"},
        # a proxy that keeps its own Host and says the public one (Apache's default)
        {
            "Host": "upstream-name",
            "X-Forwarded-Host": "labels.example.org",
            "X-Forwarded-Proto": "https",
        },
        {
            "Host": "upstream-name",
            "Forwarded": 'for=10.0.0.1;proto=https;host="labels.example.org"',
        },
    ],
)
def test_behind_a_reverse_proxy_the_forwarded_origin_is_accepted(session, headers):
    store, client = session
    body = {"item_id": store.current("alice"), "choice": "A_much", "seconds": 1}
    reply = post(client, api(store, "alice", "answer"), body, Origin=PUBLIC, **headers)
    assert reply.status_code == 200, reply.text
    # what the proxy says never lets another site in
    body = {"item_id": store.current("alice"), "choice": "A_much", "seconds": 1}
    reply = post(
        client, api(store, "alice", "answer"), body, Origin="https://evil.example", **headers
    )
    assert reply.status_code == 403


def test_with_public_url_a_proxy_s_own_host_is_accepted_and_a_refusal_is_logged(session, caplog):
    store, client = session
    body = {"item_id": store.current("alice"), "choice": "A_much", "seconds": 1}
    nginx = {"Origin": PUBLIC, "Host": "upstream-name"}  # nginx's default Host; no X-Forwarded-*
    with caplog.at_level("WARNING", logger="farmkit"):
        reply = post(client, api(store, "alice", "answer"), body, **nginx)
    assert reply.status_code == 403 and store.journal_path.read_bytes() == b""
    said = caplog.text
    assert (
        "farm-label: refused POST /a/.../api/answer (alice): 403 cross-origin request: the page is "
        f"at {PUBLIC}, this server is http://upstream-name as the request names it; if that is "
        "this server behind a reverse proxy, pass the public Host and X-Forwarded-Proto (nginx: proxy_set_header Host "
        "$host; proxy_set_header X-Forwarded-Proto $scheme), or give --public-url "
        f"{PUBLIC}"
    ) in said
    assert store.tokens["alice"] not in said
    static = store.output.parent / "static"
    proxied = TestClient(create_app(store, GUIDELINES, static, public_url=PUBLIC))
    assert post(proxied, api(store, "alice", "answer"), body, **nginx).status_code == 200
    body = {"item_id": store.current("alice"), "choice": "A_much", "seconds": 1}
    reply = post(proxied, api(store, "alice", "answer"), body, Origin="https://evil.example")
    assert reply.status_code == 403


def test_every_refusal_is_logged_with_its_reason_and_never_a_token(session, caplog):
    store, client = session
    bob = store.tokens["bob"]
    near_miss = bob[:-1] + ("y" if bob.endswith("x") else "x")  # a link copied with a typo
    with caplog.at_level("WARNING", logger="farmkit"):
        client.get(f"/a/{near_miss}/api/state")
        client.get(f"/status/{store.tokens['alice']}")
        client.post(
            api(store, "alice", "answer"), content="{}", headers={"Content-Type": "text/plain"}
        )
        post(client, api(store, "alice", "answer"), {"item_id": "p3", "choice": "no", "seconds": 1})
        client.get("/nowhere%1B[2Kfarm-label: forged")
    lines = caplog.text.splitlines()
    for expected in (
        "farm-label: refused GET /a/.../api/state: 403 a wrong token or no such page",
        "farm-label: refused GET /status/... (alice): 403 a wrong token or no such page",
        "farm-label: refused POST /a/.../api/answer (alice): 415 expected Content-Type: "
        "application/json",
        "farm-label: refused POST /a/.../api/answer (alice): 400 expected choice, one of",
        "farm-label: refused GET /nowhere?[2Kfarm-label: forged: 403 a wrong token or no such page",
    ):
        assert any(expected in line for line in lines), (expected, lines)
    assert near_miss[:20] not in caplog.text and store.tokens["alice"] not in caplog.text


@pytest.mark.parametrize(
    "kind",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_a_post_that_is_not_json_is_refused(session, kind):
    """A form or a text/plain fetch is what another page can send without asking the browser first."""
    store, client = session
    item = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
    body = json.dumps({"item_id": item, "choice": "A_much", "seconds": 1})
    headers = {"Content-Type": kind} if kind else {}
    reply = client.post(api(store, "alice", "answer"), content=body, headers=headers)
    assert reply.status_code == 415
    assert store.journal_path.read_bytes() == b""


def test_a_body_over_the_cap_is_413(session):
    store, client = session
    item = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
    body = {"item_id": item, "choice": "A_much", "seconds": 1, "pad": "x" * MAX_BODY}
    assert post(client, api(store, "alice", "answer"), body).status_code == 413

    def chunks():  # no Content-Length: the cap holds on what arrives
        yield b'{"item_id": "' + item.encode() + b'", "pad": "'
        for _ in range(20):
            yield b"x" * 1024
        yield b'"}'

    reply = client.post(
        api(store, "alice", "answer"),
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 413
    assert store.journal_path.read_bytes() == b""


def test_the_status_page_needs_the_admin_token_and_shows_progress_and_checks(session):
    store, client = session
    answer_all(store, client, "alice", "A_much")
    report = client.get(f"/status/{store.admin}.json").json()
    rows = {row["annotator"]: row for row in report["annotators"]}
    assert rows["alice"]["done"] == rows["alice"]["total"] > 0
    assert rows["alice"]["checks_answered"] == 1
    assert rows["bob"]["done"] == 0 and report["complete"] is False
    page = client.get(f"/status/{store.admin}")
    assert page.status_code == 200 and "alice" in page.text and "in progress" in page.text
    answer_all(store, client, "bob", "B_much")
    assert client.get(f"/status/{store.admin}.json").json()["complete"] is True
    assert "complete" in client.get(f"/status/{store.admin}").text


@pytest.mark.parametrize("route", ["answer", "undo"])
def test_an_answer_the_disk_cannot_take_is_507_with_the_headers_and_can_be_sent_again(
    session, monkeypatch, route, caplog
):
    from test_label_store import fill_the_disk

    store, client = session
    for _ in range(2):
        item = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
        post(
            client, api(store, "alice", "answer"), {"item_id": item, "choice": "tie", "seconds": 1}
        )
    item = client.get(api(store, "alice", "state")).json()["item"]["item_id"]
    body = {"item_id": item, "choice": "B_much", "seconds": 4} if route == "answer" else {}
    labels, journal = store.output.read_bytes(), store.journal_path.read_bytes()
    fill_the_disk(monkeypatch)
    with caplog.at_level("WARNING", logger="farmkit"):
        reply = post(client, api(store, "alice", route), body)
    assert reply.status_code == 507
    for name, value in HEADERS.items():
        assert reply.headers[name] == value
    assert reply.headers["cache-control"] == "no-store"
    said = reply.json()["error"]
    assert said == "not saved (No space left on device); nothing of it was kept", said
    assert "could not save alice's" in caplog.text and "No space left on device" in caplog.text
    assert (store.output.read_bytes(), store.journal_path.read_bytes()) == (labels, journal)
    assert client.get(api(store, "alice", "state")).json()["item"]["item_id"] == item  # unmoved
    monkeypatch.undo()  # space comes back: the page sends the same request again
    assert post(client, api(store, "alice", route), body).status_code == 200
    done = 3 if route == "answer" else 1
    assert client.get(api(store, "alice", "state")).json()["progress"]["done"] == done


def test_an_annotator_below_min_check_score_is_screened_out_and_said(tmp_path):
    """farm-label --min-check-score 0.8: alice answers every check wrong (0/2), bob right (2/2).
    Alice's labels in LABELS carry screened_out (bob's do not); the status and the summary say so."""
    from farmkit.annotate.label.server import status, status_html, summary

    checks = [{**CHECKS[0], "instruction": f"known {k}", "preference": 1.5} for k in range(2)]
    with open_store(
        str(tmp_path / "labels.jsonl"),
        pairs(6),
        checks,
        ("alice", "bob"),
        0.0,
        0,
        min_check_score=0.8,
    ) as store:
        for name in ("alice", "bob"):
            while (item := store.current(name)) is not None:
                right = name == "bob" and item in store.checks  # a tie is each check's answer
                store.answer(name, item, "tie" if right else "A_much", 1.0)
        labels = written(store)
        report = status(store)
        said = summary(store)
        page = status_html(report)
    assert {record["annotator"] for record in labels} == {"alice", "bob"}
    flagged = [record.get("screened_out", False) for record in labels]
    assert flagged == [record["annotator"] == "alice" for record in labels]
    assert [row["screened_out"] for row in report["annotators"]] == [True, False]
    assert report["min_check_score"] == 0.8
    assert any(
        line.startswith("alice: ") and "screened out (checks below 80%" in line for line in said
    )
    assert not any(line.startswith("bob: ") and "screened out" in line for line in said)
    assert page.count("screened out") == 1


def send(client, store, name: str, choice: str, comment: str | None = None) -> dict:
    """Answer NAME's current item with CHOICE (a label, skip, cant_judge or problem): the new state."""
    item = client.get(api(store, name, "state")).json()["item"]["item_id"]
    body = {"item_id": item, "choice": choice, "seconds": 1.5}
    if comment is not None:
        body["comment"] = comment
    reply = post(client, api(store, name, "answer"), body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_skipped_pair_comes_back_after_the_rest_and_is_no_label(session):
    store, client = session
    queue = store.assignment.queues["alice"]
    after = send(client, store, "alice", "skip", "  need to think  ")
    assert after["item"]["item_id"] == queue[1] and after["can_undo"] is True
    assert after["progress"] == {"done": 0, "total": len(queue), "skipped": 1}
    (skip,) = written(store)
    assert skip["preference"] is None and skip["skipped"] is True and "flag" not in skip
    assert skip["preference_reason"].startswith("skipped") and skip["comment"] == "need to think"
    assert (
        skip["annotator"] == "alice" and skip["instruction"] == store.pairs[queue[0]]["instruction"]
    )
    for _ in queue[1:]:
        state = send(client, store, "alice", "A_much")
    # the rest answered: the skipped pair is back, said to be
    assert state["item"]["item_id"] == queue[0] and state["item"]["skipped_before"] is True
    assert state["progress"] == {"done": len(queue) - 1, "total": len(queue), "skipped": 1}
    assert store.complete() is False
    state = send(client, store, "alice", "tie")
    assert state["item"] is None and state["progress"]["skipped"] == 0
    assert state["progress"]["done"] == len(queue)
    # LABELS: the skip, then the labels in the order given (the check's answer goes elsewhere)
    records = written(store)
    assert [r["preference"] is None for r in records] == [True] + [False] * (len(records) - 1)
    assert records[-1]["instruction"] == skip["instruction"] and records[-1]["preference"] == 1.5


def test_undo_takes_back_a_skip_or_a_flag_as_it_does_a_label(session):
    store, client = session
    first = store.assignment.queues["alice"][0]
    send(client, store, "alice", "skip")
    state = post(client, api(store, "alice", "undo"), {}).json()
    assert state["item"]["item_id"] == first and state["item"]["skipped_before"] is False
    assert state["progress"]["skipped"] == 0 and state["can_undo"] is False
    assert written(store) == []
    send(client, store, "alice", "cant_judge", "outside what I know")
    assert [r["flag"] for r in written(store)] == ["cant_judge"]
    state = post(client, api(store, "alice", "undo"), {}).json()
    assert state["item"]["item_id"] == first and state["progress"]["done"] == 0
    assert written(store) == []
    # and a restart replays it all the same
    store.close()
    again = open_store(str(store.output), pairs(6), CHECKS, ("alice", "bob"), 0.0, 0)
    try:
        assert again.current("alice") == first and again.answers["alice"] == []
    finally:
        again.close()


def test_a_flag_ends_the_pair_with_no_label_and_a_problem_needs_a_comment(session):
    store, client = session
    item = client.get(api(store, "bob", "state")).json()["item"]["item_id"]
    bare = {"item_id": item, "choice": "problem", "seconds": 1}
    for body in (bare, {**bare, "comment": "   "}):
        reply = post(client, api(store, "bob", "answer"), body)
        assert reply.status_code == 400 and "a problem needs a comment" in reply.json()["error"]
    assert store.journal_path.read_bytes() == b""
    state = send(client, store, "bob", "problem", "output_2 is cut off mid-sentence")
    assert state["progress"]["done"] == 1 and state["progress"]["skipped"] == 0
    state = send(client, store, "bob", "cant_judge")
    state = send(client, store, "bob", "B_slightly", "close call")
    records = written(store) + (
        [json.loads(line) for line in store.checks_path.read_text().splitlines()]
        if store.checks_path.exists()
        else []
    )
    flags = {r.get("flag"): r for r in records}
    assert flags["problem"]["preference"] is None
    assert flags["problem"]["comment"] == "output_2 is cut off mid-sentence"
    assert flags["cant_judge"]["preference"] is None and "comment" not in flags["cant_judge"]
    assert flags[None]["preference"] in (1, 2) and flags[None]["comment"] == "close call"
    report = client.get(f"/status/{store.admin}.json").json()
    bob = next(row for row in report["annotators"] if row["annotator"] == "bob")
    assert (bob["done"], bob["labelled"], bob["flagged"], bob["skipped"], bob["comments"]) == (
        3,
        1,
        2,
        0,
        2,
    )
    assert bob["checks_answered"] == int(store.assignment.queues["bob"][2].startswith("c"))
    page = client.get(f"/status/{store.admin}").text
    assert "<th>flagged</th>" in page and "<th>skipped (to come back)</th>" in page


MARKDOWN = (
    "Use this:\n\n```python\nprint('<b>hi</b>')\n```\n\n- one <script>window.__pwned=1</script>\n"
    "- two [site](https://example.org) [bad](javascript:alert(1)) ![img](https://example.org/x.png)\n"
    "- three [here](/a/other-token) [mail](mailto:a@example.org) [ftp](ftp://example.org/f)\n"
)


def test_outputs_and_guidelines_are_markdown_rendered_with_no_raw_html(tmp_path):
    static = tmp_path / "static"
    static.mkdir()
    (static / "label.html").write_text("<!doctype html>\n")
    pair = {"instruction": "i", "output_1": MARKDOWN, "output_2": "<img src=x onerror=alert(2)>"}
    store = open_store(str(tmp_path / "labels.jsonl"), [pair], [], ("alice",), 0.0, 0)
    try:
        client = TestClient(create_app(store, "# Rules\n\n1. read\n2. <b>judge</b>\n", static))
        state = client.get(api(store, "alice", "state")).json()
    finally:
        store.close()
    item = state["item"]
    rendered = item["left_html"] if item["left"] == MARKDOWN else item["right_html"]
    raw_img = item["right_html"] if item["left"] == MARKDOWN else item["left_html"]
    assert (
        "<pre><code class=\"language-python\">print('&lt;b&gt;hi&lt;/b&gt;')\n</code></pre>"
        in rendered
    )
    assert "<li>one &lt;script&gt;window.__pwned=1&lt;/script&gt;</li>" in rendered
    assert (
        '<a href="https://example.org" target="_blank" rel="noopener noreferrer nofollow">site</a>'
        in rendered
    )
    assert "javascript:" not in rendered.replace("[bad](javascript:alert(1))", "")
    assert "[bad](javascript:alert(1))" in rendered  # shown as the text it is, not a link
    assert "<img" not in rendered and "<script" not in rendered
    # only http(s) links are links: a path on this server, mailto: or ftp: stay text
    assert rendered.count("<a ") == 2  # the site, and the image's address as a link to it
    assert '!<a href="https://example.org/x.png" target="_blank"' in rendered
    assert (
        "[here](/a/other-token) [mail](mailto:a@example.org) [ftp](ftp://example.org/f)" in rendered
    )
    assert raw_img == "<p>&lt;img src=x onerror=alert(2)&gt;</p>\n"
    assert item["left"] in (MARKDOWN, pair["output_2"])  # the raw text is kept beside it
    assert state["guidelines_html"] == (
        "<h1>Rules</h1>\n<ol>\n<li>read</li>\n<li>&lt;b&gt;judge&lt;/b&gt;</li>\n</ol>\n"
    )


def test_skips_and_flags_are_left_out_of_win_rates_and_agreement(tmp_path):
    """farm-winrate --humans and farm-correlate read LABELS with its skips and flags exactly as
    LABELS with only its labels: a pair skipped or flagged is no label."""
    from click.testing import CliRunner
    from farmkit.tools.farm_correlate import cli as correlate
    from farmkit.tools.farm_winrate import cli as winrate

    static = tmp_path / "static"
    static.mkdir()
    (static / "label.html").write_text("<!doctype html>\n")
    items = pairs(8)
    simulated = tmp_path / "sim.jsonl"
    simulated.write_text(
        "".join(
            json.dumps({**pair, "preference": 1 + (index % 3 != 0), "annotator": "judge"}) + "\n"
            for index, pair in enumerate(items)
        )
    )
    store = open_store(str(tmp_path / "labels.jsonl"), items, [], ("alice", "bob"), 1.0, 0)
    try:
        client = TestClient(create_app(store, GUIDELINES, static))
        plan = {
            "alice": ["skip", "cant_judge", "A_much", "B_much", "tie", "A_slightly"],
            "bob": ["problem", "B_much", "A_much", "skip", "A_much", "B_slightly", "tie"],
        }
        for name, choices in plan.items():
            for choice in choices:
                send(client, store, name, choice, "why" if choice == "problem" else None)
        report = client.get(f"/status/{store.admin}.json").json()
    finally:
        store.close()
    counts = {
        row["annotator"]: (row["labelled"], row["flagged"], row["skipped"])
        for row in report["annotators"]
    }
    assert counts == {"alice": (4, 1, 1), "bob": (5, 1, 1)}
    # farm-label --status says the same, without serving
    from farmkit.tools.farm_label import cli as farm_label

    given = tmp_path / "pairs.jsonl"
    given.write_text("".join(json.dumps(pair) + "\n" for pair in items))
    command = [str(given), "-o", str(store.output), "--annotators", "alice,bob", "--overlap", "1"]
    result = CliRunner().invoke(farm_label, [*command, "--seed", "0", "--status"])
    assert result.exit_code == 75, result.output  # not complete: a skipped pair is still to come
    assert json.loads(result.stdout)["annotators"] == report["annotators"]
    labels = [json.loads(line) for line in store.output.read_text().splitlines()]
    assert sum(record["preference"] is None for record in labels) == 4
    only = tmp_path / "only_labels.jsonl"
    only.write_text("".join(json.dumps(r) + "\n" for r in labels if r["preference"] is not None))

    def figures(tool, *args):
        result = CliRunner().invoke(tool, [*map(str, args)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        for row in rows:
            row.pop("provenance", None)
        return rows

    read = {}
    for tool, args in (
        (winrate, [simulated, "--reference-generator", "ref", "--no-length-control", "--humans"]),
        (correlate, ["--judge", simulated, "--humans"]),
    ):
        read[tool] = with_skips = figures(tool, *args, store.output)
        assert with_skips == figures(tool, *args, only) and with_skips
    (row,) = read[winrate]
    labelled = {r["instruction"] for r in labels if r["preference"] is not None}
    assert row["n_human"] == len(labelled) < 8  # the pairs someone labelled, and only those
