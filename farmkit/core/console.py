"""What a run says on stderr besides its log lines: the -q and -v switches (set once by the command
line, farmkit.cli's common_options) and a tqdm progress bar that -q silences. Here, below the
pillars, so that the library's long loops (sampling, scoring, annotating, training) obey -q without
importing the command line."""

from __future__ import annotations

import sys
from typing import Any


class _Switches:
    quiet = False
    verbose = False


def set_verbosity(quiet: bool, verbose: bool) -> None:
    _Switches.quiet, _Switches.verbose = quiet, verbose


def quiet() -> bool:
    return _Switches.quiet


def verbose() -> bool:
    return _Switches.verbose


def progress(iterable: Any = None, **kwargs: Any) -> Any:
    """A tqdm progress bar on stderr, silenced by -q."""
    from tqdm import tqdm

    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", False)
    return tqdm(iterable, disable=_Switches.quiet, **kwargs)
