"""Microseconds a call of the vocabulary-split reductions (sglaunch/kernels/vocab_reduce.py) against the
torch sequences they replace, each replayed from a CUDA graph of `--reps` calls (so launch gaps
are a graph's, as in a burst iteration).

    python benchmarks/vocab_reduce_bench.py [--reps 50] [--sms N]

Rows: the drafter's add + argmax over its vocabulary (16384) at 1/8/32 requests; the target's
greedy + log-probability over 49152 at 8 rows a request (a burst's B * Q rows) in bf16.
"""

from __future__ import annotations

import argparse

import torch

from sglaunch.kernels import vocab_reduce as vr


def graph_us(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (10 * reps)


def torch_greedy(x):
    choice = x.argmax(dim=-1)
    return choice, torch.log_softmax(x.float(), dim=-1).gather(1, choice[:, None])[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    sms = vr.sm_count("cuda")
    print(f"SMs {sms}, block {vr.BLOCK}, waves {vr.WAVES}")
    print(f"{'what':<34}{'rows':>6}{'V':>7}{'chunks':>8}{'triton us':>11}{'torch us':>10}")
    for rows in (1, 8, 32):
        a = torch.randn(rows, 16384, device="cuda")
        b = torch.randn(rows, 16384, device="cuda")
        n, _ = vr.vocab_chunks(rows, 16384, sms)
        t = graph_us(lambda a=a, b=b: vr.add_argmax_triton(a, b), args.reps)
        r = graph_us(lambda a=a, b=b: (a + b).argmax(-1), args.reps)
        assert torch.equal(vr.add_argmax_triton(a, b), vr.add_argmax_reference(a, b))
        print(f"{'add_argmax (drafter)':<34}{rows:>6}{16384:>7}{n:>8}{t:>11.1f}{r:>10.1f}")
    for requests in (1, 8, 32):
        rows = 8 * requests
        x = (torch.randn(rows, 49152, device="cuda") * 3).to(torch.bfloat16)
        n, _ = vr.vocab_chunks(rows, 49152, sms)
        t = graph_us(lambda x=x: vr.greedy_logprob_triton(x), args.reps)
        r = graph_us(lambda x=x: torch_greedy(x), args.reps)
        index, lp = vr.greedy_logprob_triton(x)
        ref_index, ref_lp = vr.greedy_logprob_reference(x)
        assert torch.equal(index, ref_index)
        err = ((lp - ref_lp).abs() / (ref_lp.abs() + 1e-6)).max().item()
        print(f"{'greedy_logprob bf16 (target)':<34}{rows:>6}{49152:>7}{n:>8}{t:>11.1f}{r:>10.1f}"
              f"   max rel err {err:.1e}")


if __name__ == "__main__":
    main()
