"""CI's short run of benchmarks/soak.py: mixed requests, disconnects and hostile bodies against a
real server; no error, no hang, the engine idle afterwards and greedy output unchanged."""

from __future__ import annotations

import importlib.util
import json
import sys

from .conftest import REPO_ROOT


def test_a_short_soak_leaves_the_server_as_it_found_it(tmp_path, tiny_llama):
    spec = importlib.util.spec_from_file_location("soak", REPO_ROOT / "benchmarks" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = soak  # NOTE: its dataclasses look their module up there
    spec.loader.exec_module(soak)
    out = tmp_path / "soak.json"
    exit_code = soak.main(["--requests", "240", "--concurrency", "32", "--disconnect", "0.3",
                           "--model-path", str(tiny_llama), "--json", str(out)])
    result = json.loads(out.read_text())
    assert exit_code == 0, result
    assert result["errors"] == 0 and result["hangs"] == 0, result["error_samples"]
    assert result["completed"] + result["disconnected"] + result["refused_as_expected"] == 240
    assert result["disconnected"] > 0 and result["refused_as_expected"] > 0
    assert result["idle"] and result["kv_used_tokens"] == 0  # every cached page evictable again
    assert result["greedy_unchanged"] and result["exit_code_after_sigterm"] == 0
