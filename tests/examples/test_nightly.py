"""The scheduled re-evaluation recipe (examples/nightly.mk) end to end on tiny models and an endpoint
pool served by a real local OpenAI-compatible server (tests/openai_server.py), counting the requests
it gets: night one pays for every pair, night two only for the new checkpoint's pairs (none for the
old ones), and a changed reference only for the pairs it changed; the history holds every night's
rows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import forkserver
import orjson
import pytest
from openai_server import OpenAIServer, judge_longer, shown_pairs

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "nightly.mk"
PROMPTS = [f"Name a colour for item number {i}." for i in range(3)]
KEY = "sk-test-nightly-3e1f"
# an endpoint pool whose judges see one pair per request, so that requests count pairs
POOL = """name: nightly_endpoint
description: "Two endpoint judges, one pair per request."
flip_rate: 0.0
settings: {timeout: 5.0, backoff: 0.02, max_retries: 4, concurrency: 4}
tiers: {small: gpt-4o-mini}
judges:
  - {name: plain-b1, backend: openai, tier: small, prompt: plain, batch_size: 1, temperature: 1.0}
  - {name: json-b1, backend: openai, tier: small, prompt: json_rationale, batch_size: 1, temperature: 1.0, max_tokens: 400}
"""

pytestmark = pytest.mark.recipe


def _night(workdir: Path, server: OpenAIServer, *extra: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OPENAI_BASE_URL": server.url,
        "OPENAI_API_KEY": KEY,
    }
    # the recipe's farm-* commands start as forks of the test's fork server (tests/forkserver.py)
    env["PATH"], venv = forkserver.recipe_path(env["PATH"])
    return subprocess.run(
        [
            "make",
            "-f",
            str(RECIPE),
            "CHECKPOINTS=checkpoints",
            "PROMPTS=prompts.jsonl",
            "REFERENCE=reference.jsonl",
            "POOL=pool.yaml",
            "OUT=nightly",
            "BOOTSTRAP=20",
            "MAX_NEW_TOKENS=8",
            "SAMPLE_OPTS=--device cpu --batch-size 4",
            *extra,
            *venv,
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def _history(workdir: Path) -> list[dict]:
    return [
        orjson.loads(line)
        for line in (workdir / "nightly" / "history.jsonl").read_bytes().splitlines()
    ]


def _checkpoint(tiny_model_path: Path, folder: Path, seed: int) -> None:
    """A checkpoint of its own: the tiny model with its weights moved by seeded noise, so that each
    checkpoint writes other outputs (copies would write the same ones, and the cache would serve
    them)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn(parameter.shape, generator=noise))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(folder)


def _reference(workdir: Path, outputs: dict[int, str]) -> None:
    (workdir / "reference.jsonl").write_bytes(
        b"".join(
            orjson.dumps(
                {"instruction": PROMPTS[i], "input": "", "output": text, "generator": "ref"}
            )
            + b"\n"
            for i, text in outputs.items()
        )
    )


def _paid(server: OpenAIServer, since: int, owners: dict[str, str]) -> Counter:
    """The pairs the server was asked about from request number `since` on, counted by the
    checkpoint whose output each shows, by (checkpoint, reference output) and by that output."""
    asked: Counter = Counter()
    for body in server.bodies[since:]:
        (pair,) = shown_pairs(body)[1]  # one pair per request
        (mine,) = [text for text in pair if text in owners]
        (theirs,) = [text for text in pair if text != mine]
        asked[owners[mine]] += 1
        asked[(owners[mine], theirs)] += 1
        asked[mine] += 1
    return asked


