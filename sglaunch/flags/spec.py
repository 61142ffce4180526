"""Data types of the flag schema: one `Flag` per SGLang launch flag, with its history.

The schema is a timeline, not a snapshot: every flag and every choice value carries the
release that added it and, where it applies, the release that deprecated or removed it
and what replaces it. `FlagSchema.at(release)` answers "what did SGLang <release> accept?".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable

from sglaunch.releases import CURRENT_RELEASE, at_or_after


class Kind(str, Enum):
    STR = "str"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"  # argparse store_true: a bare switch, never takes a value
    LIST = "list"  # nargs="+": one or more values up to the next flag


class Support(str, Enum):
    ENGINE = "engine"  # sglaunch's engine implements it
    FRONTEND = "frontend"  # consumed by the front end itself (e.g. --config)
    COMPAT = "compat"  # accepted and validated for SGLang compatibility; `serve` warns it has no effect


class Status(str, Enum):
    ABSENT = "absent"  # not yet added at this release
    ACTIVE = "active"
    DEPRECATED = "deprecated"  # still accepted; SGLang prints a warning
    REMOVED = "removed"


@dataclass(frozen=True)
class ValueChange:
    """History of one choice value: added, removed (with replacement) or a deprecated alias."""

    value: str
    added: str | None = None
    removed: str | None = None
    replacement: str | None = None  # what to use instead once removed (None: nothing replaces it)
    alias_of: str | None = None  # accepted spelling that SGLang rewrites to this value
    note: str = ""


@dataclass(frozen=True)
class Flag:
    """One SGLang launch flag as declared in `sglaunch.flags.registry`."""

    name: str
    kind: Kind
    help: str
    group: str = "Other"
    default: Any = None
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    open_choices: bool = False  # choices are the known ones; others pass with a warning
    upper_case: bool = False  # value is upper-cased before the choice check (SGLang does this)
    metavar: str | None = None
    item_kind: Kind = Kind.STR  # element type of a LIST flag
    added: str | None = None  # None: already present in the oldest release we track
    deprecated: str | None = None
    removed: str | None = None
    replaced_by: str | None = None  # canonical name of the flag that replaces this one
    value_map: tuple[tuple[str, str], ...] = ()  # old value -> value of `replaced_by`
    meaning_changed: bool = False  # the replacement does not mean the same thing
    note: str = ""  # what a user must know when this flag's history bites
    values: tuple[ValueChange, ...] = ()
    support: Support = Support.COMPAT
    engine_note: str = ""  # why/how sglaunch's engine treats it, shown by `serve`
    # --- argparse details, from the releases' data (sglaunch/flags/sglang/*.json)
    nargs: str | int | None = None  # "?": the value is optional; "+"/"*"/N for LIST
    switch_value: Any = True  # what a BOOL switch stores (False for store_false)
    value_type: str | None = None  # SGLang's value parser when it is not str/int/float (json, ...)
    repeatable: bool = False  # argparse action="append": each occurrence adds a value
    sglang_help: str = ""  # SGLang's own help text (newest release that has the flag)
    default_history: tuple[tuple[str, Any], ...] = ()  # (release, SGLang's default there)
    present_in: tuple[str, ...] = ()  # releases whose parser accepts this spelling
    alias_of: str | None = None  # another spelling of that flag, with a lifetime of its own
    # --- the hand-written layer only
    sglaunch_only: bool = False  # ours, not SGLang's (SGLang would reject it)
    sglaunch_values: tuple[str, ...] = ()  # values our engine takes that SGLang's choices lack
    default_differs: str = ""  # why our default is not SGLang's (empty: it is the same)

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def takes_value(self) -> bool:
        return self.kind is not Kind.BOOL

    def status_at(self, release: str = CURRENT_RELEASE) -> Status:
        if self.added is not None and not at_or_after(release, self.added):
            return Status.ABSENT
        if at_or_after(release, self.removed):
            return Status.REMOVED
        if at_or_after(release, self.deprecated):
            return Status.DEPRECATED
        return Status.ACTIVE

    def value_change(self, value: str) -> ValueChange | None:
        for change in self.values:
            if change.value == value:
                return change
        return None

    def value_status(self, value: str, release: str = CURRENT_RELEASE) -> Status:
        change = self.value_change(value)
        if change is None:
            return Status.ACTIVE
        if change.added is not None and not at_or_after(release, change.added):
            return Status.ABSENT
        if at_or_after(release, change.removed):
            return Status.REMOVED
        if change.alias_of is not None:
            return Status.DEPRECATED
        return Status.ACTIVE

    def known_values(self, release: str = CURRENT_RELEASE) -> tuple[str, ...]:
        """Choices valid at `release` (deprecated aliases excluded)."""
        if self.choices is None:
            return ()
        return tuple(v for v in self.choices if self.value_status(v, release) is Status.ACTIVE)


@dataclass(frozen=True)
class EnvVar:
    """An environment variable SGLang reads that matters for launch validation."""

    name: str
    help: str
    choices: tuple[str, ...] | None = None
    default: str | None = None
    added: str | None = None
    removed: str | None = None  # the variable is no longer read
    noop_since: str | None = None  # still read but does nothing
    replaced_by_flag: str | None = None
    note: str = ""
    sglaunch_only: bool = False  # read by sglaunch's engine, not by SGLang
    refused: bool = False  # the engine refuses a value outside `choices` at start-up (ENV005, an error)
    at_least: int | None = None  # a whole number >= this, else the engine refuses it at start-up (ENV005)


@dataclass
class FlagSchema:
    """Lookup over every flag the timeline knows, by any spelling."""

    flags: tuple[Flag, ...]
    env_vars: tuple[EnvVar, ...] = ()
    _by_spelling: dict[str, Flag] = field(init=False, repr=False)
    _by_name: dict[str, Flag] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_spelling = {}
        self._by_name = {}
        for flag in self.flags:
            self._by_name[flag.name] = flag
            for spelling in flag.spellings:
                if spelling in self._by_spelling:
                    raise ValueError(f"flag spelling {spelling} declared twice in the schema")
                self._by_spelling[spelling] = flag

    def lookup(self, spelling: str) -> Flag | None:
        return self._by_spelling.get(spelling)

    def get(self, name: str) -> Flag:
        return self._by_name[name]

    def by_dest(self, dest: str) -> Flag | None:
        return self._by_name.get("--" + dest.replace("_", "-"))

    def env_var(self, name: str) -> EnvVar | None:
        return next((e for e in self.env_vars if e.name == name), None)

    def at(self, release: str = CURRENT_RELEASE) -> list[Flag]:
        """Flags a launch at `release` accepts (active or deprecated)."""
        return [f for f in self.flags if f.status_at(release) in (Status.ACTIVE, Status.DEPRECATED)]

    def groups(self, release: str = CURRENT_RELEASE) -> dict[str, list[Flag]]:
        out: dict[str, list[Flag]] = {}
        for flag in self.at(release):
            if flag.status_at(release) is Status.ACTIVE:
                out.setdefault(flag.group, []).append(flag)
        return out

    def suggest(self, spelling: str, release: str = CURRENT_RELEASE, n: int = 3) -> list[str]:
        """'Did you mean' candidates among spellings valid at `release`."""
        import difflib

        candidates = _spellings(self.at(release))
        return difflib.get_close_matches(spelling, candidates, n=n, cutoff=0.6)

    def abbreviated(self, prefix: str, release: str = CURRENT_RELEASE) -> list[Flag]:
        """The distinct flags whose spellings at `release` start with `prefix`, as argparse's
        allow_abbrev (on in SGLang) sees them: one means `prefix` stands for it, several mean
        SGLang stops with 'ambiguous option'."""
        found: dict[str, Flag] = {}
        for flag in self.at(release):
            if any(s.startswith(prefix) and s != prefix for s in flag.spellings):
                target = self._by_name.get(flag.alias_of, flag) if flag.alias_of else flag
                found.setdefault(target.name, target)
        return list(found.values())

    def remapped_abbreviation(self, prefix: str, flag: Flag, release: str = CURRENT_RELEASE) -> Flag | None:
        """The removed flag `prefix` used to abbreviate, when it was the only one and `flag` (what
        argparse expands it to at `release`) is another: the same text now silently sets another
        flag (`--optimistic-prefill`: -retries up to 0.5.15, -attempts from 0.5.16)."""
        gone = [f for f in self.flags if f.removed and not f.alias_of and at_or_after(release, f.removed)
                and any(s.startswith(prefix) for s in f.spellings)]
        return gone[0] if len(gone) == 1 and gone[0].name != flag.name else None

    def prefix_expansions(self, spelling: str, release: str | None = CURRENT_RELEASE) -> list[str]:
        """Flags that argparse's prefix abbreviation would have matched (SGLang allows it).

        `release=None` searches every flag the timeline knows, removed ones included."""
        flags = self.flags if release is None else self.at(release)
        return sorted(s for s in _spellings(flags) if s.startswith(spelling) and s != spelling)


def _spellings(flags: Iterable[Flag]) -> list[str]:
    return [s for f in flags for s in f.spellings]
