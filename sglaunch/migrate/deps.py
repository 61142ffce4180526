"""Package pins and SGLang images: what the target release needs installed.

`pin` rules (migrations/<release>.yaml) say which version of a package a release needs
(`sglang` at the release itself, FlashInfer 0.6.14 from 0.5.16 on) and which image
repositories carry the release in their tag (`lmsysorg/sglang:v0.5.16`), with the CUDA major
version of the release's images. `depreaders` finds the places that install or name them
(requirements and constraints files, pyproject.toml, `pip install` / `uv pip install` lines
wherever shell is run, Dockerfile `FROM`/`ARG`/`RUN`, YAML `image:` values and Helm
`repository` + `tag` pairs, Python literals, tags of SGLang's git repository); this module
turns the rules into findings and byte-exact text edits of the version or tag alone, read
through a variable the file sets once (`ARG SGLANG_VERSION=0.5.15`) where one is used.

Requirements and version specifiers are parsed with `packaging` (PEP 508 / PEP 440); a pin is
checked by asking its specifier whether it contains the version the release needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from sglaunch.migrate.kinds import FIX, INFO, MANUAL, UNSAFE
from sglaunch.migrate.rules import Rule, canonical_name
from sglaunch.migrate.tokens import TextEdit, apply_edits, drop_overlaps, line_of

Mapper = Callable[[TextEdit], "TextEdit | None"]
DEPENDENCY_FORMATS = ("requirements", "pyproject", "setupcfg", "pipfile", "lockfile")
REQUIREMENT, IMAGE, TAG, INDEX, POETRY = "requirement", "image", "tag", "index", "poetry"
GITREF = "gitref"  # a git tag or branch of SGLang's repository (`git clone -b v0.5.15`, `git+...@v0.5.15`)
SGL_GIT = re.compile(r"github\.com[/:]sgl-project/sglang(?:\.git)?@([^#\s&'\"]+)")
SCRIPT = "script"  # a file this one runs or includes (`./serve.sh`, `-r base.txt`): no rule, only followed;
# its `where` is the format to read it in ("" when its name tells)
CUDA_INDEX = re.compile(r"(?<![A-Za-z0-9])cu(\d{2,3})(?![0-9])")
DYNAMIC = re.compile(r"\$|\ue000|\{\{|\{%")  # shell/make variables, masked template directives


@dataclass
class Ref:
    """One place that installs a package or names an image, as its decoded text."""

    kind: str  # REQUIREMENT (`sglang[all]==0.5.15`), IMAGE (`lmsysorg/sglang:v0.5.15`), TAG (Helm `tag:`),
    # POETRY (`sglang = "^0.5.15"`), GITREF (`git clone -b v0.5.15`), INDEX (`-i .../cu126`), SCRIPT
    value: str
    mapper: Mapper | None  # edit in `value` coordinates -> edit of the file (None: not editable)
    offset: int  # where the value starts in the file (for its line)
    where: str  # what holds it, for messages: `pip install`, `requirements file`, `FROM`, ...
    repository: str = ""  # TAG: the repository next to it
    hashed: bool = False  # a requirements line with `--hash`: a new version needs new hashes
    line: int = 0
    also: tuple = ()  # more mappers that get the same edit (a variable assigned the same value twice)
    shown: str = ""  # the text as written, when a template's masking changed `value`
    helm: bool = False  # in a Helm template: a `{{ }}` tag comes from the chart's values
    lock: str = ""  # a lock file's entry: the command that regenerates the lock (never rewritten)

    @property
    def display(self) -> str:
        return (self.shown or self.value).strip()


@dataclass
class DepResult:
    text: str
    findings: list = field(default_factory=list)
    error: str | None = None
    refs: int = 0  # places that name a package or image the rules know
    scripts: tuple[tuple[str, str], ...] = ()  # (path as written, format or "") of the files this one runs or
    # includes (read too: files.follow)


class DepsUnreadable(Exception):
    pass


# --------------------------------------------------------------------------- the pass


def migrate_deps(text: str, fmt: str, rules: Sequence[Rule], to_release: str, unsafe_fixes: bool) -> DepResult:
    """Findings and edits of the `pin` rules on one file's text; edits applied and re-checked."""
    pins = [r for r in rules if r.kind == "pin"]
    if not pins:
        return DepResult(text)
    known = _Known(_with_earlier(pins, to_release), to_release, unsafe_fixes)
    variables: dict = {}
    try:
        refs = deps_scan(text, fmt, known.repositories, variables)
    except DepsUnreadable as exc:
        from sglaunch.migrate.evaluate import ERROR, Finding

        return DepResult(text, [Finding("parse", ERROR, 1, f"cannot parse as {fmt}: {exc}")], error=str(exc))
    scripts = tuple(dict.fromkeys((r.value, r.where) for r in refs if r.kind == SCRIPT))
    planned = []  # (finding, the edits it proposes or None, ref index, new value)
    for index, ref in enumerate(refs):
        ref.line = line_of(text, ref.offset)
        through = resolved(ref, variables, text) if DYNAMIC.search(ref.value) else None
        if through is not None:  # `sglang==${V}` with `V=0.5.15` set once in the file: check and fix V
            ref, index = through, -1 - index
        for finding, new_value in known.check(ref):
            made = _edit(ref, new_value) if finding.level in (FIX, UNSAFE) else None
            if finding.level in (FIX, UNSAFE) and made is None:
                finding = _downgraded(finding, ref)
            planned.append((finding, made, index, new_value))
    findings, edits, expected = [], [], {}
    for finding, made, index, new_value in _without_conflicts(planned):
        if made is not None and finding.level == FIX:
            edits.extend(e for e in made if e not in edits)
            expected[index] = new_value
        findings.append(finding)
    counted = sum(1 for ref in refs if known.rule_for(ref) is not None)
    if not edits:
        return DepResult(text, findings, refs=counted, scripts=scripts)
    updated = apply_edits(text, edits)
    problem = _verify(updated, fmt, refs, expected, known.repositories)
    if problem:
        from sglaunch.migrate.evaluate import ERROR, Finding

        kept = [f if f.level != FIX else _downgraded(f, None) for f in findings]
        return DepResult(text, kept + [Finding("engine", ERROR, 1, f"pins left unchanged: {problem}")],
                         error=problem, refs=counted, scripts=scripts)
    return DepResult(updated, findings, refs=counted, scripts=scripts)


