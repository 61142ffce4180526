"""The one edit engine: read a file's launch commands, apply rule edits back to front,
re-run until nothing changes (bounded), verify the rewrite re-reads as intended and
re-validate the migrated commands against the flag schema of the target release.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Callable, Sequence

from sglaunch.migrate.evaluate import (ERROR, FIX, INFO, MANUAL, UNSAFE, Finding, Op, Rename,
                                       Replace, SetEnv, Suffix, evaluate, validate)
from sglaunch.migrate.kinds import FORMATS  # re-exported
from sglaunch.migrate.rules import Rule
from sglaunch.migrate.tokens import Site, TextEdit, apply_edits, drop_overlaps

MAX_ROUNDS = 8


class UnreadableError(Exception):
    """The text cannot be parsed in its format; the file is left alone."""


class ConvergenceError(Exception):
    """Rules kept changing the text: a rule bug, reported loudly."""


@dataclass
class Result:
    text: str  # migrated text (== original when nothing applies or on error)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    sites: int = 0  # launch commands found
    deps: int = 0  # pins and image references of the rules' packages and images found
    follow: tuple[tuple[str, str], ...] = ()  # (path as written, format or "") of the files the launches read,
    # run or include (`--config FILE`, `./serve.sh`, `-r base.txt`)


def read_sites(text: str, fmt: str, origin: str | None = None) -> tuple[list[Site], list[tuple]]:
    """Launch commands of `text` in format `fmt`, plus non-fatal read problems (line, message)
    or (line, message, source text, kind). `origin`: the file's path, for the files it names
    (compose `env_file:`, systemd `EnvironmentFile=`)."""
    from sglaunch.migrate import dockerfile, shell, yamlfmt

    if fmt.endswith(JINJA):  # an Ansible/Jinja template of another format: directives masked
        inner = fmt[:-len(JINJA)]
        sites, problems = read_sites(mask_jinja(text, inner), inner, origin)
        for site in sites:
            site.dynamic = tuple(d or JINJA_MARK in a or "${_" in a for a, d in zip(site.args, site.dynamic))
            site.fmt = fmt
        return sites, problems
    if fmt in DEPENDENCY_FORMATS:
        return [], []  # requirements files and pyproject.toml hold pins only (module deps)
    shell.ORIGIN[:] = [origin] if origin else []  # for the env files a script sources
    try:
        if fmt == "shell":
            parsed = shell.parse_script(text)
            return list(parsed.sites), shell_problems(parsed)
        if fmt == "config":
            doc = yamlfmt.read_config(text)
        elif fmt in ("k8s", "compose", "yaml"):
            doc = yamlfmt.read_manifest(text, fmt, origin)
        elif fmt == "workflow":
            doc = yamlfmt.read_manifest(yamlfmt.mask_actions(text), fmt, origin)
            for site in doc.sites:  # show `${{ matrix.q }}`, not its mask, in the findings
                site.args = tuple(_unmasked(text, site, k) if "${_" in a else a for k, a in enumerate(site.args))
        elif fmt == "helm":
            doc = yamlfmt.read_helm(text, origin)
        elif fmt == "dockerfile":
            doc = dockerfile.read_dockerfile(text)
        elif fmt in ("makefile", "systemd", "env", "supervisor"):
            from sglaunch.migrate import textfmt

            if fmt in ("systemd", "supervisor"):
                doc = (textfmt.read_systemd if fmt == "systemd" else textfmt.read_supervisor)(text, origin)
            else:
                doc = {"makefile": textfmt.read_makefile, "env": textfmt.read_envfile}[fmt](text)
        elif fmt == "python":
            from sglaunch.migrate import pyfmt

            doc = pyfmt.read_python(text)
        elif fmt == "notebook":
            from sglaunch.migrate import notebook

            doc = notebook.read_notebook(text)
        else:
            raise UnreadableError(f"unknown format {fmt}")
    except (yamlfmt.YamlError, dockerfile.DockerfileError) as exc:
        raise UnreadableError(str(exc)) from None
    except SyntaxError as exc:
        raise UnreadableError(f"invalid Python: {exc.msg} (line {exc.lineno or 1})") from None
    except RecursionError:
        raise UnreadableError("it nests too deeply (or an alias refers to itself)") from None
    return doc.sites, doc.errors


def shell_problems(parsed) -> list[tuple]:
    """A parsed script's read problems: (line, message) notices and (line, message, text, kind)
    places the engine reports as manual when they may hold a launch or a rule's flag."""
    problems: list[tuple] = []
    flagged = {line for line, _, kind in parsed.suspects if kind == "region"}
    for line in parsed.error_lines:
        if line not in flagged:
            problems.append((line, "shell syntax tree-sitter could not parse; commands there are left alone"))
    for line, source, kind in parsed.suspects:
        problems.append((line, SUSPECT_MESSAGES.get(kind.split(" ")[0], "{}").format(kind.partition(" ")[2]),
                         source, kind.split(" ")[0]))
    return problems


