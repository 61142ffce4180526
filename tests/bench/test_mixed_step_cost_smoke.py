"""benchmarks/mixed_step_cost.py on the CPU, tiny: a decoding batch, arrivals of several prompt
lengths admitted beside it and aborted, every (P, A) point timed, and the fit written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("bench_script_mixed_step_cost",
                                                  ROOT / "benchmarks" / "mixed_step_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mixed_step_cost_times_every_point(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLAUNCH_OVERLAP", "0")  # NOTE: the script sets it too; undone after the test
    script = load()
    out = tmp_path / "mixed.json"
    code = script.main(["--model", str(tiny_model), "--device", "cpu", "--dtype", "float32", "--batch", "3",
                        "--prompt-tokens", "4,12", "--arrivals", "1,2", "--repeats", "2", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    points = {(r["prompt_tokens"], r["arrivals"]) for r in result["rows"]}
    assert points == {(4, 1), (4, 2), (12, 1), (12, 2)}
    for row in result["rows"]:
        assert row["mixed_ms"] > 0 and row["decode_ms"] > 0
        assert abs(row["extra_ms"] - (row["mixed_ms"] - row["decode_ms"])) < 1e-9
    assert set(result["fit"]) == {"fixed_ms", "per_token_us"} and result["fit"]["per_token_us"] is not None


def test_fit_recovers_a_line():
    script = load()
    model = script.fit([(10, 1.0 + 0.5 * 10), (20, 1.0 + 0.5 * 20), (40, 1.0 + 0.5 * 40)])
    assert abs(model["fixed_s"] - 1.0) < 1e-9 and abs(model["per_token_s"] - 0.5) < 1e-9
    assert script.fit([(10, 1.0)]) == {"fixed_s": None, "per_token_s": None}


def test_mixed_step_cost_profiles_a_point(tiny_model, tmp_path, monkeypatch):
    """--profile P,A: the host functions of mixed and decode steps (kernels too on a GPU), with the
    decoding batch still whole at the end (its token budget covers the profiled steps)."""
    monkeypatch.setenv("SGLAUNCH_OVERLAP", "0")
    script = load()
    out = tmp_path / "mixed.json"
    code = script.main(["--model", str(tiny_model), "--device", "cpu", "--dtype", "float32", "--batch", "2",
                        "--prompt-tokens", "4", "--arrivals", "2", "--repeats", "3", "--profile", "6,2",
                        "--top", "5", "--json", str(out)])
    assert code == 0
    profile = json.loads(out.read_text())["profile"]
    assert (profile["prompt_tokens"], profile["arrivals"]) == (6, 2)
    for kind in ("mixed", "decode"):
        assert "engine.py" in profile[kind]["cprofile"] and "step" in profile[kind]["cprofile"]
        assert profile[kind]["device_us_per_step"] == 0 and profile[kind]["top_kernels"] == []  # a CPU


def test_profile_argument_is_checked():
    script = load()
    import pytest

    for bad in ("16", "a,b", "0,1"):
        with pytest.raises(SystemExit):
            script.parse_args(["--model", "m", "--profile", bad])