def _with_earlier(pins: Sequence[Rule], to_release: str) -> list[Rule]:
    """What `to_release` needs installed does not depend on `--from`: the pin rules of earlier
    releases (FlashInfer's, from 0.5.16) count too, unless a later one of the range replaces them."""
    from sglaunch.migrate.rules import load_rules
    from sglaunch.releases import release_key

    shipped = [r for r in load_rules().rules if r.kind == "pin" and release_key(r.release) <= release_key(to_release)]
    merged = {r.id: r for r in [*shipped, *pins]}
    return sorted(merged.values(), key=lambda r: release_key(r.release))


def _without_conflicts(planned):
    """Proposals whose edits overlap others that differ (one variable, two different needs:
    `V=0.5.15` used as `sglang==$V` and `flashinfer-python==$V`) become manual, all of them."""
    clashing = set()
    for k, (_, made, _, _) in enumerate(planned):
        for j, (_, other, _, _) in enumerate(planned[:k]):
            if made and other and drop_overlaps([*other, *made])[1]:
                clashing.update((k, j))
    why = "one variable holds versions that need different fixes here; change it by hand. "
    return [(_downgraded(f, None, why), None, i, v) if k in clashing else (f, m, i, v)
            for k, (f, m, i, v) in enumerate(planned)]


def _edit(ref: Ref, new_value: str) -> list[TextEdit] | None:
    """The smallest edit that turns `ref.value` into `new_value` (common prefix and suffix kept)."""
    if ref.mapper is None or "\n" in new_value:
        return None
    old = ref.value
    start = 0
    while start < min(len(old), len(new_value)) and old[start] == new_value[start]:
        start += 1
    end_old, end_new = len(old), len(new_value)
    while end_old > start and end_new > start and old[end_old - 1] == new_value[end_new - 1]:
        end_old, end_new = end_old - 1, end_new - 1
    if "\n" in old[start:end_old]:
        return None
    made = [m(TextEdit(start, end_old, new_value[start:end_new])) for m in (ref.mapper, *ref.also)]
    return None if any(e is None for e in made) else made


VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def resolved(ref: Ref, variables: dict, text: str) -> Ref | None:
    """`ref` read through the one variable it uses (`sglang==${SGLANG_VERSION}`, `v${TAG}-cu129`)
    when the file gives that variable one literal value (`ARG SGLANG_VERSION=0.5.15`, a shell
    assignment): edits land in the assignment(s); None when that cannot be told."""
    uses = list(VARIABLE.finditer(ref.value))
    if len(uses) != 1:
        return None
    use = uses[0]
    name = use.group(1) or use.group(2)
    rest = ref.value[:use.start()] + ref.value[use.end():]
    defined = variables.get(name, [])
    if DYNAMIC.search(rest) or not defined or len({d.value for d in defined}) != 1:
        return None
    value = defined[0].value
    low, high = use.start(), use.start() + len(value)

    def through(mapper):
        def moved(edit: TextEdit) -> TextEdit | None:
            if mapper is None or edit.start < low or edit.end > high:
                return None
            return mapper(TextEdit(edit.start - low, edit.end - low, edit.text))
        return moved

    lines = ", ".join(str(line_of(text, d.offset)) for d in defined)
    return replace(ref, value=ref.value[:low] + value + ref.value[use.end():], mapper=through(defined[0].mapper),
                   also=tuple(through(d.mapper) for d in defined[1:]), shown="",
                   where=f"{ref.where}; {name}={value} set on line{'s' if len(defined) > 1 else ''} {lines}")


def _verify(updated: str, fmt: str, before: list[Ref], expected: dict[int, str], repositories) -> str:
    try:
        after = deps_scan(updated, fmt, repositories)
    except DepsUnreadable as exc:
        return f"the rewrite would not parse any more ({exc})"
    if len(after) != len(before):
        return f"the rewrite changed the number of pins and images ({len(before)} -> {len(after)})"
    for index, (old, new) in enumerate(zip(before, after)):
        want = expected.get(index, old.value)
        if new.value != want:
            return f"line {line_of(updated, new.offset)}: the rewrite reads back as {new.value!r}"
    return ""


def _downgraded(finding, ref: Ref | None, why: str = ""):
    from sglaunch.migrate.evaluate import Finding

    why = why or "this spot cannot be rewritten safely (quoting, escapes or a continued line); change it by hand. "
    return Finding(finding.rule_id, MANUAL, finding.line, why + finding.message, (), finding.rule, finding.token)


# --------------------------------------------------------------------------- the checks


class _Known:
    """The pin rules of the range: for each package and image repository, the newest one
    (a later release's rule supersedes an earlier one for the same package)."""

    def __init__(self, pins: Sequence[Rule], to_release: str, unsafe_fixes: bool):
        self.to_release = to_release
        self.unsafe_fixes = unsafe_fixes
        self.by_package: dict[str, Rule] = {}
        self.by_image: dict[str, Rule] = {}
        for rule in pins:  # oldest first: later ones overwrite
            for name in rule.packages:
                self.by_package[canonical_name(name)] = rule
            for image in rule.images:
                self.by_image[image] = rule
        self.canonical = canonical_name
        self.repositories = tuple(self.by_image)

    def rule_for(self, ref: Ref) -> Rule | None:
        if ref.kind == SCRIPT:
            return None
        if ref.kind in (INDEX, GITREF):  # a CUDA wheel index; SGLang's own repository
            return self.by_package.get("sglang")
        if ref.kind == POETRY:
            return self.by_package.get(self.canonical(ref.repository))
        if ref.kind == REQUIREMENT:
            name = requirement_name(ref.value)
            return self.by_package.get(self.canonical(name)) if name else None
        repository = ref.repository if ref.kind == TAG else (parse_image(ref.value, self.by_image) or {}).get("repo")
        return self.by_image.get(repository or "")

    def check(self, ref: Ref):
        rule = self.rule_for(ref)
        if rule is None:
            return []
        if ref.kind == INDEX:
            found = check_index(ref, rule)
        elif ref.kind == POETRY:
            found = check_poetry(ref, rule, self.to_release)
        elif ref.kind == GITREF:
            found = check_gitref(ref, rule)
        elif ref.kind == REQUIREMENT:
            found = check_requirement(ref, rule, self.to_release)
        else:
            found = check_image(ref, rule, self.by_image)
        return [(replace(f, level=FIX) if f.level == UNSAFE and self.unsafe_fixes else f, new) for f, new in found]


def _finding(rule: Rule, ref: Ref, level: str, detail: str, token: str | None = None):
    from sglaunch.migrate.evaluate import Finding

    return Finding(rule.id, level, ref.line, f"{detail} {rule.message}", (), rule, token or ref.display)


def _fix_level(rule: Rule) -> str:
    """UNSAFE (FIX with --unsafe-fixes): a new pin or tag changes what gets installed."""
    return MANUAL if rule.safety == "manual" else UNSAFE


NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*")