def embedded_problems(parsed, to_line) -> list[tuple]:
    """`shell_problems` of a script embedded in another file, at the file's lines
    (`to_line`: line in the script -> line in the file)."""
    return [(to_line(p[0]),) + tuple(p[1:]) for p in shell_problems(parsed)]


SUSPECT_MESSAGES = {
    "region": "shell syntax tree-sitter could not parse; a launch there is neither checked nor fixed",
    "variable": "${} holds what looks like SGLang launch flags, but the tool cannot follow it into a launch; "
                "check and fix it by hand",
    "unresolved": "${} is set outside this file; the launch flags it passes are not checked",
    "heredoc": "a heredoc ({}) holds an SGLang launch the tool does not read; check it by hand",
    "shell": "a shell string holds an SGLang launch the tool cannot line up with its quoting; fix it by hand",
    "nested": "launch commands nested this deep are not read; check it by hand",
    "unreadable": "{}",
    "launcher": "{} is given what look like SGLang launch flags, which the tool does not follow into a "
                "launch; check and fix them by hand",
    "built": "the shell builds a launch argument here at run time; flags in it are not checked or fixed",
}


def suspicious(text: str, rules: Sequence[Rule], release: str) -> str:
    """The first flag in `text` that a rule of the range is about or that `release` refuses ('' if none)."""
    from sglaunch.flags.registry import SCHEMA
    from sglaunch.flags.spec import Status

    words = set(re.findall(r"[A-Za-z0-9_.:/-]+", text))
    for token in re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", text):
        # an abbreviation (`--enable-deepep-water`, argparse expands unique prefixes) counts too
        abbreviation = SCHEMA.lookup(token) is None and len(token) >= 8

        def names(flag: str) -> bool:
            return token == flag or (abbreviation and flag.startswith(token))

        for rule in rules:
            if rule.kind in ("rename-flag", "remove-flag") and names(rule.old):
                return token
            if rule.kind in ("remove-value", "replace-value") and names(rule.flag) and rule.old in words:
                return f"{token} {rule.old}"
        flag = SCHEMA.lookup(token)
        if flag is not None and flag.status_at(release) is Status.REMOVED:
            return token
    return ""


def _problem_findings(problems, text: str, rules: Sequence[Rule], release: str) -> list[Finding]:
    """Read problems as findings: a place that may hold a launch (a launcher name or a rule's
    flag) which the tool cannot read is `manual`, so that --check fails; other notes are `info`."""
    from sglaunch.migrate.shell import mentions

    out = []
    launch_file = mentions(text)
    for problem in _unique(problems):
        if len(problem) == 2:
            # a parse error on a line that names a launcher or a rule's flag: that launch may be misread
            lines = text.split("\n")
            source = lines[problem[0] - 1] if 0 < problem[0] <= len(lines) else ""
            flag = suspicious(source, rules, release)
            if launch_file and (flag or mentions(source)):
                detail = f" ({flag})" if flag else ""
                out.append(Finding("unread", MANUAL, problem[0],
                                   "shell syntax tree-sitter could not parse; a launch there is neither checked "
                                   "nor fixed" + detail, token=flag))
            else:
                out.append(Finding("parse", INFO, problem[0], problem[1]))
            continue
        line, message, source, kind = problem
        flag = suspicious(source, rules, release)
        if kind == "unresolved":
            out.append(Finding("unread", INFO, line, message, token=source))
        elif kind in ("variable", "built", "launcher"):
            if flag:
                out.append(Finding("unread", MANUAL, line, f"{message} ({flag})", token=flag))
        elif flag or mentions(source) or (kind == "region" and launch_file):
            detail = f" ({flag})" if flag else ""
            out.append(Finding("unread", MANUAL, line, message + detail, token=flag))
        else:
            out.append(Finding("parse", INFO, line, message))
    return out


def migrate_text(text: str, fmt: str, rules: Sequence[Rule], to_release: str,
                 unsafe_fixes: bool = False, origin: str | None = None) -> Result:
    """Migrate one file's text: package pins and image tags first (`pin` rules, module deps;
    their edits stay inside one line), then the launch commands. Never raises for bad input:
    problems become findings/errors."""
    from sglaunch.migrate.deps import migrate_deps

    from sglaunch.migrate.depreaders import SCAN_NAME

    SCAN_NAME[:] = [PurePath(origin).name] if origin else []
    pins = migrate_deps(text, fmt, rules, to_release, unsafe_fixes)
    if pins.error and fmt in DEPENDENCY_FORMATS:
        return Result(text, pins.findings, error=pins.error, deps=pins.refs)
    launches = [r for r in rules if r.kind != "pin"]
    result = _migrate_launches(pins.text, fmt, launches, to_release, unsafe_fixes, origin)
    result.findings = _unsilenced(text, result.findings + pins.findings)
    result.deps = pins.refs
    result.follow = tuple(dict.fromkeys(result.follow + pins.scripts))
    if pins.error and result.error is None:
        result.error = pins.error
    return result


def _migrate_launches(text: str, fmt: str, rules: Sequence[Rule], to_release: str,
                      unsafe_fixes: bool = False, origin: str | None = None) -> Result:
    try:
        sites, problems = read_sites(text, fmt, origin)
    except UnreadableError as exc:
        return Result(text, [Finding("parse", ERROR, 1, f"cannot parse as {fmt}: {exc}")], error=str(exc))
    findings: list[Finding] = []
    seen: set[tuple[str, str, int]] = set()

    def report(finding: Finding, line_map: list[int]) -> None:
        # Every finding once, at its line in the ORIGINAL file (rule id + token + place).
        finding = replace(finding, line=_original_line(line_map, finding.line))
        key = (finding.rule_id, finding.token, finding.line)
        if key not in seen:
            seen.add(key)
            findings.append(finding)

    configs = tuple((path, "config") for path in config_files(sites))
    guard = _jinja_guard if fmt.endswith(JINJA) else _GUARDS.get(fmt)
    from sglaunch.migrate.yamlfmt import looks_json, valid_json

    if fmt in ("k8s", "compose", "yaml", "config", "workflow", "notebook") and looks_json(text) and valid_json(text):
        guard = _json_guard(guard)
    identity = list(range(1, text.count("\n") + 2))
    for finding in _problem_findings(problems, text, rules, to_release):
        report(finding, identity)
    current, count, line_map = text, len(sites), identity
    for _round in range(MAX_ROUNDS):
        planned = _plan(current, sites, rules, unsafe_fixes, guard)
        for finding in planned.findings:
            report(finding, line_map)
        if not planned.edits:
            break
        updated = apply_edits(current, planned.edits)
        problem = _verify(updated, fmt, count, planned.expected, origin)
        if problem:
            return _refused(text, findings, problem)
        line_map = _carry_lines(current, updated, planned.edits, line_map)
        current = updated
        sites, _ = read_sites(current, fmt, origin)
    else:
        raise ConvergenceError(f"rules still changed the text after {MAX_ROUNDS} rounds")
    for finding in _revalidate(sites, to_release, findings, line_map):
        report(finding, line_map)
    return Result(current, findings, sites=count, follow=configs)


def config_files(sites: Sequence[Site]):
    """The `--config FILE` values of the launches (as written; not when the shell computes them)."""
    for site in sites:
        for k, arg in enumerate(site.args):
            if arg == "--config" and k + 1 < len(site.args) and not site.dynamic[k + 1]:
                yield site.args[k + 1]
            elif arg.startswith("--config=") and not site.dynamic[k]:
                yield arg[len("--config="):]


IGNORE = re.compile(r"sglaunch:\s*ignore(?:\[([A-Za-z0-9_,\s-]+)\])?")


def _unsilenced(text: str, findings: list[Finding]) -> list[Finding]:
    """Drop the report-only findings (manual, info) of a line that says `sglaunch: ignore` or
    `sglaunch: ignore[unread,R516-04]` in a comment, after a person has checked it. Fixes
    and errors are never silenced."""
    if "sglaunch:" not in text:
        return findings
    lines = text.split("\n")
    kept = []
    for finding in findings:
        line = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        match = IGNORE.search(line)
        if match and finding.level in (MANUAL, INFO):
            ids = {i.strip() for i in (match.group(1) or "").split(",") if i.strip()}
            if not ids or finding.rule_id in ids:
                continue
        kept.append(finding)
    return kept


def _original_line(line_map: list[int], line: int) -> int:
    if line < 1 or not line_map:
        return line
    return line_map[min(line, len(line_map)) - 1]


def _carry_lines(old: str, new: str, edits: Sequence[TextEdit], line_map: list[int]) -> list[int]:
    """Original line of every line of `new` (= `old` with `edits` applied): a line that starts
    inside replacement text belongs to the line where that edit starts."""
    ordered = sorted(drop_overlaps(edits)[0])
    old_starts = [0] + [m.end() for m in re.finditer("\n", old)]
    result: list[int] = []
    shift, k = 0, 0
    for pos in [0] + [m.end() for m in re.finditer("\n", new)]:
        old_pos = None
        while k < len(ordered):
            edit = ordered[k]
            new_start = edit.start + shift
            new_end = new_start + len(edit.text)
            if pos < new_start:
                break
            if pos < new_end:
                old_pos = edit.start
                break
            shift += len(edit.text) - (edit.end - edit.start)
            k += 1
        if old_pos is None:
            old_pos = pos - shift
        old_line = bisect.bisect_right(old_starts, max(0, min(old_pos, len(old))))
        result.append(line_map[min(old_line, len(line_map)) - 1])
    return result


def _unique(items):
    return list(dict.fromkeys(items))


@dataclass
class _Plan:
    edits: list[TextEdit] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    expected: list[tuple[tuple[str, ...], dict[str, str]]] = field(default_factory=list)


def _unmasked(text: str, site: Site, index: int) -> str:
    ref = site.refs[index] if index < len(site.refs) else None
    token = getattr(ref.container, "tokens", None) if ref else None
    if not token:
        return site.args[index]
    tok = token[ref.index]
    start = ref.container.mapper(TextEdit(tok.start, tok.start, ""))
    end = ref.container.mapper(TextEdit(tok.end, tok.end, ""))
    if start is None or end is None or end.start <= start.start:
        return site.args[index]
    original = text[start.start:end.start]
    return original if "${{" in original else site.args[index]


def _helm_guard(text: str, edits: Sequence[TextEdit]) -> bool:
    """No edit may touch a Helm directive or write one (or the mask that stands for one)."""
    from sglaunch.migrate.yamlfmt import MASK

    for edit in edits:
        if MASK in edit.text or "{{" in edit.text or "}}" in edit.text:
            return False
        if edit.start == edit.end and text[edit.start - 1:edit.start] in ("", "\n"):
            # a line inserted before a line (a `{{- end }}` closing a define body): it touches no directive
            if "}}" in text[max(0, edit.start - 3):edit.start] or "{{" in text[text.rfind("\n", 0, edit.start - 1) + 1:
                                                                        edit.start].split("}}")[-1]:
                return False
            continue
        around = text[max(0, edit.start - 2):edit.end + 2]
        if "{{" in around or "}}" in around:
            return False
    return True


JINJA = "+jinja"
JINJA_MARK = "\ue000"  # yamlfmt.MASK
JINJA_DIRECTIVE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
JINJA_SUFFIXES = (".j2", ".jinja", ".jinja2")


def mask_jinja(text: str, inner: str) -> str:
    """A Jinja template with its directives masked, same length: lines holding only `{% %}` /
    `{# #}` / `{{ }}` become blank (a shell continuation kept going), and a `{{ expr }}` inside
    a line a value the rules cannot know (`${____}` in shell-like formats, the YAML mask in
    YAML)."""
    out, previous = [], ""
    for line in text.split("\n"):
        if "{" in line and JINJA_DIRECTIVE.sub("", line).strip() == "" and JINJA_DIRECTIVE.search(line):
            keep = previous.rstrip().endswith("\\") and len(line) > 0
            out.append(" " * (len(line) - 1) + "\\" if keep else " " * len(line))
        else:
            out.append(line)
            previous = line
    masked = "\n".join(out)
    yaml_like = inner in ("k8s", "compose", "yaml", "workflow", "config", "helm")

    def one(match) -> str:
        body = match.group(0)
        if yaml_like:
            return "".join("\n" if c == "\n" else JINJA_MARK for c in body)
        if body.startswith("{{") and len(body) >= 4 and "\n" not in body:
            return "${" + "_" * (len(body) - 3) + "}"
        return "".join("\n" if c == "\n" else " " for c in body)

    return JINJA_DIRECTIVE.sub(one, masked)


def _jinja_guard(text: str, edits: Sequence[TextEdit]) -> bool:
    spans = [(m.start(), m.end()) for m in JINJA_DIRECTIVE.finditer(text)]
    return not any(a < e.end + 1 and e.start - 1 < b for e in edits for a, b in spans) and \
        not any(ch in e.text for e in edits for ch in ("{{", "{%", JINJA_MARK))


def _actions_guard(text: str, edits: Sequence[TextEdit]) -> bool:
    """No edit may touch a workflow's `${{ ... }}` expression."""
    from sglaunch.migrate.yamlfmt import ACTIONS_EXPR

    spans = [(m.start(), m.end()) for m in ACTIONS_EXPR.finditer(text)]
    return not any(a < e.end + 1 and e.start - 1 < b for e in edits for a, b in spans) and \
        not any("${{" in e.text for e in edits)


_GUARDS = {"helm": _helm_guard, "workflow": _actions_guard}


def _json_guard(inner: Callable[[str, Sequence[TextEdit]], bool] | None):
    """JSON (with comments): an edit keeps the file valid JSON and touches no comment."""
    from sglaunch.migrate.yamlfmt import json_comments, valid_json

    def guard(text: str, edits: Sequence[TextEdit]) -> bool:
        if inner is not None and not inner(text, edits):
            return False
        spans = [s for s in json_comments(text) if text[s[0]] != ","]
        if any(a < e.end and e.start < b for e in edits for a, b in spans):
            return False
        return valid_json(apply_edits(text, list(edits)))

    return guard


def _plan(text: str, sites: list[Site], rules: Sequence[Rule], unsafe_fixes: bool,
          guard: Callable[[str, Sequence[TextEdit]], bool] | None = None) -> _Plan:
    plan = _Plan()
    for site in sites:
        args, env = list(site.args), dict(site.env)
        applied: list[Op] = []
        own: list[TextEdit] = []  # edits of this site (identical edits from another site are fine)
        for finding in evaluate(site, rules, unsafe_fixes):
            if not finding.ops:
                plan.findings.append(finding)
                continue
            edits = _edits_for(site, finding.ops)
            if edits is not None and guard is not None and not guard(text, edits):
                edits = None
            if edits is None:
                plan.findings.append(_downgrade(finding))
                continue
            if _conflicts(edits, plan.edits) or any(e in own for e in edits):
                continue  # re-evaluated next round, reported then if it still applies
            own.extend(edits)
            plan.edits.extend(e for e in edits if e not in plan.edits)
            applied.extend(finding.ops)
            plan.findings.append(finding)
        plan.expected.append((_expected_args(args, applied), _expected_env(env, applied)))
        for finding, edits in _false_keys(text, site, rules):
            if edits and _conflicts(edits, plan.edits):
                continue
            plan.edits.extend(edits)
            plan.findings.append(finding)
    return plan


def _false_keys(text: str, site: Site, rules: Sequence[Rule]):
    """`enable-deepep-waterfill: false` in a `--config` file: argparse never sees it, but the
    dead key stops SGLang's loader. A rename writes the new key (the value stays false, so no
    `ensure` is added); a removed or re-valued switch's `false` entry is deleted (false is the
    default)."""
    from sglaunch.flags.registry import SCHEMA

    for key in site.false_keys:
        flag = SCHEMA.lookup(key.spelling)
        if flag is None:
            continue
        for rule in rules:
            if rule.kind not in ("rename-flag", "remove-flag") or SCHEMA.lookup(rule.old or "") is not flag:
                continue
            if rule.kind == "rename-flag" and not (rule.set_value or rule.value_map or rule.transform):
                name = key.spelling[2:]
                if text[key.start:key.start + len(name)] != name or not (rule.new or "").startswith("--"):
                    break
                edits = [TextEdit(key.start, key.start + len(name), (rule.new or "")[2:])]
                how = f"renamed to {(rule.new or '')[2:]} (the value stays false)"
            else:
                indent = text[key.line_start:key.start].rstrip("\"'")
                edits = [TextEdit(key.line_start, key.line_end,
                                  f"{indent}{key.comment}\n" if key.comment else "")]
                how = "deleted (false is the default)"
            yield (Finding(rule.id, FIX, key.line, f"the `--config` key {key.spelling[2:]}: false is {how}. "
                           + rule.message, (), rule, key.spelling), edits)
            break


def _downgrade(finding: Finding) -> Finding:
    return Finding(finding.rule_id, MANUAL, finding.line,
                   "this spot cannot be rewritten safely (quoting or shell syntax); change it by hand. "
                   + finding.message, (), finding.rule, finding.token)


def _conflicts(edits: Sequence[TextEdit], accepted: Sequence[TextEdit]) -> bool:
    kept, dropped = drop_overlaps([*accepted, *edits])
    return bool(dropped)


def _edits_for(site: Site, ops: Sequence[Op]) -> list[TextEdit] | None:
    ops = _merge_token_ops(site, ops)
    edits: list[TextEdit] = []
    for op in ops:
        made = _edit_for(site, op)
        if made is None:
            return None
        edits.extend(made)
    kept, dropped = drop_overlaps(edits)
    return None if dropped else kept


def _merge_token_ops(site: Site, ops: Sequence[Op]) -> list[Op]:
    """A rename and a value change on one `--flag=value` token become one token rewrite."""
    suffixed = {op.index for op in ops if isinstance(op, Suffix)}
    renamed = {op.index for op in ops if isinstance(op, Rename)}
    merged: list[Op] = [op for op in ops if not (isinstance(op, (Rename, Suffix)) and op.index in suffixed & renamed)]
    for index in sorted(suffixed & renamed):
        args = list(site.args)
        for op in ops:
            if isinstance(op, (Rename, Suffix)) and op.index == index:
                op.apply(args)
        merged.append(Replace(index, index + 1, (args[index],)))
    return merged


