"""SGLang-native POST /generate: `text` or `input_ids`, one prompt or a batch, optional stream."""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request

from sglaunch.engine.interface import SamplingParams
from sglaunch.server.errors import bad_request, documented_errors
from sglaunch.server.generation import (
    PreparedRequest, ServerContext, TextDelta, first_then_rest, new_request_id, run_all,
    stream_text,
)
from sglaunch.server.protocol import NativeGenerateRequest, NativeSamplingParams, stop_strings
from sglaunch.server.state import server_state, unless_disconnected
from sglaunch.server.streaming import STREAMED_OK, EventStreamResponse, sse

router = APIRouter()


@router.post("/generate", responses={**STREAMED_OK, **documented_errors(400, 401, 413, 500, 503)})
async def generate(body: NativeGenerateRequest, request: Request):
    ctx = server_state(request).context()
    prompts, is_batch = await _prompts(ctx, body)
    rids = _request_ids(body.rid, len(prompts))
    prepared = [_prepare(ctx, ids, body.sampling_params, rid) for ids, rid in zip(prompts, rids)]
    start = time.perf_counter()
    if body.stream:
        if is_batch:
            raise bad_request("Streaming supports one prompt per request.", param="text")
        deltas = await first_then_rest(stream_text(ctx, prepared[0]))
        events = _events(deltas, prepared[0], start, body.return_logprob)
        return EventStreamResponse(events)
    results = await unless_disconnected(request, run_all(ctx, prepared))
    bodies = [_result_body(result, req, start, body.return_logprob)
              for result, req in zip(results, prepared)]
    return bodies if is_batch else bodies[0]


async def _prompts(ctx: ServerContext, body: NativeGenerateRequest) -> tuple[list[list[int]], bool]:
    """Token ids of each prompt, and whether the request was a batch."""
    if (body.text is None) == (body.input_ids is None):
        raise bad_request("Pass exactly one of 'text' or 'input_ids'.", param="text")
    if body.text is not None:
        texts = [body.text] if isinstance(body.text, str) else body.text
        return [await ctx.encode(text) for text in texts], not isinstance(body.text, str)
    ids = body.input_ids
    batch = bool(ids) and isinstance(ids[0], list)
    prompts = ids if batch else [ids]
    for prompt in prompts:
        ctx.check_token_ids(prompt, param="input_ids")
    return [list(p) for p in prompts], batch


def _request_ids(rid: str | list[str] | None, count: int) -> list[str]:
    if rid is None:
        return [new_request_id() for _ in range(count)]
    rids = [rid] if isinstance(rid, str) else list(rid)
    if len(rids) != count:
        raise bad_request(f"'rid' names {len(rids)} requests but {count} prompts were given.",
                          param="rid")
    return rids


def _prepare(ctx: ServerContext, input_ids: list[int], params: NativeSamplingParams,
             rid: str) -> PreparedRequest:
    max_new_tokens = ctx.check_length(len(input_ids), params.max_new_tokens,
                                      param="sampling_params.max_new_tokens")
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=params.temperature, top_p=params.top_p,
        top_k=params.top_k, min_p=params.min_p,
        seed=params.seed if params.seed is not None else params.sampling_seed,
        stop_token_ids=ctx.stop_token_ids(params.stop_token_ids, params.ignore_eos),
        ignore_eos=params.ignore_eos)
    return PreparedRequest(rid, tuple(input_ids), sampling, stop_strings(params.stop),
                           params.skip_special_tokens)


def _finish_reason(delta: TextDelta, request: PreparedRequest) -> dict[str, Any] | None:
    """SGLang's finish_reason object: {"type": "stop", "matched": ...} or {"type": "length", ...}."""
    if delta.finish_reason is None:
        return None
    if delta.finish_reason == "length":
        return {"type": "length", "length": request.sampling.max_new_tokens}
    if delta.finish_reason == "stop":
        return {"type": "stop", "matched": delta.matched_stop}
    return {"type": delta.finish_reason}


def _meta_info(delta: TextDelta, request: PreparedRequest, start: float,
               logprobs: list | None) -> dict[str, Any]:
    meta = {"id": request.rid, "finish_reason": _finish_reason(delta, request),
            "prompt_tokens": delta.prompt_tokens, "completion_tokens": delta.completion_tokens,
            "cached_tokens": delta.cached_tokens, "e2e_latency": time.perf_counter() - start}
    if logprobs is not None:
        meta["output_token_logprobs"] = logprobs
    return meta


def _logprob_triples(delta: TextDelta) -> list[list]:
    """SGLang's output_token_logprobs: [logprob, token_id, None] per output token."""
    return [[logprob, token_id, None] for logprob, token_id in zip(delta.logprobs, delta.token_ids)]


def _result_body(result: TextDelta, request: PreparedRequest, start: float,
                 with_logprobs: bool) -> dict[str, Any]:
    logprobs = _logprob_triples(result) if with_logprobs else None
    return {"text": result.text, "output_ids": list(result.token_ids),
            "meta_info": _meta_info(result, request, start, logprobs)}


async def _events(deltas: AsyncIterator[TextDelta], request: PreparedRequest, start: float,
                  with_logprobs: bool) -> AsyncIterator[bytes]:
    """SGLang streams the cumulative text, output ids (and logprobs) in every event."""
    text, output_ids, logprobs = "", [], []
    try:
        async for delta in deltas:
            text += delta.text
            output_ids.extend(delta.token_ids)
            logprobs.extend(_logprob_triples(delta))
            meta = _meta_info(delta, request, start, list(logprobs) if with_logprobs else None)
            yield sse({"text": text, "output_ids": list(output_ids), "meta_info": meta},
                      tuple(triple[0] for triple in logprobs) if with_logprobs else ())
    finally:
        await deltas.aclose()
