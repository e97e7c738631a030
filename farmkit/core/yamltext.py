"""YAML as farmkit reads it (pools, judges, price tables, --config files): safe types and no
aliases. An alias (`*name`) repeats a subtree without copying it, so a few nested ones make a
kilobyte file stand for gigabytes once anything walks it (a "billion laughs"); no file farmkit
reads needs one, so they are refused outright, with the line that holds the first."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError


class _NoAliases(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(
                None,
                None,
                f"found an alias (*{event.anchor}): farmkit reads YAML without aliases (they can "
                "expand a small file without bound); write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def safe_yaml(text: str) -> Any:
    """The value of a YAML document, like yaml.safe_load, but an alias raises yaml.YAMLError
    (whose text names the line and column)."""
    return yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader
