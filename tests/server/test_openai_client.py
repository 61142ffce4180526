"""The real `openai` client (and httpx for native routes) against a real server and engine."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest

from sglaunch.server.tokenizer import load_tokenizer

from .conftest import MODEL_NAME, running_server

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}]
IGNORE_EOS = {"ignore_eos": True}  # random weights: make output lengths predictable


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    with running_server(tiny_llama, tmp_path_factory.mktemp("logs"), enable_metrics=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return load_tokenizer(tiny_llama)


def greedy_completion(client, prompt=PROMPT, max_tokens=12, **kwargs):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens,
                                     temperature=0, extra_body=IGNORE_EOS, **kwargs)


# ---------------------------------------------------------------- OpenAI routes


def test_health_answered_503_while_the_engine_started(server):
    assert server.saw_starting_503
    assert re.search(r"ready: http://127\.0\.0\.1:\d+", server.log())


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_completion_is_greedy_and_counts_tokens(client, tokenizer):
    first = greedy_completion(client)
    second = greedy_completion(client)
    assert first.choices[0].text == second.choices[0].text
    assert first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert first.usage.completion_tokens == 12
    assert first.usage.total_tokens == first.usage.prompt_tokens + 12


def test_completion_accepts_token_id_prompts(client, tokenizer):
    by_text = greedy_completion(client, max_tokens=6)
    by_ids = greedy_completion(client, prompt=tokenizer.encode(PROMPT), max_tokens=6)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_streamed_completion_equals_the_non_streamed_one(client):
    expected = greedy_completion(client).choices[0].text
    chunks = list(greedy_completion(client, stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == expected
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_seeded_sampling_is_reproducible(client):
    def sample(seed):
        return client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=10,
                                         temperature=1.0, top_p=0.9, seed=seed,
                                         extra_body=IGNORE_EOS).choices[0].text
    assert sample(1234) == sample(1234)


def test_stop_string_truncates_the_output(client):
    full = greedy_completion(client, max_tokens=16).choices[0].text
    stop = next(full[i:i + 3] for i in range(2, len(full) - 3) if full[i:i + 3].strip())
    stopped = greedy_completion(client, max_tokens=16, stop=[stop])
    assert stopped.choices[0].text == full[:full.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = greedy_completion(client, max_tokens=16, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == full[:full.index(stop)]


def test_chat_completion(client, tokenizer):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8,
                                           temperature=0, extra_body=IGNORE_EOS)
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(tokenizer.encode_chat(MESSAGES))
    assert reply.usage.completion_tokens == 8


def test_chat_continuing_the_final_message(client, tokenizer):
    """continue_final_message: the prompt is the template's rendering cut right after the last
    (assistant) message's text, no generation prompt, tokenized without special tokens (the
    template and the tokenizer run in one hop off the event loop)."""
    messages = MESSAGES + [{"role": "assistant", "content": "Hello! I"}]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0,
                                           extra_body={**IGNORE_EOS, "continue_final_message": True,
                                                       "add_generation_prompt": False})
    text = tokenizer.render_chat(messages, add_generation_prompt=False)
    cut = text[: text.rfind("Hello! I") + len("Hello! I")]
    assert cut != text  # the template's end-of-turn marker was dropped
    assert reply.usage.prompt_tokens == len(tokenizer.encode(cut, add_special_tokens=False))
    assert reply.usage.completion_tokens == 4


def test_streamed_chat_equals_the_non_streamed_one(client):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0,
                  extra_body=IGNORE_EOS)
    expected = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_64_concurrent_streams_finish_with_the_right_token_counts(server):
    async def one_stream(client, index):
        max_tokens = 4 + index % 13
        stream = await client.completions.create(
            model=MODEL_NAME, prompt=f"{PROMPT} number {index}", max_tokens=max_tokens,
            temperature=0.8, seed=index, stream=True, stream_options={"include_usage": True},
            extra_body=IGNORE_EOS)
        chunks = [chunk async for chunk in stream]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        return max_tokens, chunks[-1].usage.completion_tokens, finish

    async def all_streams():
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                                      max_retries=0, timeout=120) as client:
            return await asyncio.gather(*(one_stream(client, i) for i in range(64)))

    results = asyncio.run(all_streams())
    assert all(finish == "length" for _, _, finish in results)
    assert [got for _, got, _ in results] == [wanted for wanted, _, _ in results]


def test_chosen_token_logprobs(client):
    completion = greedy_completion(client, max_tokens=6, logprobs=0)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    streamed = greedy_completion(client, max_tokens=6, logprobs=0, stream=True)
    streamed_logprobs = [lp for c in streamed for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed_logprobs == pytest.approx(logprobs.token_logprobs, abs=1e-4)
    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=5,
                                          temperature=0, logprobs=True, extra_body=IGNORE_EOS)
    assert len(chat.choices[0].logprobs.content) == 5
    assert all(item.logprob <= 0 for item in chat.choices[0].logprobs.content)


# ---------------------------------------------------------------- native routes


def test_native_generate_text_and_input_ids(server, tokenizer):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                "ignore_eos": True}}
    by_text = httpx.post(f"{server.base_url}/generate", json=body, timeout=60).json()
    assert len(by_text["output_ids"]) == 5
    assert by_text["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert by_text["meta_info"]["prompt_tokens"] == len(tokenizer.encode(PROMPT))
    assert by_text["text"] == tokenizer.decode(by_text["output_ids"])
    by_ids = httpx.post(f"{server.base_url}/generate", timeout=60, json={
        "input_ids": tokenizer.encode(PROMPT), "sampling_params": body["sampling_params"]}).json()
    assert by_ids["output_ids"] == by_text["output_ids"]
    with_logprobs = httpx.post(f"{server.base_url}/generate", timeout=60,
                               json={**body, "return_logprob": True}).json()
    triples = with_logprobs["meta_info"]["output_token_logprobs"]
    assert [token for _, token, _ in triples] == by_text["output_ids"]
    assert all(logprob <= 0 for logprob, _, _ in triples)


def test_native_generate_batch_and_stream(server):
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    batch = httpx.post(f"{server.base_url}/generate", timeout=60,
                       json={"text": ["one", "two"], "sampling_params": params}).json()
    assert [len(item["output_ids"]) for item in batch] == [4, 4]
    events = []
    with httpx.stream("POST", f"{server.base_url}/generate", timeout=60,
                      json={"text": "one", "sampling_params": params, "stream": True}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["output_ids"] == batch[0]["output_ids"]  # cumulative, like SGLang
    assert last["text"] == batch[0]["text"]


# ---------------------------------------------------------------- health, info, metrics


def test_health_and_info_routes(server, tiny_llama):
    base = server.base_url
    assert httpx.get(f"{base}/health").status_code == 200
    info = httpx.get(f"{base}/server_info").json()
    assert info["model_path"] == str(tiny_llama)
    assert info["status"] == "ready"
    assert "api_key" not in info
    assert isinstance(info["internal_states"][0], dict)
    assert httpx.get(f"{base}/get_server_info").json()["model_path"] == str(tiny_llama)
    model_info = httpx.get(f"{base}/model_info").json()
    assert model_info["is_generation"] is True
    assert model_info["context_length"] == 256


def test_metrics_are_exposed_in_prometheus_format(server, client):
    greedy_completion(client, max_tokens=3)
    response = httpx.get(f"{server.base_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _parse_samples(response.text)
    assert samples['sglang:num_requests_total{finish_reason="length",model_name="tiny-llama"}'] >= 1
    assert samples['sglang:prompt_tokens_total{model_name="tiny-llama"}'] > 0
    assert samples['sglang:generation_tokens_total{model_name="tiny-llama"}'] >= 3
    assert samples['sglang:time_to_first_token_seconds_count{model_name="tiny-llama"}'] >= 1
    assert samples['sglang:inter_token_latency_seconds_count{model_name="tiny-llama"}'] >= 2
    for gauge in ("token_usage", "num_queue_reqs", "num_running_reqs"):
        assert f'sglang:{gauge}{{model_name="tiny-llama"}}' in samples


def test_an_idle_server_with_a_warm_cache_reads_no_kv_in_use(server, client):
    """Cached prefix pages no request holds are evictable: not "used" (SGLang's token_usage)."""
    greedy_completion(client, max_tokens=3)
    def live():
        return httpx.get(f"{server.base_url}/server_info").json()["internal_states"][0]

    info, deadline = live(), time.monotonic() + 10
    while info["num_running_requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
        info = live()
    assert info["kv_cached_tokens"] > 0 and info["kv_evictable_tokens"] == info["kv_cached_tokens"]
    assert info["kv_used_tokens"] == 0 and info["kv_usage"] == 0
    samples = _parse_samples(httpx.get(f"{server.base_url}/metrics").text)
    assert samples['sglang:token_usage{model_name="tiny-llama"}'] == 0
    assert samples['sglang:num_evictable_tokens{model_name="tiny-llama"}'] > 0


def _parse_samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples
