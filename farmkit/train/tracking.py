"""--report-to: a trainer's metrics sent to an experiment tracker besides metrics.jsonl and stderr.

The trainers written on accelerate (farm-rm-train, farm-ppo, farm-quark) use accelerate's trackers:
`accelerator_kwargs` when the Accelerator is made, then `start`, `log` and `finish`. The ones
written on TRL's trainers (farm-sft, farm-expiter's rounds, farm-dpo) use the Trainer's reporting
(`trainer_reporting`). TensorBoard's event files go to DIR.runs/ beside the output folder (the
folder itself is written whole at the end); wandb follows its own variables (WANDB_PROJECT,
WANDB_MODE=offline...). Only the main process reports.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def tracker_dir(output_dir: str | os.PathLike) -> Path:
    """Where the tracker's files of a run writing `output_dir` go: DIR.runs beside it."""
    target = Path(output_dir)
    return target.parent / f"{target.name}.runs"


def check(report_to: str) -> None:
    """Fail before training, not after, when the tracker's package is missing."""
    if report_to == "none":
        return
    if report_to not in PACKAGES:
        raise FarmError(f"unknown tracker {report_to!r}; expected none, tensorboard or wandb")
    if importlib.util.find_spec(PACKAGES[report_to]) is None:
        raise FarmError(
            f"--report-to {report_to} needs the {PACKAGES[report_to]} package "
            f"(pip install {PACKAGES[report_to]})"
        )


def scalars(values: dict[str, Any]) -> dict[str, Any]:
    """The numbers and short texts of a run's configuration, which a tracker can record."""
    kept = {}
    for key, value in values.items():
        if isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) < 200):
            kept[key] = value
    return kept


def accelerator_kwargs(report_to: str, output_dir: str | os.PathLike) -> dict[str, Any]:
    """What the Accelerator of a run needs to report to `report_to`."""
    check(report_to)
    if report_to == "none":
        return {}
    return {"log_with": report_to, "project_dir": str(tracker_dir(output_dir))}


def start(accelerator: Any, tool: str, config: dict[str, Any]) -> None:
    """Open the run in the tracker (main process only; nothing when no tracker was asked for)."""
    if accelerator.log_with:
        accelerator.init_trackers(tool, config=scalars(config))


def log(accelerator: Any, metrics: dict[str, Any], step: int) -> None:
    if accelerator.log_with:
        numbers = {
            key: value
            for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        accelerator.log(numbers, step=step)


def finish(accelerator: Any) -> None:
    if accelerator.log_with:
        accelerator.end_training()


def trainer_reporting(
    report_to: str, logging_dir: str | os.PathLike, main_process: bool = True
) -> tuple[Any, list[Any]]:
    """(report_to, callbacks) for a transformers/TRL Trainer: TensorBoard through transformers'
    own callback, given the folder (its default would be inside the checkpoint folder, removed at
    the end), wandb through report_to."""
    check(report_to)
    if report_to == "wandb":
        return ["wandb"], []
    if report_to == "tensorboard" and main_process:
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        return "none", [TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(logging_dir)))]
    return "none", []
