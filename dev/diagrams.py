"""The two pictures of docs/architecture.md, written as plain SVG (no Graphviz, no JavaScript) so
that the site shows them offline and `python -m dev.docs --site --check` notices when they are
stale: the tools' pipeline, and farmkit's modules by layer with the imports between them, read from
the real code (`import_graph`, `import_circles`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = [
    "tools/",
    "cli",
    "annotate/",
    "methods/",
    "evaluation",
    "train/",
    "models and sampling",
    "plumbing",
]
# The layers, top to bottom: a module imports its own group and the rows below it; the pillars
# (one row) do not import each other. farmkit/__init__ (the version string) is imported from anywhere.
ROWS = [
    ["tools/"],
    ["cli"],
    ["annotate/", "methods/", "evaluation"],
    ["train/"],
    ["models and sampling"],
    ["plumbing"],
]
ROW = {group: number for number, groups in enumerate(ROWS) for group in groups}
# top-level modules of farmkit by group; a subpackage is its own group ("annotate/", "methods/"),
# an evaluate/ or evaluation/ package is "evaluation", anything unnamed is "models and sampling"
MODULE_GROUPS = {
    "plumbing": {"io", "records", "validate", "formats", "seeds", "split", "runs"},
    "evaluation": {
        "winrate",
        "length_control",
        "correlate",
        "history",
        "plots",
        "metrics",
        "overopt",
    },
    "cli": {"cli", "__init__"},
}


def _group(module: str) -> str:
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in ("tools", "annotate", "methods", "train"):
        return parts[0] + "/"
    if parts[0] in ("evaluate", "evaluation"):
        return "evaluation"
    if parts[0] == "core":
        return "plumbing"
    if parts[0] == "lm":
        return "models and sampling"
    return next(
        (g for g, names in MODULE_GROUPS.items() if parts[0] in names), "models and sampling"
    )


def _type_only(tree):
    """The nodes under `if TYPE_CHECKING:` (imports for annotations only: they never run, so they
    make no circle)."""
    import ast

    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def import_graph() -> dict[str, set[str]]:
    """farmkit module -> the farmkit modules it imports (anywhere in its file, lazy imports too;
    not the ones under `if TYPE_CHECKING:`, which never run)."""
    import ast

    files = {
        "farmkit." + ".".join(p.relative_to(ROOT / "farmkit").with_suffix("").parts): p
        for p in (ROOT / "farmkit").rglob("*.py")
    }
    files |= {f"farmkit.tools.{p.stem}": p for p in (ROOT / "tools").glob("*.py")}
    files = {m.removesuffix(".__init__"): p for m, p in files.items()}
    graph: dict[str, set[str]] = {}
    for module, path in sorted(files.items()):
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        type_only = _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def against_layers(source: str, target: str) -> bool:
    """Whether an import from group SOURCE to group TARGET goes up the layers or across the pillars."""
    return source != target and ROW[target] <= ROW[source]


def layer_breaks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, imported module) of every import against the layers, sorted."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if target != "farmkit" and against_layers(_group(module), _group(target))
    )


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(box: tuple[float, float, float, float], toward: tuple[float, float]):
    """Where the line from BOX's centre toward a point leaves the box."""
    x, y, w, h = box
    cx, cy = x + w / 2, y + h / 2
    dx, dy = toward[0] - cx, toward[1] - cy
    scale = min(w / 2 / abs(dx) if dx else 1e9, h / 2 / abs(dy) if dy else 1e9)
    return cx + dx * scale, cy + dy * scale


SVG_HEAD = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
    'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">\n'
    '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
    'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker>'
    "</defs>\n"
    '<rect width="100%" height="100%" fill="#ffffff"/>\n'
)


def _line(start: tuple[float, float], end: tuple[float, float]) -> str:
    return (
        f'<line x1="{start[0]:.1f}" y1="{start[1]:.1f}" x2="{end[0]:.1f}" y2="{end[1]:.1f}" '
        'stroke="#555" stroke-width="1.3" marker-end="url(#arrow)"/>\n'
    )


def _wrap(names: list[str], limit: int) -> list[str]:
    lines, line = [], ""
    for name in names:
        if line and len(line) + len(name) + 2 > limit:
            lines.append(line)
            line = ""
        line += ("  " if line else "") + name
    return lines + [line]


def packages_svg(graph: dict[str, set[str]]) -> str:
    """Left: farmkit's modules in their layers (tools on top, plumbing at the bottom). Right: how
    many imports go from each group (row) to each other (column); red cells go up the layers or
    from one pillar to another (against_layers), which the layering forbids. Imports of
    farmkit/__init__ (the version string, allowed from anywhere) are not counted. Below: the
    import circles."""
    members: dict[str, list[str]] = {group: [] for group in LAYERS}
    for module in graph:
        members[_group(module)].append("__init__" if module == "farmkit" else module.split(".")[-1])
    left, span, gap, char = 20, 560, 12, 6.7
    parts, y = [], 20
    for groups in ROWS:
        box_width = (span - gap * (len(groups) - 1)) / len(groups)
        wrapped = {g: _wrap(sorted(members[g]), int((box_width - 16) / char)) for g in groups}
        height = 30 + 14 * max(len(lines) for lines in wrapped.values())
        for column, group in enumerate(groups):
            x = left + column * (box_width + gap)
            parts.append(
                f'<rect x="{x:.0f}" y="{y}" width="{box_width:.0f}" height="{height}" rx="8" '
                'fill="#eef3fb" stroke="#3f6fb5"/>\n'
                f'<text x="{x + 8:.0f}" y="{y + 18}" font-weight="bold" font-size="13">'
                f"{_escape(group)} ({len(members[group])})</text>\n"
            )
            for number, text in enumerate(wrapped[group]):
                parts.append(
                    f'<text x="{x + 8:.0f}" y="{y + 34 + number * 14}" font-size="11" '
                    f'font-family="DejaVu Sans Mono, monospace" fill="#333">{_escape(text)}</text>\n'
                )
        y += height + gap
    boxes_bottom = y
    order = [group for groups in ROWS for group in groups]
    counts: dict[tuple[str, str], int] = {}
    for module, targets in graph.items():
        for target in targets - {"farmkit"}:
            pair = (_group(module), _group(target))
            if pair[0] != pair[1]:
                counts[pair] = counts.get(pair, 0) + 1
    mx, my, cell, label = left + span + 40, 120, 44, 130
    parts.append(
        f'<text x="{mx}" y="20" font-weight="bold" font-size="13">imports: row group -&gt; '
        "column group</text>\n"
    )
    for index, group in enumerate(order):
        cx = mx + label + index * cell + cell / 2
        parts.append(
            f'<text x="{cx:.0f}" y="{my - 6}" font-size="11" '
            f'transform="rotate(-45 {cx:.0f} {my - 6})">{_escape(group)}</text>\n'
            f'<text x="{mx + label - 6}" y="{my + index * cell + cell / 2 + 4:.0f}" font-size="11" '
            f'text-anchor="end">{_escape(group)}</text>\n'
        )
    for row, source in enumerate(order):
        for column, target in enumerate(order):
            count = counts.get((source, target), 0)
            upward = against_layers(source, target)
            fill = "#f5f5f5" if source == target else ("#ffcdd2" if upward and count else "#ffffff")
            x, cy = mx + label + column * cell, my + row * cell
            parts.append(
                f'<rect x="{x}" y="{cy}" width="{cell}" height="{cell}" fill="{fill}" '
                'stroke="#bbb"/>\n'
            )
            if count:
                colour = "#b71c1c" if upward else "#333"
                parts.append(
                    f'<text x="{x + cell / 2:.0f}" y="{cy + cell / 2 + 4:.0f}" font-size="12" '
                    f'text-anchor="middle" fill="{colour}">{count}</text>\n'
                )
    note_y = my + len(order) * cell + 24
    parts.append(
        f'<text x="{mx}" y="{note_y}" font-size="11" fill="#333">Above the diagonal: imports down '
        "the layers. Red: imports up</text>\n"
        f'<text x="{mx}" y="{note_y + 14}" font-size="11" fill="#333">(or between the pillars); '
        "lazy imports included.</text>\n"
    )
    circles = import_circles(graph)
    y = max(boxes_bottom, note_y + 30) + 8
    parts.append(
        f'<text x="{left}" y="{y}" font-size="13" font-weight="bold">Import circles among the '
        f"modules: {len(circles) or 'none'}</text>\n"
    )
    for number, circle in enumerate(circles, 1):
        names = ", ".join(m.removeprefix("farmkit.") for m in circle)
        names = names if len(names) <= 160 else names[:157] + "..."
        parts.append(
            f'<text x="{left + 10}" y="{y + 16 * number}" font-size="11" fill="#b71c1c">'
            f"{number}. {_escape(names)}</text>\n"
        )
    width, height = mx + label + len(order) * cell + 110, y + 16 * len(circles) + 14
    return SVG_HEAD.format(w=int(width), h=int(height)) + "".join(parts) + "</svg>\n"


