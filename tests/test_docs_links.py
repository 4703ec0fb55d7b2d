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
