"""Markdown to safe HTML for farm-label's page: model outputs and the guidelines, rendered on the
server by markdown-it-py (CommonMark, tables and strikethrough) with raw HTML off, so an output's
`<script>` or `<img onerror=...>` arrives as the characters it is. Links keep only http(s) targets
(a `javascript:` or `data:` link, a path or `mailto:` stays text), open in a new tab without the
page's address, and images are not rendered (the page loads nothing from elsewhere): an image's
markdown is a `!` and a link to its address."""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

from markdown_it import MarkdownIt


def _web_link(url: str) -> bool:
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)


def _link_open(renderer, tokens, index, options, env) -> str:
    tokens[index].attrSet("target", "_blank")
    tokens[index].attrSet("rel", "noopener noreferrer nofollow")
    return renderer.renderToken(tokens, index, options, env)


@lru_cache(maxsize=1)
def _renderer() -> MarkdownIt:
    # "breaks": a line break in an output is one on the page, as when it was shown as plain text
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False})
    md.enable(["table", "strikethrough"])
    md.disable("image")
    md.validateLink = _web_link
    md.add_render_rule("link_open", _link_open)
    return md


def markdown_html(text: str) -> str:
    """TEXT (markdown, untrusted) as HTML in which no tag, attribute or link comes from TEXT's raw
    HTML: what the page may set as innerHTML."""
    return _renderer().render(text)
