"""SIGTERM with long streams in flight, and a tensor-parallel rank killed mid-stream, against
real servers: every open request gets a proper last event, and no process is left behind."""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from .checkpoints import build_llama
from .conftest import MODEL_NAME, RunningServer, engine_config, spawn_server, stop_server, wait_until_healthy

LONG_CONTEXT = 2048


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory) -> Path:
    """The tiny Llama with room for streams long enough to still run when a signal arrives."""
    folder = tmp_path_factory.mktemp("long-llama")
    build_llama(folder, max_position_embeddings=LONG_CONTEXT)
    return folder


def start(checkpoint: Path, tmp_path: Path, **overrides) -> RunningServer:
    config = engine_config(checkpoint, context_length=LONG_CONTEXT, max_total_tokens=32768, **overrides)
    log_path = tmp_path / "server.log"
    server = RunningServer(f"http://127.0.0.1:{config['port']}", spawn_server(config, log_path),
                           log_path, config)
    try:
        wait_until_healthy(server)
    except BaseException:
        stop_server(server, signal.SIGKILL)
        raise
    return server


@dataclass
class Stream:
    """One streamed completion read on its own thread; `started` is set at its first token."""

    base_url: str
    max_tokens: int
    events: list = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self):
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        body = {"model": MODEL_NAME, "prompt": f"Story number {id(self) % 97}:", "stream": True,
                "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        try:
            with httpx.stream("POST", f"{self.base_url}/v1/completions", json=body, timeout=300) as reply:
                assert reply.status_code == 200, reply.read()
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.started.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.started.set()

    def join(self) -> "Stream":
        self.thread.join(300)
        assert not self.thread.is_alive(), "stream never ended"
        assert self.error is None, f"stream cut: {self.error!r}"
        return self

    @property
    def payloads(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    @property
    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for p in self.payloads for c in p.get("choices", []) if c["finish_reason"]]

    @property
    def completion_tokens(self) -> int:
        return next(p["usage"]["completion_tokens"] for p in self.payloads if p.get("usage"))


def children_of(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the tensor-parallel ranks, multiprocessing's helpers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def spawned_children(pid: int) -> list[int]:
    """Children of `pid` started by multiprocessing's spawn (not its resource tracker)."""
    return [child for child in children_of(pid)
            if "spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")]


def engine_pids(server: RunningServer) -> list[int]:
    """The engine process (rank 0's scheduler loop): the server's spawned child."""
    return spawned_children(server.process.pid)


def rank_pids(server: RunningServer) -> list[int]:
    """The other tensor-parallel ranks: spawned by the engine process."""
    return [pid for engine in engine_pids(server) for pid in spawned_children(engine)]


def test_sigterm_drains_running_streams_and_refuses_new_work(long_llama, tmp_path):
    server = start(long_llama, tmp_path, graceful_shutdown_timeout=300)
    try:
        streams = [Stream(server.base_url, max_tokens=400) for _ in range(6)]
        for stream in streams:
            assert stream.started.wait(120)
        server.process.send_signal(signal.SIGTERM)
        # still listening while it drains: /health and new requests get 503, not a refused connection
        health = httpx.get(f"{server.base_url}/health", timeout=30)
        assert health.status_code == 503 and health.json()["error"]["code"] == "shutting_down"
        refused = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                             timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        for stream in streams:
            stream.join()
            assert stream.finish_reasons == ["length"] and stream.events[-1] == "[DONE]"
            assert stream.completion_tokens == 400
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
    log = server.log()
    assert "Draining 6 running request(s)" in log
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_after_the_drain_timeout_the_rest_end_with_abort_and_no_process_is_left(long_llama, tmp_path):
    server = start(long_llama, tmp_path, graceful_shutdown_timeout=0, tp_size=2)
    ranks = rank_pids(server)
    assert len(ranks) == 1
    try:
        streams = [Stream(server.base_url, max_tokens=1800) for _ in range(4)]
        plain = {}
        thread = threading.Thread(target=lambda: plain.update(reply=httpx.post(
            f"{server.base_url}/v1/completions", timeout=300,
            json={"prompt": "A long one", "max_tokens": 1800, "ignore_eos": True})))
        thread.start()
        for stream in streams:
            assert stream.started.wait(120)
        while httpx.get(f"{server.base_url}/server_info").json()["internal_states"][0][
                "num_running_requests"] < 5:
            pass  # the non-streamed request is queued behind the streams' first steps
        server.process.send_signal(signal.SIGTERM)
        for stream in streams:
            stream.join()
            assert stream.finish_reasons == ["abort"], stream.events[-3:]
            assert stream.events[-1] == "[DONE]" and stream.completion_tokens < 1800
        thread.join(300)
        reply = plain["reply"]
        assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "abort"
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
    assert "Aborting 5 request(s) still running after the drain" in server.log()
    assert not [pid for pid in ranks if alive(pid)], "a tensor-parallel rank outlived the server"
    assert "Traceback" not in server.log()


def test_a_rank_killed_mid_stream_ends_every_stream_with_an_error_event(long_llama, tmp_path):
    server = start(long_llama, tmp_path, tp_size=2)
    try:
        (rank1,) = rank_pids(server)
        streams = [Stream(server.base_url, max_tokens=1800) for _ in range(3)]
        for stream in streams:
            assert stream.started.wait(120)
        os.kill(rank1, signal.SIGKILL)
        exit_code = server.process.wait(60)
        for stream in streams:
            stream.join()
            assert stream.events[-1] == "[DONE]", stream.events[-3:]
            error = json.loads(stream.events[-2])["error"]
            assert "TP rank 1" in error["message"] and error["code"] == "engine_error", error
            assert stream.finish_reasons == []
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    assert exit_code != 0
    assert "TP rank 1" in server.log()
    assert not alive(rank1)



def test_a_second_signal_ends_the_drain_at_once(long_llama, tmp_path):
    server = start(long_llama, tmp_path, graceful_shutdown_timeout=600)
    try:
        streams = [Stream(server.base_url, max_tokens=1800) for _ in range(3)]
        for stream in streams:
            assert stream.started.wait(120)
        server.process.send_signal(signal.SIGTERM)
        assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 503  # draining
        server.process.send_signal(signal.SIGTERM)
        for stream in streams:
            stream.join()
            assert stream.finish_reasons == ["abort"] and stream.events[-1] == "[DONE]"
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
    assert "aborting the running requests now" in server.log()
