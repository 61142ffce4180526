"""Fixtures: one tiny random-weight Llama per session, real servers in subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .checkpoints import build_llama

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-llama"
CONTEXT_LENGTH = 256
STARTUP_TIMEOUT_S = 180
SHUTDOWN_TIMEOUT_S = 30
# run_server exactly as `sglaunch serve` calls it, from a JSON-encoded EngineConfig
LAUNCH_SNIPPET = (
    "import json, sys\n"
    "from sglaunch.config import EngineConfig\n"
    "from sglaunch.server.launch import run_server\n"
    "sys.exit(run_server(EngineConfig(**json.loads(sys.argv[1]))))\n"
)


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen
    log_path: Path
    config: dict
    saw_starting_503: bool = False

    @property
    def api_key(self) -> str | None:
        return self.config.get("api_key")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_config(checkpoint: Path, **overrides) -> dict:
    config = dict(model_path=str(checkpoint), tokenizer_path=str(checkpoint),
                  served_model_name=MODEL_NAME, dtype="float32", context_length=CONTEXT_LENGTH,
                  host="127.0.0.1", port=free_port(), device="cpu", kv_cache_dtype="float32",
                  max_total_tokens=8192, log_level="info")
    config.update(overrides)
    return config


def spawn_server(config: dict, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-c", LAUNCH_SNIPPET, json.dumps(config)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)


def wait_until_healthy(server: RunningServer) -> None:
    """Poll /health until 200; remember whether it answered 503 while the engine loaded."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        with contextlib.suppress(httpx.TransportError):
            status = httpx.get(f"{server.base_url}/health", timeout=2).status_code
            if status == 200:
                return
            server.saw_starting_503 |= status == 503
        time.sleep(0.05)
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log()}")


def stop_server(server: RunningServer, sig: int = signal.SIGTERM) -> int:
    """Signal the server and wait for it; kill it (and fail) if it does not exit in time."""
    if server.process.poll() is None:
        server.process.send_signal(sig)
    try:
        return server.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
        raise AssertionError(f"server ignored {signal.Signals(sig).name}:\n{server.log()}") from None


@contextlib.contextmanager
def running_server(checkpoint: Path, log_dir: Path, **overrides):
    """A real `run_server` subprocess; on exit SIGTERM must stop it cleanly (exit code 0)."""
    config = engine_config(checkpoint, **overrides)
    log_path = log_dir / f"server-{config['port']}.log"
    server = RunningServer(f"http://127.0.0.1:{config['port']}", spawn_server(config, log_path),
                           log_path, config)
    try:
        wait_until_healthy(server)
        yield server
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, f"server exited with {exit_code} after SIGTERM:\n{server.log()}"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    build_llama(folder, max_position_embeddings=CONTEXT_LENGTH)
    return folder
