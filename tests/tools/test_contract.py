"""The CLI contract, run over every farm-* command declared in pyproject.toml: fast --help without
torch, empty input, a malformed line reported as FILE:LINE with exit 1, usage errors exit 2, and a
closed stdout pipe that ends quietly."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import tomllib
from conftest import ROOT, run_tool

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]

# How each command is called with one input file (`{input}`; `{dir}` is an output folder),
# and what an empty input gives: "empty" (exit 0, nothing on stdout) or "error" (exit 1 with a
# message naming the file: a training command cannot train on nothing).
CONTRACT: dict[str, dict] = {
    "farm-split": {"args": ["--tag", "{input}"], "empty": "empty"},
    "farm-winrate": {"args": ["{input}"], "empty": "empty"},
    "farm-eval": {
        "args": ["--reference", "{input}", "--pool", "gold", "--no-cache", "{input}"],
        "empty": "empty",
    },
    "farm-correlate": {"args": ["{input}", "{input}"], "empty": "empty"},
    "farm-annotate": {"args": ["--pool", "gold", "--no-cache", "{input}"], "empty": "empty"},
    "farm-sample": {"args": ["embedded", "{input}"], "empty": "empty"},
    "farm-sft": {"args": ["embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-rm-train": {"args": ["embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-score": {"args": ["embedded", "{input}"], "empty": "empty"},
    "farm-bon": {"args": ["embedded", "embedded", "{input}"], "empty": "empty"},
    "farm-expiter": {"args": ["embedded", "embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-dpo": {"args": ["embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-online-dpo": {"args": ["embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-ppo": {"args": ["embedded", "embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-quark": {"args": ["embedded", "embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-rloo": {"args": ["embedded", "embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-grpo": {"args": ["embedded", "embedded", "{input}", "-o", "{dir}"], "empty": "error"},
    "farm-convert": {"args": ["{input}"], "empty": "empty"},
    "farm-plot": {"args": ["history", "{input}", "-o", "{dir}/history.png"], "empty": "empty"},
    "farm-judge-train": {"args": ["{input}", "--folds", "0", "-o", "{dir}"], "empty": "error"},
    "farm-label": {"args": ["{input}", "-o", "{dir}/labels.jsonl"], "empty": "error"},
}


# Commands that stream many records to stdout, with an input that makes them write far more than a
# pipe buffer holds, for the closed-pipe check.
def _many_instructions(n: int) -> bytes:
    return b"".join(
        orjson.dumps({"instruction": f"task {i}", "input": "", "output": "x" * 40}) + b"\n"
        for i in range(n)
    )


def _many_pairs(n: int) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "instruction": f"task {i}",
                "output_1": "short",
                "output_2": "a longer answer " * (i % 3 + 1),
            }
        )
        + b"\n"
        for i in range(n)
    )


PIPED = {
    "farm-split": (["--tag", "-"], _many_instructions),
    "farm-annotate": (["--pool", "gold", "-q", "--no-cache", "-"], _many_pairs),
}


def test_every_script_has_a_contract_entry():
    assert sorted(SCRIPTS) == sorted(CONTRACT)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_is_fast_and_imports_no_torch(script):
    module, function = SCRIPTS[script].split(":")
    code = (
        "import sys\n"
        f"from {module} import {function} as main\n"
        "try:\n"
        f"    main(['--help'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'vllm', 'openai') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    assert b"Usage:" in result.stdout


def _call(script: str, path: Path, tmp_path: Path) -> list[str]:
    return [a.format(input=str(path), dir=str(tmp_path / "out")) for a in CONTRACT[script]["args"]]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_empty_input(script, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    result = run_tool(script, *_call(script, empty, tmp_path), "-q")
    if CONTRACT[script]["empty"] == "empty":
        assert result.returncode == 0, result.stderr.decode()
        assert result.stdout == b""
    else:
        assert result.returncode == 1, result.stderr.decode()
        assert str(empty) in result.stderr.decode()
        assert not (tmp_path / "out").exists()
    assert b"Traceback" not in result.stderr


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_malformed_line_names_file_and_line(script, tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    good = orjson.dumps(
        {
            "instruction": "a",
            "input": "",
            "output": "b",
            "output_1": "b",
            "output_2": "c",
            "generator": "g",
            "preference": 1,
            "reward": 0.0,
        }
    )
    bad.write_bytes(gzip.compress(good + b"\n" + good + b"\n{not json\n"))
    result = run_tool(script, *_call(script, bad, tmp_path))
    assert result.returncode == 1, result.stderr.decode()
    stderr = result.stderr.decode()
    assert f"{bad}:3:" in stderr
    assert "expected" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_unknown_option_is_a_usage_error(script):
    result = run_tool(script, "--no-such-option")
    assert result.returncode == 2
    assert b"No such option" in result.stderr


@pytest.mark.parametrize("script", sorted(PIPED))
def test_closed_pipe_is_quiet(script):
    args, make_input = PIPED[script]
    executable = Path(sys.executable).parent / script
    process = subprocess.Popen(
        [str(executable), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdin.write(make_input(20000))
    process.stdin.close()
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=120)
    assert first.startswith(b"{")
    assert b"Traceback" not in stderr and b"Error" not in stderr, stderr.decode()
    assert process.returncode in (0, -13), process.returncode


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_script_is_documented(script):
    """The tool's text lives on its docs page (docs/tools/farm-x.md, a `# farm-x:` heading); the
    README's and the site's tables of tools both list it, linking that page."""
    page = ROOT / "docs" / "tools" / f"{script}.md"
    what = (
        f"write {page.relative_to(ROOT)} (a `# {script}: what it does` heading, a paragraph, an "
        f"example) and add a row `| [`{script}`](docs/tools/{script}.md) | reads | writes | "
        "example |` to README.md's table of tools"
    )
    assert page.is_file(), f"{script} has no docs page: {what}"
    assert page.read_text(encoding="utf-8").startswith(f"# {script}:"), what
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## The tools", 1)[1].split("## Record kinds", 1)[0]
    assert f"| [`{script}`](docs/tools/{script}.md) |" in table, what
    index = (ROOT / "docs" / "tools" / "index.md").read_text(encoding="utf-8")
    assert f"| [`{script}`]({script}.md) |" in index, f"docs/tools/index.md's table lacks {script}"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_short_help_and_version(script):
    from farmkit import __version__

    short = run_tool(script, "-h")
    assert short.returncode == 0, short.stderr.decode()
    assert short.stdout.startswith(f"Usage: {script} ".encode())
    version = run_tool(script, "--version")
    assert version.returncode == 0, version.stderr.decode()
    assert version.stdout.decode() == f"{script} {__version__}\n"


def _subcommands() -> list[tuple[str, str]]:
    """(script, subcommand) for every command that is a group (farm-plot)."""
    import importlib

    import click

    found = []
    for script, target in sorted(SCRIPTS.items()):
        module, name = target.split(":")
        command = getattr(importlib.import_module(module), "cli", None)
        if isinstance(command, click.Group):
            found += [(script, sub) for sub in sorted(command.commands)]
    return found


@pytest.mark.parametrize(("script", "sub"), _subcommands())
def test_subcommand_help_on_stdout_and_version(script, sub):
    """`farm-plot history -h | less` shows the help: it goes to stdout, as the group's does, and
    `farm-plot history --version` is the group's version."""
    from farmkit import __version__

    for flag in ("-h", "--help"):
        shown = run_tool(script, sub, flag)
        assert shown.returncode == 0, shown.stderr.decode()
        assert shown.stdout.startswith(f"Usage: {script} {sub} ".encode()), shown.stdout[:200]
        assert shown.stderr == b""
    version = run_tool(script, sub, "--version")
    assert version.returncode == 0, version.stderr.decode()
    assert version.stdout.decode() == f"{script} {__version__}\n"
    assert version.stderr == b""


