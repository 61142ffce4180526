"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from fastapi import APIRouter, Request

from sglaunch.engine.interface import SamplingParams
from sglaunch.server.errors import bad_request, documented_errors
from sglaunch.server.generation import (
    PreparedRequest, ServerContext, TextDelta, collect_text, first_then_rest, new_request_id,
    run_all,
    stream_text,
)
from sglaunch.server.protocol import (
    ChatCompletionRequest, CompletionRequest, OpenAISampling, stop_strings,
)
from sglaunch.server.state import server_state, unless_disconnected
from sglaunch.server.streaming import STREAMED_OK, EventStreamResponse, json_bytes, sse
from sglaunch.server.tokenizer import ServerTokenizer

router = APIRouter()

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
RESERVED_TEMPLATE_KWARGS = {"messages", "add_generation_prompt", "bos_token", "eos_token",
                            "pad_token", "unk_token"}


@dataclass(frozen=True)
class ResponseMeta:
    """The fields every response object and chunk of one request repeats."""

    id: str
    model: str
    created: int

    def envelope(self, object_type: str, **fields: Any) -> dict[str, Any]:
        return {"id": self.id, "object": object_type, "created": self.created,
                "model": self.model, **fields}


# a string no text holds: where a chunk's text goes in its pre-encoded template
_TEXT_MARK = f"\x00sglaunch-text-{uuid.uuid4().hex}\x00"


class TextChunk:
    """The server-sent event of a plain text chunk (no logprobs, not the last), pre-encoded
    around its one varying field: `chunk(text)` == sse(payload with that text), byte for byte
    (issue 15: once per token per stream; the JSON around the text never changes).

    `payload`: the chunk's payload with _TEXT_MARK where the text goes.
    """

    __slots__ = ("_prefix", "_suffix", "_payload")

    def __init__(self, payload: dict[str, Any]):
        parts = sse(payload).split(json_bytes(_TEXT_MARK))
        self._payload = payload
        self._prefix, self._suffix = (parts[0], parts[1]) if len(parts) == 2 else (None, None)

    def __call__(self, text: str) -> bytes:
        if self._prefix is None:  # pragma: no cover - the mark was not found once: the plain way
            return sse(_replace_mark(self._payload, text))
        return self._prefix + json_bytes(text) + self._suffix


def _replace_mark(value, text: str):
    if value == _TEXT_MARK:
        return text
    if isinstance(value, dict):
        return {k: _replace_mark(v, text) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_mark(v, text) for v in value]
    return value


@dataclass(frozen=True)
class Logprobs:
    """Chosen-token log-probabilities in OpenAI's completion and chat shapes (None when off).

    NOTE: tokens are shown as their text decoded alone, so a token holding part of a UTF-8
    character shows as U+FFFD; there are no top alternatives (the engine reports none).
    """

    tokenizer: ServerTokenizer
    enabled: bool

    def wanted_for(self, delta: TextDelta) -> bool:
        return self.enabled and bool(delta.token_ids)

    def completion(self, delta: TextDelta) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        return {"tokens": self._tokens(delta), "token_logprobs": list(delta.logprobs),
                "top_logprobs": None, "text_offset": None}

    def chat(self, delta: TextDelta) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        return {"content": [{"token": token, "logprob": logprob, "bytes": list(token.encode()),
                             "top_logprobs": []}
                            for token, logprob in zip(self._tokens(delta), delta.logprobs)]}

    def floats(self, delta: TextDelta) -> tuple:
        """The floats a chunk of `delta` carries (for sse's NaN / infinity check)."""
        return delta.logprobs if self.enabled else ()

    def _tokens(self, delta: TextDelta) -> list[str]:
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in delta.token_ids]


# ---------------------------------------------------------------- routes


