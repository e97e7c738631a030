"""The package layout (issues 24 and 38): no import circle among farmkit's modules, and every import
follows the layers: tools -> cli -> pillars (annotate, methods, evaluate) -> train -> lm -> core, the
pillars not importing each other. Read from the code by dev.diagrams.import_graph, lazy imports
inside functions included (only `if TYPE_CHECKING:` imports, which never run, are not)."""

from __future__ import annotations

from dev.diagrams import import_circles, import_graph, layer_breaks


def test_no_import_circles():
    circles = import_circles(import_graph())
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_every_import_follows_the_layers():
    breaks = layer_breaks(import_graph())
    assert breaks == [], (
        "imports against the layers (tools -> cli -> annotate | methods | evaluate -> train -> lm "
        "-> core; lazy imports count): " + ", ".join(f"{m} -> {t}" for m, t in breaks)
    )


def _package(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_graph_sees_lazy_imports_but_not_type_checking(tmp_path, monkeypatch):
    """The checker itself: an import inside a function is an edge, one under TYPE_CHECKING is not."""
    from dev import diagrams

    (tmp_path / "tools").mkdir()
    _package(
        tmp_path / "farmkit",
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "def f():\n    from farmkit.top import g\n",
            "top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from farmkit.core import a\n",
        },
    )
    monkeypatch.setattr(diagrams, "ROOT", tmp_path)
    graph = diagrams.import_graph()
    assert graph["farmkit.core.a"] == {"farmkit.top"}
    assert graph["farmkit.top"] == set()
    (tmp_path / "farmkit" / "top.py").write_text("import farmkit.core.a\n")
    graph = diagrams.import_graph()
    assert diagrams.import_circles(graph) == [["farmkit.core.a", "farmkit.top"]]


def test_the_layer_rule_reports_upward_and_sideways_imports_lazy_ones_too(tmp_path, monkeypatch):
    """A planted lazy import from lm up to a pillar, and one from a pillar to another, are reported;
    imports down the layers, within a package, of farmkit/__init__ (the version string) and under
    TYPE_CHECKING are not."""
    from dev import diagrams

    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "farm_x.py").write_text("from farmkit import cli\n")
    _package(
        tmp_path / "farmkit",
        {
            "__init__.py": "__version__ = '0'\n",
            "cli.py": "from farmkit.annotate import pools\n",
            "annotate/__init__.py": "",
            "annotate/pools.py": "from farmkit.train import loop\nfrom farmkit.annotate import cost\n",
            "annotate/cost.py": "from farmkit import __version__\n",
            "evaluate/__init__.py": "",
            "evaluate/board.py": "def f():\n    from farmkit.annotate import pools\n",
            "train/__init__.py": "",
            "train/loop.py": "from farmkit.lm import sampling\n",
            "lm/__init__.py": "",
            "lm/sampling.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from farmkit import cli\nfrom farmkit.core import io\n"
            "def f():\n    from farmkit.annotate.cost import estimate\n",
            "core/__init__.py": "",
            "core/io.py": "",
        },
    )
    monkeypatch.setattr(diagrams, "ROOT", tmp_path)
    assert diagrams.layer_breaks(diagrams.import_graph()) == [
        ("farmkit.evaluate.board", "farmkit.annotate"),  # the package's __init__ runs first
        ("farmkit.evaluate.board", "farmkit.annotate.pools"),
        ("farmkit.lm.sampling", "farmkit.annotate.cost"),
    ]
