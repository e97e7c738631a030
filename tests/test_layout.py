"""The package layout (issue 24): no import circle among farmkit's modules, and the plumbing
(farmkit.core) imports nothing of farmkit above it. Read from the code by docs_diagrams.import_graph,
lazy imports inside functions included (only `if TYPE_CHECKING:` imports, which never run, are not)."""

from __future__ import annotations

from dev.diagrams import import_circles, import_graph

# what farmkit.core may import: itself, and the package's __init__ (the version string)
CORE = "farmkit.core"


def test_no_import_circles():
    circles = import_circles(import_graph())
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_core_imports_nothing_above_it():
    graph = import_graph()
    core = [module for module in graph if module == CORE or module.startswith(CORE + ".")]
    assert core, "no farmkit.core package: the plumbing has no home"
    upward = sorted(
        f"{module} -> {target}"
        for module in core
        for target in graph[module]
        if target != "farmkit" and target != CORE and not target.startswith(CORE + ".")
    )
    assert upward == [], "farmkit.core imports from above it: " + ", ".join(upward)


def test_graph_sees_lazy_imports_but_not_type_checking(tmp_path, monkeypatch):
    """The checker itself: an import inside a function is an edge, one under TYPE_CHECKING is not."""
    from dev import diagrams as docs_diagrams

    package = tmp_path / "farmkit"
    (package / "core").mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "a.py").write_text("def f():\n    from farmkit.top import g\n")
    (package / "top.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from farmkit.core import a\n"
    )
    monkeypatch.setattr(docs_diagrams, "ROOT", tmp_path)
    graph = docs_diagrams.import_graph()
    assert graph["farmkit.core.a"] == {"farmkit.top"}
    assert graph["farmkit.top"] == set()
    (package / "top.py").write_text("import farmkit.core.a\n")
    graph = docs_diagrams.import_graph()
    assert docs_diagrams.import_circles(graph) == [["farmkit.core.a", "farmkit.top"]]
