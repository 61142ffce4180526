"""`run_server`: boot the engine behind the HTTP server and run until SIGINT/SIGTERM.

Order on node 0: bind the port (fail fast before loading weights), serve HTTP at once
(/health answers 503), start the engine process, attach it (routes go live), log the URL, then
wait for a signal or the engine process dying (every open request gets its error, exit 1).
On a signal: stop admitting (503 on /health and new requests, the port stays open), let
running requests finish for up to --graceful-shutdown-timeout, abort the rest (each ends with
finish_reason "abort"), stop HTTP, then shut the engine process down.
Nodes with `node_rank > 0` only host engine ranks. With `--tokenizer-worker-num N > 1` the
launcher (`server/workers.py`) binds the port, spawns the engine process and N HTTP worker
processes that accept on that one socket, each running `_serve` below with its own event loop,
tokenizer and pipes to the engine process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from pathlib import Path

import uvicorn

from sglaunch.logs import configure_logging
from sglaunch.config import EngineConfig
from sglaunch.engine.heap import freeze_startup_heap
from sglaunch.errors import SglaunchError
from sglaunch.server.app import create_app
from sglaunch.server.generation import ServerContext
from sglaunch.server.metrics import PrometheusMetrics, ServerMetrics
from sglaunch.server.state import ServerState
from sglaunch.server.tokenizer import ServerTokenizer, load_tokenizer

logger = logging.getLogger("sglaunch.server")

HTTP_CLOSE_SECONDS = 5  # after the drain: responses still being written get this long
ABORT_SETTLE_SECONDS = 10  # aborted requests get this long to send their last event
FATAL_SETTLE_SECONDS = 3  # a dying engine: open streams get this long to send their error event
ENGINE_SHUTDOWN_SECONDS = 60
ENGINE_SETTLE_SECONDS = 300  # a stop during start-up waits this long for loading to finish
DEFAULT_CONTEXT_LENGTH = 4096  # only when neither the config nor the checkpoint says


def run_server(config: EngineConfig) -> int:
    """Serve `config`'s model over HTTP (node 0) or host its engine ranks (other nodes)."""
    configure_logging(config.log_level)
    if config.node_rank > 0:
        from sglaunch.engine.launch import run_worker_node

        return run_worker_node(config)
    if config.tokenizer_worker_num > 1:
        from sglaunch.server.workers import run_workers

        return run_event_loop(run_workers(config))
    return run_event_loop(_serve(config))


def run_event_loop(main):
    """asyncio.run(main) on uvloop's event loop when it is installed (a dependency of
    sglaunch[engine]): the front end's per-token work (a wake-up and a socket write per chunk
    per stream) runs on it; else on asyncio's."""
    if _loop_factory() is None:
        return asyncio.run(main)
    import uvloop

    return uvloop.run(main)