def requirement_name(value: str) -> str | None:
    """The distribution a requirement, wheel file or `name @ url` installs (None: not one)."""
    wheel = _wheel(value)
    if wheel is not None:
        return wheel[0]
    egg = re.search(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)", value)
    if egg and "://" in value:
        return egg.group(1)
    match = NAME.match(value)
    if match is None or "/" in value[:match.end()] or match.end() == 0:
        return None
    rest = value[match.end():]
    if rest and not re.match(r"[<>=!~(;@]", rest):
        return None
    return match.group(1)


def _wheel(value: str) -> tuple[str, str] | None:
    base = value.rsplit("/", 1)[-1].split("#", 1)[0].split("?", 1)[0]
    if not base.endswith(".whl"):
        return None
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _, _ = parse_wheel_filename(base)
    except InvalidWheelFilename:
        return None
    return str(name), str(version)


def spec_span(value: str) -> tuple[object, tuple[int, int] | None] | None:
    """(Requirement, (start, end) of its version specifier inside `value`) — an empty span at
    the insertion point when unpinned, None as the span when it cannot be located exactly;
    None when `value` is no PEP 508 requirement."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        requirement = Requirement(value)
    except InvalidRequirement:
        return None
    match = NAME.match(value)
    if match is None or requirement.url:
        return requirement, None
    start = match.end()
    end = value.find(";", start)
    end = len(value) if end < 0 else end
    while end > start and value[end - 1] in " \t":
        end -= 1
    written = value[start:end]
    if written.startswith("(") and written.endswith(")"):
        start, end = start + 1, end - 1
        written = value[start:end]
    try:
        if SpecifierSet(written.strip()) != requirement.specifier:
            return requirement, None
    except InvalidSpecifier:
        return requirement, None
    return requirement, (start, end)


def _contains(specifier, version) -> bool:
    return specifier.contains(version, prereleases=True)


def _admits_release(specifier, target) -> bool:
    """The specifier allows `target` or a post release / local build of it (`==0.5.16.post1`)."""
    from packaging.version import InvalidVersion, Version

    if _contains(specifier, target):
        return True
    for spec in specifier:
        if spec.operator in ("==", "===") and not spec.version.endswith(".*"):
            try:
                pinned = Version(spec.version)
            except InvalidVersion:
                continue
            if pinned.release == target.release and pinned.pre is None and pinned.dev is None and \
                    _contains(specifier, pinned):
                return True
    return False


def _admits_floor(specifier, floor, never) -> bool:
    """Some version at or above `floor`, not in `never`, satisfies the specifier: tried on the
    floor itself, every version the specifier names and the next releases after each."""
    from packaging.version import InvalidVersion, Version

    candidates = [floor]
    for spec in specifier:
        try:
            named = Version(spec.version.rstrip(".*").rstrip("."))
        except InvalidVersion:
            continue
        major, minor, micro = (list(named.release) + [0, 0, 0])[:3]
        candidates += [named, Version(f"{major}.{minor}.{micro + 1}"), Version(f"{major}.{minor}.{micro + 2}"),
                       Version(f"{major}.{minor + 1}.0"), Version(f"{major + 1}.0.0")]
    return any(c >= floor and c not in never and _contains(specifier, c) for c in candidates)


def check_requirement(ref: Ref, rule: Rule, to_release: str):
    """[(finding, new value)] for one requirement of a rule's package."""
    unknown = _unknown_version(ref, rule, to_release)
    if unknown is not None:
        return unknown
    parsed = spec_span(ref.value)
    if parsed is None:
        return []  # not a requirement after all (a path, an option value)
    requirement, span = parsed
    problem = _pin_problem(requirement.specifier, rule, to_release)
    if problem is None:
        return []
    newer = _newer_only(requirement.specifier, rule)
    if newer is not None:
        return _newer(ref, rule, newer, to_release)
    reverted, exact = problem
    pinned, shown = ref.display, rule.packages[0]
    if ref.lock:  # a lock file is regenerated, never edited
        return [(_finding(rule, ref, MANUAL, (
            f"{pinned} ({ref.where}) is locked at a version SGLang {to_release} cannot use (it needs "
            f"{_wanted(rule, to_release)}); a lock file is never rewritten: update the pin in the project's "
            f"manifest and regenerate the lock with `{ref.lock}`.{reverted}"), pinned), None)]
    if not exact:
        return [(_finding(rule, ref, MANUAL, (
            f"{pinned} ({ref.where}) allows no {shown} that SGLang {to_release} can use: it needs {rule.version} "
            f"or newer (SGLang {rule.release} pins {rule.version}; the pin of {to_release} itself is not in the "
            f"data).{reverted}"), pinned), None)]
    if ref.hashed:
        return [(_finding(rule, ref, MANUAL, (
            f"{pinned} ({ref.where}) excludes {rule.version}, which SGLang {to_release} needs, and the line carries "
            f"--hash values: regenerate the lock file (pip-compile, uv pip compile) with {shown}=={rule.version}."
            f"{reverted}"), pinned), None)]
    new_value = _fixed(ref.value, span, rule) if span is not None else None
    level = _fix_level(rule) if new_value is not None else MANUAL
    how = f"the fix writes {new_value.split(';', 1)[0].strip()}" if new_value is not None else \
        f"the specifier cannot be located exactly; write {shown}=={rule.version} by hand"
    return [(_finding(rule, ref, level, (
        f"{pinned} ({ref.where}) excludes {rule.version}, which SGLang {to_release} needs{_why(rule, to_release)}; "
        f"{how}.{reverted}"), pinned), new_value)]