def test_nights_pay_only_for_new_pairs(tiny_model_path, tmp_path):
    (tmp_path / "prompts.jsonl").write_bytes(
        b"".join(orjson.dumps({"instruction": p, "input": ""}) + b"\n" for p in PROMPTS)
    )
    (tmp_path / "pool.yaml").write_text(POOL)
    # the reference lacks the last prompt: --skip-missing leaves it out instead of failing the night
    _reference(tmp_path, {0: "Blue.", 1: "Blue."})
    checkpoints = tmp_path / "checkpoints"
    for seed, name in enumerate(("step-1", "step-2", "step-3"), start=1):
        _checkpoint(tiny_model_path, tmp_path / "later" / name, seed)
        if name != "step-3":
            shutil.copytree(tmp_path / "later" / name, checkpoints / name)
    (checkpoints / "not-a-checkpoint").mkdir()  # no config.json: never sampled
    outputs = tmp_path / "nightly" / "outputs"

    def owners() -> dict[str, str]:  # output text -> checkpoint, for the outputs sampled so far
        texts = {
            orjson.loads(line)["output"]: path.stem
            for path in outputs.iterdir()
            for line in path.read_bytes().splitlines()
        }
        assert len(texts) == 3 * len(list(outputs.iterdir())) and "Blue." not in texts
        return texts

    with OpenAIServer(respond=judge_longer, api_key=KEY) as server:
        first = _night(tmp_path, server)
        assert first.returncode == 0, first.stdout + first.stderr
        assert re.findall(r"farm-sample checkpoints/(\S+)", first.stdout) == ["step-1", "step-2"]
        assert first.stderr.count("skipped 1 output record(s) with no reference output") == 2
        # night one: one request per pair, every pair once (2 checkpoints x 2 prompts with a reference)
        sampled_outputs = owners()
        asked = _paid(server, 0, sampled_outputs)
        assert server.outcomes == Counter(ok=4)
        assert asked["step-1"] == asked["step-2"] == 2
        shown = [text for text, name in sampled_outputs.items() if asked[text]]
        assert len(shown) == 4 and all(asked[text] == 1 for text in shown)  # each pair once
        night_one = _history(tmp_path)
        assert sorted(row["generator"] for row in night_one) == ["step-1", "step-2"]
        assert {row["reference"] for row in night_one} == {"ref"}
        sampled = {path.name: path.stat().st_mtime_ns for path in outputs.iterdir()}
        assert sorted(sampled) == ["step-1.jsonl", "step-2.jsonl"]  # kept for the nights to come

        # nothing new: make has nothing to sample or annotate, the server gets nothing
        assert _night(tmp_path, server, "-q", "annotations").returncode == 0
        assert server.outcomes == Counter(ok=4)

        # night two: a new checkpoint; only its two pairs are paid, none of the old ones
        shutil.copytree(tmp_path / "later" / "step-3", checkpoints / "step-3")
        second = _night(tmp_path, server)
        assert second.returncode == 0, second.stdout + second.stderr
        assert re.findall(r"farm-sample checkpoints/(\S+)", second.stdout) == ["step-3"]
        assert re.findall(r"^farm-annotate (\S+)", second.stdout, re.M) == [
            "nightly/outputs/step-3.jsonl"
        ]
        asked = _paid(server, 4, owners())
        assert server.outcomes == Counter(ok=6)
        assert (asked["step-1"], asked["step-2"], asked["step-3"]) == (0, 0, 2)
        for name, mtime in sampled.items():  # earlier outputs were left as they were
            assert (outputs / name).stat().st_mtime_ns == mtime

        # a changed reference: one output rewritten, the missing one added. make re-annotates every
        # checkpoint, and the cache makes it pay only for the pairs that are new: the two changed
        # prompts for each of the three checkpoints; prompt 1 (unchanged) is served from the cache
        _reference(tmp_path, {0: "A deep blue, like the sea.", 1: "Blue.", 2: "Red."})
        third = _night(tmp_path, server)
        assert third.returncode == 0, third.stdout + third.stderr
        assert not re.findall(r"farm-sample", third.stdout)
        assert len(re.findall(r"^farm-annotate ", third.stdout, re.M)) == 3
        asked = _paid(server, 6, owners())
        assert server.outcomes == Counter(ok=12)
        for name in ("step-1", "step-2", "step-3"):
            assert asked[name] == 2
            assert asked[(name, "A deep blue, like the sea.")] == asked[(name, "Red.")] == 1
            assert asked[(name, "Blue.")] == 0

    history = _history(tmp_path)
    assert history[: len(night_one)] == night_one  # appended, never rewritten
    nights = [night_one, history[2:5], history[5:]]
    assert [sorted(row["generator"] for row in night) for night in nights[1:]] == [
        ["step-1", "step-2", "step-3"]
    ] * 2
    assert len({row["run_id"] for row in history}) == 3
    assert all(len({row["run_id"] for row in night}) == 1 for night in nights)
    assert [row["n_total"] for row in history] == [2] * 5 + [3] * 3
    assert all(
        row["evaluated_at"] <= later["evaluated_at"]
        for earlier, after in zip(nights, nights[1:], strict=False)
        for row in earlier
        for later in after
    )
    figure = tmp_path / "nightly" / "history.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # 35 s alone (the recipe's fork server starts for it)
