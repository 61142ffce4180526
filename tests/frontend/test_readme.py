"""The README's Quickstart keeps exactly two command lines, and CI runs the second one."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_quickstart_has_two_command_lines():
    commands = quickstart_commands()
    assert len(commands) == 2, commands
    assert commands[0].startswith("pip install") and "sglaunch" in commands[0]
    assert "pytest" in commands[1] and "torch==2.13.0" in commands[1]


def test_ci_runs_the_readme_test_command():
    script = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert "test-command" in script
    extract = script.split('test_command="$(', 1)[1].split(')"\n', 1)[0]
    got = subprocess.run(["bash", "-c", extract], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    assert got == quickstart_commands()[1]