# the tools' pipeline: node -> (column, row, label); edges: (from, to, record kind on the arrow)
PIPELINE_NODES = {
    "split": (0, 0, "farm-split"),
    "sft": (1, 0, "farm-sft"),
    "sample": (2, 0, "farm-sample"),
    "annotate": (3, 0, "farm-annotate"),
    "rm": (4, 0, "farm-rm-train"),
    "dpo": (3, 1, "farm-dpo,\nfarm-online-dpo"),
    "rl": (4, 1, "farm-ppo, farm-rloo,\nfarm-grpo, farm-quark,\nfarm-expiter, farm-bon"),
    "eval_sample": (1, 2, "farm-sample\n(val prompts)"),
    "eval_annotate": (2, 2, "farm-annotate\n--reference ref.jsonl"),
    "winrate": (3, 2, "farm-winrate"),
    "correlate": (4, 2, "farm-correlate,\nfarm-plot"),
}
PIPELINE_EDGES = [
    ("split", "sft", "instruction"),
    ("sft", "sample", "SFT model"),
    ("sample", "annotate", "output x2"),
    ("annotate", "rm", "preference"),
    ("annotate", "dpo", "preference"),
    ("rm", "rl", "reward model"),
    ("dpo", "eval_sample", "policy"),
    ("rl", "eval_sample", "policy"),
    ("eval_sample", "eval_annotate", "output"),
    ("eval_annotate", "winrate", "preference"),
    ("winrate", "correlate", "leaderboard"),
]


def pipeline_svg() -> str:
    width, box_w, box_h, col, row = 1200, 178, 58, 250, 120
    boxes = {
        key: (20 + c * col, 30 + r * row, box_w, box_h) for key, (c, r, _) in PIPELINE_NODES.items()
    }
    parts = []
    for source, target, label in PIPELINE_EDGES:
        a, b = boxes[source], boxes[target]
        start = _clip(a, (b[0] + box_w / 2, b[1] + box_h / 2))
        end = _clip(b, (a[0] + box_w / 2, a[1] + box_h / 2))
        parts.append(_line(start, end))
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        parts.append(
            f'<text x="{mx:.0f}" y="{my - 5:.0f}" text-anchor="middle" font-size="11" '
            f'fill="#1b5e20" font-style="italic">{_escape(label)}</text>\n'
        )
    for key, (_, _, label) in PIPELINE_NODES.items():
        x, y, w, h = boxes[key]
        parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="#fff8e1" stroke="#b26a00"/>\n'
        )
        lines = label.split("\n")
        for number, text in enumerate(lines):
            ty = y + h / 2 + 4 + (number - (len(lines) - 1) / 2) * 14
            parts.append(
                f'<text x="{x + w / 2:.0f}" y="{ty:.0f}" text-anchor="middle" '
                f'font-family="DejaVu Sans Mono, monospace" font-size="11.5">{_escape(text)}</text>\n'
            )
    height = 30 + 3 * row
    note = (
        f'<text x="20" y="{height - 20}" font-size="12" fill="#333">Boxes: commands; arrows: what '
        "flows between them (JSONL records, or a model folder); every arrow is a file or a pipe.</text>\n"
    )
    return SVG_HEAD.format(w=width, h=height) + "".join(parts) + note + "</svg>\n"


def diagrams() -> dict[str, str]:
    """docs/ file name -> SVG text."""
    return {"pipeline.svg": pipeline_svg(), "packages.svg": packages_svg(import_graph())}
