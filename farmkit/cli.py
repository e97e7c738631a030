"""What every farm-* command shares: option bundles, logging to stderr, the error handler and
quiet closed pipes. (The provenance a tool stamps on its records is farmkit.core.provenance's, the
-q switch and progress bars farmkit.core.console's.)

A tool module looks like:

    @click.command()
    @input_argument("prompts")
    @output_option
    @model_options
    @decoding_options(temperature=0.7)
    @seed_option
    @common_options
    def cli(prompts, output, template, device, temperature, ..., seed): ...

    main = entry_point(cli)

The CLI dialect: an option that several tools have is declared once, in SHARED below (name, type
and range, help; its default too, unless the default is the method's own, as --epochs), and every
tool builds it from there, by hand (`shared_option`, the bundles) or from a method config
(`config_options`). Renamed options keep their old name for one release as a hidden alias that
warns on stderr. tests/test_cli.py checks every tool against SHARED.

Numbers: every numeric option is a FiniteFloat or a WholeNumber (farmkit.core.values' one check:
finite, whole for a count, in its range), declared with it in SHARED, in a config field's metadata
or in the tool; a --config file's values are converted by the same types.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from farmkit import __version__
from farmkit.annotate.pools import FLIP_RATE, load_pool
from farmkit.core import console
from farmkit.core import fields as config_fields
from farmkit.core.allocator import keep_freed_memory
from farmkit.core.io import (
    ON_ERROR,
    FarmError,
    MissingInput,
    set_on_error,
    set_records_stdout,
    set_split,
)
from farmkit.core.values import Bounds, Number, check_number
from farmkit.lm.models import TEMPLATES
from farmkit.train import config as method_config
from farmkit.train.config import REPORT_TO, ROLLOUT_BACKENDS, SHARED_HELP, SHARED_NUMBERS
from farmkit.train.precision import PRECISIONS

log = logging.getLogger("farmkit")


def input_argument(name: str = "input", nargs: int = 1) -> Callable:
    """A file argument that defaults to `-` (stdin); .gz and JSON arrays are read transparently, and
    a Hugging Face dataset (a name, a dataset folder, NAME:SPLIT) is read too (farmkit.core.io)."""
    if nargs == 1:
        return click.argument(name, default="-", type=click.Path(allow_dash=True))
    return click.argument(name, nargs=nargs, type=click.Path(allow_dash=True))


def _output_file(help_text: str) -> Callable:
    return click.option(
        "-o",
        "--output",
        default="-",
        type=click.Path(allow_dash=True, dir_okay=False),
        help=help_text,
    )


output_option = _output_file(
    "Write records to this file (atomically: whole or not at all; .gz compresses). Default: stdout."
)

board_output_option = _output_file("Write to this file (atomically). Default: stdout.")
"""-o of the tools that write a board (farmkit.evaluate.boards): records or text."""

figure_output_option = click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The PNG to write (atomically).",
)
"""-o of the commands that draw a figure (farm-plot's)."""


def _on_error(ctx: click.Context, param: click.Parameter, value: str) -> None:
    set_on_error(value)
    ctx.call_on_close(lambda: set_on_error("fail"))  # the next command in this process starts over


on_error_option = click.option(
    "--on-error",
    type=click.Choice(ON_ERROR),
    default="fail",
    show_default=True,
    expose_value=False,
    callback=_on_error,
    help="A bad input record (not JSON, not the format or schema expected): fail stops at the "
    "first, naming FILE:LINE; skip leaves each out, names the first few on stderr (FILE:LINE: "
    "reason) and counts them per file (a file with no good record still fails).",
)


def _split(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    set_split(value)
    ctx.call_on_close(lambda: set_split(None))


split_option = click.option(
    "--split",
    metavar="SPLIT",
    expose_value=False,
    callback=_split,
    help="The split of each Hugging Face dataset input that names none (NAME:SPLIT names one). "
    "Default: train, or the dataset's only split.",
)

reference_option = click.option(
    "--reference",
    type=click.Path(allow_dash=False),
    help="The reference's outputs (a file or a Hugging Face dataset): each output record is paired "
    "with the reference's output for the same instruction, the reference in position 1, for "
    "evaluation.",
)

long_prompts_option = click.option(
    "--long-prompts",
    type=click.Choice(["fail", "skip", "truncate"]),
    default="fail",
    show_default=True,
    help="A prompt longer than the model's context holds beside --max-new-tokens, decided per "
    "record before the model loads: fail stops naming its FILE:LINE; skip leaves it out (counted "
    "on stderr); truncate keeps its end (the last tokens, where the instruction meets the answer).",
)

# ---------------------------------------------------------------------------------------------
# The shared options: one name, type and help per concept (the help texts live beside the method
# configs, in farmkit.train.config.SHARED_HELP, since the configs' fields carry them too).


@dataclasses.dataclass(frozen=True)
class Shared:
    """An option several tools share. `own_default`: each tool (method) sets its own default."""

    flags: tuple[str, ...]
    type: Any
    default: Any = None
    own_default: bool = False
    aliases: tuple[str, ...] = ()  # old names, in every tool that has the option
    # tools may follow the shared help with a sentence of their own (what they do with the value)
    own_help: bool = False
    other_types: tuple[Any, ...] = ()  # the one other type a tool may take (a sweep of values)
    metavar: str | None = None
    flag: bool = False  # a bare flag (--no-cache), not --x/--no-x
    multiple: bool = False  # repeatable: the value is a tuple


class _Checked:
    """What FiniteFloat and WholeNumber share: farmkit.core.values' check, with click's range
    text in --help ("x>0") and none for an unbounded number."""

    kind: type

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.min, self.max, self.min_open, self.max_open)  # type: ignore[attr-defined]

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            return check_number(value, self.kind, self.bounds)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)  # type: ignore[attr-defined]

    def _describe_range(self) -> str:
        if self.min is None and self.max is None:  # type: ignore[attr-defined]
            return ""
        return super()._describe_range()  # type: ignore[misc]


