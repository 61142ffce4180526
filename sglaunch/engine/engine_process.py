"""The engine process: rank 0's scheduler loop, apart from the HTTP server's process.

`engine_main` boots the engine (create_engine: it spawns and joins the other tensor-parallel
ranks), reports READY or FAILED, then loops: take every queued command, run one step, send one
STEP event with all of that step's outputs. It ignores SIGINT and SIGTERM (Ctrl+C reaches the
whole process group; the server drains, then sends SHUTDOWN), and exits when the server process
is gone. A fatal error (a dead rank, a broken engine) leaves its message in the last-words file
for the server, which then ends every open stream with it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback

from sglaunch.logs import configure_logging
from sglaunch.config import EngineConfig
from sglaunch.engine import ipc

logger = logging.getLogger(__name__)

# a step that fails with no request to blame fails its running requests; this many in a row
# means the engine itself is broken (e.g. a sticky device error), which ends the process
MAX_CONSECUTIVE_STEP_FAILURES = 3
STATS_INTERVAL_S = 0.05  # live statistics ride on step events at most this often (and at finishes)
PARENT_POLL_S = 0.5


def engine_main(config: EngineConfig, endpoints: ipc.Endpoints, server_pid: int) -> None:
    """Entry point of the spawned engine process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # NOTE: a handler, not SIG_IGN: an ignored SIGTERM would be inherited by the TP ranks
    signal.signal(signal.SIGTERM, lambda *_: None)
    configure_logging(config.log_level)
    _watch_parent(server_pid)
    channel = _EngineChannel(endpoints)
    from sglaunch.engine.watchdog import before_fatal_exit

    before_fatal_exit(lambda message: _leave_last_words(endpoints.last_words, message))
    booted = _boot(config, channel)
    if booted is None:
        channel.close()
        return
    engine, cluster = booted
    try:
        _EngineLoop(engine, cluster, channel).run()
    except BaseException as exc:  # noqa: BLE001 - the engine cannot continue: exit naming why
        cluster.fail(exc)
    channel.send((ipc.STOPPED,))
    channel.close()


def _boot(config: EngineConfig, channel: "_EngineChannel"):
    """(LLMEngine, Cluster), READY sent; or None, FAILED sent."""
    from sglaunch.engine.launch import create_engine

    try:
        # debugging aid: stretch start-up to exercise stops that arrive while loading
        time.sleep(float(os.environ.get("SGLAUNCH_DEBUG_ENGINE_START_DELAY_S", "0")))
        engine, cluster = create_engine(config)
    except BaseException as exc:  # noqa: BLE001 - reported to the server, which raises it
        if not isinstance(exc, ValueError):
            traceback.print_exc()
        channel.send((ipc.FAILED, type(exc).__name__, str(exc), isinstance(exc, ValueError)))
        return None
    channel.send((ipc.READY, {
        "pid": os.getpid(),
        "static": engine.static_info(),
        "live": engine.live_stats(),
        "limits": engine.limits,
        "num_pages": engine.allocator.num_pages,
    }))
    return engine, cluster


class _EngineLoop:
    """Commands in, one step, one event out; until SHUTDOWN."""

    def __init__(self, engine, cluster, channel: "_EngineChannel"):
        self.engine, self.cluster, self.channel = engine, cluster, channel
        self._failed_steps = 0
        self._stats_sent = 0.0

    def run(self) -> None:
        from sglaunch.engine.distributed import KEEPALIVE_S

        engine = self.engine
        while True:
            idle = not engine.has_work
            commands = self.channel.receive(KEEPALIVE_S if idle else 0.0)
            if idle and not commands:
                engine.keepalive()
                continue
            outputs: list = []
            refusals: list = []
            for command in commands:
                if command[0] == ipc.SHUTDOWN:
                    self.cluster.stop(engine)
                    return
                self._handle(command, outputs, refusals)
            if engine.has_work:
                outputs += self._step()
            self._publish(outputs, refusals)

    def _handle(self, command: tuple, outputs: list, refusals: list) -> None:
        if command[0] == ipc.ADD:
            request = command[1]
            try:
                outputs += self.engine.add_request(request)
            except ValueError as exc:
                refusals.append((request.rid, ipc.REFUSED, str(exc)))
            except Exception as exc:  # noqa: BLE001 - one request's failure, not the engine's
                logger.exception("Could not add request %s", request.rid)
                refusals.append((request.rid, ipc.ERROR, f"the engine could not add the request: {exc!r}"))
        elif command[0] == ipc.ABORT:
            out = self.engine.abort(command[1])
            if out is not None:
                outputs.append(out)

    def _step(self) -> list:
        """One engine step; on one rank, a failed step fails the requests it ran, not the engine."""
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._failed_steps += 1
            if self.engine.tp.size > 1 or self._failed_steps >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise  # NOTE: ranks may be out of step, or the engine is broken: end the process
            logger.exception("An engine step failed; failing the requests it ran")
            return self.engine.fail_running(exc)
        self._failed_steps = 0
        return outputs

    def _publish(self, outputs: list, refusals: list) -> None:
        """One event for the whole step; statistics when a request ended, the engine went idle, or
        STATS_INTERVAL_S passed (NOTE: a client that sees its last token also sees the counts)."""
        now = time.monotonic()
        due = (now - self._stats_sent >= STATS_INTERVAL_S or not self.engine.has_work
               or any(out.finished for out in outputs))
        live = self.engine.live_stats() if due else None
        if due:
            self._stats_sent = now
        if outputs or refusals or live is not None:
            self.channel.send((ipc.STEP, ipc.pack_outputs(outputs), refusals, live))


class _EngineChannel:
    """The engine's ends of the two pipes (used from the main thread only)."""

    def __init__(self, endpoints: ipc.Endpoints):
        import zmq

        self._zmq = zmq
        self._context = zmq.Context(1)
        self._commands = self._context.socket(zmq.PULL)
        self._commands.connect(endpoints.commands)
        self._events = self._context.socket(zmq.PUSH)
        self._events.setsockopt(zmq.SNDHWM, 0)  # NOTE: never block a step on a slow server
        self._events.connect(endpoints.events)

    def send(self, message: tuple) -> None:
        self._events.send(ipc.encode(message), copy=False)

    def receive(self, timeout_s: float) -> list[tuple]:
        """Every command queued now; waits up to `timeout_s` for the first one."""
        if timeout_s > 0 and not self._commands.poll(int(timeout_s * 1000)):
            return []
        commands = []
        while True:
            try:
                commands.append(ipc.decode(self._commands.recv(self._zmq.NOBLOCK)))
            except self._zmq.Again:
                return commands

    def close(self) -> None:
        """Close both pipes; what was sent still reaches the server (bounded wait)."""
        self._commands.close(linger=0)
        self._events.close(linger=5000)
        self._context.term()


def _watch_parent(server_pid: int) -> None:
    """End this process (its TP ranks follow on their own) once the server process is gone."""
    def watch() -> None:
        while os.getppid() == server_pid:
            time.sleep(PARENT_POLL_S)
        sys.stderr.write(f"Error: the server process (pid {server_pid}) exited; stopping the engine\n")
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def _leave_last_words(path: str, message: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(message)
    os.replace(tmp, path)
