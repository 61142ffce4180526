"""`sglaunch serve --speculative-algorithm DSPARK` end to end: the real CLI in a subprocess with
SGLANG_RAGGED_VERIFY_MODE=compact and an SPS table, talked to with the `openai` client; greedy
output equals plain decoding; /metrics and /server_info carry the speculative statistics."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dspark_helpers import steep_sps
from sglaunch.engine.distributed import free_port

openai = pytest.importorskip("openai")
REPO = Path(__file__).resolve().parents[2]


def build_llama_pair(root: Path) -> tuple[Path, Path]:
    """The server tests' tiny Llama (with a real tokenizer) and a random LlamaDSparkModel for it."""
    from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter
    from sglaunch.speculative.drafter_config import parse_drafter_config

    spec = importlib.util.spec_from_file_location("server_checkpoints", REPO / "tests/server/checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build_llama(root / "target")
    target_cfg = json.loads((root / "target/config.json").read_text())
    cfg = parse_drafter_config({**target_cfg, "architectures": ["LlamaDSparkModel"], "num_hidden_layers": 1,
                                "block_size": 4, "mask_token_id": 0, "target_layer_ids": [-1, 0],
                                "num_target_layers": 2, "markov_rank": 8, "enable_confidence_head": True})
    state = init_drafter_state(cfg, seed=3, with_embed=False, with_lm_head=False)
    return root / "target", save_drafter(root / "draft", cfg, state, target_config=target_cfg)


@contextlib.contextmanager
def serve(args: list[str], log: Path):
    env = {**os.environ, "SGLANG_RAGGED_VERIFY_MODE": "compact",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sglaunch", "serve", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(log.read_text(errors="replace"))


def test_serve_dspark_compact_over_http(tmp_path):
    target, drafter = build_llama_pair(tmp_path)
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    args = ["--model-path", str(target), "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path", str(drafter),
            "--speculative-dspark-sps-table-path", str(steep_sps(tmp_path / "sps.json")),
            "--device", "cpu", "--dtype", "float32", "--served-model-name", "tiny", "--port", str(port),
            "--enable-metrics", "--max-total-tokens", "4096"]
    with serve(args, log) as proc:
        wait_healthy(url, proc, log)
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            body = dict(model="tiny", prompt="Hello world! How are", max_tokens=24, temperature=0,
                        extra_body={"ignore_eos": True})
            whole = client.completions.create(**body)
            assert whole.usage.completion_tokens == 24
            streamed = "".join(c.choices[0].text for c in client.completions.create(**body, stream=True)
                               if c.choices)
            assert streamed == whole.choices[0].text
            chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=12, temperature=0.8, seed=5)
            assert chat.choices[0].finish_reason in ("stop", "length")
        prompt = [5, 17, 99, 230, 41, 8]
        reply = httpx.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 20, "temperature": 0, "ignore_eos": True}}, timeout=60).json()
        metrics = httpx.get(f"{url}/metrics").text
        info = httpx.get(f"{url}/server_info").json()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")
    spec = info["internal_states"][0]["speculative"]
    assert spec["mode"] == "compact" and spec["steps"] > 0 and spec["mean_accept_length"] >= 1.0
    assert sum(spec["accept_length_histogram"].values()) == spec["request_steps"]
    assert info["internal_states"][0]["avg_spec_accept_length"] == spec["mean_accept_length"]
    for series in ("sglang:spec_accept_length{", "sglang:spec_verify_tokens_per_step{",
                   'sglang:spec_accept_length_per_step_bucket{le="1"', "sglang:spec_draft_seconds_total{",
                   "sglang:spec_verify_seconds_total{", "sglang:spec_step_aside_steps_total{"):
        assert series in metrics, series
    aside = next(line for line in metrics.splitlines() if line.startswith("sglang:spec_step_aside_steps_total{"))
    assert float(aside.rsplit(" ", 1)[1]) == spec["step_aside_steps"]
    assert "DSpark: block size 4, ragged verify mode compact" in log.read_text(errors="replace")

    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.launch import generate_batch

    from dspark_helpers import engine_config

    plain = generate_batch(engine_config(target), [prompt],
                           SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True))
    assert reply["output_ids"] == plain[0]
