"""One CLI dialect: an option several tools share has the same name, type, default and help in every
tool that has it (farmkit.cli.SHARED), old names keep working for one release as hidden aliases that
warn on stderr, and click stays out of the method configs."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys

import click
import pytest
import tomllib
from click.testing import CliRunner
from conftest import ROOT, run_tool

from farmkit import cli as farm_cli
from farmkit.methods.dpo import DPOConfig
from farmkit.methods.ppo import PPOConfig
from farmkit.methods.quark import QuarkConfig
from farmkit.methods.reward import RewardConfig
from farmkit.methods.sft import SFTConfig
from farmkit.train.config import SHARED_HELP

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
TRAINERS = (
    "farm-sft",
    "farm-rm-train",
    "farm-dpo",
    "farm-ppo",
    "farm-quark",
    "farm-expiter",
    "farm-rloo",
    "farm-grpo",
    "farm-online-dpo",
)
# every tool that makes or picks a policy: each has a --gold judge (farmkit.train.gold)
POLICY_METHODS = (
    "farm-ppo",
    "farm-quark",
    "farm-dpo",
    "farm-expiter",
    "farm-bon",
    "farm-rloo",
    "farm-grpo",
    "farm-online-dpo",
)
RECORD_WRITERS = ("farm-sample", "farm-score", "farm-bon", "farm-annotate", "farm-convert")
OLD_NAMES = ("--lora-r", "--max-response-tokens", "--output-dir", "--sample-batch-size")


def command(script: str) -> click.Command:
    module = importlib.import_module(SCRIPTS[script].split(":")[0])
    return module.cli


def commands() -> list[tuple[str, click.Command]]:
    """Every command and subcommand, by the name its user types."""
    found = []
    for script in SCRIPTS:
        top = command(script)
        if isinstance(top, click.Group):
            found += [(f"{script} {name}", sub) for name, sub in top.commands.items()]
        else:
            found.append((script, top))
    return found


def options(cmd: click.Command) -> list[click.Option]:
    return [param for param in cmd.params if isinstance(param, click.Option)]


def shared_name(option: click.Option) -> str | None:
    """The SHARED concept an option stands for: by its parameter name or by one of its flags."""
    if option.name in farm_cli.SHARED:
        return option.name
    flags = set(option.opts) | set(option.secondary_opts)
    for name, spec in farm_cli.SHARED.items():
        if flags & {flag for decl in spec.flags for flag in decl.split("/")}:
            return name
    return None


def declared_flags(name: str) -> list[str]:
    return [flag for decl in farm_cli.SHARED[name].flags for flag in decl.split("/")]


def value_kind(option: click.Option) -> str:
    """What an option takes, coarsely: a flag, a file, a number or text."""
    if option.is_flag:
        return "flag"
    if isinstance(option.type, click.Path | click.File):
        return "file"
    if isinstance(option.type, click.types._NumberParamTypeBase | farm_cli.SampleCounts):
        return "number"
    return "text"


def old_names() -> set[str]:
    """Every name an idea had before it got its one name: hidden aliases, never a visible flag."""
    return set(OLD_NAMES) | {alias for spec in farm_cli.SHARED.values() for alias in spec.aliases}


def dialect_problems(found: list[tuple[str, click.Command]]) -> list[str]:
    """What breaks the one CLI dialect among these commands: a shared option that reads otherwise
    than SHARED says (flags, help, type, default, aliases), a known idea under another name (an
    old or synonymous spelling shown as a flag of its own), and one flag taking two kinds of value
    in two tools (--labels FILE here, --labels N there)."""
    problems = []
    kinds: dict[str, dict[str, str]] = {}
    synonyms = old_names()
    for tool, cmd in found:
        for option in options(cmd):
            where = f"{tool} {option.opts}"
            for flag in option.opts + option.secondary_opts:
                kinds.setdefault(flag, {})[tool] = value_kind(option)
                if flag in synonyms:
                    problems.append(f"{where}: {flag} is an old name of a shared option")
            name = shared_name(option)
            if name is None:
                continue
            spec = farm_cli.SHARED[name]
            if option.opts + option.secondary_opts != declared_flags(name):
                problems.append(f"{where}: flags differ from {declared_flags(name)}")
            if spec.own_help:  # the shared sentence first, then the tool's own
                if not (option.help or "").startswith(SHARED_HELP[name]):
                    problems.append(f"{where}: help does not start with the shared help")
            elif option.help != SHARED_HELP[name]:
                problems.append(f"{where}: help differs from the shared help")
            if spec.type is not click.BOOL:
                types = [kind.to_info_dict() for kind in (spec.type, *spec.other_types)]
                # a method may narrow a free text to the values it implements
                narrowed = spec.type is click.STRING and isinstance(option.type, click.Choice)
                if option.type.to_info_dict() not in types and not narrowed:
                    problems.append(f"{where}: type {option.type.name} differs")
            elif not option.is_bool_flag:
                problems.append(f"{where}: not a boolean flag")
            if not spec.own_default and option.default != spec.default:
                problems.append(f"{where}: default {option.default!r} differs")
            if not option.show_default:
                problems.append(f"{where}: default not shown")
            if not isinstance(option, farm_cli.AliasedOption) or not set(spec.aliases) <= set(
                option.aliases
            ):
                problems.append(f"{where}: the old names {spec.aliases} are not accepted")
    for flag, by_tool in sorted(kinds.items()):
        if len(set(by_tool.values())) > 1:
            problems.append(f"{flag} takes different kinds of value: {by_tool}")
    return problems


def test_every_shared_option_reads_the_same_in_every_tool():
    assert dialect_problems(commands()) == []
    seen: dict[str, set[str]] = {}
    for tool, cmd in commands():
        for option in options(cmd):
            name = shared_name(option)
            if name is not None:
                seen.setdefault(name, set()).add(tool)
    # the check above saw the options where they are meant to be (a renamed one would slip by)
    group_methods = {"farm-rloo", "farm-grpo"}
    lora_added = {"farm-quark", "farm-expiter"}  # issue 22
    resume_added = {"farm-dpo", "farm-rm-train", "farm-quark"}
    expected = {
        "num_samples": {"farm-sample", "farm-bon", "farm-expiter", "farm-quark", *group_methods},
        "seed": {"farm-sample", "farm-bon", "farm-sft", "farm-dpo", "farm-ppo", "farm-quark"},
        "template": {"farm-sample", "farm-bon", "farm-expiter", "farm-sft", "farm-rm-train"},
        "device": {"farm-sample", "farm-bon", "farm-score", *TRAINERS},
        "max_new_tokens": {"farm-sample", "farm-bon", "farm-expiter", "farm-ppo", "farm-quark"},
        "generation_batch_size": {"farm-sample", "farm-bon", "farm-expiter", "farm-quark"},
        "reward_batch_size": {"farm-score", "farm-bon", "farm-expiter", "farm-ppo"},
        "lora_rank": {"farm-sft", "farm-rm-train", "farm-dpo", "farm-ppo", *lora_added},
        "lora_alpha": {"farm-sft", "farm-rm-train", "farm-dpo", "farm-ppo", *lora_added},
        "lora": {"farm-sft", "farm-rm-train", "farm-dpo", "farm-ppo", *lora_added},
        "epochs": {"farm-sft", "farm-rm-train", "farm-dpo", "farm-expiter"},
        "lr_scheduler_type": {"farm-sft", "farm-quark"},
        "save_steps": {"farm-sft", "farm-ppo", *group_methods, *resume_added},
        "resume": {"farm-sample", "farm-sft", "farm-ppo", *group_methods, *resume_added},
        "report_to": set(TRAINERS),
        "precision": set(TRAINERS),  # issue 48
        "gold": set(POLICY_METHODS),
        "gold_prompts": set(POLICY_METHODS),
        "gold_size": set(POLICY_METHODS),
        "include_screened": {"farm-audit", "farm-winrate", "farm-correlate"},
        **{
            name: {"farm-annotate", "farm-online-dpo"}
            for name in (
                "flip_rate",
                "both_orders",
                "judge_models",
                "cache",
                "no_cache",
                "max_cost",
                "prices",
            )
        },
    }
    for name, tools in expected.items():
        assert tools <= seen.get(name, set()), (name, sorted(tools - seen.get(name, set())))


def _tool(*params: click.Option) -> click.Command:
    return click.Command("farm-x", params=list(params))


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        # a known idea under another name: the option of its own is not the shared one
        ([click.Option(["--checkpoint-every"], type=int)], "--checkpoint-every is an old name"),
        ([click.Option(["--samples-per-prompt"], type=int)], "--samples-per-prompt is an old"),
        ([click.Option(["--lr-schedule"])], "--lr-schedule is an old name"),
        # the shared name, declared by hand: it misses the shared help and the old names
        (
            [click.Option(["--save-steps"], type=int, default=5)],
            "old names ('--checkpoint-every',) are not",
        ),
        ([click.Option(["--device"], default="auto", show_default=True)], "help differs"),
    ],
)
def test_the_dialect_check_refuses_a_tool_that_names_a_known_idea_its_own_way(params, problem):
    problems = dialect_problems([("farm-x", _tool(*params))])
    assert any(problem in line for line in problems), problems


def test_the_dialect_check_refuses_one_flag_with_two_meanings():
    annotate = _tool(click.Option(["--labels"], type=click.Path()))
    correlate = _tool(click.Option(["--labels"], type=click.IntRange(min=0)))
    problems = dialect_problems([("farm-a", annotate), ("farm-c", correlate)])
    assert problems == [
        "--labels takes different kinds of value: {'farm-a': 'file', 'farm-c': 'number'}"
    ]


def test_no_tool_shows_an_old_name_and_every_o_is_output():
    for tool, cmd in commands():
        for option in options(cmd):
            visible = set(option.opts) | set(option.secondary_opts)
            assert not visible & old_names(), (tool, option.opts)
            if "-o" in option.opts:
                assert option.opts == ["-o", "--output"], tool
        # with the command's own settings: click caches the help option the first context makes
        help_text = cmd.get_help(click.Context(cmd, info_name=tool, **cmd.context_settings))
        for old in old_names():
            assert old + " " not in help_text, (tool, old)


@pytest.mark.parametrize("tool", TRAINERS)
def test_trainers_write_the_model_folder_with_one_option(tool):
    (output,) = [option for option in options(command(tool)) if "-o" in option.opts]
    assert output.help == farm_cli.MODEL_DIR_HELP
    assert output.required and "--output-dir" in output.aliases


@pytest.mark.parametrize("tool", RECORD_WRITERS)
def test_record_writers_share_the_output_option(tool):
    (output,) = [option for option in options(command(tool)) if "-o" in option.opts]
    (reference,) = [option for option in options(command("farm-sample")) if "-o" in option.opts]
    assert (output.help, output.default) == (reference.help, reference.default)


# (tool, arguments with an old option name, parameter, value it must get)
ALIASES = [
    ("farm-sft", ["m", "d", "-o", "out", "--lora-r", "4"], "lora_rank", 4),
    ("farm-rm-train", ["m", "p", "--output-dir", "out", "--lora-r", "2"], "output_dir", "out"),
    ("farm-dpo", ["m", "p", "--output-dir", "out"], "output", "out"),
    ("farm-ppo", ["s", "r", "p", "-o", "out", "--max-response-tokens", "7"], "max_new_tokens", 7),
    ("farm-quark", ["s", "r", "p", "-o", "o", "--max-response-tokens", "5"], "max_new_tokens", 5),
    ("farm-sample", ["m", "p", "--batch-size", "5"], "batch_size", 5),
    ("farm-bon", ["s", "r", "p", "--batch-size", "6"], "batch_size", 6),
    (
        "farm-expiter",
        ["s", "r", "p", "-o", "o", "--sample-batch-size", "3"],
        "sample_batch_size",
        3,
    ),
    ("farm-score", ["r", "p", "--batch-size", "9"], "batch_size", 9),
    ("farm-split", ["p", "--output-dir", "splits"], "output_dir", "splits"),
    # issue 22: one name per idea, transformers' where it has one
    (
        "farm-quark",
        ["s", "r", "p", "-o", "o", "--samples-per-prompt", "3"],
        "samples_per_prompt",
        3,
    ),
    ("farm-rloo", ["s", "r", "p", "-o", "o", "--samples-per-prompt", "8"], "samples_per_prompt", 8),
    ("farm-grpo", ["s", "r", "p", "-o", "o", "--checkpoint-every", "3"], "checkpoint_every", 3),
    ("farm-ppo", ["s", "r", "p", "-o", "o", "--checkpoint-every", "0"], "checkpoint_every", 0),
    ("farm-sft", ["m", "d", "-o", "out", "--lr-scheduler", "linear"], "lr_scheduler", "linear"),
    (
        "farm-quark",
        ["s", "r", "p", "-o", "o", "--lr-schedule", "constant"],
        "lr_schedule",
        "constant",
    ),
    ("farm-correlate", ["a.csv", "b.csv", "--labels", "4"], "max_labels", 4),
]


@pytest.mark.parametrize(("tool", "args", "name", "value"), ALIASES, ids=[a[0] for a in ALIASES])
def test_old_names_still_work_and_warn(tool, args, name, value, capsys):
    cmd = command(tool)
    with cmd.make_context(tool, list(args)) as context:
        assert context.params[name] == value
    old = next(arg for arg in args if arg in (*old_names(), "--batch-size", "--labels"))
    err = capsys.readouterr().err
    assert f"{tool}: warning: {old} is deprecated" in err
    assert "use --" in err


@pytest.mark.parametrize(
    ("tool", "head", "name", "value"),
    [
        ("farm-sample", ["m", "p"], "n", 3),
        ("farm-bon", ["s", "r", "p"], "ns", (3,)),
        ("farm-expiter", ["s", "r", "p", "-o", "o"], "n", 3),
        ("farm-quark", ["s", "r", "p", "-o", "o"], "samples_per_prompt", 3),
        ("farm-rloo", ["s", "r", "p", "-o", "o"], "samples_per_prompt", 3),
        ("farm-grpo", ["s", "r", "p", "-o", "o"], "samples_per_prompt", 3),
    ],
)
def test_the_sample_count_is_n_or_num_samples_in_every_tool(tool, head, name, value):
    cmd = command(tool)
    for flag in ("-n", "--num-samples"):
        with cmd.make_context(tool, [*head, flag, "3"]) as context:
            assert context.params[name] == value
    with pytest.raises(click.BadParameter):
        cmd.make_context(tool, [*head, "-n", "0"])


@pytest.mark.parametrize(
    ("tool", "head", "name", "value"),
    [
        ("farm-sft", ["m", "d", "-o", "o"], "lr_scheduler", "constant"),
        ("farm-quark", ["s", "r", "p", "-o", "o"], "lr_schedule", "constant"),
    ],
)
def test_the_learning_rate_schedule_is_lr_scheduler_type_in_every_tool(tool, head, name, value):
    cmd = command(tool)
    with cmd.make_context(tool, [*head, "--lr-scheduler-type", value]) as context:
        assert context.params[name] == value


@pytest.mark.parametrize(
    ("tool", "head", "name"),
    [
        ("farm-sft", ["m", "d", "-o", "o"], "save_steps"),
        ("farm-ppo", ["s", "r", "p", "-o", "o"], "checkpoint_every"),
        ("farm-rloo", ["s", "r", "p", "-o", "o"], "checkpoint_every"),
        ("farm-grpo", ["s", "r", "p", "-o", "o"], "checkpoint_every"),
    ],
)
def test_checkpoints_are_save_steps_in_every_tool(tool, head, name):
    cmd = command(tool)
    with cmd.make_context(tool, [*head, "--save-steps", "7"]) as context:
        assert context.params[name] == 7
    with pytest.raises(click.BadParameter):
        cmd.make_context(tool, [*head, "--save-steps", "-1"])


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("num-samples", "samples_per_prompt"),
        ("samples_per_prompt", "samples_per_prompt"),
        ("lr_scheduler_type", "lr_schedule"),
    ],
)
def test_config_files_take_the_shared_name_and_the_field_name(key, field, tmp_path):
    yaml_file = tmp_path / "quark.yaml"
    value = "constant" if field == "lr_schedule" else 6
    yaml_file.write_text(f"{key}: {value}\n")
    cmd = command("farm-quark")
    base = ["s", "r", "p", "-o", "o", "--config", str(yaml_file)]
    with cmd.make_context("farm-quark", base) as context:
        config = farm_cli.resolve_config(QuarkConfig, str(yaml_file), context.params)
    assert getattr(config, field) == value


def test_farm_correlate_max_labels_is_a_number_and_labels_a_file_elsewhere():
    cmd = command("farm-correlate")
    with cmd.make_context("farm-correlate", ["a.csv", "b.csv", "--max-labels", "4"]) as context:
        assert context.params["max_labels"] == 4
    help_text = cmd.get_help(click.Context(cmd, **cmd.context_settings))
    assert "--max-labels N" in help_text and "--labels" not in help_text


def test_best_of_n_takes_a_sweep_of_sample_counts():
    cmd = command("farm-bon")
    with cmd.make_context("farm-bon", ["s", "r", "p", "--num-samples", "1,4,16"]) as context:
        assert context.params["ns"] == (1, 4, 16)
    with cmd.make_context("farm-bon", ["s", "r", "p"]) as context:
        assert context.params["ns"] == (16,)
    with pytest.raises(click.BadParameter, match="every n must be at least 1"):
        cmd.make_context("farm-bon", ["s", "r", "p", "-n", "4,0"])


def test_a_reference_option_is_a_file_of_outputs_and_the_reference_generator_a_name():
    """--reference means one thing: the FILE of reference outputs (farm-annotate, farm-eval). The reference's
    name in preference records is --reference-generator (farm-winrate)."""
    found = {}
    for tool, cmd in commands():
        for option in options(cmd):
            for flag in ("--reference", "--reference-generator"):
                if flag in option.opts:
                    found.setdefault(flag, set()).add(tool)
                    want = click.Path if flag == "--reference" else click.types.StringParamType
                    assert isinstance(option.type, want), (tool, flag)
    assert found == {
        "--reference": {"farm-annotate", "farm-audit", "farm-eval", "farm-label"},
        "--reference-generator": {"farm-winrate"},
    }
    winrate = command("farm-winrate")
    (option,) = [opt for opt in options(winrate) if "--reference-generator" in opt.opts]
    assert "--reference" in option.aliases
    help_text = winrate.get_help(click.Context(winrate, **winrate.context_settings))
    listed = [line.split()[0] for line in help_text.splitlines() if line.startswith("  -")]
    assert "--reference-generator" in listed and "--reference" not in listed


def test_farm_winrate_reference_still_works_and_warns(tmp_path):
    record = {
        "instruction": "Colour?",
        "generator_1": "model",
        "generator_2": "ref",
        "output_1": "blue",
        "output_2": "Blue.",
        "preference": 1,
    }
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(json.dumps(record) + "\n")
    common = [str(prefs), "--no-length-control", "--format", "csv"]
    new = run_tool("farm-winrate", *common, "--reference-generator", "ref")
    old = run_tool("farm-winrate", *common, "--reference", "ref")
    assert new.returncode == old.returncode == 0, old.stderr.decode()
    assert old.stdout == new.stdout
    assert b"model,ref,100.0," in new.stdout  # oriented: ref moved to position 1, the model won
    assert b"deprecated" not in new.stderr
    warning = "farm-winrate: warning: --reference is deprecated"
    assert old.stderr.decode().count(warning) == 1
    assert "use --reference-generator" in old.stderr.decode()


def test_the_new_name_wins_over_the_old_and_nothing_warns_without_old_names(capsys):
    cmd = command("farm-ppo")
    args = ["s", "r", "p", "-o", "o", "--max-response-tokens", "7", "--max-new-tokens", "9"]
    with cmd.make_context("farm-ppo", list(args)) as context:
        assert context.params["max_new_tokens"] == 9
    with cmd.make_context("farm-ppo", ["s", "r", "p", "-o", "o", "--max-new-tokens", "9"]):
        pass
    assert capsys.readouterr().err.count("deprecated") == 1


@pytest.mark.parametrize(
    ("tool", "config_class"),
    [
        ("farm-sft", SFTConfig),
        ("farm-rm-train", RewardConfig),
        ("farm-dpo", DPOConfig),
        ("farm-ppo", PPOConfig),
        ("farm-quark", QuarkConfig),
    ],
)
def test_config_files_flags_and_defaults_in_that_order(tool, config_class, tmp_path, capsys):
    """--config values beat the defaults (now shown in --help as real defaults), a flag beats the
    file even when it repeats the default, and an old key in the file still works, with a warning."""
    cmd = command(tool)
    heads = {"farm-ppo": ["s", "r", "p"], "farm-quark": ["s", "r", "p"]}.get(tool, ["m", "p"])
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text("learning_rate: 0.125\nseed: 7\n")
    base = [*heads, "-o", "out", "--config", str(yaml_file)]
    with cmd.make_context(tool, list(base)) as context:
        config = farm_cli.resolve_config(config_class, str(yaml_file), context.params)
    assert (config.learning_rate, config.seed) == (0.125, 7)
    with cmd.make_context(tool, [*base, "--seed", "0"]) as context:
        config = farm_cli.resolve_config(config_class, str(yaml_file), context.params)
    assert (config.learning_rate, config.seed) == (0.125, 0)
    with cmd.make_context(tool, heads + ["-o", "out"]) as context:
        config = farm_cli.resolve_config(config_class, None, context.params)
    assert config == config_class()
    old_key, field = (
        ("max-response-tokens", "max_new_tokens")
        if tool in ("farm-ppo", "farm-quark")
        else ("lora_r", "lora_rank")
    )
    yaml_file.write_text(f"{old_key}: 3\n")
    with cmd.make_context(tool, list(base)) as context:
        config = farm_cli.resolve_config(config_class, str(yaml_file), context.params)
    assert getattr(config, field) == 3
    assert f"{old_key} (in {yaml_file}) is deprecated" in capsys.readouterr().err


def test_every_method_config_inherits_model_args():
    from farmkit.methods.bon import BestOfNConfig
    from farmkit.methods.group import GRPOConfig, RLOOConfig
    from farmkit.methods.online_dpo import OnlineDPOConfig
    from farmkit.train.config import ModelArgs

    configs = (SFTConfig, RewardConfig, DPOConfig, PPOConfig, QuarkConfig, BestOfNConfig)
    for config_class in (*configs, RLOOConfig, GRPOConfig, OnlineDPOConfig):
        assert issubclass(config_class, ModelArgs), config_class


def test_click_stays_out_of_the_method_configs():
    code = (
        "import sys\n"
        "import farmkit.train.config, farmkit.methods.sft, farmkit.methods.dpo\n"
        "import farmkit.methods.ppo, farmkit.methods.quark, farmkit.methods.reward\n"
        "print('click' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert result.stdout.strip() == b"False"
    source = (ROOT / "farmkit" / "train" / "config.py").read_text()
    assert "import click" not in source


def test_an_old_name_on_the_command_line_warns_once_and_runs(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = run_tool("farm-score", "embedded", str(empty), "--batch-size", "2")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().count("--batch-size is deprecated") == 1
    assert result.stdout == b""


def _scalar_tags(folder) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in folder.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events.parent))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags


@pytest.mark.parametrize(
    ("tool", "loss_tag"),
    [("farm-rm-train", "loss"), ("farm-sft", "train/loss")],
    ids=["accelerate-trackers", "trainer-report-to"],
)
def test_report_to_tensorboard_writes_event_files_offline(
    tool, loss_tag, tiny_model_path, tmp_path
):
    pytest.importorskip("tensorboard")
    if tool == "farm-rm-train":
        row = {"instruction": "Colour?", "output_1": "blue", "output_2": "seven", "preference": 1}
    else:
        row = {"instruction": "Colour?", "input": "", "output": "Blue."}
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join([json.dumps(row)] * 4) + "\n")
    output = tmp_path / "model"
    offline = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    common = ["--max-steps", "2", "--batch-size", "2", "--report-to", "tensorboard", "-q"]
    if tool == "farm-sft":
        common += ["--logging-steps", "1"]
    result = run_tool(
        tool, str(tiny_model_path), str(data), "-o", str(output), *common, env=offline
    )
    assert result.returncode == 0, result.stderr.decode()
    runs = tmp_path / "model.runs"
    assert list(runs.rglob("events.out.tfevents.*")), sorted(runs.rglob("*"))
    assert loss_tag in _scalar_tags(runs)
    assert not list(output.rglob("events.out.tfevents.*"))  # the model folder stays a model folder


# ---------------------------------------------------------------------------------------------
# Numbers: every numeric option of every command goes through farmkit.core.values' one check.

BAD_FLOATS = ("nan", "inf", "-inf", "1e999")


def numeric_options(cmd: click.Command) -> list[click.Option]:
    return [
        option
        for option in options(cmd)
        if isinstance(option.type, click.types._NumberParamTypeBase | farm_cli.SampleCounts)
    ]


def test_every_numeric_option_is_checked_where_it_is_declared():
    """A float option is a FiniteFloat, an int option a WholeNumber (or a sweep of them): click's
    own FLOAT, INT and ranges let nan, inf or 1.5 through, so a new option declared with them (or
    with a bare numeric default, from which click infers FLOAT) fails here."""
    loose = [
        f"{tool} {option.opts}: {option.type!r}"
        for tool, cmd in commands()
        for option in numeric_options(cmd)
        if not isinstance(option.type, farm_cli.FiniteFloat | farm_cli.WholeNumber)
        and not isinstance(option.type, farm_cli.SampleCounts)
    ]
    assert loose == []
    assert sum(len(numeric_options(cmd)) for _, cmd in commands()) > 150  # the walk finds them


@pytest.mark.parametrize("tool", sorted(SCRIPTS))
def test_every_numeric_option_refuses_non_finite_and_fractional_values(tool):
    """Each float option refuses nan and infinities, each int option 1.5: exit 2, naming the flag
    and what it takes, before the tool does anything (its arguments are not even given)."""
    runner = CliRunner()
    for name, cmd in commands():
        if name.split()[0] != tool:
            continue
        for option in numeric_options(cmd):
            floats = isinstance(option.type, click.types.FloatParamType)
            for value in BAD_FLOATS if floats else ("1.5", "nan"):
                result = runner.invoke(cmd, [option.opts[-1], value])
                assert result.exit_code == 2, (name, option.opts, value, result.output)
                error = result.output.split("Error: ", 1)[1]
                assert error.startswith("Invalid value for ") and f"'{option.opts[-1]}'" in error
                assert f"{value!r}" in error


SEED_RANGE = "in [0, 4294967295]"  # what numpy's seeding (transformers' set_seed) takes


@pytest.mark.parametrize("value", ["-1", str(2**32), str(2**64)])
def test_every_seed_is_a_usage_error_outside_the_range_numpy_and_torch_take(value):
    """farm-annotate --seed 2**64 and farm-winrate --seed -1 were exit 1 with a TypeError or a
    ValueError from inside the run (issue 44): every tool's --seed says its range instead."""
    seeded = [
        (name, cmd) for name, cmd in commands() if any(o.name == "seed" for o in options(cmd))
    ]
    assert len(seeded) >= 15
    for name, cmd in seeded:
        result = CliRunner().invoke(cmd, ["--seed", value])
        assert result.exit_code == 2, (name, result.output)
        assert f"Invalid value for '--seed': {value!r} is not a whole number {SEED_RANGE}" in (
            result.output
        ), (name, result.output)
        (option,) = [o for o in options(cmd) if o.name == "seed"]
        assert option.type.convert("4294967295", option, None) == 2**32 - 1


