"""The one rule of -o DIR for every trainer (farmkit.lm.modelio.output_folder_problem, checked by
farmkit.cli.model_dir_option before any work): DIR may be absent, empty or a model folder of
farmkit's; a folder of the user's is refused (exit 2, naming it and what is in it) unless --force;
a symlink is followed; a device, the current folder or one above it are usage errors (issue 44)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_tool
from policy_fixtures import write_jsonl

# every tool that writes a model folder with -o, and arguments that reach the -o check (none of them
# is read before it: the check comes first)
TRAINERS = {
    "farm-sft": ["base", "demos.jsonl"],
    "farm-rm-train": ["base", "prefs.jsonl"],
    "farm-dpo": ["sft", "prefs.jsonl"],
    "farm-ppo": ["sft", "rm", "prompts.jsonl"],
    "farm-rloo": ["sft", "rm", "prompts.jsonl"],
    "farm-grpo": ["sft", "rm", "prompts.jsonl"],
    "farm-quark": ["sft", "rm", "prompts.jsonl"],
    "farm-expiter": ["sft", "rm", "prompts.jsonl"],
    "farm-online-dpo": ["sft", "prompts.jsonl"],
    "farm-judge-train": ["prefs.jsonl"],
}


def users_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    (folder / "drafts").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    return folder


def demos(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "demos.jsonl",
        [{"instruction": f"Say {w}.", "input": "", "output": w} for w in ("red", "blue")],
    )


def prefs(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "prefs.jsonl",
        [
            {
                "instruction": f"Say {w}.",
                "input": "",
                "output_1": w,
                "output_2": "no",
                "preference": 1,
            }
            for w in ("red", "blue", "green", "yellow")
        ],
    )


@pytest.mark.parametrize("tool", ["farm-sft", "farm-rm-train"])
def test_a_folder_of_the_users_is_refused_before_training_and_kept(tool, tiny_model_path, tmp_path):
    """Both trained, then deleted whatever -o named and exited 0."""
    data = demos(tmp_path) if tool == "farm-sft" else prefs(tmp_path)
    mine = users_folder(tmp_path)
    done = run_tool(tool, str(tiny_model_path), str(data), "-o", str(mine), "--max-steps", "1")
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert f"{mine} is a folder that holds no farmkit model" in err
    assert "drafts/, notes.txt" in err and "--force" in err
    assert (mine / "notes.txt").read_text() == "my notes\n" and (mine / "drafts").is_dir()
    assert sorted(os.listdir(mine)) == ["drafts", "notes.txt"]
    assert not Path(f"{mine}-checkpoints").exists()


@pytest.mark.parametrize("tool", sorted(TRAINERS))
def test_every_trainer_refuses_a_folder_of_the_users_before_any_work(tool, tmp_path):
    mine = users_folder(tmp_path)
    for name in range(6):
        (mine / f"run-{name}.log").write_text("")
    arguments = [str(tmp_path / argument) for argument in TRAINERS[tool]]
    done = run_tool(tool, *arguments, "-o", str(mine))
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Invalid value for '-o' / '--output'" in err
    assert f"{mine} is a folder that holds no farmkit model" in err
    # the first entries, and how many more
    assert "drafts/, notes.txt, run-0.log, run-1.log, run-2.log and 3 more" in err
    assert len(os.listdir(mine)) == 8


@pytest.mark.parametrize("target", ["/dev/null", ".", ".."])
def test_a_device_or_the_current_folder_is_a_usage_error_before_training(
    target, tiny_model_path, tmp_path, monkeypatch
):
    """They trained, then failed: `.` left a `.-checkpoints` folder behind."""
    data = demos(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    done = run_tool(
        "farm-sft",
        str(tiny_model_path),
        str(data),
        "-o",
        target,
        "--max-steps",
        "1",
        "--save-steps",
        "1",
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    expected = {
        "/dev/null": "/dev/null is not a folder (a character device)",
        ".": ". is the current folder",
        "..": ".. is above the current folder",
    }[target]
    assert expected in err
    assert os.listdir(work) == [] and sorted(os.listdir(tmp_path)) == ["demos.jsonl", "work"]


def test_a_path_under_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    done = run_tool("farm-sft", "base", "demos.jsonl", "-o", str(tmp_path / "notes.txt" / "model"))
    assert done.returncode == 2
    assert f"{tmp_path / 'notes.txt'} is not a folder (a file)" in done.stderr.decode()


def test_force_replaces_a_folder_of_the_users_and_a_symlink_is_followed(tiny_model_path, tmp_path):
    """-o LINK trained the whole run, then failed with "Cannot call rmtree on a symbolic link"."""
    data = demos(tmp_path)
    mine = users_folder(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(mine, target_is_directory=True)
    argv = [str(tiny_model_path), str(data), "-o", str(link), "--max-steps", "1", "--force"]
    done = run_tool("farm-sft", *argv)
    assert done.returncode == 0, done.stderr.decode()
    assert link.is_symlink() and os.readlink(link) == str(mine)
    assert not (mine / "notes.txt").exists() and (mine / "config.json").is_file()
    assert json.loads((mine / "meta.json").read_text())["tool"] == "farm-sft"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.jsonl", "link", "mine"]


@pytest.mark.parametrize("kind", ["absent", "empty", "ours", "link to ours"])
def test_an_empty_folder_or_a_model_of_farmkits_passes_the_rule(kind, tmp_path):
    """The check passes: the tool goes on to its next complaint (DEMOS missing), no -o error."""
    from farmkit.lm.modelio import model_meta, write_meta

    target = tmp_path / "out"
    if kind != "absent":
        target.mkdir()
    if "ours" in kind:  # an earlier run's model: a rerun (or a resumed run) replaces it
        (target / "config.json").write_text("{}")
        write_meta(target, model_meta("farm-sft", "policy", "base", "chat", 0, {}))
    if kind == "link to ours":
        os.rename(target, tmp_path / "model")
        target.symlink_to(tmp_path / "model", target_is_directory=True)
    done = run_tool("farm-sft", "base", str(tmp_path / "missing.jsonl"), "-o", str(target))
    err = done.stderr.decode()
    assert done.returncode == 2 and "missing.jsonl" in err, err
    assert "'-o'" not in err