def test_batch_nights_submit_then_collect(tmp_path):
    """BATCH=submit: the first night uploads the checkpoints' questions and writes no annotations
    (make goes on), the next night collects them and writes the board; the ledger books both."""
    from batch_server import BatchServer

    (tmp_path / "prompts.jsonl").write_bytes(
        b"".join(orjson.dumps({"instruction": p, "input": ""}) + b"\n" for p in PROMPTS)
    )
    (tmp_path / "pool.yaml").write_text(POOL)
    _reference(tmp_path, {i: "Blue." for i in range(3)})
    outputs = tmp_path / "nightly" / "outputs"
    outputs.mkdir(parents=True)
    for step in ("step-1", "step-2"):
        (tmp_path / "checkpoints" / step).mkdir(parents=True)
        (tmp_path / "checkpoints" / step / "config.json").write_text("{}")
        # sampled already (newer than the checkpoint and the prompts): the nights only judge
        (outputs / f"{step}.jsonl").write_bytes(
            b"".join(
                orjson.dumps(
                    {
                        "instruction": p,
                        "input": "",
                        "output": f"{step} says green, {p}",
                        "generator": step,
                    }
                )
                + b"\n"
                for p in PROMPTS
            )
        )
        os.utime(outputs / f"{step}.jsonl", (2e9, 2e9))
    with BatchServer(polls=1) as server:
        first = _night(tmp_path, server, "BATCH=submit")
        assert first.returncode == 0, first.stdout + first.stderr
        assert (
            "pending in batches" in first.stderr
            and not (tmp_path / "nightly" / "annotations" / "step-1.jsonl").exists()
        )
        # one batch per checkpoint (each is its own farm-annotate run; the second collected the
        # first's, its own still pending), so no checkpoint has annotations yet
        assert server.calls["POST /v1/batches"] == 2
        assert not list((tmp_path / "nightly" / "annotations").glob("*.jsonl"))
        second = _night(tmp_path, server, "BATCH=submit")
        assert second.returncode == 0, second.stdout + second.stderr
        assert server.calls["POST /v1/batches"] == 2 and set(server.answered.values()) == {1}
        assert server.direct == 0
    assert sorted(row["generator"] for row in _history(tmp_path)) == ["step-1", "step-2"]
    ledger = [
        orjson.loads(line)
        for line in (tmp_path / "nightly" / "spend.jsonl").read_bytes().splitlines()
    ]
    runs = [entry for entry in ledger if "collected" not in entry]
    assert [entry["mode"] for entry in runs] == ["batch"] * 4
    assert sum(entry["pending"] for entry in runs[:2]) == 6 and runs[-1]["pending"] == 0
    # each batch is booked once, as it is collected
    assert len([entry for entry in ledger if "collected" in entry]) == 2


def judge_shorter(body: dict) -> str:
    """The judge that replaced judge_longer overnight: in every pair the shorter answer wins."""
    from openai_server import verdict_text

    format, pairs = shown_pairs(body)
    return verdict_text(format, ["B" if len(b) < len(a) else "A" for a, b in pairs])


