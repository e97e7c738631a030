"""farm-label's page as its users meet it: a real `farm-label` process and a real headless Chromium,
driven by clicks and keys (`make test-browser`; left out of `make test`)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dev.browser import (
    LabelServer,
    act,
    choose,
    chromium_missing,
    click,
    double_click,
    open_browser,
    open_page,
    page_state,
    plain,
    press,
    reload_page,
    shown_text,
    wait_until,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing())),
]

CHOICES = ["A_much", "A_slightly", "tie", "B_slightly", "B_much"]
KEYS = {choice: str(number) for number, choice in enumerate(CHOICES, 1)}


def write_pairs(path, count: int, topic: str = "question") -> list[dict]:
    pairs = [
        {
            "id": f"{topic}-{number}",
            "instruction": f"Answer {topic} {number}.",
            "input": f"context {number}" if number % 2 else "",
            "output_1": f"First answer to {topic} {number}.\n  (indented second line)",
            "output_2": f"Second answer to {topic} {number}.",
            "generator_1": "one",
            "generator_2": "two",
        }
        for number in range(count)
    ]
    path.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return pairs


@contextmanager
def serving(tmp_path, count: int, *options: str) -> Iterator[tuple[LabelServer, list[dict], Path]]:
    """farm-label on COUNT pairs written under tmp_path, with OPTIONS, on a free port:
    (the server, the pairs, its -o)."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", count)
    output = tmp_path / "labels.jsonl"
    with LabelServer(tmp_path / "pairs.jsonl", "-o", output, "--port", "0", *options) as server:
        yield server, pairs, output


