"""Whether bf16 pays on this CPU (session 26: an AMD EPYC without AVX-512 had no native bf16):
a small GEMM of a decode step's shape in fp32 and bf16, a large fp32 GEMM's GFLOP/s, and the
cached default model's greedy decode time per token in each dtype (an in-process engine; the
time of a 4-token generation subtracted from a 68-token one, so start-up and prefill drop out).

    python benchmarks/cpu_bf16_probe.py [--model DIR] [--dtypes bfloat16,float32]
"""

from __future__ import annotations

import argparse
import time


def gemm_us(rows: int, k: int, n: int, dtype, iters: int = 2000) -> float:
    import torch

    a, w = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    for _ in range(10):
        a @ w.T
    start = time.perf_counter()
    for _ in range(iters):
        a @ w.T
    return (time.perf_counter() - start) / iters * 1e6


def decode_ms_per_token(model: str, dtype: str) -> float:
    from sglaunch.config import EngineConfig
    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.launch import generate_batch

    config = EngineConfig(model_path=model, tokenizer_path=model, served_model_name="t", dtype=dtype,
                          kv_cache_dtype=dtype, context_length=None, device="cpu", max_total_tokens=8192)
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8] * 8]
    generate_batch(config, prompt, SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
    seconds = {}
    for n in (4, 68):
        start = time.perf_counter()
        generate_batch(config, prompt, SamplingParams(max_new_tokens=n, temperature=0.0))
        seconds[n] = time.perf_counter() - start
    return (seconds[68] - seconds[4]) / 64 * 1e3


def main() -> None:
    import torch

    from sglaunch.hub.default_model import cached_default_model
    from sglaunch.probe.environment import cpu_native_bf16

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a converted model folder (default: the cached built-in model)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()
    print(f"bf16 matrix instructions (/proc/cpuinfo): {cpu_native_bf16()}; torch threads {torch.get_num_threads()}")
    for dtype in (torch.float32, torch.bfloat16):
        print(f"GEMM (8 x 576) x (576 x 1536) {str(dtype)[6:]}: {gemm_us(8, 576, 1536, dtype):.0f} us")
    a = torch.randn(1024, 1024)
    for _ in range(3):
        a @ a
    start = time.perf_counter()
    for _ in range(20):
        a @ a
    print(f"GEMM 1024^3 float32: {2 * 1024 ** 3 * 20 / (time.perf_counter() - start) / 1e9:.1f} GFLOP/s")
    model = args.model or str(cached_default_model() or parser.error("no cached default model: run sglaunch models pull"))
    for dtype in args.dtypes.split(","):
        print(f"decode {dtype}: {decode_ms_per_token(model, dtype):.1f} ms/token (batch 1, 64 tokens)")


if __name__ == "__main__":
    main()
