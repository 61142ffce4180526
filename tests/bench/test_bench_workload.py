"""Workload files, synthetic requests, sampling and arrivals: parsing, bad input, determinism."""

from __future__ import annotations

import json
import statistics

import pytest

from sglaunch.bench.workload import (SyntheticSpec, load_workload, poisson_offsets, requests_digest,
                                     sample_requests, synthetic_requests)
from sglaunch.errors import SglaunchError


def write_lines(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_prompt_file_accepts_text_ids_and_messages(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [
        {"prompt": "hello there", "output_len": 7},
        "",
        {"prompt": [1, 2, 3]},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
         "max_tokens": 5},
    ])
    requests = load_workload(path, default_output_len=11)
    assert [(r.prompt, r.output_len) for r in requests[:2]] == [("hello there", 7), ([1, 2, 3], 11)]
    assert requests[1].input_len == 3
    assert requests[2].messages[1]["content"] == "hi" and requests[2].output_len == 5


def test_sharegpt_uses_first_human_turn_and_reply_length(tmp_path):
    path = tmp_path / "share.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "What is KV cache?"},
                                      {"from": "gpt", "value": "x" * 40}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model"},
                                      {"from": "human", "value": "skipped"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "only one turn"}]},
    ]))
    requests = load_workload(path)
    assert len(requests) == 1
    assert requests[0].messages == [{"role": "user", "content": "What is KV cache?"}]
    assert requests[0].output_len == 10  # 40 characters / 4 without a tokenizer
    assert load_workload(path, count_tokens=lambda text: 3)[0].output_len == 3


@pytest.mark.parametrize("rows, where, problem", [
    (['{"prompt": "ok"}', '{"prompt": "unterminated'], ":2", "invalid JSON"),
    ([{"text": "no prompt key"}], ":1", "neither `prompt` nor `messages`"),
    ([{"prompt": ""}], ":1", "non-empty string"),
    ([{"prompt": "x", "output_len": 0}], ":1", "positive integer"),
    ([{"prompt": "x", "output_len": "long"}], ":1", "positive integer"),
    ([{"messages": [{"role": "wizard", "content": "x"}]}], ":1", "role"),
    ([{"messages": []}], ":1", "non-empty list"),
    (["[1, 2]"], "[0]", "expected a JSON object"),
    ([{"conversations": "not a list"}], ":1", "conversations"),
    ([{"conversations": [{"from": "gpt", "value": "no human first"}]}], "", "no conversation"),
])
def test_malformed_files_name_the_place(tmp_path, rows, where, problem):
    path = write_lines(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SglaunchError) as info:
        load_workload(path)
    assert f"bad.jsonl{where}:" in info.value.message and problem in info.value.message
    assert "docs/benchmarking.md" in info.value.hint


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(SglaunchError, match="empty"):
        load_workload(tmp_path / "empty.jsonl")
    with pytest.raises(SglaunchError, match="cannot read"):
        load_workload(tmp_path / "missing.jsonl")


def test_synthetic_requests_are_deterministic_per_seed():
    spec = SyntheticSpec(input_len=40, output_len=20, range_ratio=0.5)
    first = synthetic_requests(spec, 16, seed=3)
    assert first == synthetic_requests(spec, 16, seed=3)
    assert requests_digest(first) == requests_digest(synthetic_requests(spec, 16, seed=3))
    assert requests_digest(first) != requests_digest(synthetic_requests(spec, 16, seed=4))
    assert all(10 <= r.output_len <= 20 for r in first)
    assert len({r.output_len for r in first}) > 1


def test_synthetic_with_a_tokenizer_has_exact_input_lengths():
    encode = lambda text: [len(word) for word in text.split()]  # noqa: E731 - one token per word
    requests = synthetic_requests(SyntheticSpec(input_len=30, output_len=5, range_ratio=0.2), 8, seed=0,
                                  encode=encode)
    assert all(isinstance(r.prompt, list) and len(r.prompt) == r.input_len for r in requests)
    assert all(6 <= r.input_len <= 30 for r in requests)


def test_sampling_and_arrivals_are_deterministic():
    pool = synthetic_requests(SyntheticSpec(16, 4), 5, seed=0)
    drawn = sample_requests(pool, 12, seed=9)
    assert drawn == sample_requests(pool, 12, seed=9) != sample_requests(pool, 12, seed=10)
    assert all(drawn.count(r) in (2, 3) for r in pool)  # whole passes before repeats
    offsets = poisson_offsets(2000, 50.0, seed=1)
    assert offsets == poisson_offsets(2000, 50.0, seed=1)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert poisson_offsets(3, float("inf"), seed=1) == [0.0, 0.0, 0.0]
