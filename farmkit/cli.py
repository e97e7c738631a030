"""What every farm-* command shares: option bundles, logging to stderr, the error handler,
quiet closed pipes, and the provenance stamped on the records a tool adds.

A tool module looks like:

    @click.command()
    @input_argument("prompts")
    @output_option
    @seed_option
    @common_options
    def cli(prompts, output, seed, **_): ...

    main = entry_point(cli)
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import orjson

from farmkit import __version__
from farmkit.io import FarmError

log = logging.getLogger("farmkit")


def input_argument(name: str = "input", nargs: int = 1) -> Callable:
    """A file argument that defaults to `-` (stdin); .gz and JSON arrays are read transparently."""
    if nargs == 1:
        return click.argument(name, default="-", type=click.Path(allow_dash=True, dir_okay=False))
    return click.argument(name, nargs=nargs, type=click.Path(allow_dash=True, dir_okay=False))


output_option = click.option(
    "-o",
    "--output",
    default="-",
    type=click.Path(allow_dash=True, dir_okay=False),
    help="Write records to this file (atomically: whole or not at all; .gz compresses). Default: stdout.",
)

seed_option = click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed for every random choice: same input and seed, same output."
)


def common_options(function: Callable) -> Callable:
    """-q/--quiet and -v/--verbose; they set the farmkit logger (stderr) and the tqdm switch."""

    @click.option("-q", "--quiet", is_flag=True, help="Print nothing on stderr but errors.")
    @click.option("-v", "--verbose", is_flag=True, help="More detail on stderr, and tracebacks on errors.")
    @functools.wraps(function)
    def wrapper(*args: Any, quiet: bool = False, verbose: bool = False, **kwargs: Any) -> Any:
        setup_logging(quiet=quiet, verbose=verbose)
        return function(*args, **kwargs)

    return wrapper


class _State:
    quiet = False
    verbose = False


def setup_logging(quiet: bool = False, verbose: bool = False) -> None:
    _State.quiet, _State.verbose = quiet, verbose
    level = logging.ERROR if quiet else (logging.DEBUG if verbose else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    if quiet:
        # libraries that print progress on their own (transformers, datasets) follow -q too
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("DISABLE_TQDM", "1")
        # transformers 5 draws its "Loading weights" bars through huggingface_hub's switch
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet() -> bool:
    return _State.quiet


def progress(iterable: Any = None, **kwargs: Any) -> Any:
    """A tqdm progress bar on stderr, silenced by -q."""
    from tqdm import tqdm

    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", False)
    return tqdm(iterable, disable=_State.quiet, **kwargs)


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
    return hashlib.sha256(orjson.dumps(options, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


def entry_point(command: click.Command) -> Callable[[], None]:
    """Wrap a click command as a console script with the shared error contract.

    Exit 0 success, 1 data/runtime error (FarmError, OSError: one line, no traceback unless -v),
    2 usage error (click), 130 interrupted. A closed stdout (`| head`) ends quietly.
    """

    def main(argv: list[str] | None = None) -> None:
        code = 0
        try:
            # make_context/invoke rather than command.main: click's main turns a closed pipe (EPIPE)
            # into sys.exit(1) before the BrokenPipeError below can end the command quietly
            with command.make_context(command.name, sys.argv[1:] if argv is None else list(argv)) as context:
                command.invoke(context)
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            code = 130
        except BrokenPipeError:
            code = _closed_pipe()
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            code = 130
        except Exception as exc:  # noqa: BLE001 - the one place that turns failures into exit 1
            if _State.verbose:
                import traceback

                traceback.print_exc()
            if isinstance(exc, FarmError):
                message = str(exc)
            else:
                message = f"{type(exc).__name__}: {exc} (run with -v for the traceback)"
            click.echo(f"{command.name}: error: {message}", err=True)
            code = 1
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            code = _closed_pipe()
        sys.exit(code)

    return main


def _closed_pipe() -> int:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot complain.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
