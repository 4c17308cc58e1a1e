"""What the documentation's code blocks are and how their output is checked (the harness of
``tests/docs/test_examples.py``; its own rules are tested in ``test_harness.py``).

The convention, for README.md and every page under docs/:

- A fenced ``python`` block is a complete program, run as written in a fresh directory.
- A block that calls ``anyio.run`` without a ``backend=`` runs twice, under asyncio and trio.
- A block whose first line is ``# file: NAME.py`` is a module the page's later blocks import:
  it is written beside each of them, and not run by itself.
- A ``text`` block right after a python block (blank lines between at most) is its expected
  standard output. Lines are compared without trailing spaces; a line that is only ``...``
  stands for any number of lines, and ``...`` within a line for any text.
- An HTML comment on the line before a block says how it runs: ``<!-- example: pytest -->``
  (a test module, run by pytest), ``<!-- example: lan -->`` (needs the test run's private
  network namespace), ``<!-- example: etcd -->`` (an etcd server, its URL in
  ``$ANYWOOL_EXAMPLE_ETCD``), ``<!-- example: skip REASON -->`` (not run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MARKERS = ("pytest", "lan", "etcd", "skip")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\s`]*)[^`]*$")
_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<kind>\w+)(?:\s+(?P<reason>.*?))?\s*-->\s*$")
_HELPER = re.compile(r"^#\s*file:\s*(?P<name>[\w./-]+\.py)\s*$")
_BACKEND_FREE_RUN = re.compile(r"\banyio\.run\((?![^)]*\bbackend\s*=)")


@dataclass
class Block:
    """One python block of a page: where it starts (1-based line of its fence), its code, the
    helper modules of the page before it, and how it runs."""

    page: str
    line: int
    code: str
    marker: str | None = None
    reason: str = ""
    expected: str | None = None
    helpers: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def backends(self) -> tuple[str | None, ...]:
        """The backends to run under: both where ``anyio.run`` is left to choose, else the
        program's own choice (``None``)."""
        if self.marker != "pytest" and _BACKEND_FREE_RUN.search(self.code):
            return ("asyncio", "trio")
        return (None,)


def _fences(lines: list[str]) -> list[tuple[int, int, str, int]]:
    """``(start, end, info, indent)`` of every fenced block: the lines of its two fences."""
    found: list[tuple[int, int, str, int]] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        for end in range(index + 1, len(lines)):
            if lines[end].strip() == fence:  # only the same fence closes it
                found.append((index, end, opening["info"].lower(), len(opening["indent"])))
                index = end + 1
                break
        else:
            raise ValueError(f"line {index + 1}: a code block that never ends")
    return found


def blocks(page: str, text: str) -> list[Block]:
    """The python blocks of a page, helpers (``# file:``) folded into those after them.

    :raises ValueError: a block never ends, or an unknown marker.
    """
    lines = text.splitlines()
    fences = _fences(lines)
    found: list[Block] = []
    helpers: dict[str, str] = {}
    for number, (start, end, info, indent) in enumerate(fences):
        if info not in ("python", "py", "python3"):
            continue
        code = "\n".join(line[indent:] for line in lines[start + 1:end]) + "\n"
        first = code.splitlines()[0] if code.strip() else ""
        if (helper := _HELPER.match(first)) is not None:
            helpers[helper["name"]] = code
            continue
        block = Block(page, start + 1, code, helpers=dict(helpers))
        before = start - 1
        if before >= 0 and (marker := _MARKER.match(lines[before])) is not None:
            if marker["kind"] not in MARKERS:
                raise ValueError(f"{page}:{before + 1}: unknown example marker "
                                 f"{marker['kind']!r} (known: {', '.join(MARKERS)})")
            block.marker = marker["kind"]
            block.reason = marker["reason"] or ""
        if number + 1 < len(fences):
            next_start, next_end, next_info, next_indent = fences[number + 1]
            between = lines[end + 1:next_start]
            if next_info == "text" and all(not line.strip() for line in between):
                block.expected = "\n".join(
                    line[next_indent:] for line in lines[next_start + 1:next_end])
        found.append(block)
    return found


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` output is what ``expected`` shows (see the module's rules)."""
    parts: list[str] = []
    for line in expected.rstrip("\n").splitlines():
        line = line.rstrip()
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    lines = [line.rstrip() for line in actual.rstrip("\n").splitlines()]
    text = "\n".join(lines) + "\n" if lines else ""
    return re.fullmatch("".join(parts), text) is not None


def pages(root: Path) -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
