"""`make humans` (examples/humans.mk): a seeded sample of the demo's judged evaluation pairs served
with farm-label, and once every pair is labelled the agreement table and the PPI board. The demo's
simulated verdicts are stood in for by small files (SIM_EVALS=...), so no model runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

EXAMPLES = ROOT / "examples"


def sim_evals(folder: Path, systems=("sft", "ppo"), prompts: int = 12) -> list[Path]:
    """Preference records as the demo's eval/sim/<system>.jsonl: each system against the reference,
    with the pool's verdict and provenance."""
    files = []
    for system in systems:
        path = folder / f"{system}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"val-{number}",
                        "instruction": f"Prompt {number}.",
                        "input": "",
                        "output_1": f"Reference answer {number}.",
                        "output_2": f"{system} answer {number}.",
                        "generator_1": "base",
                        "generator_2": system,
                        "preference": 2,
                        "annotator": "sim_eval_offline/judge-1",
                        "price": 0.0,
                    }
                )
                + "\n"
                for number in range(prompts)
            )
        )
        files.append(path)
    return files


def make_args(tmp_path: Path, *extra: str) -> list[str]:
    evals = " ".join(str(path) for path in sim_evals(tmp_path))
    return [
        "make",
        "--no-print-directory",
        "-C",
        str(EXAMPLES),
        f"OUT={tmp_path / 'run'}",
        f"SIM_EVALS={evals}",
        f"VENV={sys.prefix}",
        f"PYTHON={sys.executable}",
        *extra,
    ]


def test_the_dry_run_names_the_sample_the_server_and_the_report(tmp_path):
    planned = subprocess.run(
        [*make_args(tmp_path, "HUMAN_N=10", "HUMAN_ANNOTATORS=alice,bob"), "-n", "humans"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planned.returncode == 0, planned.stderr
    out = tmp_path / "run" / "humans"
    assert (
        f"human_sample.py {out}/sim_prefs.jsonl -n 10 --seed 0 -o {out}/pairs.jsonl"
        in planned.stdout
    )
    assert (
        f"farm-label {out}/pairs.jsonl -o {out}/labels.jsonl --annotators alice,bob --overlap 0.25"
        in planned.stdout
    )
    sim, labels = f"{out}/sim_prefs.jsonl", f"{out}/labels.jsonl"
    assert f"farm-correlate --judge {sim} --humans {labels}" in planned.stdout
    assert f"farm-winrate {sim} --humans {labels}" in planned.stdout
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


@pytest.mark.heavy  # make, farm-label and the shims: about 2 s
def test_humans_serves_a_sample_of_the_judged_pairs_then_reports_once_complete(tmp_path):
    args = make_args(tmp_path, "HUMAN_N=10", "HUMAN_ANNOTATORS=2", "HUMAN_OVERLAP=0.2")
    serving = subprocess.Popen(
        [*args, "humans"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    links = []
    deadline = time.monotonic() + 60
    try:
        while len(links) < 3 and time.monotonic() < deadline:
            line = serving.stderr.readline()
            assert line, f"make humans stopped: {serving.stdout.read()}"
            if line.startswith("farm-label: ") and "http://127.0.0.1:" in line:
                links.append(line.split()[1])
    finally:
        os.killpg(serving.pid, signal.SIGTERM)
        serving.wait(30)
    assert links == ["annotator-1", "annotator-2", "status"]

    out = tmp_path / "run" / "humans"
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == 10 and len({(p["instruction"], p["output_2"]) for p in pairs}) == 10
    # the pairs people see carry no simulated verdict or provenance, and keep their generators
    assert all("preference" not in p and "annotator" not in p and "price" not in p for p in pairs)
    assert {p["generator_2"] for p in pairs} <= {"sft", "ppo"}

    # complete: round(0.2 * 10) = 2 pairs by both, 8 by one: 12 labels; then the report is printed
    # (its two tools stood in for by shims that echo their arguments)
    shims = tmp_path / "shims"
    shims.mkdir()
    for tool in ("farm-correlate", "farm-winrate"):
        (shims / tool).write_text(f'#!/bin/sh\necho "{tool} $*"\n')
        (shims / tool).chmod(0o755)
    labels = out / "labels.jsonl"
    outcomes = []
    path = f"{shims}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for count, serves in ((11, True), (12, False)):
            labels.write_text("".join(json.dumps(pairs[i % 10]) + "\n" for i in range(count)))
            done = subprocess.run(
                [*args, "VENV=", "humans", f"HUMAN_PORT={port}"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "PATH": path},
            )
            outcomes.append((serves, done))
    for serves, done in outcomes:
        if serves:  # 11 of 12: it serves again (on a port taken here, so it stops at once)
            assert "11 of 12 labels" in done.stdout and "cannot listen" in done.stderr
        else:
            assert done.returncode == 0, done.stderr
            assert f"farm-correlate --judge {out}/sim_prefs.jsonl --humans {labels}" in done.stdout
            assert f"farm-winrate {out}/sim_prefs.jsonl --humans {labels}" in done.stdout
