"""`--tokenizer-worker-num N > 1`: N HTTP worker processes in front of one engine process.

The launcher (this process) checks the port is free, listens on it with one SO_REUSEPORT socket
per worker, spawns the engine process (it owns it, as the one HTTP server does with N = 1) and
N worker processes, each handed its socket. The kernel spreads new connections over the
sockets by a hash of their addresses.

NOTE: one socket shared by every worker balances badly: an idle worker's event loop accepts
every connection queued at the moment it wakes (a burst of 64 went 58 / 6 on two workers);
SO_REUSEPORT's hash goes about even, and a dead worker's socket leaves the group with it. Where
the platform has no SO_REUSEPORT, the workers share one socket.

Each worker runs the whole HTTP server of `launch._serve`: its own event loop, tokenizer,
metrics and pipe pair to the engine process (`EngineClient.attached`). The launcher serves no
request itself.

Lifecycle: SIGINT/SIGTERM reaching the launcher is passed on to every worker as SIGTERM (a
worker ignores SIGINT, so Ctrl+C on the process group counts once); each drains its requests
as the single server does (a second signal aborts them, a third drops connections). Once every
worker has exited, the launcher shuts the engine down. A dead engine process ends every worker
(each gives its open requests the reason and exits 1) and the launcher exits 1; a dead worker
ends the server too: the engine aborts its requests, the other workers drain, exit 1. Workers
and the engine process end themselves when the launcher is gone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass

from sglaunch.config import EngineConfig
from sglaunch.engine import ipc
from sglaunch.engine.engine_process import watch_parent
from sglaunch.errors import SglaunchError
from sglaunch.server import launch

logger = logging.getLogger("sglaunch.server")

LISTEN_BACKLOG = 2048  # uvicorn's default; connections wait here until a worker accepts them
WORKER_KILL_GRACE_S = 5.0  # a worker asked to stop that does not: killed after its budget plus this
PARENT_POLL_S = 0.5


@dataclass(frozen=True)
class WorkerSeat:
    """What one HTTP worker process gets from the launcher."""

    index: int
    count: int
    sock: socket.socket  # NOTE: pickled by multiprocessing as the descriptor itself (spawn)
    endpoints: ipc.Endpoints
    engine_pid: int
    launcher_pid: int
    metrics_dir: str | None  # prometheus-client's multiprocess folder, with --enable-metrics


async def run_workers(config: EngineConfig) -> int:
    """Serve `config` with `config.tokenizer_worker_num` HTTP worker processes; the exit code."""
    socks = _listen(config.host, config.port, config.tokenizer_worker_num)
    metrics_dir = tempfile.mkdtemp(prefix="sglaunch-metrics-") if config.enable_metrics else None
    if metrics_dir is not None:  # NOTE: read by prometheus-client when a worker imports it
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return await _Launcher(config, socks, metrics_dir).run()
    finally:
        for sock in socks:
            sock.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _listen(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on host:port (one each worker), or one shared socket.

    NOTE: the port is first bound alone (no SO_REUSEPORT), so one that any other process holds
    fails here, before any weights load, instead of silently sharing its connections."""
    probe = launch._bind(host, port)
    if not hasattr(socket, "SO_REUSEPORT"):
        probe.listen(LISTEN_BACKLOG)
        return [probe] * count
    probe.close()
    socks = []
    try:
        for _ in range(count):
            socks.append(launch._bind(host, port, reuse_port=True))
            socks[-1].listen(LISTEN_BACKLOG)  # NOTE: connections wait here until their worker runs
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


class _Launcher:
    """The engine process and the worker processes, from start to exit."""

    def __init__(self, config: EngineConfig, socks: list[socket.socket], metrics_dir: str | None):
        self.config, self.socks, self.metrics_dir = config, socks, metrics_dir
        self.workers: list = []
        self.stopping = False  # the workers were asked to stop: their exits are expected
        self.signals = 0
        self.stop = asyncio.Event()  # a signal arrived
        self.worker_died = asyncio.Event()
        self.dead: tuple[int, int | None] | None = None  # (index, exit code) of the first to die
        self.exited: dict[int, asyncio.Event] = {}

    async def run(self) -> int:
        from sglaunch.engine.engine_client import EngineClient

        engine = EngineClient(self.config, workers=self.config.tokenizer_worker_num)
        with self._signals_installed():
            engine.launch()
            try:
                self._spawn_workers(engine)
                started = await self._start(engine)
            except BaseException:
                self._kill_workers()
                raise
            if started is not None:
                return started
            logger.info("The server is ready: %s (model '%s', %d HTTP worker processes)",
                        launch._url(self.config), self.config.served_model_name, len(self.workers))
            code = await self._serve_until_stopped(engine)
            return max(code, await launch._shutdown_engine(engine))

    # ---- start ----------------------------------------------------------------------------
    def _spawn_workers(self, engine) -> None:
        context = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        count = self.config.tokenizer_worker_num
        for index in range(count):
            seat = WorkerSeat(index, count, self.socks[index], engine.endpoints, engine.pid,
                              os.getpid(), self.metrics_dir)
            process = context.Process(target=worker_main, name=f"sglaunch-http-{index}",
                                      args=(self.config, seat), daemon=True)
            process.start()  # NOTE: the child has its own copy of the socket from here on
            if self.socks[index] is not self.socks[-1] or index == count - 1:
                self.socks[index].close()  # a dead worker's socket then leaves the port's group
            self.workers.append(process)
            self.exited[index] = asyncio.Event()
            loop.add_reader(process.sentinel, self._on_worker_exit, index)

    async def _start(self, engine) -> int | None:
        """None once the engine is ready; else the exit code (a signal or a dead worker came
        first); raises SglaunchError when the engine cannot start."""
        ready = asyncio.create_task(engine.ready())
        stop = asyncio.create_task(self.stop.wait())
        died = asyncio.create_task(self.worker_died.wait())
        await asyncio.wait({ready, stop, died}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        died.cancel()
        if ready.done():
            try:
                ready.result()
                return None
            except ValueError as exc:
                raise SglaunchError(f"The engine cannot start: {exc}") from exc
            except RuntimeError as exc:
                raise SglaunchError(f"The engine failed to start: {exc}", exit_code=1,
                                    hint="The engine process logged the cause above.") from exc
        code = self._report_dead_worker() if self.dead is not None else 0
        await self._stop_workers()
        await launch._settle_and_shut_down(ready)
        return code

    # ---- running --------------------------------------------------------------------------
    async def _serve_until_stopped(self, engine) -> int:
        """Until a signal (0), a dead worker or a dead engine process (1), and every worker gone."""
        stop = asyncio.create_task(self.stop.wait())
        died = asyncio.create_task(self.worker_died.wait())
        failed = asyncio.create_task(engine.wait_failed())
        await asyncio.wait({stop, died, failed}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, died, failed):
            task.cancel()
        if failed.done() and not failed.cancelled():
            logger.error("The engine stopped: %s; shutting the server down.", failed.result())
            self.stopping = True  # NOTE: every worker sees it too, ends its requests and exits 1
            await self._wait_workers(launch.FATAL_SETTLE_SECONDS + 10)
            return 1
        code = 0
        if self.dead is not None and not self.stop.is_set():
            code = self._report_dead_worker()
            engine.drop_worker(self.dead[0])
        await self._stop_workers()
        failures = [p for p in self.workers if p.exitcode not in (0, None)]
        if code == 0 and failures:
            logger.error("%d HTTP worker process(es) exited with an error while stopping.", len(failures))
            code = 1
        return code

    def _report_dead_worker(self) -> int:
        index, exitcode = self.dead
        logger.error("HTTP worker %d (pid %s) exited unexpectedly with %s; shutting the server down.",
                     index, self.workers[index].pid, _describe(exitcode))
        return 1

    # ---- the worker processes -------------------------------------------------------------
    def _on_worker_exit(self, index: int) -> None:
        process = self.workers[index]
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join(1.0)
        self.exited[index].set()
        if self.dead is None and not self.stopping:
            self.dead = (index, process.exitcode)
            self.worker_died.set()

    def _signal_workers(self) -> None:
        for process in self.workers:
            if process.exitcode is None:
                try:
                    os.kill(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    async def _stop_workers(self) -> None:
        """Ask every worker to drain and exit (the SIGTERM a signal already sent counts)."""
        if not self.stopping:
            self.stopping = True
            if not self.stop.is_set():
                self._signal_workers()
        budget = (self.config.graceful_shutdown_timeout + launch.ABORT_SETTLE_SECONDS
                  + launch.HTTP_CLOSE_SECONDS + WORKER_KILL_GRACE_S)
        await self._wait_workers(budget)

    async def _wait_workers(self, timeout: float) -> None:
        waits = [event.wait() for event in self.exited.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except asyncio.TimeoutError:
            logger.error("HTTP worker process(es) did not exit within %g s; killing them.", timeout)
            self._kill_workers()

    def _kill_workers(self) -> None:
        for process in self.workers:
            if process.is_alive():
                process.kill()
        for process in self.workers:
            process.join(5)

    # ---- signals --------------------------------------------------------------------------
    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals == 1:
            logger.info("Received %s; shutting down.", sig.name)
        self.stopping = True
        self.stop.set()
        self._signal_workers()  # NOTE: each worker counts its own signals: drain, abort, drop

    def _signals_installed(self):
        import contextlib

        @contextlib.contextmanager
        def installed():
            loop = asyncio.get_running_loop()
            signals = (signal.SIGINT, signal.SIGTERM)
            for sig in signals:
                loop.add_signal_handler(sig, self._on_signal, sig)
            try:
                yield
            finally:
                for sig in signals:
                    loop.remove_signal_handler(sig)

        return installed()


def worker_main(config: EngineConfig, seat: WorkerSeat) -> None:
    """Entry point of an HTTP worker process (spawned by the launcher)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # NOTE: the launcher passes Ctrl+C on as SIGTERM
    from sglaunch.logs import configure_logging

    configure_logging(config.log_level)
    watch_parent(seat.launcher_pid, "this HTTP worker")
    try:
        code = launch.run_event_loop(launch._serve(config, seat))
    except SglaunchError as exc:
        # NOTE: the engine could not start: the launcher says why and ends the workers; exiting
        # first would look like a dead worker to it
        logger.debug("HTTP worker %d: %s", seat.index, exc)
        threading.Event().wait()
        code = 1
    sys.exit(code)


def _describe(code: int | None) -> str:
    from sglaunch.engine.engine_client import _describe as describe

    return describe(code)
