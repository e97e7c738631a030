"""Nothing lost when the README is cut: list the README's paragraphs and code blocks that appear
verbatim in no docs/*.md page (and in no other markdown file the site draws on). Help blocks
(regenerated from --help) and headings are left out. Usage:
    python dev/readme_coverage.py [README] [DOCS_DIR]
Prints one line per missing unit and a count; exit 1 when any is missing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def units(text: str) -> list[str]:
    """Paragraphs and fenced code blocks, each with whitespace normalised."""
    text = re.sub(
        r"<!-- farm-[\w-]+ --help:.*?<!-- end farm-[\w-]+ --help -->\n", "", text, flags=re.S
    )
    out, block, fence = [], [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            block.append(line)
            if fence:
                out.append("\n".join(block))
                block = []
            fence = not fence
            continue
        if fence:
            block.append(line)
        elif not line.strip() or line.startswith("#"):
            if block:
                out.append("\n".join(block))
            block = []
        else:
            block.append(line)
    if block:
        out.append("\n".join(block))
    return [u for u in out if u.strip() and not u.startswith("<!--")]


def norm(text: str) -> str:
    # links are rewritten for the site (README anchors -> pages); compare the visible words
    text = re.sub(r"\[([^\]]*)\]\([^)\s]*\)", r"\1", text)
    text = re.sub(r"`([^`]*)`", r"\1", text)
    return " ".join(text.split())


def main() -> int:
    readme = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "README.md"
    docs = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs"
    corpus = " ".join(norm(p.read_text(encoding="utf-8")) for p in sorted(docs.rglob("*.md")))
    found = units(readme.read_text(encoding="utf-8"))
    missing = [u for u in found if norm(u) not in corpus]
    for unit in missing:
        print("MISSING:", unit.split("\n")[0][:110])
    print(f"{len(missing)} of {len(found)} README paragraphs/code blocks found in no docs page")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
