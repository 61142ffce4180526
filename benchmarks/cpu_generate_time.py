"""Seconds for one in-process engine to start and decode 64 greedy tokens of the cached default model on the
CPU (bf16), after a warm-up engine: a coarse check of whether a slow CPU benchmark is the machine or the tree.
Run it in the tree to check and in a worktree of another commit (`git worktree add /tmp/wt COMMIT`, then
`PYTHONPATH=/tmp/wt python benchmarks/cpu_generate_time.py` from /tmp/wt):

    python benchmarks/cpu_generate_time.py [--model DIR] [--label TEXT]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from sglaunch.config import EngineConfig
    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.launch import generate_batch
    from sglaunch.hub.default_model import cached_default_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a converted model folder (default: the cached built-in model)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    model = args.model or str(cached_default_model() or parser.error("no cached default model: run sglaunch models pull"))
    config = EngineConfig(model_path=model, tokenizer_path=model, served_model_name="t", dtype="bfloat16",
                          kv_cache_dtype="bfloat16", context_length=None, device="cpu", max_total_tokens=8192)
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8] * 8]
    generate_batch(config, prompt, SamplingParams(max_new_tokens=4, temperature=0.0))
    start = time.perf_counter()
    generate_batch(config, prompt, SamplingParams(max_new_tokens=64, temperature=0.0))
    print(f"{args.label} {time.perf_counter() - start:.2f} s for one engine + 64 tokens".strip())


if __name__ == "__main__":
    main()
