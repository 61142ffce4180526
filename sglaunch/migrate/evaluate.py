"""Rules applied to one launch command: findings plus token-level edit operations.

Pure functions over a `Site`'s arguments; no text is touched here. Every rule kind has a
small handler; the engine turns the operations into text edits through the site's containers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from sglaunch.errors import SglaunchError
from sglaunch.flags.argv import Occurrence, split_argv, unknown_flag_error
from sglaunch.migrate.shell import SERVER_ARGS_TOOLS
from sglaunch.flags.registry import SCHEMA
from sglaunch.flags.spec import Flag, Kind, Status
from sglaunch.flags.timeline import config_refused
from sglaunch.migrate.kinds import ERROR, FIX, INFO, MANUAL, UNSAFE  # the finding levels (re-exported)
from sglaunch.migrate.rules import Rule, When
from sglaunch.migrate.tokens import Site

# In `Site.env_dynamic`: the launch also gets variables the tool cannot read (k8s envFrom, an
# unreadable env file, docker --env-file), so an explicit setting may exist where it cannot see.
UNKNOWN_ENV = "*"


@dataclass(frozen=True)
class Rename:
    """Token `index` starts with `old` (a flag spelling): write `new` instead."""

    index: int
    old: str
    new: str

    def apply(self, args: list[str]) -> None:
        args[self.index] = self.new + args[self.index][len(self.old):]


@dataclass(frozen=True)
class Suffix:
    """Token `index` is `--flag=old`: write `new` after the `=`."""

    index: int
    old: str
    new: str

    def apply(self, args: list[str]) -> None:
        token = args[self.index]
        args[self.index] = token[: len(token) - len(self.old)] + self.new


@dataclass(frozen=True)
class Replace:
    """Tokens start..end-1 become `tokens` (empty: deleted)."""

    start: int
    end: int
    tokens: tuple[str, ...]

    def apply(self, args: list[str]) -> None:
        args[self.start:self.end] = list(self.tokens)


@dataclass(frozen=True)
class SetEnv:
    name: str
    value: str

    def apply(self, args: list[str]) -> None:
        return None


Op = Rename | Suffix | Replace | SetEnv


@dataclass(frozen=True)
class Finding:
    rule_id: str
    level: str
    line: int
    message: str
    ops: tuple[Op, ...] = field(default=(), compare=False)
    rule: Rule | None = field(default=None, compare=False, repr=False)
    token: str = ""  # the flag or variable involved, for display


def evaluate(site: Site, rules: Sequence[Rule], unsafe_fixes: bool) -> list[Finding]:
    """Every finding of `rules` on one launch command, oldest release first."""
    try:
        occurrences = split_argv(site.args, SCHEMA, lenient=True, dynamic=site.dynamic).occurrences
    except SglaunchError as exc:
        return [Finding("parse", ERROR, site.line, f"cannot read the launch arguments: {exc.message}")]
    context = _Context(site, occurrences, unsafe_fixes)
    findings: list[Finding] = []
    for rule in rules:
        findings.extend(HANDLERS[rule.kind](rule, context))
    return findings


@dataclass
class _Context:
    site: Site
    occurrences: list[Occurrence]
    unsafe_fixes: bool

    def of(self, spelling: str | None) -> list[Occurrence]:
        flag = SCHEMA.lookup(spelling or "")
        if flag is None:
            return [o for o in self.occurrences if o.spelling == spelling]
        return [o for o in self.occurrences if o.flag.name == flag.name]

    def present(self, spelling: str | None) -> bool:
        return bool(self.of(spelling))

    def line(self, occurrence: Occurrence) -> int:
        return self.site.token_line(occurrence.index)

    def level(self, rule: Rule) -> str:
        if rule.safety == "safe":
            return FIX
        if rule.safety == "unsafe":
            return FIX if self.unsafe_fixes else UNSAFE
        return MANUAL

    def finding(self, rule: Rule, occurrence: Occurrence | None, ops: Sequence[Op] = (),
                level: str | None = None, message: str | None = None) -> Finding:
        line = self.line(occurrence) if occurrence else self.site.line
        level = level or self.level(rule)
        kept_ops = tuple(ops) if level == FIX else ()
        return Finding(rule.id, level, line, message or rule.message, kept_ops, rule,
                       occurrence.spelling if occurrence else (rule.env or rule.old or ""))


# --------------------------------------------------------------------------- values


def inline(occurrence: Occurrence, args: Sequence[str]) -> bool:
    return "=" in args[occurrence.index] and args[occurrence.index] != occurrence.spelling


def value_index(occurrence: Occurrence) -> int:
    return occurrence.index + 1


def occurrence_end(occurrence: Occurrence, args: Sequence[str]) -> int:
    if occurrence.raw is None or inline(occurrence, args):
        return occurrence.index + 1
    if isinstance(occurrence.raw, tuple):
        return occurrence.index + 1 + len(occurrence.raw)
    return occurrence.index + 2


def same_value(flag: Flag, raw, expected: str) -> bool:
    if not isinstance(raw, str):
        return False
    return raw.upper() == expected.upper() if flag.upper_case else raw == expected


def set_value_ops(occurrence: Occurrence, args: Sequence[str], new: str) -> list[Op]:
    raw = occurrence.raw
    assert isinstance(raw, str)
    if inline(occurrence, args):
        return [Suffix(occurrence.index, raw, new)]
    return [Replace(value_index(occurrence), value_index(occurrence) + 1, (new,))]


# --------------------------------------------------------------------------- handlers


def rename_flag(rule: Rule, ctx: _Context) -> list[Finding]:
    findings = []
    for occurrence in ctx.of(rule.old):
        if ctx.present(rule.new):
            findings.append(ctx.finding(rule, occurrence, level=MANUAL, message=(
                f"both {occurrence.spelling} and {rule.new} are given; remove {occurrence.spelling}. "
                + rule.message)))
            continue
        ops, problem = _rename_ops(rule, occurrence, ctx)
        if problem:
            findings.append(ctx.finding(rule, occurrence, level=MANUAL, message=f"{problem}. {rule.message}"))
        else:
            findings.append(ctx.finding(rule, occurrence, ops))
    return _one_target(rule, findings, ctx)


def _one_target(rule: Rule, findings: list[Finding], ctx: _Context) -> list[Finding]:
    """Two old flags mapping onto the same new flag (e.g. two prefill-graph switches) conflict."""
    fixing = [f for f in findings if f.level == FIX]
    if len(fixing) > 1:
        return [Finding(f.rule_id, MANUAL, f.line, f"{rule.new} would be given twice; merge by hand. "
                        + rule.message, (), rule, f.token) for f in findings]
    return findings


def _rename_ops(rule: Rule, occurrence: Occurrence, ctx: _Context) -> tuple[list[Op], str]:
    args = ctx.site.args
    index, spelling = occurrence.index, occurrence.spelling
    ensure = [item for flag, value in rule.ensure if not ctx.present(flag) for item in (flag, value)]
    if rule.set_value is not None:
        if occurrence.raw is not None:
            return [], f"{spelling} has a value; expected a bare switch"
        return [Replace(index, index + 1, (rule.new, rule.set_value, *ensure))], ""  # type: ignore[arg-type]
    if rule.value_map or rule.transform:
        return _mapped_value_ops(rule, occurrence, ctx)
    if occurrence.raw is None and ensure:
        return [Replace(index, index + 1, (rule.new, *ensure))], ""  # type: ignore[arg-type]
    if ensure:
        return [], f"cannot add {' '.join(ensure)} after a valued flag automatically"
    return [Rename(index, spelling, rule.new)], ""  # type: ignore[arg-type]


def _mapped_value_ops(rule: Rule, occurrence: Occurrence, ctx: _Context) -> tuple[list[Op], str]:
    raw = occurrence.raw
    if occurrence.dynamic or not isinstance(raw, str):
        return [], f"the value of {occurrence.spelling} is computed by the shell; convert it by hand"
    new_value = _convert(rule, raw)
    if new_value is None:
        return [], f"no known {rule.new} value for {occurrence.spelling} {raw}"
    ops: list[Op] = [Rename(occurrence.index, occurrence.spelling, rule.new)]  # type: ignore[arg-type]
    if new_value != raw:
        ops += set_value_ops(occurrence, ctx.site.args, new_value)
    return ops, ""


def _convert(rule: Rule, raw: str) -> str | None:
    if rule.transform == "increment":
        try:
            return str(int(raw) + 1)
        except ValueError:
            return None
    return dict(rule.value_map).get(raw)


def remove_flag(rule: Rule, ctx: _Context) -> list[Finding]:
    args = ctx.site.args
    return [ctx.finding(rule, o, [Replace(o.index, occurrence_end(o, args), ())]) for o in ctx.of(rule.old)]


def _unknown_value(rule: Rule, occurrence: Occurrence, ctx: _Context) -> Finding:
    """The value is shell text ($Q): unknown until the script runs, so the rule can neither pass
    nor fix it; it is reported (never passed silently, never guessed)."""
    raw = " ".join(occurrence.raw) if isinstance(occurrence.raw, tuple) else occurrence.raw
    return ctx.finding(rule, occurrence, level=MANUAL, message=(
        f"the value of {occurrence.spelling} is shell text ({raw}), unknown until the script runs; "
        f"if it is {rule.old}: {rule.message.strip()}"))


def remove_value(rule: Rule, ctx: _Context) -> list[Finding]:
    return [_unknown_value(rule, o, ctx) if o.dynamic else ctx.finding(rule, o, level=MANUAL)
            for o in ctx.of(rule.flag)
            if o.dynamic or same_value(o.flag, o.raw, rule.old or "") or _in_list(o.raw, rule.old)]


def replace_value(rule: Rule, ctx: _Context) -> list[Finding]:
    findings = []
    for occurrence in ctx.of(rule.flag):
        if occurrence.dynamic:
            findings.append(_unknown_value(rule, occurrence, ctx))
        elif same_value(occurrence.flag, occurrence.raw, rule.old or ""):
            ops = set_value_ops(occurrence, ctx.site.args, rule.new or "")
            findings.append(ctx.finding(rule, occurrence, ops))
        elif _in_list(occurrence.raw, rule.old):
            position = occurrence.raw.index(rule.old) + value_index(occurrence)  # type: ignore[union-attr]
            findings.append(ctx.finding(rule, occurrence, [Replace(position, position + 1, (rule.new,))]))  # type: ignore[arg-type]
    return findings


def _in_list(raw, value: str | None) -> bool:
    return isinstance(raw, tuple) and value in raw


def require_env(rule: Rule, ctx: _Context) -> list[Finding]:
    if not rule.when or not _matches(rule.when, ctx):
        return []
    name, site = rule.env or "", ctx.site
    anchor = _anchor(rule.when, ctx)
    if name in site.env_dynamic:
        return [ctx.finding(rule, anchor, level=INFO, message=(
            f"{name} is computed by the shell; make sure it is '{rule.value}'. {rule.message}"))]
    if name in site.env:
        return _check_env_value(rule, anchor, site.env[name], ctx)
    if UNKNOWN_ENV in site.env_dynamic:  # envFrom, an env file the tool cannot read: it may set it
        return [ctx.finding(rule, anchor, level=INFO, message=(
            f"the environment of this launch also comes from a source the tool cannot read (envFrom, an env "
            f"file); make sure {name}={rule.value} is set there, or set it here. {rule.message}"))]
    if site.set_env is None:
        return [ctx.finding(rule, anchor, level=MANUAL, message=(
            f"set {name}={rule.value} in the environment that runs this launch"
            f"{' (' + site.env_hint + ')' if site.env_hint else ''}. {rule.message}"))]
    return [ctx.finding(rule, anchor, [SetEnv(name, rule.value or "")])]


def _check_env_value(rule: Rule, anchor, value: str, ctx: _Context) -> list[Finding]:
    name = rule.env
    if value == rule.value:
        return []
    if value not in rule.allowed:
        return [ctx.finding(rule, anchor, level=MANUAL, message=(
            f"invalid {name}={value!r}: SGLang accepts only {', '.join(rule.allowed)} and refuses "
            f"to start; use {name}={rule.value}"))]
    return [ctx.finding(rule, anchor, level=INFO, message=(
        f"{name}={value} is set explicitly and left alone; {rule.value} is the fast path. {rule.message}"))]


def _anchor(when: When, ctx: _Context) -> Occurrence | None:
    found = ctx.of(when.flag) if when.flag else []
    return found[0] if found else None


def rename_env(rule: Rule, ctx: _Context) -> list[Finding]:
    if rule.old not in ctx.site.env:
        return []
    return [ctx.finding(rule, None, level=MANUAL)]


def notice(rule: Rule, ctx: _Context) -> list[Finding]:
    if rule.when and _matches(rule.when, ctx):
        return [ctx.finding(rule, _anchor(rule.when, ctx), level=INFO)]
    return []


def _matches(when: When, ctx: _Context) -> bool:
    if when.flag:
        found = ctx.of(when.flag)
        if not found:
            return False
        if when.values and not any(same_value(o.flag, o.raw, v) for o in found for v in when.values):
            return False
    if when.flags and not all(ctx.present(f) for f in when.flags):
        return False
    if when.env and not any(name in ctx.site.env for name in when.env):
        return False
    return True


HANDLERS: dict[str, Callable[[Rule, _Context], list[Finding]]] = {
    "rename-flag": rename_flag,
    "remove-flag": remove_flag,
    "remove-value": remove_value,
    "replace-value": replace_value,
    "require-env": require_env,
    "rename-env": rename_env,
    "notice": notice,
}


# --------------------------------------------------------------------------- validation


def validate(site: Site, release: str) -> list[Finding]:
    """Flags and values of the (migrated) command that SGLang `release` does not accept: removed or
    not yet added flags and values, flags no release has, and abbreviations argparse cannot expand
    there (ambiguous) or expands to another flag than the one meant."""
    try:
        split = split_argv(site.args, SCHEMA, lenient=True, dynamic=site.dynamic, release=release)
    except SglaunchError as exc:
        return [Finding("validate", ERROR, site.line, f"cannot read the launch arguments: {exc.message}")]
    findings = []
    refused = config_refused(release) if site.fmt == "config" else {}
    for occurrence in split.occurrences:
        problem = _problem_at(occurrence, release)
        key = occurrence.spelling[2:].replace("-", "_")
        if not problem and key in refused:
            problem = (f"SGLang {release}'s --config loader stops with 'Unsupported config option' on the key "
                       f"'{occurrence.spelling[2:]}' (it reads plain values and switches only); pass "
                       f"{occurrence.flag.name} on the command line instead")
        if problem:
            findings.append(Finding("validate", MANUAL, site.token_line(occurrence.index), problem,
                                    token=occurrence.spelling))
    for index, token in split.unknown:
        spelling = token.split("=", 1)[0]
        if spelling.startswith("--router-") and "sglang_router" in site.launcher:
            continue  # the router's own arguments
        if any(site.launcher.endswith(tool) for tool in SERVER_ARGS_TOOLS):
            continue  # bench_one_batch, compile_deep_gemm, ...: their own flags beside the server's
        if spelling in ("--help", "-h"):
            continue  # argparse's own: prints the usage
        if not _known_spelling(spelling):
            message = unknown_flag_error(spelling, SCHEMA, release).message
            findings.append(Finding("validate", MANUAL, site.token_line(index),
                                    f"SGLang {release} stops with 'unrecognized arguments': {message}",
                                    token=spelling))
    return findings


def _known_spelling(spelling: str) -> bool:
    """A spelling of the schema (a flag of some release) is judged by `_problem_at`, not here."""
    return SCHEMA.lookup(spelling) is not None


def _problem_at(occurrence: Occurrence, release: str) -> str:
    flag, spelling = occurrence.flag, occurrence.spelling
    status = flag.status_at(release)
    if occurrence.abbreviated:
        old = SCHEMA.remapped_abbreviation(spelling, flag, release)
        if old is not None:
            return (f"{spelling} abbreviated {old.name}, which SGLang {old.removed} removed; SGLang "
                    f"{release} silently reads it as {flag.name}: write the flag you mean in full")
    if status is Status.REMOVED:
        return f"{spelling} is not accepted by SGLang {release} (removed in {flag.removed})"
    if status is Status.ABSENT:
        return f"{spelling} does not exist yet in SGLang {release} (added in {flag.added})"
    values = occurrence.raw if isinstance(occurrence.raw, tuple) else (occurrence.raw,)
    for value in values:
        if isinstance(value, str) and not occurrence.dynamic and flag.kind is not Kind.BOOL:
            checked = value.upper() if flag.upper_case else value
            value_status = flag.value_status(checked, release)
            if value_status is Status.REMOVED:
                return f"{spelling} {value} is not accepted by SGLang {release}"
            if value_status is Status.ABSENT:
                return f"{spelling} {value} does not exist yet in SGLang {release}"
    return ""