def _edit_for(site: Site, op: Op) -> list[TextEdit] | None:
    if isinstance(op, SetEnv):
        return site.set_env(op.name, op.value) if site.set_env else None
    if isinstance(op, Rename):
        ref = site.refs[op.index]
        return ref.container.rename_prefix(ref.index, op.old, op.new)
    if isinstance(op, Suffix):
        ref = site.refs[op.index]
        return ref.container.replace_suffix(ref.index, op.old, op.new)
    refs = site.refs[op.start:op.end]
    if not refs or any(r.container is not refs[0].container for r in refs):
        return None
    if [r.index for r in refs] != list(range(refs[0].index, refs[0].index + len(refs))):
        return None
    return refs[0].container.replace(refs[0].index, refs[-1].index + 1, op.tokens)


def _expected_args(args: list[str], ops: Sequence[Op]) -> tuple[str, ...]:
    out = list(args)
    for op in sorted((o for o in ops if not isinstance(o, SetEnv)), key=_op_position, reverse=True):
        op.apply(out)
    return tuple(out)


def _op_position(op: Op) -> int:
    return op.start if isinstance(op, Replace) else op.index  # type: ignore[union-attr]


def _expected_env(env: dict[str, str], ops: Sequence[Op]) -> dict[str, str]:
    out = dict(env)
    for op in ops:
        if isinstance(op, SetEnv):
            out[op.name] = op.value
    return out


def _verify(text: str, fmt: str, count: int, expected, origin: str | None = None) -> str:
    """'' when the rewritten text re-reads as exactly the intended commands."""
    try:
        sites, _ = read_sites(text, fmt, origin)
    except UnreadableError as exc:
        return f"the rewrite would not parse any more ({exc})"
    if len(sites) != count:
        return f"the rewrite changed the number of launch commands ({count} -> {len(sites)})"
    for site, (args, env) in zip(sites, expected):
        if site.args != args:
            return f"line {site.line}: the rewrite reads back as {' '.join(site.args)!r}"
        missing = [k for k, v in env.items() if site.env.get(k) != v and k not in site.env_dynamic]
        if missing:
            return f"line {site.line}: the rewrite lost environment variable(s) {', '.join(missing)}"
    return ""


def _refused(text: str, findings: list[Finding], problem: str) -> Result:
    kept = [f if f.level != FIX else _downgrade(f) for f in findings]
    kept.append(Finding("engine", ERROR, 1, f"left unchanged: {problem}"))
    return Result(text, kept, error=problem)


def _revalidate(sites: list[Site], release: str, findings: list[Finding],
                line_map: list[int]) -> list[Finding]:
    """Schema check of the migrated commands; skips what a rule finding already explains
    (same token on the same original line)."""
    explained = {(f.token, f.line) for f in findings if f.level in (MANUAL, UNSAFE, INFO)}
    extra = []
    from sglaunch.flags.registry import SCHEMA
    from sglaunch.flags.spec import Status

    for site in sites:
        for finding in validate(site, release):
            line = _original_line(line_map, finding.line)
            if (finding.token, line) not in explained:
                extra.append(finding)
        for key in site.false_keys:
            flag = SCHEMA.lookup(key.spelling)
            if flag is not None and flag.status_at(release) is Status.REMOVED \
                    and (key.spelling, _original_line(line_map, key.line)) not in explained:
                extra.append(Finding("validate", MANUAL, key.line,
                                     f"the `--config` key {key.spelling[2:]} (false) names a flag SGLang "
                                     f"{release} no longer has (removed in {flag.removed}); its loader refuses "
                                     "unknown keys: delete the entry", token=key.spelling))
    return extra


# --------------------------------------------------------------------------- formats


SCRIPT_NAMES = (".sh", ".bash", ".zsh", ".ksh", ".slurm", ".sbatch")
DEPENDENCY_FORMATS = ("requirements", "pyproject", "setupcfg", "pipfile", "lockfile")
REQUIREMENTS_NAME = re.compile(r"(?i)(.*[-_.])?(requirements|constraints|reqs)([-_.].*)?\.(txt|in)")
MAKEFILES = ("makefile", "gnumakefile")
LOCK_FILES = ("uv.lock", "poetry.lock", "pdm.lock", "pipfile.lock")
# documents without a suffix: a walk never reads them (a file named explicitly is read)
DOCUMENT_NAMES = frozenset({"README", "CHANGELOG", "CHANGES", "NEWS", "NOTES", "HISTORY", "LICENSE", "COPYING",
                            "AUTHORS", "CONTRIBUTING", "TODO", "RELEASE_NOTES"})
