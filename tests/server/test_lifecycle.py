"""run_server start-up failures and shutdown on signals."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx

from .conftest import (
    RunningServer, engine_config, free_port, spawn_server, stop_server, wait_until_healthy,
)


def _start(checkpoint, tmp_path, **overrides) -> RunningServer:
    config = engine_config(checkpoint, **overrides)
    log_path = tmp_path / "server.log"
    return RunningServer(f"http://127.0.0.1:{config['port']}", spawn_server(config, log_path),
                         log_path, config)


def test_sigint_shuts_down_cleanly(tiny_llama, tmp_path):
    server = _start(tiny_llama, tmp_path)
    try:
        wait_until_healthy(server)
        assert httpx.get(f"{server.base_url}/health").status_code == 200
    finally:
        exit_code = stop_server(server, signal.SIGINT)
    assert exit_code == 0, server.log()
    assert "Received SIGINT" in server.log()
    assert "Engine shut down" in server.log()


def test_busy_port_fails_before_loading_the_model(tiny_llama, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = _start(tiny_llama, tmp_path, port=busy.getsockname()[1])
        try:
            exit_code = server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop_server(server)
            raise
    assert exit_code != 0
    assert "Cannot listen on 127.0.0.1" in server.log()


def test_missing_tokenizer_fails_with_a_clear_error(tiny_llama, tmp_path):
    server = _start(tiny_llama, tmp_path, tokenizer_path=str(tmp_path / "nowhere"))
    assert server.process.wait(timeout=60) != 0
    assert "Tokenizer folder not found" in server.log()


def test_two_nodes_serve_and_exit_together(tiny_llama, tmp_path):
    """Node 1 only hosts its rank; node 0 serves HTTP; SIGTERM on node 0 ends both cleanly."""
    topology = dict(tp_size=2, nnodes=2, dist_init_addr=f"127.0.0.1:{free_port()}")
    worker_log = tmp_path / "node1.log"
    worker = spawn_server(engine_config(tiny_llama, node_rank=1, **topology), worker_log)
    (tmp_path / "node0").mkdir()
    server = _start(tiny_llama, tmp_path / "node0", node_rank=0, **topology)
    try:
        wait_until_healthy(server)
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
        reply = httpx.post(f"{server.base_url}/generate", json=body, timeout=60).json()
        assert len(reply["output_ids"]) == 4
    finally:
        exit_code = stop_server(server)
        try:
            worker_exit = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise
    assert exit_code == 0, server.log()
    assert worker_exit == 0, worker_log.read_text()


def test_sigint_during_a_slow_load_waits_then_shuts_the_engine_down(tiny_llama, tmp_path, monkeypatch):
    """A stop while weights load must not orphan the loading thread (that ends in a C++ abort)."""
    monkeypatch.setenv("SGLAUNCH_DEBUG_ENGINE_START_DELAY_S", "2")
    server = _start(tiny_llama, tmp_path)
    try:
        while server.process.poll() is None:
            try:
                if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 503:
                    break
            except httpx.TransportError:
                time.sleep(0.02)
    finally:
        exit_code = stop_server(server, signal.SIGINT)
    assert exit_code == 0, server.log()
    log = server.log()
    assert "waiting for the engine to finish loading" in log and "Engine shut down." in log


def test_sigterm_while_the_engine_starts_exits_cleanly(tiny_llama, tmp_path):
    server = _start(tiny_llama, tmp_path)
    try:
        while server.process.poll() is None:  # first answer: /health is 503 while loading
            try:
                if httpx.get(f"{server.base_url}/health", timeout=2).status_code in (200, 503):
                    break
            except httpx.TransportError:
                time.sleep(0.02)
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
