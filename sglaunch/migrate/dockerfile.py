"""Launch commands in Dockerfiles: `CMD` / `ENTRYPOINT` in exec (JSON) and shell form, `ENV`.

dockerfile-parse splits the file into instructions with their lines; exec-form arrays are
edited string literal by string literal, shell forms are parsed with the shell reader.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from sglaunch.migrate import shell
from sglaunch.migrate.tokens import Site, TextEdit, TokenRef, align, line_of, scalar_mapper
from sglaunch.migrate.yamlfmt import CANNOT, SHELL_C, SHELLS, Document

JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


class DockerfileError(Exception):
    pass


@dataclass
class _Instruction:
    keyword: str
    start: int  # offset of the instruction's first line
    body: int  # offset where the arguments start
    end: int  # offset after the instruction's content
    value: str  # arguments as dockerfile-parse joined them
    line: int  # 1-based
    masked: str = ""  # text[body:end] with comment lines blanked out (same length)
    heredocs: list = field(default_factory=list)  # _Heredoc bodies that follow the instruction

    def exec_items(self, text: str) -> list[str] | None:
        raw = text[self.body:self.end].strip()
        if not raw.startswith("["):
            return None
        try:
            items = json.loads(self.value)
        except ValueError:
            return None
        return items if isinstance(items, list) and all(isinstance(i, str) for i in items) else None


class JsonArrayContainer:
    """String literals of a JSON exec-form array."""

    def __init__(self, text: str, spans: list[tuple[int, int]]):
        self.text = text
        self.spans = spans

    def rename_prefix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        start, _ = self.spans[i]
        if self.text[start + 1:].startswith(old):
            return [TextEdit(start + 1, start + 1 + len(old), new)]
        return None

    def replace_suffix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        start, end = self.spans[i]
        value = json.loads(self.text[start:end])
        if not value.endswith(old):
            return None
        return self.replace(i, i + 1, [value[: len(value) - len(old)] + new])

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        start, end = self.spans[i][0], self.spans[j - 1][1]
        if new_tokens:
            return [TextEdit(start, end, ", ".join(json.dumps(t) for t in new_tokens))]
        if j < len(self.spans):
            return [TextEdit(start, self.spans[j][0], "")]
        if i > 0:
            return [TextEdit(self.spans[i - 1][1], end, "")]
        return [TextEdit(start, end, "")]


@dataclass
class _Heredoc:
    """`RUN <<EOF` / `COPY <<'EOF' /start.sh`: the body lines after the instruction."""

    delimiter: str
    quoted: bool
    start: int  # offset of the body's first line
    end: int  # offset of the delimiter line (the body ends just before it)
    line: int  # 1-based line of the body's first line


HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")


def _attach_heredocs(text: str, instructions: list[_Instruction]) -> list[_Instruction]:
    """dockerfile-parse does not know BuildKit heredocs and reads their bodies as instructions:
    find each body (up to its delimiter line), give it to its instruction, drop the rest."""
    offsets = _line_offsets(text)
    lines = text.split("\n")
    kept: list[_Instruction] = []
    skip_until = -1
    for instruction in instructions:
        if instruction.start < skip_until:
            continue
        if instruction.keyword in ("RUN", "COPY", "ADD"):
            row = instruction.line  # 0-based row of the next line
            for match in HEREDOC.finditer(text[instruction.body:instruction.end]):
                strip_tabs = bool(match.group(1))
                first = row
                while row < len(lines) and (lines[row].lstrip("\t") if strip_tabs else lines[row]) != match.group(3):
                    row += 1
                if row >= len(lines):
                    raise DockerfileError(f"line {instruction.line}: heredoc <<{match.group(3)} is never closed")
                instruction.heredocs.append(_Heredoc(match.group(3), bool(match.group(2)), offsets[first],
                                                     offsets[row], first + 1))
                row += 1
            if instruction.heredocs:
                skip_until = offsets[row] if row < len(offsets) else len(text) + 1
        kept.append(instruction)
    return kept


_PROBLEMS: list = []  # read problems of the shell forms of the file being read (one at a time)


def _embedded(parsed, to_line) -> list:
    from sglaunch.migrate.engine import embedded_problems

    return embedded_problems(parsed, to_line)


def read_dockerfile(text: str) -> Document:
    doc = Document()
    _PROBLEMS.clear()
    named: dict[str, list[_Instruction]] = {}  # stage name -> what a `FROM name` stage inherits
    for stage in _stages(_attach_heredocs(text, _instructions(text))):
        inherited = _inherited(stage, named)
        doc.sites.extend(_run_sites(text, stage))
        doc.sites.extend(_command_sites(text, inherited + stage))
        doc.errors.extend(_heredoc_sites(text, stage, doc.sites))
        for instruction in stage:
            if instruction.keyword == "ONBUILD" and shell.mentions(instruction.value):
                # `ONBUILD CMD [...]`: the launch of the images built FROM this one, not read
                doc.errors.append((instruction.line, "an ONBUILD instruction holds an SGLang launch the tool "
                                   "does not read; check it by hand", instruction.value, "variable"))
        for instruction in stage:  # `ENV SGLANG_ARGS="--x"`, `ARG EXTRA=--x`: not read as a launch
            if instruction.keyword in ("ENV", "ARG") and "--" in instruction.value \
                    and not shell.mentions(instruction.value):
                doc.errors.append((instruction.line, f"{instruction.keyword} holds what looks like SGLang launch "
                                   "flags, which the tool does not follow into a launch; check and fix it by hand",
                                   instruction.value, "variable"))
    doc.errors.extend(_PROBLEMS)
    _PROBLEMS.clear()
    return doc


def _heredoc_sites(text: str, stage: list[_Instruction], sites: list[Site]) -> list:
    """Scripts in `RUN <<EOF` bodies (run by the build shell, or the program named after the
    marker) and in `COPY <<EOF /x.sh` bodies (a script written into the image)."""
    problems: list = []
    for instruction in stage:
        for doc in instruction.heredocs:
            body = text[doc.start:doc.end]
            if not shell.mentions(body):
                continue
            head = HEREDOC.sub(" ", instruction.masked).strip()
            head = RUN_OPTION.sub("", head + " ").strip() if instruction.keyword == "RUN" else head
            words = head.split()
            if instruction.keyword == "RUN":
                program = os.path.basename(words[0]) if words else ""
                script = not words or program in SHELLS or words[:1] == ["set"]
            else:
                dest = words[-1] if words else ""
                script = dest.endswith(shell.SCRIPT_SUFFIXES) or shell._shebang(body)
            if not script and instruction.keyword == "RUN" and program.startswith("python"):
                problems.extend(_python_heredoc(text, doc, stage, instruction, sites))
                continue
            if not script:
                problems.append((doc.line, f"a {instruction.keyword} heredoc holds an SGLang launch the tool "
                                 "does not read (not a shell script)", body, "unreadable"))
                continue
            forbidden = "" if doc.quoted else "$`\\"
            start = doc.start

            def mapper(edit: TextEdit, start=start, forbidden=forbidden) -> TextEdit | None:
                if any(ch in edit.text for ch in forbidden):
                    return None
                return TextEdit(edit.start + start, edit.end + start, edit.text)

            parsed = shell.parse_script(body, mapper, fmt="dockerfile")
            problems.extend(_embedded(parsed, lambda line, base=doc.line - 1: base + line))
            env, dynamic = _stage_env(stage, instruction.start)
            for site in parsed.sites:
                adopted = _adopt(site, text, start, env, dynamic, None, doc.line - 1)
                adopted.env_hint = "set NAME=VALUE in front of the command in the heredoc"
                sites.append(adopted)
    return problems


def _instructions(text: str) -> list[_Instruction]:
    from dockerfile_parse import DockerfileParser

    try:
        parser = DockerfileParser(fileobj=io.BytesIO(b""))
        parser.content = text
        structure = parser.structure
    except Exception as exc:  # dockerfile-parse raises assorted errors on odd input
        raise DockerfileError(f"cannot parse Dockerfile ({type(exc).__name__})") from None
    offsets = _line_offsets(text)
    found = []
    for item in structure:
        if item["instruction"].upper() == "COMMENT":
            continue
        start = offsets[item["startline"]] if item["startline"] < len(offsets) else len(text)
        stop = offsets[item["endline"] + 1] if item["endline"] + 1 < len(offsets) else len(text)
        raw = text[start:stop]
        end = start + len(raw.rstrip("\r\n")) if raw.endswith("\n") else stop
        if not raw.lstrip().upper().startswith(item["instruction"].upper()):
            if shell.mentions(item["value"]):
                _PROBLEMS.append((item["startline"] + 1, CANNOT, item["value"], "unreadable"))
            continue  # dockerfile-parse placed it somewhere we cannot follow; do not edit it
        match = re.match(r"\s*\S+[ \t]*", raw)
        body = start + (match.end() if match else 0)
        found.append(_Instruction(item["instruction"].upper(), start, body, end,
                                  item["value"], item["startline"] + 1,
                                  _mask_comment_lines(text[body:end])))
    return found


def _mask_comment_lines(body: str) -> str:
    """The instruction's arguments with the comment lines Docker drops from a continued
    instruction turned into blank continuation lines of the same length (offsets stay)."""
    lines = body.split("\n")
    for k in range(1, len(lines)):
        stripped = lines[k].lstrip(" \t")
        if stripped.startswith("#") or (not stripped and k < len(lines) - 1 and lines[k - 1].endswith("\\")):
            line = lines[k]
            lines[k] = (" " * (len(line) - 1) + "\\") if line else line
    return "\n".join(lines)


def _line_offsets(text: str) -> list[int]:
    offsets = [0]
    for index, char in enumerate(text):
        if char == "\n":
            offsets.append(index + 1)
    return offsets


def _stages(instructions: list[_Instruction]) -> list[list[_Instruction]]:
    stages: list[list[_Instruction]] = [[]]
    for instruction in instructions:
        if instruction.keyword == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return [s for s in stages if s]


def _stage_env(stage: list[_Instruction], before: int) -> tuple[dict[str, str], set[str]]:
    env: dict[str, str] = {}
    dynamic: set[str] = set()
    for instruction in stage:
        if instruction.keyword != "ENV" or instruction.start >= before:
            continue
        for name, value in _env_pairs(instruction.value):
            env[name] = value
            (dynamic.add if "$" in value else dynamic.discard)(name)
    return env, dynamic


def _env_pairs(value: str) -> list[tuple[str, str]]:
    try:
        words = shlex.split(value, posix=True)
    except ValueError:
        return []
    if words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]  # legacy `ENV NAME value`
    return [tuple(w.split("=", 1)) for w in words if "=" in w]  # type: ignore[misc]


def _inherited(stage: list[_Instruction], named: dict[str, list[_Instruction]]) -> list[_Instruction]:
    """`FROM base AS prod` after `FROM ... AS base`: the ENV, ENTRYPOINT and CMD of `base` are
    prod's until it sets its own (an ENTRYPOINT of prod's drops the CMD it inherits)."""
    words = stage[0].value.split() if stage and stage[0].keyword == "FROM" else []
    words = [w for w in words if not w.startswith("--")]
    parent = named.get(words[0].lower(), []) if words else []
    if any(i.keyword == "ENTRYPOINT" for i in stage):
        parent = [i for i in parent if i.keyword != "CMD"]
    if len(words) >= 3 and words[1].upper() == "AS":
        named[words[2].lower()] = parent + [i for i in stage if i.keyword in ("ENV", "ENTRYPOINT", "CMD")]
    return parent


def _stage_sites(text: str, stage: list[_Instruction]) -> list[Site]:
    return _run_sites(text, stage) + _command_sites(text, stage)


RUN_OPTION = re.compile(r"--[a-z-]+(=\S*)?[ \t]+")


def _run_sites(text: str, stage: list[_Instruction]) -> list[Site]:
    """`RUN` lines that start a server (warm-up or compile at build time)."""
    sites: list[Site] = []
    for instruction in stage:
        if instruction.keyword != "RUN" or not _mentions_launch(instruction.value):
            continue
        env, dynamic = _stage_env(stage, instruction.start)
        if instruction.exec_items(text) is not None:
            sites.extend(_exec_form(text, [instruction], env, dynamic, _env_setter(instruction)))
            continue
        skip = 0
        while True:  # RUN --mount=... --network=... options
            option = RUN_OPTION.match(instruction.masked, skip)
            if option is None:
                break
            skip = option.end()
        body = instruction.masked[skip:]
        if body.lstrip().startswith("<<"):
            continue  # RUN heredocs are not read
        parsed = shell.parse_script(body, _offset_mapper(instruction.body + skip), fmt="dockerfile")
        _PROBLEMS.extend(_embedded(parsed, lambda line, base=line_of(text, instruction.body + skip) - 1: base + line))
        # in a RUN line the variable goes in front of the command (`NAME=VALUE python ...`)
        sites.extend(_adopt(site, text, instruction.body + skip, env, dynamic, None) for site in parsed.sites)
    return sites


def _python_heredoc(text: str, doc: _Heredoc, stage, instruction, sites: list[Site]) -> list:
    """`RUN python3 <<EOF`: the body read with Python's `ast`, the rest of the file blanked
    (same offsets), so its edits land in the Dockerfile."""
    from sglaunch.migrate import pyfmt

    masked = "".join(c if c == "\n" else " " for c in text[:doc.start]) + text[doc.start:doc.end] + \
        "".join(c if c == "\n" else " " for c in text[doc.end:])
    try:
        found = pyfmt.read_python(masked)
    except SyntaxError as exc:
        return [(doc.line, f"a RUN python heredoc the tool cannot parse ({exc.msg})", text[doc.start:doc.end],
                 "unreadable")]
    env, dynamic = _stage_env(stage, instruction.start)
    for site in found.sites:
        site.env = {**env, **site.env}
        site.fmt = "dockerfile"
        sites.append(site)
    return found.errors


def _mentions_launch(value: str) -> bool:
    return shell.mentions(value) or "serve" in value and "sglang" in value


def _command_sites(text: str, stage: list[_Instruction]) -> list[Site]:
    entry = _last(stage, "ENTRYPOINT")
    cmd = _last(stage, "CMD")
    first = min((i for i in (entry, cmd) if i is not None), key=lambda i: i.start, default=None)
    if first is None:
        return []
    env, dynamic = _stage_env(stage, first.start)
    setter = _env_setter(first)
    parts = [i for i in (entry, cmd) if i is not None]
    if entry is not None and entry.exec_items(text) is None:
        parts = [entry]  # a shell-form ENTRYPOINT ignores CMD
    if len(parts) == 1 and parts[0].exec_items(text) is None:
        return _shell_form(text, parts[0], env, dynamic, setter)
    return _exec_form(text, [p for p in parts if p.exec_items(text) is not None], env, dynamic, setter)


def _last(stage: list[_Instruction], keyword: str) -> _Instruction | None:
    found = [i for i in stage if i.keyword == keyword]
    return found[-1] if found else None


def _env_setter(instruction: _Instruction):
    def set_env(name: str, value: str) -> list[TextEdit]:
        return [TextEdit(instruction.start, instruction.start, f"ENV {name}={shlex.quote(value)}\n")]

    return set_env


def _offset_mapper(offset: int):
    def mapper(edit: TextEdit) -> TextEdit | None:
        return TextEdit(edit.start + offset, edit.end + offset, edit.text)

    return mapper


def _shell_form(text, instruction, env, dynamic, setter) -> list[Site]:
    body = instruction.masked
    parsed = shell.parse_script(body, _offset_mapper(instruction.body), fmt="dockerfile")
    _PROBLEMS.extend(_embedded(parsed, lambda line, base=line_of(text, instruction.body) - 1: base + line))
    return [_adopt(site, text, instruction.body, env, dynamic, setter) for site in parsed.sites]


def _adopt(site: Site, text: str, offset: int, env, dynamic, setter, line_base: int | None = None) -> Site:
    base = line_of(text, offset) - 1 if line_base is None else line_base
    site.refs = tuple(TokenRef(r.container, r.index, base + r.line) for r in site.refs)
    site.line = base + site.line
    site.env = {**env, **site.env}
    site.env_dynamic = frozenset((set(dynamic) - set(site.env)) | set(site.env_dynamic))
    if setter is not None:
        site.set_env = setter
        site.env_hint = "add `ENV NAME=VALUE` before CMD/ENTRYPOINT"
    else:
        site.env_hint = "set NAME=VALUE in front of the command in the RUN line"
    return site


def _exec_form(text, parts: list[_Instruction], env, dynamic, setter) -> list[Site]:
    values: list[str] = []
    refs: list[TokenRef] = []
    literals: list[tuple[str, int, int, int]] = []  # value, start, end, line
    for instruction in parts:
        items = instruction.exec_items(text) or []
        spans = [(m.start() + instruction.body, m.end() + instruction.body)
                 for m in JSON_STRING.finditer(instruction.masked)]
        if len(spans) != len(items) or any(json.loads(text[s:e]) != v for (s, e), v in zip(spans, items)):
            if shell.mentions(instruction.value) or any(i.startswith("--") for i in items):
                _PROBLEMS.append((instruction.line, CANNOT, instruction.value, "unreadable"))
            return []
        container = JsonArrayContainer(text, spans)
        for k, ((start, end), value) in enumerate(zip(spans, items)):
            line = line_of(text, start)
            values.append(value)
            refs.append(TokenRef(container, k, line))
            literals.append((value, start, end, line))
    script = _script_index(values)
    if script is not None:
        value, start, end, _ = literals[script]
        positions = align(text[start:end], start, value)
        if positions is None:
            _PROBLEMS.append((line_of(text, start), CANNOT, value, "unreadable"))
            return []
        parsed = shell.parse_script(value, scalar_mapper(positions, end, '"\\\n'), fmt="dockerfile")
        _PROBLEMS.extend(_embedded(parsed, lambda line, base=line_of(text, start) - 1: base + line))
        return [_adopt(site, text, start, env, dynamic, setter, line_of(text, start) - 1) for site in parsed.sites]
    found = shell._find_launcher(values)
    if found is None:
        if any(v.startswith("--") for v in values) and parts \
                and not os.path.basename(values[0]).startswith(("python", "pypy")):
            _PROBLEMS.append((parts[0].line, f"the flags given to {values[0]!r} look like SGLang launch flags, "
                              "which the tool does not follow into a launch; check and fix them by hand",
                              " ".join(values), "variable"))
        return []
    _, stop, launcher = found
    return [Site(args=tuple(values[stop:]), dynamic=tuple(False for _ in values[stop:]),
                 refs=tuple(refs[stop:]), line=line_of(text, parts[0].start), launcher=launcher,
                 env=env, env_dynamic=frozenset(dynamic), set_env=setter,
                 env_hint="add `ENV NAME=VALUE` before CMD/ENTRYPOINT", fmt="dockerfile")]


def _script_index(values: Sequence[str]) -> int | None:
    for k, value in enumerate(values[:-2]):
        if os.path.basename(value) in SHELLS and SHELL_C.fullmatch(values[k + 1]):
            return k + 2
    return None
