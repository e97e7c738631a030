"""Writing model folders: one writer and one meta.json layout for every tool that trains a model.

A folder is written whole or not at all: the weights, tokenizer and meta.json go into a temporary
sibling `.NAME.partial` (the same path in every process, since some savers need every rank: ZeRO-3
gathers its shards), which the main process alone renames onto the target once meta.json is in it.

meta.json always holds: tool, kind (policy, reward_model), base_model, prompt_template, seed, config
(the resolved configuration), inputs (name -> SHA-256), versions (packages), provenance (farmkit's
version and the configuration's hash), launch (distributed type, processes, ZeRO stage, precision),
cpu_seconds (the CPU time the writing process had spent: bench/stage_profile.py reads it); a tool adds
its own keys beside them (training, pairs...).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError, process_umask
from farmkit.core.provenance import config_hash, provenance

META_FILE = "meta.json"

META_KEYS = (
    "tool",
    "kind",
    "base_model",
    "prompt_template",
    "seed",
    "config",
    "inputs",
    "versions",
    "provenance",
)


def model_meta(
    tool: str,
    kind: str,
    base_model: str | os.PathLike,
    prompt_template: str,
    seed: int,
    config: dict[str, Any],
    inputs: Mapping[str, str] | Sequence[str] = (),
    **extra: Any,
) -> dict[str, Any]:
    """meta.json of a model folder. `inputs` is {name: hash} or a list of paths to hash; `extra` keys
    (None values left out) sit beside the common ones. `launch` (the setup that really ran, see
    launch_record) is read from accelerate's state unless given."""
    base = str(base_model)
    hashes = (
        dict(inputs)
        if isinstance(inputs, Mapping)
        else {str(path): file_sha256(path) for path in inputs}
    )
    meta = {
        "tool": tool,
        "kind": kind,
        "base_model": str(Path(base).resolve()) if Path(base).is_dir() else base,
        "prompt_template": prompt_template,
        "seed": seed,
        "config": config,
        "inputs": hashes,
        "versions": package_versions(),
        "provenance": provenance(tool, config_hash=config_hash(config)),
    }
    meta.update({key: value for key, value in extra.items() if value is not None})
    meta.setdefault("launch", launch_record())
    meta.setdefault("cpu_seconds", cpu_seconds())
    return meta


def cpu_seconds() -> float:
    """User and system CPU seconds this process has spent so far, every thread of it and the child
    processes it waited for (a launcher's workers are counted by their own main process, not here)."""
    import resource

    spent = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return round(sum(usage.ru_utime + usage.ru_stime for usage in spent), 2)


def partial_path(target: str | os.PathLike) -> Path:
    target = Path(target)
    return target.with_name(f".{target.name}.partial")


SHOWN_ENTRIES = 5  # a refused folder's entries named in the error


