"""One request through the engine: token ids in, text deltas out.

`stream_text` drives `AsyncEngine.generate`, detokenizes incrementally, applies stop strings
and aborts the engine request whenever it ends early: a stop string matched, the client went
away (the task is cancelled), or anything raised. Routes format the deltas for their API.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import AsyncIterator

from sglaunch.engine.interface import AsyncEngine, GenerateRequest, SamplingParams, TokenOutput
from sglaunch.server.errors import ApiError, bad_request
from sglaunch.server.metrics import ServerMetrics
from sglaunch.server.tokenizer import IncrementalDetokenizer, ServerTokenizer, StopStringMatcher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request, ready for the engine."""

    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True


@dataclass(slots=True)  # NOTE: not frozen: one per streamed chunk, and a frozen __init__ costs
class TextDelta:
    """New text (and the tokens behind it) since the previous delta of one request."""

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last delta
    matched_stop: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: tuple[float, ...] = ()  # of token_ids, when the engine reports them

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def new_request_id(prefix: str = "") -> str:
    """32 random hex digits (128 bits from os.urandom, as unguessable as uuid4's 122, at a third
    of its cost: two ids a request)."""
    return f"{prefix}{os.urandom(16).hex()}"


@dataclass
class ServerContext:
    """What routes need to run a request: engine, tokenizer, limits, metrics, and the engine
    requests in flight (which a shutdown drains, then aborts)."""

    engine: AsyncEngine
    tokenizer: ServerTokenizer
    context_length: int
    metrics: ServerMetrics
    vocab_size: int
    inflight: dict[int, str] = field(default_factory=dict)  # id(GenerateRequest) -> rid
    closed: bool = False  # the drain is over: no new engine request starts
    _inflight_changed: asyncio.Event = field(default_factory=asyncio.Event)

    # ---- off the event loop: tokenizing a long prompt must not stall other clients
    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # NOTE: always on a worker thread, short texts too: the backend's encode_batch releases the
        # GIL, so the event loop's thread (what a saturated server is held by) keeps serving; on
        # the loop, prompts of up to 2,048 characters cost that thread 23.7 -> 30.0 us a streamed
        # token (session 20, http_frontend_ceiling.py, held-out code prompts, 3 pairs)
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)

    async def render_chat(self, messages: list[dict], **kwargs) -> str:
        return await asyncio.to_thread(self.tokenizer.render_chat, messages, **kwargs)

    # ---- requests in flight
    def _track(self, request: GenerateRequest) -> None:
        if self.closed:
            raise ApiError(503, "The server is shutting down.", code="shutting_down")
        self.inflight[id(request)] = request.rid
        self._inflight_changed.set()

    def _untrack(self, request: GenerateRequest) -> None:
        self.inflight.pop(id(request), None)
        self._inflight_changed.set()

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no engine request is in flight; False if `timeout` seconds pass first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.inflight:
            self._inflight_changed.clear()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(self._inflight_changed.wait(), left)
            except asyncio.TimeoutError:
                return not self.inflight
        return True

    async def abort_inflight(self) -> None:
        """End every request in flight now: each gets finish_reason "abort" as its last output."""
        for rid in set(self.inflight.values()):
            await _abort_quietly(self.engine, rid)

    def check_length(self, prompt_tokens: int, max_new_tokens: int | None,
                     param: str = "max_tokens") -> int:
        """Validate the prompt against the context length; return the max new tokens to use."""
        if prompt_tokens == 0:
            raise bad_request("The prompt is empty.", param="prompt")
        if prompt_tokens >= self.context_length:
            raise bad_request(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({self.context_length} tokens).", param="prompt", code="context_length_exceeded")
        if max_new_tokens is None:
            return self.context_length - prompt_tokens
        if prompt_tokens + max_new_tokens > self.context_length:
            raise bad_request(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens: {prompt_tokens} in the prompt plus "
                f"{max_new_tokens} to generate ('{param}'); lower '{param}' or shorten the prompt.",
                param=param, code="context_length_exceeded")
        return max_new_tokens

    def check_token_ids(self, input_ids: list[int], param: str = "prompt") -> None:
        vocab = self.vocab_size
        if not input_ids or (min(input_ids) >= 0 and max(input_ids) < vocab):
            return
        token_id = next(t for t in input_ids if not 0 <= t < vocab)
        raise bad_request(f"Invalid value for '{param}': token id {token_id} is outside the "
                          f"vocabulary (0..{vocab - 1}).", param=param, code="invalid_value")

    def stop_token_ids(self, extra: list[int] | None, ignore_eos: bool) -> tuple[int, ...]:
        """Request stop ids plus the tokenizer's EOS (the engine adds the model's own EOS ids)."""
        self.check_token_ids(list(extra or ()), param="stop_token_ids")
        ids = list(extra or ())
        eos = self.tokenizer.eos_token_id
        if not ignore_eos and eos is not None and eos not in ids:
            ids.append(eos)
        return tuple(ids)


async def stream_text(ctx: ServerContext, request: PreparedRequest) -> AsyncIterator[TextDelta]:
    """Generate one request; yields text deltas, the last with `finish_reason` set.

    NOTE: one async generator over the engine's stream (issue 15: every generator between the
    engine client and the socket is resumed once per token per stream); the engine's
    ValueError / RuntimeError become a 400 / 500 exactly where the engine raises them."""
    engine_request = GenerateRequest(request.rid, request.input_ids, request.sampling)
    ctx._track(engine_request)
    tracker = ctx.metrics.track(len(request.input_ids))
    engine_done = False
    outputs = None
    try:
        detokenizer = IncrementalDetokenizer(ctx.tokenizer, request.input_ids, request.skip_special_tokens)
        stops = StopStringMatcher(request.stop)
        outputs = await _engine_stream(ctx.engine, engine_request)
        next_output = outputs.__anext__
        on_tokens = tracker.on_tokens
        while True:
            try:
                output = await next_output()
            except StopAsyncIteration:
                break
            except ValueError as exc:
                raise bad_request(str(exc)) from exc
            except RuntimeError as exc:  # the engine stopped (a rank died) or could not take the request
                raise ApiError(500, f"The engine failed: {exc}", code="engine_error",
                               error_type="server_error") from exc
            if output.error is not None:  # the engine failed on this request (and only on it)
                raise ApiError(500, f"The engine could not run this request: {output.error}",
                               code="engine_error", error_type="server_error")
            new_ids = output.new_token_ids
            on_tokens(len(new_ids))
            text = stops.feed(detokenizer.add(new_ids))
            finished = output.finished
            if stops.matched is None and finished:
                text += stops.feed(detokenizer.flush())
                text += "" if stops.matched else stops.flush()
            if stops.matched is not None:
                delta = _delta(output, text, "stop", stops.matched)
            elif finished:
                delta = _delta(output, text, _finish_reason(output), _matched_token(output))
            elif text or new_ids:
                yield _delta(output, text, None, None)
                continue
            else:
                continue
            # NOTE: settle before yielding; the consumer may not resume us
            engine_done = finished
            tracker.finish(delta.finish_reason, delta.completion_tokens, delta.cached_tokens)
            if not engine_done:  # a stop string ended it: the engine is still generating
                await _abort_quietly(ctx.engine, request.rid)
                engine_done = True
            yield delta
            return
        raise RuntimeError(f"engine stream of request {request.rid} ended without a finished output")
    finally:
        if outputs is not None and hasattr(outputs, "aclose"):
            await outputs.aclose()
        if not engine_done:
            await _abort_quietly(ctx.engine, request.rid)
            tracker.finish("abort", None, 0)
        ctx._untrack(engine_request)


def _delta(output: TokenOutput, text: str, reason: str | None, matched) -> TextDelta:
    return TextDelta(text, tuple(output.new_token_ids), output.prompt_tokens,
                     output.completion_tokens, output.cached_tokens, reason, matched,
                     tuple(output.logprobs))


def _finish_reason(output: TokenOutput) -> str:
    return output.finish_reason or "stop"


def _matched_token(output: TokenOutput) -> int | None:
    if output.finish_reason == "stop" and output.new_token_ids:
        return output.new_token_ids[-1]
    return None


async def _engine_stream(engine: AsyncEngine, request: GenerateRequest):
    """The engine's output stream; ValueError (a request the engine refuses) becomes a 400."""
    try:
        stream = engine.generate(request)
        if inspect.isawaitable(stream):
            stream = await stream
        return stream.__aiter__()
    except ValueError as exc:
        raise bad_request(str(exc)) from exc
    except RuntimeError as exc:  # the engine stopped (a rank died) or could not take the request
        raise ApiError(500, f"The engine failed: {exc}", code="engine_error",
                       error_type="server_error") from exc


async def _abort_quietly(engine: AsyncEngine, rid: str) -> None:
    """Abort a request even while our own task is being cancelled."""
    try:
        await asyncio.shield(engine.abort(rid))
    except asyncio.CancelledError:
        pass
    except Exception:  # noqa: BLE001 - abort must never turn into a client-visible error
        logger.exception("Aborting request %s failed", rid)


async def first_then_rest(deltas: AsyncIterator[TextDelta]) -> AsyncIterator[TextDelta]:
    """Pull the first delta now, so errors become HTTP errors before a stream starts."""
    iterator = deltas.__aiter__()
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration as exc:
        raise ApiError(500, "The engine returned no output.", error_type="server_error") from exc
    except BaseException:
        await iterator.aclose()
        raise
    return _FirstThenRest(first, iterator)


class _FirstThenRest:
    """`first`, then the rest of `iterator`, whose steps it hands out as they are (no generator
    of its own in between: issue 15, once per token per stream); aclose() closes `iterator`."""

    __slots__ = ("_first", "_iterator", "_started")

    def __init__(self, first: TextDelta, iterator):
        self._first, self._iterator, self._started = first, iterator, False

    def __aiter__(self):
        return self

    def __anext__(self):
        if self._started:
            return self._iterator.__anext__()
        self._started = True
        return _ready(self._first)

    async def aclose(self) -> None:
        self._started = True
        self._first = None
        await self._iterator.aclose()


async def _ready(value):
    return value


async def collect_text(ctx: ServerContext, request: PreparedRequest) -> TextDelta:
    """Run a request to the end; one TextDelta with all text and token ids."""
    texts, token_ids, logprobs = [], [], []
    async with contextlib.aclosing(stream_text(ctx, request)) as deltas:
        async for delta in deltas:
            texts.append(delta.text)
            token_ids.extend(delta.token_ids)
            logprobs.extend(delta.logprobs)
            if delta.finished:
                return TextDelta("".join(texts), tuple(token_ids), delta.prompt_tokens,
                                 delta.completion_tokens, delta.cached_tokens,
                                 delta.finish_reason, delta.matched_stop, tuple(logprobs))
    raise RuntimeError("generation ended without a finished delta")


async def run_all(ctx: ServerContext, prepared: list[PreparedRequest]) -> list[TextDelta]:
    """Run requests concurrently; if one fails or we are cancelled, abort the rest."""
    tasks = [asyncio.ensure_future(collect_text(ctx, request)) for request in prepared]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
