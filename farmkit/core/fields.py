"""Configuration dataclasses whose fields carry their help text and allowed values: the one
declaration a tool's options, its --config keys and a config built in Python are all read from
(farmkit.cli turns the fields into click options). No click here: the library imports this.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from farmkit.core.values import UNBOUNDED, Bounds, Number

# the `path` settings of a file option (click.Path's): one that must exist, and one read from a
# file or `-` (stdin)
EXISTING_FILE = {"exists": True, "dir_okay": False}
FILE_OR_STDIN = {"allow_dash": True, "dir_okay": False}


def help_field(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    bounds: Bounds = UNBOUNDED,
    **extra: Any,
) -> Any:
    """A dataclass field with its help text, and the allowed values: a choice's, or a number's
    range (its kind is the field's type; every number must be finite: check_fields).

    `extra` shapes the field's command-line option where the default (--field-name, its type, the
    default shown) does not fit, in plain values (farmkit.cli reads them; no click here):
    flags (("-o", "--output")), aliases (old names, hidden), metavar, flag (a bare --x rather than
    --x/--no-x), flag_value (the value of the option given without one), multiple (repeatable: a tuple), nargs, path (click.Path's settings, a dict),
    parse (text -> value; a ValueError is a usage error naming the option), required, and
    show_default (False: the help says the default itself, or it means "none")."""
    metadata: dict[str, Any] = {"help": help, "bounds": bounds, **extra}
    if choices:
        metadata["choices"] = choices
    return dataclasses.field(default=default, metadata=metadata)


def concept(field: dataclasses.Field) -> str:
    """The shared concept a config field stands for (its own name unless shared_field said)."""
    return field.metadata.get("shared", field.name)


def number(field: dataclasses.Field) -> Number | None:
    """The kind and range of a numeric field (None for a text, a flag or a choice)."""
    kind = scalar_type(field.type)
    if kind not in (int, float):
        return None
    return Number(kind, field.metadata.get("bounds", UNBOUNDED))


def check_fields(config: Any) -> None:
    """Check every numeric field of a config against its declaration (farmkit.core.values): the
    config of a run built in Python is held to what its options and --config keys are. Fields set
    to None (an optional number left out) are skipped. Raises ValueError naming the option."""
    for field in dataclasses.fields(config):
        declared = number(field)
        value = getattr(config, field.name)
        if declared is None or value is None:
            continue
        try:
            setattr(config, field.name, declared.check(value))
        except ValueError as exc:
            raise ValueError(f"{option_name(concept(field))}: {exc}") from None


def scalar_type(annotation: Any) -> type:
    """The one scalar type behind `int`, `float | None`, `str`, ... (None is never a flag value)."""
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, {"typing": typing})  # noqa: S307 - our own annotations only
        except NameError:  # a module's own type (a parsed value, farmkit.core.split.Sizes)
            return object
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return annotation


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def field_values(config_class: type) -> dict[str, dataclasses.Field]:
    return {field.name: field for field in dataclasses.fields(config_class)}
