"""The one-kernel sampling of greedy and temperature-only rows (sglaunch/kernels/sample_rows.py) on
the CPU through Triton's interpreter: the kernel against its float64 reference, the distribution it
draws from, and sampler.sample_device with SGLAUNCH_FUSED_SAMPLING=1 against the usual operators."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from sglaunch.engine.interface import SamplingParams  # noqa: E402
from sglaunch.engine.sampler import make_generator, sample_device  # noqa: E402
from sglaunch.kernels.sample_rows import temperature_sample, temperature_sample_reference  # noqa: E402


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setenv("SGLAUNCH_DSPARK_KERNELS", "triton")


def test_the_kernel_draws_where_the_float64_cdf_says(kernel):
    """Greedy rows (T = 0) take torch.argmax and its log-probability; a sampled row's token is the
    first whose running probability passes u (within float32 rounding of the boundary), with
    log_softmax's log-probability, over several blocks of a 3,000-token row."""
    torch.manual_seed(0)
    x = torch.randn(8, 3000) * 3
    temperatures = torch.tensor([0.0, 0.7, 1.0, 0.3, 2.0, 0.0, 1.3, 0.05])
    u = torch.rand(8)
    got = temperature_sample(x, temperatures, u)
    want = temperature_sample_reference(x, temperatures, u)
    greedy = temperatures < 1e-5
    assert torch.equal(got[0][greedy], x.argmax(-1)[greedy].double())
    torch.testing.assert_close(got[1], torch.log_softmax(x, -1).gather(1, got[0].long()[:, None])[:, 0].double(),
                               atol=1e-4, rtol=0)
    assert not got[2].any()
    probs = torch.softmax(x / torch.where(greedy, 1.0, temperatures)[:, None], -1).double()
    cdf = probs.cumsum(-1)
    for r in torch.nonzero(~greedy)[:, 0].tolist():
        t, target = int(got[0, r]), float(u[r]) * float(cdf[r, -1])
        below = float(cdf[r, t - 1]) if t else 0.0
        assert below <= target + 1e-6 and float(cdf[r, t]) > target - 1e-6, (r, t, int(want[0, r]))
    assert (got[0] == want[0]).float().mean() >= 0.9  # NOTE: boundaries aside, the reference's own tokens


def test_the_kernel_flags_rows_that_cannot_be_sampled(kernel):
    """A sampled row with a NaN or +inf logit is flagged (its request fails, as sampler.draw's rows
    do); a greedy row never is and takes the first NaN, as torch.argmax does."""
    x = torch.randn(4, 40)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    temperatures = torch.tensor([0.8, 0.8, 0.0, 0.8])
    got = temperature_sample(x, temperatures, torch.full((4,), 0.5))
    assert got[2].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert int(got[0, 2]) == 7 and int(got[0, 2]) == int(x[2].argmax())


def test_the_kernel_samples_the_temperatures_distribution(kernel):
    """400 draws of one 10-token row at T = 0.6 (uniforms on a grid, so every part of the CDF is
    hit): each token's share is its probability within 0.005, and a token of probability 0 (a -inf
    logit) never comes."""
    x = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -float("inf"), 1.5, -1.0, 0.7, 0.3])
    n = 400  # NOTE: grid uniforms: each share is off by at most 1 / n
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    got = temperature_sample(x.repeat(n, 1), torch.full((n,), 0.6), u)
    shares = torch.bincount(got[0].long(), minlength=10).double() / n
    probs = torch.softmax(x / 0.6, -1).double()
    assert shares[5] == 0
    torch.testing.assert_close(shares, probs, atol=5e-3, rtol=0)


@pytest.mark.parametrize("fused", ["1", "0"])
def test_sample_device_with_fused_sampling_draws_the_usual_tokens(kernel, monkeypatch, fused):
    """SGLAUNCH_FUSED_SAMPLING=1: a batch of greedy and temperature-only rows is sampled by the
    kernel, each seeded row drawing the same uniform from its generator as the usual operators do,
    so the tokens and log-probabilities are theirs; a batch with a top-p row keeps the usual path."""
    torch.manual_seed(3)
    logits = torch.randn(5, 300) * 2
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=1),
              SamplingParams(temperature=1.2, seed=2), SamplingParams(temperature=0.0), SamplingParams(temperature=0.4)]
    gens = lambda: [None, make_generator(1), make_generator(2), None, make_generator(5)]  # noqa: E731

    monkeypatch.setenv("SGLAUNCH_FUSED_SAMPLING", "0")
    usual = sample_device(logits, params, gens())
    monkeypatch.setenv("SGLAUNCH_FUSED_SAMPLING", fused)
    import sglaunch.kernels.sample_rows as rows

    calls = []
    original = rows.temperature_sample
    monkeypatch.setattr(rows, "temperature_sample", lambda *a: calls.append(1) or original(*a))
    got = sample_device(logits, params, gens())
    assert len(calls) == (fused == "1")
    assert torch.equal(got[0], usual[0]) and not got[2].any()
    torch.testing.assert_close(got[1], usual[1], atol=1e-5, rtol=0)
    filtered = params[:2] + [SamplingParams(temperature=0.9, top_p=0.8, seed=3)]
    sample_device(logits[:3], filtered, [None, make_generator(1), make_generator(3)])
    assert len(calls) == (fused == "1")  # the top-p row: the usual operators, no kernel


@pytest.mark.parametrize("switch", ["SGLAUNCH_FUSED_SAMPLING", "SGLAUNCH_FILTER_KERNEL"])
@pytest.mark.parametrize("value,device,triton,on", [
    (None, "cuda", True, True), (None, "cpu", True, False), ("1", "cpu", True, True), ("0", "cuda", True, False),
    (None, "cuda", False, False), ("1", "cuda", False, False)])
def test_fused_sampling_and_the_filter_kernel_are_on_by_default_on_cuda(monkeypatch, switch, value, device, triton, on):
    """Both switches: unset, the kernel runs on CUDA devices with Triton (measured there) and not on a
    CPU even where SGLAUNCH_DSPARK_KERNELS=triton runs the other kernels in the interpreter; 1 asks for
    it wherever the kernels run; 0 turns it off (the usual operators, the sort); without Triton it
    never runs."""
    import sglaunch.kernels as kernels
    from sglaunch.engine.sampler import filter_kernel, fused_sampling

    rule = {"SGLAUNCH_FUSED_SAMPLING": fused_sampling, "SGLAUNCH_FILTER_KERNEL": filter_kernel}[switch]
    monkeypatch.setattr(kernels, "HAS_TRITON", triton)
    monkeypatch.setenv("SGLAUNCH_DSPARK_KERNELS", "auto" if device == "cuda" else "triton")
    if value is None:
        monkeypatch.delenv(switch, raising=False)
    else:
        monkeypatch.setenv(switch, value)
    assert rule(torch.device(device)) is on


@pytest.mark.parametrize("overlap", ["0", "1"])
def test_an_engine_with_fused_sampling_gives_the_usual_seeded_outputs(kernel, checkpoints, monkeypatch, overlap):
    """A plain engine (overlap off and on) serving greedy, seeded temperature-only and top-p requests
    together: with SGLAUNCH_FUSED_SAMPLING=1 every request gets the tokens it gets without it."""
    from engine_helpers import PROMPTS, engine_config
    from sglaunch.engine.launch import generate_batch

    monkeypatch.setenv("SGLAUNCH_OVERLAP", overlap)
    prompts = PROMPTS[:4]
    params = [SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True),
              SamplingParams(max_new_tokens=12, temperature=0.8, seed=11, ignore_eos=True),
              SamplingParams(max_new_tokens=12, temperature=1.3, seed=12, ignore_eos=True),
              SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.7, seed=13, ignore_eos=True)]
    outputs = {}
    for fused in ("0", "1"):
        monkeypatch.setenv("SGLAUNCH_FUSED_SAMPLING", fused)
        outputs[fused] = [generate_batch(engine_config(checkpoints["llama"]), [p], q)[0]
                          for p, q in zip(prompts, params)]
        outputs[fused + "batched"] = generate_batch(engine_config(checkpoints["llama"]), prompts[1:3], params[1])
    assert outputs["1"] == outputs["0"] and outputs["1batched"] == outputs["0batched"]
    assert len({tuple(t) for t in outputs["1"]}) == 4


def test_the_filtered_kernel_draws_only_kept_tokens_where_its_cdf_says(kernel):
    """filtered_sample: rows with top-k, top-p, min-p (alone, together, none) beside greedy rows over
    3,000-token rows: each drawn token is one the reference filter keeps, at the place the kept
    tokens' float64 CDF puts u (within float32 rounding), with log_softmax's log-probability."""
    from sglaunch.kernels.filter_rows import threshold_filter_reference
    from sglaunch.kernels.sample_rows import filtered_sample, filtered_sample_reference

    torch.manual_seed(1)
    n, V = 8, 3000
    x = torch.randn(n, V) * 3
    temperatures = torch.tensor([0.7, 0.0, 1.0, 0.9, 1.3, 0.6, 0.0, 2.0])
    top_k = torch.tensor([V, V, 20, V, 5, 50, 3, V])
    top_p = torch.tensor([0.9, 0.5, 1.0, 1.0, 0.8, 0.95, 1.0, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.05, 0.0, 0.0, 0.0])
    u = torch.rand(n)
    got = filtered_sample(x, temperatures, u, top_k, top_p, min_p)
    want = filtered_sample_reference(x, temperatures, u, top_k, top_p, min_p)
    greedy = temperatures < 1e-5
    assert torch.equal(got[0][greedy], x.argmax(-1)[greedy].double()) and not got[2].any()
    torch.testing.assert_close(got[1], torch.log_softmax(x, -1).gather(1, got[0].long()[:, None])[:, 0].double(),
                               atol=1e-4, rtol=0)
    scale = torch.where(greedy, 1.0, temperatures)[:, None]
    kept = threshold_filter_reference(torch.softmax(x / scale, -1), top_k, top_p, min_p).double()
    cdf = kept.cumsum(-1)
    for r in torch.nonzero(~greedy)[:, 0].tolist():
        t, target = int(got[0, r]), float(u[r]) * float(cdf[r, -1])
        assert kept[r, t] > 0, (r, t)  # NOTE: never a token the filter drops
        below = float(cdf[r, t - 1]) if t else 0.0
        assert below <= target + 1e-6 and float(cdf[r, t]) > target - 1e-6, (r, t, int(want[0, r]))
    assert (got[0] == want[0]).float().mean() >= 0.9


def test_the_filtered_kernel_samples_the_filtered_distribution(kernel):
    """400 grid draws of one 10-token row at T = 0.8 with top-p 0.7 and top-k 4: each token's share is
    its renormalised kept probability within 0.005; a dropped token never comes."""
    from sglaunch.kernels.filter_rows import threshold_filter_reference
    from sglaunch.kernels.sample_rows import filtered_sample

    x = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -float("inf"), 1.5, -1.0, 0.7, 0.3])
    n = 400
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    full = lambda v, dtype=torch.float32: torch.full((n,), v, dtype=dtype)  # noqa: E731
    got = filtered_sample(x.repeat(n, 1), full(0.8), u, full(4, torch.int64), full(0.7), full(0.0))
    shares = torch.bincount(got[0].long(), minlength=10).double() / n
    kept = threshold_filter_reference(torch.softmax(x / 0.8, -1)[None], torch.tensor([4]), torch.tensor([0.7]),
                                      torch.tensor([0.0]))[0].double()
    assert (kept > 0).sum() < 4  # NOTE: top-p cuts below top-k here
    assert shares[kept == 0].sum() == 0
    torch.testing.assert_close(shares, kept, atol=5e-3, rtol=0)


@pytest.mark.parametrize("switch", ["1", "0"])
def test_sample_device_samples_filtered_rows_in_the_kernel_with_the_filter_switch(kernel, monkeypatch, switch):
    """With fused sampling on, a batch with top-k / top-p / min-p rows goes through filtered_sample
    only under SGLAUNCH_FILTER_KERNEL=1 (the threshold filter's tie rule); its seeded rows draw the
    uniforms the usual path draws, so on rows without ties at the boundary the tokens are the
    sorted filter's. With the switch off the usual operators sample them."""
    import sglaunch.kernels.sample_rows as rows

    torch.manual_seed(4)
    logits = torch.randn(5, 400) * 2
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9, seed=1),
              SamplingParams(temperature=1.0, top_k=10, seed=2), SamplingParams(temperature=0.5, seed=4),
              SamplingParams(temperature=0.9, min_p=0.1, top_p=0.8, seed=5)]
    gens = lambda: [None, make_generator(1), make_generator(2), make_generator(4), make_generator(5)]  # noqa: E731
    monkeypatch.setenv("SGLAUNCH_FUSED_SAMPLING", "0")
    usual = sample_device(logits, params, gens())
    monkeypatch.setenv("SGLAUNCH_FUSED_SAMPLING", "1")
    monkeypatch.setenv("SGLAUNCH_FILTER_KERNEL", switch)
    calls = []
    original = rows.filtered_sample
    monkeypatch.setattr(rows, "filtered_sample", lambda *a: calls.append(1) or original(*a))
    got = sample_device(logits, params, gens())
    assert len(calls) == (switch == "1")
    assert torch.equal(got[0], usual[0]) and not got[2].any()
    torch.testing.assert_close(got[1], usual[1], atol=1e-5, rtol=0)
