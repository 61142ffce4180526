"""The flag timeline built from SGLang's own releases, and our hand-written layer on top of it.

`sglaunch/flags/sglang/<release>.json` (written by `python -m sglaunch.flags.extract` from the
released wheels) says what each release's argparse parser accepts. Here those snapshots become
one `Flag` per flag with its history: the release that added it, deprecated it, removed it;
the history of every choice value; each spelling's own lifetime (an alias that came or went
later is its own entry pointing at the flag it spells).

`merge` then lays the hand-written declarations of `registry.py` over the generated facts:
what our engine does with a flag, migration notes, meaning changes, value replacements. Facts
(type, choices, releases) always come from the data; `disagreements` lists every place where a
hand-written declaration says otherwise, and a test keeps that list empty.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Iterable, Mapping, Sequence

from sglaunch.flags.spec import Flag, Kind, Support, ValueChange

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang")  # package data
# 0.5.20+ declares some flags in namespace classes without a section title: the group they belong to
NAMESPACE_GROUPS = {"exec.moe": "Expert parallelism", "exec.mamba": "Mamba cache and linear attn",
                    "serving": "API related", "memory": "Memory and scheduling", "disagg": "PD disaggregation",
                    "exec.features": "Misc runtime features", "mm": "Multi-modal optimization configs"}
SUPPRESS = "==SUPPRESS=="  # argparse.SUPPRESS as the extractor writes it
SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count", "append_const")


def release_data(release: str) -> dict:
    """One release's extracted flags (the JSON file shipped in the package); building the index
    and the tests read them, the front end reads only the index."""
    from sglaunch.flags.release_diff import load_release_data

    return load_release_data(release)


def has_release_data(release: str) -> bool:
    from sglaunch.flags.release_diff import available_releases

    return release in available_releases()


# --------------------------------------------------------------------------- entry -> facts


@dataclass(frozen=True)
class Facts:
    """What one release's parser does with one spelling."""

    kind: Kind
    item_kind: Kind = Kind.STR
    nargs: str | int | None = None
    switch_value: Any = True
    choices: tuple[str, ...] | None = None
    choices_open: bool = False
    default: Any = None
    help: str = ""
    value_type: str | None = None
    repeatable: bool = False
    deprecated_for: str | None = None  # a deprecated spelling: the flag to write instead
    deprecated_value: str | None = None  # ... and the value it stands for (`--new=VALUE`)
    deprecation_message: str = ""
    deprecated: bool = False
    negatable: bool = False  # argparse.BooleanOptionalAction: --no-NAME turns it off
    group: str | None = None
    action: str = "store"


def entry_facts(entry: Mapping[str, Any]) -> Facts:
    action, nargs, type_name = entry.get("action") or "store", entry.get("nargs"), entry.get("type")
    default = entry.get("default")
    if (isinstance(default, dict) and set(default) == {"expr"}) or default == SUPPRESS:
        default = None  # computed at run time, or argparse.SUPPRESS (no attribute unless given)
    deprecated = entry.get("deprecated") or None
    new_flag = (deprecated or {}).get("new_flag") or ""
    help_text = "" if entry.get("help") == SUPPRESS else entry.get("help") or ""
    group = entry.get("group") or NAMESPACE_GROUPS.get(entry.get("namespace") or "")
    common = dict(help=help_text, default=default, group=group,
                  deprecated=deprecated is not None,
                  deprecated_for=(deprecated or {}).get("replaced_by"),
                  deprecated_value=new_flag.partition("=")[2] or None,
                  deprecation_message=(deprecated or {}).get("message") or "")
    common["action"] = action
    if action in SWITCH_ACTIONS or nargs == 0:
        return Facts(Kind.BOOL, switch_value=action != "store_false", negatable=action == "BooleanOptionalAction",
                     **common)
    choices = entry.get("choices")
    choices = tuple(str(c) for c in choices) if isinstance(choices, list) else None
    value_common = dict(choices=choices, choices_open=bool(entry.get("choices_open")),
                        value_type=type_name, repeatable=action == "append", **common)
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs >= 1):
        return Facts(Kind.LIST, item_kind=_scalar_kind(type_name), nargs=nargs, **value_common)
    return Facts(_scalar_kind(type_name), nargs=nargs, **value_common)


def _scalar_kind(type_name: str | None) -> Kind:
    return {"int": Kind.INT, "float": Kind.FLOAT, "human_readable_int": Kind.INT}.get(type_name or "", Kind.STR)


