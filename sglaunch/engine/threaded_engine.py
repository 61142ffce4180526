"""AsyncEngine for the HTTP server: LLMEngine on a background thread.

The thread owns every torch object (it also loads the model), so the asyncio loop only ever
queues commands and receives TokenOutputs; a long forward pass never blocks the server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from typing import Any, AsyncIterator

import sglaunch
from sglaunch.config import EngineConfig
from sglaunch.engine.interface import GenerateRequest, TokenOutput

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0
# a step that fails with no request to blame fails its running requests; this many in a row
# means the engine itself is broken (e.g. a sticky device error), which ends the process
MAX_CONSECUTIVE_STEP_FAILURES = 3


class _Stream:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[TokenOutput | BaseException] = asyncio.Queue()


class ThreadedEngine:
    """Implements sglaunch.engine.interface.AsyncEngine."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.engine = None
        self.cluster = None
        self._inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._static: dict = {}
        self._live: dict = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sglaunch-engine", daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started: asyncio.Future = self._loop.create_future()
        self._thread.start()
        await self._started

    async def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._inbox.put(("shutdown",))
        await asyncio.to_thread(self._thread.join, SHUTDOWN_TIMEOUT_S)

    # ---- AsyncEngine --------------------------------------------------------------------
    def check_request(self, request: GenerateRequest) -> None:
        """Raise ValueError now for a request generate() would refuse (prompt too long, ...)."""
        if self.engine is None or self._stopped:
            raise RuntimeError("the engine is not running")
        self.engine.scheduler.check(len(request.input_ids), request.sampling.max_new_tokens)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenOutput]:
        """Stream a request's outputs; a refused request raises ValueError at the first
        iteration, before any output."""
        self.check_request(request)
        stream = _Stream()
        with self._lock:
            if request.rid in self._streams:
                raise ValueError(f"request id {request.rid!r} is already in use")
            self._streams[request.rid] = stream
        self._inbox.put(("add", request))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            with self._lock:
                self._streams.pop(request.rid, None)
            if not finished:  # consumer went away (client disconnected): free its pages
                self._inbox.put(("abort", request.rid))

    async def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def server_info(self) -> dict:
        config = {k: v for k, v in self.config.to_dict().items() if k != "api_key"}  # never leak it
        return {
            **config,
            "version": sglaunch.__version__,
            **self._static,
            **self._live,
        }

    # ---- the engine thread --------------------------------------------------------------
    def _run(self) -> None:
        from sglaunch.engine.launch import create_engine

        try:
            # debugging aid: stretch start-up to exercise stops that arrive while loading
            time.sleep(float(os.environ.get("SGLAUNCH_DEBUG_ENGINE_START_DELAY_S", "0")))
            self.engine, self.cluster = create_engine(self.config)
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            self._loop.call_soon_threadsafe(_settle, self._started, exc)
            return
        self._static = self.engine.static_info()
        self._live = self.engine.live_stats()
        from sglaunch.engine.watchdog import before_fatal_exit

        # NOTE: a dead rank ends the process; every open stream first gets the reason
        before_fatal_exit(lambda message: self._deliver_error(RuntimeError(f"the engine stopped: {message}")))
        self._loop.call_soon_threadsafe(_settle, self._started, None)
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - the engine cannot continue
            self._deliver_error(RuntimeError(f"the engine failed: {exc!r}"))
            self.cluster.fail(exc)

    def _serve(self) -> None:
        from sglaunch.engine.distributed import KEEPALIVE_S

        while True:
            idle = not self.engine.has_work
            try:
                command = self._inbox.get(timeout=KEEPALIVE_S) if idle else self._inbox.get_nowait()
            except queue.Empty:
                if idle:
                    self.engine.keepalive()
                    continue
                command = None
            if command is not None and not self._handle(command):
                self.cluster.stop(self.engine)
                return
            while not self._inbox.empty():  # drain everything queued so far
                if not self._handle(self._inbox.get_nowait()):
                    self.cluster.stop(self.engine)
                    return
            outputs = self._step() if self.engine.has_work else []
            # NOTE: stats first, so a client that sees its last token also sees the counts
            self._live = self.engine.live_stats()
            self._deliver(outputs)

    def _step(self) -> list[TokenOutput]:
        """One engine step; on one rank, a failed step fails the requests it ran, not the engine."""
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._failed_steps = getattr(self, "_failed_steps", 0) + 1
            if self.engine.tp.size > 1 or self._failed_steps >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise  # NOTE: ranks may be out of step, or the engine is broken: end the process
            logger.exception("An engine step failed; failing the requests it ran")
            return self.engine.fail_running(exc)
        self._failed_steps = 0
        return outputs

    def _handle(self, command: tuple[Any, ...]) -> bool:
        """Apply one queued command; False means shut down."""
        kind = command[0]
        if kind == "add":
            request = command[1]
            try:
                self._deliver(self.engine.add_request(request))
            except ValueError as exc:
                self._deliver_to(request.rid, exc)
            except Exception as exc:  # noqa: BLE001 - one request's failure, not the engine's
                logger.exception("Could not add request %s", request.rid)
                self._deliver_to(request.rid, RuntimeError(f"the engine could not add the request: {exc!r}"))
        elif kind == "abort":
            out = self.engine.abort(command[1])
            if out is not None:
                self._deliver([out])
        elif kind == "shutdown":
            return False
        return True

    def _deliver(self, outputs: list[TokenOutput]) -> None:
        if outputs:
            self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _deliver_to(self, rid: str, error: BaseException) -> None:
        self._loop.call_soon_threadsafe(self._dispatch_error, rid, error)

    def _deliver_error(self, error: BaseException) -> None:
        with self._lock:
            rids = list(self._streams)
        for rid in rids:
            self._deliver_to(rid, error)

    # ---- on the event loop --------------------------------------------------------------
    def _dispatch(self, outputs: list[TokenOutput]) -> None:
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.rid)
                if stream is not None:
                    stream.queue.put_nowait(out)

    def _dispatch_error(self, rid: str, error: BaseException) -> None:
        with self._lock:
            stream = self._streams.get(rid)
        if stream is not None:
            stream.queue.put_nowait(error)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
