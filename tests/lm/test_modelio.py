"""farmkit.lm.modelio: a model folder appears whole or not at all, with one meta.json layout, and only
the main process renames it into place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farmkit.core.io import FarmError
from farmkit.lm.modelio import META_KEYS, model_folder, model_meta, partial_path, save_model_folder


class Saver:
    """Stands in for a model or tokenizer: writes one file, or fails halfway."""

    def __init__(self, name: str, fail: bool = False):
        self.name, self.fail = name, fail

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / self.name).write_text("weights")
        if self.fail:
            raise RuntimeError("disk full")


def test_meta_layout(tmp_path):
    data = tmp_path / "prefs.jsonl"
    data.write_text("{}\n")
    meta = model_meta(
        "farm-x",
        "policy",
        tmp_path,
        "chat",
        3,
        {"beta": 0.1},
        [str(data)],
        training={"steps": 2},
        unused=None,
    )
    assert list(meta)[: len(META_KEYS)] == list(META_KEYS)
    assert meta["base_model"] == str(tmp_path.resolve()) and meta["inputs"] == {
        str(data): meta["inputs"][str(data)]
    }
    assert (
        len(meta["inputs"][str(data)]) == 64
        and meta["training"] == {"steps": 2}
        and "unused" not in meta
    )
    assert meta["provenance"]["tool"] == "farm-x" and len(meta["provenance"]["config_hash"]) == 12
    assert meta["launch"]["num_processes"] == 1 and meta["launch"]["zero_stage"] == 0
    assert (
        model_meta("farm-x", "policy", "org/model", "chat", 3, {"beta": 0.1}, {"-": "stdin"})[
            "base_model"
        ]
        == "org/model"
    )


def test_a_failed_write_leaves_the_old_folder_untouched(tmp_path):
    target = tmp_path / "model"
    save_model_folder(target, Saver("weights.bin"), Saver("tokenizer.json"), {"kind": "policy"})
    assert sorted(p.name for p in target.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "weights.bin",
    ]
    with pytest.raises(RuntimeError, match="disk full"):
        save_model_folder(
            target, Saver("other.bin", fail=True), Saver("tokenizer.json"), {"kind": "policy"}
        )
    assert sorted(p.name for p in target.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "weights.bin",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no partial folder left behind
    with pytest.raises(FarmError, match="without meta.json"), model_folder(target) as folder:
        (folder / "weights.bin").write_text("new")
    assert (
        json.loads((target / "meta.json").read_text()) == {"kind": "policy"}
        and not partial_path(target).exists()
    )


def test_only_the_main_process_renames(tmp_path):
    target = tmp_path / "model"
    with model_folder(target, main_process=True) as folder:
        # another rank enters too: it sees the same temporary folder and never renames or removes it
        with model_folder(target, main_process=False) as other:
            assert other == folder
        assert folder.is_dir() and not target.exists()
        (folder / "meta.json").write_text("{}")
    assert target.is_dir() and not partial_path(target).exists()


def test_launch_record_without_accelerate_reads_the_launcher(monkeypatch):
    """A tool that never built an Accelerator still records how many processes the launcher ran."""
    from farmkit.lm import modelio
    from farmkit.train import launch

    # launch_record lives in farmkit.lm.modelio (the meta.json writer); launch names it too
    monkeypatch.setattr(modelio, "_accelerate_state", lambda: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launch.launch_record() == {
        "distributed_type": "MULTI_CPU",
        "num_processes": 2,
        "zero_stage": 0,
        "mixed_precision": "no",
    }
    # meta.json keeps a launch a tool gives (an Accelerator's own record)
    given = {"distributed_type": "DEEPSPEED", "num_processes": 1, "zero_stage": 3}
    assert model_meta("farm-x", "policy", "m", "chat", 0, {}, {}, launch=given)["launch"] == given


def test_policy_folders_go_through_the_one_writer(tmp_path):
    """PPO and Quark write their policies (and checkpoints) with farmkit.train.policy: the same
    meta.json layout and the same whole-or-nothing folder as every other trained model."""
    from farmkit.train.policy import policy_meta, save_policy

    meta = policy_meta("farm-ppo", str(tmp_path), "chat", 1, {"steps": 3}, [], step=3)
    assert list(meta)[: len(META_KEYS)] == list(META_KEYS) and meta["kind"] == "policy"
    assert meta["provenance"]["tool"] == "farm-ppo" and meta["step"] == 3
    target = tmp_path / "ppo"
    with pytest.raises(RuntimeError, match="disk full"):
        save_policy(Saver("model.safetensors", fail=True), Saver("tokenizer.json"), target, meta)
    assert not target.exists() and not partial_path(target).exists()

    def trainer_state(folder: Path) -> None:
        (folder / "trainer_state").mkdir()

    save_policy(
        Saver("model.safetensors"), Saver("tokenizer.json"), target, meta, extra=trainer_state
    )
    assert (target / "trainer_state").is_dir() and not partial_path(target).exists()
    assert json.loads((target / "meta.json").read_text())["provenance"] == meta["provenance"]


def _check_converted(folder):
    meta = json.loads((folder / "meta.json").read_text())
    assert set(META_KEYS) <= set(meta) and meta["kind"] == "base_model"
    assert meta["converted_from"] == "gguf" and meta["prompt_template"] == "auto"
    assert (folder / "config.json").is_file() and not partial_path(folder).exists()
    assert not any(path.name.endswith(".partial") for path in folder.parent.iterdir())


@pytest.mark.model
def test_the_embedded_models_cached_folder_has_the_one_writers_layout():
    """The folder `make install` converted the embedded model's GGUF into (resolve('embedded'), the
    same call every tool makes; converted here, once, where it is not cached yet): the common
    meta.json layout, and no partial folder beside it. The conversion from scratch, into a folder of
    its own, is the slow lane's (about 30 s of dequantizing)."""
    from farmkit.lm.models import resolve

    _check_converted(Path(resolve("embedded")))


