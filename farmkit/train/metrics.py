"""Training metrics: one metrics.jsonl schema for every trainer (schemas/metrics.json).

Each line is one JSON object with

- `method`: the trainer (sft, reward, dpo, online-dpo, ppo, rloo, grpo, quark, expiter; bon for
  farm-bon --metrics);
- `step`: its unit of progress, counted from 1: optimizer steps for sft, reward, dpo and expiter
  (over all rounds), PPO steps (one rollout batch and its updates) for ppo, rloo and grpo, optimizer
  steps over all rounds for quark, rounds for online-dpo, n for bon;
- `loss`: the objective the trainer minimizes at that step (null where it has none);
- the method's own figures (numbers, null, or lists of numbers), named the same across methods
  where they mean the same thing: `learning_rate`, `epoch`, `elapsed_s` (seconds since training
  started), `reward`, `kl`, `accuracy`, `round`, `response_length`; the budget as running totals
  (`labels_used`, `tokens_sampled`, `training_tokens`: farmkit.train.budget); and, on the rows of
  checkpoints judged by a --gold judge, `gold_win_rate`, `gold_reward`, `gold_kl` and
  `gold_answer_length` (farmkit.train.gold); on the on-policy trainers' rows, `step_s` (the step's
  wall time), `tokens_per_s` (tokens sampled per second of it) and, on a device whose peak is known
  (farmkit.core.devices), `mfu` (StepWork: 2 x parameters FLOPs per token of a forward pass, 6 x
  per token trained, over the step's time x the peak bf16 FLOPs x the processes); with
  --async-rollouts, `staleness` (the steps by which the weights that sampled the step's batch lag
  the policy it trains: farmkit.train.async_rollouts).

`farm-plot curves` draws any of them. A value that is not finite (NaN, inf) is written as null, so
every line stays JSON that any reader parses."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from farmkit.core.devices import DevicePeak
from farmkit.core.io import atomic_path
from farmkit.core.validate import problems

# the figures of a row that read the clock: a seeded rerun or a resumed run repeats every other one
CLOCK_FIELDS = frozenset({"elapsed_s", "step_s", "tokens_per_s", "mfu"})
METHODS = ("sft", "reward", "dpo", "online-dpo", "ppo", "rloo", "grpo", "quark", "expiter", "bon")


def _clean(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        return _clean(value.item())
    return value


def metrics_row(method: str, step: int, loss: float | None, **figures: Any) -> dict[str, Any]:
    """One row of the schema: method, step and loss first, then the figures in the order given.
    Raises ValueError for a row the schema rejects (a programming error in a trainer)."""
    row: dict[str, Any] = {"method": method, "step": step, "loss": _clean(loss)}
    for name, value in figures.items():
        if name not in row:
            row[name] = _clean(value)
    problem = problems(row, "metrics")
    if problem:
        raise ValueError(f"metrics row for {method}: {problem}")
    return row


@dataclass(frozen=True)
class StepWork:
    """A step's work in tokens, over all processes, for its FLOPs: the usual estimate of a dense
    transformer's matrix products (Kaplan et al., 2020), attention's own products left out."""

    parameters: int  # the policy's (the reward and value models are left out)
    generated: float  # tokens sampled (one decoding step each)
    forward: float  # tokens through forward passes without gradient (prefill, log-probabilities)
    trained: float  # tokens through a forward and backward pass

    def flops(self) -> float:
        return (
            2 * self.parameters * (self.generated + self.forward)
            + 6 * self.parameters * self.trained
        )


def parameter_count(model: Any) -> int:
    """A model's parameters (DeepSpeed ZeRO-3's partitioned ones at their full size)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def step_throughput(
    work: StepWork, seconds: float, peak: DevicePeak | None, processes: int
) -> dict[str, float]:
    """A step's `step_s`, `tokens_per_s` (sampled) and, where the device's peak is known, `mfu`."""
    figures = {"step_s": round(seconds, 3), "tokens_per_s": work.generated / seconds}
    if peak is not None:
        figures["mfu"] = work.flops() / (seconds * peak.bf16_flops * processes)
    return figures


def dumps(row: Mapping[str, Any]) -> str:
    return json.dumps(row, allow_nan=False) + "\n"


def write_metrics(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write finished rows (from `metrics_row`) as the whole file, atomically."""
    target = Path(path)
    text = "".join(dumps(row) for row in rows)
    with atomic_path(target) as tmp:
        tmp.write_text(text)
    return target


class MetricsWriter:
    """Rows written as training goes, one flushed line each (a crashed run keeps what it logged).
    `append`: continue an existing file (a resumed run); `enabled=False` writes nothing (the ranks
    other than the main process) but still builds and returns the rows."""

    def __init__(
        self,
        path: str | os.PathLike,
        method: str,
        append: bool = False,
        enabled: bool = True,
    ) -> None:
        self.path, self.method = Path(path), method
        self.started = time.time()
        self._handle: IO[str] | None = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a" if append else "w")

    def write(self, step: int, loss: float | None, **figures: Any) -> dict[str, Any]:
        """Write one row and return it; `elapsed_s` is filled in unless given."""
        figures.setdefault("elapsed_s", round(time.time() - self.started, 2))
        row = metrics_row(self.method, step, loss, **figures)
        if self._handle is not None:
            self._handle.write(dumps(row))
            self._handle.flush()
        return row

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def from_trainer_log(
    method: str, log_history: Iterable[Mapping[str, Any]], step_offset: int = 0, **extra: Any
) -> list[dict[str, Any]]:
    """Rows from a transformers Trainer's `state.log_history` (the entries that carry a training
    loss; the final summary entry, with train_loss, is left out), with `extra` figures on each."""
    rows = []
    for entry in log_history:
        if "loss" not in entry or "step" not in entry:
            continue
        figures = {k: v for k, v in entry.items() if k not in ("loss", "step")}
        rows.append(
            metrics_row(
                method, int(entry["step"]) + step_offset, entry["loss"], **{**extra, **figures}
            )
        )
    return rows