def _unknown_version(ref: Ref, rule: Rule, to_release: str):
    """Findings for a requirement whose version the tool cannot read or rewrite (a variable, a
    URL or VCS install, a wheel file of another version); None when it can be checked."""
    from packaging.version import Version

    if DYNAMIC.search(ref.value):
        return [(_finding(rule, ref, MANUAL, (
            f"{ref.display} ({ref.where}) takes its version from a variable the tool cannot resolve; make sure it "
            f"is {_wanted(rule, to_release)}.")), None)]
    wheel = _wheel(ref.value)
    parsed = None if wheel else spec_span(ref.value)
    if wheel is None and not (parsed is not None and parsed[0].url) and not (parsed is None and "://" in ref.value):
        return None
    if wheel is not None and _pin_problem(_exactly(wheel[1]), rule, to_release) is None:
        return []
    name = requirement_name(ref.value) or ref.value
    version = f" {Version(wheel[1])}" if wheel else ""
    return [(_finding(rule, ref, MANUAL, (
        f"{name}{version} is installed from a file or URL ({ref.where}), which the tool cannot rewrite; make "
        f"sure it is {_wanted(rule, to_release)}.")), None)]


def _exactly(version: str):
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(f"=={version}")


def _pin_problem(specifier, rule: Rule, to_release: str) -> tuple[str, bool] | None:
    """None when `specifier` allows what the target needs; else (a note on reverted versions,
    whether the need is an exact version (else: at least `rule.version`))."""
    from packaging.version import Version

    version = Version(rule.version or "0")
    never = [Version(v) for v in rule.never]
    exact = not rule.floor or to_release == rule.release
    bad = [v for v in never if str(specifier) and _only(specifier, v)]
    if exact and _admits_release(specifier, version) and not bad:
        return None
    if not exact and _admits_floor(specifier, version, never):
        return None
    reverted = f" {', '.join(map(str, bad))} was released and reverted: never install it." if bad else ""
    return reverted, exact


def _newer_only(specifier, rule: Rule) -> str | None:
    """The release a `sglang` pin names when it allows only releases after the target
    (`==0.5.20` with --to 0.5.16): the file targets a newer release, never downgraded."""
    from packaging.version import InvalidVersion, Version

    if rule.floor:
        return None
    target = Version(rule.version or "0")
    candidates = []
    for spec in specifier:
        try:
            named = Version(spec.version.rstrip(".*").rstrip("."))
        except InvalidVersion:
            continue
        major, minor, micro = (list(named.release) + [0, 0, 0])[:3]
        candidates += [named, Version(f"{major}.{minor}.{micro + 1}"), Version(f"{major}.{minor}.{max(micro - 1, 0)}")]
    major, minor, micro = (list(target.release) + [0, 0, 0])[:3]
    candidates += [Version(f"{major}.{minor}.{max(micro - 1, 0)}"), Version(f"{major}.{minor}.{micro + 1}")]
    allowed = sorted(c for c in candidates if _contains(specifier, c))
    if allowed and all(c.release > target.release for c in allowed):
        return ".".join(map(str, allowed[0].release[:3]))
    return None


def _newer(ref: Ref, rule: Rule, newer: str, to_release: str):
    return [(_finding(rule, ref, INFO, (
        f"{ref.display} ({ref.where}) installs SGLang {newer} or later, newer than --to {to_release}: the file "
        f"targets a later release, so check it with --to {newer}; it is not downgraded.")), None)]


def _fixed(value: str, span: tuple[int, int], rule: Rule) -> str:
    """`value` with its specifier replaced by `==version` (and the old `flashinfer` name by
    the rule's first package name)."""
    start, end = span
    new_value = value[:start] + f"=={rule.version}" + value[end:]
    written = NAME.match(value)
    if written and written.group(1) and _canonical(written.group(1)) != rule.packages[0]:
        new_value = new_value[:written.start(1)] + rule.packages[0] + new_value[written.end(1):]
    return new_value


