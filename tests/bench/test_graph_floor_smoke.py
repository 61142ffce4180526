"""benchmarks/graph_floor.py on the CPU: the plain-PyTorch reference computes the same model as
the engine (same safetensors tensors, greedy tokens and verify logits), and the JSON and table
carry every figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("bench_script_graph_floor", ROOT / "benchmarks" / "graph_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape, attention", [("tiny", "matmul"), ("tiny-llama", "sdpa")])
def test_graph_floor_reference_matches_engine_on_cpu(tmp_path, capsys, shape, attention):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    graph_floor = load()
    threads = torch.get_num_threads()
    try:
        code = graph_floor.main(["--out", str(tmp_path), "--device", "cpu", "--shape", shape, "--context", "40",
                                 "--attention", attention, "--iters", "5", "--warmup", "2", "--engine-steps", "6",
                                 "--verify-iters", "3", "--time-budget", "60"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    result = json.loads((tmp_path / "graph_floor.json").read_text())
    assert result["errors"] == [] and result["dtype"] == "float32" and result["context"] == 40
    for row in ("floor", "eager_graph", "engine"):
        for kind in ("decode", "verify"):
            assert result[row][kind]["median_s"] > 0, (row, kind)
    assert result["eager_graph"]["decode"]["one_cuda_graph"] is False  # no CUDA graphs on the CPU
    assert result["engine"]["verify"]["graph"] is False and "hand-built StepInput" in result["engine"]["verify"]["how"]
    check = result["check"]
    # the reference computes the same model: same greedy tokens, same verify logits (float32)
    assert len(check["reference_tokens"]) == graph_floor.CHECK_TOKENS
    assert check["engine_tokens"] == check["reference_tokens"] and check["greedy_tokens_equal"]
    assert all(check["verify_argmax_equal"]) and len(check["verify_argmax_equal"]) == graph_floor.VERIFY_TOKENS
    assert check["verify_max_abs_logit_diff"] < 1e-4 * max(1.0, check["verify_logit_scale"])
    assert all(result["eager_graph"]["verify"]["argmax_equal_eager"])
    table = capsys.readouterr().out.strip().splitlines()
    assert table == result["table"] and table[1].split()[:3] == ["step", "floor", "ms"]
    assert table[2].startswith("decode") and table[3].startswith("verify")
