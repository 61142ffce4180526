"""The fused decoder-layer kernels (sglaunch/kernels/layer_ops.py) against their torch references, on
random inputs in every dtype the engine serves. On CPU through Triton's interpreter (set before
triton is imported), natively on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from engine_helpers import triton_or_skip  # noqa: E402

triton_or_skip()

from sglaunch.kernels import layer_ops  # noqa: E402
from sglaunch.engine.distributed import TPGroup  # noqa: E402
from sglaunch.engine.model_runner import ModelRunner  # noqa: E402
from sglaunch.engine.model_spec import load_model_spec  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(autouse=True)
def _rounding(interpreter_rounds_like_the_gpu):
    pass


def rand(*shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + 0.1).to(dtype).to(DEVICE)


def assert_close_bits(out, ref, dtype, max_mismatch=0.002):
    """Equal except a rare last-bit difference (a float32 row sum in another order)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    diff = (out.float() - ref.float()).abs()
    tol = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float32: 1e-5}[dtype]
    assert torch.all(diff <= tol * (ref.float().abs() + 0.05)), diff.max()
    if dtype != torch.float32:  # float32 results differ in their last bits wherever a sum's order does
        assert (diff > 0).float().mean().item() <= max_mismatch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", [(1, 576), (7, 64), (33, 2048)])
