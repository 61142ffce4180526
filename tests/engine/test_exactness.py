"""Engine against Hugging Face transformers on tiny random-weight models (fp32, CPU).

Tolerance for logits: fp32 everywhere, so differences come only from summation order
(fused q/k/v and gate/up matmuls, SDPA over padded batches): |ours - HF| <= 1e-4 absolute.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine_helpers import PROMPTS, engine_config, hf_greedy
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch, run_requests
from sglaunch.engine.model_runner import ModelRunner
from sglaunch.engine.model_spec import load_model_spec
from sglaunch.engine.step import StepInput

LOGIT_ATOL = 1e-4
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_greedy_tokens_identical_to_hf_generate(name, checkpoints, hf_models):
    ours = generate_batch(engine_config(checkpoints[name]), PROMPTS, GREEDY)
    assert ours == hf_greedy(hf_models[name], PROMPTS, GREEDY.max_new_tokens)


def make_runner(path, page_size=1, dtype="float32") -> ModelRunner:
    config = engine_config(path, page_size=page_size, dtype=dtype, kv_cache_dtype=dtype)
    return ModelRunner(config, load_model_spec(str(path)), TPGroup(0, 1), torch.device("cpu"), False)


def prefill_step(prompts, starts, page_tables) -> StepInput:
    """Ragged step computing prompts[b][starts[b]:] for every b, logits at every token."""
    step = StepInput([], [], [], [], [], [])
    for prompt, start, table in zip(prompts, starts, page_tables):
        step.input_ids += prompt[start:]
        step.positions += list(range(start, len(prompt)))
        step.query_lens.append(len(prompt) - start)
        step.kv_lens.append(len(prompt))
        step.page_tables.append(table)
    step.sample_indices = list(range(len(step.input_ids)))
    return step


def hf_logits(model, prompt) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float()  # [len, vocab]


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_logits_close_to_hf_for_a_ragged_batch(name, page_size, checkpoints, hf_models):
    """Step 1 prefills every prompt but its last 3 tokens; step 2 computes those 3 on top of
    the paged prefix (a verify-like ragged step). Every position's logits match HF."""
    runner = make_runner(checkpoints[name], page_size)
    pages_per = [-(-len(p) // page_size) for p in PROMPTS]
    tables, first = [], 0
    for n in pages_per:
        tables.append(list(range(first, first + n))[::-1])  # non-contiguous, reversed pages
        first += n
    cut = [max(0, len(p) - 3) for p in PROMPTS]
    heads = [p[:c] for p, c in zip(PROMPTS, cut)]
    keep = [i for i, h in enumerate(heads) if h]
    head_step = prefill_step([heads[i] for i in keep], [0] * len(keep),
                             [tables[i][: -(-len(heads[i]) // page_size)] for i in keep])
    got_heads = runner.forward(head_step).split([len(heads[i]) for i in keep])
    got_tails = runner.forward(prefill_step(PROMPTS, cut, tables)).split([len(p) - c for p, c in zip(PROMPTS, cut)])
    for j, i in enumerate(keep):
        torch.testing.assert_close(got_heads[j], hf_logits(hf_models[name], heads[i]), atol=LOGIT_ATOL, rtol=0)
    for i, prompt in enumerate(PROMPTS):
        want = hf_logits(hf_models[name], prompt)[cut[i]:]
        torch.testing.assert_close(got_tails[i], want, atol=LOGIT_ATOL, rtol=0)


def test_bfloat16_logits_close_to_hf(checkpoints):
    """bf16 weights and KV: same math as HF up to bf16 rounding (atol 0.05 on logits ~ +-1)."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["qwen3"], dtype=torch.bfloat16).eval()
    runner = make_runner(checkpoints["qwen3"], dtype="bfloat16")
    prompt = PROMPTS[2]
    got = runner.forward(prefill_step([prompt], [0], [list(range(len(prompt)))]))
    torch.testing.assert_close(got, hf_logits(hf, prompt), atol=0.05, rtol=0)


def run_engine(config, requests):
    engine, cluster = create_engine(config)
    try:
        return run_requests(engine, requests), engine
    finally:
        cluster.stop(engine)


def requests_for(prompts, sampling=GREEDY, prefix="r"):
    return [GenerateRequest(f"{prefix}{i}", tuple(p), sampling) for i, p in enumerate(prompts)]


def test_radix_cache_hits_do_not_change_outputs(checkpoints, hf_models):
    shared = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    first = [shared + [1], shared + [2, 3]]
    second = [shared + [4, 5, 6], shared[:6], shared + [1, 7]]
    engine, cluster = create_engine(engine_config(checkpoints["llama"], page_size=2))
    try:
        run_requests(engine, requests_for(first, prefix="a"))
        done = run_requests(engine, requests_for(second, prefix="b"))
    finally:
        cluster.stop(engine)
    assert [done[f"b{i}"].final.cached_tokens for i in range(3)] == [10, 4, 10]
    assert [done[f"b{i}"].token_ids for i in range(3)] == hf_greedy(hf_models["llama"], second, 12)


@pytest.mark.parametrize("page_size", [1, 4])
def test_preemption_and_chunked_prefill_do_not_change_outputs(page_size, checkpoints, hf_models):
    prompts = PROMPTS * 2
    config = engine_config(checkpoints["qwen2"], page_size=page_size, max_total_tokens=64, chunked_prefill_size=8)
    sampling = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
    done, engine = run_engine(config, requests_for(prompts, sampling))
    assert engine.scheduler.num_preemptions > 0
    assert [done[f"r{i}"].token_ids for i in range(len(prompts))] == hf_greedy(hf_models["qwen2"], prompts, 20)


def test_seeded_sampling_is_deterministic_and_batch_independent(checkpoints):
    config = engine_config(checkpoints["qwen3"])
    seeded = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=7, ignore_eos=True)
    alone, _ = run_engine(config, [GenerateRequest("x", tuple(PROMPTS[0]), seeded)])
    others = requests_for(PROMPTS[1:], dataclasses.replace(seeded, seed=None))
    crowded, _ = run_engine(config, [GenerateRequest("x", tuple(PROMPTS[0]), seeded), *others])
    assert alone["x"].token_ids == crowded["x"].token_ids
    reseeded, _ = run_engine(config, [GenerateRequest("x", tuple(PROMPTS[0]), dataclasses.replace(seeded, seed=8))])
    assert reseeded["x"].token_ids != alone["x"].token_ids
    top1 = dataclasses.replace(seeded, top_k=1)
    greedy = generate_batch(config, [PROMPTS[0]], dataclasses.replace(GREEDY, max_new_tokens=16))
    assert generate_batch(config, [PROMPTS[0]], top1) == greedy
    assert all(len(lp) == 1 and lp[0] <= 0 for lp in [alone["x"].final.logprobs])


def test_eos_from_generation_config_stops(checkpoints, tmp_path):
    import json
    import shutil

    folder = tmp_path / "with_eos"
    shutil.copytree(checkpoints["llama"], folder)
    greedy = generate_batch(engine_config(folder), [PROMPTS[0]], GREEDY)[0]
    eos = greedy[4]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    stopped = generate_batch(engine_config(folder), [PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=0))
    assert stopped[0] == greedy[: greedy.index(eos) + 1]


def test_engine_rejects_overlong_prompt(checkpoints):
    engine, cluster = create_engine(engine_config(checkpoints["llama"], context_length=16))
    try:
        with pytest.raises(ValueError, match="context length"):
            engine.add_request(GenerateRequest("long", tuple(range(16)), GREEDY))
        assert engine.static_info()["context_length"] == 16
    finally:
        cluster.stop(engine)


def test_the_engine_freezes_its_start_up_heap_until_it_stops(checkpoints):
    """engine/heap.py: the collector's full passes must not walk the start-up heap every few
    steps, and a process that stops an engine gets its cycles back to collect."""
    import gc

    gc.unfreeze()
    engine, cluster = create_engine(engine_config(checkpoints["llama"]))
    try:
        frozen = gc.get_freeze_count()
        # the model's modules and parameters are among the frozen objects: far more than a few
        assert frozen > 10_000, frozen
        run_requests(engine, requests_for([PROMPTS[0]]))
        gc.collect(0)
        live = engine.live_stats()["gc"]  # /server_info: the passes since start-up
        assert abs(live["frozen_objects"] - frozen) < 100 and len(live["collections"]) == 3
        assert live["collections"][0] >= 1 and live["seconds"][0] >= 0.0
    finally:
        cluster.stop(engine)
    assert gc.get_freeze_count() == 0


def test_step_wall_time_is_counted_by_kind(checkpoints):
    """live_stats' step_seconds: every step() lands in one kind, the steps that admitted prompts
    under `prefill` (total_prefill_steps of them), the rest under `decode`."""
    engine, cluster = create_engine(engine_config(checkpoints["llama"]))
    try:
        run_requests(engine, requests_for(PROMPTS[:2]))
        live = engine.live_stats()
        kinds = live["step_seconds"]
        assert kinds["prefill"][0] == live["total_prefill_steps"] >= 1
        assert kinds["decode"][0] >= 1
        assert kinds["prefill"][0] + kinds["decode"][0] >= live["total_steps"]
        assert all(seconds > 0 for _, seconds in kinds.values())
    finally:
        cluster.stop(engine)