# --------------------------------------------------------------------------- the timeline


@dataclass
class _Group:
    """The spellings argparse treats as one flag, across releases."""

    name: str  # the primary spelling in the newest release that has the flag
    present: list[str]  # releases (oldest first)
    facts: dict[str, Facts]  # release -> facts of the primary entry there
    spellings: dict[str, list[str]]  # spelling -> releases where this flag accepts it
    refused: dict[str, dict]  # release -> the "deprecated" record of an action that errors out


def _groups(releases: Sequence[str], data: Mapping[str, dict]) -> list[_Group]:
    parent: dict[str, str] = {}

    def find(s: str) -> str:
        while parent.setdefault(s, s) != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for release in releases:
        for entry in data[release]["flags"]:
            for alias in entry.get("aliases") or ():
                parent[find(alias)] = find(entry["name"])
            find(entry["name"])
    groups: dict[str, _Group] = {}
    for release in releases:
        for entry in data[release]["flags"]:
            root = find(entry["name"])
            if (entry.get("deprecated") or {}).get("error"):
                # a deprecated action that stops argparse with an error: the release rejects the
                # flag, so it is not present; only what the message says to use instead is kept
                group = groups.get(root)
                if group is not None:
                    group.refused.setdefault(release, entry["deprecated"])
                continue
            group = groups.setdefault(root, _Group(entry["name"], [], {}, {}, {}))
            group.name = entry["name"]  # newest primary spelling wins
            if release not in group.present:
                group.present.append(release)
            group.facts.setdefault(release, entry_facts(entry))
            for spelling in (entry["name"], *(entry.get("aliases") or ())):
                seen = group.spellings.setdefault(spelling, [])
                if release not in seen:
                    seen.append(release)
    return list(groups.values())


def _lifetime(present: Sequence[str], releases: Sequence[str]) -> tuple[str | None, str | None]:
    """(added, removed) of something present in `present` (a run of `releases`)."""
    first = releases.index(present[0])
    last = releases.index(present[-1])
    added = None if first == 0 else releases[first]
    removed = releases[last + 1] if last + 1 < len(releases) else None
    return added, removed


def _value_history(group: _Group, releases: Sequence[str]) -> tuple[tuple[str, ...] | None, bool,
                                                                       tuple[ValueChange, ...]]:
    """Every choice the flag ever had, whether the list is open, and each value's lifetime."""
    lists = [group.facts[r].choices for r in group.present]
    open_ = any(group.facts[r].choices_open for r in group.present)
    if all(choices is None for choices in lists):
        return None, False, ()
    if any(choices is None for choices in lists):
        open_ = True  # some releases take any value: only the known ones can be checked
    union: list[str] = []
    for choices in lists:
        for value in choices or ():
            if value not in union:
                union.append(value)
    changes = []
    for value in union:
        present = [r for r in group.present if value in (group.facts[r].choices or ())]
        added, removed = _lifetime(present, group.present)
        if added or removed:
            changes.append(ValueChange(value, added=added, removed=removed))
    return tuple(union), open_, tuple(changes)


def generated_flags(releases: Sequence[str], data: Mapping[str, dict] | None = None) -> list[Flag]:
    """One Flag per flag of the releases' data, history included (no hand-written layer)."""
    data = data if data is not None else {r: release_data(r) for r in releases}
    flags: list[Flag] = []
    for group in _groups(releases, data):
        newest = group.facts[group.present[-1]]
        added, removed = _lifetime(group.present, releases)
        deprecated_in = [r for r in group.present if group.facts[r].deprecated]
        replaced_by = next((group.facts[r].deprecated_for for r in reversed(deprecated_in)
                            if group.facts[r].deprecated_for), None)
        refusal = next(iter(group.refused.values()), {})
        replaced_by = replaced_by or refusal.get("replaced_by")
        choices, open_, values = _value_history(group, releases)
        defaults = tuple((r, group.facts[r].default) for r in group.present)
        negated = {s for s in group.spellings if newest.negatable and s.startswith("--no-")}
        main = [s for s, seen in group.spellings.items() if seen == group.present and s not in negated]
        if group.name not in main:
            main.insert(0, group.name)
        mapped = next((group.facts[r].deprecated_value for r in reversed(deprecated_in)
                       if group.facts[r].deprecated_value), None)
        value_map = (("true", mapped),) if mapped and newest.kind is Kind.BOOL else ()
        message = next((group.facts[r].deprecation_message for r in reversed(deprecated_in)
                        if group.facts[r].deprecation_message), refusal.get("message") or "")
        titled = next((group.facts[r].group for r in reversed(group.present) if group.facts[r].group), "Other")
        flags.append(Flag(
            name=group.name, kind=newest.kind, help=newest.help, group=titled,
            default=newest.default, aliases=tuple(s for s in main if s != group.name),
            choices=choices, open_choices=open_, item_kind=newest.item_kind, nargs=newest.nargs,
            switch_value=newest.switch_value, value_type=newest.value_type,
            repeatable=newest.repeatable, added=added,
            deprecated=deprecated_in[0] if deprecated_in else None, removed=removed,
            replaced_by=replaced_by, values=values, sglang_help=newest.help, value_map=value_map,
            note=message, default_history=defaults, present_in=tuple(group.present)))
        primary = flags[-1]
        for spelling, seen in group.spellings.items():
            if spelling in main:
                continue  # a spelling with a lifetime of its own (an alias dropped later), or --no-X
            s_added, s_removed = _lifetime(seen, releases)
            flags.append(replace(primary, name=spelling, aliases=(), added=s_added, removed=s_removed,
                                 alias_of=group.name, replaced_by=group.name if s_removed else None,
                                 present_in=tuple(seen),
                                 deprecated=None, value_map=(), note="",
                                 switch_value=False if spelling in negated else primary.switch_value,
                                 help=(f"Turns {group.name} off." if spelling in negated
                                       else f"Another spelling of {group.name}.")))
    return flags


# --------------------------------------------------------------------------- our layer on top


# fields only the hand-written layer knows; copied over the generated flag as they stand
OVERLAY_FIELDS = ("support", "engine_note", "note", "meaning_changed", "value_map", "upper_case",
                  "metavar", "group", "help", "sglaunch_values", "default_differs")
# facts the data owns; a hand-written declaration that states them must agree
FACT_FIELDS = ("kind", "added", "removed", "deprecated")


def merge(hand: Iterable[Flag], generated: Iterable[Flag]) -> tuple[Flag, ...]:
    """Generated facts with the hand-written layer on top; hand flags SGLang lacks stay as they are
    (e.g. `--config`, which SGLang handles before argparse)."""
    by_name = {f.name: f for f in generated}
    ours_by_lower = {f.group.lower(): f.group for f in hand}  # "Cuda graphs" joins our "CUDA graphs"
    out: dict[str, Flag] = {name: replace(f, group=ours_by_lower.get(f.group.lower(), f.group))
                            if f.group.lower() in ours_by_lower else f for name, f in by_name.items()}
    for ours in hand:
        theirs = by_name.get(ours.name)
        if theirs is None:
            out[ours.name] = ours
            continue
        # the hand layer overrides where it says something; an empty note or map leaves the data's
        merged = replace(theirs, **{k: getattr(ours, k) for k in OVERLAY_FIELDS
                                    if getattr(ours, k) or k in ("support", "upper_case", "meaning_changed")})
        if ours.replaced_by:
            merged = replace(merged, replaced_by=ours.replaced_by)
        if ours.default is not None:
            merged = replace(merged, default=ours.default)
        merged = replace(merged, values=_merge_values(theirs.values, ours.values),
                         open_choices=theirs.open_choices or ours.open_choices)
        if theirs.choices is None and ours.choices:  # an open registry: our list of its built-ins
            merged = replace(merged, choices=ours.choices, open_choices=True)
        out[ours.name] = merged
        for alias in ours.aliases:  # a hand alias that the data keeps as its own spelling entry
            if alias in out and out[alias].alias_of == ours.name:
                out[alias] = replace(out[alias], support=ours.support, engine_note=ours.engine_note)
    # our declarations first, in their order (they open `serve --help` and the docs: what the engine
    # runs), then every other flag by SGLang's group and name
    hand_order = {f.name: i for i, f in enumerate(hand)}
    ordered = sorted(out.values(), key=lambda f: (hand_order.get(f.name, len(hand_order)), f.group, f.name))
    return tuple(ordered)


def _merge_values(theirs: tuple[ValueChange, ...], ours: tuple[ValueChange, ...]) -> tuple[ValueChange, ...]:
    """Lifetimes from the data; replacement, alias and note from the hand layer."""
    merged = {c.value: c for c in theirs}
    for change in ours:
        if change.value not in merged:
            merged[change.value] = change  # e.g. a value of an open registry the data cannot list
            continue
        base = merged[change.value]
        merged[change.value] = replace(base, replacement=change.replacement, alias_of=change.alias_of,
                                       note=change.note or base.note)
    return tuple(merged.values())