def _canonical(name: str) -> str:
    return canonical_name(name)


def _only(specifier, version) -> bool:
    """The specifier pins exactly `version` (`==0.6.15`)."""
    return all(s.operator in ("==", "===") for s in specifier) and _contains(specifier, version)


def _wanted(rule: Rule, to_release: str) -> str:
    if rule.floor and to_release != rule.release:
        return f"{rule.version} or newer" + (f" (never {', '.join(rule.never)})" if rule.never else "")
    return rule.version or ""


def _why(rule: Rule, to_release: str) -> str:
    return "" if rule.packages[0] == "sglang" else f" (SGLang {rule.release} pins it)"


def check_poetry(ref: Ref, rule: Rule, to_release: str):
    """A Poetry dependency (`sglang = "^0.5.15"`, `{version = "0.5.15", extras = [...]}`): its
    constraint read as PEP 440; the fix writes the bare version (Poetry's exact pin)."""
    specifier = poetry_specifier(ref.value) if ref.mapper is not None or ref.value else None
    name = ref.repository
    if specifier is None:
        what = f"the Poetry constraint \"{ref.display}\"" if ref.value else "a git, path or url source or a list of constraints"
        return [(_finding(rule, ref, MANUAL, (
            f"{name} comes from {what} ({ref.where}), which the tool cannot read; make sure it is "
            f"{_wanted(rule, to_release)}.")), None)]
    problem = _pin_problem(specifier, rule, to_release)
    if problem is None:
        return []
    newer = _newer_only(specifier, rule)
    if newer is not None:
        return _newer(ref, rule, newer, to_release)
    reverted, exact = problem
    if not exact or _canonical(name) != rule.packages[0]:
        how = f"write {rule.packages[0]} = \"{rule.version}\"" if exact else "change it by hand"
        return [(_finding(rule, ref, MANUAL, (
            f"{name} = \"{ref.display}\" ({ref.where}) excludes {_wanted(rule, to_release)}, which SGLang "
            f"{to_release} needs; {how}.{reverted}")), None)]
    return [(_finding(rule, ref, _fix_level(rule), (
        f"{name} = \"{ref.display}\" ({ref.where}) excludes {rule.version}, which SGLang {to_release} needs"
        f"{_why(rule, to_release)}; the fix writes \"{rule.version}\".{reverted}")), rule.version)]


POETRY_PART = re.compile(r"(\^|~=|~|===|==|!=|>=|<=|>|<)?\s*(\*|[0-9][0-9A-Za-z.*+!-]*)")


