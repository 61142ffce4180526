"""The front end's per-token path (issue 15): outputs coalesced when a stream is behind
reassemble to the same text, token ids, logprobs and finish as one token per output; server-sent
events are compact JSON that keeps non-finite logprobs as json writes them; the server runs on
uvloop and httptools when they are installed."""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest

from sglaunch.engine.engine_client import coalesce
from sglaunch.engine.interface import SamplingParams, TokenOutput
from sglaunch.server.generation import PreparedRequest, ServerContext, collect_text, stream_text
from sglaunch.server.metrics import ServerMetrics
from sglaunch.server.streaming import DONE_EVENT, sse
from sglaunch.server.tokenizer import load_tokenizer

from .checkpoints import build_tokenizer

TEXT = "Llama 🦙 says 你好, then Ωmega ✓ and ü. The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder)
    return load_tokenizer(folder)


class ScriptedEngine:
    """Replays given TokenOutputs for any request (front-end unit tests only)."""

    def __init__(self, outputs: list[TokenOutput]):
        self.outputs, self.aborted = outputs, []

    async def generate(self, request):
        for output in self.outputs:
            await asyncio.sleep(0)
            yield output

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    def server_info(self) -> dict:
        return {}


def per_token(ids: list[int], finish: str = "length") -> list[TokenOutput]:
    return [TokenOutput("r", (t,), i == len(ids) - 1, finish if i == len(ids) - 1 else None, 3, i + 1, 0,
                        None, (-0.25 * (i + 1),)) for i, t in enumerate(ids)]


def regrouped(outputs: list[TokenOutput], seed: int) -> list[TokenOutput]:
    """The same outputs merged as EngineClient merges a backlog: random runs, coalesce()."""
    rng, grouped, i = random.Random(seed), [], 0
    while i < len(outputs):
        n = rng.randint(1, 6)
        grouped += coalesce(outputs[i:i + n])
        i += n
    assert len(grouped) < len(outputs)
    return grouped


def deltas(tokenizer, outputs, stop=()):
    ctx = ServerContext(ScriptedEngine(outputs), tokenizer, 4096, ServerMetrics(), tokenizer.vocab_size)
    request = PreparedRequest("r", (5, 6, 7), SamplingParams(max_new_tokens=len(outputs)), tuple(stop))

    async def run():
        return [d async for d in stream_text(ctx, request)], await collect_text(ctx, request)

    return asyncio.run(run())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coalesced_outputs_reassemble_to_the_same_stream(tokenizer, seed):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    one, one_whole = deltas(tokenizer, per_token(ids))
    merged, merged_whole = deltas(tokenizer, regrouped(per_token(ids), seed))
    assert len(merged) < len(one)
    for got in (one, merged):
        assert "".join(d.text for d in got) == TEXT
        assert [t for d in got for t in d.token_ids] == ids
        assert [lp for d in got for lp in d.logprobs] == [-0.25 * (i + 1) for i in range(len(ids))]
        assert (got[-1].finish_reason, got[-1].completion_tokens, got[-1].prompt_tokens) == ("length", len(ids), 3)
        assert not any(d.finished for d in got[:-1])
    assert merged_whole == one_whole


@pytest.mark.parametrize("seed", [0, 3])
def test_a_stop_string_across_coalesced_outputs_cuts_at_the_same_place(tokenizer, seed):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    one, _ = deltas(tokenizer, per_token(ids), stop=["brown fox"])
    merged, _ = deltas(tokenizer, regrouped(per_token(ids), seed), stop=["brown fox"])
    expected = TEXT[:TEXT.index("brown fox")]
    assert "".join(d.text for d in one) == "".join(d.text for d in merged) == expected
    assert one[-1].finish_reason == merged[-1].finish_reason == "stop"
    assert one[-1].matched_stop == merged[-1].matched_stop == "brown fox"


