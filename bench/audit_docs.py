"""Audit of the docs site on fresh cases (not part of the test suite): copies a checkout's README,
docs/, mkdocs.yml, pyproject.toml and code into a temporary folder, changes the README as a
contributor would, regenerates the pages with that checkout's `python -m farmkit.docs --site` and
builds them with `mkdocs build --strict`, then checks that the pages followed.

    .venv/bin/python bench/audit_docs.py [--repo PATH]    # default: this checkout

Prints one line per case (ok / FAIL and why) and a JSON summary; exit 0 when every case passed."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)


def generate(copy: Path, check: bool = False) -> subprocess.CompletedProcess:
    """The copy's own generator, its ROOT pointed at the copy (the tools import from the install)."""
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "import farmkit.docs as d; root = Path(sys.argv[1]); d.ROOT = root; d.DOCS = root / 'docs'; "
        "sys.exit(d.main(sys.argv[2:]))"
    )
    args = [sys.executable, "-c", code, str(copy), "--site"] + (["--check"] if check else [])
    return run(args, copy)


def build(copy: Path) -> subprocess.CompletedProcess:
    return run([str(MKDOCS), "build", "--strict", "-f", "mkdocs.yml", "-d", "site"], copy)


def section_edit(readme: str, heading: str, addition: str) -> str:
    """README with ADDITION put right after the first paragraph of the section HEADING."""
    start = readme.index(heading)
    cut = readme.index("\n\n", start + len(heading) + 2)
    return readme[:cut] + "\n\n" + addition + readme[cut:]


def fresh_copy(repo: Path, into: Path) -> Path:
    copy = into / "repo"
    copy.mkdir()
    for name in ("README.md", "pyproject.toml", "mkdocs.yml"):
        if (repo / name).exists():
            shutil.copy(repo / name, copy / name)
    for name in ("docs", "farmkit", "tools", "bench", "examples", "schemas"):
        if (repo / name).exists():
            shutil.copytree(
                repo / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "runs")
            )
    return copy


def html(copy: Path, page: str) -> str:
    return (copy / "site" / page).read_text(encoding="utf-8")