SYSTEMD = (".service", ".socket", ".target", ".timer")


def detect_format(name: str, text: str, loose: bool = True) -> str | None:
    """Format from the file name, then the content; None when it is not a launch file."""
    path = PurePath(name)
    if path.name.lower().endswith(JINJA_SUFFIXES):  # roles/x/templates/sglang.service.j2
        inner = detect_format(str(path.with_suffix("")), mask_jinja(text, "shell"), loose)
        if inner in ("k8s", "compose", "yaml", "workflow", "config", "helm"):
            inner = detect_format(str(path.with_suffix("")), mask_jinja(text, "yaml"), loose)
        return None if inner is None else inner + JINJA
    lower = path.name.lower()
    parts = [p.lower() for p in path.parts]
    if lower.endswith((".py", ".pyw")):
        return "python"  # dockerfile.py is Python
    if lower.endswith(".ipynb"):
        return "notebook"
    if lower == "pyproject.toml":
        return "pyproject"
    if lower == "setup.cfg":
        return "setupcfg"
    if lower == "pipfile":
        return "pipfile"
    if lower in LOCK_FILES or re.fullmatch(r"pylock(\.[A-Za-z0-9_-]+)?\.toml", lower):
        return "lockfile"
    if REQUIREMENTS_NAME.fullmatch(lower) or (lower.endswith((".txt", ".in")) and
                                              any(p in ("requirements", "constraints") for p in parts[:-1])):
        return "requirements"
    if lower in ("dockerfile", "containerfile") or lower.startswith(("dockerfile.", "containerfile.")) \
            or lower.endswith((".dockerfile", ".containerfile")):
        return "dockerfile"
    if lower.endswith((".yaml", ".yml", ".tpl")):
        if lower in (".gitlab-ci.yml", ".gitlab-ci.yaml") or "workflows" in parts[:-1] and ".github" in parts \
                or lower in ("action.yml", "action.yaml") or ".gitlab" in parts or ".circleci" in parts \
                or lower.endswith(".gitlab-ci.yml"):
            return "workflow"
        if "{{" in text and ("templates" in parts[:-1] or HELM_DIRECTIVE.search(text) or _not_yaml(text)):
            return "helm"
        if lower.endswith(".tpl"):
            return None
        from sglaunch.migrate.yamlfmt import detect_yaml

        return detect_yaml(text)
    if lower.endswith((".json", ".jsonc")) and (loose or _json_launch(text)):
        # JSON is YAML: ECS task definitions, VS Code launch configs, k8s manifests as JSON. A walk
        # reads only those that name a launcher or an SGLang image (package.json and data stay out);
        # SGLang's --config takes YAML only, so a JSON mapping of flags is not read as one
        from sglaunch.migrate.yamlfmt import detect_yaml

        # a JSON mapping of flags (an SGLang config in JSON, a launcher's flag file) is read as a
        # config: its keys are renamed in place and new entries are written as JSON
        return detect_yaml(text)
    if lower.endswith(SCRIPT_NAMES) or lower in ("singularity", "apptainer") or \
            lower.endswith((".def", ".singularity")) and re.search(r"(?mi)^bootstrap:", text):
        return "shell"  # Singularity/Apptainer definitions: %runscript and %post sections are shell
    if lower == "procfile" or lower.startswith("procfile."):
        return "yaml"  # `web: python -m sglang.launch_server ...`: one command string per process type
    if lower in ("justfile", ".justfile") or lower.endswith(".just"):
        return "shell+jinja"  # recipes are shell lines; `{{model}}` interpolations are masked
    if lower in MAKEFILES or lower.endswith(".mk") or lower.startswith("makefile."):
        return "makefile"
    if lower.endswith(SYSTEMD) or lower.endswith(".service.in"):
        return "systemd"
    if lower.endswith(".conf") and (any(p.endswith(tuple(s + ".d" for s in SYSTEMD)) for p in parts[:-1])
                                    or (lower == "override.conf" and re.search(r"(?m)^\[(Service|Unit)\]", text))):
        return "systemd"  # drop-ins: sglang.service.d/override.conf, 10-args.conf
    if (lower.endswith((".conf", ".ini")) or lower == "supervisord.conf") and \
            re.search(r"(?m)^\[program:[^\]]+\]", text):
        return "supervisor"
    if lower == ".env" or lower.startswith(".env.") or lower.endswith(".env") or lower in ("env", "envfile"):
        return "env"
    if lower.endswith((".py", ".pyw")):
        return "python"
    if not loose and path.name.upper().split(".")[0] in DOCUMENT_NAMES:
        return None
    if not loose and lower.endswith((".json", ".jsonl", ".md", ".rst", ".txt", ".csv", ".lock", ".toml", ".ini",
                                     ".cfg", ".html", ".js", ".ts", ".css", ".svg", ".ipynb")):
        return None  # data and documents: a walk does not sniff them (a file named explicitly is read)
    sniffed = sniff(text, loose)
    if sniffed is None and text.startswith("#!") and "python" in text.split("\n", 1)[0]:
        return "python"
    return sniffed