def test_sse_is_compact_json_and_keeps_non_finite_floats_as_json_writes_them():
    payload = {"id": "x", "choices": [{"delta": {"content": "é 你好 \"q\"\n"}, "logprobs": [-0.5, -1e-9]}]}
    event = sse(payload, (-0.5, -1e-9))
    assert isinstance(event, bytes) and event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert json.loads(event[6:]) == payload
    assert "é 你好".encode() in event  # UTF-8, not \\u escapes
    odd = {"logprobs": [-math.inf, 0.0]}
    event = sse(odd, (-math.inf, 0.0))
    assert b"-Infinity" in event and json.loads(event[6:])["logprobs"][0] == -math.inf
    assert json.loads(sse({"n": 2**70})[6:]) == {"n": 2**70}  # past orjson's integers: json takes it
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_the_server_runs_on_uvloop_and_httptools_when_installed():
    pytest.importorskip("uvloop")
    pytest.importorskip("httptools")
    import uvloop

    from sglaunch.server.launch import _http_protocol, _loop_factory, run_event_loop

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert _loop_factory() is uvloop.new_event_loop
    assert run_event_loop(loop_module()).startswith("uvloop")
    assert _http_protocol() == "httptools"


def test_outputs_unpacked_from_a_step_event_equal_the_engines():
    import dataclasses

    from sglaunch.engine import ipc

    outputs = [TokenOutput("r1", (1, 2), True, "stop", 3, 2, 1, 2, (-0.1, -0.2), None),
               TokenOutput("r2", (7,), logprobs=(-1.5,)), TokenOutput("r3", (), True, "abort", error="boom")]
    event = ipc.decode(ipc.encode((ipc.STEP, ipc.pack_outputs(outputs), [], None)))
    back = [ipc.unpack_output(fields) for fields in event[1]]
    assert back == outputs and [repr(b) for b in back] == [repr(o) for o in outputs]
    assert [hash(b) for b in back] == [hash(o) for o in outputs]
    with pytest.raises(dataclasses.FrozenInstanceError):
        back[0].rid = "x"


@pytest.mark.parametrize("text", ["", "a", " hello", "quote \" back\\slash", "tab\tnew\nline\r\x00\x1f\x7f",
                                  TEXT, "\u2028\u2029", "</script>", "😀" * 3])
def test_pre_encoded_text_chunks_equal_sse_of_the_payload(text):
    """The pre-encoded plain chunks (issue 15) are byte for byte sse() of the chunk's payload."""
    from sglaunch.server.openai_api import _TEXT_MARK, ResponseMeta, TextChunk

    meta = ResponseMeta("chatcmpl-x\"y", "model \u00fc/\"q\"", 1700000000)

    def chat(content):
        return meta.envelope("chat.completion.chunk", choices=[
            {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None,
             "matched_stop": None}])

    def completion(content):
        return meta.envelope("text_completion", choices=[
            {"index": 0, "text": content, "logprobs": None, "finish_reason": None, "matched_stop": None}])

    for payload in (chat, completion):
        assert TextChunk(payload(_TEXT_MARK))(text) == sse(payload(text))


def test_a_stream_closed_after_its_first_delta_aborts_and_untracks(tokenizer):
    """first_then_rest's result, closed without being iterated, still ends the engine request."""
    from sglaunch.server.generation import first_then_rest

    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    engine = ScriptedEngine(per_token(ids))
    ctx = ServerContext(engine, tokenizer, 4096, ServerMetrics(), tokenizer.vocab_size)
    request = PreparedRequest("r", (5, 6, 7), SamplingParams(max_new_tokens=len(ids)))

    async def run():
        deltas = await first_then_rest(stream_text(ctx, request))
        assert ctx.inflight
        await deltas.aclose()

    asyncio.run(run())
    assert engine.aborted == ["r"] and not ctx.inflight


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_an_event_stream_closed_at_its_first_event_aborts_and_untracks(tokenizer, kind):
    """A client gone after the first event (the chat role event included): closing the event
    generator there ends the engine request at once, not whenever the garbage collector runs."""
    from sglaunch.server.generation import first_then_rest
    from sglaunch.server.openai_api import Logprobs, ResponseMeta, _chat_events, _completion_events

    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    engine = ScriptedEngine(per_token(ids))
    ctx = ServerContext(engine, tokenizer, 4096, ServerMetrics(), tokenizer.vocab_size)
    request = PreparedRequest("r", (5, 6, 7), SamplingParams(max_new_tokens=len(ids)))
    events_of = _chat_events if kind == "chat" else _completion_events

    async def run():
        deltas = await first_then_rest(stream_text(ctx, request))
        events = events_of(deltas, ResponseMeta("id", "m", 0), Logprobs(tokenizer, False), False)
        first = await events.__anext__()
        assert first.startswith(b"data: ") and engine.aborted == []
        await events.aclose()

    asyncio.run(run())
    assert engine.aborted == ["r"] and not ctx.inflight


