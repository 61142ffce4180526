"""The FastAPI application: OpenAI and SGLang-native routes, health, info, metrics, cache flush, auth."""

from __future__ import annotations

import hmac
import inspect
import json
import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import sglaunch
from sglaunch.server import native_api, openai_api
from sglaunch.server.errors import ApiError, ErrorResponse, documented_errors, error_response, install_error_handlers
from sglaunch.server.protocol import ChatCompletionRequest, CompletionRequest
from sglaunch.server.state import ServerState, server_state
from sglaunch.server.streaming import RAW_SEND_KEY

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health"})
# an oversized body is read and dropped up to this much before the 413 goes out
DISCARD_FACTOR, DISCARD_MIN_BYTES = 8, 64 * 2**20
SECRET_CONFIG_KEYS = frozenset({"api_key"})


def create_app(state: ServerState, fast_routes: bool = True) -> FastAPI:
    """Build the app; routes answer 503 until `state.ctx` is set (engine ready). fast_routes=False:
    every request through FastAPI's own handling (the reference FastPostRoutes is tested against)."""
    app = SglaunchApp(title="sglaunch", version=sglaunch.__version__, **_lenient_json_bodies())
    app.state.sglaunch = state
    install_error_handlers(app)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    _add_info_routes(app)
    # NOTE: the last middleware added runs first: the key is checked before any body is read, and
    # the fast routes (added first: innermost) see a body already within the limit
    if fast_routes:
        app.add_middleware(FastPostRoutes, routes={
            "/v1/chat/completions": (ChatCompletionRequest, openai_api.create_chat_completion),
            "/v1/completions": (CompletionRequest, openai_api.create_completion),
        })
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.max_body_bytes)
    if state.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.api_key)
    _openapi_without_422(app)
    return app


class SglaunchApp(FastAPI):
    """FastAPI, with the server's own `send` in the scope (streaming.RAW_SEND_KEY): event streams
    send their events through it, past the middleware's pass-through wrappers."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND_KEY] = send
        await super().__call__(scope, receive, send)


def _openapi_without_422(app: FastAPI) -> None:
    """FastAPI documents a 422 for every body; this server answers bad bodies with 400."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _lenient_json_bodies() -> dict[str, Any]:
    """Parse JSON bodies sent without a Content-Type header, as FastAPI (and SGLang) long did.

    NOTE: newer FastAPI releases refuse them unless strict_content_type=False.
    """
    if "strict_content_type" in inspect.signature(FastAPI.__init__).parameters:
        return {"strict_content_type": False}
    return {}


class FastPostRoutes:
    """POST routes answered here, past Starlette's router and FastAPI's request handling, when the
    request is an ordinary one: a JSON body (Content-Type application/json) that parses and
    validates against the route's model. The endpoint then runs as FastAPI would run it (the same
    function, the validated model and a Request; an ApiError it raises answered by the same error
    response, any other exception left to the server-error handler). Anything else (another
    content type, a body that does not parse or validate, every other route) goes the normal way
    with the same body, so each refusal is FastAPI's own answer, byte for byte.

    Why: on a streaming request FastAPI's routing, dependency solving and exit stack took about a
    tenth of the event loop's samples (py-spy, benchmarks/http_frontend_ceiling.py, session 20);
    skipping them saved about 2% of the server's CPU a token there, and the server's CPU is what
    holds the HTTP row of issue 15 on a slow host."""

    def __init__(self, app: ASGIApp, routes: dict[str, tuple[type, Any]]):
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:  # NOTE: BodyLimitMiddleware (outside) hands the body over as one message
            message = await receive()
            if message["type"] != "http.request":  # the client went away before sending it all
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        model, endpoint = route
        try:
            data = json.loads(body)
            parsed = model.model_validate(data) if isinstance(data, dict) else None
        except (ValueError, ValidationError):  # NOTE: json's errors are ValueErrors
            parsed = None
        if parsed is None:
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            result = await endpoint(parsed, Request(scope, receive))
        except ApiError as exc:
            result = error_response(exc)
        if not isinstance(result, Response):
            result = JSONResponse(jsonable_encoder(result))
        await result(scope, receive, send)


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives `body` (already read) as the one request message, then whatever the
    client sends next (only http.disconnect from then on)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class ApiKeyMiddleware:
    """Require `Authorization: Bearer <api_key>` on every route except /health.

    A plain ASGI middleware (not BaseHTTPMiddleware), so streaming and disconnect detection
    pass through untouched.
    """

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(ApiError(
            401, "Invalid or missing API key: send 'Authorization: Bearer <api key>'.",
            code="invalid_api_key"))
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or ())
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)


