"""Server-sent events that abort their engine request when the client goes away."""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sglaunch.server.errors import ApiError

logger = logging.getLogger(__name__)

DONE_EVENT = "data: [DONE]\n\n"
# `responses=` of a route that streams with "stream": true (documented in the OpenAPI schema)
STREAMED_OK = {200: {"description": "The result; with \"stream\": true, server-sent events ending "
                                    "in data: [DONE]",
                     "content": {"application/json": {}, "text/event-stream": {}}}}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that always closes its body generator.

    NOTE: Starlette stops iterating on disconnect but leaves the generator open (it would only
    be closed by the garbage collector). Closing it here runs the generators' `finally` blocks
    at once, which abort the engine request and free its KV pages.
    """

    def __init__(self, content: AsyncIterator[str]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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


async def guarded_events(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Relay SSE strings; an error mid-stream becomes an error event, then [DONE]."""
    try:
        async for event in events:
            yield event
    except ApiError as exc:
        yield sse(exc.body())
    except Exception as exc:  # noqa: BLE001 - never break the stream without telling the client
        logger.exception("Error while streaming")
        yield sse(ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}").body())
    finally:
        await events.aclose()
    yield DONE_EVENT
