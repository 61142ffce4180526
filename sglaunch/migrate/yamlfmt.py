"""Launch commands in YAML: SGLang `--config` files, Kubernetes manifests, docker-compose.

ruamel.yaml composes the documents into nodes that carry exact character positions; every
change is a small text edit at those positions, so comments, key order, quoting and
indentation elsewhere stay byte-identical (a full round-trip dump would reflow them).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from sglaunch.flags.registry import SCHEMA
from sglaunch.flags.spec import Kind
from sglaunch.migrate import shell
from sglaunch.migrate.tokens import Site, TextEdit, TokenRef, align, line_of, scalar_mapper

UNKNOWN_ENV = "*"  # evaluate.UNKNOWN_ENV

STR_TAG = "tag:yaml.org,2002:str"
BOOL_TAG = "tag:yaml.org,2002:bool"
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash"})
SHELL_C = re.compile(r"-[a-z]*c[a-z]*")
PLAIN_SAFE = re.compile(r"[A-Za-z0-9_./@%+-][A-Za-z0-9_./@%+=:,-]*")
RESOLVES = re.compile(r"(?i)(true|false|yes|no|on|off|null|~|[-+]?[0-9][0-9_.eE+-]*)")


class YamlError(Exception):
    pass


@dataclass
class Document:
    sites: list[Site] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)  # non-fatal problems


def compose(text: str) -> list:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    if looks_json(text):  # JSON with comments or trailing commas (VS Code's launch.json): masked, same length
        masked = mask_json(text)
        if masked != text:
            try:
                json.loads(masked)
                text = masked
            except ValueError:
                pass  # not JSON with comments after all (YAML flow text): read as written
    try:
        return [doc for doc in YAML(typ="safe", pure=True).compose_all(text) if doc is not None]
    except YAMLError as exc:
        problem = getattr(exc, "problem", None) or "invalid YAML"
        mark = getattr(exc, "problem_mark", None)
        raise YamlError(f"{problem} (line {mark.line + 1})" if mark else problem) from None
    except Exception as exc:  # ruamel raises assorted errors on hostile input
        raise YamlError(f"invalid YAML ({type(exc).__name__})") from None


def looks_json(text: str) -> bool:
    return text.lstrip("\ufeff \t\r\n")[:1] in ("{", "[")


_JSON_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|,(?=\s*(?://[^\n]*\n\s*|/\*.*?\*/\s*)*[\]}])',
                          re.S)


def json_comments(text: str) -> list[tuple[int, int]]:
    """Spans of the `//` and `/* */` comments and trailing commas of JSON-with-comments text."""
    return [(m.start(), m.end()) for m in _JSON_TOKENS.finditer(text) if not m.group(0).startswith('"')]


def mask_json(text: str) -> str:
    """JSON with comments (JSONC, VS Code) as plain JSON of the same length: comments and
    trailing commas become spaces (newlines kept), so positions are the file's own."""
    spans = json_comments(text)
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        out.append(text[last:start])
        out.append("".join("\n" if c == "\n" else " " for c in text[start:end]))
        last = end
    out.append(text[last:])
    return "".join(out)


def valid_json(text: str) -> bool:
    import json

    try:
        json.loads(mask_json(text))
    except ValueError:
        return False
    return True


def kind_of(node) -> str:
    return type(node).__name__


def is_scalar(node) -> bool:
    return kind_of(node) == "ScalarNode"


def is_seq(node) -> bool:
    return kind_of(node) == "SequenceNode"


def is_map(node) -> bool:
    return kind_of(node) == "MappingNode"


def get(mapping, key: str, merged: bool = True, _seen: frozenset = frozenset()):
    """(key node, value node) of `key`, also from YAML merge keys (`<<: *common`), whose
    mappings the composer keeps as the anchored nodes themselves."""
    for k, v in mapping.value:
        if is_scalar(k) and k.value == key:
            return k, v
    if merged and id(mapping) not in _seen and len(_seen) < 16:
        for k, v in mapping.value:
            if is_scalar(k) and k.value == "<<":
                for source in (v.value if is_seq(v) else [v]):
                    if is_map(source):
                        found = get(source, key, True, _seen | {id(mapping)})
                        if found[1] is not None:
                            return found
    return None, None


def detect_yaml(text: str) -> str:
    """'k8s', 'compose', 'config' or 'yaml' (anything else: scanned for launch commands)."""
    try:
        docs = compose(text)
    except YamlError:
        return "yaml"
    for doc in docs:
        if is_map(doc):
            keys = {k.value for k, _ in doc.value if is_scalar(k)}
            if {"apiVersion", "kind"} <= keys:
                return "k8s"
            if "services" in keys:
                return "compose"
            if _looks_like_config(doc) and not keys & {"command", "args"}:
                return "config"
    return "yaml"


def _looks_like_config(doc) -> bool:
    """An SGLang --config mapping: at least half of its keys are SGLang flags, and flag keys
    hold scalars or lists (Helm values with a `port:` key are not launch configs)."""
    entries = [(k, v) for k, v in doc.value if is_scalar(k)]
    flags = [(k, v) for k, v in entries if SCHEMA.lookup("--" + str(k.value)) and not is_map(v)]
    return bool(flags) and 2 * len(flags) >= len(entries)


# --------------------------------------------------------------------------- rendering


def render_scalar(value: str, like: str | None = None, typed: bool = False) -> str:
    """A YAML scalar for `value` in the style of the node it replaces."""
    if like == "'" and "\n" not in value:
        return "'" + value.replace("'", "''") + "'"
    if like in (None, "") and PLAIN_SAFE.fullmatch(value) and (typed or not RESOLVES.fullmatch(value)):
        return value
    return json.dumps(value)


# --------------------------------------------------------------------------- containers


