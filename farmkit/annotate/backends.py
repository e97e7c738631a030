"""The registry of judge backends (name -> class, imported on first use, so that torch or openai load only
when a pool needs them) and the set of backends one run builds. Backends import only base.py (their
types and shared helpers), never this registry."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from farmkit.annotate.base import Backend

if TYPE_CHECKING:  # an annotation only: pools imports this registry, so no import back at run time
    from farmkit.annotate.pools import Pool

REGISTRY = {
    "openai": "farmkit.annotate.openai_backend:OpenAIBackend",
    "local": "farmkit.annotate.local:LocalBackend",
    "oracle": "farmkit.annotate.oracle:OracleBackend",
    "file": "farmkit.annotate.labels:FileBackend",
}


def backend_class(name: str) -> type[Backend]:
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


class Backends:
    """Builds each backend once, on first use."""

    def __init__(self, pool: Pool, options: dict[str, Any]):
        self.pool, self.options = pool, options
        self._built: dict[str, Backend] = {}

    def get(self, name: str) -> Backend:
        if name not in self._built:
            self._built[name] = backend_class(name)(self.pool, self.options)
        return self._built[name]

    @property
    def retries(self) -> int:
        """Requests sent again after a transient failure (429, 5xx, timeout, dropped connection)."""
        return sum(
            getattr(backend, "stats", {}).get("retries", 0) for backend in self._built.values()
        )

    @property
    def concurrency(self) -> list[tuple[str, int, int, int]]:
        """(backend, requests it may send at once now, the most it may, times it backed off) of each
        backend whose concurrency adapts to its endpoint."""
        return [
            (name, *backend.client.concurrency)
            for name, backend in self._built.items()
            if hasattr(getattr(backend, "client", None), "concurrency")
        ]

    def stop(self) -> None:
        for backend in self._built.values():
            backend.stop()

    async def close(self) -> None:
        for backend in self._built.values():
            await backend.close()
