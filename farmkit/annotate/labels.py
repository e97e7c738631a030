"""The `file` backend: verdicts read from a preference file (human or external labels), for comparing
simulated annotators with people.

Labels are matched on (instruction, input, output_1, output_2), in either order. A pair labelled
several times (several annotators) gives one of the labels chosen by the item's seeded draw
(`aggregate: sample`, like asking one person from the crowd) or their mean (`aggregate: mean`, a soft
label). A fractional label (a weighted judge's, as AlpacaEval 2's) is replayed as that fraction. A pair
without a label gets no verdict.
"""

from __future__ import annotations

from typing import Any

from farmkit.annotate.base import Backend, Verdict
from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown
from farmkit.core.io import read_records
from farmkit.core.records import preference_target


class FileBackend(Backend):
    name = "file"
    bulk = True

    @classmethod
    def check(cls, judge: Judge) -> str | None:
        return None if judge.path else "a file judge needs `path`, the labels file"

    def __init__(self, pool: Pool, options: dict[str, Any]) -> None:
        super().__init__(pool, options)
        self._labels: dict[str, dict[tuple[str, str, str, str], list[float]]] = {}

    def model_name(self, judge: Judge) -> str:
        return f"file:{judge.path}"

    def labels(self, path: str) -> dict[tuple[str, str, str, str], list[float]]:
        """P(output_2 better) for every labelled pair in `path`, keyed by the texts."""
        if path not in self._labels:
            table: dict[tuple[str, str, str, str], list[float]] = {}
            for record in read_records(path, "preference"):
                target = preference_target(record.get("preference"))
                if (
                    target is None
                    or not isinstance(record.get("output_1"), str)
                    or not isinstance(record.get("output_2"), str)
                ):
                    continue
                key = (
                    record.get("instruction", ""),
                    record.get("input") or "",
                    record["output_1"],
                    record["output_2"],
                )
                table.setdefault(key, []).append(target)
            self._labels[path] = table
        return self._labels[path]

    async def judge(
        self,
        judge: Judge,
        pairs: list[Shown],
        draws: list[float],
        seed: int,
        reservation: Any = None,  # unpriced: no budget to hold
    ) -> list[Verdict]:
        table = self.labels(str(judge.path))
        verdicts = []
        for pair, draw in zip(pairs, draws, strict=True):
            direct = table.get((pair.instruction, pair.input, pair.output_a, pair.output_b))
            # a label for the pair in the other order: P(B better) there is P(A better) here
            flipped = [
                1.0 - t
                for t in table.get((pair.instruction, pair.input, pair.output_b, pair.output_a), [])
            ]
            targets = (direct or []) + flipped
            if not targets:
                verdicts.append(
                    Verdict(
                        None,
                        reason=f"no label for this pair in {judge.path}",
                        model=self.model_name(judge),
                    )
                )
                continue
            if judge.aggregate == "mean":
                target = sum(targets) / len(targets)
            else:
                target = targets[min(int(draw * len(targets)), len(targets) - 1)]
            choice = "tie" if target == 0.5 else ("B" if target > 0.5 else "A")
            # a mean is a soft label, and so is one label that was fractional (a weighted judge's)
            soft = judge.aggregate == "mean" or target not in (0.0, 0.5, 1.0)
            verdicts.append(
                Verdict(
                    choice,
                    model=self.model_name(judge),
                    # not rounded: a replayed weighted verdict gives the published win rate exactly
                    probability=1.0 - target,
                    soft=target if soft else None,
                )
            )
        return verdicts

    async def close(self) -> None:
        self._labels.clear()
