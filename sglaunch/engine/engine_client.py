"""AsyncEngine for the HTTP server: the engine runs in a process of its own. Torch-free.

`EngineClient` spawns `engine_process.engine_main`, sends it commands over ZeroMQ and fans its
step events out to one asyncio queue per request; all on the event loop, no locks. Refusals the
scheduler would make (prompt too long, ...) are checked here, synchronously, against the
scheduler limits the engine sends at start-up. A dead engine process (killed, crashed, a dead
rank) ends every open stream with the reason and resolves `wait_failed()`.
"""

from __future__ import annotations

import asyncio
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
from sglaunch.engine.interface import GenerateRequest, TokenOutput

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
            merged[-1] = TokenOutput(
                item.rid, last.new_token_ids + item.new_token_ids, item.finished, item.finish_reason,
                item.prompt_tokens, item.completion_tokens, item.cached_tokens, None,
                last.logprobs + item.logprobs, item.error)
        else:
            merged.append(item)
    return merged


class _PoolSize:
    """The page count the scheduler's refusals read (the server holds no pages)."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages


class EngineClient:
    """Implements sglaunch.engine.interface.AsyncEngine over an engine process."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.pid: int | None = None  # the engine process, once spawned
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

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn the engine process and wait until it is ready; ValueError for a checkpoint or
        configuration it refuses, RuntimeError for any other start-up failure."""
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future = loop.create_future()
        self._failed: asyncio.Future = loop.create_future()
        self._open_channel()
        self._spawn()
        loop.add_reader(self._process.sentinel, self._on_exit)
        loop.add_reader(self._events.getsockopt(zmq.FD), self._receive)
        self._receiving = True
        self._receive()  # NOTE: anything that arrived before the reader was added
        try:
            await self._started
        except BaseException:
            self._stopping = True
            await self._reap()
            raise

    async def _reap(self) -> None:
        """After a failed start: let the process exit (it reported why), then release it all."""
        try:
            await asyncio.wait_for(asyncio.shield(self._exited.wait()), EXIT_GRACE_S + 5)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        _kill(self._process)
        self._close()

    def _open_channel(self) -> None:
        self._endpoints = ipc.Endpoints(tempfile.mkdtemp(prefix="sglaunch-engine-"))
        self._context = zmq.Context(1)
        self._commands = self._context.socket(zmq.PUSH)
        self._commands.setsockopt(zmq.SNDHWM, 0)
        self._commands.setsockopt(zmq.LINGER, 0)
        self._commands.bind(self._endpoints.commands)
        # NOTE: a plain socket read from the loop's own reader callback (issue 15: zmq.asyncio's
        # futures, tasks and poller callbacks cost more per step event than the event itself)
        self._events = self._context.socket(zmq.PULL)
        self._events.setsockopt(zmq.RCVHWM, 0)
        self._events.setsockopt(zmq.LINGER, 0)
        self._events.bind(self._endpoints.events)

    def _spawn(self) -> None:
        from sglaunch.engine.engine_process import engine_main  # torch-free until it boots

        context = multiprocessing.get_context("spawn")
        # NOTE: not daemonic: the engine process spawns the other tensor-parallel ranks itself
        self._process = context.Process(target=engine_main, name="sglaunch-engine",
                                        args=(self.config, self._endpoints, os.getpid()))
        self._process.start()
        self.pid = self._process.pid
        # NOTE: multiprocessing joins live children at interpreter exit; one that was never shut
        # down would hang it, so kill it first (its ranks exit once their parent is gone)
        Finalize(self, _kill, args=(self._process,), exitpriority=10)

    async def shutdown(self) -> None:
        """Let the engine stop its ranks and exit; kill it if it does not within the timeout.
        Raises RuntimeError when it failed, unless wait_failed() has already reported that."""
        if self._stopping:
            return
        self._stopping = True
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

    def _close(self) -> None:
        if self._receiving:
            self._receiving = False
            asyncio.get_running_loop().remove_reader(self._events.getsockopt(zmq.FD))
        self._events.close()
        self._commands.close()
        self._context.term()
        shutil.rmtree(self._endpoints.folder, ignore_errors=True)

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
        self.check_request(request)
        stream = _Stream()
        self._streams[request.rid] = stream
        self._send((ipc.ADD, request))
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
        self._send((ipc.ABORT, rid))

    def server_info(self) -> dict:
        config = {k: v for k, v in self.config.to_dict().items() if k != "api_key"}  # never leak it
        return {**config, "version": sglaunch.__version__, **self._static, **self._live}

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
        while self._receiving:
            try:
                frame = recv(flags, copy=False)
            except zmq.Again:
                if not events.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
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
        asyncio.get_running_loop().remove_reader(self._process.sentinel)
        asyncio.create_task(self._after_exit())

    async def _after_exit(self) -> None:
        self._process.join(1.0)
        if not self._last_event.is_set():  # events sent just before the exit may still be on the way
            try:
                await asyncio.wait_for(self._last_event.wait(), EXIT_GRACE_S)
            except asyncio.TimeoutError:
                pass
        self._exited.set()
        code = self._process.exitcode
        if not self._started.done():
            why = self._last_words() or f"the engine process exited with {_describe(code)} while starting"
            _settle(self._started, RuntimeError(why))
            return
        if self._stopping and self._last_event.is_set() and code == 0:
            return
        self._fail(self._last_words()
                   or f"the engine process (pid {self.pid}) exited unexpectedly with {_describe(code)}")

    def _fail(self, message: str) -> None:
        """Every open stream ends with the reason; wait_failed() returns it."""
        self._failure = message
        error = RuntimeError(f"the engine stopped: {message}")
        for stream in self._streams.values():
            stream.put(error)
        if not self._failed.done():
            self._failed.set_result(message)

    def _last_words(self) -> str | None:
        try:
            with open(self._endpoints.last_words, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError:
            return None


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
