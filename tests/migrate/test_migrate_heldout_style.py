"""Robustness on messy, real-world-shaped launch files (tests/migrate/fixtures/heldout_style/).

For every file: no crash, a sensible exit code, the expected findings (each once), bytes
outside the launch commands byte-identical, `--write` then a second run changes nothing, and
the rewritten commands re-validate against the target release.
"""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglaunch.cli.app import app
from sglaunch.cli.migrate_flags import exit_code
from sglaunch.migrate.deps import deps_scan
from sglaunch.migrate.engine import read_sites
from sglaunch.migrate.tokens import line_of
from sglaunch.migrate.files import _TO_PUA, process_file, write_atomic
from sglaunch.migrate.rules import load_rules

DIR = Path(__file__).parent / "fixtures" / "heldout_style"
FILES = sorted(p.name for p in DIR.iterdir())
RULES = load_rules().between("0.5.15", "0.5.20")
TO = "0.5.20"

# fixture -> (format, rule ids that must be reported, rule ids that must not be)
EXPECT = {
    "Dockerfile.split": ("dockerfile", {"R516-01", "R516-03", "R516-07"}, set()),
    "compose_folded.yml": ("compose", {"R516-01", "R516-03", "R516-07"}, set()),
    "crlf_compose.yaml": ("compose", {"R516-01", "R516-07"}, set()),
    "crlf_launch.sh": ("shell", {"R516-01", "R516-07"}, set()),
    "docker_run.sh": ("shell", {"R516-04", "R516-07"}, {"R516-01"}),
    "heredoc_launch.sh": ("shell", {"R516-01"}, {"R516-03", "R516-04"}),
    "inferencex_array.sh": ("shell", {"R516-03", "R520-01", "R519-04"}, set()),
    "k8s_sh_c.yaml": ("k8s", {"R516-01"}, {"R516-07"}),
    "latin1.sh": ("shell", {"R516-01"}, set()),
    "numactl_torchrun.sh": ("shell", {"R516-06", "R516-08", "R516-02", "R516-10"}, set()),
    "pd_decode.sh": ("shell", {"R520-02", "R520-15", "R520-19", "R520-20"}, set()),
    "sglang_config.yaml": ("config", {"R516-01", "R516-03", "R516-10", "R520-02"}, set()),
    "sglang_serve_eq.sh": ("shell", {"R516-01", "R516-03", "R520-01"}, {"R516-04"}),
    "slurm_multinode.slurm": ("shell", {"R516-01", "R516-02"}, set()),
    "statefulset.yaml": ("k8s", {"R516-01", "R516-07"}, set()),
    "tabs_no_newline.sh": ("shell", {"R516-01", "R516-04"}, set()),
    "values.yaml": ("yaml", set(), {"R516-01"}),
}


def test_every_fixture_has_expectations():
    assert sorted(EXPECT) == FILES
    assert len(FILES) >= 12


def launch_lines(text: str, fmt: str) -> set[int]:
    """Lines that hold a launch command's tokens, a package pin or an image reference (the only
    lines a rewrite may touch)."""
    text = text.translate(_TO_PUA).replace("\r\n", "\n")
    sites, _ = read_sites(text, fmt)
    lines = set()
    for site in sites:
        lines.add(site.line)
        lines.update(ref.line for ref in site.refs)
    lines.update(line_of(text, ref.offset) for ref in deps_scan(text, fmt, ("lmsysorg/sglang",)))
    return lines


def changed_original_lines(before: str, after: str) -> set[int]:
    a, b = before.splitlines(), after.splitlines()  # line endings are checked separately
    changed = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            changed.update(range(i1 + 1, i2 + 1))
    return changed