class SeqContainer:
    """A YAML sequence of scalars used as an argument list (k8s `args`, compose `command`)."""

    def __init__(self, text: str, node):
        self.text = text
        self.node = node
        self.items = list(node.value)

    def _scalar(self, i: int):
        item = self.items[i]
        return item if is_scalar(item) and item.style not in ("|", ">") else None

    def rename_prefix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        item = self._scalar(i)
        if item is None:
            return None
        src = self.text[item.start_mark.index:item.end_mark.index]
        skip = 1 if item.style in ('"', "'") else 0
        if src[skip:].startswith(old):
            start = item.start_mark.index + skip
            return [TextEdit(start, start + len(old), new)]
        return None

    def replace_suffix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        item = self._scalar(i)
        if item is None or not item.value.endswith(old):
            return None
        return self.replace(i, i + 1, [item.value[: len(item.value) - len(old)] + new])

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        if any(self._scalar(k) is None for k in range(i, j)):
            return None
        if self.node.flow_style:
            return self._replace_flow(i, j, new_tokens)
        return self._replace_block(i, j, new_tokens)

    def _replace_flow(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        # Item by item, so that comments between items (multi-line flow lists) stay put.
        items = self.items
        style = items[i].style if items[i].style in ('"', "'") else None
        paired = min(j - i, len(new_tokens))
        edits = [TextEdit(items[i + k].start_mark.index, items[i + k].end_mark.index,
                          render_scalar(new_tokens[k], items[i + k].style if items[i + k].style in ('"', "'") else None))
                 for k in range(paired)]
        if len(new_tokens) > paired:
            at = items[i + paired - 1].end_mark.index if paired else items[i].start_mark.index
            extra = ", ".join(render_scalar(t, style) for t in new_tokens[paired:])
            edits.append(TextEdit(at, at, (", " + extra) if paired else extra + ", "))
            return edits if paired or i < len(items) else None
        if paired == j - i:
            return edits
        first_gone = i + paired
        spans = self._spans()
        if j < len(items):  # delete up to the next item
            start, end = items[first_gone].start_mark.index, items[j].start_mark.index
        elif first_gone > 0:  # delete from the end of the previous item
            start, end = items[first_gone - 1].end_mark.index, items[j - 1].end_mark.index
        else:
            start, end = items[first_gone].start_mark.index, items[j - 1].end_mark.index
        edits.append(TextEdit(start, end, kept_comments(self.text, start, end, spans)))
        return edits

    def _spans(self) -> list[tuple[int, int]]:
        return [(item.start_mark.index, item.end_mark.index) for item in self.items]

    def _replace_block(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        # Item by item: every replaced item keeps its own line and comment; extra tokens go on
        # new lines after the last item; removed items leave their comments behind.
        first = self.items[i]
        dash = _dash_start(self.text, first.start_mark.index)
        if dash is None and (len(new_tokens) != j - i):
            return None
        indent = dash[1] if dash else ""
        style = first.style if first.style in ('"', "'") else None
        paired = min(j - i, len(new_tokens))
        edits = [TextEdit(self.items[i + k].start_mark.index, self.items[i + k].end_mark.index,
                          render_scalar(new_tokens[k], self.items[i + k].style))
                 for k in range(paired)]
        if len(new_tokens) > paired:
            anchor = self.items[j - 1]
            end = _line_end(self.text, anchor.end_mark.index)
            if end == len(self.text) and not self.text.endswith("\n"):
                prefix, suffix = "\n", ""
            else:
                prefix, suffix = "", "\n"
            rest = "\n".join(f"{indent}- {render_scalar(t, style)}" for t in new_tokens[paired:])
            edits.append(TextEdit(end, end, prefix + rest + suffix))
        for k in range(i + paired, j):
            item = self.items[k]
            item_dash = _dash_start(self.text, item.start_mark.index)
            if item_dash is None:
                return None
            line_start, item_indent = item_dash
            end = _line_end(self.text, item.end_mark.index)
            comments = kept_comments(self.text, item.end_mark.index, end, [])
            edits.append(TextEdit(line_start, end, f"{item_indent}{comments.lstrip()}" if comments else ""))
        return edits


def kept_comments(text: str, start: int, end: int, scalar_spans: Sequence[tuple[int, int]]) -> str:
    """What must stay of text[start:end] when the YAML in it is deleted: its comments, each
    with its newline, and the indentation after the last newline (so the next item keeps its
    place). '' when there is no comment."""
    found = comments_in(text, start, end, scalar_spans)
    if not found:
        return ""
    out = []
    for c_start, c_end in found:
        piece = text[c_start:c_end]
        if c_end < end and text[c_end:c_end + 1] == "\n":
            piece += "\n"
        out.append(piece)
    last_newline = text.rfind("\n", start, end)
    tail = text[last_newline + 1:end] if last_newline >= 0 and found[-1][1] <= last_newline else ""
    result = "".join(out) + (tail if tail.strip() == "" else "")
    if start > 0 and text[start - 1] not in " \t\n" and result.startswith("#"):
        result = " " + result
    return result


def comments_in(text: str, start: int, end: int, scalar_spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) of each YAML comment in text[start:end], outside the given scalars."""
    found = []
    pos = start
    while True:
        hit = text.find("#", pos, end)
        if hit < 0:
            return found
        inside = any(s <= hit < e for s, e in scalar_spans)
        if not inside and (hit == 0 or text[hit - 1] in " \t\n"):
            stop = text.find("\n", hit, end)
            stop = end if stop < 0 else stop
            found.append((hit, stop))
            pos = stop
        else:
            pos = hit + 1


def _dash_start(text: str, item_start: int) -> tuple[int, str] | None:
    """(line start, indentation) of a block-sequence item whose `- ` is on its own line start."""
    line_start = text.rfind("\n", 0, item_start) + 1
    prefix = text[line_start:item_start]
    match = re.fullmatch(r"( *)- +", prefix)
    return (line_start, match.group(1)) if match else None


def content_end(node) -> int:
    """End of a node's own text: block collections end where the next token starts, so use
    the end of their last scalar or flow child instead."""
    if is_scalar(node) or node.flow_style or not node.value:
        return node.end_mark.index
    last = node.value[-1]
    return content_end(last[1] if is_map(node) else last)


def _line_end(text: str, pos: int) -> int:
    """Offset just after the newline that ends the line containing `pos` (keeps comments)."""
    if pos > 0 and text[pos - 1] == "\n":
        return pos
    newline = text.find("\n", pos)
    return len(text) if newline < 0 else newline + 1


class ConfigContainer:
    """An SGLang `--config` mapping: keys are flags (kebab-case, no dashes)."""

    def __init__(self, text: str, mapping, entries: list[tuple[object, object, int]]):
        self.text = text
        self.mapping = mapping
        # per token: (key node, value node or item node or None, role) role: 'key' | 'value'
        self.slots: list[tuple[object, object, str]] = []
        self.entries = entries

    def add(self, key, node, role: str) -> int:
        self.slots.append((key, node, role))
        return len(self.slots) - 1

    def rename_prefix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        key, _, role = self.slots[i]
        if role != "key" or not old.startswith("--") or not new.startswith("--"):
            return None
        src = self.text[key.start_mark.index:key.end_mark.index]
        skip = 1 if key.style in ('"', "'") else 0
        if not src[skip:].startswith(old[2:]):
            return None
        start = key.start_mark.index + skip
        return [TextEdit(start, start + len(old) - 2, new[2:])]

    def replace_suffix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        return None

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        roles = [self.slots[k][2] for k in range(i, j)]
        if all(r == "value" for r in roles) and j - i == 1 and len(new_tokens) == 1:
            _, node, _ = self.slots[i]
            typed = node.tag != STR_TAG
            return [TextEdit(node.start_mark.index, node.end_mark.index,
                             render_scalar(new_tokens[0], node.style, typed))]
        if roles[0] != "key" or (j < len(self.slots) and self.slots[j][2] != "key"):
            return None
        return self._rewrite_entries(i, j, new_tokens)

    def _rewrite_entries(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        first_key = self.slots[i][0]
        keys = []
        for k in range(i, j):
            if self.slots[k][0] not in keys:
                keys.append(self.slots[k][0])
        values = [next(v for k, v in self.mapping.value if k is key) for key in keys]
        line_start = self.text.rfind("\n", 0, first_key.start_mark.index) + 1
        indent = self.text[line_start:first_key.start_mark.index]
        if self.mapping.flow_style and first_key.style == '"':
            return self._rewrite_json(keys, values, new_tokens, indent)
        if indent.strip() or self.mapping.flow_style:
            return None
        end = _line_end(self.text, content_end(values[-1]))
        spans = [(n.start_mark.index, n.end_mark.index) for node in [*keys, *values]
                 for n in _nodes(node) if is_scalar(n)]
        comments = comments_in(self.text, line_start, end, spans)
        lines = [indent + line for line in config_lines(new_tokens)]
        texts = [self.text[c_start:c_end] for c_start, c_end in comments]
        if lines and comments:
            # the first comment that trails a value stays on the first line, with its spacing
            c_start, c_end = comments[0]
            before = self.text[self.text.rfind("\n", 0, c_start) + 1:c_start]
            if before.strip():
                gap = len(before) - len(before.rstrip(" \t"))
                lines[0] += self.text[c_start - gap:c_start] + texts.pop(0)
        lines[1:1] = [indent + t for t in texts] if lines else []
        if not lines:
            lines = [indent + t for t in texts]
        body = "".join(line + "\n" for line in lines)
        if end == len(self.text) and not self.text.endswith("\n"):
            body = body[:-1]
        return [TextEdit(line_start, end, body)]


    def _rewrite_json(self, keys, values, new_tokens, indent: str) -> list[TextEdit] | None:
        """JSON (a flow mapping with quoted keys): the entries from the first key to the last
        value become `"key": value` entries, one a line when the entries are one a line; the
        separator after them stays as written."""
        start, end = keys[0].start_mark.index, values[-1].end_mark.index
        sep = ",\n" + indent if not indent.strip() else ", "
        if not new_tokens:
            entries = [k for k, _ in self.mapping.value]
            at = next(n for n, k in enumerate(entries) if k is keys[-1])
            if at + 1 < len(entries):
                end = entries[at + 1].start_mark.index
            else:
                first = next(n for n, k in enumerate(entries) if k is keys[0])
                if first == 0:
                    return None
                start = self.mapping.value[first - 1][1].end_mark.index
            return [TextEdit(start, end, "")]
        return [TextEdit(start, end, sep.join(json_entries(new_tokens)))]


def flag_groups(tokens: Sequence[str]) -> list[list[str]]:
    """Tokens cut into `[--flag, values...]` groups (tokens before the first flag dropped)."""
    groups: list[list[str]] = []
    for token in tokens:
        if token.startswith("--"):
            groups.append([token])
        elif groups:
            groups[-1].append(token)
    return groups


def json_entries(tokens: Sequence[str]) -> list[str]:
    """`--flag v` groups as JSON `"flag": v` entries (switches true, numbers bare, lists as arrays)."""
    def value(v: str) -> str:
        if re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", v) or v in ("true", "false", "null"):
            return v
        return json.dumps(v)

    out = []
    for flag, *values in flag_groups(tokens):
        shown = "true" if not values else value(values[0]) if len(values) == 1 else \
            "[" + ", ".join(value(v) for v in values) + "]"
        out.append(f"{json.dumps(flag[2:])}: {shown}")
    return out


def config_lines(tokens: Sequence[str]) -> list[str]:
    """`--flag v` groups as `flag: v` lines (switches as `flag: true`, lists as flow lists)."""
    lines: list[str] = []
    for flag, *values in flag_groups(tokens):
        key = flag[2:]
        if not values:
            lines.append(f"{key}: true")
        elif len(values) == 1:
            lines.append(f"{key}: {render_scalar(values[0], None, typed=True)}")
        else:
            lines.append(f"{key}: [{', '.join(render_scalar(v, None, typed=True) for v in values)}]")
    return lines


# --------------------------------------------------------------------------- config files


FLOW_FALSE: list[tuple[int, str]] = []


def read_config(text: str) -> Document:
    """An SGLang `--config` file as one site (environment cannot be set there)."""
    doc = Document()
    FLOW_FALSE.clear()
    for root in compose(text):
        if not is_map(root):
            doc.errors.append((root.start_mark.line + 1, "config root is not a mapping"))
            continue
        doc.sites.append(_config_site(text, root))
    for line, flag in FLOW_FALSE:
        doc.errors.append((line, f"the key {flag[2:]}: false names an SGLang flag; a renamed or removed flag's key "
                           "stops SGLang's loader even when false: rename or delete it by hand", flag, "variable"))
    return doc


def _config_site(text: str, root) -> Site:
    container = ConfigContainer(text, root, [])
    args: list[str] = []
    refs: list[TokenRef] = []

    def push(value: str, key, node, role: str) -> None:
        index = container.add(key, node, role)
        args.append(value)
        refs.append(TokenRef(container, index, (node or key).start_mark.line + 1))

    false_keys = []
    for key, value in root.value:
        if not is_scalar(key):
            continue
        flag = SCHEMA.lookup("--" + str(key.value))
        if is_scalar(value) and value.tag == BOOL_TAG and (flag is None or flag.kind is Kind.BOOL):
            if value.value.lower() in ("true", "yes", "on"):
                push("--" + key.value, key, None, "key")
            elif not root.flow_style:
                false_keys.append(_false_key(text, key, value))
            else:  # JSON: `"enable-deepep-waterfill": false` stops the loader under a dead name all the same
                FLOW_FALSE.append((key.start_mark.line + 1, "--" + str(key.value)))
        elif is_seq(value) and value.value and all(is_scalar(v) for v in value.value):
            push("--" + key.value, key, None, "key")
            for item in value.value:
                push(str(item.value), key, item, "value")
        elif is_scalar(value) and value.tag != "tag:yaml.org,2002:null":
            push("--" + key.value, key, None, "key")
            push(str(value.value), key, value, "value")
    return Site(args=tuple(args), dynamic=tuple(False for _ in args), refs=tuple(refs),
                line=root.start_mark.line + 1, launcher="sglang serve --config", fmt="config",
                env_hint="export the variable in the script or manifest that runs `sglang serve --config FILE`",
                false_keys=tuple(k for k in false_keys if k is not None))


def _false_key(text: str, key, value):
    from sglaunch.migrate.tokens import FalseKey

    skip = 1 if key.style in ('"', "'") else 0
    line_start = text.rfind("\n", 0, key.start_mark.index) + 1
    if text[line_start:key.start_mark.index].strip():
        return None
    end = _line_end(text, value.end_mark.index)
    comments = comments_in(text, value.end_mark.index, end, [])
    comment = text[comments[0][0]:comments[0][1]] if comments else ""
    return FalseKey("--" + str(key.value), key.start_mark.index + skip, key.start_mark.line + 1,
                    line_start, end, comment)


# --------------------------------------------------------------------------- k8s / compose / any YAML


def read_manifest(text: str, fmt: str, origin: str | None = None) -> Document:
    """Kubernetes manifests, compose files, CI workflows and other YAML: every launch command
    inside. CI `run:` / `script:` steps see the `env:` / `variables:` maps of the workflow, job
    and step around them; compose services their `env_file:` files (read next to `origin`)."""
    doc = Document()
    consumed: set[int] = set()
    ranged, used = _chart_value_paths(origin) if fmt == "yaml" and origin else ([], [])
    for root in compose(text):
        for path in used:  # `extraArgs: "--x 1 --y"` that a template writes into a command: its words are flags
            node = _at_path(root, path)
            if node is None or not is_scalar(node) or node.tag != STR_TAG or id(node) in consumed:
                continue
            value = str(node.value)
            mapper = _mapper_for(text, node) if value.lstrip().startswith("--") else None
            container = shell.split_words(value, mapper) if mapper is not None else None
            if container is None or not flag_list([t.value for t in container.tokens]):
                continue
            tokens = container.tokens
            line = node.start_mark.line + 1
            doc.sites.append(Site(args=tuple(t.value for t in tokens), dynamic=tuple(t.dynamic for t in tokens),
                                  refs=tuple(TokenRef(container, k, line) for k in range(len(tokens))),
                                  line=node.start_mark.line + 1, fmt=fmt,
                                  launcher=f"a Helm chart's .Values.{path} (a template writes it into the command)",
                                  env_hint="set it in the chart's container env"))
            consumed.add(id(node))
        if fmt == "workflow":
            _non_shell_steps(text, root, consumed, doc)
        for mapping in _mappings(root):  # Azure Pipelines `- pwsh: ...` / `- powershell: ...` steps
            for key, value in mapping.value:
                if is_scalar(key) and str(key.value) in ("pwsh", "powershell", "cmd", "PowerShell@2") \
                        and is_scalar(value) and id(value) not in consumed:
                    consumed.add(id(value))
                    body = str(value.value)
                    if shell.mentions(body) or STRAY_FLAG.search(body):
                        doc.errors.append((value.start_mark.line + 1, f"a `{key.value}:` step: the tool reads only "
                                           "POSIX shell and Python steps; a launch there is neither checked nor "
                                           "fixed; check it by hand", body,
                                           "unreadable" if shell.mentions(body) else "variable"))
        for path in ranged:  # a chart's values mapping the templates turn into flags: read as flags
            node = _at_path(root, path)
            if node is not None and is_map(node) and node.value and not node.flow_style \
                    and any(is_scalar(k) and SCHEMA.lookup("--" + str(k.value)) for k, _ in node.value):
                site = _config_site(text, node)
                site.launcher = f"a Helm chart's .Values.{path} (the templates range over it)"
                site.env_hint = "set it in the chart's container env"
                doc.sites.append(site)
                consumed.update(id(k) for k, _ in node.value)
                consumed.update(id(n) for _, v in node.value for n in _nodes(v))
        for mapping in _mappings(root):
            if _has_command_keys(mapping):
                doc.sites.extend(_container_sites(text, mapping, fmt, consumed, origin, doc))
        prose = _prose(root)
        for node, env in _nodes_with_env(root, {}):
            if id(node) not in consumed and id(node) not in prose:
                for site in _loose_sites(text, node, fmt, doc):
                    site.env = {**env, **site.env}
                    doc.sites.append(site)
                if is_seq(node) and (shell._find_launcher([str(i.value) for i in node.value if is_scalar(i)])
                                     or flag_list([str(i.value) for i in node.value if is_scalar(i)])):
                    consumed.update(id(i) for i in node.value)
        doc.errors.extend(_stray_flags(root, consumed))
    return doc


POSIX_SHELLS = ("bash", "sh", "zsh", "dash", "ksh", "ash")
RANGE_VALUES = re.compile(r"\{\{-?\s*range\s+\$[A-Za-z0-9_]+\s*,\s*\$[A-Za-z0-9_]+\s*:=\s*"
                          r"\$?\.Values\.([A-Za-z0-9_.]+)")


def _default_shell(node) -> str | None:
    """`defaults: {run: {shell: X}}` of a workflow or a job."""
    if not is_map(node):
        return None
    _, defaults = get(node, "defaults")
    _, run = get(defaults, "run") if defaults is not None and is_map(defaults) else (None, None)
    _, shell_node = get(run, "shell") if run is not None and is_map(run) else (None, None)
    return str(shell_node.value) if shell_node is not None and is_scalar(shell_node) else None


def _steps_with_shell(root):
    """(run node, shell) of every step with a `shell:` of its own, or one inherited from the job's
    or the workflow's `defaults: run: shell:`."""
    seen: set[int] = set()
    for mapping in _mappings(root):
        _, shell_node = get(mapping, "shell")
        _, run = get(mapping, "run")
        if shell_node is not None and run is not None and is_scalar(shell_node) and is_scalar(run):
            seen.add(id(run))
            yield run, str(shell_node.value)
    top = _default_shell(root)
    _, jobs = get(root, "jobs") if is_map(root) else (None, None)
    for _, job in (jobs.value if jobs is not None and is_map(jobs) else []):
        default = _default_shell(job) or top
        _, runs_on = get(job, "runs-on") if is_map(job) else (None, None)
        labels = [str(n.value) for n in _nodes(runs_on) if is_scalar(n)] if runs_on is not None else []
        if default is None and any(label.lower().startswith("windows") for label in labels):
            default = "pwsh"  # a Windows runner's steps run in PowerShell unless they say otherwise
        _, steps = get(job, "steps") if is_map(job) else (None, None)
        if default is None or steps is None or not is_seq(steps):
            continue
        for step in steps.value:
            _, run = get(step, "run") if is_map(step) else (None, None)
            if run is not None and is_scalar(run) and id(run) not in seen:
                yield run, default


VALUES_USE = re.compile(r"\{\{-?\s*(?:\$)?\.Values\.([A-Za-z0-9_.]+)\s*(?:\|[^}]*)?-?\}\}")


def _chart_value_paths(origin: str) -> tuple[list[str], list[str]]:
    """(paths ranged over into flags, paths written into a launch command) of a chart's values:
    `range $k, $v := .Values.x` with `--{{ $k }}` in its body, and `{{ .Values.extraArgs }}` on a
    line of a template that also names a launcher or a flag (`... launch_server {{ .Values.extraArgs }}`)
    or in an `args:`/`command:` item."""
    bodies = _chart_template_bodies(origin)
    ranged, used = _chart_ranged_maps(bodies), []
    for body in bodies:
        for line in body.split("\n"):
            if "--" not in line and not shell.mentions(line) and not re.match(r"\s*-\s*\{\{", line):
                continue
            for match in VALUES_USE.finditer(line):
                if match.group(1) not in used:
                    used.append(match.group(1))
    return ranged, used


def _chart_template_bodies(origin: str) -> list[str]:
    """The text of every template (.yaml, .yml, .tpl) of the chart a values file belongs to (a
    `Chart.yaml` and `templates/` beside it, or one folder up), in path order; none without one."""
    from pathlib import Path

    folder = Path(origin).resolve().parent
    chart = next((f for f in (folder, folder.parent) if (f / "Chart.yaml").is_file() and (f / "templates").is_dir()),
                 None)
    if chart is None:
        return []
    bodies = []
    for template in sorted((chart / "templates").rglob("*")):
        if template.suffix not in (".yaml", ".yml", ".tpl") or not template.is_file():
            continue
        try:
            bodies.append(template.read_text(errors="replace"))
        except OSError:
            continue
    return bodies


def _chart_ranged_maps(bodies: list[str]) -> list[str]:
    """The `.Values` paths the chart's templates (`bodies`) range over as key/value pairs
    (`{{- range $k, $v := .Values.server.options }}` ... `- --{{ $k }}={{ $v }}`)."""
    paths: list[str] = []
    for body in bodies:
        for match in RANGE_VALUES.finditer(body):
            close = re.search(r"\{\{-?\s*end\b", body[match.end():])
            following = body[match.end():match.end() + close.start()] if close else body[match.end():]
            if "--{{" in following and match.group(1) not in paths:  # the pair becomes a flag
                paths.append(match.group(1))
    return paths


def _at_path(root, path: str):
    node = root
    for part in path.split("."):
        if not is_map(node):
            return None
        _, node = get(node, part)
        if node is None:
            return None
    return node


class _MappedContainer:
    """A container of another reader (a Python argument list) whose edits `mapper` moves into
    the file (the step's `run:` block scalar)."""

    def __init__(self, inner, mapper):
        self.inner, self.mapper = inner, mapper

    def _moved(self, edits):
        if edits is None:
            return None
        moved = [self.mapper(e) for e in edits]
        return None if any(m is None for m in moved) else moved

    def rename_prefix(self, i, old, new):
        return self._moved(self.inner.rename_prefix(i, old, new))

    def replace_suffix(self, i, old, new):
        return self._moved(self.inner.replace_suffix(i, old, new))

    def replace(self, i, j, new_tokens):
        return self._moved(self.inner.replace(i, j, new_tokens))


def _non_shell_steps(text: str, root, consumed: set[int], doc: "Document") -> None:
    """GitHub Actions steps with a `shell:` that is not a POSIX shell: `shell: python` (also
    `python {0}`) runs the `run:` body as Python, read with the Python reader; pwsh, powershell,
    cmd and custom shells are not read, and a body holding a launch (or a rule's flag) is
    reported as manual."""
    for run, shell_value in _steps_with_shell(root):
        program = shell_value.strip().split(" ", 1)[0]
        name = os.path.basename(program)
        if name in POSIX_SHELLS:
            continue
        consumed.add(id(run))
        body = str(run.value)
        first = _script_line(run, run.start_mark.line, 0)  # line of the body's first line, minus one
        if re.fullmatch(r"python[0-9.]*", name):
            from sglaunch.migrate import pyfmt

            mapper = _mapper_for(text, run)
            try:
                inner = pyfmt.read_python(body)
            except SyntaxError as exc:
                doc.errors.append((first + (exc.lineno or 1), f"the `shell: {program}` step is not Python the tool "
                                   f"can parse ({exc.msg}); a launch there is neither checked nor fixed", body,
                                   "unreadable" if shell.mentions(body) else "variable"))
                continue
            wrapped: dict[int, _MappedContainer] = {}
            for site in inner.sites:
                if mapper is not None:
                    site.refs = tuple(TokenRef(wrapped.setdefault(id(r.container),
                                                                  _MappedContainer(r.container, mapper)),
                                               r.index, first + r.line) for r in site.refs)
                else:  # the block cannot be lined up with the file: nothing is edited, every rule reports
                    site.refs = tuple(TokenRef(_MappedContainer(r.container, lambda e: None), r.index, first + r.line)
                                      for r in site.refs)
                site.line = first + site.line
                site.set_env = None
                site.env_hint = "set it in the step's env:"
                site.fmt = "workflow"
                doc.sites.append(site)
            for problem in inner.errors:
                doc.errors.append((first + problem[0],) + tuple(problem[1:]))
            continue
        if shell.mentions(body) or STRAY_FLAG.search(body):
            doc.errors.append((run.start_mark.line + 1, f"a `shell: {program}` step: the tool reads only POSIX "
                               "shell and Python steps; a launch there is neither checked nor fixed; check it by "
                               "hand", body, "unreadable" if shell.mentions(body) else "variable"))


STRAY_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]+")


FLAG_KEY = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
PROSE_KEYS = frozenset({"labels", "annotations", "description", "summary", "title", "help", "notes", "note",
                        "comment", "comments", "changelog"})


def _prose(root) -> set[int]:
    """Nodes under labels, annotations and descriptions: text for people, never run."""
    prose: set[int] = set()
    for node in _nodes(root):
        if is_map(node):
            for key, value in node.value:
                if is_scalar(key) and str(key.value).lower() in PROSE_KEYS:
                    prose.update(id(n) for n in _nodes(value))
    return prose


def _embedded_config(item, text: str, key) -> list:
    """A ConfigMap's `server.yaml: |` holding an SGLang --config mapping: each key of a rule's flag
    is reported (the block is mounted and read by `--config`, which the tool does not follow)."""
    try:
        docs = compose(text)
    except YamlError:
        return []
    found = []
    for doc in docs:
        if not is_map(doc) or not _looks_like_config(doc):
            continue
        first = item.start_mark.line + (1 if item.style in ("|", ">") else 0)
        for k, v in doc.value:
            if is_scalar(k) and is_scalar(v) and str(v.value).lower() not in ("false", "none", "null", ""):
                flag = "--" + str(k.value)
                shown = flag if str(v.value).lower() == "true" else f"{flag} {v.value}"
                found.append((first + k.start_mark.line + 1, f"`{key.value}` holds an SGLang --config mapping the "
                              f"tool does not read as one ({flag}); check and fix it by hand", shown, "variable"))
    return found


def _stray_flags(root, consumed: set[int]) -> list:
    """String values outside any launch the reader found that hold launch flags (an env var
    `SGLANG_ARGS: "--x"`, a chart value): reported by the engine when a rule is about one of
    them, since nothing here can be checked or fixed."""
    found = []
    prose = _prose(root)
    for node in _nodes(root):
        if not is_map(node) or id(node) in prose:
            continue
        for key, value in node.value:
            if id(value) in prose:
                continue
            bare = str(key.value)[2:] if is_scalar(key) and str(key.value).startswith("--") else \
                str(key.value) if is_scalar(key) else ""
            if is_scalar(key) and is_scalar(value) and id(key) not in consumed and FLAG_KEY.fullmatch(bare) \
                    and SCHEMA.lookup("--" + bare.replace("_", "-")) is not None \
                    and str(value.value).lower() not in ("false", "none", "null", ""):
                # `sglang: {flags: {enable-deepep-waterfill: true}}`: a chart turns the map into flags;
                # `{"--tp": 8, "--enable-deepep-waterfill": true}` in a launcher's JSON
                flag = "--" + bare.replace("_", "-")
                shown = flag if str(value.value).lower() == "true" else f"{flag} {value.value}"
                found.append((key.start_mark.line + 1, f"`{key.value}` names the SGLang flag {flag} in a mapping the "
                              "tool does not read as a launch; check and fix it by hand", shown, "variable"))
            items = value.value if is_seq(value) else [value]
            for item in items:
                if not is_scalar(item) or item.tag != STR_TAG or id(item) in consumed:
                    continue
                text = str(item.value)
                if "\n" in text.strip() and ":" in text and not _mentions_launch(text):
                    found.extend(_embedded_config(item, text, key))
                if STRAY_FLAG.search(text) and not _mentions_launch(text):
                    found.append((item.start_mark.line + 1, f"`{key.value}` holds what looks like SGLang launch "
                                  "flags in a place the tool does not read as a launch; check and fix it by hand",
                                  text, "variable"))
    return found


def _nodes_with_env(node, env: dict[str, str]) -> Iterator:
    """Every node with the environment its CI step would see: `env:` (GitHub Actions) and
    `variables:` (GitLab CI) maps of scalars, inner ones overriding outer ones."""
    if is_map(node):
        local = dict(env)
        _, job_container = get(node, "container")  # GitHub Actions: the job's container env
        sources = [node] + ([job_container] if job_container is not None and is_map(job_container) else [])
        for key, holder in [(k, h) for h in sources for k in ("env", "variables", "envs")]:
            _, value = get(holder, key)  # GitHub Actions, GitLab CI, SkyPilot
            if value is not None and is_map(value):
                for k, v in value.value:
                    if is_scalar(k) and is_scalar(v):
                        local[str(k.value)] = str(v.value)
                    elif is_scalar(k) and is_map(v):  # GitLab `NAME: {value: x, description: ...}`
                        _, inner = get(v, "value")
                        if inner is not None and is_scalar(inner):
                            local[str(k.value)] = str(inner.value)
        yield node, local
        for key, value in node.value:
            yield from _nodes_with_env(key, local)
            yield from _nodes_with_env(value, local)
    elif is_seq(node):
        yield node, env
        for item in node.value:
            yield from _nodes_with_env(item, env)
    else:
        yield node, env


MASK = "\ue000"  # stands for each character of a Helm `{{ ... }}` directive
DIRECTIVE = re.compile(r"\{\{.*?\}\}", re.S)


def mask_helm(text: str) -> str:
    """A Helm template with every `{{ ... }}` directive masked, same length: a line that holds
    only directives becomes blank, a directive inside a value one MASK per character (the
    newlines inside a directive are kept), so ruamel.yaml reads the template's YAML."""
    out = []
    previous = ""
    for line in text.split("\n"):
        if DIRECTIVE.sub("", line).strip() == "" and "{{" in line:
            # a `{{- if }}` line inside a continued shell command keeps the continuation going
            # (`{{-` trims the newline before it, so the rendered command stays one command)
            keep = previous.rstrip().endswith("\\") and len(line) > 0
            out.append(" " * (len(line) - 1) + "\\" if keep else " " * len(line))
        else:
            out.append(line)
            previous = line
    masked = "\n".join(out)
    return DIRECTIVE.sub(lambda m: "".join(c if c == "\n" else MASK for c in m.group(0)), masked)


ACTIONS_EXPR = re.compile(r"\$\{\{.*?\}\}", re.S)


def mask_actions(text: str) -> str:
    """A workflow with every `${{ ... }}` expression written as a shell expansion of the same
    length (`${__________}`): values the rules cannot know, and valid shell."""
    return ACTIONS_EXPR.sub(lambda m: "${" + "".join("\n" if c == "\n" else "_" for c in m.group(0)[2:-1]) + "}",
                            text)


HELM_TOKEN = re.compile(r"\{\{-?\s*(define|if|range|with|block|end)\b[^}]*\}\}")


def _blank(text: str) -> str:
    return "".join("\n" if c == "\n" else " " for c in text)


def helm_variants(text: str) -> list[str]:
    """A template holding `{{ define }}` blocks as one text per block (everything else blanked,
    same length) plus the text outside them: a helpers file's bodies (a command line, an env
    list, a list of flags) are separate YAML documents, not one. [text] when it has none."""
    blocks: list[tuple[int, int]] = []
    depth, start = 0, None
    for match in HELM_TOKEN.finditer(text):
        word = match.group(1)
        if word == "define" and depth == 0:
            start, depth = match.end(), 1
        elif word in ("if", "range", "with", "block", "define") and start is not None:
            depth += 1
        elif word == "end" and start is not None:
            depth -= 1
            if depth == 0:
                blocks.append((start, match.start()))
                start = None
    if not blocks:
        return [text]
    variants = []
    for a, b in blocks:
        variants.append(_blank(text[:a]) + text[a:b] + _blank(text[b:]))
    outside, last = [], 0
    for a, b in blocks:
        # the define line itself up to its body and the body are blanked; the closing {{ end }} stays blank too
        head = text.rfind("{{", 0, a)
        outside.append(text[last:head])
        tail = text.find("}}", b)
        outside.append(_blank(text[head:tail + 2 if tail >= 0 else len(text)]))
        last = tail + 2 if tail >= 0 else len(text)
    outside.append(text[last:])
    rest = "".join(outside)
    if rest.strip() and DIRECTIVE.sub("", rest).strip():
        variants.append(rest)
    return variants


def read_helm(text: str, origin: str | None = None) -> Document:
    """A Helm chart template: the masked YAML read as Kubernetes manifests. Values that hold a
    directive are shell text to the rules (`--quantization {{ .Values.q }}` is reported, never
    guessed); the engine refuses any edit that would touch a directive. A file of `{{ define }}`
    blocks is read block by block (`helm_variants`)."""
    variants = helm_variants(text)
    doc = Document()
    for variant in variants:
        masked = mask_helm(variant)
        try:
            part = read_manifest(masked, "k8s", origin)
        except YamlError as exc:
            if len(variants) == 1:
                raise YamlError(f"{exc} (after masking the template's {{{{ }}}} directives)") from None
            first = len(variant) - len(variant.lstrip())
            line = text.count("\n", 0, first) + 1
            doc.errors.append((line, f"a {{{{ define }}}} body the tool cannot read as YAML ({exc}); a launch there "
                               "is neither checked nor fixed", variant.strip(), "unreadable"))
            continue
        doc.sites.extend(part.sites)
        doc.errors.extend(part.errors)
    for site in doc.sites:
        site.dynamic = tuple(d or MASK in a for a, d in zip(site.args, site.dynamic))
        site.args = tuple(re.sub(MASK + "+", "{{...}}", a) for a in site.args)  # as shown in findings
        site.fmt = "helm"
    return doc


def _nodes(node) -> Iterator:
    yield node
    if is_map(node):
        for key, value in node.value:
            yield from _nodes(key)
            yield from _nodes(value)
    elif is_seq(node):
        for item in node.value:
            yield from _nodes(item)


def _mappings(node) -> Iterator:
    return (n for n in _nodes(node) if is_map(n))


def _has_command_keys(mapping) -> bool:
    return any(get(mapping, key)[1] is not None for key in ("command", "args", "entrypoint"))


@dataclass
class _Part:
    """One piece of a container's argv: a YAML list or a command string."""

    container: object
    values: list[str]
    dynamic: list[bool]
    nodes: list  # per value: the scalar node it came from (a string part repeats its node)
    lines: list[int]


def _container_sites(text: str, mapping, fmt: str, consumed: set[int], origin: str | None = None,
                     doc: "Document | None" = None) -> list[Site]:
    parts: list[_Part] = []
    taken: set[int] = set()
    for key in ("entrypoint", "command", "args"):
        _, node = get(mapping, key)
        if node is None:
            continue
        part = _part(text, node)
        if part is None:
            return []
        taken.update(id(n) for n in _nodes(node))
        parts.append(part)
    consumed.update(taken)
    values = [v for p in parts for v in p.values]
    env, env_dynamic = _container_env(mapping)
    file_env = _env_files(mapping, origin, doc)
    env = {**file_env, **env}
    if file_env.pop(UNKNOWN_ENV, None) is not None or get(mapping, "envFrom")[1] is not None:
        env.pop(UNKNOWN_ENV, None)
        env_dynamic = set(env_dynamic) | {UNKNOWN_ENV}
    setter = _env_setter(text, mapping, fmt)
    hint = "add it to `env:`" if fmt == "k8s" else "add it to `environment:`"
    script = _shell_script(values)
    if script is not None:
        return _script_sites(text, parts, script, env, env_dynamic, setter, fmt, doc)
    found = shell._find_launcher(values)
    _, image = get(mapping, "image")
    sglang_image = image is not None and is_scalar(image) and "sglang" in str(image.value).lower()
    if found is None and sglang_image and (fmt == "compose" or get(mapping, "command")[1] is None) \
            and get(mapping, "entrypoint")[1] is None and flag_list(values):
        found = (0, 0, "image entrypoint")  # `args:` only: the image's entrypoint is the launcher
    if found is None:
        if sglang_image and doc is not None and any(v.startswith("--") for v in values) \
                and not os.path.basename(values[0]).startswith(("python", "pypy")):  # another module: its own flags
            # `command: ["/scripts/start.sh"]` + flags: handed to a script the tool does not follow
            # (another image's `args:` are that program's own: a decoy)
            doc.errors.append((mapping.start_mark.line + 1, f"the flags given to {values[0]!r} look like SGLang "
                               "launch flags, which the tool does not follow into a launch; check and fix them "
                               "by hand", " ".join(values), "variable"))
        if image is None:
            # no container here (a chart's values: `sglang: {args: [--x]}`): read as any other YAML
            consumed.difference_update(taken)
        return []
    _, end, launcher = found
    refs: list[TokenRef] = []
    flat = [(p, k) for p in parts for k in range(len(p.values))]
    for part, k in flat[end:]:
        refs.append(TokenRef(part.container, k, part.lines[k]))
    dynamic = [d for p in parts for d in p.dynamic][end:]
    return [Site(args=tuple(values[end:]), dynamic=tuple(dynamic), refs=tuple(refs),
                 line=mapping.start_mark.line + 1, launcher=launcher, env=env,
                 env_dynamic=frozenset(env_dynamic), set_env=setter, env_hint=hint, fmt=fmt)]


def _part(text: str, node) -> _Part | None:
    if is_seq(node):
        if not all(is_scalar(item) for item in node.value):
            return None
        values = [str(item.value) for item in node.value]
        return _Part(SeqContainer(text, node), values, [_is_dynamic(v) for v in values],
                     list(node.value), [item.start_mark.line + 1 for item in node.value])
    if is_scalar(node) and node.tag == STR_TAG:
        mapper = _mapper_for(text, node)
        if mapper is None:
            return None
        container = shell.split_words(str(node.value), mapper)
        if container is None:
            return None
        values = [t.value for t in container.tokens]
        lines = [_line(text, mapper, t.start) for t in container.tokens]
        return _Part(container, values, [t.dynamic for t in container.tokens], [node] * len(values), lines)
    return None


def _is_dynamic(value: str) -> bool:
    return "$(" in value or "${" in value or MASK in value


def _line(text: str, mapper, start: int) -> int:
    edit = mapper(TextEdit(start, start, ""))
    return line_of(text, edit.start) if edit else 1


def _mapper_for(text: str, node, forbidden: str | None = None):
    start, end = node.start_mark.index, node.end_mark.index
    positions = align(text[start:end], start, str(node.value))
    if positions is None:
        return None
    if forbidden is None:
        forbidden = {'"': '"\\\n', "'": "'\n", None: "\n#", "|": "", ">": "\n"}.get(node.style, "\n")
    return scalar_mapper(positions, end, forbidden)


def _shell_script(values: Sequence[str]) -> int | None:
    """Index of the script in `sh -c SCRIPT` argv lists."""
    for k, value in enumerate(values[:-1]):
        if os.path.basename(value) in SHELLS and k + 2 < len(values) and SHELL_C.fullmatch(values[k + 1]):
            return k + 2
    return None


def _script_sites(text, parts: list[_Part], index: int, env, env_dynamic, setter, fmt, doc=None) -> list[Site]:
    flat = [(p, k) for p in parts for k in range(len(p.values))]
    part, k = flat[index]
    node = part.nodes[k]
    if isinstance(part.container, SeqContainer):
        mapper = _mapper_for(text, node)
        script = str(node.value)

        def line_at(r_line: int, _ref=None) -> int:
            return _script_line(node, node.start_mark.line, r_line)
    else:
        # `sh -c "..."` inside a command string: the script is one shell word of that string;
        # edits go through the word's quoting, then through the YAML scalar's.
        mapper, script = _word_mapper(part.container, k)

        def line_at(r_line: int, ref=None) -> int:
            if ref is None:
                return part.lines[k]
            token = ref.container.tokens[ref.index]
            edit = ref.container.mapper(TextEdit(token.start, token.start, ""))
            return line_of(text, edit.start) if edit else part.lines[k]
    if mapper is None:
        if doc is not None:
            doc.errors.append((part.lines[k], CANNOT, str(script), "unreadable"))
        return []
    parsed = shell.parse_script(script, mapper, fmt=fmt)
    if doc is not None:
        from sglaunch.migrate.engine import embedded_problems

        doc.errors.extend(embedded_problems(parsed, line_at))
    sites = []
    for site in parsed.sites:
        merged = {**env, **site.env}
        dyn = (set(env_dynamic) - set(site.env)) | set(site.env_dynamic)
        refs = tuple(TokenRef(r.container, r.index, line_at(r.line, r)) for r in site.refs)
        first = refs[0].line if refs and not isinstance(part.container, SeqContainer) else line_at(site.line)
        sites.append(Site(args=site.args, dynamic=site.dynamic, refs=refs,
                          line=first, launcher=site.launcher,
                          env=merged, env_dynamic=frozenset(dyn), passthrough=site.passthrough,
                          set_env=setter or site.set_env, env_hint=site.env_hint, fmt=fmt))
    return sites


def _word_mapper(container, k: int):
    """(mapper, script) for shell word k of a command string: edits in the word's unquoted
    value become edits of the string, then of the file (None when they cannot be lined up)."""
    token = container.tokens[k]
    source = container.text[token.start:token.end]
    forbidden = {'"': '"\\$`\n', "'": "'\n"}.get(source[:1], " \t\n\"'\\$`;&|<>()#")
    positions = align(source, token.start, token.value)
    if positions is None:
        return None, token.value
    inner = scalar_mapper(positions, token.end, forbidden)

    def mapper(edit: TextEdit) -> TextEdit | None:
        moved = inner(edit)
        return None if moved is None else container.mapper(moved)

    return mapper, token.value


def _script_line(node, first_line: int, line_in_script: int) -> int:
    offset = 1 if node.style in ("|", ">") else 0
    return first_line + offset + line_in_script


def flag_list(values: Sequence[str]) -> bool:
    """An argument list of SGLang flags without a launcher (k8s `args:` for the sglang image,
    Helm `extraArgs:`): it starts with a flag and names at least one SGLang flag."""
    if not values or not values[0].startswith("--"):
        return False
    if not any(v.startswith("--") and v.split("=", 1)[0] not in GENERIC_FLAGS
               and _sglang_spelling(v.split("=", 1)[0]) for v in values):
        return False
    from sglaunch.errors import SglaunchError
    from sglaunch.flags.argv import split_argv

    try:  # a list of flag names (a schema, a doc table) is not an argument list
        split_argv(values, SCHEMA, lenient=True)
    except SglaunchError:
        return False
    return True


def _sglang_spelling(spelling: str) -> bool:
    """A flag of some SGLang release, or an abbreviation argparse expanded to one
    (`--enable-deepep-water`)."""
    if SCHEMA.lookup(spelling) is not None:
        return True
    return len(spelling) >= 8 and bool(SCHEMA.prefix_expansions(spelling, None))


# flags many programs share: a list of only these is not taken for an SGLang argument list
GENERIC_FLAGS = frozenset({"--port", "--host", "--config", "--log-level", "--model", "--model-path", "--verbose",
                           "--help", "--version", "--api-key", "--device", "--seed", "--timeout", "--debug",
                           "--name", "--revision", "--trust-remote-code", "--dtype", "--tokenizer"})


def _env_files(mapping, origin: str | None, doc: "Document | None") -> dict[str, str]:
    """Variables of a compose service's `env_file:` files (`environment:` overrides them)."""
    from sglaunch.migrate.textfmt import read_env_file

    _, node = get(mapping, "env_file")
    if node is None:
        return {}
    paths = []
    for item in (node.value if is_seq(node) else [node]):
        if is_scalar(item):
            paths.append((str(item.value), item))
        elif is_map(item) and is_scalar(get(item, "path")[1] or item):
            path_node = get(item, "path")[1]
            if path_node is not None:
                paths.append((str(path_node.value), path_node))
    env: dict[str, str] = {}
    for path, item in paths:
        read = read_env_file(path, origin)
        if read is None:
            if doc is not None:
                doc.errors.append((item.start_mark.line + 1, f"env_file {path} cannot be read here; the variables "
                                   "it sets are not checked"))
            env[UNKNOWN_ENV] = ""
            continue
        env.update(read)
    return env


CANNOT = ("a launch the tool cannot line up with its quoting or escapes here (it is neither checked nor "
          "fixed); check it by hand")


def _loose_sites(text: str, node, fmt: str, doc: "Document | None" = None) -> list[Site]:
    """Launch commands outside container specs: argv lists and embedded shell scripts."""
    if is_seq(node) and node.value and all(is_scalar(i) for i in node.value):
        part = _part(text, node)
        if part is None:
            return []
        found = shell._find_launcher(part.values)
        if found is None and flag_list(part.values):
            found = (0, 0, "argument list")
        if found is None:
            return []
        _, end, launcher = found
        refs = tuple(TokenRef(part.container, k, part.lines[k]) for k in range(end, len(part.values)))
        return [Site(args=tuple(part.values[end:]), dynamic=tuple(part.dynamic[end:]), refs=refs,
                     line=node.start_mark.line + 1, launcher=launcher, fmt=fmt,
                     env_hint="set it in the environment of the process that runs this command")]
    if is_scalar(node) and node.tag == STR_TAG and _mentions_launch(str(node.value)):
        mapper = _mapper_for(text, node)
        if mapper is None:
            if doc is not None:
                doc.errors.append((node.start_mark.line + 1, CANNOT, str(node.value), "unreadable"))
            return []
        if str(node.value).lstrip().startswith(("-m ", "-m\t")):
            # `with: {entrypoint: python3, args: -m sglang.launch_server --x}`: arguments of a python
            container = shell.split_words(str(node.value), mapper)
            found = shell._find_launcher(["python"] + [t.value for t in container.tokens]) if container else None
            if container is not None and found is not None:
                end = found[1] - 1
                tokens = container.tokens
                return [Site(args=tuple(t.value for t in tokens[end:]), dynamic=tuple(t.dynamic for t in tokens[end:]),
                             refs=tuple(TokenRef(container, k, node.start_mark.line + 1) for k in range(end, len(tokens))),
                             line=node.start_mark.line + 1, launcher=found[2], fmt=fmt,
                             env_hint="set it in the environment of the process that runs this command")]
        parsed = shell.parse_script(str(node.value), mapper, fmt=fmt)
        first = node.start_mark.line
        if doc is not None:
            from sglaunch.migrate.engine import embedded_problems

            doc.errors.extend(embedded_problems(parsed, lambda line: _script_line(node, first, line)))
        return [_relined(site, node, first) for site in parsed.sites]
    return []


def _relined(site: Site, node, first_line: int) -> Site:
    refs = tuple(TokenRef(r.container, r.index, _script_line(node, first_line, r.line)) for r in site.refs)
    site.refs = refs
    site.line = _script_line(node, first_line, site.line)
    return site


def _mentions_launch(value: str) -> bool:
    return shell.mentions(value) or "sglang serve" in value


# --------------------------------------------------------------------------- environment


def _container_env(mapping) -> tuple[dict[str, str], set[str]]:
    env: dict[str, str] = {}
    dynamic: set[str] = set()
    for key in ("env", "environment"):
        _, node = get(mapping, key)
        if node is None:
            continue
        if is_map(node):  # compose map form
            for k, v in node.value:
                if is_scalar(k):
                    env[str(k.value)] = "" if not is_scalar(v) or v.value is None else str(v.value)
                    if not is_scalar(v) or v.value is None:
                        dynamic.add(str(k.value))  # `NAME:` with no value: passed through from the host
        elif is_seq(node):
            for item in node.value:
                _env_item(item, env, dynamic)
    # `${MODE:-static}` (compose interpolation), `$(MODE)` (Kubernetes): a value the file does not fix
    dynamic.update(name for name, value in env.items() if "${" in value or "$(" in value or MASK in value)
    return env, dynamic


def _env_item(item, env: dict[str, str], dynamic: set[str]) -> None:
    if is_scalar(item):  # compose list form NAME=VALUE
        name, eq, value = str(item.value).partition("=")
        env[name] = value
        if not eq:
            dynamic.add(name)  # `- NAME`: passed through from the host, value unknown
        return
    if not is_map(item):
        return
    _, name = get(item, "name")
    _, value = get(item, "value")
    if name is None or not is_scalar(name):
        return
    if value is not None and is_scalar(value):
        env[str(name.value)] = str(value.value)
    else:
        env[str(name.value)] = ""
        dynamic.add(str(name.value))  # valueFrom: a secret or config map


def _env_setter(text: str, mapping, fmt: str):
    if mapping.flow_style:
        return None
    key_name = "env" if fmt == "k8s" else "environment"

    def set_env(name: str, value: str) -> list[TextEdit] | None:
        _, node = get(mapping, key_name, merged=False)
        if fmt != "k8s" and node is None:
            _, node = get(mapping, "env", merged=False)
        if node is None:
            if get(mapping, key_name)[1] is not None or get(mapping, "env")[1] is not None:
                return None  # merged from an anchor: a new key would replace it, an edit there reach others
            return _add_env_key(text, mapping, key_name, name, value, fmt)
        return _append_env(text, node, name, value, fmt)

    return set_env


def _append_env(text: str, node, name: str, value: str, fmt: str) -> list[TextEdit] | None:
    if not (is_map(node) or is_seq(node)):
        return None  # `environment:` left empty or a scalar: report instead of guessing its shape
    rendered = render_scalar(value)
    if node.flow_style:
        close = node.end_mark.index - 1
        if text[close:close + 1] not in ("]", "}"):
            return None
        if is_map(node):
            item = f"{name}: {rendered}"
        elif fmt == "k8s":
            item = f"{{name: {name}, value: {json.dumps(value)}}}"
        else:
            item = json.dumps(f"{name}={value}")
        sep = ", " if node.value else ""
        return [TextEdit(close, close, sep + item)]
    if not node.value:
        return None
    last = node.value[-1]
    at = _line_end(text, content_end(node))
    if is_map(node):
        key = last[0]
        indent = text[text.rfind("\n", 0, key.start_mark.index) + 1:key.start_mark.index]
        return [_insert_lines(text, at, f"{indent}{name}: {rendered}\n")] if not indent.strip() else None
    first_item = node.value[0]
    dash = _dash_start(text, first_item.start_mark.index)
    if dash is None:
        return None
    indent = dash[1]
    if fmt == "k8s":
        lines = f"{indent}- name: {name}\n{indent}  value: {json.dumps(value)}\n"
    else:
        lines = f"{indent}- {name}={value}\n"
    return [_insert_lines(text, at, lines)]


def _insert_lines(text: str, at: int, lines: str) -> TextEdit:
    """Insert whole lines at `at` (a line start, or the end of a file without a final newline)."""
    if at == len(text) and text and not text.endswith("\n"):
        return TextEdit(at, at, "\n" + lines[:-1])
    return TextEdit(at, at, lines)


def _add_env_key(text: str, mapping, key_name: str, name: str, value: str, fmt: str) -> list[TextEdit] | None:
    anchor = None
    for key in ("command", "entrypoint", "args"):
        anchor = get(mapping, key)[0]
        if anchor is not None:
            break
    if anchor is None:
        return None
    line_start = text.rfind("\n", 0, anchor.start_mark.index) + 1
    indent = text[line_start:anchor.start_mark.index]
    if indent.strip(" "):
        return None  # the key shares its line with a `- `: report instead of guessing indentation
    if fmt == "k8s":
        body = f"{indent}env:\n{indent}- name: {name}\n{indent}  value: {json.dumps(value)}\n"
    else:
        body = f"{indent}{key_name}:\n{indent}  {name}: {render_scalar(value)}\n"
    return [TextEdit(line_start, line_start, body)]
