"""The vocabulary-split reductions (sglaunch/kernels/vocab_reduce.py): add + argmax (the drafter's greedy
Markov step) and greedy choice + log-probability (the target's, in bursts and CUDA graphs),
against their torch references. On CPU through Triton's interpreter, natively on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from engine_helpers import triton_or_skip

triton_or_skip()

from sglaunch.kernels import layer_ops, vocab_reduce

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# chunk counts: the automatic one, one chunk (no combine), several, more than the blocks allow
CHUNKS = [None, 1, 3, 64]


def greedy_close(x, chunks=None):
    """The fused greedy choice + log-probability of x equals the reference: the index exactly,
    the log-probability to float32 summation order (1e-5 relative; 1e-6 absolute near 0, where
    float32's log(sum) rounds the reference itself)."""
    index, lp = vocab_reduce.greedy_logprob_triton(x, chunks)
    ref_index, ref_lp = vocab_reduce.greedy_logprob_reference(x)
    assert index.dtype == torch.int64 and lp.dtype == torch.float32
    assert torch.equal(index, ref_index)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_chunk_counts_come_from_static_shapes():
    # few rows: many chunks, whole blocks each; many rows: one chunk (no combine kernel)
    assert vocab_reduce.vocab_chunks(1, 16384, 132) == (16, 1024)
    assert vocab_reduce.vocab_chunks(8, 49152, 132) == (48, 1024)
    assert vocab_reduce.vocab_chunks(32, 16384, 132) == (16, 1024)
    assert vocab_reduce.vocab_chunks(256, 49152, 132) == (3, 16384)
    assert vocab_reduce.vocab_chunks(4096, 49152, 132) == (1, 49152)
    assert vocab_reduce.vocab_chunks(1, 7, 132) == (1, 1024)
    assert vocab_reduce.vocab_chunks(1, 10 ** 6, 132) == (62, 16384)  # at most MAX_CHUNKS
    assert vocab_reduce.vocab_chunks(1, 5000, 132, chunks=3) == (3, 2048)
    for rows, V in [(1, 16384), (8, 49155), (64, 49152)]:
        n, size = vocab_reduce.vocab_chunks(rows, V, 132)
        assert (n - 1) * size < V <= n * size and size % vocab_reduce.BLOCK == 0


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("V", [7, 3000, 16384 + 5])
def test_add_argmax_split_matches_reference(V, chunks):
    torch.manual_seed(V)
    a = torch.randn(4, V, device=DEVICE)
    b = torch.randn(4, V, device=DEVICE)
    assert torch.equal(vocab_reduce.add_argmax_triton(a, b, chunks), layer_ops.add_argmax_reference(a, b))


@pytest.mark.parametrize("chunks", [None, 1, 3])
def test_add_argmax_ties_and_nan_as_torch(chunks):
    V = 3000  # chunks of 1024 (three of them), blocks of 1024
    a = torch.zeros(7, V, device=DEVICE)
    b = torch.zeros(7, V, device=DEVICE)
    a[0, 1500] = a[0, V - 1] = 2.0  # a tie across chunks
    a[1, 5] = b[1, 7] = 1.0  # a tie inside a block, one from each input
    a[2] = 1.0  # all equal: index 0
    a[3, 1023] = a[3, 1024] = a[3, 2048] = 3.0  # both sides of chunk boundaries
    a[4, 2000] = float("nan")
    a[4, 2500] = float("nan")  # torch: the first NaN, even past a larger value
    a[4, 10] = 5.0
    a[5] = float("-inf")  # nothing finite: index 0
    b[6, 1100] = float("inf")
    b[6, 2999] = float("inf")
    out = vocab_reduce.add_argmax_triton(a, b, chunks)
    assert torch.equal(out, layer_ops.add_argmax_reference(a, b)), out


def test_add_argmax_reads_strided_rows():
    # the drafter passes out.logits[:, k]: rows G * V apart
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 5000, device=DEVICE)
    bias = torch.randn(3, 5000, device=DEVICE)
    for k in (0, 3):
        got = layer_ops.add_argmax_triton(logits[:, k], bias)
        assert torch.equal(got, layer_ops.add_argmax_reference(logits[:, k], bias))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunks", CHUNKS)
def test_greedy_logprob_matches_reference(dtype, chunks):
    torch.manual_seed(3)
    greedy_close((torch.randn(5, 16384 + 5) * 3).to(dtype).to(DEVICE), chunks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_logprob_small_and_peaked_rows(dtype):
    torch.manual_seed(4)
    greedy_close((torch.randn(3, 7) * 2).to(dtype).to(DEVICE))
    # confident rows: log-probabilities near 0 (and one near -log V: a flat row)
    x = torch.randn(4, 5000)
    x[0, 17] = 30.0
    x[1, 4999] = 12.0
    x[2, 2048] = 9.0
    x[3] = 0.5
    for chunks in (None, 1):
        greedy_close(x.to(dtype).to(DEVICE), chunks)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter computes both sides of a where
def test_greedy_logprob_ties_nan_and_infinities():
    V = 3000
    x = torch.randn(6, V) * 0.1
    x[0, 1500] = x[0, V - 1] = 4.0  # across chunks
    x[1, 1023] = x[1, 1024] = 4.0  # a chunk boundary
    x[2] = 0.25  # all equal
    x[3, 700] = float("nan")  # the first NaN, log-probability NaN
    x[3, 100] = 9.0
    x[4] = float("-inf")  # nothing finite: index 0, NaN
    x[5, :2000] = float("-inf")  # -inf in part of the row, the rest finite
    for dtype in DTYPES:
        for chunks in (None, 1, 3):
            greedy_close(x.to(dtype).to(DEVICE), chunks)


def test_greedy_logprob_strided_rows_and_empty():
    torch.manual_seed(6)
    x = torch.randn(4, 2, 3000, device=DEVICE).to(torch.bfloat16)
    greedy_close(x[:, 1])
    index, lp = vocab_reduce.greedy_logprob_triton(torch.zeros(0, 100, device=DEVICE))
    assert index.shape == (0,) and lp.shape == (0,)


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="greedy_logprob"):
        vocab_reduce.greedy_logprob_triton(torch.zeros(2, 8, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="greedy_logprob"):
        vocab_reduce.greedy_logprob_triton(torch.zeros(2, 2, 8, device=DEVICE))
    with pytest.raises(ValueError, match="add_argmax"):
        vocab_reduce.add_argmax_triton(torch.zeros(2, 8, device=DEVICE), torch.zeros(2, 9, device=DEVICE))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_both_replay_in_a_cuda_graph():
    # the chunk counts are static, the partials come from the graph's pool: a capture replays
    for rows, V in [(1, 16384), (8, 49152), (256, 49152)]:
        x = torch.randn(rows, V, device="cuda").to(torch.bfloat16)
        a = torch.randn(rows, V, device="cuda")
        b = torch.randn(rows, V, device="cuda")
        for _ in range(2):  # warm-up: compiles outside the capture
            vocab_reduce.greedy_logprob_triton(x)
            vocab_reduce.add_argmax_triton(a, b)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            index, lp = vocab_reduce.greedy_logprob_triton(x)
            arg = vocab_reduce.add_argmax_triton(a, b)
        for seed in range(3):
            torch.manual_seed(seed)
            x.copy_(torch.randn(rows, V, device="cuda") * 4)
            a.normal_()
            b.normal_()
            graph.replay()
            ref_index, ref_lp = vocab_reduce.greedy_logprob_reference(x)
            assert torch.equal(index, ref_index)
            torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
            assert torch.equal(arg, layer_ops.add_argmax_reference(a, b))
