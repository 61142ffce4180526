"""benchmarks/http_frontend_ceiling.py on the CPU, tiny: the real server, the real engine-process
loop and ZeroMQ channel, the synthetic token source (benchmarks/http_synthetic_engine.py). It went
stale once unnoticed (the engine-process API it borrows changed under it), so it runs here: every
request streams all its tokens, and the CPU figures it exists for are there."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_script_frontend_ceiling",
                                                  ROOT / "benchmarks" / "http_frontend_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_frontend_ceiling_streams_every_token(tmp_path):
    ceiling = load()
    out = tmp_path / "ceiling.json"
    code = ceiling.main(["--concurrency", "4", "--requests", "8", "--new-tokens", "6", "--repeats", "1",
                         "--step-ms", "1", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    run = result["runs"]["after"][0]
    assert run["tokens"] == 8 * 6 and run["chunks_per_token"] > 0
    assert run["server_cpu_us_per_token"] > 0 and run["client_cpu_us_per_token"] > 0
    assert result["median"]["after"]["tokens"] == 8 * 6


def test_the_synthetic_engine_answers_flush_cache():
    """Session 44 noticed the synthetic engine had no flush_cache: /flush_cache (and `sglaunch bench
    --flush-cache`) against it failed in the engine process."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from types import SimpleNamespace

    from http_synthetic_engine import SyntheticEngine

    engine = SyntheticEngine(0.0, [5, 6, 7], max_running=2, context_length=64)
    assert engine.flush_cache()["flushed"] is True
    engine.add_request(SimpleNamespace(rid="a", input_ids=(1, 2, 3), sampling=SimpleNamespace(max_new_tokens=2)))
    assert engine.flush_cache() == {"flushed": False, "running": 0, "waiting": 1}
    while engine.has_work:
        engine.step()
    assert engine.flush_cache()["flushed"] is True
