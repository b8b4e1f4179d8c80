"""docs/architecture.dot is what scripts/diagram.py draws from the layout test's rules now, and the committed SVG
was rendered from it; the README's layout table names every subpackage of those rules, and only those, with the
imports they allow."""

from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import markdown

from tests.test_layout import ALLOWED, PACKAGE

ROOT = Path(__file__).resolve().parent.parent
SVG_NS = "{http://www.w3.org/2000/svg}"


def diagram() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diagram", ROOT / "scripts" / "diagram.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_diagram_source_is_what_the_script_writes_now() -> None:
    assert (ROOT / "docs" / "architecture.dot").read_text() == diagram().current_source(), (
        "docs/architecture.dot is stale: run .venv/bin/python scripts/diagram.py and commit both files"
    )


def test_the_committed_svg_was_rendered_from_that_source() -> None:
    # Graphviz titles every node and edge of its SVG with their names: compare those, not the bytes.
    module = diagram()
    allowed = {name: set(deps) for name, deps in ALLOWED.items()}
    engines = module.engine_packages(PACKAGE)
    nodes = set(allowed) | {f"engines/{engine}" for engine in engines}
    edges = {f"{a}->{b}" for a, b in module.reduced_edges(allowed)} | {f"engines->engines/{e}" for e in engines}
    svg = ET.parse(ROOT / "docs" / "architecture.svg").getroot()
    titles = {
        kind: {g.findtext(f"{SVG_NS}title") for g in svg.iter(f"{SVG_NS}g") if g.get("class") == kind}
        for kind in ("node", "edge")
    }
    assert titles["node"] == nodes
    assert {t.replace("&#45;", "-") for t in titles["edge"] if t} == edges


def test_the_diagram_shows_an_arrow_the_rules_do_not_allow_as_barred() -> None:
    # Proves the reduction is read honestly: arrows read transitively, so a floor that may import the one below but
    # not the one under that must say so.
    module = diagram()
    allowed = {"top": {"mid"}, "mid": {"low"}, "low": set()}
    source = module.dot_source(allowed, {"kvoffload.engines"}, [])
    assert '"top" -> "mid"' in source
    assert '"top" -> "low"' not in source
    assert "never imports: low" in source
    allowed["top"] |= {"low"}
    assert "never imports" not in module.dot_source(allowed, {"kvoffload.engines"}, [])


class _Tables(HTMLParser):
    """The tables of an HTML page, each under the text of the last h2 before it: rows of cell HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.section = ""
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._heading: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._heading = []
        elif tag == "table":
            self.tables.append((self.section, []))
        elif tag == "tr":
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "code" and self._cell is not None:
            self._cell.append("`")

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2" and self._heading is not None:
            self.section, self._heading = "".join(self._heading).strip(), None
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "code" and self._cell is not None:
            self._cell.append("`")

    def handle_data(self, data: str) -> None:
        for sink in (self._heading, self._cell):
            if sink is not None:
                sink.append(data)


def readme_layout_rows() -> dict[str, set[str]]:
    """The README's layout table (under "## Layout", the one whose header starts "subpackage"): each row's
    subpackage and the subpackages its "may import" cell names."""
    parser = _Tables()
    parser.feed(markdown.markdown((ROOT / "README.md").read_text(), extensions=["tables"]))
    tables = [rows for section, rows in parser.tables if section == "Layout" and rows and rows[0][0] == "subpackage"]
    assert len(tables) == 1, "one layout table under the README's '## Layout'"
    header, *body = tables[0]
    assert header[2] == "may import", header
    return {cells[0].strip("`").rstrip("/"): set(re.findall(r"`([a-z]+)/?`", cells[2])) for cells in body}


def test_the_readme_layout_table_has_a_row_for_every_subpackage_of_the_rules() -> None:
    rows = readme_layout_rows()
    assert sorted(set(ALLOWED) - set(rows)) == [], "subpackages of tests/test_layout.py without a README row"
    assert sorted(set(rows) - set(ALLOWED)) == [], "README rows naming no subpackage of tests/test_layout.py"
    assert sorted(p for p in rows if not (PACKAGE / p / "__init__.py").is_file()) == []


def test_the_readme_layout_table_allows_what_the_layout_test_allows() -> None:
    rows = readme_layout_rows()
    wrong = {name: sorted(rows.get(name, set()) ^ ALLOWED[name]) for name in ALLOWED if rows.get(name) != ALLOWED[name]}
    assert wrong == {}, "README 'may import' cells that differ from ALLOWED (the names that differ)"
