"""What changed on SGLang's launch command line between two releases, from the generated data.

    python -m sglaunch.flags.release_diff 0.5.15 0.5.16 [--json]

`load_release_data(release)` reads the packaged `sglaunch/flags/sglang/<release>.json` (written by
`sglaunch.flags.extract`); `diff_releases(old, new)` compares two such dicts. Both are pure and
cheap (one `json.load`, cached), so the CLI may call them on its cold start.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

DATA_PACKAGE = "sglaunch.flags.sglang"
_RELEASE_FILE = re.compile(r"^\d+(\.\d+)+(\.post\d+)?\.json$")


@functools.lru_cache(maxsize=None)
def available_releases() -> tuple[str, ...]:
    """Releases with packaged data, oldest first."""
    names = [p.name[:-5] for p in resources.files(DATA_PACKAGE).iterdir()
             if _RELEASE_FILE.match(p.name)]
    return tuple(sorted(names, key=_version_key))


def load_release_data(release: str) -> dict:
    """The flag data of one SGLang release (cached; treat it as read-only). A post release
    without its own file (its flags are those of the base release) falls back to the base:
    "0.5.15.post1" -> "0.5.15"."""
    for name in (release, re.sub(r"\.post\d+$", "", release)):
        data = _load_file(name)
        if data is not None:
            return data
    known = ", ".join(available_releases())
    raise KeyError(f"no flag data for SGLang {release} (known: {known})")


@functools.lru_cache(maxsize=None)
def _load_file(name: str) -> dict | None:
    path = resources.files(DATA_PACKAGE) / f"{name}.json"
    if not path.is_file():
        return None
    with path.open("r", encoding="utf-8") as fh:
        return json.load(fh)


load_release_data.cache_clear = _load_file.cache_clear  # type: ignore[attr-defined]


def _version_key(release: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.]|post", release) if p)


def spellings(flag: dict) -> list[str]:
    """Every option string of one flag entry: its name, then its aliases."""
    return [flag["name"], *flag["aliases"]]


@dataclass
class Deprecation:
    flag: str
    replaced_by: str | None
    new_flag: str | None
    message: str | None
    error: bool = False


@dataclass
class ValueChange:
    flag: str
    old: Any
    new: Any


@dataclass
class ReleaseDiff:
    """Launch-flag changes from `old` to `new`. Flags are matched by option string."""

    old: str
    new: str
    removed_flags: list[str] = field(default_factory=list)  # no spelling of the flag is left
    removed_aliases: list[str] = field(default_factory=list)  # spelling gone, flag lives on
    added_flags: list[str] = field(default_factory=list)
    added_aliases: list[str] = field(default_factory=list)  # new spelling of an existing flag
    newly_deprecated: list[Deprecation] = field(default_factory=list)
    removed_choices: dict[str, list] = field(default_factory=dict)
    added_choices: dict[str, list] = field(default_factory=dict)
    changed_defaults: list[ValueChange] = field(default_factory=list)  # see effective_default
    changed_types: list[ValueChange] = field(default_factory=list)
    changed_nargs: list[ValueChange] = field(default_factory=list)
    changed_actions: list[ValueChange] = field(default_factory=list)
    # what the old release said about flags it removed: {flag: replacement} (deprecated ones)
    removed_replacements: dict[str, str | None] = field(default_factory=dict)
    removed_env: list[str] = field(default_factory=list)
    renamed_env: dict[str, str] = field(default_factory=dict)  # old name still read as alias
    added_env: list[str] = field(default_factory=list)
    changed_env_defaults: list[ValueChange] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def is_empty(self) -> bool:
        d = self.to_dict()
        return not any(v for k, v in d.items() if k not in ("old", "new"))


def _index(data: dict) -> dict[str, dict]:
    return {s: f for f in data["flags"] for s in spellings(f)}


def _match(flag: dict, other_index: dict[str, dict]) -> dict | None:
    """The entry of the other release that is the same flag: same name, else a shared spelling."""
    if flag["name"] in other_index:
        return other_index[flag["name"]]
    for s in flag["aliases"]:
        if s in other_index:
            return other_index[s]
    return None


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def _choice_delta(old: dict, new: dict) -> tuple[list, list]:
    a, b = old.get("choices") or [], new.get("choices") or []
    keys_a, keys_b = {_hashable(x) for x in a}, {_hashable(x) for x in b}
    removed = [x for x in a if _hashable(x) not in keys_b] if b else []
    added = [x for x in b if _hashable(x) not in keys_a] if a else []
    return removed, added


def diff_releases(old: dict, new: dict) -> ReleaseDiff:
    """Compare two loaded release data dicts (see `load_release_data`)."""
    diff = ReleaseDiff(old=old.get("release", "?"), new=new.get("release", "?"))
    old_idx, new_idx = _index(old), _index(new)
    for f in old["flags"]:
        twin = _match(f, new_idx)
        if twin is None:
            diff.removed_flags.append(f["name"])
            if f.get("deprecated"):
                diff.removed_replacements[f["name"]] = f["deprecated"].get("replaced_by")
            continue
        diff.removed_aliases += [s for s in spellings(f) if s not in new_idx]
    for f in new["flags"]:
        twin = _match(f, old_idx)
        if twin is None:
            diff.added_flags.append(f["name"])
            if f.get("deprecated"):
                diff.newly_deprecated.append(_deprecation(f))
            continue
        diff.added_aliases += [s for s in spellings(f) if s not in old_idx]
        _compare(twin, f, diff)
    _compare_env(old.get("env", []), new.get("env", []), diff)
    return diff


def _deprecation(flag: dict) -> Deprecation:
    d = flag["deprecated"]
    return Deprecation(flag["name"], d.get("replaced_by"), d.get("new_flag"), d.get("message"),
                       bool(d.get("error")))


def _compare(a: dict, b: dict, diff: ReleaseDiff) -> None:
    name = b["name"]
    if b.get("deprecated") and not a.get("deprecated"):
        diff.newly_deprecated.append(_deprecation(b))
    removed, added = _choice_delta(a, b)
    if removed:
        diff.removed_choices[name] = removed
    if added:
        diff.added_choices[name] = added
    if _hashable(effective_default(a)) != _hashable(effective_default(b)):
        diff.changed_defaults.append(ValueChange(name, effective_default(a), effective_default(b)))
    for key, bucket in (("type", diff.changed_types), ("nargs", diff.changed_nargs),
                        ("action", diff.changed_actions)):
        if _hashable(a.get(key)) != _hashable(b.get(key)):
            bucket.append(ValueChange(name, a.get(key), b.get(key)))


def effective_default(flag: dict) -> Any:
    """The value SGLang ends up with when the flag is not given: the argparse default, or the
    field's declared `fallback` (0.5.20+) when that default is None."""
    default = flag.get("default")
    if default is None and flag.get("fallback") is not None:
        return flag["fallback"]
    return default