class FiniteFloat(_Checked, click.FloatRange):
    """A float option: finite (nan and inf are refused), inside its range."""

    name = "float"
    kind = float


class WholeNumber(_Checked, click.IntRange):
    """An int option: a whole number (1.5 is refused, not cut to 1), inside its range."""

    name = "integer"
    kind = int


def number_type(declared: Number) -> click.ParamType:
    """The click type of a numeric declaration (farmkit.core.values.Number)."""
    bounds = dataclasses.asdict(declared.bounds)
    return FiniteFloat(**bounds) if declared.kind is float else WholeNumber(**bounds)


def _shared_number(name: str) -> click.ParamType:
    return number_type(SHARED_NUMBERS[name])


class SampleCounts(click.ParamType):
    """A number of samples per prompt, or a sweep: `16` or `1,4,16,64` (a tuple of ints >= 1)."""

    name = "n[,n...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            counts = tuple(
                int(check_number(part, int)) for part in str(value).split(",") if part.strip()
            )
        except ValueError:
            self.fail(
                f"{value!r}: expected a number or a comma-separated list such as 1,4,16,64",
                param,
                ctx,
            )
        if not counts or min(counts) < 1:
            self.fail(f"{value!r}: every n must be at least 1", param, ctx)
        return counts

    def to_info_dict(self) -> dict[str, Any]:
        return {**super().to_info_dict(), "sweep": True}


SAMPLE_COUNTS = SampleCounts()


class DeviceName(click.ParamType):
    """auto, cpu, mps, or an accelerator with an optional index (cuda, cuda:1, xpu:0...): a name
    torch would refuse is a usage error before any model loads (is it there: models.choose_device)."""

    name = "device"
    KINDS = ("cuda", "xpu", "npu", "hpu", "mps")

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip()
        kind, _, index = text.partition(":")
        if text in ("auto", "cpu") or (kind in self.KINDS and (not index or index.isdigit())):
            return text
        self.fail(f"{value!r}: expected auto, cpu, cuda, cuda:N (a GPU's index) or mps", param, ctx)


DEVICE = DeviceName()

GOLD_EXPECTED = (
    "expected a reward model folder, a learned judge folder (farm-judge-train), a shipped "
    "annotator pool's name (farm-annotate --list-pools) or a pool YAML file"
)


class GoldJudge(click.ParamType):
    """--gold POOL_OR_RM: a folder (a reward model or a learned judge, read when the run starts),
    else an annotator pool, read here: a pool file that is missing or malformed, or a name that is
    no shipped pool, is a usage error naming it, before any model loads."""

    name = "text"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if Path(text).is_dir():
            return text
        try:
            load_pool(text)
        except MissingInput:
            self.fail(f"{text}: no such file, folder or shipped pool; {GOLD_EXPECTED}", param, ctx)
        except FarmError as exc:
            self.fail(f"{exc}; {GOLD_EXPECTED}", param, ctx)
        return text


GOLD = GoldJudge()


