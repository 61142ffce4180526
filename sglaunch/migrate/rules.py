"""Migration rules as data: `migrations/<release>.yaml` loaded into frozen `Rule`s.

Each file holds `release: "X.Y.Z"` and a `rules:` list. A rule has a stable `id`, a `name`
(slug), a `kind`, `safety` (`safe`: applied by default, `unsafe`: only with
--unsafe-fixes, `manual`: reported, never rewritten), a `message` and an `example`.
Validation happens on load; a malformed file raises `SglaunchError` naming file and rule.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from sglaunch.errors import SglaunchError
from sglaunch.releases import KNOWN_RELEASES, release_key

KINDS = ("rename-flag", "remove-flag", "remove-value", "replace-value", "require-env",
         "rename-env", "notice", "pin")
SAFETIES = ("safe", "unsafe", "manual")
TRANSFORMS = ("increment",)
ID_PATTERN = re.compile(r"R\d{3}-\d{2}")
NAME_PATTERN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")

COMMON = {"id", "name", "kind", "safety", "message", "example"}
FIELDS: dict[str, tuple[set[str], set[str]]] = {  # kind -> (required, optional)
    "rename-flag": ({"old", "new"}, {"set_value", "value_map", "transform", "ensure"}),
    "remove-flag": ({"old"}, set()),
    "remove-value": ({"flag", "old"}, set()),
    "replace-value": ({"flag", "old", "new"}, set()),
    "require-env": ({"when", "env", "value", "allowed"}, set()),
    "rename-env": ({"old", "new"}, set()),
    "notice": ({"when"}, set()),
    # what the release needs installed: `packages` at `version` (pip pins, requirements files,
    # pyproject.toml) and, for `images`, SGLang image tags (module `deps`)
    "pin": ({"packages", "version"}, {"images", "floor", "never", "cuda"}),
}
WHEN_KEYS = {"flag", "value", "flags", "env"}
REPORT_ONLY = ("remove-value", "rename-env", "notice")


@dataclass(frozen=True)
class When:
    """Trigger of a notice or require-env rule; every given part must hold."""

    flag: str | None = None  # this flag is present...
    values: tuple[str, ...] = ()  # ...with one of these values (empty: any value)
    flags: tuple[str, ...] = ()  # all of these flags are present
    env: tuple[str, ...] = ()  # any of these environment variables is set


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    kind: str
    release: str
    safety: str
    message: str
    before: str
    after: str
    old: str | None = None  # flag spelling, value or env var name (by kind)
    new: str | None = None
    flag: str | None = None  # remove-value / replace-value: the flag whose value changed
    set_value: str | None = None  # rename-flag: a switch becomes `--new VALUE`
    value_map: tuple[tuple[str, str], ...] = ()  # rename-flag: old value -> new value
    transform: str | None = None  # rename-flag: a named value handler (increment)
    ensure: tuple[tuple[str, str], ...] = ()  # rename-flag: add `--flag value` when absent
    when: When | None = None
    env: str | None = None  # require-env: the variable
    value: str | None = None  # require-env: the value to add
    allowed: tuple[str, ...] = ()  # require-env: every valid value
    packages: tuple[str, ...] = ()  # pin: distribution names (PEP 503 normalised), first one shown
    images: tuple[str, ...] = ()  # pin: image repositories whose tag is the package's release
    version: str | None = None  # pin: the version the release needs (and the fix writes)
    floor: bool = False  # pin: later releases need at least `version` (their own pin is not known)
    never: tuple[str, ...] = ()  # pin: versions never to install (released and reverted)
    cuda: str | None = None  # pin: the CUDA major version of the release's images and wheels
    source: str = ""  # file it came from

    @property
    def report_only(self) -> bool:
        return self.kind in REPORT_ONLY or self.safety == "manual"

    def summary(self) -> str:
        return self.message.strip().split("\n")[0]


@dataclass(frozen=True)
class Accounted:
    """A change of `release` (a flag or a choice value removed, a spelling deprecated) that needs
    no rule, with the reason; `accounted:` in the release's file. The tests require a rule or one
    of these for every change the releases' data shows."""

    release: str
    flag: str
    reason: str
    value: str | None = None  # a removed choice value of `flag`
    source: str = ""


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    accounted: tuple[Accounted, ...] = ()

    def between(self, from_release: str, to_release: str) -> tuple[Rule, ...]:
        """Rules of releases after `from_release` up to and including `to_release`, oldest first."""
        low, high = release_key(from_release), release_key(to_release)
        return tuple(r for r in self.rules if low < release_key(r.release) <= high)

    def find(self, key: str) -> Rule | None:
        key = key.strip()
        for rule in self.rules:
            if rule.id.lower() == key.lower() or rule.name == key:
                return rule
        return None


