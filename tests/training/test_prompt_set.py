"""The user-like prompt set (sglaunch/training/prompt_set.py) over a tiny corpus fixture."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from sglaunch.training import prompt_set as ps

REPO = Path(__file__).resolve().parents[2]
COMMITTED_HELDOUT = REPO / "benchmarks" / "prompt_set" / "heldout.jsonl"
WORDS = ["crown", "river", "lantern", "orchard", "winter", "harbour", "meadow", "candle", "falcon", "garden"]


def _literary(name: str, lines: int) -> str:
    return "\n".join(f"{name} line {i}: the {WORDS[i % 10]} and the {WORDS[(i * 7) % 10]} spoke of thing {i} "
                     f"beneath the {WORDS[(i * 3) % 10]}." for i in range(lines)) + "\n"


def _docs(sections: int) -> str:
    parts = []
    for i in range(sections):
        title = f"Topic number {i}"
        parts.append(f"{title}\n{'=' * len(title)}\n\nThe feature number {i} of the language lets a program handle "
                     f"the {WORDS[i % 10]} case with care, so that every caller sees the same result and nothing "
                     f"surprising happens when the {WORDS[(i + 3) % 10]} input is empty or very large (case {i}).\n")
    return "\n".join(parts)


def _stdlib(functions: int) -> str:
    parts = []
    for i in range(functions):
        parts.append(f"def helper_{i}(values, limit={i % 7 + 2}):\n    \"\"\"Return the values below the limit, "
                     f"plus {i}.\"\"\"\n    out = []\n    for v in values:\n        if v < limit and v != {i % 5}:\n"
                     f"            out.append(v + {i})\n    return out\n")
        if i % 4 == 0:
            parts.append(f"class Box{i}:\n    def size(self, items):\n        \"\"\"Count the items of box {i}.\"\"\"\n"
                         f"        total = 0\n        for item in items:\n            total += len(item) + {i}\n"
                         f"        return total\n")
    return "\n\n".join(parts)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "shakespeare.txt").write_text(_literary("shakespeare", 600))
    (folder / "kjv.txt").write_text(_literary("kjv", 400))
    (folder / "pydocs.txt").write_text(_docs(80))
    (folder / "pystdlib.txt").write_text(_stdlib(120))
    return folder


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("set")
    ps.main([str(corpus), "--out", str(out), "--seed", "3", "--train-count", "1500", "--heldout-per-kind", "30"])
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_same_seed_same_bytes_other_seed_other_prompts(corpus, built, tmp_path):
    ps.main([str(corpus), "--out", str(tmp_path / "a"), "--seed", "3", "--train-count", "1500",
             "--heldout-per-kind", "30", "--gzip"])
    assert gzip.decompress((tmp_path / "a" / "train.jsonl.gz").read_bytes()) == (built / "train.jsonl").read_bytes()
    assert (tmp_path / "a" / "heldout.jsonl").read_bytes() == (built / "heldout.jsonl").read_bytes()
    ps.main([str(corpus), "--out", str(tmp_path / "b"), "--seed", "4", "--train-count", "200", "--heldout-per-kind", "5"])
    assert (tmp_path / "b" / "train.jsonl").read_bytes()[:5000] != (built / "train.jsonl").read_bytes()[:5000]


def test_every_kind_present_and_heldout_balanced(built):
    train, held = _rows(built / "train.jsonl"), _rows(built / "heldout.jsonl")
    assert {r["kind"] for r in train} == set(ps.KINDS)
    counts = {k: sum(r["kind"] == k for r in held) for k in ps.EVAL_KINDS}
    assert counts == {k: 30 for k in ps.EVAL_KINDS}
    assert [r["kind"] for r in held[:5]] == list(ps.EVAL_KINDS)  # interleaved: the first lines are balanced
    tasks = {r["task"] for r in train}
    for wanted in ("py-write", "py-fix", "sql", "shell", "topic", "mt-math", "mt-code"):
        assert wanted in tasks
    assert any(t.startswith("write-") and t != "write-python" for t in tasks)  # other languages
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["train"]["records"] == len(train) and manifest["heldout"]["records"] == len(held)


def test_no_empty_prompts_and_multi_turn_shape(built):
    for row in _rows(built / "train.jsonl") + _rows(built / "heldout.jsonl"):
        messages = row["messages"]
        assert messages and all(isinstance(m["content"], str) and m["content"].strip() for m in messages)
        roles = [m["role"] for m in messages if m["role"] != "system"]
        assert all(m["role"] == "system" for m in messages[: len(messages) - len(roles)])  # system only first
        assert roles[-1] == "user"
        assert all(a != b for a, b in zip(roles, roles[1:]))  # user and assistant alternate
        if row["kind"] == "multi-turn":
            assert roles == ["user", "assistant", "user"]
        else:
            assert roles == ["user"]


def test_heldout_is_disjoint_from_training_at_the_source_level(corpus, built):
    train, held = _rows(built / "train.jsonl"), _rows(built / "heldout.jsonl")
    named = ("function:", "topic:", "task:", "snippet:", "math:", "pair:", "subject:", "title:")
    train_sources = {r["source"] for r in train}
    held_named = {r["source"] for r in held if r["source"].startswith(named)}
    assert held_named and not held_named & train_sources
    train_text = "\n".join(ps.prompt_texts(r) for r in train)
    train_pools, held_pools = ps.build_pools(corpus)
    assert held_pools.functions and held_pools.paragraphs
    for f in held_pools.functions:  # a held-out function never appears in a training prompt
        assert f.source not in train_text
        assert "." in f.name or f"def {f.name}(" not in train_text
    for para in held_pools.paragraphs:
        assert para[:60] not in train_text
    held_lines = [line for blocks in held_pools.literary for block in blocks for line in block.splitlines() if line]
    assert held_lines and not any(line in train_text for line in held_lines)  # nor a line of a held-out block
    held_text = "\n".join(ps.prompt_texts(r) for r in held)
    assert any(line in held_text for line in held_lines)  # ... which the held-out prompts do use
    train_blocks = {b for blocks in train_pools.literary for b in blocks}
    assert train_blocks and not train_blocks & {b for blocks in held_pools.literary for b in blocks}


def test_training_slices_come_from_one_stream(corpus):
    train_pools, _ = ps.build_pools(corpus)
    whole = [json.dumps(r["messages"]) for r in ps.train_records(train_pools, 0, 0, 300)]
    part = [json.dumps(r["messages"]) for r in ps.train_records(train_pools, 0, 200, 100)]
    assert part and set(part) <= set(whole)
    assert len(set(whole)) == len(whole)  # duplicates dropped
    only_code = list(ps.train_records(train_pools, 0, 0, 50, kinds=("code",)))
    assert only_code and {r["kind"] for r in only_code} == {"code"}


def test_read_prompt_records_and_tokenize_prompts_accept_the_set(built, tiny_target, tmp_path):
    from sglaunch.training import data

    records = data.read_prompt_records(built / "heldout.jsonl")
    prompts = data.tokenize_prompts(records, tiny_target, built / "heldout.jsonl")
    assert len(prompts) == len(records) == 150
    assert {p.type for p in prompts} == set(ps.EVAL_KINDS)  # `kind` carried as the prompt's type
    assert all(p.ids for p in prompts)
    gz = tmp_path / "train.jsonl.gz"
    gz.write_bytes(gzip.compress((built / "train.jsonl").read_bytes()))
    assert len(data.read_prompt_records(gz)) == len(data.read_prompt_records(built / "train.jsonl"))


def test_proposals_become_second_stage_prompts(tiny_target, tmp_path):
    from sglaunch.server.tokenizer import load_tokenizer
    from sglaunch.training import data

    tok = load_tokenizer(tiny_target)
    samples = [data.Sample([1, 2], tok.encode("Question: How do tides work on a lake?\nextra", add_special_tokens=False),
                           "propose"),
               data.Sample([1, 2], tok.encode("The quick brown fox.", add_special_tokens=False), "chat")]
    data.save_samples(samples, tmp_path / "responses.jsonl")
    ps.main(["--from-proposals", str(tmp_path / "responses.jsonl"), "--target", str(tiny_target), "--out", str(tmp_path)])
    rows = _rows(tmp_path / "proposed.jsonl")
    assert rows == [{"messages": [{"role": "user", "content": "How do tides work on a lake?"}], "kind": "proposed",
                     "task": "proposed", "source": "proposed"}]


def test_python_bug_injection_changes_the_code_and_still_parses():
    import ast
    import random

    src = "def f(a, b):\n    if a < b and b > 0:\n        return a + 1\n    return b\n"
    for seed in range(10):
        bug = ps._mutate(src, random.Random(seed))
        assert bug and ast.parse(bug) and ast.unparse(ast.parse(bug)) != ast.unparse(ast.parse(src))


def test_committed_heldout_split_is_small_balanced_and_on_the_heldout_side():
    rows = _rows(COMMITTED_HELDOUT)
    assert COMMITTED_HELDOUT.stat().st_size < 1_000_000
    counts = {k: sum(r["kind"] == k for r in rows) for k in ps.EVAL_KINDS}
    assert min(counts.values()) >= 100 and set(counts) == {r["kind"] for r in rows}
    catalogue = {"topic": ps.TOPICS, "subject": ps.SUBJECTS, "math": list(ps.MATH_TEMPLATES)}
    held_side = {k: set(ps.split_names(list(v))[1]) for k, v in catalogue.items()}
    held_side["task"] = {t for t, _ in ps.split_names(ps.CODE_TASKS + ps.SQL_TASKS + ps.SHELL_TASKS,
                                                      lambda t: t[0])[1]}
    for row in rows:  # named sources must sit on the held-out side of the stable hash split
        prefix, _, name = row["source"].partition(":")
        if prefix == "function":
            assert ps.bucket(name) < ps.HELDOUT_PERMILLE_NAMES
        elif prefix in held_side:
            assert name in held_side[prefix], row["source"]


def test_dspark_accept_position_figures():
    spec = importlib.util.spec_from_file_location("dspark_accept", REPO / "benchmarks" / "dspark_accept.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    figures = mod.position_figures([1, 2, 3, 8], block=7)  # accepted drafts n = 0, 1, 2, 7
    assert figures["histogram"] == [1, 1, 1, 0, 0, 0, 0, 1]
    assert figures["mean_accept_length"] == 3.5
    assert figures["reach_rate_per_position"] == [0.75, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25]
    assert figures["accept_rate_per_position"][:3] == [0.75, round(2 / 3, 4), 0.5]
    rows = [{"kind": "a"}, {"kind": "b"}, {"kind": "a"}, {"type": "b"}, {"kind": "a"}]
    assert mod.select_rows(rows, 2, per_kind=2) == rows[:4]
    assert mod.select_rows(rows, 2) == rows[:2]


def test_generation_stops_at_its_deadline(tiny_target, prompt_file):
    import time

    from sglaunch.training import data

    prompts = data.tokenize_prompts(data.read_prompt_records(prompt_file)[:6], tiny_target, prompt_file)
    common = dict(device="cpu", dtype="float32", max_new_tokens=6, temperatures=[0.0, 0.7], top_p=0.9, seed=0,
                  max_length=256)
    full = data.generate_responses(tiny_target, prompts, **common)
    timed = data.generate_responses(tiny_target, prompts, deadline=time.monotonic() + 120, **common)
    assert [s.response for s in timed] == [s.response for s in full] and len(full) == 6
    assert data.generate_responses(tiny_target, prompts, deadline=time.monotonic() - 1, **common) == []