def poetry_specifier(constraint: str):
    """Poetry's version constraint as a PEP 440 SpecifierSet (None when it cannot be read:
    `||` alternatives, odd syntax)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    text = constraint.strip()
    if "||" in text:
        return None
    parts = []
    rest = text
    for match in POETRY_PART.finditer(text):
        operator, version = match.group(1) or "", match.group(2)
        rest = rest.replace(match.group(0), "", 1)
        if version == "*":
            continue
        if operator in ("^", "~"):
            try:
                release = list(Version(version).release)
            except InvalidVersion:
                return None
            parts += [f">={version}", f"<{_poetry_upper(release, operator)}"]
        else:
            parts.append(f"{operator or '=='}{version}")
    if rest.replace(",", "").strip():
        return None
    try:
        return SpecifierSet(",".join(parts))
    except InvalidSpecifier:
        return None


def _poetry_upper(release: list[int], operator: str) -> str:
    """The exclusive upper bound of `^X` (the first non-zero part bumped) or `~X` (the minor)."""
    written = len(release)
    release = (release + [0, 0, 0])[:max(3, written)]
    if operator == "~":
        index = 1 if written > 1 else 0
    else:
        index = next((k for k, part in enumerate(release[:3]) if part), 2)
    bumped = release[:index] + [release[index] + 1]
    return ".".join(map(str, bumped + [0] * (3 - len(bumped))))


def check_gitref(ref: Ref, rule: Rule):
    """SGLang built from its repository at a tag (`git clone -b v0.5.15`, `sglang @ git+...@v0.5.15`):
    an older release tag is an unsafe fix to `v<target>`; a branch is a moving target (info); a
    commit or a variable is unknown (manual)."""
    from packaging.version import InvalidVersion, Version

    target = rule.version or ""
    if DYNAMIC.search(ref.value):
        return [(_finding(rule, ref, MANUAL, (
            f"SGLang's repository is checked out at {ref.display} ({ref.where}), a variable the tool cannot resolve; "
            f"make sure it is v{target}.")), None)]
    match = TAG_VERSION.fullmatch(ref.value)
    try:
        release = Version(match.group("ver")) if match and not match.group("rest") else None
    except InvalidVersion:
        release = None
    if release is None:
        moving = not re.fullmatch(r"[0-9a-f]{7,40}", ref.value)
        return [(_finding(rule, ref, INFO if moving else MANUAL, (
            f"SGLang's repository is checked out at {ref.display} ({ref.where}), "
            f"{'a branch that moves' if moving else 'a commit of unknown release'}: pin the tag v{target}.")), None)]
    if release.release > Version(target).release:
        return [(_finding(rule, ref, INFO, (
            f"SGLang's repository is checked out at {ref.display} ({ref.where}), newer than --to {target}.")), None)]
    if release.release == Version(target).release:
        return []
    new_value = f"{match.group('v')}{target}"
    return [(_finding(rule, ref, _fix_level(rule), (
        f"SGLang's repository is checked out at {ref.display} ({ref.where}), release {release}, not {target}; "
        f"the fix writes {new_value}.")), new_value)]


def check_index(ref: Ref, rule: Rule):
    """A `--index-url .../cu126` next to an install of SGLang, FlashInfer or torch, when the
    target's wheels are built for another CUDA major version."""
    match = CUDA_INDEX.search(ref.value)
    if not rule.cuda or match is None or _cuda_major("cu" + match.group(1)) == int(rule.cuda):
        return []
    return [(_finding(rule, ref, MANUAL, (
        f"{ref.display} ({ref.where}) is a wheel index for CUDA {_cuda_major('cu' + match.group(1))}, and SGLang "
        f"{rule.version} is built for CUDA {rule.cuda} only: use the CUDA {rule.cuda} index (for example cu130) for "
        "the packages installed here.")), None)]


# --------------------------------------------------------------------------- images


TAG_VERSION = re.compile(r"(?P<v>v?)(?P<ver>\d+\.\d+\.\d+(?:\.?post\d+|rc\d+|\.?dev\d+|[ab]\d+)*)"
                         r"(?P<rest>(?:-[A-Za-z0-9_.]+)*)")
CUDA_VARIANT = re.compile(r"cu(\d+)")


def image_pattern(repositories) -> re.Pattern:
    names = "|".join(re.escape(r) for r in sorted(repositories, key=len, reverse=True))
    return re.compile(r"(?P<prefix>(?:docker://|docker:)?(?:[^\s/@'\"]+/)*?)(?P<repo>" + names +
                      r")(?::(?P<tag>[^\s@'\"/]*))?(?:@(?P<digest>[A-Za-z0-9]+:[0-9a-fA-F]+))?")


def parse_image(value: str, repositories) -> dict | None:
    """{prefix, repo, tag, digest, tag_start} of an image reference to one of `repositories`."""
    if not repositories:
        return None
    match = image_pattern(repositories).fullmatch(value.strip())
    if match is None:
        return None
    lead = len(value) - len(value.lstrip())
    found = match.groupdict()
    found["tag_start"] = lead + match.start("tag") if found["tag"] is not None else None
    return found


