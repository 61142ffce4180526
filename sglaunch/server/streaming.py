"""Server-sent events that abort their engine request when the client goes away."""

from __future__ import annotations

import json
import logging
import math
from typing import Any, AsyncIterator

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sglaunch.server.errors import ApiError

logger = logging.getLogger(__name__)

try:  # NOTE: several times faster than json per chunk; the stdlib is the fallback
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency of sglaunch[engine]
    orjson = None

DONE_EVENT = b"data: [DONE]\n\n"
# the server's own `send`, which the app puts in the scope before any middleware wraps it
# (app.SglaunchApp): an event stream sends its events straight through it
RAW_SEND_KEY = "sglaunch.raw_send"
# `responses=` of a route that streams with "stream": true (documented in the OpenAPI schema)
STREAMED_OK = {200: {"description": "The result; with \"stream\": true, server-sent events ending "
                                    "in data: [DONE]",
                     "content": {"application/json": {}, "text/event-stream": {}}}}


# NOTE: JSON escapes the control characters but not U+0085, U+2028 and U+2029, which
# str.splitlines (and httpx's iter_lines, which many SSE readers use) take for line breaks: a
# token that decodes to one of them cut its event in two for such a reader. Escaped, every
# event is one line for any reader, and still the same JSON.
_LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def _line_safe(data: bytes) -> bytes:
    if b"\xe2\x80" in data or b"\xc2\x85" in data:
        for raw, escaped in _LINE_BREAKS:
            data = data.replace(raw, escaped)
    return data


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON, every Unicode line break escaped. NOTE: orjson writes NaN and
    infinities as null; json writes them as NaN / -Infinity, so values holding any keep going
    through json (a logprob of -inf stays -Infinity, as before)."""
    if orjson is not None:
        try:
            return _line_safe(orjson.dumps(value))
        except TypeError:  # e.g. an int past 64 bits, a non-str key: json handles those
            pass
    return _line_safe(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def json_bytes_exact(value: Any, floats: tuple = ()) -> bytes:
    """json_bytes, unless `floats` (values inside `value`) hold a NaN or an infinity."""
    if orjson is not None and all(f is None or math.isfinite(f) for f in floats):
        return json_bytes(value)
    return _line_safe(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def sse(payload: dict, floats: tuple = ()) -> bytes:
    """One server-sent event; `floats`: the payload's float values that may be non-finite."""
    return b"data: " + json_bytes_exact(payload, floats) + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that always closes its body generator.

    NOTE: Starlette stops iterating on disconnect but leaves the generator open (it would only
    be closed by the garbage collector). Closing it here runs the generators' `finally` blocks
    at once, which abort the engine request and free its KV pages.

    The events are guarded in the send loop itself: an error mid-stream becomes an error event,
    then [DONE], as after a normal end (issue 15: a relaying generator would be one more in the
    chain resumed once per token per stream).
    """

    def __init__(self, content: AsyncIterator[bytes]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._event_send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # NOTE: the response start goes through the middleware's `send` (they note that the
        # response has started); the events past it skip their pass-through wrappers (three
        # coroutines per chunk, issue 15)
        self._event_send = scope.get(RAW_SEND_KEY)
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away while we were sending
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        send = self._event_send or send
        events = self.body_iterator
        next_event = events.__anext__
        while True:
            try:
                chunk = await next_event()
            except StopAsyncIteration:
                break
            except ApiError as exc:  # NOTE: the error event, then [DONE]
                await send({"type": "http.response.body", "body": sse(exc.body()), "more_body": True})
                break
            except Exception as exc:  # noqa: BLE001 - never break the stream without telling the client
                logger.exception("Error while streaming")
                body = sse(ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}").body())
                await send({"type": "http.response.body", "body": body, "more_body": True})
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await events.aclose()
        # NOTE: [DONE] and the end of the body in one write
        await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})
