"""The package as users get it: the sdist holds every file, the wheel built from it installs (not
editable) into a fresh environment with the base dependencies only, and every farm-* command starts
there (--help, --version) and works (farm-split, farm-winrate) from another folder.

Measured before pyproject.toml found its packages itself: the wheel lacked farmkit/core,
farmkit/evaluate and farmkit/lm, and all 20 commands died on start with ModuleNotFoundError.
Slow (about a minute: a fresh venv and pip install): `make test-wheel`, which .ci/run calls.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import orjson
import pytest
import tomllib

import farmkit

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# where each shipped file lands in the wheel: tools/ and schemas/ are mapped into farmkit's namespace
SHIPPED = {"farmkit": "farmkit", "tools": "farmkit/tools", "schemas": "farmkit/schemas"}


def _run(argv: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(arg) for arg in argv], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _source_files() -> list[str]:
    """The files of the working tree that git would commit (tracked, or new and not ignored)."""
    listed = _run(["git", "ls-files", "-co", "--exclude-standard"], ROOT).stdout.splitlines()
    return [name for name in listed if (ROOT / name).is_file()]


def test_the_wheel_from_the_sdist_installs_and_every_tool_runs(tmp_path):
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the repository
    files = _source_files()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    built = _run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))",
        ],
        source,
    )
    sdist = dist / built.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    package_files = [name for name in files if name.split("/", 1)[0] in SHIPPED]
    needed = package_files + ["pyproject.toml", "setup.py", "README.md"]
    assert [name for name in needed if name not in in_sdist] == []

    # what `pip install farmkit` does with the sdist: an isolated build of the wheel
    wheel_build = _run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", dist, sdist], tmp_path
    )
    assert "would be ignored" not in wheel_build.stdout + wheel_build.stderr
    (wheel,) = dist.glob("*.whl")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    landed = [
        SHIPPED[name.split("/", 1)[0]] + "/" + name.split("/", 1)[1] for name in package_files
    ]
    assert [name for name in landed if name not in in_wheel] == []

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], tmp_path)
    # the base dependencies only: the ML tools' --help must not need torch
    no_torch = subprocess.run([venv / "bin" / "python", "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0

    # not the repository, whose farmkit/ could shadow the install
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    for script in sorted(SCRIPTS):
        helped = _run([venv / "bin" / script, "--help"], elsewhere, env)
        assert f"Usage: {script}" in helped.stdout
        versioned = _run([venv / "bin" / script, "--version"], elsewhere, env)
        assert farmkit.__version__ in versioned.stdout

    instructions = elsewhere / "instructions.jsonl"
    instructions.write_bytes(
        b"".join(
            orjson.dumps({"instruction": f"task {i}", "output": "x"}) + b"\n" for i in range(40)
        )
    )
    _run([venv / "bin" / "farm-split", instructions, "-o", elsewhere / "splits"], elsewhere, env)
    assert sorted(path.name for path in (elsewhere / "splits").iterdir()) == [
        "pref.jsonl",
        "sft.jsonl",
        "unlabeled.jsonl",
        "val.jsonl",
    ]
    preferences = b"".join(
        orjson.dumps(
            {
                "instruction": f"task {i}",
                "output_1": "reference",
                "output_2": "model",
                "generator_1": "ref",
                "generator_2": "model",
                "preference": 2 if i % 4 else 1,
            }
        )
        + b"\n"
        for i in range(8)
    )
    (elsewhere / "prefs.jsonl").write_bytes(preferences)
    board = _run([venv / "bin" / "farm-winrate", "-q", "prefs.jsonl"], elsewhere, env)
    (row,) = [orjson.loads(line) for line in board.stdout.splitlines()]
    assert row["generator"] == "model" and row["win_rate"] == pytest.approx(75.0)