@router.get("/v1/models", responses=documented_errors(401))
async def list_models(request: Request) -> dict:
    state = server_state(request)
    ctx = state.ctx
    model = {"id": state.served_model_name, "object": "model", "created": state.created,
             "owned_by": "sglaunch", "root": state.model_path}
    if ctx is not None:
        model["max_model_len"] = ctx.context_length
    return {"object": "list", "data": [model]}


@router.post("/v1/completions", responses={**STREAMED_OK, **documented_errors(400, 401, 404, 413, 500, 503)})
async def create_completion(body: CompletionRequest, request: Request):
    state = server_state(request)
    ctx = state.context()
    meta = ResponseMeta(new_request_id("cmpl-"), state.check_model(body.model), int(time.time()))
    max_tokens = body.max_tokens or DEFAULT_COMPLETION_TOKENS
    logprobs = Logprobs(ctx.tokenizer, body.logprobs is not None)
    prepared = [_prepare(ctx, await _prompt_ids(ctx, prompt), body, max_tokens)
                for prompt in _split_prompts(body.prompt)]
    if body.stream:
        if len(prepared) != 1:
            raise bad_request("Streaming supports one prompt per request.", param="prompt")
        deltas = await first_then_rest(stream_text(ctx, prepared[0]))
        events = _completion_events(deltas, meta, logprobs, body.include_usage())
        return EventStreamResponse(events)
    results = await unless_disconnected(request, run_all(ctx, prepared))
    choices = [_completion_choice(index, result, logprobs) for index, result in enumerate(results)]
    return meta.envelope("text_completion", choices=choices, usage=_usage(results))


@router.post("/v1/chat/completions",
             responses={**STREAMED_OK, **documented_errors(400, 401, 404, 413, 500, 503)})
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    state = server_state(request)
    ctx = state.context()
    meta = ResponseMeta(new_request_id("chatcmpl-"), state.check_model(body.model), int(time.time()))
    prepared = _prepare(ctx, await _chat_prompt_ids(ctx, body), body, body.max_new_tokens())
    logprobs = Logprobs(ctx.tokenizer, body.logprobs)
    if body.stream:
        deltas = await first_then_rest(stream_text(ctx, prepared))
        events = _chat_events(deltas, meta, logprobs, body.include_usage())
        return EventStreamResponse(events)
    result = await unless_disconnected(request, collect_text(ctx, prepared))
    choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
              "logprobs": logprobs.chat(result), "finish_reason": result.finish_reason,
              "matched_stop": result.matched_stop}
    return meta.envelope("chat.completion", choices=[choice], usage=_usage([result]))


# ---------------------------------------------------------------- request preparation


def _split_prompts(prompt) -> list:
    """One prompt (text or token ids) or a batch of them, as a list of prompts."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


async def _prompt_ids(ctx: ServerContext, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return await ctx.encode(prompt)
    ctx.check_token_ids(prompt)
    return list(prompt)


async def _chat_prompt_ids(ctx: ServerContext, body: ChatCompletionRequest) -> list[int]:
    messages = [message.template_dict() for message in body.messages]
    kwargs = {k: v for k, v in (body.chat_template_kwargs or {}).items()
              if k not in RESERVED_TEMPLATE_KWARGS}
    continue_final = body.continue_final_message
    try:
        text = await ctx.render_chat(
            messages, add_generation_prompt=body.add_generation_prompt and not continue_final,
            **kwargs)
    except Exception as exc:  # noqa: BLE001 - template errors are the client's messages
        raise bad_request(f"Could not apply the chat template: {exc}", param="messages") from exc
    if continue_final:
        text = _cut_after_final_message(text, messages[-1]["content"])
    return await ctx.encode(text, add_special_tokens=False)


def _cut_after_final_message(text: str, final_content: str) -> str:
    """Drop what the template writes after the last message (its end-of-turn marker)."""
    index = text.rfind(final_content) if final_content else -1
    return text if index == -1 else text[:index + len(final_content)]


def _prepare(ctx: ServerContext, input_ids: Sequence[int], body: OpenAISampling,
             max_tokens: int | None) -> PreparedRequest:
    param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
    max_new_tokens = ctx.check_length(len(input_ids), max_tokens, param=param)
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k, min_p=body.min_p, seed=body.seed,
        stop_token_ids=ctx.stop_token_ids(body.stop_token_ids, body.ignore_eos),
        ignore_eos=body.ignore_eos)
    return PreparedRequest(new_request_id(), tuple(input_ids), sampling, stop_strings(body.stop),
                           body.skip_special_tokens)


# ---------------------------------------------------------------- response formatting


def _usage(results: Sequence[TextDelta]) -> dict[str, Any]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)}}


def _completion_choice(index: int, delta: TextDelta, logprobs: Logprobs) -> dict[str, Any]:
    return {"index": index, "text": delta.text, "logprobs": logprobs.completion(delta),
            "finish_reason": delta.finish_reason,
            "matched_stop": delta.matched_stop if delta.finished else None}


def _usage_event(meta: ResponseMeta, kind: str, delta: TextDelta) -> bytes:
    """A stream's closing usage event (stream_options.include_usage), from its last delta."""
    return sse(meta.envelope(kind, choices=[], usage=_usage([delta])))


