"""Every finding is reported once, at its line in the ORIGINAL file, even when earlier fixes
of the same run inserted lines (env entries, `--moe-a2a-backend deepep`, ...) above it."""

from __future__ import annotations

import pytest

from sglaunch.migrate.engine import migrate_text
from sglaunch.migrate.rules import load_rules

RULES_16 = load_rules().between("0.5.15", "0.5.16")

K8S = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: sglang
spec:
  template:
    spec:
      containers:
      - name: server
        image: lmsysorg/sglang:v0.5.16
        command: ["python3", "-m", "sglang.launch_server"]
        args:
        - --model-path
        - /models/ds
        - --enable-deepep-waterfill   # keep balanced
        - --fp4-gemm-backend=cutlass
        - --speculative-algorithm
        - DSPARK
        - --quantization
        - qoq
        env:
        - name: HF_HOME
          value: /cache
"""

SHELL = """\
#!/bin/bash
export HF_HOME=/cache
python3 -m sglang.launch_server \\
  --model-path /m \\
  --enable-deepep-waterfill \\
  --fp4-gemm-backend cutlass \\
  --quantization qoq \\
  --speculative-algorithm DSPARK
"""

COMPOSE = """\
services:
  sglang:
    image: lmsysorg/sglang:v0.5.16
    environment:
      - HF_HOME=/cache
    command:
      - python3
      - -m
      - sglang.launch_server
      - --enable-deepep-waterfill
      - --fp4-gemm-backend
      - cutlass
      - --quantization
      - qoq
      - --speculative-algorithm
      - DSPARK
"""

COMPOSE_STRING = """\
services:
  sglang:
    image: lmsysorg/sglang:v0.5.16
    command: python3 -m sglang.launch_server --enable-deepep-waterfill --fp4-gemm-backend cutlass
      --quantization qoq --speculative-algorithm DSPARK
"""

DOCKERFILE = """\
FROM lmsysorg/sglang:v0.5.16
ENV HF_HOME=/cache
CMD ["python3", "-m", "sglang.launch_server", \\
     "--enable-deepep-waterfill", \\
     "--fp4-gemm-backend", "cutlass", \\
     "--quantization", "qoq", \\
     "--speculative-algorithm", "DSPARK"]
"""

DOCKERFILE_SHELL = """\
FROM lmsysorg/sglang:v0.5.16
CMD python3 -m sglang.launch_server \\
    --enable-deepep-waterfill \\
    --fp4-gemm-backend cutlass \\
    --quantization qoq \\
    --speculative-algorithm DSPARK
"""

CONFIG = """\
model-path: /m
enable-deepep-waterfill: true
fp4-gemm-backend: cutlass
quantization: qoq
"""

EXPECTED = {
    "k8s": [("R516-01", 15, "fix"), ("R516-03", 16, "unsafe"), ("R516-04", 19, "manual"),
            ("R516-07", 17, "fix")],
    "shell": [("R516-01", 5, "fix"), ("R516-03", 6, "unsafe"), ("R516-04", 7, "manual"),
              ("R516-07", 8, "fix")],
    "compose": [("R516-01", 10, "fix"), ("R516-03", 11, "unsafe"), ("R516-04", 13, "manual"),
                ("R516-07", 15, "fix")],
    "compose_string": [("R516-01", 4, "fix"), ("R516-03", 4, "unsafe"), ("R516-04", 5, "manual"),
                       ("R516-07", 5, "fix")],
    "dockerfile": [("R516-01", 4, "fix"), ("R516-03", 5, "unsafe"), ("R516-04", 6, "manual"),
                   ("R516-07", 7, "fix")],
    "dockerfile_shell": [("R516-01", 3, "fix"), ("R516-03", 4, "unsafe"), ("R516-04", 5, "manual"),
                         ("R516-07", 6, "fix")],
    "config": [("R516-01", 2, "fix"), ("R516-03", 3, "unsafe"), ("R516-04", 4, "manual")],
}
CASES = [("k8s", "k8s", K8S), ("shell", "shell", SHELL), ("compose", "compose", COMPOSE),
         ("compose_string", "compose", COMPOSE_STRING), ("dockerfile", "dockerfile", DOCKERFILE),
         ("dockerfile_shell", "dockerfile", DOCKERFILE_SHELL), ("config", "config", CONFIG)]


def rule_findings(result):
    return sorted((f.rule_id, f.line, f.level) for f in result.findings if f.rule_id.startswith("R"))


@pytest.mark.parametrize("case, fmt, text", CASES, ids=[c[0] for c in CASES])
def test_each_finding_once_with_original_line(case, fmt, text):
    result = migrate_text(text, fmt, RULES_16, "0.5.16")
    assert result.error is None
    assert result.text != text  # the fixes did move lines around
    assert rule_findings(result) == sorted(EXPECTED[case])
    keys = [(f.rule_id, f.token, f.line) for f in result.findings]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("case, fmt, text", CASES, ids=[c[0] for c in CASES])
def test_unsafe_mode_reports_once_too(case, fmt, text):
    result = migrate_text(text, fmt, RULES_16, "0.5.16", unsafe_fixes=True)
    expected = sorted((r, line, "fix" if level == "unsafe" else level) for r, line, level in EXPECTED[case])
    assert rule_findings(result) == expected


def test_revalidation_findings_use_original_lines():
    # --cuda-graph-max-bs is not accepted by 0.5.20 in every spelling: whatever validate says,
    # it must point at a line of the original file that holds the token.
    rules = load_rules().between("0.5.15", "0.5.20")
    result = migrate_text(SHELL, "shell", rules, "0.5.20", unsafe_fixes=True)
    lines = SHELL.splitlines()
    for finding in result.findings:
        if finding.token.startswith("--"):
            assert 1 <= finding.line <= len(lines)
