"""Drafter forward: shapes, non-causal block attention over the injected context (against a
naive per-request reference), batching over different context lengths, incremental context,
Markov head variants, confidence head with and without the Markov embedding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spec_helpers import feature_rows, naive_block, run_batch, tiny_config
from sglaunch.engine.distributed import TPGroup
from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
from sglaunch.speculative.drafter import DraftContextCache


def build(tmp_path, **overrides):
    cfg = tiny_config(**overrides)
    path = save_drafter(tmp_path / "ckpt", cfg, init_drafter_state(cfg, seed=3))
    return load_drafter(path)


def test_shapes_and_sampling(qwen3_ckpt):
    drafter = load_drafter(qwen3_ckpt)
    cfg = drafter.config
    cache = DraftContextCache(drafter.make_pool(64))
    for rid, n in enumerate((4, 9)):
        cache.add(rid)
        cache.append(rid, feature_rows(n, cfg, seed=rid))
    out = run_batch(drafter, cache, [0, 1], [5, 6])
    assert out.hidden.shape == (2, cfg.block_size, cfg.hidden_size)
    assert out.logits.shape == (2, cfg.block_size, cfg.vocab_size) and out.logits.dtype == torch.float32
    block = drafter.sample_block(out, torch.tensor([5, 6]), torch.tensor([0.0, 0.8]), generator=torch.Generator().manual_seed(0))
    assert block.tokens.shape == (2, cfg.block_size) and block.conf_logits.shape == (2, cfg.block_size)
    torch.testing.assert_close(block.probs.sum(-1), torch.ones(2, cfg.block_size))
    # greedy row: one-hot q at the argmax of the Markov-corrected logits
    assert torch.equal(block.tokens[0], block.logits[0].argmax(-1))
    assert torch.equal(block.probs[0].argmax(-1), block.tokens[0]) and block.probs[0].max() == 1.0
    # the sampled row's tokens have positive draft probability
    assert (block.probs[1].gather(-1, block.tokens[1][:, None]) > 0).all()


def three_requests(tmp_path, markov: str, seed: int):
    """A drafter with this Markov head and its block output for three requests (contexts of 5, 8
    and 3 feature rows, anchors 7, 8, 9)."""
    drafter = build(tmp_path, markov_head_type=markov)
    cache = DraftContextCache(drafter.make_pool(64))
    for rid, n in enumerate((5, 8, 3)):
        cache.add(rid)
        cache.append(rid, feature_rows(n, drafter.config, seed=seed + rid))
    return drafter, run_batch(drafter, cache, [0, 1, 2], [7, 8, 9])


@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
def test_all_greedy_fast_path_drafts_what_the_general_path_drafts(tmp_path, markov):
    """all_greedy skips the softmax and the draw; tokens, logits and confidences are unchanged."""
    drafter, out = three_requests(tmp_path, markov, seed=20)
    cfg = drafter.config
    greedy = torch.zeros(3)
    general = drafter.sample_block(out, torch.tensor([7, 8, 9]), greedy, uniforms=torch.rand(3, cfg.block_size))
    fast = drafter.sample_block(out, torch.tensor([7, 8, 9]), greedy, return_probs=False, all_greedy=True)
    assert torch.equal(fast.tokens, general.tokens) and fast.probs is None
    torch.testing.assert_close(fast.logits, general.logits, rtol=0, atol=0)
    torch.testing.assert_close(fast.conf_logits, general.conf_logits, rtol=0, atol=0)
    # the drafts really follow the Markov chain: slot k's token is the argmax of its corrected logits
    assert torch.equal(fast.tokens, fast.logits.argmax(-1))


@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
def test_all_sampled_path_drafts_what_the_general_path_drafts(tmp_path, markov):
    """any_greedy=False (every row samples, known on the host) skips the argmax and the one-hot
    rows; tokens, probabilities, logits and confidences equal the general path's."""
    drafter, out = three_requests(tmp_path, markov, seed=30)
    cfg = drafter.config
    temps, u = torch.tensor([0.7, 1.0, 1.3]), torch.rand(3, cfg.block_size, generator=torch.Generator().manual_seed(4))
    general = drafter.sample_block(out, torch.tensor([7, 8, 9]), temps, uniforms=u)
    sampled = drafter.sample_block(out, torch.tensor([7, 8, 9]), temps, uniforms=u, any_greedy=False)
    assert torch.equal(sampled.tokens, general.tokens)
    for a, b in ((sampled.probs, general.probs), (sampled.logits, general.logits),
                 (sampled.conf_logits, general.conf_logits)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(set(general.tokens.flatten().tolist())) > 3  # really drawn, not one token


@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
def test_batched_cached_forward_matches_naive_reference(tmp_path, markov):
    drafter = build(tmp_path, markov_head_type=markov)
    cfg = drafter.config
    cache = DraftContextCache(drafter.make_pool(128))
    lengths, anchors = (3, 11, 6), [10, 20, 30]
    feats = {rid: feature_rows(n + 4, cfg, seed=10 + rid) for rid, n in enumerate(lengths)}
    for rid, n in enumerate(lengths):
        cache.add(rid)
        cache.append(rid, feats[rid][:n])
    first = run_batch(drafter, cache, [0, 1, 2], anchors)
    # next step: append accepted rows (different counts per request), reuse the cached context
    for rid, extra in enumerate((1, 4, 2)):
        cache.append(rid, feats[rid][lengths[rid]: lengths[rid] + extra])
    second = run_batch(drafter, cache, [2, 0, 1], [anchors[2], anchors[0], anchors[1]])
    for b, rid in enumerate([0, 1, 2]):
        hidden, logits = naive_block(drafter, feats[rid][: lengths[rid]], anchors[rid])
        torch.testing.assert_close(first.hidden[b], hidden, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(first.logits[b], logits, rtol=1e-4, atol=1e-4)
    for b, (rid, extra) in enumerate([(2, 2), (0, 1), (1, 4)]):
        _, logits = naive_block(drafter, feats[rid][: lengths[rid] + extra], anchors[rid])
        torch.testing.assert_close(second.logits[b], logits, rtol=1e-4, atol=1e-4)


def test_context_beyond_length_is_invisible_and_context_matters(qwen3_ckpt):
    drafter = load_drafter(qwen3_ckpt)
    cfg = drafter.config
    cache = DraftContextCache(drafter.make_pool(64))
    cache.add("a")
    feats = feature_rows(8, cfg, seed=1)
    cache.append("a", feats)
    base = run_batch(drafter, cache, ["a"], [3]).logits
    for layer in range(cfg.num_layers):  # garbage in every slot not owned by "a"
        unused = torch.tensor(cache.free_slots)
        cache.pool.k[layer][unused] = 1e3
        cache.pool.v[layer][unused] = -1e3
    again = run_batch(drafter, cache, ["a"], [3]).logits
    torch.testing.assert_close(again, base)
    cache.crop("a", 5)  # rows 5..7 no longer context
    cropped = run_batch(drafter, cache, ["a"], [3]).logits
    torch.testing.assert_close(cropped[0], naive_block(drafter, feats[:5], 3)[1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(cropped, base)


def test_block_is_non_causal(qwen3_ckpt):
    """The anchor slot's output depends on the later MASK slots: a causal block would not."""
    drafter = load_drafter(qwen3_ckpt)
    feats = feature_rows(4, drafter.config, seed=2)
    _, logits = naive_block(drafter, feats, 7)
    # rerun with a different mask token id: slot 0 changes only if it attends to the masks
    other = dataclasses.replace(drafter.config, mask_token_id=3)
    object.__setattr__(drafter, "config", other)
    try:
        _, logits2 = naive_block(drafter, feats, 7)
        cache = DraftContextCache(drafter.make_pool(16))
        cache.add(0)
        cache.append(0, feats)
        cached = run_batch(drafter, cache, [0], [7]).logits[0]
    finally:
        object.__setattr__(drafter, "config", dataclasses.replace(other, mask_token_id=96))
    assert not torch.allclose(logits[0], logits2[0])
    torch.testing.assert_close(cached, logits2, rtol=1e-4, atol=1e-4)


def test_confidence_head_without_markov_and_pure_dflash(tmp_path):
    d1 = build(tmp_path / "a", confidence_head_with_markov=False)
    assert d1.confidence_head.proj.weight.shape == (1, 32)
    d2 = build(tmp_path / "b", markov_rank=0)  # with_markov is gated on the Markov head existing
    assert d2.markov_head is None and d2.confidence_head.proj.weight.shape == (1, 32)
    cache = DraftContextCache(d2.make_pool(16))
    cache.add(0)
    cache.append(0, feature_rows(3, d2.config, seed=0))
    out = run_batch(d2, cache, [0], [4])
    block = d2.sample_block(out, torch.tensor([4]), torch.tensor([0.0]))
    assert torch.equal(block.tokens[0], out.logits[0].argmax(-1))  # no Markov bias: U_k argmax


def test_tp_group_default_is_single_rank(qwen3_ckpt):
    drafter = load_drafter(qwen3_ckpt, tp=TPGroup(0, 1))
    assert drafter.layers[0].self_attn.heads == drafter.config.num_heads
