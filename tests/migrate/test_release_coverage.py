"""Every change between consecutive SGLang releases (read from their wheels' data) is handled by a
migration rule of that release, or recorded in the release file's `accounted:` list with the
reason no rule is needed. A new release's data that removes, renames or drops a choice fails here
until `migrations/<release>.yaml` says what to do."""

from __future__ import annotations

import pytest

from sglaunch.flags.release_diff import diff_releases, load_release_data
from sglaunch.flags.registry import SCHEMA
from sglaunch.migrate.rules import load_rules
from sglaunch.releases import KNOWN_RELEASES, release_key

RULESET = load_rules()
PAIRS = list(zip(KNOWN_RELEASES, KNOWN_RELEASES[1:]))


def _changes():
    """(release, flag, value or None, what happened) for each change that needs handling."""
    out = []
    for old, new in PAIRS:
        diff = diff_releases(load_release_data(old), load_release_data(new))
        for name in diff.removed_flags:
            out.append((new, name, None, "removed"))
        for name in diff.removed_aliases:
            out.append((new, name, None, "spelling removed"))
        for dep in diff.newly_deprecated:
            if dep.error:
                out.append((new, dep.flag, None, "refused (deprecated action that errors)"))
            elif dep.replaced_by and not dep.flag.startswith("--no-"):
                out.append((new, dep.flag, None, f"deprecated for {dep.replaced_by}"))
        for name, values in diff.removed_choices.items():
            for value in values:
                out.append((new, name, str(value), "choice removed"))
    return out


CHANGES = _changes()


def _handled(release: str, flag: str, value: str | None) -> bool:
    for rule in RULESET.rules:
        if rule.release != release:
            continue
        if value is None and rule.kind in ("rename-flag", "remove-flag") and rule.old == flag:
            return True
        if value is not None and rule.kind in ("replace-value", "remove-value") and \
                rule.flag == flag and rule.old == value:
            return True
    return any(a.release == release and a.flag == flag and a.value == value for a in RULESET.accounted)


def test_the_releases_do_change_things():
    """The table below is not empty by accident: the data shows the changes we know of."""
    assert ("0.5.16", "--enable-deepep-waterfill", None, "removed") in CHANGES
    assert ("0.5.16", "--quantization", "qoq", "choice removed") in CHANGES
    assert ("0.5.20", "--cuda-graph-max-bs", None, "removed") in CHANGES
    assert len(CHANGES) > 40


@pytest.mark.parametrize("release, flag, value, what", CHANGES,
                         ids=[f"{r}{f}{'=' + v if v else ''}" for r, f, v, _ in CHANGES])
def test_every_change_between_releases_has_a_rule_or_a_reason(release, flag, value, what):
    assert _handled(release, flag, value), (
        f"SGLang {release}: {flag}{' ' + value if value else ''} {what}, but migrations/{release}.yaml "
        "has no rule for it and no `accounted:` entry saying why none is needed")


def test_accounted_entries_name_real_changes():
    """An `accounted:` entry for something that did not change is a stale note."""
    real = {(r, f, v) for r, f, v, _ in CHANGES}
    for entry in RULESET.accounted:
        assert (entry.release, entry.flag, entry.value) in real, entry


@pytest.mark.parametrize("rule", [r for r in RULESET.rules if r.kind == "rename-flag"], ids=lambda r: r.id)
def test_a_rename_writes_what_the_release_says_replaces_it(rule):
    flag = SCHEMA.lookup(rule.old)
    assert flag is not None, rule.old
    if flag.replaced_by and not flag.replaced_by.startswith("{"):
        assert rule.new == flag.replaced_by, (rule.id, rule.new, flag.replaced_by)


def test_every_release_has_a_pin_rule_for_itself():
    """`sglang` at the target: each release's file pins sglang (and its image tag) at that release,
    so a new release without one fails here; the CUDA 13 fact holds from 0.5.20 on."""
    pins = {r.release: r for r in RULESET.rules if r.kind == "pin" and "sglang" in r.packages}
    assert sorted(pins) == sorted(KNOWN_RELEASES[1:])
    for release, rule in pins.items():
        assert rule.version == release, rule.id
        assert "lmsysorg/sglang" in rule.images, rule.id
        assert (rule.cuda == "13") == (release_key(release) >= release_key("0.5.20")), rule.id
