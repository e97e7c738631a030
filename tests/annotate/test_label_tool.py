"""farm-label as its users run it: a real server on --port 0, killed with kill -9 and started again,
annotators answering at once from several processes, a port in use, a second server, bad input."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("uvicorn")

TOOL = str(Path(sys.executable).parent / "farm-label")

# An annotator in a process of its own: answers its queue as fast as the server lets it, and writes
# each item id the server acknowledged (a 200) to ACKED, flushed, before the next one.
CLIENT = r"""
import json, sys, urllib.error, urllib.request
url, acked, choice = sys.argv[1], sys.argv[2], sys.argv[3]
with open(acked, "a") as out:
    while True:
        state = json.load(urllib.request.urlopen(url + "/api/state"))
        if state["item"] is None:
            break
        item = state["item"]["item_id"]
        body = json.dumps({"item_id": item, "choice": choice, "seconds": 0.5}).encode()
        request = urllib.request.Request(
            url + "/api/answer", body, {"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(request)
        except urllib.error.HTTPError as error:
            if error.code != 409:
                raise
            continue
        out.write(item + "\n")
        out.flush()
"""


def invoke(*args: str):
    """farm-label in this process (a refusal or --status: nothing is served)."""
    from click.testing import CliRunner
    from farmkit.tools.farm_label import cli

    return CliRunner().invoke(cli, list(args))


def label(*args: str) -> subprocess.CompletedProcess:
    """farm-label run to its end (a refusal): a plain process, since it loads no model."""
    return subprocess.run([TOOL, *args], capture_output=True, timeout=120)


def write_pairs(path: Path, count: int) -> Path:
    path.write_text(
        "".join(
            json.dumps({"instruction": f"task {i}", "output_1": f"one {i}", "output_2": f"two {i}"})
            + "\n"
            for i in range(count)
        )
    )
    return path


class Server:
    """`farm-label ARGS` started in the background, its links read from its stderr."""

    def __init__(self, tmp_path: Path, *args: str, preexec_fn=None):
        self.log = tmp_path / f"server-{time.monotonic_ns()}.err"
        with open(self.log, "wb") as stderr:
            self.process = subprocess.Popen([TOOL, *args], stderr=stderr, preexec_fn=preexec_fn)
        self.links = self._links()

    def _links(self) -> dict[str, str]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if "farm-label: status " in text:
                return dict(line.split()[1:3] for line in text.splitlines() if line.count(" ") == 2)
            assert self.process.poll() is None, text
            time.sleep(0.05)
        raise AssertionError(self.log.read_text())

    def get(self, name: str, route: str = "/api/state") -> dict:
        import urllib.request

        return json.load(urllib.request.urlopen(self.links[name] + route, timeout=30))

    def stop(self, number: int = signal.SIGTERM) -> str:
        self.process.send_signal(number)
        self.process.wait(timeout=60)
        return self.log.read_text()


def client(url: str, acked: Path, choice: str = "A_much") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLIENT, url, str(acked), choice])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def answered(path: Path) -> list[tuple[str, str]]:
    return [(r["annotator"], r["provenance"]["farm-label"]["item_id"]) for r in records(path)]


def tokens(links: dict[str, str]) -> dict[str, str]:
    return {name: url.rsplit("/", 1)[1] for name, url in links.items()}


@pytest.mark.heavy
def test_kill_9_mid_answering_then_the_same_command_resumes_with_nothing_lost_or_doubled(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 40)
    labels = tmp_path / "labels.jsonl"
    command = [str(pairs), "-o", str(labels), "--annotators", "alice,bob", "--port", "0"]
    server = Server(tmp_path, *command)
    acked = tmp_path / "acked.txt"
    answering = client(server.links["alice"], acked)
    deadline = time.monotonic() + 60
    while (
        not acked.exists() or len(acked.read_text().split()) < 5
    ) and time.monotonic() < deadline:
        time.sleep(0.01)
    server.stop(signal.SIGKILL)  # while alice is answering
    answering.wait(timeout=60)
    assert answering.returncode != 0  # the server went away under it
    acknowledged = acked.read_text().split()
    assert len(acknowledged) >= 5

    # another PAIRS for the same LABELS is refused, and changes nothing
    other = label(str(write_pairs(tmp_path / "other.jsonl", 39)), *command[1:])
    assert other.returncode == 1
    assert "started with other pairs (a different assignment)" in other.stderr.decode()

    again = Server(tmp_path, *command)
    assert tokens(again.links) == tokens(server.links)  # the same links, on the new port
    done = answered(labels)
    assert len(done) == len(set(done))  # none written twice
    alice = [item for name, item in done if name == "alice"]
    # every acknowledged answer is kept; at most the one in flight was written but not acknowledged
    assert alice[: len(acknowledged)] == acknowledged and len(alice) - len(acknowledged) <= 1
    state = again.get("alice")
    assert state["progress"]["done"] == len(alice)
    assert state["guidelines"].startswith("# How to judge a pair")  # farmkit's own
    assert state["item"]["item_id"] not in alice
    finished = client(again.links["alice"], acked, "B_slightly")
    assert finished.wait(timeout=120) == 0
    said = again.stop()
    assert again.process.returncode == 0
    assert "farm-label: alice: 20/20 labelled" in said and "is not complete yet" in said
    done = answered(labels)
    assert len(done) == len(set(done)) == 20
    assert labels.with_name("labels.jsonl.journal.jsonl").exists()


def send(url: str, route: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url + route, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


# each journal line is 4,000 bytes of outputs and at most 1,000 of the rest: two fit, a third does not
LINE, LIMIT = 4000, 11000


def disk_full_at_the_third_answer() -> None:
    """The server's files may not grow past LIMIT bytes (RLIMIT_FSIZE, as a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.heavy
@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs Linux's prlimit")
def test_a_full_disk_refuses_the_answer_and_once_there_is_space_the_retry_is_kept(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pad = "x" * (LINE // 2)
    pairs.write_text(
        "".join(
            json.dumps({"instruction": f"task {i}", "output_1": pad, "output_2": pad}) + "\n"
            for i in range(4)
        )
    )
    labels = tmp_path / "labels.jsonl"
    command = [str(pairs), "-o", str(labels), "--port", "0"]
    server = Server(tmp_path, *command, preexec_fn=disk_full_at_the_third_answer)
    url = server.links["annotator-1"]
    for choice in ("A_much", "B_much"):
        item = server.get("annotator-1")["item"]["item_id"]
        assert send(url, "/api/answer", {"item_id": item, "choice": choice, "seconds": 1})[0] == 200
    third = {"item_id": server.get("annotator-1")["item"]["item_id"], "choice": "tie", "seconds": 1}
    for _ in range(2):  # refused, and refused again while the disk is full
        status, reply = send(url, "/api/answer", third)
        assert status == 507, reply
        assert "File too large" in reply["error"] and "nothing of it was kept" in reply["error"]
    journal = labels.with_name("labels.jsonl.journal.jsonl")
    assert len(journal.read_bytes().splitlines(keepends=True)) == 2
    assert journal.read_bytes().endswith(b"\n")  # no part of the third line
    assert len(records(labels)) == 2
    assert server.get("annotator-1")["item"]["item_id"] == third["item_id"]  # the page stays on it

    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (hard, hard))  # space comes back
    assert send(url, "/api/answer", third)[0] == 200  # the page's retry, once there is space
    said = server.stop()
    assert server.process.returncode == 0, said
    assert said.count(f"farm-label: {journal}: could not save annotator-1's answer") == 2

    again = Server(tmp_path, *command)  # a restart accepts the journal
    state = again.get("annotator-1")
    again.stop()
    assert state["progress"]["done"] == 3
    assert [record["preference"] for record in records(labels)][2] == 1.5
    assert [line[-1:] for line in journal.read_bytes().splitlines(keepends=True)] == [b"\n"] * 3


@pytest.mark.heavy
def test_annotators_answering_at_once_from_several_processes_never_collide(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 30)
    labels = tmp_path / "labels.jsonl"
    names = ("alice", "bob", "carol")
    server = Server(
        tmp_path, str(pairs), "-o", str(labels), "--annotators", ",".join(names), "--overlap", "0.2"
    )
    clients = [client(server.links[name], tmp_path / f"{name}.txt") for name in names]
    assert [process.wait(timeout=120) for process in clients] == [0, 0, 0]
    report = json.loads(
        __import__("urllib.request").request.urlopen(server.links["status"] + ".json").read()
    )
    said = server.stop()
    assert report["complete"] is True and "labels.jsonl is complete" in said
    done = answered(labels)
    assert len(done) == len(set(done)) == 6 * 3 + 24  # 6 pairs to all, 24 dealt out
    per_pair = Counter(item for _, item in done)
    assert sorted(Counter(per_pair.values()).items()) == [(1, 24), (3, 6)]
    for name in names:
        assert [item for who, item in done if who == name] == (
            (tmp_path / f"{name}.txt").read_text().split()
        )
    journal = labels.with_name("labels.jsonl.journal.jsonl").read_bytes().splitlines()
    assert len(journal) == len(done)


@pytest.mark.heavy
def test_outputs_with_a_reference_and_a_second_server_on_the_same_labels_is_refused(tmp_path):
    outputs, reference = tmp_path / "outputs.jsonl", tmp_path / "reference.jsonl"
    for path, generator in ((outputs, "model"), (reference, "ref")):
        path.write_text(
            json.dumps({"instruction": "Colour?", "output": f"{generator} says blue"}) + "\n"
        )
    labels = tmp_path / "labels.jsonl"
    guidelines = tmp_path / "ours.md"
    guidelines.write_text("Prefer the shorter answer.\n")
    command = [str(outputs), "--reference", str(reference), "-o", str(labels)]
    first = Server(tmp_path, *command, "--guidelines", str(guidelines))
    assert first.links["annotator-1"].startswith("http://127.0.0.1:")  # loopback unless --host
    state = first.get("annotator-1")
    assert state["guidelines"] == "Prefer the shorter answer.\n"
    item = state["item"]
    assert {item["left"], item["right"]} == {"ref says blue", "model says blue"}
    second = label(*command)
    first.stop()
    assert second.returncode == 1
    stderr = second.stderr.decode()
    assert f"farm-label: error: {labels}: another farm-label server is using it" in stderr


def test_behind_a_reverse_proxy_public_url_gives_the_links_and_answers_are_accepted(tmp_path):
    import urllib.error
    import urllib.request

    pairs = write_pairs(tmp_path / "pairs.jsonl", 2)
    public = "https://labels.example.org"
    command = [str(pairs), "-o", str(tmp_path / "labels.jsonl"), "--public-url", public + "/"]
    server = Server(tmp_path, *command)
    try:
        link = server.links["annotator-1"]
        assert link.startswith(f"{public}/a/") and server.links["status"].startswith(public)
        local = next(  # the links name the proxy; the server says where it listens
            line.split()[2]
            for line in server.log.read_text().splitlines()
            if line.startswith("farm-label: serving ")
        )
        assert local.startswith("http://127.0.0.1:")
        token = link.rsplit("/", 1)[1]
        state = json.load(urllib.request.urlopen(f"{local}/a/{token}/api/state", timeout=30))

        def answer(origin: str) -> int:
            body = {"item_id": state["item"]["item_id"], "choice": "tie", "seconds": 1}
            request = urllib.request.Request(
                f"{local}/a/{token}/api/answer",
                json.dumps(body).encode(),
                # what nginx sends by default: its upstream's name as Host, no X-Forwarded-*
                {"Content-Type": "application/json", "Origin": origin, "Host": "upstream-name"},
            )
            try:
                return urllib.request.urlopen(request, timeout=30).status
            except urllib.error.HTTPError as error:
                return error.code

        assert answer("https://evil.example") == 403
        assert answer(public) == 200
    finally:
        said = server.stop()
    assert (
        "farm-label: refused POST /a/.../api/answer (annotator-1): 403 cross-origin request: the "
        "page is at https://evil.example" in said
    )
    assert [line for line in said.splitlines() if token in line] == [
        f"farm-label: annotator-1 {link}"
    ]


def test_a_port_in_use_is_a_clear_error_and_writes_nothing(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = label(str(pairs), "-o", str(tmp_path / "labels.jsonl"), "--port", str(port))
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert f"farm-label: error: cannot listen on 127.0.0.1:{port}: " in stderr
    assert "choose another --port (--port 0 picks a free one)" in stderr
    assert "Traceback" not in stderr
    assert sorted(os.listdir(tmp_path)) == ["pairs.jsonl"]


@pytest.mark.heavy
def test_a_restart_with_port_0_prints_the_same_links_or_says_they_changed(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 2)
    command = [str(pairs), "-o", str(tmp_path / "labels.jsonl"), "--annotators", "alice,bob"]
    first = Server(tmp_path, *command)  # --port 0, the default
    first.stop()
    second = Server(tmp_path, *command)
    assert second.links == first.links  # the same port and tokens: the links sent still work
    assert second.get("alice")["progress"] == {"done": 0, "total": 1, "skipped": 0}
    said = second.stop()
    assert "NEW" not in said
    port = int(first.links["status"].split("/")[2].rsplit(":", 1)[1])
    with socket.socket() as taken:  # something else took the port meanwhile
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the last's TIME_WAIT
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        third = Server(tmp_path, *command)
        said = third.stop()
    assert tokens(third.links) == tokens(first.links) and third.links != first.links
    assert (
        f"farm-label: cannot listen on 127.0.0.1:{port}: Address already in use, the port the "
        "links carried last: serving on port" in said
    )
    assert f"so the links below are NEW (send them again, or free port {port}" in said


@pytest.mark.parametrize(
    ("setup", "args", "code", "message"),
    [
        ("bad_pairs", [], 1, "{pairs}:2: missing field 'output_2'; expected"),
        ("empty", [], 1, "{pairs}: no pairs to label; expected pair records"),
        ("bad_checks", ["--checks", "{checks}"], 1, "{checks}:1: preference is None; expected"),
        ("good", ["--annotators", "0"], 2, "expected at least one annotator"),
        ("good", ["--annotators", "alice,status"], 2, "'status' names the organiser's link"),
        ("good", ["--annotators", "Status"], 2, "'Status' names the organiser's link"),
        ("good", ["--overlap", "1.5"], 2, "--overlap"),
        ("good", ["--min-check-score", "0.8"], 2, "--min-check-score screens annotators by their"),
        ("good", ["-o", "{tmp}/labels.jsonl.gz"], 2, "plain JSONL file"),
        ("good", ["--public-url", "labels.example.org"], 2, "expected the page's public address"),
        ("good", ["--public-url", "https://example.org/labels/"], 2, "at the root of its address"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, setup, args, code, message):
    pairs = tmp_path / "pairs.jsonl"
    checks = tmp_path / "checks.jsonl"
    pair = {"instruction": "x", "output_1": "a", "output_2": "b"}
    rows = {"bad_pairs": [pair, {"instruction": "y", "output_1": "a"}], "empty": []}
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows.get(setup, [pair])))
    checks.write_text(json.dumps({**pair, "preference": None}) + "\n")
    names = {"pairs": pairs, "checks": checks, "tmp": tmp_path}
    filled = [arg.format(**names) for arg in args]
    output = [] if "-o" in filled else ["-o", str(tmp_path / "labels.jsonl")]
    result = label(str(pairs), *output, *filled)
    assert result.returncode == code, result.stderr.decode()
    assert message.format(**names) in result.stderr.decode()
    assert "Traceback" not in result.stderr.decode()
    assert sorted(os.listdir(tmp_path)) == ["checks.jsonl", "pairs.jsonl"]


@pytest.mark.heavy
def test_status_says_whether_labels_is_complete_without_serving(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 4)
    labels = tmp_path / "labels.jsonl"
    command = [str(pairs), "-o", str(labels), "--annotators", "alice,bob"]
    before = label(*command, "--status")
    assert before.returncode == 75, before.stderr.decode()  # not complete: come back later
    report = json.loads(before.stdout)
    assert report["complete"] is False
    assert [(row["annotator"], row["done"], row["total"]) for row in report["annotators"]] == [
        ("alice", 0, 2),
        ("bob", 0, 2),
    ]
    assert "http" not in before.stderr.decode()  # no links: nothing is served
    server = Server(tmp_path, *command, "--port", "0")
    assert label(*command, "--status").returncode == 1  # the running server holds the lock
    for name in ("alice", "bob"):
        assert client(server.links[name], tmp_path / f"{name}.txt").wait(timeout=120) == 0
    server.stop()
    after = label(*command, "--status")
    assert after.returncode == 0 and json.loads(after.stdout)["complete"] is True


def test_the_same_pair_twice_in_pairs_is_labelled_once(tmp_path):
    """A pair given twice (also with its outputs swapped) is merged, said on stderr: one annotator
    labelling it twice would be counted as two humans agreeing."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", 3)
    lines = pairs.read_text().splitlines()
    swapped = json.loads(lines[0])
    swapped["output_1"], swapped["output_2"] = swapped["output_2"], swapped["output_1"]
    pairs.write_text("\n".join([*lines, lines[1], json.dumps(swapped)]) + "\n")
    result = invoke(str(pairs), "-o", str(tmp_path / "labels.jsonl"), "--status")
    assert result.exit_code == 75, result.output
    assert [row["total"] for row in json.loads(result.stdout)["annotators"]] == [3]
    stderr = result.stderr
    assert (
        f"{pairs}: 2 pairs given again, labelled once (pair 4 repeats pair 2; pair 5 repeats pair 1)"
        in stderr
    )


def simulated_verdicts(path: Path) -> Path:
    """40 judged pairs: the judge sure of the first 20 (soft preference 1.02 or 1.98) and unsure of
    the last 20 (two judges of the pool disagree: 1 and 2)."""
    lines = []
    for i in range(40):
        pair = {
            "instruction": f"task {i}",
            "output_1": f"ref {i}",
            "output_2": f"model {i}",
            "generator_1": "ref",
            "generator_2": "model",
        }
        verdicts = [1.02 if i % 2 else 1.98] if i < 20 else [1, 2]
        lines += [json.dumps({**pair, "preference": v, "annotator": "pool"}) for v in verdicts]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.heavy  # a server, a client and farm-winrate, each a process
def test_with_judge_people_label_where_it_is_least_sure_and_the_labels_carry_the_probability(
    tmp_path,
):
    sim = simulated_verdicts(tmp_path / "sim.jsonl")
    labels = tmp_path / "labels.jsonl"
    command = [str(sim), "--judge", str(sim), "--budget", "10", "-o", str(labels)]
    server = Server(tmp_path, *command, "--port", "0")
    assert client(server.links["annotator-1"], tmp_path / "acked.txt").wait(timeout=120) == 0
    stderr = server.stop()
    assert "20 pairs given again, labelled once" in stderr  # the pool's second verdicts
    answers = records(labels)
    probability = [record["sampling_probability"] for record in answers]
    unsure = [record for record in answers if int(record["instruction"].split()[1]) >= 20]
    # pi proportional to sqrt(f (1 - f)) (0.14 sure, 0.5 unsure) mixed half and half with uniform,
    # 10 expected (under the ceiling of twice the uniform 10 / 40)
    sure_pi = 10 * (0.5 * 0.14 / (20 * 0.14 + 20 * 0.5) + 0.5 / 40)
    unsure_pi = 10 * (0.5 * 0.5 / (20 * 0.14 + 20 * 0.5) + 0.5 / 40)
    assert all(p == pytest.approx(sure_pi) or p == pytest.approx(unsure_pi) for p in probability)
    assert probability == sorted(probability, reverse=True)  # the most informative first
    assert len(unsure) > len(answers) - len(unsure)
    assert all(
        "preference" in record and record["annotator"] == "annotator-1" for record in answers
    )
    # farm-winrate weighs them by 1 / pi
    board = subprocess.run(
        [str(Path(TOOL).parent / "farm-winrate"), str(sim), "--humans", str(labels)],
        capture_output=True,
        timeout=120,
    )
    assert board.returncode == 0, board.stderr.decode()
    (row,) = map(json.loads, board.stdout.splitlines())
    assert row["n_human"] == len(answers) and row["small_sample"] is True
    from farmkit.evaluate.ppi import ppi_mean_ipw

    f = [(0.02 if i % 2 else 0.98) if i < 20 else 0.5 for i in range(40)]
    y, pi, drawn = [0.0] * 40, [1.0] * 40, [False] * 40
    for record in answers:
        i = int(record["instruction"].split()[1])
        y[i], pi[i], drawn[i] = record["preference"] - 1, record["sampling_probability"], True
    expected = ppi_mean_ipw(*map(np.array, (y, f, pi, drawn)))  # weighted by 1 / pi
    assert row["ppi_win_rate"] == pytest.approx(100 * expected["estimate"])
    assert row["ppi_standard_error"] == pytest.approx(100 * expected["standard_error"])
    assert 0 <= row["ppi_ci_low"] <= row["ppi_win_rate"] <= row["ppi_ci_high"] <= 100


def test_judge_needs_every_pair_and_a_budget(tmp_path, capsys):
    from farmkit.tools.farm_label import main

    sim = simulated_verdicts(tmp_path / "sim.jsonl")
    some = tmp_path / "some.jsonl"
    some.write_text("".join(sim.read_text().splitlines(keepends=True)[:5]))
    out = str(tmp_path / "labels.jsonl")
    for args, code, message in (
        ([str(some), "--budget", "3"], 1, "judges 35 pair(s) that PAIRS lacks"),
        ([str(sim)], 2, "--judge and --budget go together"),
    ):
        with pytest.raises(SystemExit) as exited:
            main([*args, "--judge", str(sim), "-o", out])
        assert exited.value.code == code and message in capsys.readouterr().err
    assert not (tmp_path / "labels.jsonl").exists()
