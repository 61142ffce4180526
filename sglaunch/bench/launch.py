"""Servers that `bench` starts and stops itself, from launch lines like
`SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --model-path M --speculative-algorithm DSPARK`."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglaunch.errors import SglaunchError

ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
STOP_TIMEOUT_S = 30
LOG_TAIL_LINES = 15
# a server that found no GPU memory for itself (the engine's KV planning, or torch's allocator)
OUT_OF_GPU_MEMORY = ("no GPU memory left for the KV cache", "CUDA out of memory")


@dataclass
class LaunchLine:
    """A parsed launch line: environment prefix, argv, and where it will listen."""

    text: str
    env: dict[str, str]
    argv: list[str]
    host: str
    port: int

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def flag(self, name: str) -> str | None:
        return flag_value(self.argv, name)


def flag_value(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_launch_line(text: str) -> LaunchLine:
    """Split env prefix and command; add `--port` (a free one) when the line has none."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise SglaunchError(f"cannot parse launch line {text!r}: {exc}", "check the quoting") from None
    env = {}
    while words and ENV_ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words:
        raise SglaunchError(f"launch line {text!r} has no command",
                            'give a full command, e.g. "sglaunch serve --model-path M"')
    if words[0] == "sglaunch":  # the sglaunch of this interpreter, installed or not
        words = [sys.executable, "-m", "sglaunch", *words[1:]]
    port = flag_value(words, "--port")
    if port is None:
        port = str(free_port())
        words += ["--port", port]
    if not port.isdigit():
        raise SglaunchError(f"launch line {text!r}: --port {port!r} is not a number")
    return LaunchLine(text, env, words, flag_value(words, "--host") or "127.0.0.1", int(port))


def local_tokenizer_dir(line: LaunchLine) -> Path | None:
    """The launch line's tokenizer folder when it is local and holds tokenizer.json."""
    for name in ("--tokenizer-path", "--model-path", "--model"):
        value = line.flag(name)
        if value and (Path(value) / "tokenizer.json").is_file():
            return Path(value)
    return None


@dataclass
class LaunchedServer:
    """One started server process (its own session, so a stop reaches its workers too)."""

    line: LaunchLine
    log_path: Path
    process: subprocess.Popen | None = None
    started_at: float = field(default=0.0)
    interrupted: bool = False  # SIGINT sent

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.line.env, "PYTHONUNBUFFERED": "1"}
        try:
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(self.line.argv, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True)
        except OSError as exc:
            raise SglaunchError(f"cannot start {self.line.text!r}: {exc}",
                                "check the command of the launch line", exit_code=1) from None
        self.started_at = time.monotonic()

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def wait_ready(self, timeout: float, beside: int = 0) -> None:
        """Poll /health until 200; fail with the log tail when the process exits or time runs out.
        beside: servers of the same bench already running (they hold their share of the GPUs)."""
        import httpx

        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                hint = "run the launch line by hand to see the whole error"
                if beside and any(marker in tail for marker in OUT_OF_GPU_MEMORY):
                    hint = (f"bench runs its launch lines' servers side by side, and {beside} already held the "
                            "GPU memory this one needed: give each launch line a share, e.g. --max-total-tokens N "
                            "(KV tokens per server) on each, or a --mem-fraction-static that counts the servers "
                            "before it (it is the card's memory in use after this server starts, as in SGLang: "
                            "0.4 for the first of two, 0.8 for the second)")
                raise SglaunchError(
                    f"the server of {self.line.text!r} exited with {self.process.returncode} before "
                    f"it was ready; last lines of {self.log_path}:\n{tail}", hint, exit_code=1)
            try:
                if httpx.get(f"{self.line.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SglaunchError(f"the server of {self.line.text!r} was not ready after {timeout:.0f} s "
                            f"(log: {self.log_path})", "raise --launch-timeout for large models",
                            exit_code=1)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def interrupt(self) -> None:
        """SIGINT (a graceful stop) without waiting for it; once (a second one ends a server's drain)."""
        if self.process is not None and self.process.poll() is None and not self.interrupted:
            self.process.send_signal(signal.SIGINT)
            self.interrupted = True

    def stop(self) -> int | None:
        """SIGINT (graceful) unless sent already, then SIGKILL of its process group after STOP_TIMEOUT_S."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.interrupt()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode
