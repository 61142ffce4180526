"""benchmarks/profile_step.py on the CPU: plain and DSpark steps of a small random model, with
per-phase times, operator counts and the report's table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_step_reports_phases_for_plain_and_dspark(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    tps = load("bench_script_tp_scaling_for_profile", "tp_scaling.py")
    profile_step = load("bench_script_profile_step", "profile_step.py")
    threads = torch.get_num_threads()
    try:
        args = tps.parse_args(["--out", str(tmp_path / "o"), "--model-dir", str(tmp_path / "m"), "--shape", "small",
                               "--device", "cpu", "--dtype", "float32"])
        tps.build_models(args)
        out = tmp_path / "profile.json"
        code = profile_step.main(["--model", str(tmp_path / "m" / "target"), "--drafter", str(tmp_path / "m" / "drafter"),
                                  "--device", "cpu", "--dtype", "float32", "--modes", "static", "--steps", "3",
                                  "--warmup", "3", "--prompt-len", "8", "--top", "5", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"plain", "dspark-static"}
    plain, dspark = results["plain"]["phases"], results["dspark-static"]["phases"]
    assert plain["target forward"]["ops"] > 0 and "draft forward" not in plain
    for phase in ("draft forward", "sample_block", "propose (rest)", "target forward", "accept"):
        assert dspark[phase]["ms"] > 0 and dspark[phase]["ops"] > 0, phase
    # the parts add up to (at most) the whole step
    parts = sum(dspark[p]["ops"] for p in ("propose (all)", "target forward", "accept"))
    assert parts <= dspark["step"]["ops"]
    assert results["dspark-static"]["spec"]["speculative"]["steps"] > 0
    # steps by kind (static mode never steps aside); a CPU engine has no drafter graphs
    kinds = results["dspark-static"]["step_kinds"]
    assert kinds["drafted_steps"] == 3 and kinds["aside_steps"] == 0 and kinds["drafted_step_ms_median"] > 0
    assert results["plain"]["step_kinds"] == {} and results["dspark-static"]["drafter_graphs"] is None
    assert dspark["plan (step aside?)"]["ms"] > 0
    assert len(results["plain"]["top_ops"]) == 5 and "cumulative" in results["plain"]["cprofile"]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("dspark-static")


def test_profile_step_compares_overlap_off_and_on_in_one_run(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    tps = load("bench_script_tp_scaling_for_overlap", "tp_scaling.py")
    profile_step = load("bench_script_profile_step_overlap", "profile_step.py")
    monkeypatch.delenv("SGLAUNCH_OVERLAP", raising=False)
    threads = torch.get_num_threads()
    try:
        args = tps.parse_args(["--out", str(tmp_path / "o"), "--model-dir", str(tmp_path / "m"), "--shape", "small",
                               "--device", "cpu", "--dtype", "float32", "--dspark", "off"])
        tps.build_models(args)
        out = tmp_path / "profile.json"
        code = profile_step.main(["--model", str(tmp_path / "m" / "target"), "--device", "cpu", "--dtype", "float32",
                                  "--overlap", "both", "--concurrency", "2", "--steps", "3", "--warmup", "3",
                                  "--prompt-len", "8", "--top", "3", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert {name: r["overlap"] for name, r in results.items()} == {"plain": False, "plain+overlap": True}
    assert all(r["pipelined_step_ms"] > 0 for r in results.values())
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("overlap on / off (same run)")
    assert "SGLAUNCH_OVERLAP" not in __import__("os").environ