def rules_dir() -> Path:
    """`migrations/` next to the package in a checkout, or the copy inside an installed wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "migrations", here / "_data" / "migrations"):
        if candidate.is_dir():
            return candidate
    raise SglaunchError("the migration rule files are missing",
                        hint=f"expected {here.parent / 'migrations'}; reinstall sglaunch")


@functools.lru_cache(maxsize=4)
def load_rules(directory: str | None = None) -> RuleSet:
    """Load and validate every `<release>.yaml` in `directory` (default: the shipped rules)."""
    folder = Path(directory) if directory else rules_dir()
    files = sorted(folder.glob("*.yaml"), key=lambda p: release_key(p.stem))
    rules: list[Rule] = []
    accounted: list[Accounted] = []
    for path in files:
        rules.extend(load_rule_file(path))
        accounted.extend(load_accounted(path))
    _check_unique(rules)
    return RuleSet(tuple(rules), tuple(accounted))


def _read(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise _bad(path, f"cannot read rule file: {exc}") from None
    if not isinstance(data, dict) or "release" not in data or set(data) - {"release", "rules", "accounted"}:
        raise _bad(path, "a rule file is a mapping with `release`, `rules` and optionally `accounted`")
    release = str(data.get("release", ""))
    if release not in KNOWN_RELEASES or release != path.stem:
        raise _bad(path, f"release '{release}' must be a known release and match the file name")
    return data


def load_rule_file(path: Path) -> list[Rule]:
    data = _read(path)
    release = str(data["release"])
    entries = data.get("rules") or []
    if not isinstance(entries, list):
        raise _bad(path, "`rules` must be a list")
    return [parse_rule(entry, release, path) for entry in entries]


def load_accounted(path: Path) -> list[Accounted]:
    """The file's `accounted:` list: `{flag: --x, reason: ...}` or `{flag: --x, value: v, reason: ...}`."""
    data = _read(path)
    release = str(data["release"])
    entries = data.get("accounted") or []
    if not isinstance(entries, list):
        raise _bad(path, "`accounted` must be a list")
    found = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) - {"flag", "value", "reason"} or \
                not str(entry.get("flag", "")).startswith("--") or not str(entry.get("reason", "")).strip():
            raise _bad(path, f"accounted entry {entry!r}: needs `flag` (starting with --) and a `reason`, "
                       "optionally `value`")
        value = entry.get("value")
        found.append(Accounted(release, str(entry["flag"]), " ".join(str(entry["reason"]).split()),
                               None if value is None else str(value), str(path)))
    return found


def parse_rule(entry: Any, release: str, path: Path | str = "<rules>") -> Rule:
    if not isinstance(entry, dict):
        raise _bad(path, f"every rule must be a mapping, got {entry!r}")
    rule_id = str(entry.get("id", "?"))
    kind = entry.get("kind")
    if kind not in KINDS:
        raise _bad(path, f"rule {rule_id}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    required, optional = FIELDS[kind]
    keys = set(entry)
    missing = (COMMON | required) - keys
    unknown = keys - COMMON - required - optional
    if missing or unknown:
        problems = [f"missing {', '.join(sorted(missing))}" if missing else "",
                    f"unknown {', '.join(sorted(unknown))}" if unknown else ""]
        raise _bad(path, f"rule {rule_id} ({kind}): " + "; ".join(p for p in problems if p))
    _check_basics(entry, kind, path)
    return _build(entry, kind, release, str(path))


def _check_basics(entry: dict, kind: str, path) -> None:
    rule_id = str(entry["id"])
    if not ID_PATTERN.fullmatch(rule_id):
        raise _bad(path, f"rule id '{rule_id}' must look like R516-01")
    if not NAME_PATTERN.fullmatch(str(entry["name"])):
        raise _bad(path, f"rule {rule_id}: name must be a lower-case slug")
    if entry["safety"] not in SAFETIES:
        raise _bad(path, f"rule {rule_id}: safety must be one of {', '.join(SAFETIES)}")
    if kind in REPORT_ONLY and entry["safety"] != "manual":
        raise _bad(path, f"rule {rule_id}: {kind} rules only report, so safety must be manual")
    example = entry["example"]
    if not isinstance(example, dict) or set(example) != {"before", "after"}:
        raise _bad(path, f"rule {rule_id}: example needs exactly `before` and `after`")
    if not str(entry["message"]).strip():
        raise _bad(path, f"rule {rule_id}: message is empty")
    for key in ("old", "new", "flag"):
        if key in entry and kind not in ("rename-env",) and key in _flag_keys(kind):
            if not str(entry[key]).startswith("--"):
                raise _bad(path, f"rule {rule_id}: `{key}` must be a flag spelling starting with --")
    if entry.get("transform") not in (None, *TRANSFORMS):
        raise _bad(path, f"rule {rule_id}: transform must be one of {', '.join(TRANSFORMS)}")
    if kind == "pin":
        _check_pin(entry, rule_id, path)


PACKAGE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
IMAGE_NAME = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)+")


