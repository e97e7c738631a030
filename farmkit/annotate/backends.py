"""The one interface every judge backend implements, what a backend returns per pair, and the
registry that builds backends on first use (so that torch or openai load only when a pool needs them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown


@dataclass
class Verdict:
    """A judge's answer for one pair as shown: choice "A" (shown first), "B", "tie" or None (no verdict)."""

    choice: str | None
    reason: str | None = None
    raw: str | None = None
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    price: float = 0.0
    seconds: float = 0.0
    model: str | None = None
    probability: float | None = None  # P(A is better) where the backend knows it (oracle, local)


class RequestFailed(Exception):
    """A request that failed for good (after its retries, or with an error no retry fixes for this item);
    its items get no verdict, the run goes on."""


class FatalBackendError(Exception):
    """An error no retry can fix (unknown model, rejected key): the whole run stops."""


class Backend(Protocol):
    priced: bool  # requests cost money (budget checks apply)
    bulk: bool  # verdicts are computed in-process and fast: judge many pairs per call

    def model_name(self, judge: Judge) -> str: ...

    async def judge(self, judge: Judge, pairs: list[Shown], draws: list[float], seed: int) -> list[Verdict]:
        """Verdicts for `pairs` in one request. `draws` are uniform numbers in [0, 1), one per pair,
        for backends that sample; `seed` is the request's seed for endpoints that accept one."""
        ...

    async def close(self) -> None: ...


def decide(probability_a: float, temperature: float, draw: float) -> str:
    """A verdict from P(A better): the likelier side at temperature 0 (ties stay ties), else a draw."""
    if temperature == 0:
        if probability_a == 0.5:
            return "tie"
        return "A" if probability_a > 0.5 else "B"
    return "A" if draw < probability_a else "B"


def sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exp = math.exp(value)
    return exp / (1.0 + exp)


def cacheable(judge: Judge) -> bool:
    """Verdicts worth keeping in the persistent cache: those that cost a request or a forward pass."""
    return judge.backend in ("openai", "local")


def identity(pool: Pool, judge: Judge) -> dict[str, Any]:
    """What, beyond the judge's own fields, decides its verdicts: the concrete model and the prompt's text.
    Computed without building the backend, so a fully cached run loads neither openai nor torch."""
    from farmkit.annotate.prompts import load_template

    if judge.backend == "openai":
        fields = {"model": pool.model_for(judge), "template": load_template(judge.prompt).text}
        if judge.examples:  # the examples it is shown, so editing one re-asks only the judges that see it
            import dataclasses

            from farmkit.annotate.prompts import worked_examples

            fields["worked_examples"] = [dataclasses.asdict(e) for e in worked_examples()[: judge.examples]]
        return fields
    if judge.backend == "local":
        from pathlib import Path

        from farmkit.models import resolve

        folder = Path(resolve(judge.model or "embedded"))
        weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
        stamps = [(w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in weights]
        return {"model": str(folder), "weights": stamps, "template": load_template(judge.prompt).text}
    return {"model": judge.reward if judge.backend == "oracle" else judge.path}


class Backends:
    """Builds each backend once, on first use."""

    def __init__(self, pool: Pool, options: dict[str, Any]):
        self.pool, self.options = pool, options
        self._built: dict[str, Backend] = {}

    def get(self, name: str) -> Backend:
        if name not in self._built:
            if name == "oracle":
                from farmkit.annotate.oracle import OracleBackend

                self._built[name] = OracleBackend()
            elif name == "file":
                from farmkit.annotate.labels import FileBackend

                self._built[name] = FileBackend()
            elif name == "local":
                from farmkit.annotate.local import LocalBackend

                self._built[name] = LocalBackend(device=self.options.get("device", "auto"))
            elif name == "openai":
                from farmkit.annotate.openai_backend import OpenAIBackend

                self._built[name] = OpenAIBackend(self.pool, self.options)
            else:
                raise ValueError(f"unknown backend {name!r}")
        return self._built[name]

    @property
    def retries(self) -> int:
        """Requests sent again after a transient failure (429, 5xx, timeout, dropped connection)."""
        return sum(getattr(backend, "stats", {}).get("retries", 0) for backend in self._built.values())

    async def close(self) -> None:
        for backend in self._built.values():
            await backend.close()