@pytest.mark.parametrize(("tool", "value"), [("farm-annotate", str(2**64)), ("farm-winrate", "-1")])
def test_a_seed_out_of_range_stops_the_tool_before_it_reads_its_input(tool, value, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps(
            {"instruction": "Say red.", "output_1": "red", "output_2": "no", "preference": 1}
        )
        + "\n"
    )
    judge = ["--pool", "gold", "--no-cache"] if tool == "farm-annotate" else []
    done = run_tool(tool, str(pairs), *judge, "--seed", value)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert f"Invalid value for '--seed': {value!r} is not a whole number {SEED_RANGE}" in err
    assert done.stdout == b""


def config_commands() -> list[tuple[str, click.Command]]:
    return [
        (name, cmd)
        for name, cmd in commands()
        if any(param.name == "config_file" for param in cmd.params)
    ]


def config_fields() -> set[str]:
    from farmkit.methods.group import GRPOConfig, RLOOConfig
    from farmkit.methods.online_dpo import OnlineDPOConfig

    configs = (SFTConfig, RewardConfig, DPOConfig, PPOConfig, QuarkConfig, OnlineDPOConfig)
    return {
        field.name
        for config_class in (*configs, RLOOConfig, GRPOConfig)
        for field in dataclasses.fields(config_class)
    }


