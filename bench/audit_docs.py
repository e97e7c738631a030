"""Audit of the docs site on fresh cases (not part of the test suite): copies a checkout's README,
docs/, mkdocs.yml, pyproject.toml and code into a temporary folder, changes a page or the code as a
contributor would, checks and regenerates the generated parts with that checkout's
`python -m dev.docs --site [--check]` and builds the site with `mkdocs build --strict`, then
checks what followed. The pages are hand-written (docs/ is the source); the generator owns each tool
page's --help block, the diagrams and the nav.

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
        "import dev.docs as d; root = Path(sys.argv[1]); d.ROOT = root; d.DOCS = root / 'docs'; "
        "sys.exit(d.main(sys.argv[2:]))"
    )
    args = [sys.executable, "-c", code, str(copy), "--site"] + (["--check"] if check else [])
    return run(args, copy)


def build(copy: Path) -> subprocess.CompletedProcess:
    return run([str(MKDOCS), "build", "--strict", "-f", "mkdocs.yml", "-d", "site"], copy)


def paragraph_edit(text: str, heading: str, addition: str) -> str:
    """TEXT with ADDITION put right after the first paragraph under the line starting HEADING."""
    start = text.index(heading)
    cut = text.index("\n\n", text.index("\n\n", start) + 2)
    return text[:cut] + "\n\n" + addition + text[cut:]


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

    def case(name: str, change, verify, expect_build: bool = True, expect_generate: bool = True):
        with tempfile.TemporaryDirectory() as tmp:
            copy = fresh_copy(repo, Path(tmp))
            if not (copy / "mkdocs.yml").exists():
                results.append((name, False, "no mkdocs.yml: no docs site in this checkout"))
                return
            change(copy)
            stale = generate(copy, check=True)
            written = generate(copy)
            if not expect_generate:  # the generator must refuse: verify what it said
                problem = None if written.returncode else "the generator did not refuse"
                problem = problem or verify(copy, stale)
                results.append((name, problem is None, problem or ""))
                return
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

    def page(copy: Path, name: str, addition: str) -> None:
        path = copy / "docs" / name
        path.write_text(paragraph_edit(path.read_text(), "# ", addition))

    # 1. a sentence added to a tool's page is the page's own text: not stale, kept, built
    sentence = "Audit sentence: best-of-n keeps every tie."
    case(
        "tool page edited",
        lambda c: page(c, "tools/farm-bon.md", sentence),
        lambda c, stale: (
            None
            if sentence in (c / "docs/tools/farm-bon.md").read_text()
            and sentence in html(c, "tools/farm-bon.html")
            and stale.returncode == 0
            else f"the sentence was lost, or --check called hand text stale (rc {stale.returncode})"
        ),
    )

    # 2. a stale --help block: --check says so first, the generator puts the command's own back
    def stale_help(c: Path) -> None:
        path = c / "docs/tools/farm-split.md"
        path.write_text(path.read_text().replace("Usage: farm-split", "Usage: farm-splat", 1))

    case(
        "stale --help block",
        stale_help,
        lambda c, stale: (
            None
            if stale.returncode == 1
            and "Usage: farm-splat" not in (c / "docs/tools/farm-split.md").read_text()
            and "Usage: farm-split" in html(c, "tools/farm-split.html")
            else f"--check missed it (rc {stale.returncode}) or the block was not refreshed"
        ),
    )
    # 3. links to headings of other pages
    case(
        "anchors into other pages",
        lambda c: page(
            c,
            "tools/farm-rloo.md",
            "See [exit codes](../exit-codes.md) and [significance](../demo.md#significance-in-the-report).",
        ),
        lambda c, stale: (
            None
            if 'href="../exit-codes.html"' in html(c, "tools/farm-rloo.html")
            and 'href="../demo.html#significance-in-the-report"' in html(c, "tools/farm-rloo.html")
            else "the links did not reach the pages and headings"
        ),
    )
    # 4. a list (nested at two spaces) right after a paragraph line: --check says the page is
    # stale, the generator puts it in Python-Markdown's form, and it renders as a nested list
    case(
        "GitHub-style list",
        lambda c: page(
            c,
            "tools/farm-score.md",
            "Audit list:\n- audit alpha\n  - audit nested beta\n- audit gamma",
        ),
        lambda c, stale: (
            None
            if stale.returncode == 1
            and re.search(
                r"<li>audit alpha\s*<ul>\s*<li>audit nested beta</li>",
                html(c, "tools/farm-score.html"),
            )
            else f"--check missed it (rc {stale.returncode}) or it did not render as a nested list"
        ),
    )

    # 5. a new console script: --check names the missing page; once written, it gets its --help
    # block and a place in the nav
    def new_tool(c: Path, with_page: bool) -> None:
        pyproject = c / "pyproject.toml"
        pyproject.write_text(
            pyproject.read_text().replace(
                'farm-split = "farmkit.tools.farm_split:main"',
                'farm-split = "farmkit.tools.farm_split:main"\nfarm-audit = "farmkit.tools.farm_split:main"',
            )
        )
        if with_page:
            marker = (
                "<!-- farm-audit --help: generated by `python -m dev.docs --site`, do not edit -->"
            )
            (c / "docs/tools/farm-audit.md").write_text(
                f"# farm-audit: a tool added later\n\nIt audits.\n\n## Options\n\n{marker}\n"
                "<!-- end farm-audit --help -->\n"
            )

    case(
        "new tool without a page",
        lambda c: new_tool(c, with_page=False),
        lambda c, stale: (
            None
            if stale.returncode == 1 and "farm-audit.md is missing" in stale.stderr
            else f"--check did not name the missing page (rc {stale.returncode})"
        ),
        expect_generate=False,
    )
    case(
        "new tool with its page",
        lambda c: new_tool(c, with_page=True),
        lambda c, stale: (
            None
            if (c / "site/tools/farm-audit.html").exists()
            and "tools/farm-audit.md" in (c / "mkdocs.yml").read_text()
            and "Usage: farm-audit" in (c / "docs/tools/farm-audit.md").read_text()
            else "no page, no nav entry or no --help for the new tool"
        ),
    )
    # 6. a broken anchor fails the strict build
    case(
        "broken anchor fails",
        lambda c: page(
            c, "tools/farm-sft.md", "See [nowhere](../demo.md#no-such-heading-anywhere)."
        ),
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
