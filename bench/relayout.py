"""Move farmkit's flat modules into packages that show the architecture (issue 24), and rewrite every
reference to them. Idempotent: a second run changes nothing, and it can be run again on a newer main
(new files that use the old paths get rewritten; modules already moved are left alone).

    python bench/relayout.py          # git mv + rewrite, in the repository it sits in
    python bench/relayout.py --check  # exit 1 if anything is left to move or rewrite

Not heuristics: MOVES is the whole table (old module -> new module). Rewritten in every tracked text
file (farmkit/, tools/, tests/, bench/, examples/, docs/, README.md, Makefile, pyproject.toml, ...):
- dotted names: farmkit.io -> farmkit.core.io (imports, mock.patch strings, prose);
- `from farmkit import io, seeds` -> `from farmkit.core import io, seeds` (split per new package,
  `as` kept; a module whose new name differs keeps its old local name with `as`);
- file paths: farmkit/io.py -> farmkit/core/io.py (README, docs, bench/mutants.py).
bench/results/ (records of past runs) and this file are left as they are.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MOVES = {
    # plumbing: reading, checking and writing records; seeds; runs; endpoints
    "farmkit.io": "farmkit.core.io",
    "farmkit.records": "farmkit.core.records",
    "farmkit.validate": "farmkit.core.validate",
    "farmkit.formats": "farmkit.core.formats",
    "farmkit.seeds": "farmkit.core.seeds",
    "farmkit.split": "farmkit.core.split",
    "farmkit.runs": "farmkit.core.runs",
    "farmkit.distributed": "farmkit.core.distributed",
    "farmkit.endpoint": "farmkit.core.endpoint",
    # language models: loading, model folders, generation, sampling
    "farmkit.models": "farmkit.lm.models",
    "farmkit.modelio": "farmkit.lm.modelio",
    "farmkit.generation": "farmkit.lm.generation",
    "farmkit.sampling": "farmkit.lm.sampling",
    # evaluation
    "farmkit.evaluate": "farmkit.evaluate.run",
    "farmkit.winrate": "farmkit.evaluate.winrate",
    "farmkit.length_control": "farmkit.evaluate.length_control",
    "farmkit.correlate": "farmkit.evaluate.correlate",
    "farmkit.history": "farmkit.evaluate.history",
    "farmkit.plots": "farmkit.evaluate.plots",
    "farmkit.metrics": "farmkit.evaluate.metrics",
    "farmkit.overopt": "farmkit.evaluate.overopt",
    # judges learned from real verdicts (issue 23) belong to the annotation pillar
    "farmkit.learned_judge": "farmkit.annotate.learned",
    "farmkit.judge_validation": "farmkit.annotate.validation",
}

PACKAGES = {
    "farmkit.core": "The plumbing: records read, checked and written (io, records, validate, formats),\n"
    "seeds, splits, run folders, processes and endpoints. Imports nothing of farmkit above it.",
    "farmkit.lm": "Language models: loading (models), model folders and meta.json (modelio), generation\n"
    "and sampling. Imports farmkit.core only (and, lazily, a few helpers noted where used).",
    "farmkit.evaluate": "Evaluation: win rates, length control, correlation, history, plots, training\n"
    "metrics, over-optimization, and farm-eval's leaderboard (run).",
}

SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".ini", ".sh", ".json"}
NAMES = {"Makefile"}
SKIP = ("bench/results/", "bench/relayout.py", ".git/")


def _path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _submodules(package: str) -> set[str]:
    """The last names of the modules MOVES puts in `package`."""
    return {new.rpartition(".")[2] for new in MOVES.values() if new.rpartition(".")[0] == package}


def _dotted_pattern(old: str, new: str) -> re.Pattern[str]:
    # old, not already part of a longer dotted name; when new is old + ".x" (farmkit.evaluate ->
    # farmkit.evaluate.run), not when a module of the new package already follows (idempotent)
    guard = ""
    if new.startswith(old + "."):
        names = "|".join(sorted(_submodules(old)))
        guard = rf"(?!\.(?:{names})\b)"
    return re.compile(rf"(?<![\w.]){re.escape(old)}\b{guard}")


def _path_pattern(old: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){re.escape(_path(old))}(?!\w)")


FROM_FARMKIT = re.compile(
    r"^(?P<indent>[ \t]*)from farmkit import (?P<names>\([^)]*\)|[^\n#]*?)(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.MULTILINE,
)


def _rewrite_from_farmkit(match: re.Match[str]) -> str:
    indent, names = match["indent"], match["names"].strip("() \n")
    items = [item.strip() for item in names.replace("\n", " ").split(",") if item.strip()]
    groups: dict[str, list[str]] = {}
    for item in items:
        name, _, alias = (part.strip() for part in item.partition(" as "))
        new = MOVES.get(f"farmkit.{name}")
        if new is None:
            groups.setdefault("farmkit", []).append(item)
            continue
        package, _, leaf = new.rpartition(".")
        local = alias or name
        groups.setdefault(package, []).append(leaf if leaf == local else f"{leaf} as {local}")
    if set(groups) == {"farmkit"}:
        return match[0]
    lines = [
        f"{indent}from {package} import {', '.join(names)}" for package, names in groups.items()
    ]
    lines[0] += match["tail"]
    return "\n".join(lines)


def _package_import(names: str, package: str) -> bool:
    """`names` (what follows `from PACKAGE import`) are all modules of the new package PACKAGE: the
    statement already names the package (`from farmkit.evaluate import winrate`), not the old module."""
    found = re.match(r"\(?([\w\s,]+?)\)?[ \t]*(?:#|$)", names, re.MULTILINE)
    if not found:
        return False
    items = [item.split(" as ")[0].strip() for item in found[1].split(",") if item.strip()]
    return bool(items) and all(item in _submodules(package) for item in items)


def _dotted_sub(old: str, new: str, text: str) -> str:
    pattern = _dotted_pattern(old, new)
    if not new.startswith(old + "."):
        return pattern.sub(new, text)

    def replace(match: re.Match[str]) -> str:
        rest = text[match.end() :]
        if rest.startswith(" import ") and _package_import(rest[len(" import ") :], old):
            return match[0]
        return new

    return pattern.sub(replace, text)


def rewrite(text: str) -> str:
    text = FROM_FARMKIT.sub(_rewrite_from_farmkit, text)
    for old, new in MOVES.items():
        text = _dotted_sub(old, new, text)
        text = _path_pattern(old).sub(_path(new), text)
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
    left = []
    for old, new in MOVES.items():
        source, target = ROOT / _path(old), ROOT / _path(new)
        if source.exists() and not target.exists():
            left.append((source, target))
    return left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if work is left"
    )
    check = parser.parse_args().check
    work = []
    # (farmkit/evaluate.py and the package folder farmkit/evaluate/ can sit side by side while moving)
    for source, target in moves_left():
        work.append(f"git mv {source.relative_to(ROOT)} {target.relative_to(ROOT)}")
        if check:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(source), str(target)], cwd=ROOT, check=True)
    for package, doc in PACKAGES.items():
        init = ROOT / _path(package + ".__init__")
        if not init.exists():
            work.append(f"create {init.relative_to(ROOT)}")
            if not check:
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text(f'"""{doc}"""\n', encoding="utf-8")
                subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    rewritten = []
    for path in tracked_files():
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        new = rewrite(text)
        if new != text:
            work.append(f"rewrite {path.relative_to(ROOT)}")
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
