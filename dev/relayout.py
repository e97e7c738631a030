"""The moves of issue 38 ("a house to live in"), and every reference to them rewritten. Idempotent: a
second run changes nothing, and it can be run again on a newer tree (a branch started before the
moves): files that still use the old names get rewritten, files already moved are left alone.

    python dev/relayout.py          # git mv + rewrite, in the repository it sits in
    python dev/relayout.py --check  # exit 1 if anything is left to move or rewrite

Not heuristics: the tables below are the whole move (docs/architecture.md shows them). Rewritten in
every tracked text file (farmkit/, tools/, tests/, bench/, dev/, examples/, docs/, README.md,
Makefile, pyproject.toml, ...):
- dotted names: farmkit.methods.rollouts -> farmkit.train.rollouts (imports, mock.patch strings,
  prose), and `from farmkit.methods import policy, ppo` split into one import per new package;
- file paths: farmkit/methods/rollouts.py -> farmkit/train/rollouts.py (also written without the
  leading farmkit/), tests/test_ppo.py -> tests/methods/test_ppo.py, bench/mutants.py ->
  dev/mutants.py;
- a test module renamed: `from test_cli_dialect import` and bare test_cli_dialect.py mentions.
bench/results/ (records of past runs) and this file are left as they are. The first relayout
(issue 24, flat modules into farmkit.core, farmkit.lm, farmkit.evaluate) was bench/relayout.py, in
the history before this one.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# modules: old dotted name -> new dotted name
TRAIN = [
    "budget",
    "checkpoints",
    "config",
    "estimators",
    "gold",
    "launch",
    "onpolicy",
    "policy",
    "rl_common",
    "rollout_backends",
    "rollouts",
    "schedule",
    "tracking",
]
MOVES = {f"farmkit.methods.{name}": f"farmkit.train.{name}" for name in TRAIN}
MOVES |= {
    # the metrics.jsonl writer belongs to the trainers, below the pillars that read it
    "farmkit.evaluate.metrics": "farmkit.train.metrics",
    # the docs generator leaves the runtime package
    "farmkit.docs": "dev.docs",
    "farmkit.docs_diagrams": "dev.diagrams",
}

PACKAGES = {
    "farmkit.train": "Training machinery every method shares: the on-policy loop and its rollouts and\n"
    "rollout backends, checkpoints, schedules, the policy wrapper, the estimators and losses, the\n"
    "gold evaluation, launch and tracking, the options' config dataclasses and the metrics writer.\n"
    "Below the pillars (methods/ holds one module per method and imports this), above farmkit.lm.",
    "dev": "The project's own tooling, not shipped in the wheel: the docs generator (python -m\n"
    "dev.docs), the mutation gate (dev/mutants.py) and the relayout script.",
}

# tests: old file -> new file (tests/ mirrors the package: tests/<package>/test_<module>[_topic].py,
# tests/tools/ for the CLI contract over every tool, tests/examples/ for the recipes, tests/bench/
# for the benchmarks' own checks; project-wide checks stay at the top)
TESTS = {
    "test_allocator": "core/test_allocator",
    "test_endpoint": "core/test_endpoint",
    "test_formats": "core/test_formats",
    "test_datasets_by_name": "core/test_formats_datasets",
    "test_io": "core/test_io",
    "test_on_error": "core/test_io_on_error",
    "test_stdout_records": "core/test_io_stdout",
    "test_seeds": "core/test_seeds",
    "test_split": "core/test_split",
    "test_values": "core/test_values",
    "test_distributed": "core/test_distributed",
    "test_multinode": "core/test_distributed_multinode",
    "test_models": "lm/test_models",
    "test_prompt_format": "lm/test_models_prompt_format",
    "test_modelio": "lm/test_modelio",
    "test_prompt_length": "lm/test_generation",
    "test_temperature": "lm/test_generation_temperature",
    "test_sample": "lm/test_sampling",
    "test_vllm": "lm/test_sampling_vllm",
    "test_annotate": "annotate/test_annotate_run",
    "test_annotate_engine": "annotate/test_engine",
    "test_annotate_local": "annotate/test_local",
    "test_annotate_server": "annotate/test_openai_backend",
    "test_annotate_weighted": "annotate/test_openai_backend_weighted",
    "test_parsers": "annotate/test_parse",
    "test_judge_train": "annotate/test_learned",
    "test_validate_judges": "examples/test_validate_judges",
    "test_bon": "methods/test_bon",
    "test_dpo": "methods/test_dpo",
    "test_expiter": "methods/test_expiter",
    "test_online_dpo": "methods/test_online_dpo",
    "test_online_dpo_continuity": "methods/test_online_dpo_continuity",
    "test_ppo": "methods/test_ppo",
    "test_quark": "methods/test_quark",
    "test_reward": "methods/test_reward",
    "test_sft": "methods/test_sft",
    "test_group_methods": "methods/test_group",
    "test_policy_embedded": "methods/test_methods_embedded",
    "test_checkpoints": "train/test_checkpoints",
    "test_onpolicy": "train/test_onpolicy",
    "test_rollouts": "train/test_rollouts",
    "test_rollout_backends": "train/test_rollout_backends",
    "test_rl_math": "train/test_estimators",
    "test_gold": "train/test_gold",
    "test_launch_configs": "train/test_launch",
    "test_deepspeed": "train/test_launch_deepspeed",
    "test_deepspeed_multi": "train/test_launch_deepspeed_multi",
    "test_deepspeed_tools": "train/test_launch_deepspeed_tools",
    "test_trainer_options": "train/test_config",
    "test_presets": "train/test_config_presets",
    "test_warmup": "train/test_schedule",
    "test_report_to": "train/test_tracking",
    "test_metrics_schema": "train/test_metrics",
    "test_winrate": "evaluate/test_winrate",
    "test_alpaca_eval_format": "evaluate/test_winrate_alpaca_eval",
    "test_correlate": "evaluate/test_correlate",
    "test_eval": "evaluate/test_evaluate_run",
    "test_history": "evaluate/test_history",
    "test_plots": "evaluate/test_plots",
    "test_figures": "evaluate/test_plots_figures",
    "test_contract": "tools/test_contract",
    "test_pipeline": "tools/test_pipeline",
    "test_demo": "examples/test_demo",
    "test_equal_budget": "examples/test_budget",
    "test_overopt": "examples/test_overopt",
    "test_nightly": "examples/test_nightly",
    "test_examples_path": "examples/test_examples_path",
    "test_report_significance": "examples/test_report",
    "test_bench_rl": "bench/test_bench_rl",
    "test_gpu_check": "bench/test_gpu_check",
    "test_cli_dialect": "test_cli",
    "test_docs_site": "dev/test_docs",
}
# two test modules share a base name at most once on sys.path: refuse a table that repeats one
assert len({new.rpartition("/")[2] for new in TESTS.values()}) == len(TESTS)

FILES = {
    "bench/mutants.py": "dev/mutants.py",
    **{f"tests/{old}.py": f"tests/{new}.py" for old, new in TESTS.items()},
}
# where a test file moved one folder down, its way to the repository root grows by one parent
DEEPER = {
    "Path(__file__).resolve().parent.parent": "Path(__file__).resolve().parents[2]",
    "Path(__file__).resolve().parents[1]": "Path(__file__).resolve().parents[2]",
    'Path(__file__).parent / "data"': 'Path(__file__).parent.parent / "data"',
}

SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".ini", ".sh", ".json", ".mk"}
NAMES = {"Makefile", "run"}
SKIP = ("bench/results/", "dev/relayout.py", "bench/relayout.py", ".git/", "site/")


def _path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _dotted_pattern(old: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){re.escape(old)}\b")


FROM = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<package>[\w.]+) import (?P<names>\([^)]*\)|[^\n#]*?)"
    r"(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.MULTILINE,
)


def _rewrite_from(match: re.Match[str]) -> str:
    """`from farmkit.methods import policy, ppo` -> one import per package the names now live in."""
    indent, package = match["indent"], match["package"]
    names = match["names"].strip("() \n")
    items = [item.strip() for item in names.replace("\n", " ").split(",") if item.strip()]
    if not any(f"{package}.{item.partition(' as ')[0].strip()}" in MOVES for item in items):
        return match[0]
    groups: dict[str, list[str]] = {}
    for item in items:
        name, _, alias = (part.strip() for part in item.partition(" as "))
        new = MOVES.get(f"{package}.{name}")
        if new is None:
            groups.setdefault(package, []).append(item)
            continue
        target, _, leaf = new.rpartition(".")
        local = alias or name
        groups.setdefault(target, []).append(leaf if leaf == local else f"{leaf} as {local}")
    lines = [f"{indent}from {target} import {', '.join(names)}" for target, names in groups.items()]
    lines[0] += match["tail"]
    return "\n".join(lines)


def rewrite(text: str, relative: str) -> str:
    text = text.replace("python -m farmkit.docs", "python -m dev.docs")
    text = text.replace("-m farmkit.docs ", "-m dev.docs ")
    text = FROM.sub(_rewrite_from, text)
    for old, new in MOVES.items():
        text = _dotted_pattern(old).sub(new, text)
        old_path, new_path = _path(old), _path(new)
        text = re.sub(rf"(?<![\w./]){re.escape(old_path)}(?!\w)", new_path, text)
        if old.startswith("farmkit.") and new.startswith("farmkit."):
            short_old, short_new = (
                old_path.removeprefix("farmkit/"),
                new_path.removeprefix("farmkit/"),
            )
            text = re.sub(rf"(?<![\w./]){re.escape(short_old)}(?!\w)", short_new, text)
    for old, new in FILES.items():
        text = re.sub(rf"(?<![\w./]){re.escape(old)}(?!\w)", new, text)
    for old, new in TESTS.items():
        leaf = new.rpartition("/")[2]
        if leaf != old:
            text = re.sub(rf"(?<![\w/]){old}\.py\b", f"{leaf}.py", text)
            text = re.sub(rf"^(\s*)(from|import) {old}\b", rf"\1\2 {leaf}", text, flags=re.M)
    if relative in {f"tests/{new}.py" for new in TESTS.values() if "/" in new}:
        for old, new in DEEPER.items():
            text = text.replace(old, new)
    return text


def tracked_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    return [
        ROOT / name
        for name in names
        if name
        and not name.startswith(SKIP)
        and (Path(name).suffix in SUFFIXES or Path(name).name in NAMES)
        and (ROOT / name).is_file()
    ]


def moves_left() -> list[tuple[Path, Path]]:
    pairs = [(ROOT / _path(old), ROOT / _path(new)) for old, new in MOVES.items()]
    pairs += [(ROOT / old, ROOT / new) for old, new in FILES.items()]
    return [(source, target) for source, target in pairs if source.exists() and not target.exists()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if work is left"
    )
    check = parser.parse_args().check
    work = []
    for package, doc in PACKAGES.items():
        init = ROOT / _path(package + ".__init__")
        if not init.exists():
            work.append(f"create {init.relative_to(ROOT)}")
            if not check:
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text(f'"""{doc}"""\n', encoding="utf-8")
                subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    for source, target in moves_left():
        work.append(f"git mv {source.relative_to(ROOT)} {target.relative_to(ROOT)}")
        if check:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(source), str(target)], cwd=ROOT, check=True)
    rewritten = []
    for path in tracked_files():
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        new = rewrite(text, relative)
        if new != text:
            work.append(f"rewrite {relative}")
            if not check:
                path.write_text(new, encoding="utf-8", errors="surrogateescape")
                rewritten.append(str(path))
    python = [name for name in rewritten if name.endswith(".py")]
    if python:
        # the new names sort differently: put the imports back in ruff's order, lines in its width
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "check", "-q", "--select", "I", "--fix", *python], cwd=ROOT)
        subprocess.run([*ruff, "format", "-q", *python], cwd=ROOT, check=True)
    for line in work:
        print(line)
    print(f"{len(work)} change(s){' left' if check else ''}", file=sys.stderr)
    return 1 if check and work else 0


if __name__ == "__main__":
    sys.exit(main())
