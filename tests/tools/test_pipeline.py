"""The mission's pipelines exactly as written, through real shell pipes: sampling piped into the
`sim_ann` pool (over a local OpenAI-compatible server), and evaluation piped into farm-winrate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkserver
import orjson
from openai_server import OpenAIServer, judge_longer

BIN = Path(sys.executable).parent
PROMPTS = [
    {"instruction": "Name a primary colour.", "input": ""},
    {"instruction": "Give one word that rhymes with cat.", "input": ""},
    {"instruction": "Translate to French.", "input": "good morning"},
]


def shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        capture_output=True,
        timeout=600,
        # the farm-* commands start as forks of the test's fork server (tests/forkserver.py)
        env={**os.environ, "PATH": forkserver.recipe_path(f"{BIN}:{os.environ['PATH']}")[0], **env},
    )


def test_sample_piped_into_sim_ann_as_the_mission_writes_it(tiny_model_path, tmp_path):
    (tmp_path / "sft").symlink_to(tiny_model_path, target_is_directory=True)
    (tmp_path / "prompts.jsonl").write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in PROMPTS))
    with OpenAIServer(respond=judge_longer) as server:
        env = {
            "OPENAI_BASE_URL": server.url,
            "OPENAI_API_KEY": "sk-test-secret",
            "FARMKIT_CACHE": str(tmp_path / "cache"),
        }
        result = shell(
            "farm-sample sft/ prompts.jsonl --max-new-tokens 8 | farm-annotate --pool sim_ann > prefs.jsonl",
            tmp_path,
            env,
        )
        assert result.returncode == 0, result.stderr.decode()
        prefs = [
            orjson.loads(line) for line in (tmp_path / "prefs.jsonl").read_bytes().splitlines()
        ]
        # one preference per prompt: farm-sample's two samples form the pair
        assert [p["instruction"] for p in prefs] == [p["instruction"] for p in PROMPTS]
        for pref in prefs:
            assert pref["preference"] in (1, 2)
            assert pref["generator_1"] == pref["generator_2"] == "sft"
            info = pref["provenance"]["farm-annotate"]
            assert info["pool"] == "sim_ann"
            if not info[
                "noised"
            ]:  # the judge prefers the longer answer; noised labels are coin flips
                longer = 1 if len(pref["output_1"]) > len(pref["output_2"]) else 2
                if len(pref["output_1"]) != len(pref["output_2"]):
                    assert pref["preference"] == longer
        asked = sum(not p["provenance"]["farm-annotate"]["noised"] for p in prefs)
        assert server.outcomes["ok"] >= (1 if asked else 0)
        assert b"sk-test-secret" not in (tmp_path / "prefs.jsonl").read_bytes() + result.stderr


def test_evaluation_piped_into_winrate(tiny_model_path, tmp_path):
    (tmp_path / "ppo").symlink_to(tiny_model_path, target_is_directory=True)
    (tmp_path / "eval.jsonl").write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in PROMPTS))
    reference = [{**p, "output": "x", "generator": "reference"} for p in PROMPTS]
    (tmp_path / "ref.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in reference))
    result = shell(
        "farm-sample ppo/ eval.jsonl -n 1 --max-new-tokens 8 "
        "| farm-annotate --pool gold --reference ref.jsonl | farm-winrate",
        tmp_path,
        {},
    )
    assert result.returncode == 0, result.stderr.decode()
    [row] = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert row["generator"] == "ppo" and row["n_total"] == len(PROMPTS)
    assert 0 <= row["win_rate"] <= 100
