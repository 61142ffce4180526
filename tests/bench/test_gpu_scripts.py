"""The CPU-side logic of the GPU benchmark scripts: argument handling, child command lines,
closed-loop levels, ratios and tables (benchmarks/gpu_decode.py, dspark_sweep.py, gpu_run.sh)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_decode = load("gpu_decode")
sweep = load("dspark_sweep")


# ----------------------------------------------------------------------------- gpu_decode.py


def test_decode_child_argv_round_trips(tmp_path):
    args = gpu_decode.parse_args(["--model", "M", "--out", str(tmp_path), "--batch-sizes", "1,8",
                                  "--disable-cuda-graph", "--attention-backend", "flashinfer",
                                  "--cuda-graph-max-bs", "32", "--repeats", "2"])
    assert args.models == list(gpu_decode.MODELS) and args.batch_list == [1, 8]
    assert gpu_decode.engine_options(args) == {"attention_backend": "flashinfer", "disable_cuda_graph": True,
                                               "cuda_graph_max_bs": 32}
    child = gpu_decode.parse_args(gpu_decode.child_argv(args, "qwen3-1.7b", tmp_path / "r.json")[2:])
    assert child.models == ["qwen3-1.7b"] and child.result_file == tmp_path / "r.json"
    for field in ("model", "batch_sizes", "repeats", "new_tokens", "dtype", "device", "attention_backend",
                  "disable_cuda_graph", "cuda_graph_max_bs", "copy_bytes"):
        assert getattr(child, field) == getattr(args, field), field
    # NOTE: on CUDA the backend defaults to flashinfer (EngineConfig's torch runs eagerly there); on
    # the CPU nothing is passed, so the engine's defaults stay
    assert gpu_decode.engine_options(gpu_decode.parse_args(["--out", "o"])) == {"attention_backend": "flashinfer"}
    assert gpu_decode.engine_options(gpu_decode.parse_args(["--out", "o", "--device", "cpu"])) == {}
    with pytest.raises(SystemExit):
        gpu_decode.parse_args(["--out", "o", "--models", "llama-70b"])


def test_decode_table_shows_rows_errors_and_the_floor():
    row = {"batch": 1, "hf_tok_s": 40.0, "engine_tok_s": 80.0, "ratio": 2.0}
    results = [{"model": "smollm2-135m", "error": "timed out after 80 s"},
               {"model": "qwen3-1.7b", "rows": [row], "weight_bytes": 3.4e9,
                "step": {"median_s": 0.004, "floor_s": 0.0008, "copy_bandwidth_Bps": 4.25e12, "ratio_to_floor": 5.0}}]
    lines = gpu_decode.table_lines(results)
    assert "ERROR timed out" in lines[1]
    assert lines[2].split()[:5] == ["qwen3-1.7b", "1", "40.0", "80.0", "2.00x"]
    assert "4.00 ms" in lines[3] and "0.800 ms" in lines[3] and "5.0x the floor" in lines[3]


# ----------------------------------------------------------------------------- dspark_sweep.py


def sweep_args(tmp_path, *extra: str):
    return sweep.parse_args(["--model", "M", "--drafter", "D", "--prompts", "p.jsonl", "--out", str(tmp_path), *extra])


def test_sweep_levels_default_and_explicit(tmp_path):
    assert sweep_args(tmp_path).levels == [(1, 4), (4, 8), (16, 32), (64, 64), (256, 256)]
    assert sweep_args(tmp_path, "--concurrency", "2,8", "--requests", "3,20").levels == [(2, 3), (8, 20)]
    with pytest.raises(SystemExit):
        sweep_args(tmp_path, "--concurrency", "2,8", "--requests", "3")
    with pytest.raises(SystemExit):
        sweep_args(tmp_path, "--modes", "static,eager")


def test_sweep_configurations_flags_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "cap-accept")  # the caller's value never leaks in
    args = sweep_args(tmp_path, "--serve-args=--disable-cuda-graph --attention-backend torch")
    assert sweep.configurations(args) == [("plain", None), ("dspark-static", "static"), ("dspark-compact", "compact")]
    tokens, env = sweep.serve_tokens(args, None)
    assert "--speculative-algorithm" not in tokens and "SGLANG_RAGGED_VERIFY_MODE" not in env
    assert tokens[tokens.index("--max-running-requests") + 1] == "256"
    assert tokens[-3:] == ["--disable-cuda-graph", "--attention-backend", "torch"]
    tokens, env = sweep.serve_tokens(args, "compact")
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    assert tokens[tokens.index("--speculative-draft-model-path") + 1] == "D"
    child = sweep.parse_args(sweep.child_argv(args, "dspark-compact", 123.0, tmp_path / "r.json")[2:])
    assert child.config == "dspark-compact" and child.deadline == 123.0 and child.levels == args.levels
    assert child.serve_args == args.serve_args and child.ignore_eos


def test_sweep_ratios_and_table():
    results = [
        {"config": "plain", "mode": None, "levels": [
            {"concurrency": 1, "requests": 4, "output_tok_s": 100.0},
            {"concurrency": 4, "requests": 8, "skipped": "time budget"}]},
        {"config": "dspark-static", "mode": "static", "levels": [
            {"concurrency": 1, "requests": 4, "output_tok_s": 150.0, "mean_accept_length": 2.5,
             "verify_tokens_per_step": 8.0, "verify_tokens_per_request_step": 8.0},
            {"concurrency": 4, "requests": 8, "output_tok_s": 300.0, "mean_accept_length": 2.4,
             "verify_tokens_per_step": 32.0, "verify_tokens_per_request_step": 8.0}]},
        {"config": "dspark-compact", "mode": "compact", "error": "RuntimeError: boom"},
    ]
    sweep.add_ratios(results)
    assert results[1]["levels"][0]["ratio_to_plain"] == pytest.approx(1.5)
    assert "ratio_to_plain" not in results[1]["levels"][1]  # no baseline at that level
    lines = sweep.table_lines(results)
    assert "skipped" in lines[2]
    assert lines[3].split()[:7] == ["dspark-static", "1", "4", "150.0", "1.50x", "2.50", "8.0"]
    assert lines[4].split()[4] == "-"
    assert "ERROR RuntimeError: boom" in lines[5]


def test_closed_loop_level_and_decode_step_timing_on_cpu(tiny_model, tmp_path):
    """dspark_sweep's engine (built from serve flags) and closed loop; gpu_decode's step timer
    and copy bandwidth on the same tiny engine (the GPU run covers the transformers side)."""
    from sglaunch.engine.launch import create_engine

    tokens, env = sweep.serve_tokens(sweep_args(tmp_path, "--concurrency", "3", "--serve-args=--device cpu"), None)
    tokens[tokens.index("--model-path") + 1] = str(tiny_model)
    config = sweep.build_config(tokens, env)
    assert config.device == "cpu" and config.speculative is None and config.max_running_requests == 3
    engine, cluster = create_engine(config)
    try:
        row = sweep.run_level(engine, [[5, 6, 7], [8, 9]], concurrency=3, count=7, max_tokens=5, ignore_eos=True,
                              tag="t")
        step = gpu_decode.decode_step_seconds(engine, [5, 6, 7, 8], steps=4)
    finally:
        cluster.stop(engine)
    assert row["finished"] == 7 and row["output_tokens"] == 35 and row["max_in_flight"] == 3
    assert row["output_tok_s"] > 0 and "mean_accept_length" not in row and "bursts" not in row
    assert "drafter_graph_captures" not in row and sweep.drafter_graphs(engine) is None  # no drafter
    assert step["steps"] == 4 and 0 < step["min_s"] <= step["median_s"] <= step["p90_s"]
    assert gpu_decode.copy_bandwidth("cpu", nbytes=1 << 20, repeats=3) > 0


# ----------------------------------------------------------------------------- gpu_run.sh


def test_gpu_run_script_parses_and_wants_four_arguments():
    script = ROOT / "benchmarks/gpu_run.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr
