"""The grouped training layout's attention (training/attention.py): every implementation sees
exactly the visibility of the serving forward (context rows < the block's anchor, its own block)
and gives the reference SDPA call's output and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from sglaunch.errors import SglaunchError
from sglaunch.training import attention as att
from sglaunch.training import model

from test_train_draft import fast_args  # noqa: E402  (tests/training is on sys.path under pytest)


def ctx_lens_for(S: int, A: int, T: int, seed: int) -> torch.Tensor:
    """[S, A] context lengths with 0 and T (the extremes) among them."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, T + 1, (S, A), generator=gen)
    lens[0, 0], lens[-1, -1] = 0, T
    if A > 2:
        lens[0, 1] = T
        lens[-1, 0] = 0
    return lens


def qkv(S, H, KH, A, G, T, D, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(S, H, A * G, D, generator=gen).to(dtype).requires_grad_(True)
    k = torch.randn(S, KH, T + A * G, D, generator=gen).to(dtype).requires_grad_(True)
    v = torch.randn(S, KH, T + A * G, D, generator=gen).to(dtype).requires_grad_(True)
    return q, k, v


def brute_force(q, k, v, ctx_lens, T, G, scale):
    """Attention written from the definition, query by query over its own key list (fp64)."""
    S, H, Q, D = q.shape
    rep = H // k.shape[1]
    out = torch.zeros(S, H, Q, D, dtype=torch.float64)
    for s in range(S):
        for i in range(Q):
            j = i // G
            keys = list(range(int(ctx_lens[s, j]))) + [T + j * G + x for x in range(G)]
            for h in range(H):
                kk, vv = k[s, h // rep, keys].double(), v[s, h // rep, keys].double()
                w = torch.softmax(kk @ q[s, h, i].double() * scale, 0)
                out[s, h, i] = w @ vv
    return out


def test_visibility_is_context_prefix_and_own_block_only():
    S, A, G, T = 2, 4, 3, 6
    lens = ctx_lens_for(S, A, T, 1)
    vis = att.visibility(lens, T, G)
    assert vis.shape == (S, A * G, T + A * G)
    for s in range(S):
        for i in range(A * G):
            j = i // G
            want = {t for t in range(int(lens[s, j]))} | {T + j * G + x for x in range(G)}
            assert set(vis[s, i].nonzero()[:, 0].tolist()) == want, (s, i)


def test_mask_mod_is_the_visibility():
    from torch.nn.attention.flex_attention import create_mask

    S, A, G, T = 3, 5, 7, 11
    lens = ctx_lens_for(S, A, T, 2)
    dense = create_mask(att.mask_mod_for(lens, T, G), S, 1, A * G, T + A * G, device="cpu")
    assert torch.equal(dense[:, 0], att.visibility(lens, T, G))


@pytest.mark.parametrize("block", [8, 16, 128])
def test_block_mask_tiles_are_create_block_masks(block):
    """The BlockMask built from the dense visibility classifies tiles as torch's own
    create_block_mask does (full / partial / skipped), ragged last tiles included."""
    from torch.nn.attention.flex_attention import create_block_mask

    S, A, G, T = 3, 9, 7, 37
    lens = ctx_lens_for(S, A, T, 3)
    ours = att.block_mask(lens, T, G, block=block)
    theirs = create_block_mask(att.mask_mod_for(lens, T, G), S, None, A * G, T + A * G, device="cpu",
                               BLOCK_SIZE=block)
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        a_num, b_num = getattr(ours, num), getattr(theirs, num)
        assert torch.equal(a_num.long(), b_num.long()), num
        a_idx, b_idx = getattr(ours, idx), getattr(theirs, idx)
        for s in range(S):
            for r in range(a_num.shape[2]):
                n = int(a_num[s, 0, r])
                assert sorted(a_idx[s, 0, r, :n].tolist()) == sorted(b_idx[s, 0, r, :n].tolist())
    assert torch.equal(ours.to_dense(), theirs.to_dense())


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2)])
def test_reference_and_dense_equal_the_definition(heads, kv_heads):
    S, A, G, T, D = 2, 3, 3, 5, 8
    lens = ctx_lens_for(S, A, T, 4)
    q, k, v = qkv(S, heads, kv_heads, A, G, T, D, torch.float32)
    want = brute_force(q.detach(), k.detach(), v.detach(), lens, T, G, D ** -0.5)
    for impl in ("sdpa", "dense"):
        got = att.grouped_attention(impl, q, k, v, lens, T, G, D ** -0.5)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=impl)


def test_a_wrong_mask_is_caught():
    """The definition test above can fail: a block that also sees its neighbour block, or one
    more context row, changes the output."""
    S, A, G, T, D = 1, 3, 3, 5, 8
    lens = torch.tensor([[0, 2, 4]])
    q, k, v = qkv(S, 2, 2, A, G, T, D, torch.float32)
    want = brute_force(q.detach(), k.detach(), v.detach(), lens, T, G, D ** -0.5)
    neighbour = att.visibility(lens, T, G).clone()
    neighbour[0, 0:G, T + G] = True  # block 0 sees block 1's first row
    past = att.visibility(lens, T, G).clone()
    past[0, G:2 * G, 2] = True  # block 1 (ctx_len 2) sees context row 2
    for bad in (neighbour, past):
        got = att.attend_sdpa(q, k, v, bad, D ** -0.5)
        assert (got.double() - want).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (3, 3)])
def test_dense_equals_the_reference_with_gradients(dtype, heads, kv_heads):
    S, A, G, T, D = 3, 6, 7, 20, 16
    lens = ctx_lens_for(S, A, T, 5)
    outs, grads = [], []
    gen = torch.Generator().manual_seed(9)
    g_out = torch.randn(S, heads, A * G, D, generator=gen).to(dtype)
    for impl in ("sdpa", "dense"):
        q, k, v = qkv(S, heads, kv_heads, A, G, T, D, dtype)
        out = att.grouped_attention(impl, q, k, v, lens, T, G, D ** -0.5)
        out.backward(g_out)
        outs.append(out.detach().float())
        grads.append([t.grad.float() for t in (q, k, v)])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[1], outs[0], **tol)
    for a, b, name in zip(grads[1], grads[0], "qkv"):
        torch.testing.assert_close(a, b, **tol, msg=name)


@pytest.mark.parametrize("compiled", [False, True])
def test_flex_forward_equals_the_reference(compiled):
    """flex_attention with our BlockMask on the CPU (forward only: torch has no flex backward on
    CPU). Shapes of several 128-tiles, so the compiled kernel skips tiles and trusts 'full' ones."""
    S, H, KH, A, G, T, D = 2, 4, 2, 24, 7, 150, 16
    lens = ctx_lens_for(S, A, T, 6)
    lens[1] = torch.arange(A) * 3 + 100  # sorted anchors, as sample_anchors gives
    q, k, v = (t.detach() for t in qkv(S, H, KH, A, G, T, D, torch.float32))
    want = att.attend_sdpa(q, k, v, att.visibility(lens, T, G), D ** -0.5)
    mask = att.block_mask(lens, T, G)
    assert int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum()) < S * 2 * 3  # some tiles skipped
    with torch.no_grad():
        got = att.attend_flex(q, k, v, mask, D ** -0.5, compiled=compiled)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_resolve_chooses_once_by_device(monkeypatch):
    monkeypatch.delenv(att.ENV, raising=False)
    assert att.resolve("auto", "cpu") == "sdpa"
    assert att.resolve("auto", "cuda") == "flex"
    assert att.resolve("flex", "cuda") == "flex"
    monkeypatch.setenv(att.ENV, "dense")
    assert att.resolve("auto", "cpu") == "dense"
    assert att.resolve("sdpa", "cuda") == "sdpa"  # an explicit choice beats the environment
    with pytest.raises(ValueError, match="CUDA"):
        att.resolve("flex", "cpu")
    with pytest.raises(ValueError, match="expected"):
        att.resolve("math", "cpu")


