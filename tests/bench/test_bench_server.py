"""`sglaunch bench` against our real server (tiny random Llama on CPU), started from launch lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
import matplotlib.image

SERVE = "sglaunch serve --model-path {model} --device cpu --dtype float32 --max-total-tokens 8192"
SHORT = ("--num-prompts", "6", "--input-len", "24", "--output-len", "8", "--range-ratio", "0.5",
         "--warmup", "1")


def test_short_sweep_against_our_server(run_bench, tiny_model):
    out = run_bench("--launch", SERVE.format(model=tiny_model) + " --enable-metrics",
                    "--concurrency", "1,3", "--request-rate", "inf", "--max-concurrency", "2", *SHORT)
    assert out.exit_code == 0, out.stderr
    doc = out.doc()
    assert doc["requests"]["token_accuracy"] == f"exact (local tokenizer {tiny_model})"
    planned = doc["requests"]["planned_input_tokens_mean"] * 6
    levels = doc["configs"][0]["levels"]
    # the levels reuse the prompts: from the second on, the server has every one cached but its last token
    assert [lv["total_cached_tokens"] for lv in levels[1:]] == [planned - 6] * 2
    for level in levels:
        assert (level["completed"], level["errors"]) == (6, 0)
        assert level["total_input_tokens"] == planned  # the server counted what we planned
        assert level["total_output_tokens"] == round(doc["requests"]["planned_output_tokens_mean"] * 6)
        assert level["ttft_ms"]["p50"] > 0 and level["e2e_ms"]["p99"] >= level["e2e_ms"]["p50"]
        assert level["accept_length"] is None  # no speculative decoding: reported as n/a
    assert "n/a" in out.stdout
    image = matplotlib.image.imread(out.json_path.with_suffix(".png"))
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert "ready" in (out.json_path.parent / "bench-server-server.log").read_text()


def test_flush_cache_runs_every_level_uncached(run_bench, tiny_model):
    """--flush-cache: the server empties its prefix cache before each level, so the second round
    of a level finds no more of its prompts cached than the first (the test above shows how much a
    later level finds without it); the server logged one flush per level."""
    out = run_bench("--launch", SERVE.format(model=tiny_model), "--concurrency", "1", "--rounds", "2",
                    "--flush-cache", "--no-plot", *SHORT)
    assert out.exit_code == 0, out.stderr
    doc = out.doc()
    assert doc["settings"]["flush_cache"] is True
    planned = doc["requests"]["planned_input_tokens_mean"] * 6
    first, second = doc["configs"][0]["levels"]
    assert (first["completed"], second["completed"]) == (6, 6)
    assert first["total_cached_tokens"] == second["total_cached_tokens"] < (planned - 6) / 2
    log = (out.json_path.parent / "bench-server-server.log").read_text()
    assert len(re.findall(r"flushed the prefix cache: \d+ pages freed", log)) == 2


def test_compare_two_launch_lines_in_a_subprocess(tiny_model, tmp_path):
    plain = SERVE.format(model=tiny_model)
    compact = f"SGLANG_RAGGED_VERIFY_MODE=compact {plain} --max-running-requests 2"
    proc = subprocess.run([sys.executable, "-m", "sglaunch", "bench", "--compare", plain, "--compare", compact,
                           "--label", "plain", "--label", "compact", "--concurrency", "1,2", *SHORT,
                           "-o", str(tmp_path / "cmp.json")], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert [c["label"] for c in doc["configs"]] == ["plain", "compact"]
    assert doc["configs"][1]["launch"].startswith("SGLANG_RAGGED_VERIFY_MODE=compact ")
    assert all(lv["status"] == "ok" for c in doc["configs"] for lv in c["levels"])
    assert [r["label"] for r in doc["comparison"]] == ["c=1", "c=2"]
    assert all(r["output_token_throughput"] > 0 for r in doc["comparison"])
    assert (tmp_path / "cmp.png").stat().st_size > 1000
    assert "ratios compact/plain" in proc.stdout
    for config in doc["configs"]:  # bench stopped both servers
        try:
            httpx.get(config["url"] + "/health", timeout=1)
            raise AssertionError(f"{config['label']} still answers")
        except httpx.TransportError:
            pass


def test_launch_line_that_fails_shows_the_log(run_bench, tmp_path):
    out = run_bench("--launch", f"sglaunch serve --model-path {tmp_path}/no-such-model --device cpu", *SHORT)
    assert out.exit_code == 1
    assert "exited with 2 before it was ready" in out.stderr and "Hint:" in out.stderr


def test_a_server_starved_of_gpu_memory_by_the_one_beside_it_gets_a_hint(tmp_path):
    """bench --compare runs its servers side by side: when a later one exits for want of GPU memory,
    the hint says why and what to give each launch line; alone, or failing otherwise, the usual hint."""
    import shlex

    from sglaunch.bench.launch import LaunchedServer, parse_launch_line
    from sglaunch.errors import SglaunchError

    def failing(message: str, beside: int) -> str:
        script = f"import sys; print({message!r}); sys.exit(2)"
        server = LaunchedServer(parse_launch_line(f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}"),
                                tmp_path / f"server-{beside}-{len(message)}.log")
        server.start()
        with pytest.raises(SglaunchError) as raised:
            server.wait_ready(30, beside=beside)
        assert "exited with 2 before it was ready" in str(raised.value) and message in str(raised.value)
        return raised.value.hint

    starved = "Error: The engine cannot start: no GPU memory left for the KV cache (budget -2.31 GiB)"
    hint = failing(starved, beside=1)
    assert "side by side" in hint and "--max-total-tokens" in hint and "--mem-fraction-static" in hint
    assert "by hand" in failing(starved, beside=0)
    assert "by hand" in failing("Error: no such model", beside=1)


HANGING_SERVER = r'''
import http.server, json, os, sys, time
from pathlib import Path

mark = Path(sys.argv[2])


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {})
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": "hang", "object": "model"}]})
        return self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/v1/"):
            mark.write_text(str(os.getpid()))  # a warm-up request came: bench is measuring
            time.sleep(600)
        return self._json(404, {"error": {"message": "not found"}})


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''


def test_sigterm_stops_the_servers_bench_started(tiny_model, tmp_path):
    """A `timeout` around a bench (SIGTERM) once left both of its launch-line servers running
    (their own sessions), holding the GPU for every bench after it. Now bench stops them, writes
    the results so far as `terminated` and exits 143."""
    import os
    import shlex
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script, mark = tmp_path / "hang.py", tmp_path / "measuring"
    script.write_text(HANGING_SERVER)
    line = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {port} {shlex.quote(str(mark))} --port {port}"
    bench = subprocess.Popen([sys.executable, "-m", "sglaunch", "bench", "--launch", line, "--concurrency", "1",
                              *SHORT, "--tokenizer", str(tiny_model), "--timeout", "300", "-o", str(tmp_path / "out.json")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not mark.exists() and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.1)
        assert mark.exists(), bench.communicate(timeout=30)
        server_pid = int(mark.read_text())
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
            if mark.exists():  # NOTE: its server has a session of its own: not left behind by a failing run
                try:
                    os.kill(int(mark.read_text()), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
    assert bench.returncode == 143, err
    assert (tmp_path / "out.json").exists(), err
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["status"] == "terminated" and doc["partial"] and "SIGTERM" in doc["message"]
    for _ in range(50):  # the server's process is gone (reaped once bench exited)
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(server_pid, signal.SIGKILL)
        raise AssertionError("the launch-line server outlived bench")