def test_rms_norm(dtype, n, d):
    x, w = rand(n, d, dtype=dtype, seed=n + d, scale=3), rand(d, dtype=dtype, seed=1)
    assert_close_bits(layer_ops.rms_norm_triton(x, w, 1e-5), layer_ops.rms_norm_reference(x, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_on_a_strided_view(dtype):
    # Qwen3's q/k norm: [n, heads, head_dim] views into the packed qkv projection
    qkv = rand(5, 3 * 4 * 32, dtype=dtype, seed=2, scale=2)
    q = qkv[:, : 4 * 32].view(5, 4, 32)
    assert not q.is_contiguous()
    w = rand(32, dtype=dtype, seed=3)
    assert_close_bits(layer_ops.rms_norm_triton(q, w, 1e-6), layer_ops.rms_norm_reference(q, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", [(1, 576), (9, 960)])
def test_add_rms_norm(dtype, n, d):
    x, r = rand(n, d, dtype=dtype, seed=4, scale=2), rand(n, d, dtype=dtype, seed=5, scale=4)
    w = rand(d, dtype=dtype, seed=6)
    out, summed = layer_ops.add_rms_norm_triton(x, r, w, 1e-5)
    ref_out, ref_summed = layer_ops.add_rms_norm_reference(x, r, w, 1e-5)
    assert torch.equal(summed, ref_summed)  # the residual stream is bit-exact
    assert_close_bits(out, ref_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,inter", [(1, 1536), (6, 100), (3, 3000)])
def test_silu_and_mul(dtype, n, inter):
    x = rand(n, 2 * inter, dtype=dtype, seed=inter, scale=3)
    out, ref = layer_ops.silu_and_mul_triton(x), layer_ops.silu_and_mul_reference(x)
    assert_close_bits(out, ref, dtype, max_mismatch=0.01)  # exp's last bit


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hq,hk,d", [(1, 9, 3, 64), (11, 4, 2, 128), (3, 2, 1, 16)])
def test_rotary_on_views_of_the_qkv_projection(dtype, n, hq, hk, d):
    qkv = rand(n, (hq + 2 * hk) * d, dtype=dtype, seed=n * d, scale=2)
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(n, hk, d)
    positions = torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(7)).to(DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.arange(512).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(DEVICE), emb.sin().to(DEVICE)
    q_out, k_out = layer_ops.rotary_triton(positions, q, k, cos, sin)
    q_ref, k_ref = layer_ops.rotary_reference(positions, q, k, cos, sin)
    if DEVICE.type == "cpu":  # the interpreter rounds each product as eager torch does: bit-exact
        assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    else:  # NOTE: on the GPU the products stay in float32 (one rounding, not three): within a step
        tol = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float32: 1e-6}[dtype]
        for out, ref, x in ((q_out, q_ref, q), (k_out, k_ref, k)):
            bound = 2 * tol * x.float().abs().amax(dim=-1, keepdim=True) + 1e-6
            assert torch.all((out.float() - ref.float()).abs() <= bound)
    assert q_out.is_contiguous() and k_out.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,hq,hk,d", [(1, 9, 3, 64), (6, 4, 2, 128)])
def test_rotary_store_writes_the_pool_rows(dtype, n, hq, hk, d):
    qkv = rand(n, (hq + 2 * hk) * d, dtype=dtype, seed=n + d, scale=2)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k, v = q.view(n, hq, d), k.view(n, hk, d), v.view(n, hk, d)
    positions = torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    slots = torch.randperm(40, generator=torch.Generator().manual_seed(4))[:n].to(DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.arange(512).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([emb, emb], dim=-1)
    cos, sin = emb.cos().to(DEVICE), emb.sin().to(DEVICE)
    caches = {kind: [rand(40, hk, d, dtype=dtype, seed=9), rand(40, hk, d, dtype=dtype, seed=10)]
              for kind in ("triton", "torch")}
    q_out = layer_ops.rotary_store_triton(positions, q, k, v, cos, sin, *caches["triton"], slots)
    q_ref = layer_ops.rotary_store_reference(positions, q, k, v, cos, sin, *caches["torch"], slots)
    untouched = torch.ones(40, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    for got, want in zip(caches["triton"], caches["torch"]):
        assert torch.equal(got[untouched], want[untouched])  # other rows untouched
        if DEVICE.type == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, atol=0.05, rtol=2 ** -7)
    torch.testing.assert_close(q_out, q_ref, atol=0.0 if DEVICE.type == "cpu" else 0.05,
                               rtol=0.0 if DEVICE.type == "cpu" else 2 ** -7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,hq,hk,d", [(1, 9, 3, 64), (5, 8, 2, 128)])
def test_rotary_store_with_the_qk_norm_is_the_norm_then_the_rotation(dtype, n, hq, hk, d):
    """Qwen3's q/k RMSNorm folded into the rotary-store kernel: the same values as the separate
    norm kernels followed by the rotary store, and as the torch reference, on strided q/k views."""
    qkv = rand(n, (hq + 2 * hk) * d, dtype=dtype, seed=n + d + 1, scale=3)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k, v = q.view(n, hq, d), k.view(n, hk, d), v.view(n, hk, d)
    qw, kw = rand(d, dtype=dtype, seed=21, scale=0.5), rand(d, dtype=dtype, seed=22, scale=0.5)
    positions = torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    slots = torch.randperm(40, generator=torch.Generator().manual_seed(6))[:n].to(DEVICE)
    inv_freq = 1.0 / (1000000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.arange(512).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([emb, emb], dim=-1)
    cos, sin = emb.cos().to(DEVICE), emb.sin().to(DEVICE)
    caches = {kind: [rand(40, hk, d, dtype=dtype, seed=11), rand(40, hk, d, dtype=dtype, seed=12)]
              for kind in ("fused", "separate", "torch")}
    got = layer_ops.rotary_store_triton(positions, q, k, v, cos, sin, *caches["fused"], slots,
                                        q_weight=qw, k_weight=kw, eps=1e-6)
    separate = layer_ops.rotary_store_triton(positions, layer_ops.rms_norm_triton(q, qw, 1e-6),
                                             layer_ops.rms_norm_triton(k, kw, 1e-6), v, cos, sin,
                                             *caches["separate"], slots)
    ref = layer_ops.rotary_store_reference(positions, q, k, v, cos, sin, *caches["torch"], slots,
                                           q_weight=qw, k_weight=kw, eps=1e-6)
    plain = layer_ops.rotary_store_triton(positions, q, k, v, cos, sin, *[c.clone() for c in caches["torch"]],
                                          slots)
    assert not torch.allclose(plain.float(), ref.float(), atol=0.1)  # the norm changes q
    # the norm's float32 row sum runs over two halves here, over the whole head in its own
    # kernel: a rare last-bit difference at most
    assert_close_bits(got, separate, dtype, max_mismatch=0.01)
    for a, b in zip(caches["fused"], caches["separate"]):
        assert_close_bits(a, b, dtype, max_mismatch=0.01)
    torch.testing.assert_close(got, ref, atol=0.05, rtol=2 ** -6)
    for a, b in zip(caches["fused"], caches["torch"]):
        torch.testing.assert_close(a, b, atol=0.05, rtol=2 ** -6)
    with pytest.raises(ValueError, match="both weights"):
        layer_ops.rotary_store_triton(positions, q, k, v, cos, sin, *caches["fused"], slots, q_weight=qw)


def test_empty_batches():
    x = torch.empty(0, 64, dtype=torch.float32, device=DEVICE)
    w = torch.ones(64, device=DEVICE)
    assert layer_ops.rms_norm_triton(x, w, 1e-5).shape == (0, 64)
    assert layer_ops.silu_and_mul_triton(torch.empty(0, 64, device=DEVICE)).shape == (0, 32)


def runner_for(path, dtype, kernels, monkeypatch):
    from engine_helpers import engine_config

    monkeypatch.setenv("SGLAUNCH_LAYER_KERNELS", kernels)
    config = engine_config(path, page_size=4, dtype=dtype, kv_cache_dtype=dtype)
    return ModelRunner(config, load_model_spec(str(path)), TPGroup(0, 1), torch.device("cpu"), False)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the CPU's forward through the interpreter")
@pytest.mark.parametrize("name", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_decoder_computes_what_the_torch_decoder_does(name, dtype, checkpoints, monkeypatch):
    """The whole model with every fused kernel (Qwen3: q/k norm on strided views too) against
    the same weights on the torch path: a ragged prefill, then decode-like and verify-like rows
    on the paged prefix."""
    from test_exactness import prefill_step

    from engine_helpers import PROMPTS

    runners = {k: runner_for(checkpoints[name], dtype, k, monkeypatch) for k in ("torch", "triton")}
    assert runners["triton"].model.model.norm.fused and not runners["torch"].model.model.norm.fused
    prompts = PROMPTS[:3]
    tables, first = [], 0
    for p in prompts:
        n = -(-len(p) // 4)
        tables.append(list(range(first, first + n)))
        first += n
    cut = [max(1, len(p) - 2) for p in prompts]
    logits = {}
    for kind, runner in runners.items():
        with torch.inference_mode():
            head = runner.forward(prefill_step([p[:c] for p, c in zip(prompts, cut)], [0] * 3,
                                               [t[: -(-c // 4)] for t, c in zip(tables, cut)]))
            tail = runner.forward(prefill_step(prompts, cut, tables))
        logits[kind] = torch.cat([head, tail])
    if dtype == "float32":
        torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=0)
    else:  # bf16 rounding steps as eager torch's; only a norm's row-sum order differs
        torch.testing.assert_close(logits["triton"], logits["torch"], atol=0.05, rtol=0)
        assert (logits["triton"].argmax(-1) == logits["torch"].argmax(-1)).float().mean() > 0.95


def test_layer_kernel_choice(monkeypatch):
    from sglaunch.engine.layers import use_layer_kernels

    monkeypatch.setenv("SGLAUNCH_LAYER_KERNELS", "auto")
    assert use_layer_kernels("cpu") is False
    monkeypatch.setenv("SGLAUNCH_LAYER_KERNELS", "torch")
    assert use_layer_kernels("cuda") is False
    monkeypatch.setenv("SGLAUNCH_LAYER_KERNELS", "triton")
    assert use_layer_kernels("cpu") is True
    monkeypatch.setenv("SGLAUNCH_LAYER_KERNELS", "fast")
    with pytest.raises(ValueError, match="auto, torch or triton"):
        use_layer_kernels("cpu")


@pytest.mark.parametrize("V", [7, 4096, 16384, 49152 + 3])
def test_add_argmax_matches_reference(V):
    torch.manual_seed(V)
    a = torch.randn(5, V, device=DEVICE)
    b = torch.randn(5, V, device=DEVICE)
    assert torch.equal(layer_ops.add_argmax_triton(a, b), layer_ops.add_argmax_reference(a, b))
    # ties, inside one block and across blocks: the first index of the maximum, as torch.argmax
    a.zero_(), b.zero_()
    a[0, V // 2] = a[0, V - 1] = 2.0
    a[1, 0] = b[1, V - 1] = 1.0
    a[2:] = 1.0
    assert torch.equal(layer_ops.add_argmax_triton(a, b), layer_ops.add_argmax_reference(a, b))


def test_add_argmax_rejects_mixed_inputs():
    with pytest.raises(ValueError, match="add_argmax"):
        layer_ops.add_argmax_triton(torch.zeros(2, 8, device=DEVICE), torch.zeros(2, 8, device=DEVICE).half())