@pytest.mark.parametrize("tool", sorted(name for name, _ in config_commands()))
def test_every_numeric_config_key_is_checked_like_its_option(tool, tmp_path):
    """A --config file's numbers go through the same check as the flags: NaN, a list, a string
    that is not a number and, for a count, 1.5 are usage errors naming the file and the key."""
    cmd = command(tool)
    yaml_file = tmp_path / "config.yaml"
    runner = CliRunner()
    arguments = [param for param in cmd.params if isinstance(param, click.Argument)]
    heads = ["x" for param in arguments if param.required] + ["-o", str(tmp_path / "out")]
    for option in numeric_options(cmd):
        if option.name not in config_fields():  # farm-online-dpo's annotator: flags only
            continue
        floats = isinstance(option.type, click.types.FloatParamType)
        for value in (".nan", "[1]", "many", ".inf" if floats else "1.5"):
            yaml_file.write_text(f"{option.name}: {value}\n")
            result = runner.invoke(cmd, [*heads, "--config", str(yaml_file)])
            assert result.exit_code == 2, (option.name, value, result.output)
            assert f"{yaml_file}: {option.name}: " in result.output, result.output


def test_the_declared_range_is_in_help_and_in_the_error():
    cmd = command("farm-dpo")
    result = CliRunner().invoke(cmd, ["--beta", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--beta': '0' is not a finite number > 0" in result.output
    help_text = CliRunner().invoke(cmd, ["--help"], terminal_width=200).output
    assert "--beta FLOAT " in help_text
    assert "[default: 0.1; x>0]" in help_text.split("--beta FLOAT ", 1)[1].split("\n  -", 1)[0]


@pytest.mark.parametrize(
    ("config_class", "values", "message"),
    [
        (SFTConfig, {"learning_rate": float("inf")}, "--learning-rate: inf is not a finite"),
        (DPOConfig, {"beta": float("nan")}, "--beta: nan is not a finite number > 0"),
        (PPOConfig, {"kl_coef": float("nan")}, "--kl-coef: nan is not a finite number >= 0"),
        (RewardConfig, {"epochs": 1.5}, "--epochs: 1.5 is not a whole number >= 1"),
        (QuarkConfig, {"samples_per_prompt": True}, "--num-samples: True is not a whole"),
        (
            SFTConfig,
            {"warmup_ratio": 1.0},
            r"--warmup-ratio: 1.0 is not a finite number in \[0, 1\)",
        ),
    ],
)
def test_a_config_built_in_python_is_checked_like_its_options(config_class, values, message):
    with pytest.raises(ValueError, match=message):
        config_class(**values)


def test_best_of_n_settings_are_checked_too():
    from farmkit.methods.bon import BestOfNConfig

    with pytest.raises(ValueError, match="--score-batch-size: 0 is not a whole number >= 1"):
        BestOfNConfig(score_batch_size=0)
    with pytest.raises(ValueError, match="--temperature: nan is not a finite number"):
        BestOfNConfig(temperature=float("nan"))


def test_method_config_fields_take_the_shared_range():
    """A field of a shared concept has SHARED's range, so its option and its field check alike."""
    from farmkit.core.fields import concept, number
    from farmkit.train.config import SHARED_NUMBERS

    for config_class in (SFTConfig, RewardConfig, DPOConfig, PPOConfig, QuarkConfig):
        for field in dataclasses.fields(config_class):
            if concept(field) in SHARED_NUMBERS:
                assert number(field) == SHARED_NUMBERS[concept(field)], field.name


@pytest.mark.parametrize("tool", ["farm-dpo", "farm-ppo", "farm-sft"])
def test_a_config_key_takes_one_value_not_a_list_or_a_mapping(tool, tmp_path):
    """A text or file option's key given a list was taken as its text ("[1]") or crashed with a
    TypeError (a path): now a usage error naming the file and the key, as for numbers."""
    cmd = command(tool)
    yaml_file = tmp_path / "config.yaml"
    arguments = [param for param in cmd.params if isinstance(param, click.Argument)]
    heads = ["x" for param in arguments if param.required] + ["-o", str(tmp_path / "out")]
    keys = [
        option.name
        for option in options(cmd)
        if option.name in config_fields() and not option.is_flag and not option.is_bool_flag
    ]
    assert {"template", "learning_rate"} <= set(keys)  # text and numbers alike
    for name in keys:
        for value in ("[1]", "{a: 1}"):
            yaml_file.write_text(f"{name}: {value}\n")
            result = CliRunner().invoke(cmd, [*heads, "--config", str(yaml_file)])
            assert result.exit_code == 2, (name, value, result.output)
            assert f"{yaml_file}: {name}: expected one value, not " in result.output


# ---------------------------------------------------------------------------------------------
# One option style: every option of every tool comes from its config dataclass (help_field, through
# farmkit.cli.field_options / config_options) or from a shared bundle of farmkit/cli.py.

# the shared bundles' options that are no concept of SHARED (their parameter names)
BUNDLED = {"quiet", "verbose", "output", "output_dir", "on_error", "split", "config_file"}
BUNDLED |= {"reference", "long_prompts", "version", "force"}


def tool_module(script: str):
    return importlib.import_module(SCRIPTS[script].split(":")[0])


def config_classes(module) -> list[type]:
    """The config dataclasses a tool module uses (imported or its own)."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and any("help" in field.metadata for field in dataclasses.fields(value))
    ]


def untraced_options(script: str) -> list[str]:
    """The options of a tool that neither a config field nor a shared bundle declares, and the
    click.option calls in its source."""
    module = tool_module(script)
    fields = {
        field.name: field
        for config_class in config_classes(module)
        for field in dataclasses.fields(config_class)
    }
    found = []
    for tool, cmd in commands():
        if tool.split()[0] != script:
            continue
        for option in options(cmd):
            if shared_name(option) is not None or option.name in BUNDLED:
                continue
            field = fields.get(option.name)
            if field is None or field.metadata.get("help") != option.help:
                found.append(f"{tool} {option.opts}: from no config field nor shared bundle")
    source = (ROOT / "tools" / f"{module.__name__.rsplit('.', 1)[1]}.py").read_text()
    found += [f"{script}: declares an option by hand"] * source.count("click.option(")
    return found


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_option_comes_from_a_config_field_or_a_shared_bundle(script):
    assert untraced_options(script) == []


def test_a_hand_declared_option_is_found():
    @click.command()
    @click.option("--mine", help="Mine.")
    def cli(mine):
        pass

    module = type(sys)("farm_x")
    module.cli = cli
    assert not config_classes(module)