def read_labels(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_preference(record: dict, choice: str) -> tuple[float, str | None]:
    """The preference and strength CHOICE means, given the order the record says was shown."""
    if choice == "tie":
        return 1.5, None
    picked = record["shown"][0] if choice.startswith("A_") else record["shown"][1]
    return (1 if picked == "output_1" else 2), choice.split("_")[1]


def check_labels(labels: list[dict], seen: list[dict], annotator: str) -> None:
    """Each answer in -o is the pair that was on screen, mapped back through its order shown."""
    assert len(labels) == len(seen)
    by_instruction = {label["instruction"]: label for label in labels}
    assert len(by_instruction) == len(labels), "an item written twice"
    for screen in seen:
        label = by_instruction[screen["instruction"]]
        assert sorted(label["shown"]) == ["output_1", "output_2"]
        # the outputs are rendered from markdown: their text is the raw text, line breaks aside
        assert (shown_text(label[label["shown"][0]]), shown_text(label[label["shown"][1]])) == (
            plain(screen["left"]),
            plain(screen["right"]),
        )
        assert (label["preference"], label["strength"]) == expected_preference(
            label, screen["choice"]
        )
        assert label["annotator"] == annotator
        assert label["seconds"] > 0
        assert label["generator_1"] == "one" and label["generator_2"] == "two"


def label(driver, choice: str, by_key: bool) -> tuple[dict, dict]:
    """Answer the pair on screen with CHOICE; (what was on screen, the page after)."""
    screen = {**page_state(driver), "choice": choice}
    after = act(driver, press(KEYS[choice]) if by_key else choose(choice))
    assert after["error"] is None, after["error"]
    return screen, after


def test_a_batch_by_clicks_and_keys(tmp_path):
    with serving(tmp_path, 10, "--annotators", "alice") as (server, pairs, output):
        with open_browser() as driver:
            state = open_page(driver, server.links["alice"])
            assert state["progress"] == "0 / 10"
            assert driver.find_element("css selector", "#annotator").text == "alice"
            labels = [
                driver.find_element("css selector", f'button[data-choice="{choice}"]')
                for choice in CHOICES
            ]
            assert [button.get_attribute("aria-label") for button in labels] == [
                "A much better",
                "A slightly better",
                "Tie",
                "B slightly better",
                "B much better",
            ]
            seen = []
            for number in range(10):
                screen, after = label(driver, CHOICES[number % 5], by_key=number >= 5)
                seen.append(screen)
                assert after["progress"] == f"{number + 1} / 10"
                # the input is shown only when the pair has one
                pair = next(p for p in pairs if p["instruction"] == screen["instruction"])
                assert screen["input"] == (pair["input"] or None)
            assert after["done"] and not after["task"]
            assert driver.find_element("css selector", "#done").is_displayed()
    check_labels(read_labels(output), seen, "alice")
    # the order shown was drawn per item: both orders occur in ten items
    assert {tuple(record["shown"]) for record in read_labels(output)} == {
        ("output_1", "output_2"),
        ("output_2", "output_1"),
    }


def test_undo_by_key_and_button_and_a_reload_midway(tmp_path):
    with serving(tmp_path, 5, "--annotators", "bob") as (server, _, output):
        with open_browser() as driver:
            first = open_page(driver, server.links["bob"])
            assert not first["can_undo"]
            seen = [label(driver, "A_much", by_key=False)[0]]
            second, _ = label(driver, "B_much", by_key=True)
            assert len(read_labels(output)) == 2

            # u: the last answer is gone and its pair is back on screen
            undone = act(driver, press("u"))
            assert (undone["progress"], undone["instruction"]) == ("1 / 5", second["instruction"])
            assert (undone["left"], undone["right"]) == (second["left"], second["right"])
            assert len(read_labels(output)) == 1
            # the button: the first answer goes too
            undone = act(driver, click("#undo"))
            assert (undone["progress"], undone["instruction"]) == ("0 / 5", first["instruction"])
            assert read_labels(output) == [] and not undone["can_undo"]
            seen = [label(driver, "tie", by_key=False)[0]]
            seen.append(label(driver, "A_slightly", by_key=True)[0])

            # a reload continues where the annotator was
            before = page_state(driver)
            reloaded = reload_page(driver)
            for field in ("progress", "instruction", "left", "right"):
                assert reloaded[field] == before[field]
            for number, choice in enumerate(["B_slightly", "A_much", "B_much"]):
                seen.append(label(driver, choice, by_key=number % 2 == 0)[0])
            assert page_state(driver)["done"]
    check_labels(read_labels(output), seen, "bob")


def test_two_annotators_at_once_each_see_only_their_items(tmp_path):
    with serving(tmp_path, 8, "--annotators", "alice,bob") as (server, pairs, output):
        with open_browser() as alice, open_browser() as bob:
            drivers = {"alice": alice, "bob": bob}
            seen = {name: [] for name in drivers}
            states = {
                name: open_page(driver, server.links[name]) for name, driver in drivers.items()
            }
            # the two take turns, each in their own browser, until both are done
            while not all(state["done"] for state in states.values()):
                for name, driver in drivers.items():
                    if not states[name]["done"]:
                        screen, states[name] = label(driver, "A_slightly", by_key=name == "bob")
                        seen[name].append(screen)
    alice_items = {screen["instruction"] for screen in seen["alice"]}
    bob_items = {screen["instruction"] for screen in seen["bob"]}
    assert alice_items and bob_items and not alice_items & bob_items
    assert alice_items | bob_items == {pair["instruction"] for pair in pairs}
    labels = read_labels(output)
    for name in drivers:
        check_labels([r for r in labels if r["annotator"] == name], seen[name], name)


INJECTIONS = [
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1">',
    '<a href="javascript:window.__pwned=1">x</a>',
    "<svg onload=\"window.__pwned=1\"><circle r='9'/></svg>",
    '<iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>',
    "<script>alert(1)</script><img src=y onerror=alert(2)>",
]


INJECTED_ELEMENTS = ", ".join(
    f"{area} {tag}"
    for area in ("#prompt", "#outputs")
    for tag in ("a", "img", "script", "svg", "iframe")
)


def test_injected_outputs_run_nothing_and_stay_visible_as_text(tmp_path):
    pairs = [
        {
            "instruction": f"Repeat this: {injection}",
            "input": injection,
            "output_1": f"Here: {injection}",
            "output_2": injection + "\n" + INJECTIONS[(number + 1) % len(INJECTIONS)],
        }
        for number, injection in enumerate(INJECTIONS)
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    output = tmp_path / "labels.jsonl"
    with LabelServer(tmp_path / "pairs.jsonl", "-o", output, "--port", "0") as server:
        with open_browser() as driver:
            open_page(driver, next(link for name, link in server.links.items() if name != "status"))
            texts = "#instruction, #input, #left .markdown, #right .markdown"
            by_instruction = {pair["instruction"]: pair for pair in pairs}
            steps = 0
            while not page_state(driver)["done"]:
                screen = page_state(driver)
                pair = by_instruction.get(screen["instruction"])
                assert pair, (
                    f"the instruction is not shown as its raw text: {screen['instruction']!r}"
                )
                # the raw text is what the annotator reads, in the order drawn (rendered from
                # markdown with raw HTML off: the same characters, line breaks aside)
                shown = {plain(screen["left"]), plain(screen["right"])}
                assert shown == {shown_text(pair["output_1"]), shown_text(pair["output_2"])}
                assert screen["input"] == pair["input"]
                for element in driver.find_elements("css selector", texts):
                    if element.is_displayed():
                        element.click()  # click into the texts, where a link would be followed
                assert driver.find_elements("css selector", INJECTED_ELEMENTS) == []
                if steps == 3:
                    act(driver, press("u"))  # the pair before comes back, shown anew
                else:
                    label(driver, CHOICES[steps % 5], by_key=steps % 2 == 1)
                steps += 1
            assert page_state(driver)["done"]
            assert driver.execute_script("return typeof window.__pwned") == "undefined"
            # no dialog opened (an open one makes this call fail with "unexpected alert open")
            assert driver.execute_script("return document.title").startswith("farm-label")
            with pytest.raises(Exception, match="no such alert"):
                driver.switch_to.alert.text  # noqa: B018
    assert len(read_labels(output)) == len(pairs)


def test_a_wrong_token_shows_403_and_nothing_else(tmp_path):
    with serving(tmp_path, 3, "--annotators", "alice") as (server, _, output):
        good = server.links["alice"]
        wrong = good.rsplit("/", 1)[0] + "/" + "x" * 32
        with open_browser() as driver:
            bodies = []
            for link in (wrong, good.rsplit("/", 1)[0] + "/"):
                driver.get(link)
                status = driver.execute_script(
                    "return performance.getEntriesByType('navigation')[0].responseStatus"
                )
                assert status in (403, 404)
                bodies.append(driver.find_element("css selector", "body").text)
            # the wrong token's page: no page script ran, no name or pair leaked
            assert driver.find_elements("css selector", "#progress") == []
            assert "alice" not in "".join(bodies) and "question" not in "".join(bodies)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(wrong + "/api/state", timeout=10)
        assert refused.value.code == 403


def test_a_killed_server_restarted_resumes_the_page_with_nothing_lost_or_doubled(tmp_path):
    write_pairs(tmp_path / "pairs.jsonl", 6)
    output = tmp_path / "labels.jsonl"
    args = [tmp_path / "pairs.jsonl", "-o", output, "--annotators", "carol"]
    server = LabelServer(*args, "--port", "0")
    port, link = server.port, server.links["carol"]
    try:
        with open_browser() as driver:
            open_page(driver, link)
            seen = [label(driver, choice, by_key=False)[0] for choice in CHOICES[:3]]
            before = page_state(driver)
            server.kill()
            # an answer to a dead server: a visible error, the pair stays on screen
            failed = act(driver, choose("B_much"))
            assert failed["error"] and failed["progress"] == "3 / 6"
            assert failed["instruction"] == before["instruction"]

            server = LabelServer(*args, "--port", str(port))
            assert server.links["carol"] == link  # the same token, so the same link
            resumed = reload_page(driver)
            assert resumed["error"] is None
            for field in ("progress", "instruction", "left", "right"):
                assert resumed[field] == before[field]
            seen += [label(driver, choice, by_key=True)[0] for choice in CHOICES[3:] + ["tie"]]
            wait_until(driver, lambda d: page_state(d)["done"], "the page is not done")
    finally:
        server.stop()
    check_labels(read_labels(output), seen, "carol")


def test_a_double_click_or_a_double_key_sends_one_answer(tmp_path):
    with serving(tmp_path, 4) as (server, _, output):
        with open_browser() as driver:
            open_page(driver, next(link for name, link in server.links.items() if name != "status"))
            # every request takes 300 ms, so the second press comes while the first is in flight
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd(
                "Network.emulateNetworkConditions",
                {
                    "offline": False,
                    "latency": 300,
                    "downloadThroughput": -1,
                    "uploadThroughput": -1,
                },
            )
            once = act(driver, press("22"))
            assert (once["progress"], once["error"]) == ("1 / 4", None)
            twice = act(driver, double_click('button[data-choice="B_much"]'))
            assert (twice["progress"], twice["error"]) == ("2 / 4", None)
    labels = read_labels(output)
    assert [label["strength"] for label in labels] == ["slightly", "much"]


# each answer's journal line is 4,000 bytes of outputs and at most 1,000 of the rest: two fit, a
# third does not
LINE, LIMIT = 4000, 11000


def full_disk() -> None:
    """The server's files may not grow past LIMIT bytes (RLIMIT_FSIZE, as a full disk)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_an_answer_a_full_disk_refuses_stays_chosen_and_retry_saves_it(tmp_path):
    import resource

    pad = "x" * (LINE // 2)
    (tmp_path / "pairs.jsonl").write_text(
        "".join(
            json.dumps({"instruction": f"Task {n}.", "output_1": pad, "output_2": pad}) + "\n"
            for n in range(4)
        )
    )
    output = tmp_path / "labels.jsonl"
    args = [tmp_path / "pairs.jsonl", "-o", output, "--annotators", "dana", "--port", "0"]
    with LabelServer(*args, preexec_fn=full_disk) as server, open_browser() as driver:
        open_page(driver, server.links["dana"])
        for choice in ("A_much", "tie"):
            act(driver, press(KEYS[choice]))
        refused = act(driver, choose("B_slightly"))
        assert refused["progress"] == "2 / 4" and refused["task"]
        assert "NOT saved" in refused["error"] and "File too large" in refused["error"]
        assert "Your choice is kept on this page: press Retry (R)" in refused["error"]
        marked = driver.execute_script(
            """return [!document.getElementById("retry").hidden,
                       Array.from(document.querySelectorAll("#choices button.unsaved"))
                         .map((button) => button.dataset.choice)];"""
        )
        assert marked == [True, ["B_slightly"]]
        assert len(read_labels(output)) == 2

        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (hard, hard))  # space again
        saved = act(driver, press("r"))
        assert (saved["progress"], saved["error"]) == ("3 / 4", None)
        assert driver.execute_script('return document.getElementById("retry").hidden') is True
    labels = read_labels(output)
    assert [label["strength"] for label in labels] == ["much", None, "slightly"]
    assert labels[2]["preference"] == expected_preference(labels[2], "B_slightly")[0]


class NginxDefault:
    """A reverse proxy on a free local port that forwards to UPSTREAM as nginx does by default: its
    upstream's name as Host, no X-Forwarded-* (so the server cannot tell the page's address)."""

    def __init__(self) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self

        class Forward(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.forward()

            def do_POST(self) -> None:
                self.forward()

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {
                    name: value
                    for name, value in self.headers.items()
                    if name.lower() not in ("host", "connection", "keep-alive")
                }
                headers["Host"] = "upstream-name"
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                upstream.request(self.command, self.path, body or None, headers)
                reply = upstream.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                for name, value in reply.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            def log_message(self, *args) -> None:
                pass

        self.upstream: tuple[str, int] = ("127.0.0.1", 0)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_labelling_through_a_reverse_proxy_with_public_url(tmp_path):
    """Without --public-url the proxy's answers would be refused as cross-origin (the server sees
    Host: upstream-name); with it, a batch is labelled through the proxy, links and all."""
    write_pairs(tmp_path / "pairs.jsonl", 3)
    output = tmp_path / "labels.jsonl"
    proxy = NginxDefault()
    try:
        args = [tmp_path / "pairs.jsonl", "-o", output, "--annotators", "erin", "--port", "0"]
        with LabelServer(*args) as server, open_browser() as driver:
            local, path = server.links["erin"].split("/a/")
            proxy.upstream = ("127.0.0.1", int(local.rsplit(":", 1)[1]))
            open_page(driver, f"{proxy.url}/a/{path}")
            refused = act(driver, choose("tie"))
            assert "HTTP 403" in refused["error"] and refused["progress"] == "0 / 3"
            wait_until(driver, lambda _: any("cross-origin" in line for line in server.stderr), "")
        refusal = next(line for line in server.stderr if "cross-origin" in line)
        assert f"the page is at {proxy.url}, this server is http://upstream-name" in refusal
        assert not output.read_text()

        with LabelServer(*args, "--public-url", proxy.url) as server:
            assert server.links["erin"].startswith(f"{proxy.url}/a/")
            serving = next(line for line in server.stderr if line.startswith("farm-label: serving"))
            proxy.upstream = ("127.0.0.1", int(serving.split()[2].rsplit(":", 1)[1]))
            with open_browser() as driver:
                open_page(driver, server.links["erin"])
                seen = [label(driver, choice, by_key=True)[0] for choice in ("A_much", "tie")]
                last = label(driver, "B_slightly", by_key=False)[0]
                assert page_state(driver)["done"] and page_state(driver)["error"] is None
        check_labels(read_labels(output), [*seen, last], "erin")
    finally:
        proxy.close()


def test_skip_flag_comment_and_undo_through_a_reverse_proxy(tmp_path):
    """Behind a proxy (--public-url): a skip comes back after the rest, a flag needs no label, a
    problem needs a comment, keys typed in the comment are text, and undo takes back a flag."""
    write_pairs(tmp_path / "pairs.jsonl", 3)
    output = tmp_path / "labels.jsonl"
    proxy = NginxDefault()
    args = [
        tmp_path / "pairs.jsonl",
        "-o",
        output,
        "--annotators",
        "fay",
        "--public-url",
        proxy.url,
    ]
    try:
        with LabelServer(*args) as server, open_browser() as driver:
            serving = next(line for line in server.stderr if line.startswith("farm-label: serving"))
            proxy.upstream = ("127.0.0.1", int(serving.split()[2].rsplit(":", 1)[1]))
            first = open_page(driver, server.links["fay"])
            skipped = act(driver, press("s"))
            assert skipped["progress"] == "0 / 3 (1 skipped)" and skipped["error"] is None
            assert skipped["instruction"] != first["instruction"]

            comment = driver.find_element("css selector", "#comment")
            comment.send_keys("not my field 1 2 s u")  # keys in the box are text, not answers
            assert page_state(driver)["progress"] == "0 / 3 (1 skipped)"
            flagged = act(driver, click('button[data-choice="cant_judge"]'))
            assert flagged["progress"] == "1 / 3 (1 skipped)" and flagged["comment"] == ""
            undone = act(driver, press("u"))
            assert undone["progress"] == "0 / 3 (1 skipped)"
            assert undone["instruction"] == skipped["instruction"]

            # a problem needs its comment: said on the page, nothing sent
            refused = act(driver, click('button[data-choice="problem"]'))
            assert "what the problem is" in refused["error"]
            assert refused["progress"] == "0 / 3 (1 skipped)"
            comment.send_keys("output B is cut off")
            problem = act(driver, click('button[data-choice="problem"]'))
            assert problem["progress"] == "1 / 3 (1 skipped)" and problem["error"] is None

            comment.send_keys("close call")
            third = page_state(driver)
            back = act(driver, choose("A_much"))
            # the rest done: the skipped pair is back, and the page says so
            assert back["instruction"] == first["instruction"] and back["skipped_before"]
            assert back["progress"] == "2 / 3 (1 skipped)"  # skipped, shown, not yet done
            done = act(driver, press("3"))
            assert done["done"] and done["progress"] == "3 / 3"
    finally:
        proxy.close()
    records = read_labels(output)
    assert [(r["instruction"], r["preference"]) for r in records] == [
        (first["instruction"], None),
        (skipped["instruction"], None),
        (third["instruction"], expected_preference(records[2], "A_much")[0]),
        (first["instruction"], 1.5),
    ]
    assert records[0]["skipped"] is True and "comment" not in records[0]
    assert (records[1]["flag"], records[1]["comment"]) == ("problem", "output B is cut off")
    assert records[2]["comment"] == "close call" and "flag" not in records[2]
    assert all(r["annotator"] == "fay" for r in records)
    journal = (tmp_path / "labels.jsonl.journal.jsonl").read_text()
    assert "not my field 1 2 s u" in journal  # the undone flag's comment, kept in the journal only
    assert all("not my field" not in json.dumps(r) for r in records)


MARKDOWN_OUTPUT = """Here is how:

