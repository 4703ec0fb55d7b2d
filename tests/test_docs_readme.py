"""The README's example outputs (and docs/cli.md's abridged plan) are what the commands print.

The blocks are abridged: a line ``...`` stands for lines left out, and a line ending in
``...`` for the start of a longer line; every other line must be a line the command
prints, in order. ``transfer`` and ``checkpoint`` blocks are checked by their own tests
(``tests/test_cli_transfer.py``; the checkpoint ones need files), ``demo`` by
``tests/test_demo.py``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from meshlayout.cli import main

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("plan", "mesh", "shard", "reshard")


def _blocks(page: Path) -> list[tuple[list[str], list[str]]]:
    """(argv, shown lines) of every ``$ meshlayout COMMAND ...`` text block of ``page``."""
    text = page.read_text(encoding="utf-8")
    found = re.findall(r"```text\n\$ meshlayout ((?:[^\n]*\\\n)*[^\n]*)\n(.*?)```", text, re.S)
    blocks = [(shlex.split(cmd.replace("\\\n", " ")), out.splitlines()) for cmd, out in found]
    return [(argv, shown) for argv, shown in blocks if argv[0] in COMMANDS]


def _matches(shown: list[str], printed: list[str]) -> str | None:
    """None when every shown line is printed, in order; else the first line that is not."""
    at = 0
    for line in shown:
        if line == "...":
            continue
        head = line[:-3] if line.endswith("...") else None
        while at < len(printed) and not (
            printed[at] == line or (head is not None and printed[at].startswith(head))
        ):
            at += 1
        if at == len(printed):
            return line
        at += 1
    return None


CASES = [
    (page, argv, shown)
    for page in ("README.md", "docs/cli.md")
    for argv, shown in _blocks(ROOT / page)
    if page == "README.md" or "..." in shown
]


def test_the_blocks_are_found() -> None:
    assert sorted({argv[0] for page, argv, _ in CASES if page == "README.md"}) == sorted(COMMANDS)
    assert any(page == "docs/cli.md" and argv[0] == "plan" for page, argv, _ in CASES)


@pytest.mark.parametrize(("page", "argv", "shown"), CASES, ids=[f"{p}:{a[0]}" for p, a, _ in CASES])
def test_shown_lines_are_printed(
    page: str,
    argv: list[str],
    shown: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    assert _matches(shown, out.splitlines()) is None, (page, _matches(shown, out.splitlines()))
