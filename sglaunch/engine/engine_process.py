"""The engine process: rank 0's scheduler loop, apart from the HTTP server's process.

`engine_main` boots the engine (create_engine: it spawns and joins the other tensor-parallel
ranks), reports READY or FAILED, then loops: take every queued command, run one step, send one
STEP event with all of that step's outputs. It ignores SIGINT and SIGTERM (Ctrl+C reaches the
whole process group; the server drains, then sends SHUTDOWN), and exits when the server process
is gone. With several HTTP worker processes (`--tokenizer-worker-num`), each step's outputs and
refusals go to the worker that added each request, one message per worker, and the live
statistics to every worker. A fatal error (a dead rank, a broken engine) leaves its message in the last-words file
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
    watch_parent(server_pid)
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


class StreamInterval:
    """--stream-interval N: a request's outputs reach the server once N new tokens have gathered
    since its last one sent, and always its first (the time to first token) and its last (the
    finish, an abort, an error); the outputs between are merged into one (token ids and
    log-probabilities joined, the counts and finish of the latest). Fewer, larger events: less
    IPC, detokenizing and SSE work per token, coarser streaming. N = 1 passes every output as is.
    As SGLang's flag of the same name (the scheduler's stream interval)."""

    def __init__(self, interval: int):
        self.interval = max(1, int(interval))
        self.held: dict[str, object] = {}  # rid -> the merged outputs not sent yet

    def __call__(self, outputs: list) -> list:
        if self.interval == 1 or not outputs:
            return outputs
        from sglaunch.engine.interface import joined

        ready, held = [], self.held
        for out in outputs:
            last = held.pop(out.rid, None)
            if last is not None:
                out = joined(last, out)
            # NOTE: the first output holds every token generated so far; later ones never do
            first = out.completion_tokens <= len(out.new_token_ids)
            if out.finished or first or len(out.new_token_ids) >= self.interval:
                ready.append(out)
            else:
                held[out.rid] = out
        return ready


class _EngineLoop:
    """Commands in, one step, one event out; until SHUTDOWN."""

    def __init__(self, engine, cluster, channel: "_EngineChannel"):
        self.engine, self.cluster, self.channel = engine, cluster, channel
        self._interval = StreamInterval(engine.config.stream_interval)
        self._failed_steps = 0
        self._stats_sent = 0.0
        # several worker pipes: rid -> the pipe of the worker that added it (None: one pipe)
        self._owners: dict[str, int] | None = {} if channel.pipes > 1 else None
        engine.input_waiting = channel.has_input  # NOTE: a DSpark engine chains no burst past an arrival

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
            self._publish(self._interval(outputs), refusals)

    def _handle(self, command: tuple, outputs: list, refusals: list) -> None:
        kind = command[0]
        if kind == ipc.ADD:
            request = command[1]
            if self._owners is not None:
                self._owners[request.rid] = command[2]
            try:
                outputs += self.engine.add_request(request)
            except ValueError as exc:
                refusals.append((request.rid, ipc.REFUSED, str(exc)))
            except Exception as exc:  # noqa: BLE001 - one request's failure, not the engine's
                logger.exception("Could not add request %s", request.rid)
                refusals.append((request.rid, ipc.ERROR, f"the engine could not add the request: {exc!r}"))
        elif kind == ipc.ABORT:
            out = self.engine.abort(command[1])
            if out is not None:
                outputs.append(out)
        elif kind == ipc.DROP:
            self._drop(command[1], outputs)
        elif kind == ipc.FLUSH_CACHE:
            self._flush_cache(command[1], command[2] if len(command) > 2 else 0)

    def _flush_cache(self, token: int, pipe: int) -> None:
        """/flush_cache: empty the prefix cache unless a request runs or waits (commands queued
        before it in this batch count: an add before it refuses it); the answer, with the live
        statistics after it (so /metrics and /server_info are right once the client has it), goes
        to the pipe that asked."""
        try:
            result = self.engine.flush_cache()
        except Exception as exc:  # noqa: BLE001 - answered as a failed flush, the engine goes on
            logger.exception("Could not flush the prefix cache")
            result = {"flushed": False, "error": f"{type(exc).__name__}: {exc}"}
        self.channel.send((ipc.FLUSHED, token, result, self.engine.live_stats()), pipe)

    def _drop(self, pipe: int, outputs: list) -> None:
        """A worker process died: abort its requests (frees their KV), stop sending to it."""
        owners = self._owners or {}
        rids = [rid for rid, owner in owners.items() if owner == pipe]
        for rid in rids:
            out = self.engine.abort(rid)
            if out is not None:
                outputs.append(out)
        self.channel.drop(pipe)
        if rids:
            logger.warning("Aborted %d request(s) of HTTP worker %d, which is gone.", len(rids), pipe - 1)

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
        """One event for the whole step (per worker); statistics when a request ended, the engine
        went idle, or STATS_INTERVAL_S passed (NOTE: a client that sees its last token also sees
        the counts)."""
        now = time.monotonic()
        due = (now - self._stats_sent >= STATS_INTERVAL_S or not self.engine.has_work
               or any(out.finished for out in outputs))
        live = self.engine.live_stats() if due else None
        if due:
            self._stats_sent = now
        if self._owners is not None:
            self._publish_per_worker(outputs, refusals, live)
        elif outputs or refusals or live is not None:
            self.channel.send((ipc.STEP, ipc.pack_outputs(outputs), refusals, live))

    def _publish_per_worker(self, outputs: list, refusals: list, live: dict | None) -> None:
        """Each worker gets the outputs and refusals of the requests it added, and the live
        statistics when due; a finished or refused request is forgotten."""
        owners, per_pipe = self._owners, {}
        for out in outputs:
            pipe = owners.pop(out.rid, None) if out.finished else owners.get(out.rid)
            if pipe is not None:
                per_pipe.setdefault(pipe, ([], []))[0].append(out)
        for refusal in refusals:
            pipe = owners.pop(refusal[0], None)
            if pipe is not None:
                per_pipe.setdefault(pipe, ([], []))[1].append(refusal)
        for pipe in self.channel.worker_pipes():
            mine = per_pipe.get(pipe)
            if mine is not None or live is not None:
                outs, refused = mine or ((), ())
                self.channel.send((ipc.STEP, ipc.pack_outputs(outs), list(refused), live), pipe)


class _EngineChannel:
    """The engine's ends of the pipes (used from the main thread only): one socket reads every
    commands pipe (fair-queued), one socket per events pipe."""

    def __init__(self, endpoints: ipc.Endpoints):
        import zmq

        self._zmq = zmq
        self.pipes = endpoints.pipes
        self._context = zmq.Context(1)
        self._commands = self._context.socket(zmq.PULL)
        self._events = []
        for pipe in range(self.pipes):
            # NOTE: a worker binds its pipes once it runs; until then ZeroMQ queues what is sent
            self._commands.connect(endpoints.commands_of(pipe))
            events = self._context.socket(zmq.PUSH)
            events.setsockopt(zmq.SNDHWM, 0)  # NOTE: never block a step on a slow server
            events.connect(endpoints.events_of(pipe))
            self._events.append(events)
        self._dropped: set[int] = set()

    def send(self, message: tuple, pipe: int | None = None) -> None:
        """To one pipe, or (None) to every pipe."""
        data = ipc.encode(message)
        for index in (range(self.pipes) if pipe is None else (pipe,)):
            if index not in self._dropped:
                self._events[index].send(data, copy=False)

    def worker_pipes(self) -> list[int]:
        """The pipes of the HTTP worker processes still there (all of them but the owner's)."""
        return [pipe for pipe in range(1, self.pipes) if pipe not in self._dropped]

    def drop(self, pipe: int) -> None:
        """Send nothing more to a pipe whose worker is gone (nor wait on it when closing)."""
        if 0 < pipe < self.pipes and pipe not in self._dropped:
            self._dropped.add(pipe)
            self._events[pipe].close(linger=0)

    def has_input(self) -> bool:
        """Whether a command waits unread (no wait, no read)."""
        return bool(self._commands.getsockopt(self._zmq.EVENTS) & self._zmq.POLLIN)

    def receive(self, timeout_s: float) -> list[tuple]:
        """Every command queued now; waits up to `timeout_s` for the first one."""
        sock, zmq = self._commands, self._zmq
        if timeout_s > 0 and not sock.poll(int(timeout_s * 1000)):
            return []
        # NOTE: ask the socket whether a message waits instead of trying recv(NOBLOCK) until it
        # raises: the loop runs this every step, and building zmq.Again cost about as much as
        # decoding the commands (py-spy of the engine process over HTTP)
        commands = []
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            commands.append(ipc.decode(sock.recv(zmq.NOBLOCK)))
        return commands

    def close(self) -> None:
        """Close the pipes; what was sent still reaches the server (bounded wait).

        NOTE: the worker pipes close at once: the launcher shuts the engine down only once its
        workers are gone, and nothing would ever read what is still queued for them."""
        self._commands.close(linger=0)
        for pipe, events in enumerate(self._events):
            if pipe not in self._dropped:
                events.close(linger=5000 if pipe == 0 else 0)
        self._context.term()


def watch_parent(server_pid: int, stopping: str = "the engine") -> None:
    """End this process once the server process (its parent) is gone: the engine (its TP ranks
    follow on their own) or an HTTP worker (so that no orphan keeps the port)."""
    def watch() -> None:
        while os.getppid() == server_pid:
            time.sleep(PARENT_POLL_S)
        sys.stderr.write(f"Error: the server process (pid {server_pid}) exited; stopping {stopping}\n")
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def _leave_last_words(path: str, message: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(message)
    os.replace(tmp, path)