def _loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _http_protocol() -> str:
    """httptools' parser when installed (uvicorn's C-backed protocol; h11 is pure Python and
    costs several times more per streamed chunk), else h11."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


async def _serve(config: EngineConfig, seat=None) -> int:
    """The HTTP server in this process: the whole server (seat None), or one HTTP worker
    (`seat`, a `workers.WorkerSeat`: the launcher's socket and engine process)."""
    tokenizer = load_tokenizer(config.tokenizer_path, config.chat_template)
    state = _initial_state(config, seat)
    server = _HttpServer(uvicorn.Config(
        create_app(state), log_level=config.log_level, lifespan="off", http=_http_protocol(),
        timeout_graceful_shutdown=HTTP_CLOSE_SECONDS, access_log=config.log_level == "debug"))
    stop = _StopSignal(server, state)
    sock = _bind(config.host, config.port) if seat is None else seat.sock
    http_task = asyncio.create_task(server.serve(sockets=[sock]))
    # NOTE: a worker's signals come from the launcher (SIGTERM, once per SIGINT/SIGTERM it gets)
    with stop.installed((signal.SIGINT, signal.SIGTERM) if seat is None else (signal.SIGTERM,)):
        try:
            engine = await _start_engine(config, stop, http_task, seat)
        except BaseException:
            await _stop_http(server, http_task)
            raise
        if engine is None:  # a signal arrived while the engine was starting
            await _stop_http(server, http_task)
            return 0
        state.ctx = ctx = _server_context(engine, tokenizer, config, state.metrics)
        freeze_startup_heap()  # NOTE: streaming allocates per token: see engine/heap.py
        if seat is None:
            logger.info("The server is ready: %s (model '%s')", _url(config), config.served_model_name)
        exit_code = await _wait_until_stopped(stop, http_task, engine)
        state.shutting_down = True
        if exit_code == 0:
            await _drain(ctx, config.graceful_shutdown_timeout, stop)
        else:  # NOTE: every open request has its error by now; let the responses go out
            await _let_requests_end(state, server)
        await _stop_http(server, http_task)
        return max(exit_code, await _shutdown_engine(engine))


async def _drain(ctx: ServerContext, timeout: float, stop: "_StopSignal") -> None:
    """Let running requests finish for up to `timeout` s (a second signal cuts it short), then
    abort the rest: each ends with finish_reason "abort" (then [DONE] for streams)."""
    if ctx.inflight:
        logger.info("Draining %d running request(s) for up to %g s (--graceful-shutdown-timeout).",
                    len(ctx.inflight), timeout)
    idle = asyncio.create_task(ctx.wait_idle(timeout))
    again = asyncio.create_task(stop.again.wait())
    await asyncio.wait({idle, again}, return_when=asyncio.FIRST_COMPLETED)
    for task in (idle, again):
        task.cancel()
    ctx.closed = True  # NOTE: from here on nothing new reaches the engine
    if not ctx.inflight:
        return
    logger.warning("Aborting %d request(s) still running after the drain.", len(ctx.inflight))
    await ctx.abort_inflight()
    if not await ctx.wait_idle(ABORT_SETTLE_SECONDS):
        logger.warning("%d aborted request(s) did not end within %d s.", len(ctx.inflight),
                       ABORT_SETTLE_SECONDS)


async def _let_requests_end(state: ServerState, server: uvicorn.Server) -> None:
    """Wait (bounded) until the engine requests have ended and uvicorn has sent every response."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FATAL_SETTLE_SECONDS
    if state.ctx is not None:
        await state.ctx.wait_idle(FATAL_SETTLE_SECONDS)
    while server.server_state.tasks and loop.time() < deadline:
        await asyncio.sleep(0.01)


class _HttpServer(uvicorn.Server):
    """uvicorn without its own signal handlers.

    NOTE: uvicorn re-raises captured signals when `serve` returns (SIGTERM would then kill the
    process before the engine is shut down), so `_StopSignal` owns SIGINT/SIGTERM instead.
    """

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _StopSignal:
    """SIGINT/SIGTERM: stop admitting and drain; a second signal ends the drain at once (the
    running requests get their abort event), a third drops open connections.

    NOTE: the HTTP server keeps listening while requests drain, so a load balancer sees /health
    answer 503 instead of a refused connection.
    """

    def __init__(self, server: uvicorn.Server, state: ServerState):
        self._server = server
        self._state = state
        self.event = asyncio.Event()
        self.again = asyncio.Event()

    def trigger(self, sig: signal.Signals) -> None:
        if self.again.is_set():  # a third signal: drop open connections at once
            self._server.force_exit = True
            return
        if self.event.is_set():
            logger.info("Received %s again; aborting the running requests now.", sig.name)
            self.again.set()
            return
        logger.info("Received %s; shutting down.", sig.name)
        self._state.shutting_down = True
        self.event.set()

    @contextlib.contextmanager
    def installed(self, signals: tuple = (signal.SIGINT, signal.SIGTERM)):
        loop = asyncio.get_running_loop()
        try:
            for sig in signals:
                loop.add_signal_handler(sig, self.trigger, sig)
        except (NotImplementedError, RuntimeError):  # not the main thread (e.g. tests), or Windows
            signals = ()
        try:
            yield self
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)


def _initial_state(config: EngineConfig, seat=None) -> ServerState:
    metrics = (PrometheusMetrics(config.served_model_name, multiprocess_dir=seat and seat.metrics_dir)
               if config.enable_metrics else ServerMetrics())
    worker = {"index": seat.index if seat else 0, "count": config.tokenizer_worker_num, "pid": os.getpid()}
    return ServerState(served_model_name=config.served_model_name, model_path=config.model_path,
                       api_key=config.api_key, metrics=metrics, static_info=config.to_dict(),
                       max_body_bytes=max(1, int(config.max_request_body_mb * 2**20)), worker=worker)


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """Bind the listening socket now, so a busy port fails before any weights load (with
    `reuse_port`, one of several sockets on the port, each handed its share of connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SglaunchError(f"Cannot listen on {host}:{port}: {exc.strerror}",
                            hint="Pick a free port with --port, or stop the process using it.") from exc
    sock.set_inheritable(True)
    return sock


async def _start_engine(config: EngineConfig, stop: _StopSignal, http_task: asyncio.Task, seat=None):
    """The started engine, or None when a signal (or the HTTP server ending) came first."""
    engine_task = asyncio.create_task(_engine_starting(config, seat))
    stop_task = asyncio.create_task(stop.event.wait())
    await asyncio.wait({engine_task, stop_task, http_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()
    if engine_task.done():
        try:
            return engine_task.result()
        except ValueError as exc:  # start_engine's refusal of a checkpoint or configuration
            raise SglaunchError(f"The engine cannot start: {exc}") from exc
        except RuntimeError as exc:  # the engine process failed or died while starting
            raise SglaunchError(f"The engine failed to start: {exc}", exit_code=1,
                                hint="The engine process logged the cause above.") from exc
    if seat is None:
        await _settle_and_shut_down(engine_task)
    else:  # NOTE: the launcher owns the engine process; a worker only stops waiting for it
        engine_task.cancel()
        await asyncio.gather(engine_task, return_exceptions=True)
    if http_task.done() and not stop.event.is_set():
        http_task.result()  # re-raise why uvicorn stopped
        raise SglaunchError("The HTTP server stopped while the engine was starting.")
    return None


async def _engine_starting(config: EngineConfig, seat):
    """Start the engine process (seat None), or attach a worker to the launcher's."""
    if seat is None:
        from sglaunch.engine.launch import start_engine  # torch-free: the engine has its own process

        return await start_engine(config)
    from sglaunch.engine.engine_client import EngineClient

    engine = EngineClient.attached(config, seat.endpoints, seat.index, seat.engine_pid)
    await engine.start()
    return engine


async def _settle_and_shut_down(engine_task: asyncio.Task) -> None:
    """A stop arrived while the engine was loading: let the start settle, then shut it down.

    NOTE: the engine process reads no command while it loads; letting it finish and stop its
    ranks itself is the clean way out. If loading hangs, leave (the engine process ends itself
    once this process is gone).
    """
    logger.info("Stopping: waiting for the engine to finish loading, then shutting it down.")
    try:
        engine = await asyncio.wait_for(asyncio.shield(engine_task), ENGINE_SETTLE_SECONDS)
    except asyncio.TimeoutError:
        logger.error("The engine did not finish loading within %d s; exiting without cleanup.",
                     ENGINE_SETTLE_SECONDS)
        logging.shutdown()
        os._exit(1)
    except Exception:  # noqa: BLE001 - the start failed on its own: nothing to shut down
        return
    await _shutdown_engine(engine)


async def _wait_until_stopped(stop: _StopSignal, http_task: asyncio.Task, engine) -> int:
    """Block until a signal (exit 0), the HTTP server ending on its own or the engine process
    dying (exit 1).

    NOTE: a dead engine process (killed, crashed, or ended by a dead tensor-parallel rank) has
    already handed every open request its error when `wait_failed` returns.
    """
    signal_task = asyncio.create_task(stop.event.wait())
    engine_task = asyncio.create_task(engine.wait_failed())
    await asyncio.wait({signal_task, http_task, engine_task}, return_when=asyncio.FIRST_COMPLETED)
    signal_task.cancel()
    engine_task.cancel()
    if engine_task.done() and not engine_task.cancelled():
        logger.error("The engine stopped: %s; shutting the server down.", engine_task.result())
        return 1
    if not stop.event.is_set():
        logger.error("The HTTP server stopped unexpectedly.")
        return 1
    return 0


async def _stop_http(server: uvicorn.Server, http_task: asyncio.Task) -> None:
    server.should_exit = True
    try:
        await asyncio.wait_for(http_task, HTTP_CLOSE_SECONDS + 5)
    except asyncio.TimeoutError:
        server.force_exit = True
        logger.warning("HTTP server did not stop in time; dropping open connections.")
    except Exception:  # noqa: BLE001 - shutting down anyway; keep going to stop the engine
        logger.exception("HTTP server failed while stopping")


async def _shutdown_engine(engine) -> int:
    try:
        await asyncio.wait_for(engine.shutdown(), ENGINE_SHUTDOWN_SECONDS)
    except asyncio.TimeoutError:
        logger.error("The engine did not shut down within %ss.", ENGINE_SHUTDOWN_SECONDS)
        return 1
    except RuntimeError as exc:  # the engine process failed (e.g. it died while requests drained)
        logger.error("The engine failed: %s", exc)
        return 1
    except Exception:  # noqa: BLE001 - report, and exit non-zero
        logger.exception("Engine shutdown failed")
        return 1
    if getattr(engine, "owner", True):  # NOTE: an HTTP worker only let go of the launcher's engine
        logger.info("Engine shut down.")
    return 0


def _server_context(engine, tokenizer: ServerTokenizer, config: EngineConfig,
                    metrics: ServerMetrics) -> ServerContext:
    info = engine.server_info() or {}
    checkpoint = _checkpoint_config(config.model_path)
    context_length = (info.get("context_length") or config.context_length
                      or checkpoint.get("max_position_embeddings") or DEFAULT_CONTEXT_LENGTH)
    vocab_size = info.get("vocab_size") or checkpoint.get("vocab_size") or tokenizer.vocab_size
    return ServerContext(engine, tokenizer, int(context_length), metrics, int(vocab_size))


def _checkpoint_config(model_path: str) -> dict:
    """The checkpoint's config.json (the text config of multimodal wrappers), or {}."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return config.get("text_config", config) if isinstance(config, dict) else {}


def _url(config: EngineConfig) -> str:
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{config.port}"
