"""End-to-end smoke run: check-config, then `sglaunch serve` a tiny random Llama and talk to it over HTTP.

    python benchmarks/serve_smoke.py [--tp 2] [--out DIR] [-- extra serve flags]

Builds the test suite's tiny checkpoint (random weights, real byte-level BPE tokenizer), writes
`check-config --json` to DIR/check.json, starts the real server, sends a completion, a chat and a
streamed completion, stops it with SIGINT and prints one line per step. Exit 0 when all worked.
Used on the GPU machine to check the CUDA path and GPU detection; runs on CPU too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def build_checkpoint(folder: Path) -> None:
    spec = importlib.util.spec_from_file_location("checkpoints", ROOT / "tests/server/checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build_llama(folder, max_position_embeddings=512)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_config(flags: list[str], out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sglaunch", "check-config", "--json", *flags],
                          capture_output=True, text=True)
    (out / "check.json").write_text(proc.stdout)
    report = json.loads(proc.stdout)
    gpus = report["environment"]["gpus"]
    print(f"check-config: exit {proc.returncode}, {len(gpus)} GPU(s) "
          f"{[g['name'] for g in gpus]}, device -> "
          f"{next((r['value'] for r in report['resolutions'] if r['flag'] == '--device'), '?')}, "
          f"diagnostics {[d['code'] for d in report['diagnostics']]}")
    return report


def wait_ready(client: httpx.Client, server: subprocess.Popen, timeout: float = 300) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode} before it was ready")
        try:
            if client.get("/health").status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready in time")


def talk(client: httpx.Client) -> None:
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    start = time.monotonic()
    completion = client.post("/v1/completions", json=body).json()
    print(f"completion: {completion['usage']['completion_tokens']} tokens in {time.monotonic() - start:.2f} s")
    chat = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}).json()
    print(f"chat: finish_reason={chat['choices'][0]['finish_reason']}, usage={chat['usage']}")
    chunks = 0
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            chunks += line.startswith("data: ") and line != "data: [DONE]"
    print(f"stream: {chunks} chunks")
    info = (client.get("/server_info").json().get("internal_states") or [{}])[0]
    print(f"server_info: device={info.get('device')}, tp_size={info.get('tp_size')}, "
          f"kv tokens={info.get('max_total_num_tokens')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("smoke-out"))
    parser.add_argument("extra", nargs="*", help="more serve flags (after --)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / "tiny-llama"
    if not model.exists():
        build_checkpoint(model)
    port = free_port()
    flags = ["--model-path", str(model), "--served-model-name", "tiny", "--tp", str(args.tp),
             "--port", str(port), *args.extra]
    check_config(flags, args.out)
    log = open(args.out / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "sglaunch", "serve", *flags], stdout=log, stderr=log,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            print(f"ready after {wait_ready(client, server):.1f} s")
            talk(client)
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(timeout=60)
        print(f"serve exited with {code} after SIGINT")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
