"""The recipes under examples/ find the project's tools without an activated environment: a shell
whose PATH holds neither the venv nor any farm-* tool (a new user after `make install`, cron) runs
`make -C examples ...` and the recipe uses .venv's tools and Python; with no tools anywhere, make
says what to do instead of failing with Error 127. Cheap targets only (no model is loaded)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
from conftest import ROOT

EXAMPLES = ROOT / "examples"
BARE_PATH = "/usr/bin:/bin"  # make and a system python3, no farm-* tool, no `python`


def _venv() -> list[str]:
    """VENV=... when the tests run from an environment other than the project's .venv (whose
    discovery is what the tests check when they run from it)."""
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        return []
    return [f"VENV={sys.prefix}"]


def _make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MFLAGS")
    }
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(EXAMPLES), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, "PATH": BARE_PATH, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def _instructions(path: Path, n: int = 12) -> Path:
    path.write_bytes(
        b"".join(
            orjson.dumps({"instruction": f"Name a colour ({i}).", "input": "", "output": "Blue."})
            + b"\n"
            for i in range(n)
        )
    )
    return path


def test_the_bare_path_has_no_farm_tool():
    assert not any(Path(folder, "farm-split").exists() for folder in BARE_PATH.split(":"))


def test_demo_step_runs_without_an_activated_venv(tmp_path):
    """The demo's first step (farm-split) with a PATH that lacks the venv: it runs."""
    data = _instructions(tmp_path / "instructions.jsonl")
    out = tmp_path / "run"
    done = _make(
        "SIZE=ci", f"OUT={out}", f"DATA={data}", "N_SFT=3", "N_PREF=3", "N_UNLABELED=3", "N_VAL=3",
        f"{out}/splits/.done", *_venv(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for split in ("sft", "pref", "unlabeled", "val"):
        assert (out / "splits" / f"{split}.jsonl").read_bytes().strip(), split


def test_validate_judges_runs_without_an_activated_venv(tmp_path):
    """validate-judges (python human_pairs.py, farm-annotate, farm-correlate) with a PATH that lacks
    the venv and no PYTHON: it prints the table."""
    humans = tmp_path / "humans.jsonl"
    humans.write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "instruction": f"Question {i}?",
                    "output_1": "A short answer.",
                    "output_2": "A longer answer, with some detail " * (i % 3 + 1),
                    "preference": 1 + i % 2,
                }
            )
            + b"\n"
            for i in range(6)
        )
    )
    done = _make(
        "validate-judges", f"HUMANS={humans}", "POOL=gold", "VALIDATE_N=0",
        f"OUT={tmp_path / 'run'}", f"VALIDATE_OUT={tmp_path / 'validate'}", *_venv(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| gold ")]
    assert len(rows) == 1, done.stdout


def test_without_any_tools_make_says_how_to_get_them(tmp_path):
    """No venv and nothing on PATH: make names `make install` (not just Error 127)."""
    data = _instructions(tmp_path / "instructions.jsonl")
    out = tmp_path / "run"
    done = _make(
        "SIZE=ci", f"OUT={out}", f"DATA={data}", f"VENV={tmp_path / 'no-venv'}",
        f"{out}/splits/.done",
    )  # fmt: skip
    assert done.returncode != 0
    assert "make install" in done.stderr, done.stderr
    assert "VENV" in done.stderr
