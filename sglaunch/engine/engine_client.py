"""AsyncEngine for the HTTP server: the engine runs in a process of its own. Torch-free.

`EngineClient` spawns `engine_process.engine_main`, sends it commands over ZeroMQ and fans its
step events out to one asyncio queue per request; all on the event loop, no locks. Refusals the
scheduler would make (prompt too long, ...) are checked here, synchronously, against the
scheduler limits the engine sends at start-up. A dead engine process (killed, crashed, a dead
rank) ends every open stream with the reason and resolves `wait_failed()`.

With `--tokenizer-worker-num N > 1` the launcher holds the owner (`EngineClient(config,
workers=N)`: it spawns the engine process, waits for it, shuts it down; it runs no request) and
each HTTP worker process an attached client (`EngineClient.attached`): its own pipe pair to the
same engine process, request ids prefixed with the worker's index (unique across workers), and
the engine process's exit seen through a pidfd (it is not the worker's child).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections import deque
from multiprocessing.util import Finalize
from typing import AsyncIterator

import zmq

import sglaunch
from sglaunch.config import EngineConfig
from sglaunch.engine import ipc
from sglaunch.engine.interface import GenerateRequest, TokenOutput, joined

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0
EXIT_GRACE_S = 1.0  # a process that exited: its last events get this long to arrive


class _Stream:
    """One request's outputs (and errors) as they arrive, taken all at once by its consumer.

    NOTE: a bare future per wait instead of an asyncio.Event (issue 15: once per token per
    stream; the Event's waiter list, clear and set cost more than the wake-up itself)."""

    __slots__ = ("items", "waiter", "first_taken", "_loop")

    def __init__(self) -> None:
        self.items: deque = deque()
        self.waiter: asyncio.Future | None = None
        self.first_taken = False
        self._loop = asyncio.get_running_loop()

    def put(self, item) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list:
        while not self.items:
            self.waiter = waiter = self._loop.create_future()
            await waiter
        if not self.first_taken:  # NOTE: the first output goes alone: it is the time to first token
            self.first_taken = True
            return [self.items.popleft()]
        items = list(self.items)
        self.items.clear()
        return items


def coalesce(items: list) -> list:
    """Merge runs of plain-decoding TokenOutputs into one each (token ids and logprobs joined, the
    counts and finish of the last). A consumer that fell behind the engine (many streams, slow
    clients) then detokenizes and sends one chunk for several tokens instead of one per token.
    Speculative outputs (accept_length set) and errors pass unmerged, in order."""
    if len(items) < 2:  # NOTE: a consumer that keeps up takes one output at a time
        return items
    merged: list = []
    for item in items:
        last = merged[-1] if merged else None
        if (isinstance(item, TokenOutput) and isinstance(last, TokenOutput) and not last.finished
                and item.accept_length is None and last.accept_length is None):
            merged[-1] = joined(last, item)
        else:
            merged.append(item)
    return merged


class _PoolSize:
    """The page count the scheduler's refusals read (the server holds no pages)."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages


class EngineClient:
    """Implements sglaunch.engine.interface.AsyncEngine over an engine process."""

    def __init__(self, config: EngineConfig, *, workers: int = 0):
        self.config = config
        self.pid: int | None = None  # the engine process, once spawned
        self.endpoints: ipc.Endpoints | None = None  # the pipes' folder, made at launch()
        self._workers = workers  # HTTP worker processes that attach to the engine process
        self._pipe = 0  # which pipe pair of the engine process is this client's
        self._rid_prefix = ""
        self._process = None  # the engine process when this client spawned it, else None
        self._pidfd: int | None = None  # the engine process when it is not our child
        self._streams: dict[str, _Stream] = {}
        self._static: dict = {}
        self._live: dict = {}
        self._checker = None
        self._stopping = False
        self._failure: str | None = None
        self._failure_reported = False
        self._exited = asyncio.Event()  # the engine process has ended
        self._receiving = False
        self._last_event = asyncio.Event()  # STOPPED or FAILED arrived
        self._flushes: dict[int, asyncio.Future] = {}  # flush_cache calls waiting for their answer
        self._flush_tokens = itertools.count(1)

    @classmethod
    def attached(cls, config: EngineConfig, endpoints: ipc.Endpoints, worker: int,
                 engine_pid: int) -> "EngineClient":
        """HTTP worker `worker`'s client of an engine process the launcher spawned (start() binds
        its pipe pair and waits for the engine to be ready; shutdown() only closes the pipes)."""
        client = cls(config)
        client.endpoints, client._pipe, client.pid = endpoints, worker + 1, engine_pid
        client._rid_prefix = f"w{worker}-"
        return client

    @property
    def owner(self) -> bool:
        """Whether this client spawned the engine process (and shuts it down)."""
        return self._pipe == 0

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn the engine process (or, attached, connect to it) and wait until it is ready;
        ValueError for a checkpoint or configuration it refuses, RuntimeError for any other
        start-up failure."""
        self.launch()
        await self.ready()

    def launch(self) -> None:
        """Spawn the engine process (owner) or bind this worker's pipes; `pid` is known after."""
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future = loop.create_future()
        self._failed: asyncio.Future = loop.create_future()
        if self.endpoints is None:
            self.endpoints = ipc.Endpoints(tempfile.mkdtemp(prefix="sglaunch-engine-"), self._workers)
        self._open_channel()
        if self.owner:
            self._spawn()
            loop.add_reader(self._process.sentinel, self._on_exit)
        else:
            self._watch_engine(loop)
        loop.add_reader(self._events.getsockopt(zmq.FD), self._receive)
        self._receiving = True
        self._receive()  # NOTE: anything that arrived before the reader was added

    async def ready(self) -> None:
        """Wait until the engine process is ready (see start)."""
        try:
            await self._started
        except BaseException:
            self._stopping = True
            await self._reap()
            raise

    async def _reap(self) -> None:
        """After a failed start: let the process exit (it reported why), then release it all."""
        if self.owner:
            try:
                await asyncio.wait_for(asyncio.shield(self._exited.wait()), EXIT_GRACE_S + 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            _kill(self._process)
        self._close()

    def _open_channel(self) -> None:
        self._context = zmq.Context(1)
        self._commands = self._context.socket(zmq.PUSH)
        self._commands.setsockopt(zmq.SNDHWM, 0)
        self._commands.setsockopt(zmq.LINGER, 0)
        self._commands.bind(self.endpoints.commands_of(self._pipe))
        # NOTE: a plain socket read from the loop's own reader callback (issue 15: zmq.asyncio's
        # futures, tasks and poller callbacks cost more per step event than the event itself)
        self._events = self._context.socket(zmq.PULL)
        self._events.setsockopt(zmq.RCVHWM, 0)
        self._events.setsockopt(zmq.LINGER, 0)
        self._events.bind(self.endpoints.events_of(self._pipe))

    def _watch_engine(self, loop: asyncio.AbstractEventLoop) -> None:
        """An attached client: the engine process is the launcher's child, not ours; a pidfd
        becomes readable when it exits."""
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # already gone
            loop.call_soon(self._on_exit)
            return
        loop.add_reader(self._pidfd, self._on_exit)

    def _spawn(self) -> None:
        from sglaunch.engine.engine_process import engine_main  # torch-free until it boots

        context = multiprocessing.get_context("spawn")
        # NOTE: not daemonic: the engine process spawns the other tensor-parallel ranks itself
        self._process = context.Process(target=engine_main, name="sglaunch-engine",
                                        args=(self.config, self.endpoints, os.getpid()))
        self._process.start()
        self.pid = self._process.pid
        # NOTE: multiprocessing joins live children at interpreter exit; one that was never shut
        # down would hang it, so kill it first (its ranks exit once their parent is gone)
        Finalize(self, _kill, args=(self._process,), exitpriority=10)

    async def shutdown(self) -> None:
        """Let the engine stop its ranks and exit; kill it if it does not within the timeout.
        Raises RuntimeError when it failed, unless wait_failed() has already reported that.
        An attached client only closes its pipes (the launcher shuts the engine down)."""
        if self._stopping:
            return
        self._stopping = True
        if not self.owner:
            self._close()
            return
        try:
            if not self._exited.is_set():
                self._send((ipc.SHUTDOWN,))
                try:
                    await asyncio.wait_for(self._exited.wait(), SHUTDOWN_TIMEOUT_S)
                except asyncio.TimeoutError:
                    logger.error("The engine process did not exit within %g s; killing it.", SHUTDOWN_TIMEOUT_S)
                    _kill(self._process)
                    await self._exited.wait()
        finally:
            self._close()
        code = self._process.exitcode
        if not self._failure_reported and (self._failure is not None or code != 0):
            raise RuntimeError(self._failure or f"the engine process exited with code {code} while shutting down")

    def _settle_flushes(self, error: BaseException) -> None:
        """flush_cache calls still waiting get `error` (the engine will not answer them)."""
        for future in self._flushes.values():
            _settle(future, error)

    def _close(self) -> None:
        self._settle_flushes(RuntimeError("the engine is shutting down"))
        loop = asyncio.get_running_loop()
        if self._receiving:
            self._receiving = False
            loop.remove_reader(self._events.getsockopt(zmq.FD))
        if self._pidfd is not None:
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._events.close()
        self._commands.close()
        self._context.term()
        if self.owner:
            shutil.rmtree(self.endpoints.folder, ignore_errors=True)

    def drop_worker(self, worker: int) -> None:
        """Owner: HTTP worker `worker` died; the engine aborts its requests (frees their KV)."""
        self._send((ipc.DROP, worker + 1))

    async def wait_failed(self) -> str:
        """Returns why, once the engine process has died (never, after a clean shutdown)."""
        message = await asyncio.shield(self._failed)
        self._failure_reported = True
        return message

    # ---- AsyncEngine --------------------------------------------------------------------
    def check_request(self, request: GenerateRequest) -> None:
        """Raise ValueError now for a request generate() would refuse (prompt too long, ...)."""
        if self._checker is None or self._stopping or self._failure is not None:
            raise RuntimeError(f"the engine is not running{': ' + self._failure if self._failure else ''}")
        self._checker.check(len(request.input_ids), request.sampling.max_new_tokens)
        if request.rid in self._streams:
            raise ValueError(f"request id {request.rid!r} is already in use")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenOutput]:
        """Stream a request's outputs; a refused request raises ValueError at the first
        iteration, before any output."""
        if self._rid_prefix:  # NOTE: unique across the HTTP workers of one engine
            request = dataclasses.replace(request, rid=self._rid_prefix + request.rid)
        self.check_request(request)
        stream = _Stream()
        self._streams[request.rid] = stream
        self._send((ipc.ADD, request, self._pipe) if self._pipe else (ipc.ADD, request))
        finished = False
        try:
            while not finished:
                for item in coalesce(await stream.take()):
                    if isinstance(item, BaseException):
                        raise item
                    finished = item.finished
                    yield item
                    if finished:
                        break
        finally:
            if self._streams.get(request.rid) is stream:
                del self._streams[request.rid]
            if not finished:  # consumer went away (client disconnected): free its pages
                self._send((ipc.ABORT, request.rid))

    async def abort(self, rid: str) -> None:
        self._send((ipc.ABORT, self._rid_prefix + rid))

    async def flush_cache(self) -> dict:
        """Ask the engine to empty its prefix cache (LLMEngine.flush_cache): {"flushed": True,
        "freed_pages", ...}, or {"flushed": False, "running", "waiting"} when requests are in
        flight (of every HTTP worker: the engine counts them), or {"flushed": False, "error"}.
        RuntimeError when the engine is not running or stops before it answers."""
        if self._checker is None or self._stopping or self._failure is not None or self._exited.is_set():
            raise RuntimeError(f"the engine is not running{': ' + self._failure if self._failure else ''}")
        token = next(self._flush_tokens)
        future = asyncio.get_running_loop().create_future()
        self._flushes[token] = future
        self._send((ipc.FLUSH_CACHE, token, self._pipe) if self._pipe else (ipc.FLUSH_CACHE, token))
        try:
            return await future
        finally:
            self._flushes.pop(token, None)

    def server_info(self) -> dict:
        config = {k: v for k, v in self.config.to_dict().items() if k != "api_key"}  # never leak it
        return {**config, "version": sglaunch.__version__, "engine_pid": self.pid, **self._static, **self._live}

    def _send(self, command: tuple) -> None:
        if self._exited.is_set() or self._checker is None or self._commands.closed:
            return
        try:
            self._commands.send(ipc.encode(command), zmq.NOBLOCK)
        except zmq.Again:  # NOTE: no engine connected any more; its exit is handled by _on_exit
            pass

    # ---- events from the engine ---------------------------------------------------------
    def _receive(self) -> None:
        """Every event queued now, handled at once (the socket's descriptor is edge-triggered:
        it signals again only once the queue has been read empty)."""
        events, recv, flags = self._events, self._events.recv, zmq.NOBLOCK
        # NOTE: asks EVENTS before each recv rather than recv until zmq.Again: building the
        # exception cost more than the check (py-spy of the server process); reading EVENTS until
        # it shows no message is also what re-arms the edge-triggered descriptor
        while self._receiving:
            try:
                if not events.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
                frame = recv(flags, copy=False)
            except zmq.Again:
                continue
            except zmq.ZMQError:  # closed under us
                return
            try:
                self._on_event(ipc.decode(frame.buffer))
            except Exception:  # NOTE: one bad event must not stop the reader
                logger.exception("Could not handle an event from the engine process")

    def _on_event(self, event: tuple) -> None:
        kind = event[0]
        if kind == ipc.STEP:
            self._on_step(*event[1:])
        elif kind == ipc.READY:
            self._on_ready(event[1])
        elif kind == ipc.FAILED:
            _, type_name, message, refused = event
            self._last_event.set()
            error = ValueError(message) if refused else RuntimeError(f"{type_name}: {message}")
            _settle(self._started, error)
        elif kind == ipc.STOPPED:
            self._last_event.set()
        elif kind == ipc.FLUSHED:
            _, token, result, live = event
            self._live = live  # NOTE: before the answer: a client that sees it sees the emptied cache
            future = self._flushes.get(token)
            if future is not None and not future.done():
                future.set_result(result)

    def _on_ready(self, info: dict) -> None:
        from sglaunch.engine.scheduler import Scheduler  # torch-free

        self._checker = Scheduler(info["limits"], _PoolSize(info["num_pages"]), None)
        self._static, self._live = info["static"], info["live"]
        _settle(self._started, None)

    def _on_step(self, outputs: list, refusals: list, live: dict | None) -> None:
        if live is not None:  # NOTE: stats first, so a client that sees its last token sees the counts
            self._live = live
        streams = self._streams
        for fields in outputs:
            stream = streams.get(fields[0])
            if stream is not None:
                stream.put(ipc.unpack_output(fields))
        for rid, kind, message in refusals:
            stream = streams.get(rid)
            if stream is not None:
                stream.put(ValueError(message) if kind == ipc.REFUSED else RuntimeError(message))

    # ---- the engine process ended -------------------------------------------------------
    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        if self._process is not None:
            loop.remove_reader(self._process.sentinel)
            if self.endpoints.workers:
                self._process.join(1.0)
                self._leave_exit_reason()
        elif self._pidfd is not None:
            loop.remove_reader(self._pidfd)
        asyncio.create_task(self._after_exit())

    def _leave_exit_reason(self) -> None:
        """Owner of an engine with HTTP workers: when the engine left no last words, write how it
        exited in their place, for the workers (which cannot read its exit code)."""
        if self._last_words() is None and self._process.exitcode not in (0, None):
            _leave_last_words(self.endpoints.last_words, self._unexpected_exit())

    def _unexpected_exit(self) -> str:
        code = self._process.exitcode if self._process is not None else None
        how = f" with {_describe(code)}" if self._process is not None else ""
        return f"the engine process (pid {self.pid}) exited unexpectedly{how}"

    async def _after_exit(self) -> None:
        if self._process is not None:
            self._process.join(1.0)
        if not self._last_event.is_set():  # events sent just before the exit may still be on the way
            try:
                await asyncio.wait_for(self._last_event.wait(), EXIT_GRACE_S)
            except asyncio.TimeoutError:
                pass
        self._exited.set()
        code = self._process.exitcode if self._process is not None else None
        if not self._started.done():
            why = self._last_words() or f"the engine process exited with {_describe(code)} while starting"
            _settle(self._started, RuntimeError(why))
            return
        if self._stopping and self._last_event.is_set() and (code == 0 or not self.owner):
            return
        self._fail(self._last_words() or self._unexpected_exit())

    def _fail(self, message: str) -> None:
        """Every open stream ends with the reason; wait_failed() returns it."""
        self._failure = message
        error = RuntimeError(f"the engine stopped: {message}")
        for stream in self._streams.values():
            stream.put(error)
        self._settle_flushes(error)
        if not self._failed.done():
            self._failed.set_result(message)

    def _last_words(self) -> str | None:
        try:
            with open(self.endpoints.last_words, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError:
            return None


def _leave_last_words(path: str, message: str) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(message)
        os.replace(tmp, path)
    except OSError:  # the folder is gone: nobody is left to read it
        pass


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"code {code}"


def _kill(process) -> None:
    if process.is_alive():
        process.kill()
        process.join(5)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