class BodyLimitMiddleware:
    """Refuse a request body over `max_bytes` with 413, before any of it is parsed.

    A declared Content-Length over the limit is refused without parsing the body; otherwise the
    body is read (at most `max_bytes`), then handed to the app as one message.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._discard_rest(receive, 0, int(declared))
            await self._refuse(int(declared), scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before sending it all
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                more = message.get("more_body", False)
                chunks.clear()
                if more:
                    await self._discard_rest(receive, size, None)
                await self._refuse(None, scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _discard_rest(self, receive: Receive, size: int, declared: int | None) -> None:
        """Read (and drop) what the client is still sending, so it gets to read the 413 instead of
        a reset connection; past DISCARD_FACTOR times the limit the connection is just closed."""
        budget = max(DISCARD_MIN_BYTES, DISCARD_FACTOR * self.max_bytes)
        if declared is not None and declared > budget:
            return
        while size <= budget:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _refuse(self, size: int | None, scope: Scope, receive: Receive, send: Send) -> None:
        limit_mb = self.max_bytes / 2**20
        got = f" ({size / 2**20:.1f} MiB)" if size is not None else ""
        response = error_response(ApiError(
            413, f"The request body{got} is larger than this server accepts ({limit_mb:g} MiB); "
            "send a shorter prompt, or start the server with a larger --max-request-body-mb.",
            code="request_too_large"))
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


FLUSH_CACHE_ERRORS = {
    400: {"model": ErrorResponse, "description": "Requests are running or waiting: nothing was flushed; "
                                                 "retry once the server is idle (code `requests_in_flight`)"},
    **documented_errors(401, 500, 503),
}


def _add_info_routes(app: FastAPI) -> None:
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)  # one operation id each
    app.add_api_route("/server_info", get_server_info, methods=["GET"])
    app.add_api_route("/get_server_info", deprecated_get_server_info, methods=["GET"],
                      deprecated=True)
    app.add_api_route("/model_info", get_model_info, methods=["GET"])
    app.add_api_route("/get_model_info", get_model_info, methods=["GET"], deprecated=True)
    app.add_api_route("/metrics", metrics, methods=["GET"])
    # SGLang accepts both methods; one route each (one operation id each in the schema)
    for method in ("POST", "GET"):
        app.add_api_route("/flush_cache", flush_cache, methods=[method], name=f"flush_cache_{method.lower()}",
                          responses=FLUSH_CACHE_ERRORS)


async def health(request: Request) -> Response:
    """200 when the engine is ready, 503 while starting or shutting down."""
    state = server_state(request)
    if state.ready:
        return Response(status_code=200)
    message = "shutting down" if state.shutting_down else "starting"
    return error_response(ApiError(503, f"The server is {message}.", code=message.replace(" ", "_")))


async def get_server_info(request: Request) -> JSONResponse:
    """The resolved configuration plus the engine's live state (KV usage, queue, ...)."""
    state = server_state(request)
    info = _without_secrets(state.static_info)
    info["version"] = sglaunch.__version__
    info["sglang_version"] = sglaunch.SGLANG_RELEASE
    info["status"] = "ready" if state.ready else ("shutting_down" if state.shutting_down else "starting")
    info["internal_states"] = [_without_secrets(state.ctx.engine.server_info())] if state.ctx else []
    info["tokenizer_worker"] = state.worker  # which HTTP worker process answered
    return JSONResponse(info)


def _without_secrets(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in SECRET_CONFIG_KEYS}


async def deprecated_get_server_info(request: Request) -> JSONResponse:
    logger.warning("/get_server_info is deprecated; use /server_info.")
    return await get_server_info(request)


async def get_model_info(request: Request) -> dict[str, Any]:
    state = server_state(request)
    info: dict[str, Any] = {
        "model_path": state.model_path,
        "tokenizer_path": state.static_info.get("tokenizer_path", state.model_path),
        "served_model_name": state.served_model_name,
        "is_generation": True,
    }
    if state.ctx is not None:
        info["context_length"] = state.ctx.context_length
        info["vocab_size"] = state.ctx.vocab_size
    return info


async def flush_cache(request: Request) -> dict[str, Any]:
    """Empty the engine's prefix (radix) cache, as SGLang's /flush_cache: every cached page goes
    back to the KV pool, so later prompts are computed anew (benchmarks that must not reuse the
    last run's prompts). Only while no request runs or waits: otherwise 400 and nothing changes."""
    ctx = server_state(request).context()
    try:
        result = await ctx.engine.flush_cache()
    except RuntimeError as exc:  # the engine stopped or is stopping
        raise ApiError(503, f"The cache was not flushed: {exc}.", code="engine_error") from None
    if result.get("error"):
        raise ApiError(500, f"The engine could not flush the cache: {result['error']}", code="engine_error")
    if not result.get("flushed"):
        running, waiting = result.get("running", 0), result.get("waiting", 0)
        busy = (f"{running + waiting} request(s) in flight ({running} running, {waiting} waiting)"
                if running + waiting else "a step is still in flight")
        raise ApiError(400, f"Cache not flushed: {busy}; the prefix cache is flushed only when no request "
                            "runs or waits. Retry once the server is idle.", code="requests_in_flight")
    return {"message": "Cache flushed.", **{k: v for k, v in result.items() if k != "flushed"}}


async def metrics(request: Request) -> Response:
    """Prometheus exposition text; 404 unless the server runs with --enable-metrics."""
    state = server_state(request)
    if not state.metrics.enabled:
        raise ApiError(404, "Metrics are disabled; start the server with --enable-metrics.")
    engine_info = state.ctx.engine.server_info() if state.ctx else {}
    body, content_type = state.metrics.render(engine_info)
    return Response(body, media_type=content_type)
