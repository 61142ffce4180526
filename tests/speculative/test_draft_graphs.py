"""The drafter's CUDA-graph layout on the CPU: which key a step picks, and that the padded
static input (dummy requests, padded slot table) gives the real requests the eager output."""

from __future__ import annotations

import pytest
import torch

from spec_helpers import feature_rows, tiny_config
from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
from sglaunch.speculative.draft_graphs import (
    MIN_CONTEXT, DraftGraphKey, DraftGraphPlan, DraftGraphRunner, EagerCapture, batch_from_flat, graph_body,
    padded_inputs)
from sglaunch.speculative.draft_runner import context_slots
from sglaunch.speculative.drafter import DraftBatch

BUCKETS = [1, 2, 4, 8, 16, 24, 32]


def eager_block(drafter, cfg, pool, pages, lengths, anchors, page_size, seed):
    """Write each request's context K/V (random feature rows, positions 0..n-1 at its pages'
    slots), then the eager block forward -> (its output, the context slot table)."""
    for r, (table, n) in enumerate(zip(pages, lengths)):
        slots = torch.tensor([table[i // page_size] * page_size + i % page_size for i in range(n)])
        drafter.write_context(feature_rows(n, cfg, seed=seed + r), torch.arange(n), slots, pool)
    table = context_slots(pages, lengths, page_size)
    positions = torch.tensor(lengths)
    eager = drafter.forward_block(DraftBatch(
        anchor_tokens=torch.tensor(anchors), anchor_positions=positions,
        ctx_features=torch.empty(0, cfg.num_features * cfg.hidden_size), ctx_positions=torch.empty(0, dtype=torch.int64),
        ctx_slots=torch.empty(0, dtype=torch.int64), slot_table=table, ctx_lens=positions), pool)
    return eager, table


def test_plan_rounds_batch_to_a_bucket_and_context_to_a_power_of_two():
    plan = DraftGraphPlan(BUCKETS, max_context=2000, max_cells=1 << 14)
    assert plan.pick(1, 5) == DraftGraphKey(1, MIN_CONTEXT)
    assert plan.pick(3, 129) == DraftGraphKey(4, 256)
    assert plan.pick(17, 256) == DraftGraphKey(24, 256)
    assert plan.pick(8, 2000) == DraftGraphKey(8, 2048)  # the plan's limit is 2000 rounded up
    assert plan.pick(8, 2049) is None  # longer than any context the plan allows
    assert plan.pick(33, 10) is None  # above the largest bucket
    assert plan.pick(16, 1025) is None  # 16 x 2048 cells: over max_cells


def test_static_buffer_holds_every_key_the_plan_picks():
    plan = DraftGraphPlan(BUCKETS, max_context=3000, max_cells=1 << 15)
    keys = {plan.pick(b, c) for b in range(1, 40) for c in range(1, 5000, 7)} - {None}
    assert keys and max(k.flat_size for k in keys) == plan.max_flat_size
    # keys(): what start-up captures is exactly what pick() can ask for, largest first
    assert set(plan.keys()) == keys and len(plan.keys()) == len(keys)
    cells = [k.batch * k.context for k in plan.keys()]
    assert cells == sorted(cells, reverse=True)


def test_padded_inputs_layout():
    key = DraftGraphKey(4, 8)
    table = torch.tensor([[5, 6, 7], [9, 9, 9]])
    flat = padded_inputs([11, 12], [3, 1], table, key)
    assert flat.shape == (key.flat_size,)
    assert flat[:4].tolist() == [11, 12, 0, 0] and flat[4:8].tolist() == [3, 1, 0, 0]
    grid = flat[8:].view(4, 8)
    assert grid[0].tolist() == [5, 6, 7, 0, 0, 0, 0, 0] and grid[1, :3].tolist() == [9, 9, 9]
    assert grid[2:].abs().sum() == 0


@pytest.mark.parametrize("markov", ["vanilla", "rnn"])
def test_padded_batch_gives_the_eager_output(tmp_path, markov):
    cfg = tiny_config(markov_head_type=markov)
    drafter = load_drafter(save_drafter(tmp_path / "d", cfg, init_drafter_state(cfg, seed=5)))
    page_size, pool = 4, drafter.make_pool(64)
    # three requests on pages 2.., context lengths 6, 10 and 3; page 0 (the padding's slot 0)
    # is nobody's, filled with garbage that the masks must hide
    pages, lengths, anchors = [[2, 3], [4, 5, 6], [7]], [6, 10, 3], [10, 20, 30]
    for layer in range(cfg.num_layers):
        pool.k[layer][:page_size] = 1e3
        pool.v[layer][:page_size] = -1e3
    eager, table = eager_block(drafter, cfg, pool, pages, lengths, anchors, page_size, seed=40)
    key = DraftGraphPlan(BUCKETS, max_context=256).pick(3, max(lengths))
    assert key == DraftGraphKey(4, MIN_CONTEXT)
    static = torch.zeros(key.flat_size + 50, dtype=torch.int64)  # a larger static buffer, as on the GPU
    static[: key.flat_size] = padded_inputs(anchors, lengths, table, key)
    padded = graph_body(drafter, batch_from_flat(static, key, cfg.num_features * cfg.hidden_size, torch.float32), pool)
    assert padded.logits.shape[0] == key.batch and torch.isfinite(padded.logits).all()
    torch.testing.assert_close(padded.hidden[:3], eager.hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.logits[:3], eager.logits, rtol=1e-5, atol=1e-5)
    # the greedy block sampled inside the graph equals the eager sampling of the real rows
    want = drafter.sample_block(eager, torch.tensor(anchors), torch.zeros(3), uniforms=torch.zeros(3, cfg.block_size),
                                return_probs=False, all_greedy=True)
    got = padded.greedy
    assert torch.equal(got.tokens[:3], want.tokens) and got.probs is None and got.logits is None  # logits not kept
    torch.testing.assert_close(got.conf_logits[:3], want.conf_logits, rtol=1e-5, atol=1e-5)


def test_runner_captures_at_start_up_only_and_shares_its_outputs(tmp_path):
    cfg = tiny_config()
    drafter = load_drafter(save_drafter(tmp_path / "d", cfg, init_drafter_state(cfg, seed=6)))
    page_size, pool = 4, drafter.make_pool(64)
    plan = DraftGraphPlan([1, 2, 4], max_context=256)
    runner = DraftGraphRunner(drafter, pool, plan, torch.device("cpu"), capture=EagerCapture())
    assert runner.pick(1, 5) is None  # nothing captured yet: eager, never a capture
    runner.capture_all()
    assert runner.captures == len(plan.keys()) == 6 and set(runner.graphs) == set(plan.keys())
    pages, lengths, anchors = [[2, 3], [4, 5, 6]], [6, 10], [10, 20]
    eager, table = eager_block(drafter, cfg, pool, pages, lengths, anchors, page_size, seed=50)
    key = runner.pick(2, max(lengths))
    assert key == DraftGraphKey(2, MIN_CONTEXT)
    out = runner.run(key, padded_inputs(anchors, lengths, table, key), 2)
    assert runner.captures == 6 and runner.replays == 1
    torch.testing.assert_close(out.logits, eager.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.hidden, eager.hidden, rtol=1e-5, atol=1e-5)
    # every key writes the same static buffers (memory does not grow with the number of graphs)
    assert out.logits.data_ptr() == runner.outputs.logits.data_ptr()
    one = runner.run(runner.pick(1, 300 // 2), padded_inputs(anchors[:1], lengths[:1], table[:1], DraftGraphKey(1, 256)), 1)
    assert one.logits.data_ptr() == runner.outputs.logits.data_ptr()
    torch.testing.assert_close(one.logits[0], eager.logits[0], rtol=1e-5, atol=1e-5)


def test_plan_keys_for_sampled_rows_stop_at_their_batch_cap():
    from sglaunch.speculative.draft_graphs import sampled_batch_cap

    # [bucket, gamma 7, 1000 tokens] float32 within 300 kB: 8 rows (224 kB) fit, 16 do not
    assert sampled_batch_cap(BUCKETS, 7, 1000, budget=300_000) == 8
    assert sampled_batch_cap(BUCKETS, 7, 1000, budget=1000) == 0
    plan = DraftGraphPlan(BUCKETS, max_context=512, sampled_batch=10)  # 10: down to the bucket 8
    assert plan.sampled_batch == 8
    assert plan.pick(3, 129, sampled=True) == DraftGraphKey(4, 256, True)
    assert plan.pick(9, 10, sampled=True) is None and plan.pick(9, 10) == DraftGraphKey(16, MIN_CONTEXT)
    sampled = plan.keys(sampled=True)
    assert sampled and all(k.sampled and k.batch <= 8 for k in sampled)
    assert {plan.pick(b, c, sampled=True) for b in range(1, 40) for c in range(1, 600, 7)} - {None} == set(sampled)
    assert plan.all_keys() == plan.keys() + sampled
    assert DraftGraphPlan(BUCKETS, max_context=512).keys(sampled=True) == []  # no cap: no sampled graphs


def test_padded_sampling_layout():
    from sglaunch.speculative.draft_graphs import padded_sampling, sampling_from_flat

    key = DraftGraphKey(4, 8, True)
    flat = padded_sampling([0.0, 0.7], torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]), key, 3)
    assert flat.shape == (4 * 4,) and flat.dtype == torch.float32
    temps, uniforms = sampling_from_flat(flat, key, 3)
    assert temps.tolist() == pytest.approx([0.0, 0.7, 0.0, 0.0])
    assert uniforms[:2].flatten().tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert uniforms[2:].abs().sum() == 0  # the padding rows: greedy, zero uniforms
    # a step without a second chain fills the block's columns only; the chain's stay 0
    flat = padded_sampling([0.5], [[0.1, 0.2]], key, 4, out=torch.full((40,), 9.0))
    temps, uniforms = sampling_from_flat(flat, key, 4)
    assert uniforms[0].tolist() == pytest.approx([0.1, 0.2, 0.0, 0.0]) and uniforms[1:].abs().sum() == 0


@pytest.mark.parametrize("draft_vocab,chain", [(False, 0), (True, 0), (True, 3)])
def test_sampled_graph_draws_the_eager_block(tmp_path, draft_vocab, chain):
    """A sampled key's replay (the runner, with EagerCapture) over a padded batch: the tokens,
    the whole-vocabulary draft probabilities and the confidence logits of sample_block on the
    eager forward, for greedy and sampled rows at their uniforms (chain: and the sampled second
    chain of sampled_second_chain, for keys of up to SECOND_CHAIN_MAX_BATCH requests); a greedy
    replay afterwards still gives the greedy block."""
    cfg = tiny_config(markov_head_type="rnn")
    drafter = load_drafter(save_drafter(tmp_path / "d", cfg, init_drafter_state(cfg, seed=8)))
    if draft_vocab:
        drafter.restrict_vocab(range(3, cfg.vocab_size, 2))
    page_size, pool = 4, drafter.make_pool(64)
    plan = DraftGraphPlan([1, 2, 4, 8], max_context=256, sampled_batch=8)
    runner = DraftGraphRunner(drafter, pool, plan, torch.device("cpu"), capture=EagerCapture(), sampled_chain=chain)
    runner.capture_all()
    assert runner.chain == chain and runner.chain_batch == (4 if chain else 0)
    assert runner.captures == len(plan.all_keys()) == 2 * len(plan.keys())
    pages, lengths, anchors = [[2, 3], [4, 5, 6], [7]], [6, 10, 3], [10, 20, 30]
    eager, table = eager_block(drafter, cfg, pool, pages, lengths, anchors, page_size, seed=60)
    G = cfg.block_size
    temps = [0.0, 0.9, 1.3]
    uniforms = torch.rand(3, G + chain, generator=torch.Generator().manual_seed(3))
    key = runner.pick(3, max(lengths), sampled=True)
    assert key == DraftGraphKey(4, MIN_CONTEXT, True) and runner.draws_chain(key) == bool(chain)
    out = runner.run_padded(key, anchors, lengths, table, temps, uniforms)
    assert out.greedy is None and runner.sampled_replays == 1
    want = drafter.sample_block(eager, torch.tensor(anchors), torch.tensor(temps), uniforms=uniforms[:, :G])
    got = out.sampled
    assert torch.equal(got.tokens, want.tokens)
    assert got.probs.shape == (3, G, cfg.vocab_size)
    torch.testing.assert_close(got.probs, want.probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.conf_logits, want.conf_logits, rtol=1e-5, atol=1e-5)
    if draft_vocab:
        assert got.probs[:, :, 0].abs().sum() == 0 and torch.isin(got.tokens, drafter.draft_vocab).all()
    if chain:
        tokens, probs = drafter.sampled_second_chain(eager, torch.tensor(anchors), want, torch.tensor(temps),
                                                     uniforms[:, G:], chain)
        assert torch.equal(out.sampled_second[0], tokens)
        torch.testing.assert_close(out.sampled_second[1], probs, rtol=1e-5, atol=1e-6)
        # a key of more than SECOND_CHAIN_MAX_BATCH requests draws no chain
        wide = runner.pick(5, max(lengths), sampled=True)
        assert wide.batch == 8 and not runner.draws_chain(wide)
    else:
        assert out.sampled_second is None
    # the sampled draws differ from the greedy block: the test can tell the two apart
    greedy = drafter.sample_block(eager, torch.tensor(anchors), torch.zeros(3), uniforms=uniforms[:, :G],
                                  all_greedy=True)
    assert not torch.equal(greedy.tokens[1:], got.tokens[1:])
    back = runner.run_padded(runner.pick(3, max(lengths)), anchors, lengths, table)
    assert back.sampled is None and torch.equal(back.greedy.tokens, greedy.tokens)
