"""The server's shared state: starting, ready (engine attached) or shutting down."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import Request

from sglaunch.server.errors import ApiError
from sglaunch.server.generation import ServerContext
from sglaunch.server.metrics import ServerMetrics


@dataclass
class ServerState:
    """What every route reads; `ctx` is set once the engine is ready."""

    served_model_name: str
    model_path: str
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    ctx: ServerContext | None = None
    static_info: dict = field(default_factory=dict)  # config facts for /server_info
    shutting_down: bool = False
    max_body_bytes: int = 8 * 2**20  # request bodies over this get 413 (--max-request-body-mb)
    created: int = field(default_factory=lambda: int(time.time()))
    worker: dict = field(default_factory=dict)  # this HTTP worker: index, count, pid

    @property
    def ready(self) -> bool:
        return self.ctx is not None and not self.shutting_down

    def context(self) -> ServerContext:
        """The engine context, or a 503 while the server starts or stops."""
        if self.shutting_down:
            raise ApiError(503, "The server is shutting down.", code="shutting_down")
        if self.ctx is None:
            raise ApiError(503, "The server is starting; the model is still loading.",
                           code="starting")
        return self.ctx

    def check_model(self, name: str | None) -> str:
        """The served model name; 404 for a model this server does not serve."""
        if name is None or name in (self.served_model_name, self.model_path):
            return self.served_model_name
        raise ApiError(404, f"The model '{name}' does not exist; this server serves "
                            f"'{self.served_model_name}'.", param="model", code="model_not_found")


def server_state(request: Request) -> ServerState:
    return request.app.state.sglaunch


async def unless_disconnected(request: Request, awaitable, poll_seconds: float = 0.25):
    """Await `awaitable`; cancel it (aborting its engine requests) if the client disconnects."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_seconds)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ApiError(499, "Client closed the request.", error_type="client_closed")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
