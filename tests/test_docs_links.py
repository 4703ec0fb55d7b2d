"""README and docs stand alone: every relative link resolves to a file inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _relative_targets(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


def test_the_link_pattern_finds_links_and_images() -> None:
    text = "see [mesh](docs/mesh.md) and ![pic](docs/a.png) but not [web](https://x.org)"
    assert [m.group(1) for m in LINK.finditer(text)] == [
        "docs/mesh.md",
        "docs/a.png",
        "https://x.org",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    for target in _relative_targets(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert path.exists(), f"{page.name} links to a missing file: {target}"


def test_no_page_points_at_the_shared_folder() -> None:
    for page in PAGES:
        assert "../shared" not in page.read_text(encoding="utf-8"), page.name


# The design contract the code was written against is not part of the repository: the
# code and the pages point readers at docs/*.md instead (issue 24 item 9).
_CITES_DESIGN = re.compile(r"DESIGN(?:\.md|\s*§|\s+section\b|:)")
_DOC_REF = re.compile(r"docs/([A-Za-z0-9_-]+\.md)(?:#([a-z0-9-]+))?")
_SOURCES = sorted((ROOT / "src").rglob("*.py"))


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces -> '-'."""
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_design_citation_pattern_finds_citations() -> None:
    cited = ["see DESIGN" + ".md", "(DESIGN " + "§8)", "DESIGN" + " section 8", "(DESIGN" + ": x)"]
    assert all(_CITES_DESIGN.search(text) for text in cited)
    assert not _CITES_DESIGN.search("docs/design.md explains the design")


@pytest.mark.parametrize("path", [*_SOURCES, *PAGES], ids=lambda p: str(Path(p).relative_to(ROOT)))
def test_nothing_cites_the_design_file_outside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [m.group(0) for m in _CITES_DESIGN.finditer(text)]
    assert not found, f"{path.relative_to(ROOT)} cites {found}: point at docs/*.md instead"


def test_every_docs_page_a_docstring_names_exists_with_its_section() -> None:
    for source in _SOURCES:
        for page, anchor in _DOC_REF.findall(source.read_text(encoding="utf-8")):
            target = ROOT / "docs" / page
            assert target.is_file(), f"{source.relative_to(ROOT)} names a missing docs/{page}"
            if anchor:
                assert anchor in _anchors(target), (
                    f"{source.relative_to(ROOT)}: docs/{page} has no section #{anchor}"
                )
