"""The tests' fork server (tests/forkserver.py): a tool forked from it behaves as the same tool
started fresh (bytes out, exit status, stdin), a timeout kills it, an environment that could change
an import starts the tool fresh, and the PATH shims that the recipes use pass status and streams on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkserver
import orjson
import pytest
from conftest import run_tool

BIN = Path(sys.executable).parent


@pytest.fixture(name="server")
def server_fixture():
    server = forkserver.server()
    if server is None:
        pytest.skip("the fork server is off here (FARMKIT_TEST_FORK=0 or noisy imports)")
    return server


def _fresh(*argv: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], input=input, capture_output=True, env=dict(os.environ)
    )


def test_a_forked_tool_answers_as_a_fresh_one(server, tiny_model_path, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"instruction": "Say hi"}\n{"instruction": "Name a colour"}\n')
    argv = ["farm-sample", str(tiny_model_path), str(prompts), "-n", "2", "--max-new-tokens", "6"]
    argv += ["--seed", "3", "-q"]
    fresh = _fresh(*argv)
    forked = server.run([str(BIN / argv[0]), *argv[1:]], None, dict(os.environ), 600)
    assert fresh.returncode == forked.returncode == 0, forked.stderr.decode()
    assert len(fresh.stdout.splitlines()) == 4
    assert forked.stdout == fresh.stdout
    assert forked.stderr == fresh.stderr == b""


def test_stdin_status_and_errors_are_the_tools_own(server, tmp_path):
    records = b"".join(orjson.dumps({"instruction": f"q{i}"}) + b"\n" for i in range(6))
    argv = ["farm-split", "--tag", "--sizes", "a=2,b=4", "--seed", "1"]
    fresh = _fresh(*argv, input=records)
    forked = server.run([str(BIN / argv[0]), *argv[1:]], records, dict(os.environ), 60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert fresh.returncode == 0 and len(fresh.stdout.splitlines()) == 6
    missing = str(tmp_path / "missing.jsonl")
    fresh = _fresh("farm-winrate", missing)
    forked = server.run([str(BIN / "farm-winrate"), missing], None, dict(os.environ), 60)
    assert fresh.returncode == forked.returncode == 2  # a missing input: a usage error
    assert forked.stderr == fresh.stderr and missing.encode() in forked.stderr


def test_a_timeout_kills_the_forked_tool(server, tmp_path):
    # farm-split with no input file reads stdin; a fifo that no one writes keeps it waiting
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    holder = os.open(fifo, os.O_RDWR)  # a writer exists, so the tool waits instead of reading EOF
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            server.run([str(BIN / "farm-split"), "--tag", str(fifo)], None, dict(os.environ), 2)
    finally:
        os.close(holder)


def test_an_environment_that_could_change_an_import_starts_the_tool_fresh(server, monkeypatch):
    same = dict(server.env)
    runtime = {"OPENAI_API_KEY": "x", "FARMKIT_CACHE": "/c", "PATH": "/", "MAKEFLAGS": "-j2"}
    assert server.same_imports({**same, **runtime})
    assert not server.same_imports(
        {**same, "HF_HUB_OFFLINE": "0" if same.get("HF_HUB_OFFLINE") == "1" else "1"}
    )
    assert not server.same_imports({**same, "OMP_NUM_THREADS": "7"})
    forked = []
    monkeypatch.setattr(server, "run", lambda *a, **k: forked.append(a) or None)
    verbosity = "info" if os.environ.get("TRANSFORMERS_VERBOSITY") != "info" else "warning"
    done = run_tool("farm-winrate", "--help", env={"TRANSFORMERS_VERBOSITY": verbosity})
    assert done.returncode == 0 and forked == []  # started fresh
    assert run_tool("farm-winrate", "--help") is None and len(forked) == 1  # through the server


def test_a_shim_on_path_passes_status_and_streams(server, tmp_path):
    shims = forkserver.shim_folder()
    assert shims is not None and (Path(shims) / "farm-split").is_file()
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    records = b"".join(orjson.dumps({"instruction": f"q{i}"}) + b"\n" for i in range(5))
    done = subprocess.run(
        "farm-split --tag --sizes a=2,b=3 --seed 0 | wc -l; farm-split --sizes a=1; echo status=$?",
        shell=True,
        input=records,
        capture_output=True,
        env=env,
    )
    assert done.stdout.split() == [b"5", b"status=2"], done
    assert b"give exactly one of -o DIR" in done.stderr


def test_a_recipe_step_with_two_threads_forks_from_the_threaded_server(server):
    shims = forkserver.shim_folder()
    threaded = forkserver.threaded_server()
    assert threaded is not None and threaded.env["OMP_NUM_THREADS"] == "2"
    servers = [(server.address, server.import_env()), (threaded.address, threaded.import_env())]
    base = dict(server.env)
    assert forkserver.choose(servers, {**base, "OMP_NUM_THREADS": "2"}) == threaded.address
    assert forkserver.choose(servers, base) == server.address
    assert forkserver.choose(servers, {**base, "OMP_NUM_THREADS": "3"}) is None  # exec'd fresh
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    records = b"".join(orjson.dumps({"instruction": f"q{i}"}) + b"\n" for i in range(3))
    done = subprocess.run(
        ["bash", "-c", "OMP_NUM_THREADS=2 farm-split --tag --sizes a=1,b=2 --seed 0"],
        input=records,
        capture_output=True,
        env=env,
    )
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3, done