# `{{ .Values.x }}`, `{{- include "x" . }}`, `{{ if }}`: a Helm template wherever it is kept (a
# template can also be valid YAML as it stands, and then read as a plain manifest)
HELM_DIRECTIVE = re.compile(r"\{\{-?\s*(?:\.Values|\.Release|\.Chart|\$\.Values|include\s|template\s|if\s|range\s|"
                            r"with\s|end\s*-?\}\}|toYaml\s|define\s|tpl\s)")


def _json_launch(text: str) -> bool:
    """A JSON file a walk reads: it names a launcher or an SGLang image, holds an array of
    arguments with a rule's flag (`"args": ["--tp", 8, "--x"]`) or a mapping keyed by such flags,
    or is a mapping of SGLang flags (an SGLang config in JSON)."""
    from sglaunch.migrate.shell import mentions

    if mentions(text) or "lmsysorg/sglang" in text:
        return True
    # an array of strings holding a flag some rule is about (a launcher's `"args": [...]`), or a mapping
    # keyed by such flags: benchmark records that only hold valid flags, and data that names flags as
    # values (`{"name": "--x", "removed": "0.5.16"}`, a flag schema) stay out of a walk
    if len(text) >= 1_000_000:
        return False
    import json

    from sglaunch.migrate.yamlfmt import mask_json

    try:
        data = json.loads(mask_json(text))
    except ValueError:
        return False
    if isinstance(data, dict) and data:
        # an SGLang config in JSON: at least half of the top-level keys are SGLang flags
        from sglaunch.flags.registry import SCHEMA

        flags = [k for k, v in data.items() if not isinstance(v, dict) and SCHEMA.lookup("--" + k)]
        if flags and 2 * len(flags) >= len(data):
            return True
    if '"--' in text:
        from sglaunch.migrate.rules import load_rules
        from sglaunch.releases import KNOWN_RELEASES

        rules = load_rules().rules
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                scalars = [str(v) for v in item if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
                if scalars and len(scalars) == len(item) and any(v.startswith("--") for v in scalars) \
                        and suspicious(" ".join(scalars), rules, KNOWN_RELEASES[-1]):
                    return True
                stack.extend(v for v in item if isinstance(v, (list, dict)))
            elif isinstance(item, dict):
                keys = [k for k in item if k.startswith("--")]
                if keys and suspicious(" ".join(f"{k} {item[k]}" for k in keys), rules, KNOWN_RELEASES[-1]):
                    return True
                stack.extend(v for v in item.values() if isinstance(v, (list, dict)))
    return False


def _not_yaml(text: str) -> bool:
    from sglaunch.migrate.yamlfmt import YamlError, compose

    try:
        compose(text)
    except YamlError:
        return True
    return False


def sniff(text: str, loose: bool = True) -> str | None:
    """Content-only detection (stdin, files without a telling name)."""
    head = text.lstrip()[:4096]
    first = head.splitlines()[0] if head else ""
    if re.search(r"(?m)^\[(Unit|Service|Install)\]\s*$", head) and re.search(r"(?m)^\s*Exec\w*=", head):
        return "systemd"
    if first.startswith("#!") and any(s in first for s in ("sh", "bash", "zsh")):
        return "shell"
    if any(line.upper().startswith("FROM ") for line in head.splitlines()[:40]) and \
            any(k in head.upper() for k in ("CMD", "ENTRYPOINT")):
        return "dockerfile"
    if first.startswith("#!"):
        return None
    if first in ("---",) or ":" in first and not first.startswith(("python", "sglang", "export")):
        from sglaunch.migrate.yamlfmt import YamlError, compose, detect_yaml, is_scalar

        try:
            docs = compose(text)
            if docs and not all(is_scalar(d) for d in docs):  # `docker run img:tag ...` is one plain scalar
                return detect_yaml(text)
        except YamlError:
            pass
    # NOTE: only files named on the command line (or stdin) fall back to shell on content alone;
    # a directory walk must not treat READMEs and notes as scripts.
    return "shell" if loose and "sglang" in text else None


FormatReader = Callable[[str], list[Site]]
