"""Format-neutral view of a launch command: argument tokens that know where they live.

Every format reader (shell, YAML, Dockerfile) turns a launch command into a `Site`: the
SGLang arguments as strings plus, per argument, a `TokenRef` into the `Container` that holds
it (a shell command line, a bash array, a YAML list, a JSON exec array, a config mapping).
A container turns token-level changes into `TextEdit`s on the file's text, or answers None
when it cannot make the change safely (the engine then reports instead of rewriting).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


@dataclass(frozen=True, order=True)
class TextEdit:
    """Replace text[start:end] (character offsets) with `text`."""

    start: int
    end: int
    text: str


class Container(Protocol):
    """A run of argument tokens stored in one place of a file."""

    def rename_prefix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        """Token i starts with `old` (a flag spelling); write `new` instead, keep the rest."""

    def replace_suffix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        """Token i ends with `old` (an inline `=value`); write `new` instead."""

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        """Replace tokens i..j-1 with `new_tokens` (empty: delete them)."""


@dataclass(frozen=True)
class TokenRef:
    container: Container
    index: int  # position inside the container
    line: int  # 1-based line in the file


EnvSetter = Callable[[str, str], "list[TextEdit] | None"]


@dataclass(frozen=True)
class FalseKey:
    spelling: str  # --enable-deepep-waterfill
    start: int  # offset of the key's name (inside its quotes)
    line: int
    line_start: int  # the whole entry's lines, for a deletion
    line_end: int
    comment: str = ""  # a trailing comment, kept on its own line when the entry goes


@dataclass
class Site:
    """One SGLang launch command found in a file, in any format."""

    args: tuple[str, ...]
    dynamic: tuple[bool, ...]
    refs: tuple[TokenRef, ...]
    line: int
    launcher: str
    env: dict[str, str] = field(default_factory=dict)
    env_dynamic: frozenset[str] = frozenset()
    passthrough: bool = False
    set_env: EnvSetter | None = None  # None: this format cannot carry environment variables
    env_hint: str = ""  # how to set an environment variable by hand in this format
    fmt: str = "shell"
    # `--config` switches written `key: false`: not in `args` (argparse never sees them), but a
    # renamed or removed flag's dead key still stops SGLang's loader
    false_keys: tuple["FalseKey", ...] = ()

    def token_line(self, index: int) -> int:
        return self.refs[index].line if 0 <= index < len(self.refs) else self.line


SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def shell_quote(value: str) -> str:
    """Minimal POSIX quoting: bare when safe, else single quotes."""
    if SAFE_WORD.fullmatch(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def apply_edits(text: str, edits: Sequence[TextEdit]) -> str:
    """Apply non-overlapping edits back to front (callers drop overlaps first)."""
    out = text
    for edit in sorted(edits, reverse=True):
        out = out[: edit.start] + edit.text + out[edit.end:]
    return out


def drop_overlaps(edits: Sequence[TextEdit]) -> tuple[list[TextEdit], list[TextEdit]]:
    """Deduplicate identical edits; keep the first of overlapping ones. Returns (kept, dropped)."""
    kept: list[TextEdit] = []
    dropped: list[TextEdit] = []
    for edit in edits:
        if edit in kept:
            continue
        if any(_overlaps(edit, other) for other in kept):
            dropped.append(edit)
        else:
            kept.append(edit)
    return kept, dropped


def _overlaps(a: TextEdit, b: TextEdit) -> bool:
    if a.start == a.end == b.start == b.end:
        return True  # two insertions at one point: order would be arbitrary
    return a.start < b.end and b.start < a.end


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def align(source: str, offset: int, value: str) -> list[int] | None:
    """Positions in the file of each character of `value`, a scalar decoded from `source`
    (which starts at file offset `offset`): greedy, skipping quotes, indentation and escapes.
    None when the value cannot be lined up with its source."""
    positions: list[int] = []
    pos = 0
    for char in value:
        found = source.find(char, pos) if char not in "\n " else _find_blank(source, pos, char)
        if found < 0:
            return None
        positions.append(offset + found)
        pos = found + 1
    return positions


def _find_blank(source: str, pos: int, char: str) -> int:
    # A space or newline of a decoded scalar may come from a folded newline in the source.
    hits = [i for i in (source.find(" ", pos), source.find("\n", pos)) if i >= 0]
    return min(hits) if hits else -1


def scalar_mapper(positions: list[int], end: int, forbidden: str = "") -> Callable[[TextEdit], "TextEdit | None"]:
    """Move an edit in decoded-value coordinates to file coordinates (None if it cannot be)."""

    def to_file(index: int, is_end: bool) -> int:
        if not positions:
            return end
        if is_end:
            return positions[index - 1] + 1 if index > 0 else positions[0]
        return positions[index] if index < len(positions) else positions[-1] + 1

    def mapper(edit: TextEdit) -> TextEdit | None:
        if any(ch in edit.text for ch in forbidden):
            return None
        start = to_file(edit.start, False)
        stop = to_file(edit.end, True) if edit.end > edit.start else start
        return TextEdit(start, max(start, stop), edit.text)

    return mapper
