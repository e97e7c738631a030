"""What training runs leave behind, read back for plotting: each run's metrics.jsonl (one JSON object
per line with `step` and the method's figures)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError, RecordError, display_name, iter_json

METRICS_FILE = "metrics.jsonl"


def metrics_file(run: str | os.PathLike) -> Path:
    """A run's metrics: RUN/metrics.jsonl, PPO's RUN-checkpoints/metrics.jsonl, or RUN itself when it is a file."""
    path = Path(run)
    if path.is_file():
        return path
    for candidate in (
        path / METRICS_FILE,
        path.with_name(f"{path.name}-checkpoints") / METRICS_FILE,
    ):
        if candidate.is_file():
            return candidate
    raise FarmError(
        f"{run}: no {METRICS_FILE} in it (or beside it in {path.name}-checkpoints); expected a run folder "
        "written by a farmkit trainer (farm-sft, farm-rm-train, farm-dpo, farm-ppo, farm-quark, "
        "farm-expiter), or a metrics file"
    )


def read_metrics(run: str | os.PathLike) -> list[dict[str, Any]]:
    """A run's metric rows, in order; a row without `step` is numbered after the previous one (older
    files), a row that is not an object is an error naming its line."""
    path = metrics_file(run)
    rows: list[dict[str, Any]] = []
    for number, row in iter_json(path):
        if not isinstance(row, dict):
            raise RecordError(
                display_name(path),
                number,
                f"a {type(row).__name__}; expected one JSON object per line with step",
            )
        if not isinstance(row.get("step"), int | float) or isinstance(row.get("step"), bool):
            row = {**row, "step": rows[-1]["step"] + 1 if rows else 1}
        rows.append(row)
    return rows


def run_names(runs: list[str]) -> list[str]:
    """Short names for the runs' lines: the folder names, or the whole paths where two names clash."""
    names = [Path(run).name or str(run) for run in runs]
    return names if len(set(names)) == len(names) else [str(run) for run in runs]