SHARED: dict[str, Shared] = {
    # model
    "template": Shared(("--template",), click.Choice(TEMPLATES), "auto"),
    "device": Shared(("--device",), DEVICE, "auto"),
    "precision": Shared(("--precision",), click.Choice(PRECISIONS), "auto"),
    "seed": Shared(("--seed",), _shared_number("seed"), 0),
    # sampling: farm-sample writes them all, farm-bon and farm-expiter keep the best
    "num_samples": Shared(
        ("-n", "--num-samples"),
        _shared_number("num_samples"),
        own_default=True,
        own_help=True,
        other_types=(SAMPLE_COUNTS,),
        aliases=("--samples-per-prompt",),
    ),
    # decoding
    "temperature": Shared(("--temperature",), _shared_number("temperature"), 1.0, own_default=True),
    "top_p": Shared(("--top-p",), _shared_number("top_p"), 1.0),
    "max_new_tokens": Shared(
        ("--max-new-tokens",),
        _shared_number("max_new_tokens"),
        300,
        aliases=("--max-response-tokens",),
    ),
    "generation_batch_size": Shared(
        ("--generation-batch-size",),
        _shared_number("generation_batch_size"),
        16,
        own_default=True,
    ),
    "reward_batch_size": Shared(("--reward-batch-size",), _shared_number("reward_batch_size"), 16),
    # training
    "epochs": Shared(("--epochs",), _shared_number("epochs"), own_default=True),
    "max_steps": Shared(("--max-steps",), _shared_number("max_steps"), -1),
    "learning_rate": Shared(
        ("--learning-rate",), _shared_number("learning_rate"), own_default=True
    ),
    "gradient_accumulation_steps": Shared(
        ("--gradient-accumulation-steps",), _shared_number("gradient_accumulation_steps"), 1
    ),
    "warmup_ratio": Shared(("--warmup-ratio",), _shared_number("warmup_ratio"), own_default=True),
    "weight_decay": Shared(("--weight-decay",), _shared_number("weight_decay"), 0.0),
    # transformers' names (TrainingArguments.lr_scheduler_type, save_steps); a method may restrict
    # the scheduler to the ones it implements (a click.Choice)
    "lr_scheduler_type": Shared(
        ("--lr-scheduler-type",),
        click.STRING,
        own_default=True,
        own_help=True,
        aliases=("--lr-scheduler", "--lr-schedule"),
    ),
    "save_steps": Shared(
        ("--save-steps",),
        _shared_number("save_steps"),
        own_default=True,
        own_help=True,
        aliases=("--checkpoint-every",),
    ),
    "resume": Shared(("--resume/--no-resume",), click.BOOL, False, own_help=True),
    "lora": Shared(("--lora/--no-lora",), click.BOOL, False),
    "lora_rank": Shared(("--lora-rank",), _shared_number("lora_rank"), 16, aliases=("--lora-r",)),
    "lora_alpha": Shared(("--lora-alpha",), _shared_number("lora_alpha"), 32),
    "report_to": Shared(("--report-to",), click.Choice(REPORT_TO), "none"),
    "rollout_backend": Shared(("--rollout-backend",), click.Choice(ROLLOUT_BACKENDS), "auto"),
    # the gold judge of every policy method (farmkit.train.gold)
    "gold": Shared(("--gold",), GOLD, metavar="POOL_OR_RM"),
    "gold_prompts": Shared(("--gold-prompts",), click.Path(exists=True, dir_okay=False)),
    "gold_size": Shared(("--gold-size",), _shared_number("gold_size"), 32),
    # the annotator of farm-annotate and of farm-online-dpo's rounds (judge_options)
    "flip_rate": Shared(("--flip-rate",), number_type(FLIP_RATE)),  # a pool file's range
    "both_orders": Shared(("--both-orders",), click.BOOL, False, own_help=True, flag=True),
    "judge_models": Shared(("--model",), click.STRING, (), metavar="[TIER=]NAME", multiple=True),
    "cache": Shared(("--cache",), click.Path(dir_okay=False)),
    "no_cache": Shared(("--no-cache",), click.BOOL, False, flag=True),
    "max_cost": Shared(("--max-cost",), _shared_number("max_cost"), metavar="USD", own_help=True),
    "prices": Shared(("--prices",), click.Path(exists=True, dir_okay=False)),
    # the human labels of farm-audit, farm-winrate and farm-correlate
    "include_screened": Shared(("--include-screened",), click.BOOL, False, flag=True),
}