def _compare_env(old: list, new: list, diff: ReleaseDiff) -> None:
    a, b = {e["name"]: e for e in old}, {e["name"]: e for e in new}
    aliases = {e["deprecated_name"]: e["name"] for e in new if e.get("deprecated_name")}
    gone = sorted(set(a) - set(b))
    diff.removed_env = [n for n in gone if n not in aliases]
    diff.renamed_env = {n: aliases[n] for n in gone if n in aliases}
    diff.added_env = sorted(set(b) - set(a))
    for name in sorted(set(a) & set(b)):
        if _hashable(a[name]["default"]) != _hashable(b[name]["default"]):
            diff.changed_env_defaults.append(ValueChange(name, a[name]["default"],
                                                         b[name]["default"]))


def format_report(diff: ReleaseDiff) -> str:
    """A readable, plain-text rendering of a ReleaseDiff."""
    lines = [f"SGLang {diff.old} -> {diff.new}"]

    def section(title: str, rows: list[str]) -> None:
        if rows:
            lines.append(f"\n{title} ({len(rows)}):")
            lines.extend(f"  {r}" for r in rows)

    section("Removed flags", [
        f + (f"  (was deprecated; use {diff.removed_replacements[f]})"
             if diff.removed_replacements.get(f) else
             "  (was deprecated)" if f in diff.removed_replacements else "")
        for f in diff.removed_flags])
    section("Removed spellings of surviving flags", diff.removed_aliases)
    section("Added flags", diff.added_flags)
    section("Added spellings of existing flags", diff.added_aliases)
    section("Newly deprecated", [
        f"{d.flag} -> {d.new_flag or d.replaced_by or '(no replacement)'}"
        + ("  [error]" if d.error else "") for d in diff.newly_deprecated])
    section("Removed choice values", [f"{k}: {', '.join(map(str, v))}"
                                      for k, v in diff.removed_choices.items()])
    section("Added choice values", [f"{k}: {', '.join(map(str, v))}"
                                    for k, v in diff.added_choices.items()])
    for title, rows in (("Changed defaults", diff.changed_defaults),
                        ("Changed types", diff.changed_types),
                        ("Changed nargs", diff.changed_nargs),
                        ("Changed actions", diff.changed_actions),
                        ("Changed env defaults", diff.changed_env_defaults)):
        section(title, [f"{c.flag}: {json.dumps(c.old)} -> {json.dumps(c.new)}" for c in rows])
    section("Removed env vars", diff.removed_env)
    section("Renamed env vars (old name still read, with a warning)",
            [f"{k} -> {v}" for k, v in diff.renamed_env.items()])
    section("Added env vars", diff.added_env)
    if diff.is_empty():
        lines.append("\nNo launch-flag changes.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglaunch.flags.release_diff",
                                description="Launch-flag changes between two SGLang releases.")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--json", action="store_true", help="print the diff as JSON")
    args = p.parse_args(argv)
    try:
        diff = diff_releases(load_release_data(args.old), load_release_data(args.new))
    except KeyError as e:
        print(f"Error: {e.args[0]}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(diff.to_dict(), indent=1, sort_keys=True))
    else:
        sys.stdout.write(format_report(diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