@pytest.mark.parametrize("text", ["a\u2028b", "x\x85y\u2029z \u2026 \u201cq\u201d", "\u2028", "plain"])
def test_an_event_stays_one_line_for_readers_that_split_on_unicode_line_breaks(text):
    """A token can decode to U+0085, U+2028 or U+2029, which JSON does not escape but
    str.splitlines and httpx's iter_lines treat as line ends: escaped, the event is one line and
    the same text (a CI run's random-weight stream once cut an event there)."""
    import json

    from httpx._decoders import LineDecoder

    from sglaunch.server.openai_api import _TEXT_MARK, TextChunk

    chunk = TextChunk({"object": "text_completion", "choices": [{"index": 0, "text": _TEXT_MARK}]})
    for event in (sse({"text": text}), chunk(text)):
        lines = [line for line in LineDecoder().decode(event.decode()) if line]
        assert len(lines) == 1, lines
        payload = json.loads(lines[0][len("data: "):])
        assert (payload.get("text") or payload["choices"][0]["text"]) == text


def test_fast_post_routes_answer_as_fastapi_does_and_skip_its_router(tokenizer):
    """app.FastPostRoutes: for every body (valid streaming and non-streaming requests of both
    OpenAI routes, ApiErrors raised by the endpoint, bad JSON, bodies that fail validation, other
    content types) the server answers with the same status, content type and body (ids and
    timestamps aside) as FastAPI's own handling; the valid ones never reach the router, every
    refused body does (its error is FastAPI's own)."""
    import re

    import httpx

    from sglaunch.server.app import create_app
    from sglaunch.server.state import ServerState

    ids = tokenizer.encode(TEXT, add_special_tokens=False)[:12]
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
    cases = [
        ("/v1/chat/completions", {**chat, "stream": True}, "application/json"),
        ("/v1/chat/completions", chat, "application/json"),
        ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 12, "stream": True,
                             "logprobs": 0}, "application/json; charset=utf-8"),
        ("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 12}, "application/json"),
        ("/v1/completions", {"model": "other", "prompt": "hello"}, "application/json"),  # 404 from the endpoint
        ("/v1/completions", {"prompt": ""}, "application/json"),  # 400 from the endpoint
        ("/v1/chat/completions", {**chat, "n": 2}, "application/json"),  # validation
        ("/v1/chat/completions", {**chat, "temperature": "hot"}, "application/json"),
        ("/v1/chat/completions", {"messages": "hi"}, "application/json"),
        ("/v1/completions", b"{not json", "application/json"),
        ("/v1/completions", b"[1, 2]", "application/json"),
        ("/v1/completions", b"", "application/json"),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 4}, "text/plain"),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 4}, None),
    ]

    def answers(fast: bool):
        state = ServerState(served_model_name="m", model_path="/models/m")
        state.ctx = ServerContext(ScriptedEngine(per_token(ids)), tokenizer, 4096, ServerMetrics(),
                                  tokenizer.vocab_size)
        app = create_app(state, fast_routes=fast)
        routed = []
        router = app.router

        class Counting:  # NOTE: the middleware stack is built at the first request, from app.router
            def __getattr__(self, name):
                return getattr(router, name)

            async def __call__(self, scope, receive, send):
                routed.append(scope["path"])
                await router(scope, receive, send)

        app.router = Counting()
        out = []

        async def run():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                for path, body, ctype in cases:
                    content = body if isinstance(body, bytes) else json.dumps(body).encode()
                    headers = {"content-type": ctype} if ctype else {}
                    before = len(routed)
                    reply = await client.post(path, content=content, headers=headers)
                    text = re.sub(r'"(id|created)":\s*("[^"]*"|\d+)', '"\\1":"-"', reply.text)
                    out.append((reply.status_code, reply.headers.get("content-type"), text, len(routed) > before))

        asyncio.run(run())
        return out

    fast, slow = answers(True), answers(False)
    assert [a[:3] for a in fast] == [a[:3] for a in slow]
    statuses = [a[0] for a in fast]
    assert statuses[:4] == [200, 200, 200, 200] and statuses[4] == 404 and all(s == 400 for s in statuses[5:12])
    assert "data: [DONE]" in fast[0][2] and '"logprobs"' in fast[2][2]
    routed_fast = [a[3] for a in fast]
    assert routed_fast[:6] == [False] * 6  # valid bodies (the endpoint's own refusals too): past the router
    assert all(routed_fast[6:])  # refused bodies, other content types: FastAPI's handling
    assert all(a[3] for a in slow)