def cases(repo: Path) -> list[tuple[str, bool, str]]:
    results = []

    def case(name: str, change, verify, expect_build: bool = True) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            copy = fresh_copy(repo, Path(tmp))
            if not (copy / "mkdocs.yml").exists():
                results.append((name, False, "no mkdocs.yml: no docs site in this checkout"))
                return
            change(copy)
            stale = generate(copy, check=True)
            written = generate(copy)
            if written.returncode:
                results.append((name, False, "generator failed: " + written.stderr.strip()[-300:]))
                return
            built = build(copy)
            if (built.returncode == 0) != expect_build:
                why = built.stderr.strip()[-300:] or "built although it should not have"
                results.append((name, False, f"mkdocs --strict rc {built.returncode}: {why}"))
                return
            problem = verify(copy, stale)
            results.append((name, problem is None, problem or ""))

    def readme(copy: Path, heading: str, addition: str) -> None:
        path = copy / "README.md"
        path.write_text(section_edit(path.read_text(), heading, addition))

    # 1. a sentence added to a tool's section shows on its page, and --check said stale first
    case(
        "tool section edited",
        lambda c: readme(c, "### farm-bon:", "Audit sentence: best-of-n keeps every tie."),
        lambda c, stale: (
            None
            if "Audit sentence: best-of-n keeps every tie."
            in (c / "docs/tools/farm-bon.md").read_text()
            and stale.returncode == 1
            else f"page did not follow or --check missed it (check rc {stale.returncode})"
        ),
    )
    # 2. a link to a repository file without a page of its own
    case(
        "link to a repository file",
        lambda c: readme(
            c, "### farm-dpo:", "The sizes are in [the size table](examples/sizes.mk)."
        ),
        lambda c, stale: (
            None
            if "examples/sizes.mk" in html(c, "tools/farm-dpo.html")
            else "the link's target is gone from the page"
        ),
    )
    # 3. links to headings of other sections (README anchors)
    case(
        "anchors into other sections",
        lambda c: readme(
            c,
            "### farm-rloo:",
            "See [exit codes](#exit-codes) and [scaling out](#scaling-out-one-gpu-several-gpus-several-machines).",
        ),
        lambda c, stale: (
            None
            if 'href="../exit-codes.html#exit-codes"' in html(c, "tools/farm-rloo.html")
            and 'href="../scaling.html#scaling-out-one-gpu-several-gpus-several-machines"'
            in html(c, "tools/farm-rloo.html")
            else "anchor links not sent to the pages that carry the headings"
        ),
    )
    # 4. a list (nested at two spaces) right after a paragraph line renders as a list
    case(
        "GitHub-style list",
        lambda c: readme(
            c, "### farm-score:", "Audit list:\n- audit alpha\n  - audit nested beta\n- audit gamma"
        ),
        lambda c, stale: (
            None
            if re.search(
                r"<li>audit alpha\s*<ul>\s*<li>audit nested beta</li>",
                html(c, "tools/farm-score.html"),
            )
            else "the list did not render as a nested list"
        ),
    )

    # 5. a new console script with a README section gets a page in the nav
    def new_tool(c: Path) -> None:
        pyproject = c / "pyproject.toml"
        pyproject.write_text(
            pyproject.read_text().replace(
                'farm-split = "farmkit.tools.farm_split:main"',
                'farm-split = "farmkit.tools.farm_split:main"\nfarm-audit = "farmkit.tools.farm_split:main"',
            )
        )
        path = c / "README.md"
        text = path.read_text()
        text = text.replace(
            "## Exit codes", "### farm-audit: a tool added later\n\nIt audits.\n\n## Exit codes", 1
        )
        path.write_text(text)

    case(
        "new tool",
        new_tool,
        lambda c, stale: (
            None
            if (c / "site/tools/farm-audit.html").exists()
            and "tools/farm-audit.md" in (c / "mkdocs.yml").read_text()
            and "Usage: farm-audit" in (c / "docs/tools/farm-audit.md").read_text()
            else "no page, no nav entry or no --help for the new tool"
        ),
    )

    # 6. the source flips: a page made hand-written keeps its text when the README section goes
    def flip(c: Path) -> None:
        page = c / "docs/tools/farm-plot.md"
        lines = page.read_text().split("\n", 1)
        page.write_text(lines[1].replace("# farm-plot:", "# farm-plot (hand-written):", 1))
        path = c / "README.md"
        text = path.read_text()
        start = text.index("### farm-plot:")
        end = text.index("\n## ", start)
        path.write_text(text[:start] + text[end + 1 :])

    case(
        "source flipped to docs/",
        flip,
        lambda c, stale: (
            None
            if "farm-plot (hand-written)" in html(c, "tools/farm-plot.html")
            and "Usage: farm-plot" in html(c, "tools/farm-plot.html")
            else "the hand-written page lost its text or its --help"
        ),
    )
    # 7. a broken anchor fails the strict build
    case(
        "broken anchor fails",
        lambda c: readme(c, "### farm-sft:", "See [nowhere](#no-such-heading-anywhere)."),
        lambda c, stale: None,
        expect_build=False,
    )
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, default=HERE)
    repo = parser.parse_args().repo.resolve()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        copy = fresh_copy(repo, Path(tmp))
        scripts = re.findall(r"^(farm-[\w-]+) = ", (copy / "pyproject.toml").read_text(), re.M)
        pages = (
            sorted(p.name for p in (copy / "docs/tools").glob("farm-*.md"))
            if (copy / "docs/tools").exists()
            else []
        )
        build_s, built = None, None
        if (copy / "mkdocs.yml").exists():
            t = time.monotonic()
            built = build(copy).returncode == 0
            build_s = round(time.monotonic() - t, 2)
            html_pages = len(list((copy / "site").rglob("*.html"))) if built else 0
        else:
            html_pages = 0
    results = cases(repo)
    for name, ok, why in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + why if why else ''}")
    summary = {
        "repo": str(repo),
        "console_scripts": len(scripts),
        "tool_pages": sum(f"{s}.md" in pages for s in scripts),
        "strict_build_passes": built,
        "build_seconds": build_s,
        "html_pages": html_pages,
        "fresh_cases_passed": sum(ok for _, ok, _ in results),
        "fresh_cases": len(results),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary))
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
