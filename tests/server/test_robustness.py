"""Hostile but well-formed-enough requests against a real server: each gets a 4xx naming what is
wrong, and the server keeps answering a greedy request exactly as before (issue 18)."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest

from .conftest import MODEL_NAME, running_server

BODY_LIMIT_MB = 1  # small, so the oversized bodies stay cheap to send
GREEDY = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0,
          "ignore_eos": True}
CHAT = [{"role": "user", "content": "hi"}]
SURROGATE = "abc\\ud800def"  # a JSON escape: the parsed string holds a lone surrogate


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    with running_server(tiny_llama, tmp_path_factory.mktemp("logs"), enable_metrics=True,
                        max_request_body_mb=BODY_LIMIT_MB) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def greedy_text(http) -> str:
    reply = http.post("/v1/completions", json=GREEDY)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def completion(**fields) -> str:
    return json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 4, **fields})


def chat(**fields) -> str:
    return json.dumps({"model": MODEL_NAME, "messages": CHAT, "max_tokens": 4, **fields})


def generate(**params) -> str:
    return json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4, **params}})


def raw(text: str) -> str:
    return text  # a body written by hand (surrogate escapes, NaN, huge literals)


HUGE_INT = 10**20
# (route, body, expected status, param the error must name (None: no param), code or None)
HOSTILE = [
    # sampling fields the engine cannot represent
    ("/v1/completions", completion(top_k=HUGE_INT, temperature=1), 400, "top_k", "invalid_value"),
    ("/v1/chat/completions", chat(top_k=HUGE_INT, temperature=1), 400, "top_k", "invalid_value"),
    ("/generate", generate(top_k=HUGE_INT, temperature=1), 400, "sampling_params.top_k", "invalid_value"),
    ("/v1/completions", completion(top_k=0), 400, "top_k", "invalid_value"),
    ("/v1/completions", completion(top_k=-2), 400, "top_k", "invalid_value"),
    ("/v1/completions", completion(temperature=1e300), 400, "temperature", "invalid_value"),
    ("/v1/completions", completion(temperature=-0.5), 400, "temperature", "invalid_value"),
    ("/v1/completions", raw('{"prompt": "hi", "temperature": NaN}'), 400, "temperature", "invalid_value"),
    ("/v1/completions", raw('{"prompt": "hi", "top_p": Infinity}'), 400, "top_p", "invalid_value"),
    ("/generate", raw('{"text": "hi", "sampling_params": {"min_p": -Infinity}}'), 400,
     "sampling_params.min_p", "invalid_value"),
    ("/v1/completions", completion(top_p=0), 400, "top_p", "invalid_value"),
    ("/v1/completions", completion(min_p=1.5), 400, "min_p", "invalid_value"),
    ("/v1/completions", completion(seed=2**64), 400, "seed", "invalid_value"),
    ("/generate", generate(sampling_seed=-(2**63) - 1), 400, "sampling_params.sampling_seed", "invalid_value"),
    ("/v1/completions", completion(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("/v1/completions", completion(max_tokens=HUGE_INT), 400, "max_tokens", "context_length_exceeded"),
    ("/v1/chat/completions", chat(max_completion_tokens=HUGE_INT), 400, "max_completion_tokens",
     "context_length_exceeded"),
    ("/generate", generate(max_new_tokens=HUGE_INT), 400, "sampling_params.max_new_tokens",
     "context_length_exceeded"),
    ("/v1/completions", raw('{"prompt": "hi", "max_tokens": 1e400}'), 400, "max_tokens", "invalid_value"),
    ("/v1/completions", completion(n=HUGE_INT), 400, "n", "invalid_value"),
    ("/v1/completions", completion(stop=["x"] * 17), 400, "stop", "invalid_value"),
    ("/v1/completions", completion(stop="s" * 513), 400, "stop", "invalid_value"),
    ("/v1/completions", completion(stop_token_ids=[HUGE_INT]), 400, "stop_token_ids", None),
    ("/v1/completions", completion(stop_token_ids=[-1]), 400, "stop_token_ids", None),
    ("/generate", generate(stop_token_ids=list(range(1025))), 400, "sampling_params.stop_token_ids",
     "invalid_value"),
    # out-of-vocabulary token ids
    ("/v1/completions", completion(prompt=[1, 2, 10**6]), 400, "prompt", None),
    ("/v1/completions", completion(prompt=[-5]), 400, "prompt", None),
    ("/generate", json.dumps({"input_ids": [[1, 2], [HUGE_INT]]}), 400, "input_ids", None),
    # wrong types
    ("/v1/completions", completion(prompt=123), 400, "prompt", "invalid_value"),
    ("/v1/completions", completion(max_tokens="many"), 400, "max_tokens", "invalid_value"),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}), 400, "messages", "invalid_value"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}), 400,
     "messages.0.role", "invalid_value"),
    ("/generate", json.dumps({"text": "hi", "sampling_params": {"temperature": "warm"}}), 400,
     "sampling_params.temperature", "invalid_value"),
    ("/generate", json.dumps({"text": "hi", "input_ids": [1]}), 400, "text", None),
    # lone UTF-16 surrogates, wherever text goes
    ("/v1/completions", raw(f'{{"prompt": "{SURROGATE}"}}'), 400, "prompt", "invalid_value"),
    ("/v1/completions", raw(f'{{"prompt": ["ok", "{SURROGATE}"]}}'), 400, "prompt.1", "invalid_value"),
    ("/v1/completions", raw(f'{{"prompt": "hi", "stop": ["{SURROGATE}"]}}'), 400, "stop.0", "invalid_value"),
    ("/v1/completions", raw(f'{{"prompt": "hi", "model": "{SURROGATE}"}}'), 400, "model", "invalid_value"),
    ("/v1/chat/completions", raw(f'{{"messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}'), 400,
     "messages.0.content", "invalid_value"),
    ("/v1/chat/completions",
     raw(f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "{SURROGATE}"}}]}}]}}'),
     400, "messages.0.content.0.text", "invalid_value"),
    ("/v1/chat/completions", raw(f'{{"messages": [{{"role": "user", "content": "hi"}}], '
                                 f'"chat_template_kwargs": {{"x": "{SURROGATE}"}}}}'),
     400, "chat_template_kwargs.x", "invalid_value"),
    ("/generate", raw(f'{{"text": "{SURROGATE}"}}'), 400, "text", "invalid_value"),
    ("/generate", raw(f'{{"text": "hi", "rid": "{SURROGATE}"}}'), 400, "rid", "invalid_value"),
    # bodies that are not JSON objects
    ("/v1/completions", "", 400, None, "invalid_json"),
    ("/v1/completions", "[]", 400, None, "invalid_json"),
    ("/v1/completions", '{"prompt": "hi"', 400, None, "invalid_json"),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None, "invalid_json"),  # invalid UTF-8
    ("/generate", '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", 400, None, "invalid_json"),
    ("/v1/completions", '{"prompt": ' + "[" * 200 + "]" * 200 + "}", 400, "prompt", "invalid_value"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": '
     '{"deep": ' + "[" * 900 + "]" * 900 + "}, \"max_tokens\": 2, \"model\": 3}", 400, "model",
     "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 1' + "0" * 5000 + "}", 400, None, "invalid_json"),
]


def _ids(case) -> str:
    route, body, status, param, _ = case
    return f"{route}-{param or status}"


@pytest.mark.parametrize("case", HOSTILE, ids=[_ids(c) for c in HOSTILE])
def test_hostile_body_gets_a_clear_4xx_and_the_server_is_unchanged(http, greedy_text, case):
    route, body, status, param, code = case
    reply = http.post(route, content=body.encode() if isinstance(body, str) else body,
                      headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    if status != 200:
        error = reply.json()["error"]
        assert error["message"] and error["param"] == param, error
        if code is not None:
            assert error["code"] == code, error
        if param is not None:
            assert param.split(".")[-1] in error["message"] or param in error["message"], error
    again = http.post("/v1/completions", json=GREEDY)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == greedy_text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/xml"])
def test_wrong_content_types_are_refused_or_read_as_json(http, greedy_text, content_type):
    reply = http.post("/v1/completions", content=b"prompt=hi&max_tokens=4",
                      headers={"Content-Type": content_type})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "invalid_json"
    assert http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"] == greedy_text


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_an_oversized_body_gets_413_before_it_is_parsed(http, greedy_text, route):
    body = json.dumps({"prompt": "x" * (BODY_LIMIT_MB * 2**20), "messages": CHAT, "text": "x"})
    reply = http.post(route, content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert error["code"] == "request_too_large" and "--max-request-body-mb" in error["message"]
    assert http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"] == greedy_text


def test_an_oversized_chunked_body_without_content_length_gets_413(server, http, greedy_text):
    """No Content-Length to refuse on: the limit applies to the bytes as they arrive."""
    def chunks():
        yield b'{"prompt": "'
        for _ in range(BODY_LIMIT_MB * 16 + 1):
            yield b"x" * 65536
        yield b'"}'

    reply = http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert reply.status_code == 413, reply.text
    assert http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"] == greedy_text


def test_a_body_just_under_the_limit_is_served(http):
    prompt = "hello " * ((BODY_LIMIT_MB * 2**20 - 200) // 6)
    reply = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert reply.status_code == 400, reply.text  # parsed and tokenized: too long for the context
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_the_event_loop_answers_health_while_a_long_prompt_is_tokenized(http):
    """Tokenization runs off the event loop: /health keeps answering while the server works
    through a prompt that takes it a while to tokenize (it blocked the loop before)."""
    prompt = "Héllo wörld, ça va? 日本語 " * ((BODY_LIMIT_MB * 2**20 - 400) // 40)
    done = threading.Event()
    result = {}

    def send() -> None:
        result["reply"] = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        done.set()

    thread = threading.Thread(target=send)
    thread.start()
    answered_meanwhile = 0
    with httpx.Client(base_url=str(http.base_url), timeout=120) as probe:
        while not done.is_set():
            assert probe.get("/health").status_code == 200
            answered_meanwhile += not done.is_set()
    thread.join()
    assert result["reply"].status_code == 400
    assert answered_meanwhile >= 20  # hundreds here; 2 when tokenizing blocked the loop


def test_one_hostile_request_never_disturbs_a_running_stream(server, greedy_text):
    """A stream that runs while hostile requests arrive ends as it would alone."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    alone = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=48,
                                      temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    stream = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=48,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    pieces, finish = [], None
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for i, chunk in enumerate(stream):
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
            if i < len(HOSTILE):
                route, body, *_ = HOSTILE[i]
                http.post(route, content=body, headers={"Content-Type": "application/json"})
    assert "".join(pieces) == alone and finish == "length"


def test_openai_client_sees_bad_request_errors(server):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2,
                                  extra_body={"top_k": HUGE_INT})
    assert caught.value.body["param"] == "top_k"


def test_a_slow_client_sending_half_a_body_then_leaving_does_not_hurt(server, http, greedy_text):
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"prompt\": \"hel")
    assert http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"] == greedy_text
