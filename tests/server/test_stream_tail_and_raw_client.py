"""Against a real server (issue 15): a stream's last events (the finishing chunk and the usage
event share one write, [DONE] ends the body) keep their order and content, streamed text and
token counts equal the non-streamed response's, and the benchmarks' lean client
(sglaunch.bench.rawclient) counts the same events and reads the same usage as an httpx parse."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sglaunch.bench.rawclient import RawClientError, RawStreamClient, _Reply, usage_of

from .conftest import MODEL_NAME, running_server

PROMPT_IDS = [5, 17, 42, 99, 123, 7, 300, 11]


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    with running_server(tiny_llama, tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def completion_body(stream: bool, **extra) -> dict:
    return {"model": MODEL_NAME, "prompt": PROMPT_IDS, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": stream, **extra}


def chat_body(stream: bool, **extra) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello there!"}], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True, "stream": stream, **extra}


def events_of(server, path: str, body: dict) -> list:
    """The stream's events in order: parsed JSON objects, and the string "[DONE]"."""
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        raw = b"".join(reply.iter_raw())
    assert raw.endswith(b"data: [DONE]\n\n")
    events = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        assert block.startswith(b"data: "), block
        payload = block[6:]
        events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_completion_stream_tail_and_text_equal_the_plain_response(server, usage, logprobs):
    extra = {"logprobs": 0} if logprobs else {}
    plain = httpx.post(f"{server.base_url}/v1/completions", json=completion_body(False, **extra), timeout=60).json()
    options = {"stream_options": {"include_usage": True}} if usage else {}
    events = events_of(server, "/v1/completions", completion_body(True, **options, **extra))
    assert events[-1] == "[DONE]"
    body = events[:-1]
    if usage:
        assert body[-1]["choices"] == [] and body[-1]["usage"] == plain["usage"]
        body = body[:-1]
    assert all("usage" not in e or e["usage"] is None for e in body)
    assert body[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in body[:-1])
    assert "".join(e["choices"][0]["text"] for e in body) == plain["choices"][0]["text"]
    if logprobs:
        streamed = [lp for e in body for lp in (e["choices"][0]["logprobs"] or {}).get("token_logprobs", [])]
        assert streamed == pytest.approx(plain["choices"][0]["logprobs"]["token_logprobs"])
        assert len(streamed) == plain["usage"]["completion_tokens"] == 24


@pytest.mark.parametrize("usage", [False, True])
def test_chat_stream_tail_and_text_equal_the_plain_response(server, usage):
    plain = httpx.post(f"{server.base_url}/v1/chat/completions", json=chat_body(False), timeout=60).json()
    options = {"stream_options": {"include_usage": True}} if usage else {}
    events = events_of(server, "/v1/chat/completions", chat_body(True, **options))
    assert events[-1] == "[DONE]"
    body = events[:-1]
    if usage:
        assert body[-1]["choices"] == [] and body[-1]["usage"] == plain["usage"]
        body = body[:-1]
    assert body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert body[-1]["choices"][0]["delta"] == {} and body[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in body)
    assert text == plain["choices"][0]["message"]["content"]


def test_raw_client_counts_the_events_and_reads_the_usage(server):
    body = completion_body(True, stream_options={"include_usage": True})
    expected = events_of(server, "/v1/completions", body)

    async def run():
        client = RawStreamClient(server.base_url)
        try:
            first = await client.stream("/v1/completions", body)
            second = await client.stream("/v1/completions", body)  # NOTE: the same connection, kept alive
            idle = len(client._idle)
        finally:
            client.close()
        return first, second, idle

    first, second, idle = asyncio.run(run())
    # NOTE: how many tokens share a chunk depends on timing (a stream behind the engine takes its
    # queued tokens at once), so the counts of two runs may differ; the usage may not
    for events, usage in (first, second):
        assert usage == expected[-2]["usage"]
        assert 4 <= events <= 24 + 3  # at least a chunk, the finishing one, usage, [DONE]
    assert idle == 1


def test_raw_client_counts_events_split_anywhere_in_the_chunked_body():
    """The reply's bytes cut at every possible place: the same event count and usage."""
    events = [b'data: {"choices":[{"text":"a\\n\\nb"}]}\n\n', b'data: {"choices":[{"text":"c"}]}\n\n',
              b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n', b"data: [DONE]\n\n"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    reply = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
             + body)

    async def feed(cuts):
        protocol = _Reply()
        done = protocol.begin(asyncio.get_running_loop())
        start = 0
        for cut in [*cuts, len(reply)]:
            protocol.data_received(reply[start:cut])
            start = cut
        assert done.done()
        await done
        return protocol.events, usage_of(protocol.tail)

    for cut in range(1, len(reply)):
        assert asyncio.run(feed([cut])) == (4, {"completion_tokens": 2}), cut
    assert asyncio.run(feed(list(range(1, len(reply))))) == (4, {"completion_tokens": 2})


def test_raw_client_raises_for_an_error_status_and_goes_on(server):
    async def run():
        client = RawStreamClient(server.base_url)
        try:
            with pytest.raises(RawClientError, match="400"):
                await client.stream("/v1/completions", completion_body(True, max_tokens=-1))
            return await client.stream("/v1/completions", completion_body(True, stream_options={"include_usage": True}))
        finally:
            client.close()

    events, usage = asyncio.run(run())
    assert usage["completion_tokens"] == 24 and events >= 3
