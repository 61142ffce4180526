"""The engine runs in a process of its own (issue 15 item 1), against real servers: the HTTP
process holds no torch, outputs match the in-process engine, a killed engine process ends every
stream with an error and the server with a clear message, an abort frees KV, Ctrl+C to the whole
process group drains, and no process outlives the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from .conftest import (REPO_ROOT, LAUNCH_SNIPPET, RunningServer, engine_config, stop_server,
                       wait_until_healthy)
from .test_shutdown import LONG_CONTEXT, Stream, alive, engine_pids, long_llama, rank_pids  # noqa: F401

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
PROMPTS = [[5 + i, 17, 3 * i + 2, 40, 9] for i in range(12)]


def start(checkpoint: Path, tmp_path: Path, **overrides) -> RunningServer:
    """A server in a process group of its own (so a test can signal the whole group)."""
    config = engine_config(checkpoint, context_length=LONG_CONTEXT, max_total_tokens=32768, **overrides)
    log_path = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", LAUNCH_SNIPPET, json.dumps(config)],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
                                   start_new_session=True)
    server = RunningServer(f"http://127.0.0.1:{config['port']}", process, log_path, config)
    try:
        wait_until_healthy(server)
    except BaseException:
        stop_server(server, signal.SIGKILL)
        raise
    return server


def engine_state(server: RunningServer) -> dict:
    return httpx.get(f"{server.base_url}/server_info", timeout=30).json()["internal_states"][0]


def generate(server: RunningServer, input_ids: list[int], out: dict, key) -> None:
    """One streamed /generate; keeps the output ids of its last event."""
    body = {"input_ids": input_ids, "sampling_params": GREEDY, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out[key] = json.loads(line[6:])["output_ids"]


IN_PROCESS_SNIPPET = (
    "import json, sys\n"
    "from sglaunch.config import EngineConfig\n"
    "from sglaunch.engine.interface import SamplingParams\n"
    "from sglaunch.engine.launch import generate_batch\n"
    "config, prompts, sampling = json.loads(sys.argv[1])\n"
    "print(json.dumps(generate_batch(EngineConfig(**config), prompts, SamplingParams(**sampling))))\n"
)


def in_process_outputs(config: dict, prompts: list[list[int]]) -> list[list[int]]:
    """generate_batch, the in-process engine, in a fresh interpreter (this one stays as it was)."""
    sampling = dict(max_new_tokens=GREEDY["max_new_tokens"], temperature=0.0, ignore_eos=True)
    result = subprocess.run([sys.executable, "-c", IN_PROCESS_SNIPPET, json.dumps([config, prompts, sampling])],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def kill_all(server: RunningServer) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


def test_concurrent_streams_match_the_in_process_engine_and_the_server_holds_no_torch(long_llama, tmp_path):
    server = start(long_llama, tmp_path)
    try:
        (engine_pid,) = engine_pids(server)
        assert engine_pid != server.process.pid
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
        assert "libtorch" not in maps, "the HTTP server process loaded torch"
        assert "libtorch" in Path(f"/proc/{engine_pid}/maps").read_text()
        outputs: dict = {}
        threads = [threading.Thread(target=generate, args=(server, p, outputs, i)) for i, p in enumerate(PROMPTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
    expected = in_process_outputs({**server.config, "port": 0}, PROMPTS)
    assert [outputs.get(i) for i in range(len(PROMPTS))] == expected


def test_a_killed_engine_process_ends_every_stream_with_an_error_and_the_server_non_zero(long_llama, tmp_path):
    server = start(long_llama, tmp_path)
    try:
        (engine_pid,) = engine_pids(server)
        streams = [Stream(server.base_url, max_tokens=1800) for _ in range(3)]
        for stream in streams:
            assert stream.started.wait(120)
        os.kill(engine_pid, signal.SIGKILL)
        exit_code = server.process.wait(60)
        for stream in streams:
            stream.join()
            assert stream.events[-1] == "[DONE]", stream.events[-3:]
            error = json.loads(stream.events[-2])["error"]
            assert "SIGKILL" in error["message"] and error["code"] == "engine_error", error
            assert stream.finish_reasons == []
    finally:
        kill_all(server)
    assert exit_code == 1
    assert (f"The engine stopped: the engine process (pid {engine_pid}) exited unexpectedly with "
            "signal SIGKILL") in server.log()


def test_a_disconnected_stream_is_aborted_and_its_kv_freed(long_llama, tmp_path):
    server = start(long_llama, tmp_path)
    try:
        body = {"input_ids": PROMPTS[0], "stream": True,
                "sampling_params": {"max_new_tokens": 1800, "ignore_eos": True}}
        with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=120) as reply:
            lines = reply.iter_lines()
            while not next(lines).startswith("data: "):
                pass
            busy = engine_state(server)
        deadline = time.monotonic() + 30
        while (idle := engine_state(server))["num_running_requests"] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
    assert busy["num_running_requests"] == 1 and busy["kv_used_tokens"] > 0
    assert idle["num_running_requests"] == 0 and idle["kv_used_tokens"] == 0, idle


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_the_process_group_drains_and_leaves_no_process(sig, long_llama, tmp_path):
    """Ctrl+C, or systemd's default stop (SIGTERM to every process of the unit), reaches the
    server, the engine process and the TP rank at once: only the server acts on it, drains the
    stream, then shuts the engine (and its rank) down. A rank that died of the SIGTERM ended the
    server through the dead-rank path and cut the stream."""
    server = start(long_llama, tmp_path, tp_size=2, graceful_shutdown_timeout=300)
    try:
        engines, ranks = engine_pids(server), rank_pids(server)
        assert len(engines) == 1 and len(ranks) == 1
        stream = Stream(server.base_url, max_tokens=200)
        assert stream.started.wait(120)
        os.killpg(server.process.pid, sig)
        stream.join()
        exit_code = server.process.wait(120)
    finally:
        kill_all(server)
    assert exit_code == 0, server.log()
    assert stream.finish_reasons == ["length"] and stream.completion_tokens == 200
    time.sleep(0.5)
    assert not [pid for pid in engines + ranks if alive(pid)], "a process outlived the server"


def test_the_engine_process_does_not_outlive_a_killed_server(long_llama, tmp_path):
    server = start(long_llama, tmp_path, tp_size=2)
    try:
        pids = engine_pids(server) + rank_pids(server)
        assert len(pids) == 2
        server.process.kill()
        server.process.wait()
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        kill_all(server)
    assert not [pid for pid in pids if alive(pid)], "the engine outlived the server"


def test_token_outputs_cross_the_channel_unchanged():
    from sglaunch.engine import ipc
    from sglaunch.engine.interface import TokenOutput

    out = TokenOutput("r", (1, 2), True, "abort", 3, 2, 1, 2, (-0.5, -1.0), error="boom")
    (packed,) = ipc.decode(ipc.encode((ipc.STEP, ipc.pack_outputs([out]), [], None)))[1]
    assert ipc.unpack_output(packed) == out


def test_the_fast_output_constructors_make_what_the_dataclass_makes():
    """interface.token_output and ipc.unpack_output build a TokenOutput without its frozen
    __init__: the result must be indistinguishable from TokenOutput(...), frozenness included."""
    import dataclasses

    from sglaunch.engine import ipc
    from sglaunch.engine.interface import TokenOutput, token_output

    fields = ("r-1", (5, 6, 7), True, "stop", 11, 3, 4, 3, (-0.1, -0.2, -0.3), "why")
    for fast in (token_output(*fields), ipc.unpack_output(fields)):
        slow = TokenOutput(*fields)
        assert type(fast) is TokenOutput
        assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
        assert dataclasses.astuple(fast) == fields
        assert dataclasses.replace(fast, finished=False) == dataclasses.replace(slow, finished=False)
        with pytest.raises(dataclasses.FrozenInstanceError):  # a fast-built TokenOutput stays frozen
            fast.finished = False
    # the defaults, as the dataclass has them
    assert token_output("r", (1,)) == TokenOutput("r", (1,))
    assert list(token_output("r", (1,)).__dict__) == [f.name for f in dataclasses.fields(TokenOutput)]


def test_a_consumer_behind_the_engine_gets_its_plain_outputs_merged_in_order():
    from sglaunch.engine.engine_client import coalesce
    from sglaunch.engine.interface import TokenOutput

    outs = [TokenOutput("r", (i,), i == 3, "length" if i == 3 else None, 4, i + 1, 2, logprobs=(-float(i),))
            for i in range(4)]
    (merged,) = coalesce(outs)
    assert merged == TokenOutput("r", (0, 1, 2, 3), True, "length", 4, 4, 2, logprobs=(-0.0, -1.0, -2.0, -3.0))
    speculative = TokenOutput("r", (7, 8), accept_length=2)
    error = RuntimeError("the engine stopped")
    assert coalesce([outs[0], speculative, outs[1], error]) == [outs[0], speculative, outs[1], error]
    assert coalesce([outs[0], outs[1], error]) == [coalesce(outs[:2])[0], error]


def test_stream_interval_holds_outputs_until_n_tokens_but_never_the_first_or_the_last():
    from sglaunch.engine.engine_process import StreamInterval
    from sglaunch.engine.interface import TokenOutput

    def out(rid, tokens, count, finished=False):
        return TokenOutput(rid, tuple(tokens), finished, "length" if finished else None, 5, count, 0,
                           logprobs=tuple(-float(t) for t in tokens))

    hold = StreamInterval(3)
    # the first token of each request goes at once (the time to first token)
    assert hold([out("a", [10], 1), out("b", [20], 1)]) == [out("a", [10], 1), out("b", [20], 1)]
    assert hold([out("a", [11], 2), out("b", [21, 22], 3)]) == []  # 1 and 2 new tokens: held
    # b's speculative step of two makes 4 new tokens: one merged output; a has 2: still held
    assert hold([out("a", [12], 3), out("b", [23, 24], 5)]) == [
        TokenOutput("b", (21, 22, 23, 24), False, None, 5, 5, 0, logprobs=(-21.0, -22.0, -23.0, -24.0))]
    assert hold([out("a", [13], 4)]) == [TokenOutput("a", (11, 12, 13), False, None, 5, 4, 0,
                                                     logprobs=(-11.0, -12.0, -13.0))]
    # the end goes at once, with whatever was held
    assert hold([out("a", [14], 5)]) == []
    assert hold([out("a", [15], 6, finished=True)]) == [
        TokenOutput("a", (14, 15), True, "length", 5, 6, 0, logprobs=(-14.0, -15.0))]
    assert hold.held == {}
    # interval 1: every output as it is
    every = [out("c", [1], 1), out("c", [2], 2)]
    assert StreamInterval(1)(every) is every


def test_stream_interval_streams_fewer_events_with_the_same_tokens(long_llama, tmp_path):
    server = start(long_llama, tmp_path, stream_interval=4)
    try:
        events = []
        body = {"input_ids": PROMPTS[0], "sampling_params": {**GREEDY, "max_new_tokens": 15}, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=120) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:])["output_ids"])
    finally:
        exit_code = stop_server(server)
    assert exit_code == 0, server.log()
    expected = in_process_outputs({**server.config, "port": 0, "stream_interval": 1}, PROMPTS[:1])[0][:15]
    assert events[-1] == expected
    # the first token alone, then groups of at least 4 new tokens, the rest with the end
    sizes = [len(events[0])] + [len(b) - len(a) for a, b in zip(events, events[1:])]
    assert sizes[0] == 1 and all(n >= 4 for n in sizes[1:-1]) and sum(sizes) == 15
    assert len(events) <= 5, sizes


def test_the_engine_channel_says_when_a_command_waits_unread(tmp_path):
    """has_input (what a DSpark engine asks before it chains a burst): False on an empty pipe,
    True once a command is queued, and it reads nothing: receive() still gets the command."""
    import time

    import zmq

    from sglaunch.engine import ipc
    from sglaunch.engine.engine_process import _EngineChannel

    endpoints = ipc.Endpoints(str(tmp_path))
    context = zmq.Context(1)
    server = context.socket(zmq.PUSH)
    server.bind(endpoints.commands)
    channel = _EngineChannel(endpoints)
    try:
        assert not channel.has_input()
        server.send(ipc.encode((ipc.ABORT, "r1")))
        deadline = time.monotonic() + 5
        while not channel.has_input() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert channel.has_input() and channel.has_input()  # asking twice reads nothing
        assert channel.receive(0.0) == [(ipc.ABORT, "r1")]
        assert not channel.has_input()
    finally:
        server.close(linger=0)
        channel.close()
        context.term()