class AliasedOption(click.Option):
    """An option that also answers to old names, for one release: they are left out of --help,
    and using one prints a warning on stderr that names the new option."""

    def __init__(self, *args: Any, aliases: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = tuple(aliases)

    def _alias_dest(self, alias: str) -> str:
        return f"{self.name}\0{alias}"

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        for alias in self.aliases:
            parser.add_option(
                obj=self,
                opts=[alias],
                dest=self._alias_dest(alias),
                action="store",
                nargs=self.nargs,
            )

    def consume_value(self, ctx: click.Context, opts: Any) -> Any:
        for alias in self.aliases:
            dest = self._alias_dest(alias)
            if dest in opts:
                deprecated(ctx, alias, self.opts[-1])
                if self.name not in opts:  # the new name wins when both are given
                    opts = {**opts, self.name: opts[dest]}
        return super().consume_value(ctx, opts)


class BatchCommand(click.Command):
    """A command with --batch (farm-annotate, farm-eval). --batch is a flag and --batch-mode its
    mode, so a bare --batch before an input file leaves the file alone; `--batch submit` and
    `--batch wait` (and `--batch=MODE`), the spelling from when --batch took its mode as a value,
    are still read as `--batch --batch-mode MODE`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, batch_spelling(args))


def batch_spelling(args: list[str]) -> list[str]:
    """`args` with the old spellings of a batch mode (`--batch submit`, `--batch=wait`) written as
    `--batch --batch-mode MODE` (nothing after `--` is touched)."""
    from farmkit.annotate.batch import BATCH_MODES

    spelled: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            spelled += [arg, *rest]
            break
        mode = arg.partition("=")[2] if arg.startswith("--batch=") else None
        if arg == "--batch" and rest and rest[0] in BATCH_MODES:
            mode = rest.pop(0)
        spelled += ["--batch", "--batch-mode", mode] if mode is not None else [arg]
    return spelled


def deprecated(ctx: click.Context | None, old: str, new: str) -> None:
    name = ctx.command_path if ctx is not None else "farmkit"
    click.echo(
        f"{name}: warning: {old} is deprecated and will be removed in the next release; use {new}",
        err=True,
    )


def shared_option(
    name: str,
    default: Any = None,
    aliases: tuple[str, ...] = (),
    dest: str | None = None,
    more_help: str = "",
    param_type: Any = None,
) -> Callable:
    """The click option of a shared concept, as SHARED declares it. `default`: the tool's own, for
    the options whose default is the method's (and only those); `aliases`: the tool's old names
    besides the ones SHARED lists; `more_help`: what the tool does with the value, after the shared
    help (where SHARED allows it); `param_type`: one of the other types SHARED allows."""
    spec = SHARED[name]
    if more_help and not spec.own_help:
        raise ValueError(f"--{name.replace('_', '-')} has one help text in every tool")
    narrowed = spec.type is click.STRING and isinstance(param_type, click.Choice)
    if param_type is not None and param_type not in spec.other_types and not narrowed:
        raise ValueError(f"--{name.replace('_', '-')} has one type in every tool")
    if default is not None and not spec.own_default:
        raise ValueError(f"--{name.replace('_', '-')} has one default in every tool")
    if default is None:
        default = spec.default
    if spec.own_default and default is None:
        raise ValueError(f"--{name.replace('_', '-')}: give the tool's default")
    decls = [*spec.flags, dest or name]
    help_text = f"{SHARED_HELP[name]} {more_help}" if more_help else SHARED_HELP[name]
    kwargs: dict[str, Any] = {"default": default, "show_default": True, "help": help_text}
    if spec.type is not click.BOOL:
        kwargs["type"] = param_type or spec.type
    if spec.metavar:
        kwargs["metavar"] = spec.metavar
    if spec.flag:
        kwargs["is_flag"] = True
    if spec.multiple:
        kwargs["multiple"] = True
    return click.option(*decls, cls=AliasedOption, aliases=spec.aliases + tuple(aliases), **kwargs)


def judge_options(max_cost_help: str, both_orders_help: str) -> Callable[[Callable], Callable]:
    """The options of a tool that asks farm-annotate's pools: --flip-rate, --both-orders, --model,
    --cache, --no-cache, --max-cost and --prices (parameters flip_rate, both_orders, models,
    cache_path, no_cache, max_cost, prices), with the tool's sentence on what --max-cost covers
    and what a tie becomes."""

    def decorate(function: Callable) -> Callable:
        for option in reversed(
            [
                shared_option("flip_rate"),
                shared_option("both_orders", more_help=both_orders_help),
                shared_option("judge_models", dest="models"),
                shared_option("cache", dest="cache_path"),
                shared_option("no_cache"),
                shared_option("max_cost", more_help=max_cost_help),
                shared_option("prices"),
            ]
        ):
            function = option(function)
        return function

    return decorate


def verdict_cache(cache_path: str | None, no_cache: bool) -> str | None:
    """The cache a run uses from --cache and --no-cache: None (none), a path, or "default"."""
    if cache_path and no_cache:
        raise click.UsageError("--cache and --no-cache exclude each other")
    return None if no_cache else (cache_path or "default")


JUDGE_PARAMETERS = (
    "flip_rate",
    "both_orders",
    "models",
    "cache_path",
    "no_cache",
    "max_cost",
    "prices",
)
"""The parameters judge_options gives a command."""


def pool_labeller(
    pool: str,
    *,
    flip_rate: float | None,
    both_orders: bool,
    models: tuple[str, ...],
    cache_path: str | None,
    no_cache: bool,
    max_cost: float | None,
    prices: str | None,
    device: str,
) -> Any:
    """The pool --pool names, run with judge_options' values, as the trainers that ask it take it
    (farmkit.annotate.run.PoolLabeller)."""
    from farmkit.annotate.pools import load_pool
    from farmkit.annotate.run import PoolLabeller

    judges = load_pool(pool).with_models(list(models))
    if flip_rate is not None:
        judges.flip_rate = flip_rate
    return PoolLabeller(
        judges,
        both_orders=both_orders,
        cache=verdict_cache(cache_path, no_cache),
        prices=prices,
        device=device,
        max_cost=max_cost,
    )


seed_option = shared_option("seed")
"""--seed, default 0."""


def model_options(function: Callable) -> Callable:
    """--template and --device, for the tools that load a model by hand."""
    return shared_option("template")(shared_option("device")(function))


def decoding_options(
    temperature: float = 1.0,
    generation_batch_size: int = 16,
    batch_aliases: tuple[str, ...] = (),
    batch_dest: str | None = None,
) -> Callable[[Callable], Callable]:
    """--temperature, --top-p, --max-new-tokens and --generation-batch-size (with the tool's own
    defaults for the temperature and the batch; `batch_aliases`: the tool's old names of the batch
    option; `batch_dest`: the name of its parameter, when not generation_batch_size)."""

    def decorate(function: Callable) -> Callable:
        for option in reversed(
            [
                shared_option("temperature", temperature),
                shared_option("top_p"),
                shared_option("max_new_tokens"),
                shared_option(
                    "generation_batch_size", generation_batch_size, batch_aliases, batch_dest
                ),
            ]
        ):
            function = option(function)
        return function

    return decorate


def model_dir_option(dest: str = "output") -> Callable[[Callable], Callable]:
    """-o/--output and --force of the tools that write a model folder (the trainers), and the one
    rule of what -o may name (farmkit.lm.modelio.output_folder_problem), checked before any work:
    a path it refuses is a usage error naming the folder and what is in it."""

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def checked(*args: Any, force: bool = False, **kwargs: Any) -> Any:
            from farmkit.lm.modelio import output_folder_problem

            problem = output_folder_problem(kwargs[dest], force)
            if problem:
                raise click.BadParameter(problem, param_hint="'-o' / '--output'")
            return function(*args, **kwargs)

        output = click.option(
            "-o",
            "--output",
            dest,
            cls=AliasedOption,
            aliases=("--output-dir",),
            required=True,
            type=click.Path(file_okay=False),
            help=MODEL_DIR_HELP,
        )
        force = click.option("--force", is_flag=True, help=FORCE_HELP)
        return output(force(checked))

    return decorate


MODEL_DIR_HELP = (
    "Model folder to write (weights, tokenizer, meta.json), whole or not at all (a temporary "
    "folder renamed at the end). It may exist only empty or as a model folder of farmkit's (its "
    "meta.json), which it replaces; anything else is refused before any work (see --force). A "
    "symlink is followed."
)
FORCE_HELP = (
    "Replace -o DIR even when it is a folder that holds no farmkit model (its files are lost)."
)
output_dir_option = model_dir_option("output")


# ---------------------------------------------------------------------------------------------
# Method configs (farmkit.train.config) as options: defaults < --config FILE.yaml < flags.


def _config_option(field: dataclasses.Field, default: Any = dataclasses.MISSING) -> Callable:
    """The option of a config field; `default`: the tool's own, instead of the field's."""
    if default is dataclasses.MISSING:
        default = field.default if field.default is not dataclasses.MISSING else None
    name = config_fields.concept(field)
    if name in SHARED:
        spec = SHARED[name]
        if not spec.own_default and default != spec.default:
            raise ValueError(
                f"{field.name}: a shared option keeps its one default ({spec.default})"
            )
        choices = field.metadata.get("choices")
        return shared_option(
            name,
            default if spec.own_default else None,
            dest=field.name,
            more_help=field.metadata.get("more_help", ""),
            param_type=click.Choice(choices) if choices and spec.type is click.STRING else None,
        )
    meta = field.metadata
    flags = meta.get("flags", (config_fields.option_name(field.name),))
    kwargs: dict[str, Any] = {
        "default": default,
        "show_default": meta.get("show_default", True),
        "help": meta.get("help", ""),
    }
    for key in ("metavar", "multiple", "nargs", "required"):
        if key in meta:
            kwargs[key] = meta[key]
    if "flag_value" in meta:  # the option's value may be left out: `--batch` is `--batch wait`
        kwargs["flag_value"], kwargs["is_flag"] = meta["flag_value"], False
    if meta.get("flag"):
        kwargs["is_flag"] = True
    elif config_fields.scalar_type(field.type) is bool:
        flags = (f"{flags[-1]}/--no-{flags[-1][2:]}",)
    else:
        kwargs["type"] = field_type(field)
    if "parse" in meta:
        kwargs["callback"] = _parsed(meta["parse"])
    if "aliases" in meta:
        kwargs["cls"], kwargs["aliases"] = AliasedOption, meta["aliases"]
    return click.option(*flags, field.name, **kwargs)


def _parsed(parse: Callable[[Any], Any]) -> Callable:
    """A click callback of a field's `parse`: its ValueError is the option's usage error."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


def field_type(field: dataclasses.Field) -> click.ParamType:
    """The click type of a config field that is not a flag: its choices, a path, its number, or
    text."""
    choices = field.metadata.get("choices")
    if choices:
        return click.Choice(choices)
    if "path" in field.metadata:
        return click.Path(**field.metadata["path"])
    declared = config_fields.number(field)
    return number_type(declared) if declared is not None else click.STRING


def field_options(
    config_class: type, *names: str, defaults: dict[str, Any] | None = None
) -> Callable[[Callable], Callable]:
    """Decorate a click command with one option per field of `config_class` (or per field named
    in `names`, in that order: a tool may set its shared bundles between them), for a tool
    without --config; `tool_config` builds the config from the command's values. `defaults`: the
    tool's own, where it takes another tool's config (farm-expiter's SFT rounds)."""
    fields = config_fields.field_values(config_class)
    chosen = [fields[name] for name in names] if names else list(fields.values())
    defaults = defaults or {}

    def decorate(function: Callable) -> Callable:
        for field in reversed(chosen):
            function = _config_option(field, defaults.get(field.name, dataclasses.MISSING))(
                function
            )
        return function

    return decorate


def tool_config(config_class: type, values: dict[str, Any]) -> Any:
    """The config of a `field_options` tool from its command's values, taking its fields out of
    `values` (the rest are the tool's arguments and shared options). A combination the dataclass
    rejects (ValueError in __post_init__) is a usage error (exit 2)."""
    names = [field.name for field in dataclasses.fields(config_class) if field.name in values]
    try:
        return config_class(**{name: values.pop(name) for name in names})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def config_options(
    config_class: type, leave_out: tuple[str, ...] = ()
) -> Callable[[Callable], Callable]:
    """Decorate a click command with one option per config field plus `--config FILE.yaml`.

    The options that several tools share (SHARED) come from there, so they read the same in every
    tool. `resolve_config` tells a flag given on the command line from a default by its source.
    `leave_out`: fields the tool does not offer (they keep their defaults).
    """

    groups = [
        set(config_fields.field_values(method_config.RolloutConfig))
        if issubclass(config_class, method_config.RolloutConfig)
        else set(),
        set(config_fields.field_values(method_config.ModelArgs)),
        set(config_fields.field_values(method_config.TrackingArgs)),
        set(config_fields.field_values(method_config.GoldArgs)),
    ]

    def group(field: dataclasses.Field) -> int:
        return max(
            (number for number, names in enumerate(groups, 1) if field.name in names), default=0
        )

    # the method's own options first, then the rollout options it shares with the other methods,
    # then the model's (--template, --seed), the tracker and the gold judge
    fields = sorted(
        (field for field in dataclasses.fields(config_class) if field.name not in leave_out),
        key=group,
    )

    def decorate(function: Callable) -> Callable:
        for field in reversed(fields):
            function = _config_option(field)(function)
        return click.option(
            "--config",
            "config_file",
            type=click.Path(exists=True, dir_okay=False),
            help="YAML file of defaults for the options below (keys as option names, - or _); "
            "flags given here win.",
        )(function)

    return decorate


def load_yaml(path: str, config_class: type) -> dict[str, Any]:
    """A --config file's values by field name, converted as the options convert them."""
    try:
        raw, renamed = method_config.read_yaml(path, config_class)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from None
    context = click.get_current_context(silent=True)
    for key in renamed:
        new = method_config.RENAMED_FIELDS[key.replace("-", "_")].replace("_", "-")
        deprecated(context, f"{key} (in {path})", new)
    params = {param.name: param for param in context.command.params} if context else {}
    fields = config_fields.field_values(config_class)
    values = {}
    for name, value in raw.items():
        kind = config_fields.scalar_type(fields[name].type)
        if value is not None and kind is bool and not isinstance(value, bool):
            raise click.BadParameter(
                f"{path}: {name} must be true or false, not {value!r}", param_hint="--config"
            )
        if isinstance(value, list | dict):  # every option takes one value; YAML may give many
            raise click.BadParameter(
                f"{path}: {name}: expected one value, not {value!r}", param_hint="--config"
            )
        if value is not None and kind is not bool:
            param = params.get(name)
            param_type = param.type if param is not None else field_type(fields[name])
            try:
                value = param_type.convert(value, None, None)
            except click.BadParameter as exc:
                raise click.BadParameter(
                    f"{path}: {name}: {exc.message}", param_hint="--config"
                ) from None
        values[name] = value
    return values


_GIVEN = (
    click.core.ParameterSource.COMMANDLINE,
    click.core.ParameterSource.ENVIRONMENT,
    click.core.ParameterSource.PROMPT,
)


def resolve_config(config_class: type, config_file: str | None, flags: dict[str, Any]) -> Any:
    """Build the config: dataclass defaults, then the YAML file, then the flags that were given.

    A combination that the dataclass rejects (ValueError in __post_init__) is a usage error (exit 2).
    """
    values = load_yaml(config_file, config_class) if config_file else {}
    names = set(config_fields.field_values(config_class))
    context = click.get_current_context(silent=True)

    def given(name: str, value: Any) -> bool:
        if context is None or context.get_parameter_source(name) is None:
            return value is not None
        return context.get_parameter_source(name) in _GIVEN

    values.update(
        {name: value for name, value in flags.items() if name in names and given(name, value)}
    )
    try:
        return method_config.build_config(config_class, values)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from None


def train_on_prompts(
    train: Callable[..., Any],
    config: Any,
    sft: str,
    reward_model: Any,
    prompts: str,
    output: str,
    summary: Callable[[Any], str | None],
) -> Any:
    """What farm-ppo, farm-rloo, farm-grpo and farm-quark do once their options are read into
    `config`: read PROMPTS (refusing none), check the device and RM (a folder; or the judge of
    --pool) before any work, train with `train` (its --gold pools looked up by farm-annotate's
    loader), log `summary` of the result. Returns what `train` returned."""
    from farmkit.annotate.run import gold_pool
    from farmkit.core.io import display_name, read_records
    from farmkit.lm.models import check_reward_model
    from farmkit.train.launch import check_device

    records = list(read_records(prompts, "instruction"))
    if not records:
        raise FarmError(f"{display_name(prompts)}: no prompts to train on")
    # a device that is not there is said first, as every trainer says it
    check_device(config.device)
    if isinstance(reward_model, str):
        check_reward_model(reward_model)  # before any work: any other model scores at random
    result = train(
        sft,
        reward_model,
        records,
        output,
        config,
        seed=config.seed,
        inputs=[prompts],
        gold_pools=gold_pool,
    )
    said = summary(result)
    if said:
        log.info(said)
    log.info("wrote %s", output)
    return result


def policy_command(
    name: str,
    config_class: type,
    train: str,
    help: str,
    summary: Callable[[Any], str | None] | None = None,
) -> click.Command:
    """The command of an on-policy trainer (farm-ppo, farm-rloo, farm-grpo, farm-quark): SFT RM
    PROMPTS -o DIR and `config_class`'s options (--preset, --config and the shared ones), then
    train_on_prompts with `train` ("module:function", imported when the command runs, so --help
    loads no torch) and `summary` of its result (default: last_step). A config with a `pool`
    field (the group methods) also takes SFT PROMPTS --pool POOL instead of RM, with
    judge_options: the pool's judge (pool_labeller) scores the run."""
    import importlib

    pooled = "pool" in config_fields.field_values(config_class)

    def command(
        sft: str,
        reward_model: str | None,
        prompts: str,
        output: str,
        config_file: str | None,
        **values: Any,
    ) -> None:
        judging = {name: values.pop(name) for name in JUDGE_PARAMETERS if name in values}
        module, _, function = train.partition(":")
        trainer = getattr(importlib.import_module(module), function)
        config = resolve_config(config_class, config_file, values)
        scorer: Any = reward_model
        if pooled:
            prompts, scorer = _reward_or_pool(config, reward_model, prompts, judging)
        train_on_prompts(trainer, config, sft, scorer, prompts, output, summary or last_step)

    decorators = [
        click.command(name=name, help=help),
        click.argument("sft"),
        # with --pool the second argument is PROMPTS (_reward_or_pool)
        click.argument("reward_model", metavar="(RM | --pool POOL)", required=not pooled),
        input_argument("prompts"),
        output_dir_option,
        config_options(config_class),
        *(
            [
                judge_options(
                    max_cost_help="With --pool: it covers the whole run, reruns and --resume "
                    "included; the run stops before a step whose comparisons it does not pay for.",
                    both_orders_help="With --pool: a tie is half a win for each response.",
                )
            ]
            if pooled
            else []
        ),
        common_options,
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def _reward_or_pool(
    config: Any, reward_model: str | None, prompts: str, judging: dict[str, Any]
) -> tuple[str, Any]:
    """(PROMPTS, what scores) of a group method's command line: RM PROMPTS, or PROMPTS with --pool
    (the second argument is then PROMPTS) and the pool's judge. The judge's options without --pool
    are a usage error, as RM and --pool together."""
    context = click.get_current_context()

    def given(name: str) -> bool:
        return context.get_parameter_source(name) in _GIVEN

    if config.pool is None:
        if reward_model is None:
            raise click.UsageError("missing RM: give a reward model folder, or --pool POOL")
        extra = [name for name in (*JUDGE_PARAMETERS, "opponents", "pool_reward") if given(name)]
        if extra:
            options = ", ".join(
                next(p.opts[0] for p in context.command.params if p.name == name) for name in extra
            )
            raise click.UsageError(f"{options}: only with --pool (RM scores this run)")
        return prompts, reward_model
    if given("prompts"):
        raise click.UsageError(
            f"RM ({reward_model}) and --pool {config.pool}: give one of them (SFT PROMPTS --pool POOL)"
        )
    return reward_model or "-", pool_labeller(config.pool, device=config.device, **judging)


def last_step(last: dict[str, Any]) -> str | None:
    """The summary line of a policy-gradient run (farm-ppo, farm-rloo, farm-grpo)."""
    if not last:
        return None
    asked = f", {last['labels_used']} labels, ${last['spent']:.4f}" if "spent" in last else ""
    return f"last step: reward {last['reward']:.4f}, kl {last['kl']:.4f}{asked}"


def common_options(function: Callable) -> Callable:
    """-q/--quiet and -v/--verbose; they set the farmkit logger (stderr) and the tqdm switch."""

    @click.option("-q", "--quiet", is_flag=True, help="Print nothing on stderr but errors.")
    @click.option(
        "-v", "--verbose", is_flag=True, help="More detail on stderr, and tracebacks on errors."
    )
    @functools.wraps(function)
    def wrapper(*args: Any, quiet: bool = False, verbose: bool = False, **kwargs: Any) -> Any:
        setup_logging(quiet=quiet, verbose=verbose)
        keep_freed_memory()  # torch on a CPU: no page faults for memory it just freed
        return function(*args, **kwargs)

    return wrapper


def setup_logging(quiet: bool = False, verbose: bool = False) -> None:
    # under a launcher only the main process (RANK 0) reports; the others print errors only
    quiet = quiet or int(os.environ.get("RANK", "0")) > 0
    console.set_verbosity(quiet, verbose)
    level = logging.ERROR if quiet else (logging.DEBUG if verbose else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Redacting("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    if quiet:
        # Python warnings from libraries (a transformers FutureWarning) are not the user's to act on
        warnings.simplefilter("ignore")
        # libraries that print progress on their own (transformers, datasets) follow -q too
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("DISABLE_TQDM", "1")
        # transformers 5 draws its "Loading weights" bars through huggingface_hub's switch
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # Those variables are read when the libraries are imported; where one is imported already
        # (a tool run from Python, after `import transformers`), its own switch does the same.
        if "huggingface_hub" in sys.modules:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        if "transformers" in sys.modules:
            from transformers.utils import logging as transformers_logging

            transformers_logging.set_verbosity_error()
            transformers_logging.disable_progress_bar()
        if "datasets" in sys.modules:
            import datasets

            datasets.disable_progress_bars()


def _redacted(text: str) -> str:
    """`text` without the secrets of OPENAI_API_KEY and OPENAI_BASE_URL (the key, the URL's password
    and query secrets) in any form, nor any 8-character piece of them: the last line of defence for
    what reaches stderr (the endpoint clients redact what endpoints say at the source)."""
    if not (os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL")):
        return text
    from farmkit.core.endpoint import redact

    return redact(text, shapes=False)


class _Redacting(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _redacted(super().format(record))


def entry_point(command: click.Command) -> Callable[[], None]:
    """Wrap a click command as a console script with the shared error contract.

    Every command also takes -h (as --help) and --version.
    Exit 0 success, 1 data/runtime error (FarmError, OSError: one line, no traceback unless -v),
    2 usage error (click, or a FarmError that is one: an input path that does not exist),
    130 interrupted. A closed stdout (`| head`) ends quietly.
    """

    command.context_settings.setdefault("help_option_names", ["-h", "--help"])
    version = click.version_option(
        __version__, "--version", prog_name=command.name, message="%(prog)s %(version)s"
    )
    version(command)
    group = isinstance(command, click.Group)
    if group:
        # A subcommand's options (its --help, --version) are parsed inside the group's invoke: only
        # its callback runs with stdout reserved for records, so its help goes to stdout as the
        # group's does.
        for sub in command.commands.values():
            version(sub)
            if sub.callback is not None:
                sub.callback = _records_only_stdout_callback(sub.callback)

    def main(argv: list[str] | None = None) -> None:
        code = 0
        try:
            # make_context/invoke rather than command.main: click's main turns a closed pipe (EPIPE)
            # into sys.exit(1) before the BrokenPipeError below can end the command quietly
            with command.make_context(
                command.name, sys.argv[1:] if argv is None else list(argv)
            ) as context:
                with contextlib.nullcontext() if group else records_only_stdout():
                    command.invoke(context)
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.ClickException as exc:
            shown = io.StringIO()
            exc.show(file=shown)
            sys.stderr.write(_redacted(shown.getvalue()))
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
            if console.verbose():
                import traceback

                sys.stderr.write(_redacted(traceback.format_exc()))
            if isinstance(exc, FarmError):
                message = str(exc)
            else:
                message = f"{type(exc).__name__}: {exc} (run with -v for the traceback)"
            click.echo(f"{command.name}: error: {_redacted(message)}", err=True)
            code = exc.exit_code if isinstance(exc, FarmError) else 1
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            code = _closed_pipe()
        sys.exit(code)

    return main


def _records_only_stdout_callback(callback: Callable) -> Callable:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        with records_only_stdout():
            return callback(*args, **kwargs)

    return run


@contextlib.contextmanager
def records_only_stdout() -> Iterator[None]:
    """Run a command with stdout reserved for its records.

    Libraries print on stdout (DeepSpeed's accelerator notice, a logging handler bound to sys.stdout
    when it was imported, C code writing to fd 1), and one such line ahead of the records breaks the
    next tool in a pipe. For the command's duration, file descriptor 1 and sys.stdout point at stderr,
    and records go through farmkit.core.io.records_stdout() to a duplicate of the real stdout.
    """
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        fd = None  # not a real file (a test runner's capture): reroute Python-level output only
    original = sys.stdout
    saved = None
    if fd is not None:
        saved = os.dup(fd)
        records = os.fdopen(os.dup(saved), "wb")
        os.dup2(sys.stderr.fileno(), fd)
    else:
        records = sys.stdout.buffer
    set_records_stdout(records)
    sys.stdout = sys.stderr
    try:
        yield
        records.flush()
    finally:
        sys.stdout = original
        set_records_stdout(None)
        if saved is not None:
            os.dup2(saved, fd)
            os.close(saved)
            try:
                records.close()
            except BrokenPipeError:
                pass  # reported by the flush above or by the command itself


def _closed_pipe() -> int:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot complain.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