def output_folder_problem(target: str | os.PathLike, force: bool = False) -> str | None:
    """Why a trainer may not write its model folder at `target` (-o), or None when it may: the rule
    every trainer follows before any work. `target` may be absent, an empty folder, or a model
    folder of ours (a meta.json farmkit wrote, which names its tool); any other folder only with
    --force (`force`). A symlink is followed (the model replaces the folder it names; the link
    stays). Never the current folder or one above it, nor something that is not a folder (a device
    such as /dev/null), nor a path under a file."""
    path = Path(target)
    real = Path(os.path.realpath(path))
    here = Path.cwd().resolve()
    if real == here or real in here.parents:
        where = "the current folder" if real == here else f"above the current folder ({here})"
        return f"{target} is {where}: the model folder replaces what -o names; give a new folder"
    if real.exists() and not real.is_dir():
        return f"{target} is not a folder (a {_kind_of(real)}); give a folder for the model"
    if not real.exists():
        above = next((p for p in real.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            return f"{target}: {above} is not a folder (a {_kind_of(above)})"
        return None
    entries = sorted(os.listdir(real))
    if not entries or force or _ours(real):
        return None
    shown = ", ".join(
        name + ("/" if (real / name).is_dir() else "") for name in entries[:SHOWN_ENTRIES]
    )
    more = f" and {len(entries) - SHOWN_ENTRIES} more" if len(entries) > SHOWN_ENTRIES else ""
    return (
        f"{target} is a folder that holds no farmkit model (no {META_FILE} of ours): {shown}{more}; "
        "the model would replace it: give a new or empty folder, or --force to replace it"
    )


def _ours(folder: Path) -> bool:
    """Whether `folder` holds a model farmkit wrote: a meta.json that names the tool that wrote it."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("tool"), str)


def _kind_of(path: Path) -> str:
    import stat

    mode = path.stat().st_mode
    for test, kind in (
        (stat.S_ISREG, "file"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "named pipe"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return kind
    return "special file"


@contextlib.contextmanager
def model_folder(target: str | os.PathLike, main_process: bool = True) -> Iterator[Path]:
    """Yield the temporary folder to fill; when the block succeeds, the main process checks that
    meta.json is there and renames the folder onto `target` (replacing an older one). On failure the
    temporary folder goes away and `target` is untouched. Other processes may write into the
    temporary folder (a collective save) but never rename or remove it. A symlink is followed: the
    folder it names is replaced, beside itself, and the link stays."""
    target = Path(os.path.realpath(target))
    partial = partial_path(target)
    if main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    try:
        yield partial
        if main_process:
            if not (partial / META_FILE).is_file():
                raise FarmError(f"{target}: the model folder was written without {META_FILE}")
            follow_umask(partial)
            if target.exists():
                shutil.rmtree(target)
            os.replace(partial, target)
    except BaseException:
        if main_process:
            shutil.rmtree(partial, ignore_errors=True)
        raise


def follow_umask(folder: Path) -> None:
    """Give every file and folder under `folder` the mode the umask gives other outputs: savers that
    write through a private temporary file (safetensors' mkstemp) leave 0600 weights behind, which
    would lock the rest of a group out of a shared model folder."""
    mask = process_umask()
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def save_model_folder(
    target: str | os.PathLike,
    model: Any,
    tokenizer: Any,
    meta: dict[str, Any],
    extra_files: Sequence[str | os.PathLike] = (),
    extra: Callable[[Path], None] | None = None,
) -> None:
    """Write a whole model folder from one process: weights, tokenizer, `extra_files`, what
    `extra(folder)` adds (a trainer state to resume from) and meta.json."""
    with model_folder(target) as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        for path in extra_files:
            if Path(path).exists():
                shutil.copy(path, folder / Path(path).name)
        if extra is not None:
            extra(folder)
        write_meta(folder, meta)


def copy_model_folder(
    source: str | os.PathLike,
    target: str | os.PathLike,
    meta: dict[str, Any],
    skip: Sequence[str] = (),
    extra_files: Sequence[str | os.PathLike] = (),
) -> None:
    """Write `target` whole as a copy of the finished model folder `source` (its files, those named
    in `skip` and its meta.json left out), with `extra_files` and a new meta.json: online DPO's last
    round's policy becoming the run's output."""
    with model_folder(target) as folder:
        for path in Path(source).iterdir():
            if path.is_file() and path.name not in (META_FILE, *skip):
                shutil.copyfile(path, folder / path.name)
        for path in extra_files:
            if Path(path).exists():
                shutil.copyfile(path, folder / Path(path).name)
        write_meta(folder, meta)


# ---------------------------------------------------------------------------------------------
# meta.json: what every farmkit model folder says about itself


def read_meta(model: str | os.PathLike) -> dict[str, Any]:
    path = Path(str(model)) / META_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise FarmError(f"{path}: not valid JSON ({exc})") from None


def write_meta(folder: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Write a model folder's meta.json whole (a reader never sees half of it), and valid JSON: a
    NaN or infinite number in it (a metric) is written as null."""
    from farmkit.core.io import atomic_path
    from farmkit.core.values import finite_json

    text = json.dumps(finite_json(meta), indent=2, sort_keys=True, default=str, allow_nan=False)
    with atomic_path(Path(folder) / META_FILE) as tmp:
        tmp.write_text(text + "\n")


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in (
        "farmkit",
        "torch",
        "transformers",
        "trl",
        "accelerate",
        "peft",
        "vllm",
        "deepspeed",
    ):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def file_sha256(path: str | os.PathLike) -> str:
    """Hash of an input file for meta.json (`-` cannot be hashed after the fact: None)."""
    if str(path) == "-":
        return "stdin"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# meta.json's `launch`: the setup that really ran


def launch_record(accelerator: Any = None) -> dict[str, Any]:
    """meta.json's `launch`: how the run was really distributed (not what a config file asked for):
    distributed type, processes, ZeRO stage (0: no DeepSpeed) and mixed precision. Read from
    `accelerator`, else from accelerate's state where a trainer set it up in this process, else
    from the launcher's environment (a run that used no accelerate at all)."""
    state = accelerator.state if accelerator is not None else _accelerate_state()
    if state is None:
        import torch

        processes = int(os.environ.get("WORLD_SIZE", "1"))
        several = "MULTI_GPU" if torch.cuda.is_available() else "MULTI_CPU"
        return {
            "distributed_type": several if processes > 1 else "NO",
            "num_processes": processes,
            "zero_stage": 0,
            "mixed_precision": "no",
        }
    plugin = state.deepspeed_plugin
    return {
        "distributed_type": str(state.distributed_type.value),
        "num_processes": state.num_processes,
        "zero_stage": int(plugin.zero_stage) if plugin is not None else 0,
        "mixed_precision": str(state.mixed_precision),
    }


def _accelerate_state() -> Any:
    """accelerate's AcceleratorState when an Accelerator (a Trainer's included) exists, else None."""
    import sys

    if "accelerate" not in sys.modules:
        return None
    from accelerate.state import AcceleratorState

    return AcceleratorState() if AcceleratorState._shared_state else None