@pytest.mark.parametrize("name", FILES)
def test_heldout_style_file(name, tmp_path):
    fmt, must, must_not = EXPECT[name]
    path = tmp_path / name
    shutil.copyfile(DIR / name, path)
    original_bytes = path.read_bytes()

    report = process_file(str(path), True, RULES, TO, unsafe_fixes=True)
    assert report is not None and report.error is None, report and report.error
    assert report.fmt == fmt
    ids = {f.rule_id for f in report.findings}
    assert must <= ids, f"missing {must - ids}"
    assert not (must_not & ids)
    keys = [(f.rule_id, f.token, f.line) for f in report.findings]
    assert len(keys) == len(set(keys)), "a finding was reported twice"
    lines = original_bytes.count(b"\n") + 1
    assert all(0 <= f.line <= lines for f in report.findings)
    assert exit_code([report]) == (1 if must or report.changed else 0)

    # only the lines of launch commands change; everything else is byte-identical
    outside = changed_original_lines(report.original, report.migrated) - launch_lines(report.original, fmt)
    assert not outside, f"lines outside launch commands changed: {sorted(outside)}"
    if b"\r\n" in original_bytes:
        assert report.migrated.count("\n") == report.migrated.count("\r\n")
    if not original_bytes.endswith(b"\n"):
        assert not report.migrated.endswith("\n")

    # --write, then a second run changes nothing and the rewritten commands re-validate
    if report.changed:
        write_atomic(str(path), report.migrated)
        written = path.read_bytes()
        assert written.decode("utf-8", "surrogateescape") == report.migrated
    again = process_file(str(path), True, RULES, TO, unsafe_fixes=True)
    assert again.error is None and not again.changed
    assert not [f for f in again.findings if f.level in ("fix", "error")]
    manual = {f.token for f in report.findings if f.level in ("manual", "info")}
    for finding in again.findings:
        if finding.rule_id == "validate":
            assert finding.token in manual, finding.message


def test_cli_over_the_folder_write_then_check_is_stable(tmp_path):
    folder = tmp_path / "files"
    shutil.copytree(DIR, folder)
    runner = CliRunner()
    first = runner.invoke(app, ["migrate-flags", "--to", TO, "--unsafe-fixes", "--write", str(folder)])
    assert first.exit_code == 1, first.output
    second = runner.invoke(app, ["migrate-flags", "--to", TO, "--unsafe-fixes", "--json", str(folder)])
    data = json.loads(second.stdout)
    assert data["exit_code"] in (0, 1)
    assert not [f["path"] for f in data["files"] if f["changed"] or f["error"]]
    assert not [f for file in data["files"] for f in file["findings"] if f["level"] in ("fix", "error")]


VARIANTS = {
    "crlf": lambda data: data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"),
    "no-final-newline": lambda data: data.rstrip(b"\r\n"),
    "bom": lambda data: b"\xef\xbb\xbf" + data,
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", FILES)
def test_heldout_style_variants(name, variant, tmp_path):
    """The same file with other line endings, without its final newline or with a BOM reads
    the same, keeps that shape, and is idempotent."""
    fmt, _, _ = EXPECT[name]
    reference = process_file(str(DIR / name), True, RULES, TO, unsafe_fixes=True)
    path = tmp_path / name
    data = VARIANTS[variant]((DIR / name).read_bytes())
    path.write_bytes(data)
    report = process_file(str(path), True, RULES, TO, unsafe_fixes=True)
    assert report.error is None, report.error
    assert sorted((f.rule_id, f.line) for f in report.findings) == \
        sorted((f.rule_id, f.line) for f in reference.findings)
    migrated = report.migrated
    if variant == "crlf":
        assert migrated.count("\n") == migrated.count("\r\n")
    if variant == "no-final-newline":
        assert not migrated.endswith("\n")
    if variant == "bom":
        assert migrated.startswith("\ufeff")
    outside = changed_original_lines(report.original, migrated) - \
        launch_lines(report.original.lstrip("\ufeff"), fmt)
    assert not outside
    write_atomic(str(path), migrated)
    assert not process_file(str(path), True, RULES, TO, unsafe_fixes=True).changed