def disagreements(hand: Iterable[Flag], generated: Iterable[Flag]) -> list[str]:
    """Where a hand-written declaration contradicts what the releases say (a test keeps it empty)."""
    by_name = {f.name: f for f in generated}
    problems = []
    for ours in hand:
        theirs = by_name.get(ours.name)
        if theirs is None:
            if not ours.sglaunch_only:
                problems.append(f"{ours.name}: declared by hand, but no SGLang release we follow has it "
                                "(mark it sglaunch_only=True if it is ours)")
            continue
        if ours.sglaunch_only:
            problems.append(f"{ours.name}: marked sglaunch_only, but SGLang has it")
        for field in FACT_FIELDS:  # None: the hand layer leaves it to the data
            if getattr(ours, field) is not None and getattr(ours, field) != getattr(theirs, field):
                problems.append(f"{ours.name}: {field} is {getattr(ours, field)!r} by hand, "
                                f"{getattr(theirs, field)!r} in the releases")
        if ours.kind is Kind.LIST and ours.item_kind is not theirs.item_kind:
            problems.append(f"{ours.name}: items are {ours.item_kind.value} by hand, "
                            f"{theirs.item_kind.value} in the releases")
        for value in ours.sglaunch_values:
            if theirs.choices and value in theirs.choices:
                problems.append(f"{ours.name}: {value} is listed as sglaunch's own value, but SGLang has it")
        for alias in ours.aliases:
            if alias not in theirs.aliases and by_name.get(alias, theirs).alias_of != ours.name:
                problems.append(f"{ours.name}: alias {alias} is not an SGLang spelling of it")
        if ours.choices is not None:
            if theirs.choices is None and ours.open_choices:
                pass  # SGLang keeps an open registry (e.g. speculative algorithms); ours names the built-ins
            elif theirs.choices is None:
                problems.append(f"{ours.name}: choices by hand, none in the releases")
            elif set(ours.choices) != set(theirs.choices):
                extra = sorted(set(ours.choices) - set(theirs.choices))
                missing = sorted(set(theirs.choices) - set(ours.choices))
                problems.append(f"{ours.name}: hand choices differ from the releases' "
                                f"(only by hand: {extra}; only in the releases: {missing})")
        for change in ours.values if theirs.choices is not None else ():
            mine = next((c for c in theirs.values if c.value == change.value), ValueChange(change.value))
            if (change.added, change.removed) != (mine.added, mine.removed) and \
                    (change.added or change.removed):
                problems.append(f"{ours.name} {change.value}: added/removed {change.added}/"
                                f"{change.removed} by hand, {mine.added}/{mine.removed} in the releases")
        same_switch_default = ours.kind is Kind.BOOL and not ours.default and not theirs.default
        if ours.default is not None and ours.default != theirs.default and not ours.default_differs \
                and not same_switch_default:
            problems.append(f"{ours.name}: default {ours.default!r} by hand, {theirs.default!r} in "
                            f"SGLang {theirs.present_in[-1]} (set default_differs with the reason)")
    return problems


# --------------------------------------------------------------------------- the committed index
#
# Building the timeline reads every release's file (about 2 MB of JSON) and takes longer than a
# front-end command may (cold start under 0.3 s). So `python -m sglaunch.flags.timeline` writes it
# once into `sglang/timeline.json` (fields left at their defaults are omitted), the front end
# loads only that, and a test fails when the index is stale against the release files.

INDEX_NAME = "timeline.json"
_FLAG_DEFAULTS = {f.name: f.default for f in fields(Flag)}
_ENUM_FIELDS = {"kind": Kind, "item_kind": Kind, "support": Support}


def _flag_record(flag: Flag) -> dict:
    record = {}
    for name, default in _FLAG_DEFAULTS.items():
        value = getattr(flag, name)
        if value == default and not (name == "kind"):
            continue
        if name in _ENUM_FIELDS:
            value = value.value
        elif name == "values":
            value = [{k: v for k, v in vars(c).items() if v is not None and v != ""} for c in value]
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        record[name] = value
    return record