def test_quiet_silences_library_warnings(tmp_path):
    script = tmp_path / "warns.py"
    script.write_text(
        "import warnings\n"
        "import click\n"
        "from farmkit.cli import common_options, entry_point\n"
        "@click.command()\n"
        "@common_options\n"
        "def cli():\n"
        "    warnings.warn('`foo` is deprecated', FutureWarning)\n"
        "entry_point(cli)()\n"
    )
    loud = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    quiet = subprocess.run([sys.executable, str(script), "-q"], capture_output=True, timeout=60)
    assert loud.returncode == quiet.returncode == 0
    assert b"FutureWarning" in loud.stderr
    assert quiet.stderr == b""


def test_quiet_silences_a_warning_raised_while_a_real_tool_trains(tiny_model_path, tmp_path):
    """A library warning raised mid-run (here a FutureWarning that the test itself makes farm-sft's
    training raise, through a sitecustomize on PYTHONPATH, so that no library release can take it
    away) is shown without -q; with -q a real `farm-sft --lora` run leaves stderr empty: no warning,
    no progress bar, no log line."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import warnings\n"
        "import farmkit.methods.sft as sft\n"
        "_train = sft.train_sft\n"
        "def train_sft(*args, **kwargs):\n"
        "    warnings.warn('`old_name` is deprecated: use `new_name`', FutureWarning)\n"
        "    return _train(*args, **kwargs)\n"
        "sft.train_sft = train_sft\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])}
    data = tmp_path / "demos.jsonl"
    data.write_text('{"instruction": "Colour?", "input": "", "output": "Blue."}\n' * 4)
    common = ["--lora", "--lora-rank", "2", "--max-steps", "1", "--batch-size", "2"]
    loud = run_tool(
        "farm-sft", str(tiny_model_path), str(data), "-o", str(tmp_path / "a"), *common, env=env
    )
    assert loud.returncode == 0, loud.stderr.decode()[-2000:]
    assert b"FutureWarning: `old_name` is deprecated" in loud.stderr  # the run does warn
    quiet = run_tool(
        "farm-sft",
        str(tiny_model_path),
        str(data),
        "-o",
        str(tmp_path / "b"),
        *common,
        "-q",
        env=env,
    )
    assert quiet.returncode == 0, quiet.stderr.decode()[-2000:]
    assert quiet.stderr == b"", quiet.stderr.decode()[-2000:]
    assert (tmp_path / "b" / "meta.json").is_file()  # it did train


def test_option_lists_are_generated_from_help():
    """Each tool page's Options block is the command's --help as it is now (the README carries no
    copy any more)."""
    from dev.docs import site_help_block

    for script in sorted(SCRIPTS):
        page = (ROOT / "docs" / "tools" / f"{script}.md").read_text(encoding="utf-8")
        assert site_help_block(script) in page, (
            f"docs/tools/{script}.md's option list is stale: run `python -m dev.docs`"
        )
    assert "--help: generated by" not in (ROOT / "README.md").read_text(encoding="utf-8")
