"""Audit of issue 24 item 3 (the package layout) on a checkout, not part of the test suite:

    python bench/audit_layout.py BEFORE_TREE AFTER_TREE

Each tree is a plain copy of the repository (`git archive COMMIT | tar -x -C DIR`). Measured on each,
with the same yardstick (this checkout's docs_diagrams graph code, pointed at the tree):
1. import circles (strongly connected modules) and the modules caught in them;
2. plumbing modules that import (anywhere, lazily too) a farmkit module of a higher layer;
3. top-level modules of farmkit/ (the flat layout) and the packages;
4. every farmkit module imported FIRST in a fresh interpreter (a circle can break one import order),
   and the farmkit modules outside the plumbing that importing a plumbing module loads (sys.modules);
5. behaviour: every farm-* command's --help (moved file names mapped back to the old ones), and a few
   commands over real public data (../shared/data), byte for byte between the two trees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

from relayout import MOVES  # noqa: E402

from dev import diagrams as docs_diagrams  # noqa: E402

DATA = HERE.parent / "shared" / "data"
RANK = {
    "plumbing": 0,
    "models and sampling": 1,
    "annotate/": 2,
    "methods/": 2,
    "evaluation": 2,
    "cli": 3,
    "tools/": 4,
}
PLUMBING_OLD = {old for old, new in MOVES.items() if new.startswith("farmkit.core.")}


def _plumbing(module: str) -> bool:
    return module.startswith("farmkit.core") or module in PLUMBING_OLD


def graph_of(tree: Path) -> dict[str, set[str]]:
    docs_diagrams.ROOT = tree
    return docs_diagrams.import_graph()


def python(tree: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True
    )


def command(tree: Path, tool: str, args: list[str], stdin: bytes | None = None):
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    env["COLUMNS"] = "100"
    script = tree / "tools" / (tool.replace("-", "_") + ".py")
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=tree, env=env, capture_output=True, input=stdin
    )


def unmoved(text: bytes) -> bytes:
    """New module and file names written back as the old ones (to compare help texts)."""
    for old, new in sorted(MOVES.items(), key=lambda item: -len(item[1])):
        text = text.replace(new.encode(), old.encode())
        text = text.replace(
            (new.replace(".", "/") + ".py").encode(), (old.replace(".", "/") + ".py").encode()
        )
    return text


def audit(tree: Path) -> dict:
    graph = graph_of(tree)
    farm = {m: t for m, t in graph.items() if not m.startswith("farmkit.tools")}
    circles = docs_diagrams.import_circles(graph)
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in farm.items()
        if _plumbing(m)
        for t in targets
        if t != "farmkit" and RANK[docs_diagrams._group(t)] > 0
    )
    flat = sorted(p.stem for p in (tree / "farmkit").glob("*.py"))
    packages = sorted(p.parent.name for p in (tree / "farmkit").glob("*/__init__.py"))
    first_fail = []
    for module in sorted(farm):
        done = python(tree, f"import {module}")
        if done.returncode:
            first_fail.append(f"{module}: {done.stderr.strip().splitlines()[-1]}")
    loaded = {}
    for module in sorted(m for m in farm if _plumbing(m)):
        done = python(
            tree,
            f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('farmkit')))",
        )
        above = [m for m in json.loads(done.stdout.replace("'", '"')) if not _plumbing(m)]
        above = [m for m in above if m not in ("farmkit",)]
        if above:
            loaded[module] = above
    return {
        "circles": circles,
        "modules_in_circles": sum(len(c) for c in circles),
        "plumbing_imports_upward": upward,
        "flat_modules_in_farmkit/": len(flat),
        "packages": packages,
        "import_first_fails": first_fail,
        "plumbing_loads_above_at_import": loaded,
    }


def behaviour(before: Path, after: Path) -> dict:
    tools = sorted(p.stem.replace("_", "-") for p in (after / "tools").glob("farm_*.py"))
    help_same, help_rewrapped, help_diff = 0, [], []
    for tool in tools:
        a = command(before, tool, ["--help"])
        b = command(after, tool, ["--help"])
        if (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr):
            help_same += 1
        elif (a.returncode, unmoved(a.stdout).split(), a.stderr) == (
            b.returncode,
            unmoved(b.stdout).split(),
            b.stderr,
        ):
            help_rewrapped.append(tool)  # differs only by a moved file's name and line breaks
        else:
            help_diff.append(tool)
    runs = []
    if DATA.is_dir():
        annotations = DATA / "alpaca_eval" / "annotations" / "alpaca_eval_gpt4.jsonl.gz"
        eval_set = DATA / "alpaca_eval" / "eval_set.jsonl"
        boards = sorted((DATA / "alpaca_eval" / "leaderboards" / "data_AlpacaEval").glob("*.csv"))
        with tempfile.TemporaryDirectory() as tmp:
            cases = [
                ("farm-winrate", [str(annotations), "--format", "jsonl"]),
                ("farm-winrate", [str(annotations), "--format", "table", "--bootstrap", "50"]),
                ("farm-split", [str(eval_set), "--tag", "--sizes", "a=0.7,b=0.3", "--seed", "5"]),
                ("farm-correlate", [str(p) for p in boards[:2]]),
                ("farm-winrate", ["-"]),  # bad input on stdin: the error text
            ]
            for tool, args in cases:
                stdin = b'{"preference": 1}\nnot json\n' if args == ["-"] else None
                a = command(before, tool, args, stdin)
                b = command(after, tool, args, stdin)
                same = (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
                runs.append(
                    f"{'same' if same else 'DIFFERENT'}  rc={a.returncode}/{b.returncode} "
                    f"out={len(a.stdout)}B  {tool} {' '.join(Path(x).name for x in args)}"
                )
            del tmp
    return {
        "help_identical": f"{help_same}/{len(tools)}",
        "help_only_moved_names_and_wrapping": help_rewrapped,
        "help_different": help_diff,
        "runs": runs,
    }


def main() -> int:
    before, after = (Path(arg).resolve() for arg in sys.argv[1:3])
    for name, tree in (("before", before), ("after", after)):
        print(f"== {name}: {tree}")
        for key, value in audit(tree).items():
            print(f"  {key}: {value}")
    print("== behaviour, before vs after")
    for key, value in behaviour(before, after).items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
