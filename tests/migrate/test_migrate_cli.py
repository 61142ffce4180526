"""`sglaunch migrate-flags` and `sglaunch rules` through Typer's runner and a real subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglaunch.cli.app import app
from sglaunch.migrate import files

OLD = "#!/bin/bash\npython -m sglang.launch_server --model-path /m --enable-deepep-waterfill\n"
NEW = "#!/bin/bash\npython -m sglang.launch_server --model-path /m --enable-waterfill --moe-a2a-backend deepep\n"
CLEAN = "#!/bin/bash\npython -m sglang.launch_server --model-path /m\n"


def invoke(*args, input=None):
    return CliRunner().invoke(app, list(args), input=input)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "serve.sh"
    path.write_text(OLD)
    path.chmod(0o750)
    return path


def test_default_mode_prints_diff_and_writes_nothing(script):
    result = invoke("migrate-flags", str(script))
    assert result.exit_code == 1
    assert "R516-01" in result.output and "+python -m sglang.launch_server" in result.output
    assert script.read_text() == OLD


def test_check_mode_exits_1_without_diff(script):
    result = invoke("migrate-flags", "--check", str(script))
    assert result.exit_code == 1 and "+++" not in result.output
    assert script.read_text() == OLD


def test_write_mode_rewrites_atomically_and_keeps_permissions(script):
    result = invoke("migrate-flags", "--write", str(script))
    assert result.exit_code == 1
    assert script.read_text() == NEW
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert [p.name for p in script.parent.iterdir()] == ["serve.sh"]  # no temp file left
    again = invoke("migrate-flags", "--check", str(script))
    assert again.exit_code == 0


def test_clean_file_exits_0(tmp_path):
    path = tmp_path / "ok.sh"
    path.write_text(CLEAN)
    assert invoke("migrate-flags", "--check", str(path)).exit_code == 0


def test_json_output(script):
    result = invoke("migrate-flags", "--json", str(script))
    data = json.loads(result.output)
    assert data["exit_code"] == 1 and data["to"] == "0.5.16" and data["mode"] == "diff"
    finding = data["files"][0]["findings"][0]
    assert finding["rule"] == "R516-01" and finding["line"] == 2 and finding["level"] == "fix"


def test_directories_are_walked_and_bad_files_do_not_stop_others(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.sh").write_text(OLD)
    (tmp_path / "broken.yaml").write_text("services: [\n")
    (tmp_path / "notes.txt").write_text("python -m sglang.launch_server --enable-deepep-waterfill\n")
    (tmp_path / "blob.sh").write_bytes(b"\x00\x01binary")
    result = invoke("migrate-flags", "--write", "--json", str(tmp_path))
    data = json.loads(result.output)
    by_name = {Path(f["path"]).name: f for f in data["files"]}
    assert result.exit_code == 2  # the broken YAML is unreadable input
    assert by_name["broken.yaml"]["error"]
    assert (tmp_path / "sub" / "a.sh").read_text() == NEW
    assert "notes.txt" not in by_name and "blob.sh" not in by_name  # not launch files
    assert (tmp_path / "broken.yaml").read_text() == "services: [\n"


def test_binary_and_huge_named_files_are_skipped_with_a_note(tmp_path, monkeypatch):
    blob = tmp_path / "blob.sh"
    blob.write_bytes(b"\x00\x01binary")
    big = tmp_path / "big.sh"
    big.write_text(OLD)
    monkeypatch.setattr(files, "MAX_BYTES", 10)
    result = invoke("migrate-flags", "--json", str(blob), str(big))
    data = json.loads(result.output)
    notes = [f["skipped"] for f in data["files"]]
    assert "binary" in notes[0] and "larger" in notes[1]
    assert result.exit_code == 0


def test_stdin_with_write_prints_migrated_text(tmp_path):
    result = invoke("migrate-flags", "--write", "-", input=OLD)
    assert NEW in result.stdout


def test_usage_errors_exit_2(script):
    assert invoke("migrate-flags", "--check", "--write", str(script)).exit_code == 2
    assert invoke("migrate-flags", "--from", "0.5.16", "--to", "0.5.16", str(script)).exit_code == 2
    assert invoke("migrate-flags", "--to", "9.9.9", str(script)).exit_code == 2
    assert invoke("migrate-flags", str(script.parent / "missing.sh")).exit_code == 2


def test_unsafe_fixes_flag(tmp_path):
    path = tmp_path / "u.sh"
    path.write_text("sglang serve --fp4-gemm-backend cutlass\n")
    invoke("migrate-flags", "--write", str(path))
    assert "cutlass" in path.read_text()
    invoke("migrate-flags", "--write", "--unsafe-fixes", str(path))
    assert path.read_text() == "sglang serve --fp4-gemm-backend auto\n"


def test_to_later_release(tmp_path):
    path = tmp_path / "x.sh"
    path.write_text("sglang serve --cuda-graph-max-bs 8\n")
    assert invoke("migrate-flags", "--check", str(path)).exit_code == 0
    invoke("migrate-flags", "--write", "--to", "0.5.20", str(path))
    assert path.read_text() == "sglang serve --cuda-graph-max-bs-decode 8\n"


def test_failed_write_leaves_the_file(script, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    result = invoke("migrate-flags", "--write", str(script))
    assert result.exit_code == 2
    assert script.read_text() == OLD
    assert [p.name for p in script.parent.iterdir()] == ["serve.sh"]


def test_rules_list_and_explain():
    listed = invoke("rules", "list", "--to", "0.5.16", "--json")
    ids = [r["id"] for r in json.loads(listed.output)]
    assert ids[0] == "R516-01" and all(i.startswith("R516") for i in ids)
    table = invoke("rules", "list")
    assert table.exit_code == 0 and "R520-22" in table.output
    explained = invoke("rules", "explain", "R516-02")
    assert explained.exit_code == 0 and "--unsafe-fixes" in explained.output
    assert invoke("rules", "explain", "rename-enable-deepep-waterfill").exit_code == 0
    missing = invoke("rules", "explain", "R999-01")
    assert missing.exit_code == 2 and "no migration rule" in missing.output


def test_subprocess_module_entry_point(script):
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "sglaunch", "migrate-flags", "--check", str(script)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "R516-01" in done.stdout
    assert "torch" not in subprocess.run(
        [sys.executable, "-c", "import sys, sglaunch.cli.migrate_flags, sglaunch.migrate.engine,"
         " sglaunch.migrate.yamlfmt, sglaunch.migrate.dockerfile; print(sorted(sys.modules))"],
        capture_output=True, text=True, timeout=60).stdout.replace("'", " ").split()


def test_github_annotations_and_sarif(tmp_path):
    path = tmp_path / "serve.sh"
    path.write_text(OLD + "python -m sglang.launch_server --quantization qoq\n")
    result = invoke("migrate-flags", "--check", "--output-format", "github", str(path))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert any(line.startswith(f"::warning file={path},line=2,title=R516-01 fix::") for line in lines)
    assert any(line.startswith(f"::error file={path},line=3,title=R516-04 manual::") for line in lines)
    sarif = json.loads(invoke("migrate-flags", "--check", "--output-format", "sarif", str(path)).output)
    assert sarif["version"] == "2.1.0"
    results = sarif["runs"][0]["results"]
    assert {(r["ruleId"], r["level"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
            for r in results} == {("R516-01", "warning", 2), ("R516-04", "error", 3)}
    assert {"R516-01", "R516-04"} <= {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert invoke("migrate-flags", "--output-format", "xml", str(path)).exit_code == 2


def test_walk_summary_counts_kinds_read_and_skipped(tmp_path):
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "ci.yml").write_text(
        "jobs:\n  a:\n    steps:\n      - run: python -m sglang.launch_server --enable-deepep-waterfill\n")
    (tmp_path / "serve.sh").write_text(OLD)
    (tmp_path / "README.md").write_text("python -m sglang.launch_server --enable-deepep-waterfill\n")
    result = invoke("migrate-flags", "--check", str(tmp_path))
    assert "read: 1 shell, 1 workflow; skipped: 1 not launch files" in " ".join(result.output.split())
    data = json.loads(invoke("migrate-flags", "--check", "--json", str(tmp_path)).output)
    assert data["read"] == {"shell": 1, "workflow": 1} and data["skipped"]["not_launch_files"] == 1


def test_check_fails_on_a_launch_whose_arguments_cannot_be_read(tmp_path):
    """`--tp` with no value: the tool cannot tell what the launch will do on the target release,
    so --check must not pass it (it reported the error and exited 0 before)."""
    script = tmp_path / "serve.sh"
    script.write_text("python -m sglang.launch_server --model-path m --tp\n")
    result = invoke("migrate-flags", "--check", str(script))
    assert result.exit_code == 1, result.output
    assert "cannot read the launch arguments" in result.output
    assert script.read_text() == "python -m sglang.launch_server --model-path m --tp\n"


def test_the_pre_commit_hook_selects_every_file_kind_the_walk_reads():
    import re

    from ruamel.yaml import YAML

    root = Path(__file__).resolve().parents[2]
    hook = YAML(typ="safe").load((root / ".pre-commit-hooks.yaml").read_text())[0]
    pattern = re.compile(hook["files"])
    for name in ("serve.sh", "deploy/k8s.yaml", "Dockerfile.gpu", "Makefile", ".env.prod", "unit.service",
                 "requirements.txt", "requirements-gpu.txt", "constraints.txt", "requirements/serve.txt",
                 "pyproject.toml", "launch.py", "Procfile", "justfile", "sglang.def", "deploy/ecs-task.json"):
        assert pattern.search(name), name
    for name in ("README.md", "notes.txt", "model.safetensors"):
        assert not pattern.search(name), name
