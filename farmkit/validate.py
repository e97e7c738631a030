"""Check records against the JSON Schemas in schemas/ (the subset of JSON Schema that they use).

A full JSON Schema library is not a dependency: the record schemas use only `type`, `required`,
`properties`, `enum`, `minimum` and `maximum`, and the messages here name the field and what was
expected, which is what a researcher needs to fix a file.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

import orjson

KINDS = ("instruction", "output", "pair", "preference", "reward", "leaderboard")

_TYPE_NAMES = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "null": "null",
    "object": "an object",
    "array": "an array",
    "boolean": "true or false",
}


@functools.cache
def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of a record kind, as shipped in the package."""
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
    text = importlib.resources.files("farmkit.schemas").joinpath(f"{kind}.json").read_bytes()
    return orjson.loads(text)


def _is_type(value: Any, type_name: str) -> bool:
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "null":
        return value is None
    if type_name == "object":
        return isinstance(value, dict)
    if type_name == "array":
        return isinstance(value, list)
    if type_name == "boolean":
        return isinstance(value, bool)
    raise ValueError(f"unsupported schema type {type_name!r}")


def _describe(spec: dict[str, Any]) -> str:
    types = spec.get("type", [])
    types = [types] if isinstance(types, str) else types
    text = " or ".join(_TYPE_NAMES[t] for t in types)
    bounds = []
    if "minimum" in spec:
        bounds.append(f">= {spec['minimum']}")
    if "maximum" in spec:
        bounds.append(f"<= {spec['maximum']}")
    if bounds:
        text += " " + " and ".join(bounds)
    if "enum" in spec:
        text = "one of " + ", ".join(repr(v) for v in spec["enum"])
    return text


def problems(record: Any, kind: str) -> str | None:
    """Return what is wrong with `record` as a `kind` record ("...; expected ..."), or None."""
    spec = schema(kind)
    if not isinstance(record, dict):
        return f"a {type(record).__name__} is not a record; expected a JSON object ({spec['title']})"
    for field in spec["required"]:
        if field not in record:
            return f"missing field {field!r}; expected a {spec['title']} with fields {', '.join(spec['required'])}"
    for field, field_spec in spec["properties"].items():
        if field not in record:
            continue
        value = record[field]
        types = field_spec.get("type")
        if types is not None:
            types = [types] if isinstance(types, str) else types
            if not any(_is_type(value, t) for t in types):
                return f"field {field!r} is {_short(value)}; expected {_describe(field_spec)}"
        if "enum" in field_spec and value not in field_spec["enum"]:
            return f"field {field!r} is {_short(value)}; expected {_describe(field_spec)}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if ("minimum" in field_spec and value < field_spec["minimum"]) or (
                "maximum" in field_spec and value > field_spec["maximum"]
            ):
                return f"field {field!r} is {_short(value)}; expected {_describe(field_spec)}"
    return None


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."