async def _completion_events(deltas: AsyncIterator[TextDelta], meta: ResponseMeta,
                             logprobs: Logprobs, include_usage: bool) -> AsyncIterator[bytes]:
    last = None
    plain = None if logprobs.enabled else TextChunk(meta.envelope("text_completion", choices=[
        {"index": 0, "text": _TEXT_MARK, "logprobs": None, "finish_reason": None, "matched_stop": None}]))
    try:
        async for delta in deltas:
            last = delta
            if plain is not None and delta.text and delta.finish_reason is None:
                yield plain(delta.text)
            elif delta.text or delta.finished or logprobs.wanted_for(delta):
                choice = _completion_choice(0, delta, logprobs)
                chunk = sse(meta.envelope("text_completion", choices=[choice]), logprobs.floats(delta))
                if delta.finished and include_usage:  # NOTE: the last two events in one write
                    chunk += _usage_event(meta, "text_completion", delta)
                    last = None
                yield chunk
    finally:
        await deltas.aclose()
    if include_usage and last is not None:
        yield _usage_event(meta, "text_completion", last)


def _chat_chunk(meta: ResponseMeta, delta: dict, finish_reason: str | None = None,
                matched_stop=None, logprobs: dict | None = None, floats: tuple = ()) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
              "matched_stop": matched_stop}
    return sse(meta.envelope("chat.completion.chunk", choices=[choice]), floats)


async def _chat_events(deltas: AsyncIterator[TextDelta], meta: ResponseMeta, logprobs: Logprobs,
                       include_usage: bool) -> AsyncIterator[bytes]:
    last = None
    plain = None if logprobs.enabled else TextChunk(meta.envelope("chat.completion.chunk", choices=[
        {"index": 0, "delta": {"content": _TEXT_MARK}, "logprobs": None, "finish_reason": None,
         "matched_stop": None}]))
    try:  # NOTE: the role event too: closed while it is out, the request must still be aborted
        yield _chat_chunk(meta, {"role": "assistant", "content": ""})
        async for delta in deltas:
            last = delta
            if plain is not None:
                if delta.text:
                    yield plain(delta.text)
            elif delta.text or logprobs.wanted_for(delta):
                yield _chat_chunk(meta, {"content": delta.text}, logprobs=logprobs.chat(delta),
                                  floats=logprobs.floats(delta))
            if delta.finished:
                chunk = _chat_chunk(meta, {}, delta.finish_reason, delta.matched_stop)
                if include_usage:  # NOTE: the last two events in one write
                    chunk += _usage_event(meta, "chat.completion.chunk", delta)
                    last = None
                yield chunk
    finally:
        await deltas.aclose()
    if include_usage and last is not None:
        yield _usage_event(meta, "chat.completion.chunk", last)
