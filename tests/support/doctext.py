"""The README and the pages of docs/, as the tests that run their examples read them.

Every fenced code block may be preceded by a one-line marker that says how the tests run it
(docs/development/docs.md):

    <!-- doc: KIND [key=value | key="value with spaces"] ... -->

so a test finds its block by page and by the text before it, never by a line number."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!-- doc: (?P<body>.*?) -->$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")


def pages() -> list[Path]:
    """The README and every page of docs/, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page(name: str) -> Path:
    """A page by its path under docs/ (`guide/enqueue.md`), or `README.md`."""
    path = README if name == "README.md" else DOCS / name
    assert path.is_file(), f"no page {name}"
    return path


def name_of(path: Path) -> str:
    return "README.md" if path == README else str(path.relative_to(DOCS))


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    lang: str
    body: str  # without the fences, ending in a newline
    marker: tuple[str, ...] = ()  # the words of its <!-- doc: ... --> line, if any
    options: dict[str, str] = field(default_factory=dict)  # its key=value words

    @property
    def label(self) -> str:
        """Its first line."""
        return self.body.split("\n", 1)[0]

    @property
    def where(self) -> str:
        return f"{name_of(self.path)}:{self.line}"

    @property
    def kind(self) -> str | None:
        """The marker's first word (`skip`, `python`, `sql`, `toml`, `by`), if any."""
        return self.marker[0] if self.marker else None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a page (indented ones too), with its marker."""
    found: list[Block] = []
    lines = path.read_text().split("\n")
    n = 0
    while n < len(lines):
        m = FENCE.match(lines[n])
        if m is None:
            n += 1
            continue
        indent = m["indent"]
        end = n + 1
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        assert end < len(lines), f"{name_of(path)}:{n + 1}: unclosed code block"
        body = "\n".join(line[len(indent) :] for line in lines[n + 1 : end]) + "\n"
        words: tuple[str, ...] = ()
        options: dict[str, str] = {}
        prev = lines[n - 1].strip() if n > 0 else ""
        marker = MARKER.match(prev)
        if marker:
            words = tuple(shlex.split(marker["body"]))
            options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        found.append(Block(path, n + 1, m["lang"], body, words, options))
        n = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]


def block_after(name: str, lang: str, after: str, nth: int = 0) -> str:
    """The nth (from 0) ```lang block of a page after the first line starting with `after`
    (without its trailing newline)."""
    path = page(name)
    lines = path.read_text().split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(after)), None)
    assert start is not None, f"{name}: no line starting with {after!r}"
    found = [b for b in blocks(path) if b.line > start + 1 and b.lang == lang]
    assert len(found) > nth, f"{name}: no {lang} block {nth} after {after!r}"
    return found[nth].body.removesuffix("\n")