```python
def greet(name):
    return f"<b>hello {name}</b>"
```

- first, a list item
- second, with a script: <script>window.__pwned=1</script>
- [a safe link](https://example.org) and [a bad one](javascript:window.__pwned=1)
"""


def test_an_output_s_code_and_list_render_as_html_and_a_script_in_it_stays_text(tmp_path):
    pairs = [
        {
            "instruction": "Write a greeting function and list two steps.",
            "input": "",
            "output_1": MARKDOWN_OUTPUT,
            "output_2": "Just call `print('hello')`.\n\n1. open a terminal\n2. run it",
        }
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    shot = os.environ.get("FARM_LABEL_SCREENSHOT")  # where to keep a screenshot of this page
    with LabelServer(tmp_path / "pairs.jsonl", "-o", tmp_path / "labels.jsonl") as server:
        with open_browser() as driver:
            open_page(driver, server.links["annotator-1"])
            shown = driver.execute_script(
                """const out = document.getElementById("outputs");
                   return {
                     code: Array.from(out.querySelectorAll("pre > code")).map((e) => e.textContent),
                     items: Array.from(out.querySelectorAll("li")).map((e) => e.textContent),
                     inline: Array.from(out.querySelectorAll("p code")).map((e) => e.textContent),
                     links: Array.from(out.querySelectorAll("a")).map((e) => e.href),
                     scripts: out.querySelectorAll("script, img, iframe, svg").length,
                     guidelines: document.querySelectorAll("#guidelines h1, #guidelines li").length,
                   };"""
            )
            assert shown["code"] == ['def greet(name):\n    return f"<b>hello {name}</b>"\n']
            assert shown["items"] == [
                "first, a list item",
                "second, with a script: <script>window.__pwned=1</script>",
                "a safe link and [a bad one](javascript:window.__pwned=1)",
                "open a terminal",
                "run it",
            ]
            assert shown["inline"] == ["print('hello')"] and shown["scripts"] == 0
            assert shown["links"] == ["https://example.org/"]
            assert shown["guidelines"] > 5  # the guidelines' heading and lists, rendered
            for link in driver.find_elements("css selector", "#outputs li"):
                link.click()  # where a link would be followed or a handler run
            assert driver.execute_script("return typeof window.__pwned") == "undefined"
            if shot:
                from selenium.webdriver.common.action_chains import ActionChains

                heading = driver.find_element("css selector", "h1")
                ActionChains(driver).move_to_element(heading).perform()
                driver.save_screenshot(shot)
            done = act(driver, choose("A_slightly"))
            assert done["done"] and done["error"] is None
