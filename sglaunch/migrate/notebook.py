"""Jupyter notebooks (`*.ipynb`): the launches in code cells.

A notebook is JSON; each code cell's `source` is a list of JSON strings (one a line) or one
string. A cell's text is decoded with the position of every character in the file, so that an
edit of the cell text becomes an edit inside the JSON strings (the new text JSON-escaped, and
never a newline: a line stays one string). Shell lines (`!python -m sglang.launch_server ...`,
`%pip install ...`, `%%bash` / `%%sh` / `%%script bash` cells) are read with the shell reader,
the rest of a cell with the Python reader (`subprocess.Popen([...])` in a cell); magics are
blanked for it, same length, so positions stay the cell's own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from sglaunch.migrate.tokens import TextEdit, TokenRef

SHELL_CELL = re.compile(r"%%(bash|sh|script\s+(ba)?sh|system)\b")
SHELL_MAGIC = re.compile(r"[ \t]*(?:[A-Za-z_][A-Za-z0-9_]*[ \t]*=[ \t]*)?(!|%(pip|conda|sx|system|uv|mamba)\b)")
ENV_MAGIC = re.compile(r"^[ \t]*%env[ \t]+([A-Za-z_][A-Za-z0-9_]*)(?:[ \t]*=[ \t]*|[ \t]+)(\S*)[ \t]*$", re.M)
PY_ENVIRON = re.compile(r"^[ \t]*os\.environ\[[\"']([A-Za-z_][A-Za-z0-9_]*)[\"']\][ \t]*=[ \t]*"
                        r"[\"']([^\"'\n]*)[\"']", re.M)
INTERPOLATION = re.compile(r"\{[^{}\n]*\}")  # IPython expands `{expr}` in ! lines: a value the rules cannot know


@dataclass
class Cell:
    text: str  # the decoded source of the cell
    positions: list[int]  # file offset of each character of `text`
    lines: list[int]  # file line (1-based) of each line of `text`
    end: int  # file offset just after the last character (before the closing quote)
    ends: list[int] = field(default_factory=list)  # file offset just after each character (`\\"` is 2 long)
    shell: str = ""  # the cell with only its shell lines (others blanked), same length
    python: str = ""  # the cell with its magics blanked, same length
    errors: list = field(default_factory=list)

    def mapper(self) -> Callable[[TextEdit], "TextEdit | None"]:
        def to_file(index: int, is_end: bool) -> int:
            if not self.positions:
                return self.end
            if is_end:
                return _after(self, index - 1) if index > 0 else self.positions[0]
            return self.positions[index] if index < len(self.positions) else _after(self, len(self.positions) - 1)

        def mapper(edit: TextEdit) -> TextEdit | None:
            if "\n" in edit.text:
                return None
            start = to_file(edit.start, False)
            stop = to_file(edit.end, True) if edit.end > edit.start else start
            # an edit must stay inside one JSON string (no closing quote, comma or newline between)
            if any(self.text[k] == "\n" for k in range(max(0, edit.start), min(edit.end, len(self.text)))):
                return None
            return TextEdit(start, max(start, stop), json.dumps(edit.text, ensure_ascii=False)[1:-1])

        return mapper

    def line(self, cell_line: int) -> int:
        return self.lines[min(max(cell_line, 1), len(self.lines)) - 1]


def _after(cell: Cell, index: int) -> int:
    """File offset just after character `index` of the cell (escapes such as `\\"` are 2 long)."""
    return cell.ends[index] if index < len(cell.ends) else cell.positions[index] + 1


def _decode(raw: str, start: int) -> tuple[str, list[int], list[int]]:
    """A JSON string's text `raw` (without quotes, at file offset `start`): decoded characters,
    their file offsets and the offsets just after them."""
    out, pos, ends = [], [], []
    k = 0
    while k < len(raw):
        c = raw[k]
        if c == "\\" and k + 1 < len(raw):
            e = raw[k + 1]
            if e == "u" and k + 6 <= len(raw):
                ch = chr(int(raw[k + 2:k + 6], 16))
                width = 6
            else:
                ch = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"'}.get(e, e)
                width = 2
            out.append(ch)
            pos.append(start + k)
            ends.append(start + k + width)
            k += width
        else:
            out.append(c)
            pos.append(start + k)
            ends.append(start + k + 1)
            k += 1
    return "".join(out), pos, ends


def cells(text: str) -> list[Cell]:
    """The code cells of a notebook, with positions (raises ValueError when it is not JSON)."""
    from sglaunch.migrate.yamlfmt import compose, get, is_map, is_scalar, is_seq

    json.loads(text)
    found: list[Cell] = []
    for root in compose(text):
        _, items = get(root, "cells") if is_map(root) else (None, None)
        if items is None or not is_seq(items):
            continue
        for item in items.value:
            if not is_map(item):
                continue
            _, kind = get(item, "cell_type")
            _, source = get(item, "source")
            if kind is None or not is_scalar(kind) or str(kind.value) != "code" or source is None:
                continue
            parts = source.value if is_seq(source) else [source]
            chars, positions, ends, lines = [], [], [], []
            end = 0
            for part in parts:
                if not is_scalar(part):
                    continue
                a, b = part.start_mark.index, part.end_mark.index
                value, pos, after = _decode(text[a + 1:b - 1], a + 1)
                for k, ch in enumerate(value):
                    if not lines or (chars and chars[-1] == "\n"):
                        lines.append(part.start_mark.line + 1)
                    chars.append(ch)
                end = b - 1
                positions += pos
                ends += after
            body = "".join(chars)
            if not lines:
                lines = [source.start_mark.line + 1]
            if body.endswith("\n"):
                lines.append(lines[-1] + 1)
            cell = Cell(body, positions, lines, end, ends)
            cell.shell, cell.python = _split(body)
            found.append(cell)
    return found


def _blank(line: str) -> str:
    return " " * len(line)


def _split(body: str) -> tuple[str, str]:
    lines = body.split("\n")
    if lines and SHELL_CELL.match(lines[0].strip()):
        return "\n".join([_blank(lines[0])] + lines[1:]), "\n".join(_blank(x) for x in lines)
    shell, python = [], []
    continued = False
    for line in lines:
        magic = SHELL_MAGIC.match(line)
        if magic or continued:
            at = magic.start(1) if magic else -1
            # `files = !ls`: the assignment is blanked too; `{expr}` becomes a shell expansion of the same length
            text = _blank(line[:at]) + " " + line[at + 1:] if at >= 0 else line
            shell.append(INTERPOLATION.sub(lambda m: "$" + "_" * (len(m.group(0)) - 1), text))
            python.append(_blank(line))
            continued = line.rstrip().endswith("\\")
        else:
            shell.append(_blank(line))
            python.append(_blank(line) if line.lstrip().startswith("%") else line)
    return "\n".join(shell), "\n".join(python)


def read_notebook(text: str):
    """Launch commands of a notebook's code cells (a Document)."""
    from sglaunch.migrate import pyfmt, shell
    from sglaunch.migrate.engine import embedded_problems
    from sglaunch.migrate.yamlfmt import Document, _MappedContainer

    doc = Document()
    try:
        found = cells(text)
    except ValueError as exc:
        raise SyntaxError(f"not a notebook: {exc}") from None
    env: dict[str, str] = {}  # `%env NAME=VALUE` and `os.environ["NAME"] = "VALUE"` of the cells so far
    for cell in found:
        mapper = cell.mapper()
        for match in [*ENV_MAGIC.finditer(cell.text), *PY_ENVIRON.finditer(cell.text)]:
            env[match.group(1)] = match.group(2)
        if cell.shell.strip():
            parsed = shell.parse_script(cell.shell, mapper, fmt="notebook")
            for site in parsed.sites:
                site.env = {**env, **site.env}
                site.refs = tuple(TokenRef(r.container, r.index, cell.line(r.line)) for r in site.refs)
                site.line = cell.line(site.line)
                site.set_env = None
                site.env_hint = "set it in the notebook's environment (%env NAME=VALUE) before the launch"
                doc.sites.append(site)
            doc.errors.extend(embedded_problems(parsed, cell.line))
        if not cell.python.strip():
            continue
        try:
            inner = pyfmt.read_python(cell.python)
        except SyntaxError as exc:
            if shell.mentions(cell.python):
                doc.errors.append((cell.line(exc.lineno or 1), "a notebook cell the tool cannot parse as Python "
                                   f"({exc.msg}) holds an SGLang launch; check it by hand", cell.python, "unreadable"))
            continue
        wrapped: dict[int, _MappedContainer] = {}
        for site in inner.sites:
            site.refs = tuple(TokenRef(wrapped.setdefault(id(r.container), _MappedContainer(r.container, mapper)),
                                       r.index, cell.line(r.line)) for r in site.refs)
            site.line = cell.line(site.line)
            site.set_env = None
            site.env = {**env, **site.env}
            site.fmt = "notebook"
            doc.sites.append(site)
        for problem in inner.errors:
            doc.errors.append((cell.line(problem[0]),) + tuple(problem[1:]))
    return doc