@pytest.mark.slow  # about 30 s: the embedded model's GGUF dequantized from scratch
@pytest.mark.model
def test_a_converted_gguf_folder_is_written_by_the_one_writer(tmp_path, monkeypatch):
    """The embedded model's GGUF becomes a cached model folder through farmkit.lm.modelio: the common
    meta.json layout and no partial folder left behind."""
    from farmkit.lm.models import converted_gguf, embedded_gguf

    monkeypatch.setenv("FARMKIT_CACHE", str(tmp_path / "cache"))
    _check_converted(converted_gguf(embedded_gguf(), "embedded-test"))


def test_a_copied_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path, monkeypatch):
    """farm-online-dpo's output: the last round's policy copied under a new meta.json. A copy that
    fails halfway leaves the previous output as it was (it used to be copied file by file over it,
    leaving new weights beside an old config)."""
    import shutil

    from farmkit.lm.modelio import copy_model_folder

    source = tmp_path / "round_2" / "policy"
    source.mkdir(parents=True)
    for name, text in (("config.json", "new config"), ("model.safetensors", "new weights")):
        (source / name).write_text(text)
    (source / "meta.json").write_text('{"round": 2}')
    (source / "metrics.jsonl").write_text("round 2's own DPO steps\n")
    run_metrics = tmp_path / "metrics.jsonl"
    run_metrics.write_text("every round\n")
    target = tmp_path / "out"
    target.mkdir()
    for name, text in (("config.json", "old config"), ("model.safetensors", "old weights")):
        (target / name).write_text(text)
    (target / "meta.json").write_text('{"old": true}')

    copied = []
    original = shutil.copyfile

    def copyfile(src, dst, *args, **kwargs):
        if copied:
            raise OSError("disk full")
        copied.append(src)
        return original(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", copyfile)
    with pytest.raises(OSError, match="disk full"):
        copy_model_folder(source, target, {"tool": "t"}, skip=("metrics.jsonl",))
    assert {p.name: p.read_text() for p in target.iterdir()} == {
        "config.json": "old config",
        "model.safetensors": "old weights",
        "meta.json": '{"old": true}',
    }
    assert not partial_path(target).exists()

    monkeypatch.setattr(shutil, "copyfile", original)
    copy_model_folder(
        source, target, {"tool": "t"}, skip=("metrics.jsonl",), extra_files=[run_metrics]
    )
    assert {p.name: p.read_text() for p in target.iterdir() if p.name != "meta.json"} == {
        "config.json": "new config",
        "model.safetensors": "new weights",
        "metrics.jsonl": "every round\n",
    }
    assert json.loads((target / "meta.json").read_text())["tool"] == "t"


class SafetensorsSaver:
    """Writes its weights the way safetensors does (a private temporary file renamed into place)."""

    def save_pretrained(self, folder: Path) -> None:
        import torch
        from safetensors.torch import save_file

        save_file({"weight": torch.zeros(2)}, str(Path(folder) / "model.safetensors"))


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_every_file_of_a_model_folder_follows_the_umask(tmp_path, umask):
    import os

    previous = os.umask(umask)
    try:
        target = tmp_path / "model"
        save_model_folder(target, SafetensorsSaver(), Saver("tokenizer.json"), {"kind": "policy"})
        (tmp_path / "beside.jsonl").write_text("{}\n")  # any other output the tool writes
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in target.iterdir()}
    expected = 0o666 & ~umask
    assert (tmp_path / "beside.jsonl").stat().st_mode & 0o777 == expected
    assert modes == {
        name: expected for name in ("meta.json", "model.safetensors", "tokenizer.json")
    }
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask


def test_meta_records_the_cpu_seconds_spent_so_far():
    """meta.json says how much CPU the tool had spent when it wrote the folder (user + system, its
    threads and the processes it waited for), so that a finished run can be profiled stage by stage
    (bench/stage_profile.py)."""
    import resource

    def spent() -> float:
        return sum(
            u.ru_utime + u.ru_stime
            for u in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
        )

    before = spent()
    meta = model_meta("farm-x", "policy", "m", "chat", 0, {}, {})
    after = spent()
    assert before - 0.01 <= meta["cpu_seconds"] <= after + 0.01 and before > 0