def _check_pin(entry: dict, rule_id: str, path) -> None:
    from packaging.version import InvalidVersion, Version

    packages, images = entry["packages"], entry.get("images", [])
    if not isinstance(packages, list) or not packages or not all(
            isinstance(p, str) and PACKAGE_NAME.fullmatch(p) for p in packages):
        raise _bad(path, f"rule {rule_id}: `packages` is a non-empty list of package names")
    if not isinstance(images, list) or not all(isinstance(i, str) and IMAGE_NAME.fullmatch(i) for i in images):
        raise _bad(path, f"rule {rule_id}: `images` is a list of image repositories (owner/name)")
    never = entry.get("never", [])
    try:
        for version in [entry["version"], *(never if isinstance(never, list) else [None])]:
            Version(str(version))
    except (InvalidVersion, TypeError):
        raise _bad(path, f"rule {rule_id}: `version` and `never` must be versions (`never` a list)") from None
    if not isinstance(entry.get("floor", False), bool):
        raise _bad(path, f"rule {rule_id}: `floor` is true or false")
    if "cuda" in entry and not re.fullmatch(r"\d+", str(entry["cuda"])):
        raise _bad(path, f"rule {rule_id}: `cuda` is a CUDA major version such as \"13\"")
    if entry["safety"] == "safe":
        raise _bad(path, f"rule {rule_id}: a pin changes what gets installed, so safety is unsafe or manual")


def _flag_keys(kind: str) -> tuple[str, ...]:
    return {"rename-flag": ("old", "new"), "remove-flag": ("old",),
            "remove-value": ("flag",), "replace-value": ("flag",)}.get(kind, ())


def _build(entry: dict, kind: str, release: str, source: str) -> Rule:
    rule_id = str(entry["id"])
    return Rule(
        id=rule_id, name=str(entry["name"]), kind=kind, release=release,
        safety=str(entry["safety"]), message=str(entry["message"]).strip(),
        before=str(entry["example"]["before"]).rstrip("\n"),
        after=str(entry["example"]["after"]).rstrip("\n"),
        old=_opt_str(entry.get("old")), new=_opt_str(entry.get("new")),
        flag=_opt_str(entry.get("flag")), set_value=_opt_str(entry.get("set_value")),
        value_map=_pairs(entry.get("value_map"), rule_id, source),
        transform=_opt_str(entry.get("transform")),
        ensure=_pairs(entry.get("ensure"), rule_id, source),
        when=_when(entry.get("when"), rule_id, source) if "when" in entry else None,
        env=_opt_str(entry.get("env")), value=_opt_str(entry.get("value")),
        allowed=tuple(str(v) for v in entry.get("allowed") or ()),
        packages=_names(entry.get("packages")), images=tuple(str(i) for i in entry.get("images") or ()),
        version=_opt_str(entry.get("version")), floor=bool(entry.get("floor", False)),
        never=tuple(str(v) for v in entry.get("never") or ()), cuda=_opt_str(entry.get("cuda")),
        source=source,
    )


def canonical_name(name: str) -> str:
    """A distribution name normalised as PEP 503 says (`FlashInfer_Python` -> `flashinfer-python`);
    written here because packaging.utils costs 50 ms of start-up (it imports logging)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(value: Any) -> tuple[str, ...]:
    return tuple(canonical_name(str(v)) for v in value or ())


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _pairs(value: Any, rule_id: str, source: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise _bad(source, f"rule {rule_id}: expected a non-empty mapping of old -> new")
    return tuple((str(k), str(v)) for k, v in value.items())


def _when(value: Any, rule_id: str, source: str) -> When:
    if not isinstance(value, dict) or not value or set(value) - WHEN_KEYS:
        raise _bad(source, f"rule {rule_id}: `when` is a mapping of {', '.join(sorted(WHEN_KEYS))}")
    if "value" in value and "flag" not in value:
        raise _bad(source, f"rule {rule_id}: `when.value` needs `when.flag`")
    return When(flag=_opt_str(value.get("flag")), values=_strings(value.get("value")),
                flags=_strings(value.get("flags")), env=_strings(value.get("env")))


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return (str(value),)


def _check_unique(rules: Iterable[Rule]) -> None:
    seen: dict[str, str] = {}
    for rule in rules:
        for key in (rule.id.lower(), rule.name):
            if key in seen:
                raise _bad(rule.source, f"rule {rule.id}: id or name '{key}' also used in {seen[key]}")
            seen[key] = rule.source


def _bad(path, message: str) -> SglaunchError:
    return SglaunchError(f"invalid migration rules in {path}: {message}",
                         hint="fix the rule file; see docs/migrate-flags.md for the rule format")