@pytest.mark.slow  # about 20 s: make runs farm-annotate and farm-winrate several times a night
def test_canaries_catch_a_judge_replaced_overnight(tmp_path):
    """CANARIES: night one freezes the canaries (asked twice past the cache) and finds them as frozen;
    overnight the endpoint's judge is replaced by one that prefers the shorter answer; night two's
    canaries disagree, the night prints one drift line and fails with farm-winrate's exit 4 after
    writing the board, the history's canary row and a plot that marks the drift. Every canary
    question is asked (never served by the cache) and booked in the ledger. The endpoint's
    system_fingerprint, frozen with the canaries, changed too: said on one line and in the row."""
    (tmp_path / "prompts.jsonl").write_bytes(
        b"".join(orjson.dumps({"instruction": p, "input": ""}) + b"\n" for p in PROMPTS)
    )
    (tmp_path / "pool.yaml").write_text(POOL)
    _reference(tmp_path, {i: "Blue." for i in range(3)})
    outputs = tmp_path / "nightly" / "outputs"
    outputs.mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-1" / "config.json").write_text("{}")
    (outputs / "step-1.jsonl").write_bytes(
        b"".join(
            orjson.dumps(
                {"instruction": p, "input": "", "output": f"Green, {p}", "generator": "step-1"}
            )
            + b"\n"
            for p in PROMPTS
        )
    )
    os.utime(outputs / "step-1.jsonl", (2e9, 2e9))  # sampled already: the nights only judge
    canaries = [
        {
            "instruction": f"Canary question {i}?",
            "input": "",
            "output_1": "x" * (5 + i),
            "output_2": "y" * (5 + (i + 6) % 12 + (i == 6)),
        }
        for i in range(12)
    ]
    (tmp_path / "canaries.jsonl").write_bytes(b"".join(orjson.dumps(c) + b"\n" for c in canaries))
    server = OpenAIServer(respond=judge_longer, api_key=KEY, system_fingerprint="fp_one")
    with server:
        first = _night(tmp_path, server, "CANARIES=canaries.jsonl")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "judge drift" not in first.stderr
        asked_first = server.outcomes["ok"]
        assert (
            asked_first == 3 + 3 * 12
        )  # the board's 3 pairs; the canaries frozen twice and asked once
        server.respond = judge_shorter  # the endpoint's judge replaced overnight
        server.system_fingerprint = "fp_two"
        second = _night(tmp_path, server, "CANARIES=canaries.jsonl")
        assert server.outcomes["ok"] == asked_first + 12  # only the canaries, past the cache
    assert second.returncode == 2, second.stdout + second.stderr  # make's code for a failed recipe
    drift = [line for line in second.stderr.splitlines() if "judge drift" in line]
    assert len(drift) == 1 and drift[0].startswith(
        "farm-winrate: judge drift: the canaries agree with their frozen verdicts on 0 of 12 (0%)"
    )
    assert "Error 4" in second.stderr
    assert "fingerprint" not in first.stderr
    (changed,) = [line for line in second.stderr.splitlines() if "fingerprint changed" in line]
    assert "frozen with gpt-4o-mini fp_one, tonight gpt-4o-mini fp_two" in changed
    history = _history(tmp_path)
    checks = [row for row in history if row.get("kind") == "canary"]
    assert [row["judge_drift"] for row in checks] == [False, True]
    assert [row["judge_fingerprint_changed"] for row in checks] == [False, True]
    assert [row["canary_agreement"] for row in checks] == [100.0, 0.0]
    assert sum(row["generator"] == "step-1" for row in history) == 2  # the board was written too
    figure = tmp_path / "nightly" / "history.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        figure.stat().st_mtime
        > (tmp_path / "nightly" / "canaries" / "tonight.jsonl").stat().st_mtime - 1
    )
    ledger = [
        orjson.loads(line)
        for line in (tmp_path / "nightly" / "spend.jsonl").read_bytes().splitlines()
    ]
    # every question asked is booked: the board's 3 pairs, the canaries 4 times (night two's board
    # is served by the cache)
    assert sum(entry["requests"] for entry in ledger) == server.outcomes["ok"] == 3 + 4 * 12
