"""Method configurations as dataclasses whose fields carry their help text, turned into click options
and read from `--config x.yaml`: defaults < YAML file < flags given on the command line.

    @config_options(PPOConfig)
    def cli(..., config_file, **values):
        config = resolve_config(PPOConfig, config_file, values)

No torch here: tools import this at module level and `--help` must stay fast.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

SCALARS = {int: click.INT, float: click.FLOAT, str: click.STRING}


def help_field(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with its help text (and the allowed values, for a choice)."""
    metadata: dict[str, Any] = {"help": help}
    if choices:
        metadata["choices"] = choices
    return dataclasses.field(default=default, metadata=metadata)


def _scalar_type(annotation: Any) -> type:
    """The one scalar type behind `int`, `float | None`, `str`, ... (None is never a flag value)."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"typing": typing})  # noqa: S307 - our own annotations only
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return annotation


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def config_options(config_class: type) -> Callable[[Callable], Callable]:
    """Decorate a click command with one option per config field plus `--config FILE.yaml`.

    Every option defaults to None so that `resolve_config` can tell a flag given on the command line
    from a default; the help shows the dataclass default.
    """

    def decorate(function: Callable) -> Callable:
        for field in reversed(dataclasses.fields(config_class)):
            kind = _scalar_type(field.type)
            help_text = field.metadata.get("help", "")
            shown = field.default if field.default is not dataclasses.MISSING else None
            if kind is bool:
                name = field.name.replace("_", "-")
                function = click.option(
                    f"--{name}/--no-{name}", field.name, default=None, help=f"{help_text} [default: {'on' if shown else 'off'}]"
                )(function)
                continue
            choices = field.metadata.get("choices")
            param_type = click.Choice(choices) if choices else SCALARS[kind]
            suffix = "" if shown is None else f" [default: {shown}]"
            function = click.option(option_name(field.name), field.name, type=param_type, default=None, help=help_text + suffix)(function)
        return click.option(
            "--config",
            "config_file",
            type=click.Path(exists=True, dir_okay=False),
            help="YAML file of defaults for the options below (keys as option names, - or _); flags given here win.",
        )(function)

    return decorate


def load_yaml(path: str | Path, config_class: type) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{path}: not valid YAML ({exc})", param_hint="--config") from None
    if not isinstance(loaded, dict):
        raise click.BadParameter(f"{path}: expected a mapping of option names to values", param_hint="--config")
    fields = {field.name: field for field in dataclasses.fields(config_class)}
    values = {}
    for key, value in loaded.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise click.BadParameter(f"{path}: unknown option {key!r}; known: {', '.join(sorted(fields))}", param_hint="--config")
        kind = _scalar_type(fields[name].type)
        if value is not None and kind is bool and not isinstance(value, bool):
            raise click.BadParameter(f"{path}: {key} must be true or false, not {value!r}", param_hint="--config")
        if value is not None and kind is not bool:
            choices = fields[name].metadata.get("choices")
            value = (click.Choice(choices) if choices else SCALARS[kind]).convert(value, None, None)
        values[name] = value
    return values


def resolve_config(config_class: type, config_file: str | None, flags: dict[str, Any]) -> Any:
    """Build the config: dataclass defaults, then the YAML file, then the flags that were given.

    A combination that the dataclass rejects (ValueError in __post_init__) is a usage error (exit 2).
    """
    values = load_yaml(config_file, config_class) if config_file else {}
    names = {field.name for field in dataclasses.fields(config_class)}
    values.update({name: value for name, value in flags.items() if name in names and value is not None})
    try:
        return config_class(**values)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from None


def config_dict(config: Any) -> dict[str, Any]:
    """The resolved configuration, as meta.json and provenance record it."""
    return dataclasses.asdict(config)


output_dir_option = click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder of the trained model (HF weights, tokenizer, meta.json), written whole at the end.",
)
