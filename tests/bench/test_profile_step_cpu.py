"""benchmarks/profile_step.py on the CPU: plain and DSpark steps of a small random model, with
per-phase times, operator counts, host timelines and the report's tables; --force-aside and
--no-context-write."""

from __future__ import annotations

import gzip
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


def profile_small_model(tmp_path: Path, tag: str, options: list[str], drafter: bool = True) -> tuple[int, Path]:
    """Build tp_scaling's small random target (and drafter), run profile_step.main on it with
    `options` on the CPU in float32 -> (exit code, the JSON it wrote). Torch's thread count is
    restored afterwards."""
    import torch

    tps = load(f"bench_script_tp_scaling_{tag}", "tp_scaling.py")
    profile_step = load(f"bench_script_profile_step_{tag}", "profile_step.py")
    threads = torch.get_num_threads()
    try:
        args = tps.parse_args(["--out", str(tmp_path / "o"), "--model-dir", str(tmp_path / "m"), "--shape", "small",
                               "--device", "cpu", "--dtype", "float32"] + ([] if drafter else ["--dspark", "off"]))
        tps.build_models(args)
        out = tmp_path / "profile.json"
        model = ["--model", str(tmp_path / "m" / "target")]
        if drafter:
            model += ["--drafter", str(tmp_path / "m" / "drafter")]
        code = profile_step.main(model + ["--device", "cpu", "--dtype", "float32", *options, "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    return code, out


def test_profile_step_reports_phases_for_plain_and_dspark(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    code, out = profile_small_model(tmp_path, "phases", ["--modes", "static", "--steps", "3", "--warmup", "3",
                                                         "--prompt-len", "8", "--top", "5"])
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
    for r in results.values():
        check_timeline(r["host_timeline"], steps=3)
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("dspark-static ") and "(" in line for line in lines)  # the main table's row
    assert lines[-1].startswith("dspark-static - plain: step ")


def check_timeline(timeline: dict, steps: int) -> None:
    """host_timeline: every category there, non-negative, adding up to at most the step."""
    assert timeline["steps"] == steps and timeline["step_ms"] > 0 and timeline["pipelined_ms"] > 0
    parts = [k for k in timeline if k.endswith("_ms") and k not in ("step_ms", "pipelined_ms", "wait_ms", "remainder_ms")]
    assert set(parts) == {f"{k}_ms" for k in ("wait_readback", "wait_inputs", "wait_tolist", "graph_replay",
                                              "graph_inputs", "forward_other", "readback_launch", "greedy_host",
                                              "decide", "schedule", "build_step_input", "resolve", "propose",
                                              "accept")}
    assert all(timeline[k] >= 0 for k in parts + ["wait_ms", "remainder_ms"])
    assert timeline["forward_other_ms"] > 0 and timeline["schedule_ms"] > 0  # a CPU forward runs eagerly
    total = sum(timeline[k] for k in parts) + timeline["remainder_ms"]
    assert sum(timeline[k] for k in parts) <= timeline["step_ms"] + 1e-3
    assert abs(total - timeline["step_ms"]) < 2e-3  # rounding of 4 decimals per figure


def test_profile_step_forced_aside_with_and_without_the_context_write(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sglaunch.speculative.draft_runner import DraftRunner

    profile_step = load("bench_script_profile_step_aside_refusal", "profile_step.py")
    monkeypatch.delenv("SGLAUNCH_OVERLAP", raising=False)
    with pytest.raises(SystemExit):  # the drafter would have no context: only with --force-aside
        profile_step.main(["--model", str(tmp_path), "--no-context-write"])
    write_context, replay = DraftRunner.write_context, torch.cuda.CUDAGraph.replay
    # static: the real planner never steps aside, so every aside step here is the forced one
    code, out = profile_small_model(tmp_path, "aside", [
        "--modes", "static", "--overlap", "1", "--force-aside", "--no-context-write", "--concurrency", "2",
        "--steps", "3", "--warmup", "2", "--prompt-len", "8", "--top", "2"])
    assert code == 0
    # every patch undone: the context write, graph replay, Tensor.tolist
    assert DraftRunner.write_context is write_context and torch.cuda.CUDAGraph.replay is replay
    assert "tolist" not in vars(torch.Tensor)
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == ["plain+overlap", "dspark-static-aside+overlap", "dspark-static-aside-nowrite+overlap"]
    aside, nowrite = results["dspark-static-aside+overlap"], results["dspark-static-aside-nowrite+overlap"]
    for r in (aside, nowrite):
        assert r["overlap"] and r["force_aside"]
        assert r["step_kinds"]["aside_steps"] == 3 and r["step_kinds"]["drafted_steps"] == 0
        spec = r["spec"]["speculative"]
        assert spec["steps"] == 0 and spec["step_aside_steps"] > 0 and spec["step_aside_fraction"] == 1.0
        assert r["host_timeline"]["decide_ms"] > 0 and r["host_timeline"]["propose_ms"] == 0
    assert aside["context_write"] is True and nowrite["context_write"] is False
    assert results["plain+overlap"]["context_write"] is None
    # without the draft-context write the target forward dispatches fewer operators (the plain ones)
    target_ops = {name: r["phases"]["target forward"]["ops"] for name, r in results.items()}
    assert target_ops["dspark-static-aside-nowrite+overlap"] < target_ops["dspark-static-aside+overlap"]
    assert target_ops["dspark-static-aside-nowrite+overlap"] <= target_ops["plain+overlap"] + 5
    for r in results.values():
        check_timeline(r["host_timeline"], steps=3)
        assert r["host_timeline"]["resolve_ms"] > 0 and r["host_timeline"]["readback_launch_ms"] > 0  # pipelined
    lines = capsys.readouterr().out.strip().splitlines()
    timeline_rows = [line for line in lines if line.split(" ")[0] in results and len(line.split()) == 18]
    assert [row.split()[0] for row in timeline_rows] == list(results)
    assert any(line.startswith("dspark-static-aside+overlap: stepped-aside step ") for line in lines)
    assert lines[-1].startswith("dspark-static-aside-nowrite+overlap - plain+overlap: step ")


def test_profile_step_compares_overlap_off_and_on_in_one_run(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.delenv("SGLAUNCH_OVERLAP", raising=False)
    code, out = profile_small_model(tmp_path, "overlap", ["--overlap", "both", "--concurrency", "2", "--steps", "3",
                                                          "--warmup", "3", "--prompt-len", "8", "--top", "3",
                                                          "--trace", str(tmp_path / "traces")], drafter=False)
    assert code == 0
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert {name: r["overlap"] for name, r in results.items()} == {"plain": False, "plain+overlap": True}
    # a CPU run has no device activity to find gaps in, nor CUDA calls to wait on
    assert all(r["device_gaps"] is None and r["host_waits"] == {} for r in results.values())
    # --trace: each configuration's profiled pass as a Chrome trace, gzipped
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert traces == ["plain+overlap.json.gz", "plain.json.gz"]
    trace = json.loads(gzip.decompress((tmp_path / "traces" / "plain.json.gz").read_bytes()))
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert all(r["pipelined_step_ms"] > 0 for r in results.values())
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("overlap on / off (same run)")
    assert "SGLAUNCH_OVERLAP" not in __import__("os").environ


def test_profile_step_at_a_temperature_profiles_the_sampled_phases(tmp_path):
    """--temperature: sampled requests (a seed each), so the DSpark step draws uniforms and accepts
    against the target's probabilities; a greedy run never computes those."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    runs = {}
    for temperature, top_p in (("0", "1"), ("0.7", "1"), ("0.7", "0.9")):
        tag = f"temp{temperature}p{top_p}"
        code, out = profile_small_model(tmp_path / tag, tag, [
            "--modes", "static", "--steps", "3", "--warmup", "2", "--prompt-len", "8", "--top", "2",
            "--concurrency", "2", "--temperature", temperature, "--top-p", top_p])
        assert code == 0
        runs[temperature, top_p] = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    sampled, greedy = runs["0.7", "1"]["dspark-static"]["phases"], runs["0", "1"]["dspark-static"]["phases"]
    for phase in ("uniforms (in propose)", "target probs (in accept)"):
        assert sampled[phase]["ms"] > 0 and sampled[phase]["ops"] > 0, phase
    assert "target probs (in accept)" not in greedy
    # --top-p 0.9: the target's rows go through the sorted filter, more operators than softmax alone
    filtered = runs["0.7", "0.9"]["dspark-static"]["phases"]["target probs (in accept)"]
    assert filtered["ops"] > sampled["target probs (in accept)"]["ops"]
    assert runs["0.7", "1"]["dspark-static"]["spec"]["speculative"]["steps"] > 0


def test_device_gaps_counts_idle_time_outside_every_kernel():
    """profile_step.device_gaps: the union of overlapping kernels is busy once; gaps at the window's
    ends count; only gaps of threshold_us or more count as long; kernels outside the window are clipped."""
    profile_step = load("bench_script_profile_step_gaps", "profile_step.py")
    kernels = [(-50.0, 10.0), (10.0, 30.0), (20.0, 40.0), (45.0, 60.0), (100.0, 150.0), (190.0, 260.0)]
    g = profile_step.device_gaps(kernels, (0.0, 200.0), steps=2, threshold_us=20.0)
    # busy: 0-40, 45-60, 100-150, 190-200 = 40 + 15 + 50 + 10 = 115 us; idle 85 us: gaps 5, 40, 40
    assert g["window_ms_per_step"] == 0.1 and g["busy_ms_per_step"] == 0.0575 and g["idle_ms_per_step"] == 0.0425
    assert g["idle_in_long_gaps_ms_per_step"] == 0.04 and g["long_gaps_per_step"] == 1.0
    assert g["longest_gaps_us"] == [40.0, 40.0]
    idle = profile_step.device_gaps([], (0.0, 100.0), steps=1)
    assert idle["idle_ms_per_step"] == 0.1 and idle["longest_gaps_us"] == [100.0]


def test_process_cpu_names_a_thread_that_burns_cpu_beside_the_steps():
    """ProcessCpu: a thread spinning while the 'steps' run shows up as other threads' CPU time and
    first among the busiest threads (by its thread id); the stepping thread's own time stays its own."""
    import threading
    import time

    profile_step = load("bench_script_profile_step_cpu", "profile_step.py")
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    quiet = profile_step.ProcessCpu()
    time.sleep(0.3)
    calm = quiet.per_step(10)
    spinner = threading.Thread(target=spin, name="spinner", daemon=True)
    busy = profile_step.ProcessCpu()
    spinner.start()
    try:
        time.sleep(0.5)
        hot = busy.per_step(10)  # NOTE: while it still runs: only live threads are listed
    finally:
        stop.set()
        spinner.join()
    assert calm["other_threads_cpu_ms"] < 5 and calm["stepping_thread_cpu_ms"] < 5  # 300 ms asleep: ~0 per step
    # the spinner held (most of) a core for 0.5 s: about 50 ms a 'step' of ten (the GIL shares it with nobody)
    assert hot["other_threads_cpu_ms"] > 20 and hot["stepping_thread_cpu_ms"] < 5
    assert hot["busiest_threads"][0]["tid"] == spinner.native_id and hot["busiest_threads"][0]["cpu_ms"] > 10
    assert hot["wall_ms"] >= 50 and hot["threads"] >= 1


def test_profile_step_dspark_first_and_intra_op_threads(tmp_path, monkeypatch):
    """--dspark-first measures the DSpark configuration before plain; --intra-op-threads N sets torch's
    thread count after each engine is built; every result carries the CPU-time split."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n)))
    code, out = profile_small_model(tmp_path, "order", ["--modes", "static", "--steps", "2", "--warmup", "1",
                                                        "--prompt-len", "8", "--top", "2", "--dspark-first",
                                                        "--intra-op-threads", "1"])
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [r["config"] for r in results] == ["dspark-static", "plain"]
    assert calls.count(1) >= 2  # once after each engine (the engines' own set-up may call it too)
    for r in results:
        c = r["cpu"]
        # NOTE: the two clocks are read one after the other: equal within their reads' own time
        assert c["wall_ms"] > 0 and c["process_cpu_ms"] >= c["stepping_thread_cpu_ms"] - 0.01 > 0
        assert abs(c["other_threads_cpu_ms"] - (c["process_cpu_ms"] - c["stepping_thread_cpu_ms"])) < 1e-3


def test_cuda_state_host_cost_on_a_cpu_measures_the_base_rounds(tmp_path):
    """benchmarks/cuda_state_host_cost.py on the CPU: no graphs or device memory to add, so only the
    two base rounds, each with a positive step time and its ratio to their mean (which brackets 1)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    tps = load("bench_script_tp_scaling_state", "tp_scaling.py")
    script = load("bench_script_cuda_state", "cuda_state_host_cost.py")
    threads = torch.get_num_threads()
    try:
        args = tps.parse_args(["--out", str(tmp_path / "o"), "--model-dir", str(tmp_path / "m"), "--shape", "small",
                               "--device", "cpu", "--dtype", "float32", "--dspark", "off"])
        tps.build_models(args)
        out = tmp_path / "state.json"
        code = script.main(["--model", str(tmp_path / "m" / "target"), "--device", "cpu", "--dtype", "float32",
                            "--concurrency", "2", "--warmup", "2", "--steps", "3", "--prompt-len", "8",
                            "--max-tokens", "4", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["round"] for r in rounds] == ["base", "base again"]
    assert all(r["median_ms"] > 0 and r["mean_ms"] > 0 for r in rounds)
    ratios = sorted(r["over_base"] for r in rounds)
    assert ratios[0] <= 1.0 <= ratios[1] and abs(sum(ratios) / 2 - 1.0) < 1e-3