def env_index(releases: Sequence[str], data: Mapping[str, dict] | None = None) -> dict:
    """Environment variables SGLang reads: name -> releases whose `environ.py` declares it; and
    old name -> [new name, releases] for names still read under a deprecated spelling."""
    data = data if data is not None else {r: release_data(r) for r in releases}
    names: dict[str, list[str]] = {}
    renamed: dict[str, list] = {}
    for release in releases:
        for var in data[release].get("env") or ():
            names.setdefault(var["name"], []).append(release)
            if var.get("deprecated_name"):
                renamed.setdefault(var["deprecated_name"], [var["name"], []])[1].append(release)
    return {"names": names, "renamed": renamed}


def config_refused_keys(release_facts: dict) -> dict[str, str]:
    """YAML keys (dashes as underscores) that one release's `--config` loader refuses with
    "Unsupported config option", each with the flag whose action refuses it.

    Up to 0.5.22 the loader turns only store and store_true actions into argv and keys the others
    by their dest; a deprecated alias shares its dest with the flag it replaced, so the *new*
    flag's key is refused too (`cuda-graph-max-bs-decode:` in 0.5.16). 0.5.23 also takes any
    action with one value and keeps a key usable when a supported flag reads it."""
    loader = release_facts.get("config_loader")
    if loader is None:
        return {}
    entries = [e for e in release_facts["flags"] if e["name"] not in ("--config", "--help")]

    def keys(entry: dict) -> set[str]:
        spellings = (entry["name"], *entry.get("aliases", ()))
        return {entry["dest"]} | {s[2:].replace("-", "_") for s in spellings if s.startswith("--")}

    def supported(entry: dict) -> bool:
        action = entry.get("action") or "store"
        if action in ("store", "store_true"):
            return True
        return loader == "single-value" and entry.get("nargs") is None

    if loader == "store-only":
        return {e["dest"]: e["name"] for e in entries if not supported(e)}
    usable = set().union(*(keys(e) for e in entries if supported(e)))
    return {k: e["name"] for e in entries if not supported(e) for k in sorted(keys(e)) if k not in usable}


def index_text(releases: Sequence[str]) -> str:
    flags = generated_flags(releases)
    lines = ",\n".join(json.dumps(_flag_record(f), sort_keys=True, ensure_ascii=False) for f in flags)
    env = json.dumps(env_index(releases), sort_keys=True)
    refused = json.dumps({r: config_refused_keys(release_data(r)) for r in releases}, sort_keys=True)
    return ('{"releases": ' + json.dumps(list(releases)) + ',\n"env": ' + env + ',\n"config_refused": '
            + refused + ',\n"flags": [\n' + lines + "\n]}\n")


def _flag_from_record(record: dict) -> Flag:
    values = dict(record)
    for name, enum in _ENUM_FIELDS.items():
        if name in values:
            values[name] = enum(values[name])
    if "values" in values:
        values["values"] = tuple(ValueChange(**c) for c in values["values"])
    for name in ("aliases", "choices", "present_in"):
        if name in values and values[name] is not None:
            values[name] = tuple(values[name])
    for name in ("default_history", "value_map"):
        if name in values:
            values[name] = tuple(tuple(pair) for pair in values[name])
    # NOTE: the frozen dataclass's __init__ sets ~40 fields one by one; for 600 flags at every
    # start that is most of the schema's load time. Fields left out keep their class defaults.
    flag = object.__new__(Flag)
    flag.__dict__.update(values)
    return flag


@functools.lru_cache(maxsize=1)
def _index() -> dict:
    with open(os.path.join(DATA_DIR, INDEX_NAME), encoding="utf-8") as handle:
        return json.load(handle)


def config_refused(release: str) -> dict[str, str]:
    """`config_refused_keys` of `release`, from the committed index."""
    return _index()["config_refused"].get(release, {})


def env_history() -> dict:
    """`env_index` of the releases, from the committed index."""
    return _index()["env"]


def load_generated(releases: Sequence[str]) -> tuple[Flag, ...]:
    """The generated flags of `releases`, from the committed index."""
    data = _index()
    if tuple(data["releases"]) != tuple(releases):
        raise RuntimeError(f"sglaunch/flags/sglang/{INDEX_NAME} covers {data['releases']}, not "
                           f"{list(releases)}: run `python -m sglaunch.flags.timeline`")
    return tuple(_flag_from_record(r) for r in data["flags"])


def main() -> None:
    from pathlib import Path

    from sglaunch.releases import KNOWN_RELEASES

    path = Path(DATA_DIR) / INDEX_NAME
    path.write_text(index_text(KNOWN_RELEASES), encoding="utf-8")
    print(f"wrote {path} ({len(KNOWN_RELEASES)} releases)")


if __name__ == "__main__":
    main()
