"""Rule files: validation on load, schema cross-checks, and a firing/not-firing table per rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglaunch.errors import SglaunchError
from sglaunch.flags.registry import SCHEMA
from sglaunch.migrate.engine import migrate_text
from sglaunch.migrate.evaluate import INFO, MANUAL
from sglaunch.migrate.rules import load_rule_file, load_rules, parse_rule
from sglaunch.releases import KNOWN_RELEASES

RULES = load_rules().rules
FIXABLE = [r for r in RULES if not r.report_only]
REPORTED = [r for r in RULES if r.report_only]


def previous(release: str) -> str:
    return KNOWN_RELEASES[KNOWN_RELEASES.index(release) - 1]


def run(text: str, rule, unsafe: bool = True):
    rules = load_rules().between(previous(rule.release), rule.release)
    return migrate_text(text + "\n", "shell", rules, rule.release, unsafe)


# --------------------------------------------------------------------------- loading


def test_every_release_after_the_oldest_has_a_rule_file():
    releases = {r.release for r in RULES}
    assert releases == set(KNOWN_RELEASES[1:])


def test_ids_and_names_are_unique():
    assert len({r.id for r in RULES}) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)


@pytest.mark.parametrize("entry, fragment", [
    ({"id": "R516-99", "kind": "rename-flag"}, "missing"),
    ({"id": "R516-99", "name": "x", "kind": "explode", "safety": "safe", "message": "m",
      "example": {"before": "a", "after": "b"}}, "kind must be one of"),
    ({"id": "bad", "name": "x", "kind": "remove-flag", "old": "--x", "safety": "safe", "message": "m",
      "example": {"before": "a", "after": "b"}}, "must look like"),
    ({"id": "R516-99", "name": "x", "kind": "remove-flag", "old": "--x", "safety": "maybe",
      "message": "m", "example": {"before": "a", "after": "b"}}, "safety"),
    ({"id": "R516-99", "name": "x", "kind": "notice", "when": {"flag": "--x"}, "safety": "safe",
      "message": "m", "example": {"before": "a", "after": "b"}}, "must be manual"),
    ({"id": "R516-99", "name": "x", "kind": "remove-flag", "old": "x", "safety": "unsafe",
      "message": "m", "example": {"before": "a", "after": "b"}}, "starting with --"),
    ({"id": "R516-99", "name": "x", "kind": "remove-flag", "old": "--x", "safety": "unsafe",
      "message": "m", "example": {"before": "a"}}, "example"),
    ({"id": "R516-99", "name": "x", "kind": "remove-flag", "old": "--x", "typo": 1, "safety": "unsafe",
      "message": "m", "example": {"before": "a", "after": "b"}}, "unknown typo"),
])
def test_malformed_rules_are_clear_errors(entry, fragment):
    with pytest.raises(SglaunchError) as info:
        parse_rule(entry, "0.5.16", "x.yaml")
    assert fragment in info.value.message


def test_malformed_rule_file_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "0.5.16.yaml"
    bad.write_text("release: 0.5.16\nrules: [\n")
    with pytest.raises(SglaunchError, match="cannot read rule file"):
        load_rule_file(bad)
    bad.write_text('release: "0.5.17"\nrules: []\n')
    with pytest.raises(SglaunchError, match="match the file name"):
        load_rule_file(bad)


def test_duplicate_ids_across_files_are_rejected(tmp_path: Path):
    rule = ('  - {id: R516-01, name: a, kind: remove-flag, old: --x, safety: unsafe, message: m,'
            ' example: {before: a, after: b}}\n')
    (tmp_path / "0.5.16.yaml").write_text('release: "0.5.16"\nrules:\n' + rule)
    (tmp_path / "0.5.17.yaml").write_text('release: "0.5.17"\nrules:\n' + rule)
    load_rules.cache_clear()
    with pytest.raises(SglaunchError, match="also used"):
        load_rules(str(tmp_path))
    load_rules.cache_clear()


# --------------------------------------------------------------------------- schema cross-checks


@pytest.mark.parametrize("rule", [r for r in RULES if r.kind in ("rename-flag", "remove-flag")], ids=lambda r: r.id)
def test_rule_flags_are_known_to_the_schema(rule):
    assert SCHEMA.lookup(rule.old) is not None, f"{rule.id}: old flag {rule.old} unknown to SCHEMA"
    if rule.new:
        new = SCHEMA.lookup(rule.new)
        assert new is not None, f"{rule.id}: new flag {rule.new} unknown to SCHEMA"
        assert new.status_at(rule.release).value in ("active", "deprecated"), rule.id
    for flag, _ in rule.ensure:
        assert SCHEMA.lookup(flag) is not None


@pytest.mark.parametrize("rule", [r for r in RULES if r.flag or r.kind == "rename-env"], ids=lambda r: r.id)
def test_value_and_env_rules_name_known_flags(rule):
    target = rule.flag if rule.flag else rule.new
    if target and target.startswith("--"):
        assert SCHEMA.lookup(target) is not None, f"{rule.id}: {target} unknown to SCHEMA"
    if rule.kind == "replace-value":
        flag = SCHEMA.lookup(rule.flag)
        assert flag.value_status(rule.new, rule.release).value == "active", rule.id


# Coverage of every removal, rename and removed value between releases: test_release_coverage.py


# --------------------------------------------------------------------------- table: every rule


@pytest.mark.parametrize("rule", FIXABLE, ids=lambda r: r.id)
def test_fixable_rule_rewrites_its_example(rule):
    result = run(rule.before, rule)
    assert result.error is None
    assert result.text == rule.after + "\n"
    assert rule.id in {f.rule_id for f in result.findings}
    again = run(result.text.rstrip("\n"), rule)
    assert again.text == result.text, "second run changed the text"
    assert rule.id not in {f.rule_id for f in again.findings if f.level == "fix"}


@pytest.mark.parametrize("rule", [r for r in FIXABLE if r.safety == "unsafe"], ids=lambda r: r.id)
def test_unsafe_rule_needs_unsafe_fixes(rule):
    result = run(rule.before, rule, unsafe=False)
    assert result.text == rule.before + "\n"
    assert [f.level for f in result.findings if f.rule_id == rule.id] == ["unsafe"]


@pytest.mark.parametrize("rule", REPORTED, ids=lambda r: r.id)
def test_reported_rule_flags_its_example_and_changes_nothing(rule):
    result = run(rule.before, rule)
    assert result.text == rule.before + "\n"
    levels = {f.level for f in result.findings if f.rule_id == rule.id}
    assert levels == ({INFO} if rule.kind == "notice" else {MANUAL})


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_does_not_fire_on_mentions_outside_launch_commands(rule):
    text = (f"# {rule.before}\n"
            f"echo \"{rule.before.replace(chr(34), '')}\"\n"
            f"cat <<'EOF'\n{rule.before}\nEOF\n"
            f"python -m sglang.bench_serving {rule.before.split('launch_server', 1)[-1]}\n"
            "python -m sglang.launch_server --model-path /m --tp-size 2")
    result = run(text, rule)
    assert result.text == text + "\n"
    assert not [f for f in result.findings if f.rule_id == rule.id]


def test_rules_outside_the_release_range_do_not_run():
    rules = load_rules().between("0.5.16", "0.5.19")
    assert all(r.release in ("0.5.17", "0.5.18", "0.5.19") for r in rules)
    text = "python -m sglang.launch_server --enable-deepep-waterfill --cuda-graph-max-bs 8\n"
    assert migrate_text(text, "shell", rules, "0.5.19").text == text
