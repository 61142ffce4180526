"""One streamed request against an OpenAI-compatible endpoint, timed from the SSE events."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglaunch.bench.workload import BenchRequest


@dataclass
class SamplingSettings:
    """The request fields every benchmark request shares."""

    model: str
    temperature: float = 0.0
    top_p: float | None = None  # sent only when set (the server's default is 1: no filter)
    ignore_eos: bool = True


@dataclass
class RequestResult:
    """Timings in seconds; `error_kind` is http, timeout, transport or stream when it failed."""

    ok: bool = False
    error: str | None = None
    error_kind: str | None = None
    start: float = 0.0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    input_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache (usage)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def request_body(request: BenchRequest, settings: SamplingSettings, max_tokens: int | None = None) -> dict:
    body: dict[str, Any] = {
        "model": settings.model, "max_tokens": max_tokens or request.output_len,
        "temperature": settings.temperature, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if settings.top_p is not None:
        body["top_p"] = settings.top_p
    if settings.ignore_eos:
        body["ignore_eos"] = True  # SGLang/vLLM extension: exact output lengths
    if request.messages is not None:
        body["messages"] = request.messages
    else:
        body["prompt"] = request.prompt
    return body


def endpoint_of(request: BenchRequest) -> str:
    return "/v1/chat/completions" if request.messages is not None else "/v1/completions"


def chunk_text(event: dict) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or delta.get("reasoning_content") or ""
    return choice.get("text") or ""


def error_message(status: int, body: bytes) -> str:
    try:
        detail = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = body.decode(errors="replace").strip()[:200]
    return f"HTTP {status}: {detail}" if detail else f"HTTP {status}"


class StreamFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


async def send(client: httpx.AsyncClient, request: BenchRequest, settings: SamplingSettings,
               max_tokens: int | None = None) -> RequestResult:
    """POST one streamed request; never raises for server or network failures."""
    result = RequestResult(start=time.perf_counter())
    try:
        await stream_into(client, request, settings, max_tokens, result)
        result.ok = True
    except StreamFailure as exc:
        result.error, result.error_kind = str(exc), exc.kind
    except httpx.TimeoutException as exc:
        result.error, result.error_kind = f"timeout ({type(exc).__name__})", "timeout"
    except httpx.HTTPError as exc:
        result.error, result.error_kind = f"{type(exc).__name__}: {exc}".rstrip(": "), "transport"
    result.e2e = time.perf_counter() - result.start
    return result


async def stream_into(client: httpx.AsyncClient, request: BenchRequest, settings: SamplingSettings,
                      max_tokens: int | None, result: RequestResult) -> None:
    body = request_body(request, settings, max_tokens)
    async with client.stream("POST", endpoint_of(request), json=body) as response:
        if response.status_code != 200:
            raise StreamFailure("http", error_message(response.status_code, await response.aread()))
        done, chunks, last = False, 0, result.start
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            event = parse_event(payload)
            if chunk_text(event):
                now = time.perf_counter()
                if result.ttft is None:
                    result.ttft = now - result.start
                else:
                    result.itls.append(now - last)
                last, chunks = now, chunks + 1
            record_usage(event, result)
        if not done:
            raise StreamFailure("stream", "the stream ended before `data: [DONE]`")
        if not result.output_tokens:
            result.output_tokens = chunks  # no usage chunk: one token per content chunk


def parse_event(payload: str) -> dict:
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        raise StreamFailure("stream", f"malformed server-sent event: {payload[:80]!r}") from None
    if not isinstance(event, dict):
        raise StreamFailure("stream", f"malformed server-sent event: {payload[:80]!r}")
    if "error" in event:
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise StreamFailure("stream", f"error event mid-stream: {message}")
    return event


def record_usage(event: dict, result: RequestResult) -> None:
    usage = event.get("usage")
    if isinstance(usage, dict):
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        if usage.get("prompt_tokens") is not None:
            result.input_tokens = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            result.cached_tokens = int(details["cached_tokens"])