def check_image(ref: Ref, rule: Rule, repositories):
    from packaging.version import InvalidVersion, Version

    if ref.kind == TAG:
        tag, shown, tag_start = ref.value, f"{ref.repository}:{ref.display}", 0
    else:
        parsed = parse_image(ref.value, repositories)
        if parsed is None:
            return []
        tag, shown, tag_start = parsed["tag"], ref.display, parsed["tag_start"]
        if parsed["digest"]:
            return [(_finding(rule, ref, MANUAL, (
                f"the image {shown} ({ref.where}) is pinned by digest; the tool cannot tell which SGLang it holds: "
                f"make sure it is {rule.version}.")), None)]
    target = rule.version or ""
    if ref.kind == TAG and tag == "":
        return [(_finding(rule, ref, INFO, (
            f"the image {ref.repository} ({ref.where}) takes its tag from the chart's appVersion, which the tool "
            f"does not read: make sure it is v{target}{_cuda_note(rule)}.")), None)]
    if tag is None or tag == "":
        return [(_finding(rule, ref, INFO, (
            f"the image {shown} ({ref.where}) has no tag (latest): it moves with every release; pin v{target}.")),
            None)]
    if ref.helm and "\ue000" in tag:
        return [(_finding(rule, ref, INFO, (
            f"the image {shown} ({ref.where}) takes its tag from the chart's values, which are checked where they "
            f"are written (values.yaml: `repository` + `tag`).")), None)]
    if DYNAMIC.search(tag):
        return [(_finding(rule, ref, MANUAL, (
            f"the image {shown} ({ref.where}) takes its tag from a variable the tool cannot resolve; make sure it "
            f"is v{target}{_cuda_note(rule)}.")), None)]
    match = TAG_VERSION.fullmatch(tag)
    try:
        release = Version(match.group("ver")) if match else None
    except InvalidVersion:
        release = None
    if match is None or release is None:
        return [(_finding(rule, ref, INFO, (
            f"the image tag {tag} ({ref.where}) names no release (a moving tag); the tool cannot tell which SGLang "
            f"it holds: pin v{target}{_cuda_note(rule)}.")), None)]
    variants = [v for v in match.group("rest").split("-") if v]
    wanted = Version(target)
    cuda_bad = [v for v in variants if _cuda_major(v) is not None and rule.cuda and _cuda_major(v) != int(rule.cuda)]
    if release.release > wanted.release:
        return [(_finding(rule, ref, INFO, (
            f"the image {shown} ({ref.where}) is SGLang {release}, newer than --to {target}: check its flags with "
            f"--to {'.'.join(map(str, release.release))}.")), None)]
    if release.release == wanted.release and not cuda_bad:
        return []
    kept = [v for v in variants if v not in cuda_bad]
    new_tag = f"{match.group('v')}{target}" + "".join(f"-{v}" for v in kept)
    new_value = ref.value[:tag_start] + new_tag + ref.value[tag_start + len(tag):]
    if release.release == wanted.release:
        detail = (f"the image {shown} ({ref.where}) is a CUDA {_cuda_major(cuda_bad[0])} build, and SGLang {target} "
                  f"ships CUDA {rule.cuda} images only; the fix writes {new_tag} (its default image).")
    else:
        cuda = f", and its CUDA {_cuda_major(cuda_bad[0])} build is retired there" if cuda_bad else ""
        detail = (f"the image {shown} ({ref.where}) is SGLang {release}, not {target}{cuda}; the fix writes the "
                  f"tag {new_tag}.")
    return [(_finding(rule, ref, _fix_level(rule), detail, shown), new_value)]


def _cuda_major(variant: str) -> int | None:
    match = CUDA_VARIANT.fullmatch(variant)
    if match is None:
        return None
    digits = match.group(1)
    return int(digits[:2]) if len(digits) >= 3 else int(digits)


def _cuda_note(rule: Rule) -> str:
    return f" (a CUDA {rule.cuda} image)" if rule.cuda else ""


# --------------------------------------------------------------------------- readers


def deps_scan(text: str, fmt: str, repositories: Sequence[str] = (), variables: dict | None = None) -> list[Ref]:
    """Every requirement (of any package: the rules pick theirs) and every reference to one of
    the image `repositories` in `text`, in document order (`variables`: see depreaders.scan)."""
    from sglaunch.migrate import depreaders

    return depreaders.scan(text, fmt, repositories, variables)


LOOSE_PIN = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]\s]*\])?\s*(?:===|==|~=|>=|<=|!=|<|>)\s*"
                       r"[0-9][0-9A-Za-z.*+!-]*(?:\s*,\s*(?:===|==|~=|>=|<=|!=|<|>)\s*[0-9][0-9A-Za-z.*+!-]*)*)")


def loose_pins(text: str, rules: Sequence[Rule], to_release: str, skip_lines: set[int] = frozenset()) -> list:
    """Pins of the rules' packages in a file whose kind the tool does not read (`deps =` of a
    tox.ini, a Nomad or Terraform file's install line): checked, never rewritten (`manual`)."""
    pins = [r for r in rules if r.kind == "pin"]
    if not pins:
        return []
    known = _Known(_with_earlier(pins, to_release), to_release, False)
    out = []
    for match in LOOSE_PIN.finditer(text):
        ref = Ref(REQUIREMENT, match.group(1), None, match.start(1), "a file of a kind the tool does not read")
        ref.line = line_of(text, ref.offset)
        if ref.line in skip_lines:
            continue
        for finding, _ in known.check(ref):
            if finding.level in (FIX, UNSAFE):
                finding = _downgraded(finding, ref, "a pin in a file whose kind the tool does not read; change it by "
                                      "hand. ")
            if finding.level != INFO:
                out.append(finding)
    return out
