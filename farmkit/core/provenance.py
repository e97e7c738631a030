"""What a tool records about itself on every record it adds (its name, the version, the seed and the
options) and the short configuration hash that goes with it. Below every pillar, so the library's
own writers (farm-annotate's engine, the model folders' meta.json) stamp records as the tools do."""

from __future__ import annotations

from typing import Any

from farmkit import __version__
from farmkit.core.seeds import stable_hash


def provenance(tool: str, seed: int | None = None, **options: Any) -> dict[str, Any]:
    """What a tool records about itself on every record it adds: tool, version, seed, options."""
    stamp: dict[str, Any] = {"tool": tool, "version": __version__}
    if seed is not None:
        stamp["seed"] = seed
    stamp.update({key: value for key, value in options.items() if value is not None})
    return stamp


def stamp(record: dict[str, Any], tool: str, info: dict[str, Any]) -> dict[str, Any]:
    """Add a tool's provenance under record['provenance'][tool], keeping earlier tools' entries."""
    earlier = record.get("provenance")
    merged = dict(earlier) if isinstance(earlier, dict) else {}
    merged[tool] = info
    record["provenance"] = merged
    return record


def config_hash(options: dict[str, Any]) -> str:
    """A short stable hash of a configuration, for provenance and cache keys."""
    return stable_hash(options)[:12]