def test_trainer_step_with_dense_attention_equals_the_reference(tiny_target, prompt_file, tmp_path):
    """The whole fused loss through the drafter's grouped layout: loss and every trained
    parameter's gradient agree between the reference attention and the expanded-heads one."""
    from sglaunch.training.trainer import Trainer

    trainer = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "a", max_steps=1, num_draft_layers=2))
    trainer.setup()
    assert trainer.attention == "sdpa"
    with torch.no_grad():
        for p in model.own_parameters(trainer.drafter).values():
            p.add_(torch.randn_like(p) * 0.05)
    samples = trainer.micro_batch(0)
    results = {}
    for impl in ("sdpa", "dense"):
        trainer.set_attention(impl)
        assert all(layer.self_attn.train_attention == impl for layer in trainer.drafter.layers)
        trainer.drafter.zero_grad(set_to_none=True)
        loss, _ = trainer.compute_loss(samples, torch.Generator().manual_seed(5))
        loss.backward()
        results[impl] = (float(loss.detach()), {n: p.grad.clone() for n, p in model.own_parameters(trainer.drafter).items()
                                       if p.grad is not None})
    (ref_loss, ref), (loss, grads) = results["sdpa"], results["dense"]
    assert math.isclose(loss, ref_loss, rel_tol=1e-5)
    assert grads.keys() == ref.keys() and any("self_attn" in n for n in ref)
    for name, g in ref.items():
        err = float((grads[name] - g).norm() / g.norm().clamp_min(1e-12))
        assert err <= 1e-4, (name, err)


def test_flex_on_cpu_is_a_clear_error(tiny_target, prompt_file, tmp_path):
    from sglaunch.training.trainer import Trainer

    trainer = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "f", max_steps=1, attention="flex"))
    with pytest.raises(SglaunchError, match="CUDA"):
        trainer.setup()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex_attention's backward needs CUDA")
@pytest.mark.parametrize("impl", ["dense", "flex"])
def test_cuda_impls_equal_the_reference_with_gradients(impl):
    """On a GPU: forward and gradients of dense and compiled flex against the reference, bf16,
    a round's head layout (9 query heads, 3 KV heads, head_dim 64), several 128-tiles."""
    S, H, KH, A, G, T, D = 2, 9, 3, 40, 7, 300, 64
    lens = ctx_lens_for(S, A, T, 7)
    lens[1] = torch.arange(A) * 4 + 120
    lens = lens.cuda()
    gen = torch.Generator().manual_seed(9)
    g_out = torch.randn(S, H, A * G, D, generator=gen).to(torch.bfloat16).cuda()
    results = []
    for name in ("sdpa", impl):
        q, k, v = (t.detach().cuda().requires_grad_(True) for t in qkv(S, H, KH, A, G, T, D, torch.bfloat16))
        out = att.grouped_attention(name, q, k, v, lens, T, G, D ** -0.5)
        out.backward(g_out)
        results.append([out.detach().float()] + [t.grad.float() for t in (q, k, v)])
    for a, b, what in zip(results[1], results[0], ["out", "dq", "dk", "dv"]):
        torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2, msg=what)


def test_flex_compiles_once_for_changing_shapes():
    """A step's T and anchor count change every step: the compiled flex call (CPU forward here)
    is not recompiled for them (the mask_mod captures tensors, not those numbers)."""
    from torch._dynamo.utils import counters

    S, H, KH, G, D = 2, 4, 2, 7, 16
    graphs = []
    for A, T in [(24, 150), (20, 131), (30, 200)]:
        lens = ctx_lens_for(S, A, T, A)
        q, k, v = (t.detach() for t in qkv(S, H, KH, A, G, T, D, torch.float32))
        want = att.attend_sdpa(q, k, v, att.visibility(lens, T, G), D ** -0.5)
        with torch.no_grad():
            got = att.grouped_attention("flex", q, k, v, lens, T, G, D ** -0.5)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0] and graphs[2] == graphs[0], graphs
