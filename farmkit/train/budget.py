"""What a policy method's run consumed, in one shape for every method: meta.json's `budget` block
(farm-bon: its --metrics rows and a line on stderr) and, as running totals, the same figures on every
metrics.jsonl row. The equal-budget comparison (`make -C examples methods-at-equal-budget`) reads them.

- `labels_used`: preference records the method consumed, directly (farm-dpo: its input, ties and
  null verdicts included, since each was paid for; farm-online-dpo: the pairs it had labelled;
  farm-grpo and farm-rloo --pool: the pairs of their groups the pool judged) or
  through its reward model (the records that trained it, read from the reward model folder's
  meta.json; null where the folder does not say, a model not trained by farm-rm-train);
- `tokens_sampled`: response tokens the method sampled to train (rollouts, best-of-n samples, online
  DPO's pairs; the gold judge's samples are counted apart, in meta.json's `gold` block);
- `training_tokens`: tokens the optimizer's forward passes read, prompt and response, padding left
  out, every pass over the same data counted (0 for best-of-n, which trains nothing);
- `wall_seconds`: the run's wall-clock time (metrics rows: `elapsed_s`).
"""

from __future__ import annotations

import os
import time
from typing import Any

FIELDS = ("labels_used", "tokens_sampled", "training_tokens", "wall_seconds")
ROW_FIELDS = ("labels_used", "tokens_sampled", "training_tokens")


def reward_model_labels(reward_model: str | os.PathLike) -> int | None:
    """The preference records a reward model folder was trained on (farm-rm-train records them in
    meta.json's `preferences`), or the labels its own budget says it used; None when unknown."""
    from pathlib import Path

    from farmkit.lm.models import read_meta

    if not Path(str(reward_model)).is_dir():
        return None
    meta = read_meta(reward_model)
    records = (meta.get("preferences") or {}).get("records")
    if isinstance(records, int):
        return records
    used = (meta.get("budget") or {}).get("labels_used")
    return used if isinstance(used, int) else None


class Budget:
    """Running totals of one run; `before` continues a resumed run's totals (its last metrics row)."""

    def __init__(self, labels_used: int | None, before: dict[str, Any] | None = None) -> None:
        before = before or {}
        self.labels_used = labels_used
        self.tokens_sampled = int(before.get("tokens_sampled") or 0)
        self.training_tokens = int(before.get("training_tokens") or 0)
        self.seconds_before = float(before.get("elapsed_s") or 0.0)
        self.started = time.perf_counter()
        self.asked: dict[str, Any] = {}  # what having labels made cost, for a method that asks

    def labelled(self, labels_used: int, **asked: Any) -> None:
        """The totals of a method that has its labels made as it runs (farm-grpo --pool): the
        labels so far and what asking for them took (requests, cache hits, USD spent)."""
        self.labels_used = labels_used
        self.asked = asked

    def add(self, sampled: float = 0, trained: float = 0) -> None:
        self.tokens_sampled += int(sampled)
        self.training_tokens += int(trained)

    @property
    def wall_seconds(self) -> float:
        return round(self.seconds_before + time.perf_counter() - self.started, 3)

    def row(self) -> dict[str, Any]:
        """The running totals for a metrics row."""
        return {
            "labels_used": self.labels_used,
            "tokens_sampled": self.tokens_sampled,
            "training_tokens": self.training_tokens,
            **self.asked,
        }

    def block(self, **extra: Any) -> dict[str, Any]:
        """meta.json's `budget`: the four figures, then the method's own."""
        return {**self.row(), "wall_seconds": self.wall_seconds, **extra}
