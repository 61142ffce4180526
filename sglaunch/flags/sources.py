"""Merge the configuration sources into one table of settings, each with its origin.

Precedence follows SGLang: command line > `--config` YAML > built-in defaults. Environment
variables are their own namespace (SGLANG_*), recorded with origin `env` or `default`.
While merging, every flag and value is checked against its history at the target release.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from sglaunch.checks.diagnostics import Diagnostic, diag
from sglaunch.errors import SglaunchError
from sglaunch.flags.argv import CLI, DEFAULT, Occurrence, Origin, convert, split_argv
from sglaunch.flags.spec import Flag, FlagSchema, Kind, Status
from sglaunch.releases import KNOWN_RELEASES, at_or_after

MIGRATE_HINT = "run `sglaunch migrate-flags FILE` to rewrite your launch scripts and configs"


@dataclass(frozen=True)
class Setting:
    flag: Flag
    value: Any
    origin: Origin
    spelling: str


@dataclass
class Settings:
    """Resolved-so-far values by dest; missing dests fall back to schema defaults."""

    schema: FlagSchema
    release: str
    values: dict[str, Setting] = field(default_factory=dict)
    env: dict[str, tuple[str, Origin]] = field(default_factory=dict)
    config_path: str | None = None
    # values left as shell text in a script ($TP): shown, never type-checked, defaults apply
    unexpanded: dict[str, Setting] = field(default_factory=dict)

    def get(self, dest: str) -> Any:
        if dest in self.values:
            return self.values[dest].value
        flag = self.schema.by_dest(dest)
        return flag.default if flag else None

    def given(self, dest: str) -> bool:
        return dest in self.values

    def origin(self, dest: str) -> Origin:
        if dest in self.values:
            return self.values[dest].origin
        return self.unexpanded[dest].origin if dest in self.unexpanded else DEFAULT

    def set(self, flag: Flag, value: Any, origin: Origin, spelling: str | None = None) -> None:
        self.values[flag.dest] = Setting(flag, value, origin, spelling or flag.name)

    def env_value(self, name: str) -> str | None:
        return self.env[name][0] if name in self.env else None


def extract_config_path(tokens: Sequence[str]) -> tuple[list[str], str | None, list[Diagnostic]]:
    """Pull `--config FILE` out of the CLI tokens (SGLang allows exactly one)."""
    rest: list[str] = []
    paths: list[str] = []
    diagnostics: list[Diagnostic] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--config":
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                raise SglaunchError("--config needs a file path", hint="write --config FILE.yaml")
            paths.append(tokens[i + 1])
            i += 2
            continue
        if token.startswith("--config="):
            paths.append(token.split("=", 1)[1])
            diagnostics.append(diag(
                "CFG002", "SGLang only expands the two-token form `--config FILE`; with `--config=FILE` "
                "it ignores the file", flags=("--config",), fix="write --config FILE (a space, not =)"))
        else:
            rest.append(token)
        i += 1
    if len(paths) > 1:
        raise SglaunchError(f"--config given {len(paths)} times ({', '.join(paths)}); only one is allowed",
                            hint="merge the files into one YAML file, or move values to flags")
    return rest, (paths[0] if paths else None), diagnostics


def collect_settings(tokens: Sequence[str], environ: Mapping[str, str], schema: FlagSchema,
                     release: str, *, extra: Sequence[Occurrence] = ()) -> tuple[Settings, list[Diagnostic]]:
    """CLI tokens (+ the config file they name) and the environment -> Settings and diagnostics.

    `extra` are occurrences that already come split (e.g. from a shell script), applied like CLI.
    """
    from sglaunch.flags.config_file import load_config_file

    rest, config_path, diagnostics = extract_config_path(tokens)
    settings = Settings(schema, release, config_path=config_path)
    occurrences: list[Occurrence] = []
    if config_path is not None:
        config = load_config_file(config_path, schema, release)
        diagnostics.extend(config.diagnostics)
        occurrences.extend(config.occurrences)
    occurrences.extend(extra)
    occurrences.extend(split_argv(rest, schema, origin=CLI, release=release).occurrences)
    for occurrence in occurrences:
        diagnostics.extend(_admit(occurrence, settings))
    _collect_env(environ, settings)
    return settings, diagnostics


def _admit(occ: Occurrence, settings: Settings) -> list[Diagnostic]:
    """Check one occurrence against its history and store it where the release puts it."""
    flag, release = occ.flag, settings.release
    status = flag.status_at(release)
    abbreviation = _abbreviation(occ, settings)
    if any(d.code == "FLAG016" for d in abbreviation):
        return abbreviation  # it means another flag than the user wrote it for: nothing to store
    store_as = flag
    if flag.alias_of and status in (Status.ACTIVE, Status.DEPRECATED) and not flag.deprecated:
        # a spelling with a lifetime of its own (an alias added or dropped in some release, or a
        # --no-X switch): while the release accepts it, it sets the flag it spells
        store_as = settings.schema.get(flag.alias_of)
    where = str(occ.origin)
    if status is Status.ABSENT:
        return [diag("FLAG004", f"{occ.spelling} was added in SGLang {flag.added}; {release} does not "
                     "accept it", flags=(flag.name,), release=flag.added, origin=where,
                     fix=f"drop {occ.spelling}, or target SGLang {flag.added} or newer")]
    if status is Status.REMOVED:
        return [_removed_flag(occ, release)]
    if occ.dynamic:  # the last occurrence wins: shell text replaces an earlier literal value
        settings.values.pop(store_as.dest, None)
        settings.unexpanded[store_as.dest] = Setting(store_as, occ.raw, occ.origin, occ.spelling)
        return []
    settings.unexpanded.pop(store_as.dest, None)
    value = convert(flag, occ.raw, occ.spelling)
    if status is Status.DEPRECATED and flag.replaced_by:
        return _deprecated_flag(occ, value, settings)
    found = abbreviation + _check_value(flag, occ, value, release)
    value = _alias_target(flag, value)
    found += _later_change(flag, occ, release)
    found += _deprecated_without_replacement(flag, occ, release)
    previous = settings.values.get(store_as.dest)
    if store_as.repeatable and previous and previous.origin.source == occ.origin.source:
        value = (*_as_tuple(previous.value), *_as_tuple(value))  # action="append": values add up
    elif previous and previous.origin.source == occ.origin.source and previous.value != value:
        found.append(diag("FLAG010", f"{store_as.name} is given twice ({previous.value!r}, then {value!r}); "
                          "the last one wins, as in SGLang", flags=(store_as.name,), origin=where,
                          fix=f"keep one {store_as.name}"))
    settings.set(store_as, value, occ.origin, occ.spelling)
    return found


def _abbreviation(occ: Occurrence, settings: Settings) -> list[Diagnostic]:
    """`--tp` for `--tp-size`: SGLang's argparse expands unique prefixes. Say so, and say when a
    later release makes the prefix ambiguous (argparse then stops) or when it used to stand for
    a flag that is gone (the same text now silently sets another flag)."""
    if not occ.abbreviated:
        return []
    schema, release, prefix, flag = settings.schema, settings.release, occ.spelling, occ.flag
    where = str(occ.origin)
    old = schema.remapped_abbreviation(prefix, flag, release)
    if old is not None:
        return [diag("FLAG016", f"{prefix} used to be an abbreviation of {old.name} (removed in {old.removed}); "
                     f"SGLang {release} silently takes it as {flag.name}, a different flag",
                     flags=(old.name, flag.name), release=old.removed, origin=where,
                     fix=f"write {old.replaced_by or 'the launch without it'} in full, or run "
                     "`sglaunch migrate-flags FILE`")]
    later = [r for r in KNOWN_RELEASES if not at_or_after(release, r)]
    breaks = None
    for r in later:
        matches = schema.abbreviated(prefix, r)
        if [f.name for f in matches] != [flag.name]:
            breaks = (r, matches)
            break
    tail = ""
    if breaks:
        r, matches = breaks
        tail = (f"; from SGLang {r} it is ambiguous ({', '.join(f.name for f in matches[:3])}) and fails"
                if len(matches) > 1 else f"; SGLang {r} no longer accepts it")
    return [diag("FLAG015", f"{prefix} is an abbreviation that SGLang's argparse expands to {flag.name}{tail}",
                 flags=(flag.name,), origin=where, fix=f"write {flag.name} in full")]


def _as_tuple(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _deprecated_without_replacement(flag: Flag, occ: Occurrence, release: str) -> list[Diagnostic]:
    """SGLang still accepts it but warns that it is deprecated (no flag to write instead)."""
    if flag.status_at(release) is not Status.DEPRECATED or flag.replaced_by:
        return []
    note = f": {flag.note}" if flag.note else ""
    until = f"; it is removed in {flag.removed}" if flag.removed else ""
    return [diag("FLAG005", f"{occ.spelling} is deprecated since SGLang {flag.deprecated}{note}{until}",
                 flags=(flag.name,), release=flag.deprecated, origin=str(occ.origin),
                 fix=f"plan to drop {occ.spelling}; `sglaunch migrate-flags FILE` knows what replaces it")]


def _removed_flag(occ: Occurrence, release: str) -> Diagnostic:
    flag = occ.flag
    note = f" ({flag.note})" if flag.note else ""
    if flag.replaced_by:
        changed = " The meaning changed, so check the value." if flag.meaning_changed else ""
        return diag("FLAG003", f"{occ.spelling} was renamed to {flag.replaced_by} in SGLang {flag.removed} "
                    f"with no alias; {release} stops with 'unrecognized arguments'{note}.{changed}",
                    flags=(flag.name, flag.replaced_by), release=flag.removed, origin=str(occ.origin),
                    fix=f"use {flag.replaced_by}, or {MIGRATE_HINT}")
    return diag("FLAG002", f"{occ.spelling} was removed in SGLang {flag.removed} without replacement{note}",
                flags=(flag.name,), release=flag.removed, origin=str(occ.origin),
                fix=f"delete {occ.spelling}, or {MIGRATE_HINT}")


def _deprecated_flag(occ: Occurrence, value: Any, settings: Settings) -> list[Diagnostic]:
    flag = occ.flag
    target = settings.schema.get(flag.replaced_by)
    mapped = dict(flag.value_map)
    key = str(value).lower() if flag.kind is Kind.BOOL else value
    settings.set(flag, value, occ.origin, occ.spelling)  # checks that read the old name still see it
    # the value the new flag gets: mapped (a switch that stands for `--new VALUE`), or the same
    # kind of value; a switch whose replacement needs a value we cannot know sets nothing there
    if key in mapped or (flag.kind is Kind.BOOL) == (target.kind is Kind.BOOL):
        new_value = mapped.get(key, value)
        settings.set(target, new_value, occ.origin, occ.spelling)
        fix = f"write {target.name}" + (f" {new_value}" if target.takes_value else "")
    else:
        fix = f"use {target.name} instead" + (f" ({flag.note})" if flag.note else "")
    until = f" and is removed in {flag.removed}" if flag.removed else ""
    later = _later_change(flag, occ, settings.release)
    return later + [diag("FLAG005", f"{occ.spelling} is a deprecated spelling of {target.name}{until}",
                         flags=(flag.name, target.name), release=flag.deprecated, origin=str(occ.origin),
                         fix=fix)]


def _check_value(flag: Flag, occ: Occurrence, value: Any, release: str) -> list[Diagnostic]:
    if flag.choices is None or not isinstance(value, str):
        return []
    where = str(occ.origin)
    if value not in flag.choices:
        if value in flag.sglaunch_values:
            return [diag("FLAG017", f"{occ.spelling} {value} is sglaunch's own value; SGLang {release} "
                         f"rejects it (invalid choice)", flags=(flag.name,), origin=where,
                         fix=f"for SGLang use one of: {', '.join(flag.known_values(release)[:8])}")]
        if flag.open_choices:
            return [diag("FLAG008", f"'{value}' is not a {flag.name} value sglaunch knows",
                         flags=(flag.name,), origin=where,
                         fix=f"known values: {', '.join(flag.known_values(release))}")]
        raise SglaunchError(f"invalid value '{value}' for {occ.spelling}",
                            hint=f"choose from: {', '.join(flag.known_values(release))}")
    change = flag.value_change(value)
    status = flag.value_status(value, release)
    if status is Status.ABSENT:
        return [diag("FLAG009", f"{flag.name} {value} was added in SGLang {change.added}; {release} "
                     "rejects it", flags=(flag.name,), release=change.added, origin=where,
                     fix=f"target SGLang {change.added} or newer, or pick another value")]
    if status is Status.REMOVED:
        instead = f"use {flag.name} {change.replacement}" if change.replacement else "no replacement exists"
        note = f": {change.note}" if change.note else ""
        return [diag("FLAG006", f"{flag.name} {value} was removed in SGLang {change.removed}{note}",
                     flags=(flag.name,), release=change.removed, origin=where,
                     fix=f"{instead}; or {MIGRATE_HINT}")]
    if status is Status.DEPRECATED:
        return [diag("FLAG007", f"{flag.name} {value} is an old spelling of {change.alias_of}",
                     flags=(flag.name,), origin=where, fix=f"write {flag.name} {change.alias_of}")]
    return []


def _alias_target(flag: Flag, value: Any) -> Any:
    change = flag.value_change(value) if isinstance(value, str) else None
    return change.alias_of if change and change.alias_of else value


def _later_change(flag: Flag, occ: Occurrence, release: str) -> list[Diagnostic]:
    """Info: the flag or value still works here but a later release we know changes it."""
    later = [r for r in KNOWN_RELEASES if not at_or_after(release, r)]
    when = next((r for r in later if r in (flag.deprecated, flag.removed)), None)
    if when is None:
        return []
    what = f"becomes {flag.replaced_by}" if flag.replaced_by else "is removed"
    return [diag("FLAG012", f"{occ.spelling} {what} in SGLang {when}", flags=(flag.name,),
                 release=when, origin=str(occ.origin),
                 fix=f"before upgrading, run `sglaunch migrate-flags FILE --to {when}`")]


def _collect_env(environ: Mapping[str, str], settings: Settings) -> None:
    for var in settings.schema.env_vars:
        if var.name in environ:
            settings.env[var.name] = (environ[var.name], Origin("env"))
        elif var.default is not None:
            settings.env[var.name] = (var.default, DEFAULT)
