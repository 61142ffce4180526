"""Comments, including trailing ones, survive every rewrite in every format."""

from __future__ import annotations

import pytest

from sglaunch.migrate.engine import migrate_text
from sglaunch.migrate.rules import load_rules

RULES_16 = load_rules().between("0.5.15", "0.5.16")
RULES_20 = load_rules().between("0.5.15", "0.5.20")

K8S_HEAD = ("apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: x\n"
            "    command: [python3, -m, sglang.launch_server]\n")

CASES = [
    # SGLang --config: a key rename that adds an entry keeps the trailing comment
    ("config-rename-ensure", "config", RULES_16,
     "model-path: /m\nenable-deepep-waterfill: true   # old name\ntp-size: 8\n",
     "model-path: /m\nenable-waterfill: true   # old name\nmoe-a2a-backend: deepep\ntp-size: 8\n"),
    ("config-set-value", "config", RULES_20,
     "disable-piecewise-cuda-graph: true  # no piecewise\n",
     "cuda-graph-backend-prefill: disabled  # no piecewise\n"),
    ("config-value-map", "config", RULES_20,
     "nsa-prefill-cp-mode: in-seq-split   # split mode\n",
     "cp-strategy: zigzag   # split mode\n"),
    ("config-removed-key", "config", RULES_20,
     "model-path: /m\nprefill-round-robin-balance: true  # balance PD prefill\ntp-size: 8\n",
     "model-path: /m\n# balance PD prefill\ntp-size: 8\n"),
    ("config-list-comments", "config", RULES_16,
     "enable-deepep-waterfill: true # a\n# full-line comment\nfp4-gemm-backend: cutlass  # b\n",
     "enable-waterfill: true # a\nmoe-a2a-backend: deepep\n# full-line comment\nfp4-gemm-backend: auto  # b\n"),
    # Kubernetes / compose block list items
    ("k8s-ensure", "k8s", RULES_16,
     K8S_HEAD + "    args:\n    - --enable-deepep-waterfill   # keep balanced\n    - --tp=8  # eight\n",
     K8S_HEAD + "    args:\n    - --enable-waterfill   # keep balanced\n    - --moe-a2a-backend\n"
     "    - deepep\n    - --tp=8  # eight\n"),
    ("k8s-set-value", "k8s", RULES_20,
     K8S_HEAD + "    args:\n    - --disable-piecewise-cuda-graph  # off\n    - --tp=8  # eight\n",
     K8S_HEAD + "    args:\n    - --cuda-graph-backend-prefill  # off\n    - disabled\n    - --tp=8  # eight\n"),
    ("k8s-remove", "k8s", RULES_20,
     K8S_HEAD + "    args:\n    - --prefill-round-robin-balance  # rr\n    - --tp=8  # eight\n",
     K8S_HEAD + "    args:\n    # rr\n    - --tp=8  # eight\n"),
    ("k8s-flow-multiline", "k8s", RULES_20,
     K8S_HEAD.replace("sglang.launch_server]", "sglang.launch_server,\n"
                      "      --prefill-round-robin-balance,  # rr\n      --tp, '8']"),
     K8S_HEAD.replace("sglang.launch_server]", "sglang.launch_server,\n"
                      "      # rr\n      --tp, '8']")),
    # shell: trailing comments and comments inside arrays
    ("shell-trailing", "shell", RULES_16,
     "sglang serve --enable-deepep-waterfill   # old name\n",
     "sglang serve --enable-waterfill --moe-a2a-backend deepep   # old name\n"),
    ("shell-array", "shell", RULES_20,
     "ARGS=(\n  --model-path /m   # model\n  --prefill-round-robin-balance  # rr\n"
     "  --cuda-graph-max-bs 8  # graphs\n)\nsglang serve \"${ARGS[@]}\"\n",
     "ARGS=(\n  --model-path /m   # model\n  # rr\n"
     "  --cuda-graph-max-bs-decode 8  # graphs\n)\nsglang serve \"${ARGS[@]}\"\n"),
    ("shell-remove-trailing", "shell", RULES_20,
     "sglang serve --model-path /m --prefill-round-robin-balance  # rr\n",
     "sglang serve --model-path /m  # rr\n"),
    # compose: command strings
    ("compose-string", "compose", RULES_16,
     "services:\n  s:\n    command: sglang serve --enable-deepep-waterfill  # old name\n",
     "services:\n  s:\n    command: sglang serve --enable-waterfill --moe-a2a-backend deepep  # old name\n"),
    ("compose-list", "compose", RULES_16,
     "services:\n  s:\n    command:\n      - sglang\n      - serve\n      - --enable-deepep-waterfill # old\n",
     "services:\n  s:\n    command:\n      - sglang\n      - serve\n      - --enable-waterfill # old\n"
     "      - --moe-a2a-backend\n      - deepep\n"),
    # Dockerfile: comment lines inside a continued instruction, comments before it
    ("dockerfile-shell-comment-lines", "dockerfile", RULES_16,
     "FROM x\n# launch\nCMD python3 -m sglang.launch_server \\\n# the old switch\n"
     "    --enable-deepep-waterfill \\\n    --tp 8\n",
     "FROM x\n# launch\nCMD python3 -m sglang.launch_server \\\n# the old switch\n"
     "    --enable-waterfill --moe-a2a-backend deepep \\\n    --tp 8\n"),
    ("dockerfile-exec-comment-lines", "dockerfile", RULES_16,
     'FROM x\nCMD ["python3", "-m", "sglang.launch_server", \\\n# old switch\n'
     '     "--enable-deepep-waterfill"]\n',
     'FROM x\nCMD ["python3", "-m", "sglang.launch_server", \\\n# old switch\n'
     '     "--enable-waterfill", "--moe-a2a-backend", "deepep"]\n'),
]


@pytest.mark.parametrize("name, fmt, rules, before, after", CASES, ids=[c[0] for c in CASES])
def test_comments_survive(name, fmt, rules, before, after):
    to = "0.5.16" if rules is RULES_16 else "0.5.20"
    result = migrate_text(before, fmt, rules, to, unsafe_fixes=True)
    assert result.error is None, result.error
    assert result.text == after
    assert migrate_text(result.text, fmt, rules, to, unsafe_fixes=True).text == after
