"""Tokens/s of the sglaunch engine against transformers `generate`, same model and prompts.

    python benchmarks/engine_vs_hf.py                      # random-weight SmolLM2-135M shape
    python benchmarks/engine_vs_hf.py --model PATH         # any Llama/Qwen2/Qwen3 checkpoint
    python benchmarks/engine_vs_hf.py --device cuda --dtype bfloat16

Both sides decode greedily with EOS ignored, so each produces exactly batch * --new-tokens
tokens; the time covers prefill and decode (weights loaded and one warm-up run beforehand).
Each figure is the best of --repeats runs (--stat median for the median), alternating the two
sides, because a shared machine's noise only ever adds time. On CUDA the runs are timed with
CUDA events. `benchmarks/gpu_decode.py` reuses these functions for the GPU figures.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from sglaunch.config import EngineConfig
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, run_requests

SMOLLM2_135M_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
    rope_theta=100000.0, tie_word_embeddings=True,
)


def build_random_model(folder: Path) -> Path:
    config = transformers.LlamaConfig(**SMOLLM2_135M_SHAPE)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def make_prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    # lengths length, length - 1, ... (ragged), cycling over the upper half for large batches
    return [torch.randint(3, vocab, (length - i % max(1, length // 2),), generator=gen).tolist()
            for i in range(batch)]


class Stopwatch:
    """Elapsed seconds of a block: CUDA events on a GPU (after a synchronise), perf_counter otherwise."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        if self.cuda:
            torch.cuda.synchronize()
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        else:
            self.seconds = time.perf_counter() - self._t0


def time_hf(model, prompts: list[list[int]], new_tokens: int) -> float:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    starts = torch.tensor([width - len(p) for p in prompts], device=model.device)
    mask = (torch.arange(width, device=model.device)[None, :] >= starts[:, None]).long()
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode(), Stopwatch(model.device) as watch:
        out = model.generate(ids, **kwargs)
    assert out.shape[1] == width + new_tokens, out.shape
    return watch.seconds


def time_engine(engine, prompts: list[list[int]], new_tokens: int, tag: str) -> float:
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    requests = [GenerateRequest(f"{tag}-{i}", tuple(p), sampling) for i, p in enumerate(prompts)]
    with Stopwatch(engine.runner.device) as watch:
        done = run_requests(engine, requests)
    assert all(len(c.token_ids) == new_tokens for c in done.values())
    return watch.seconds


def engine_config(path: Path, dtype: str, device: str, max_total_tokens: int = 32768, **options) -> EngineConfig:
    """The engine settings both scripts use; `options` are further EngineConfig fields
    (attention_backend, disable_cuda_graph, cuda_graph_max_bs, ...)."""
    return EngineConfig(
        model_path=str(path), tokenizer_path=str(path), served_model_name="bench", dtype=dtype,
        kv_cache_dtype=dtype, context_length=None, max_total_tokens=max_total_tokens, disable_radix_cache=True,
        device=device, **options,
    )


def compare_batch(hf, engine, batch: int, prompt_len: int, new_tokens: int, repeats: int,
                  stat: str = "best") -> dict:
    """Warm both sides up, then time them alternately; -> tokens/s per side and the ratio."""
    prompts = make_prompts(batch, prompt_len, hf.config.vocab_size)
    time_hf(hf, prompts, 4), time_engine(engine, prompts, 4, f"warm{batch}")  # warm-up
    hf_runs, ours_runs = [], []
    for r in range(repeats):
        hf_runs.append(time_hf(hf, prompts, new_tokens))
        ours_runs.append(time_engine(engine, prompts, new_tokens, f"b{batch}-{r}"))
    pick = min if stat == "best" else statistics.median
    hf_s, ours_s = pick(hf_runs), pick(ours_runs)
    tokens = batch * new_tokens
    return {"batch": batch, "new_tokens": new_tokens, "prompt_len": prompt_len, "stat": stat,
            "hf_seconds": hf_runs, "engine_seconds": ours_runs, "hf_tok_s": tokens / hf_s,
            "engine_tok_s": tokens / ours_s, "ratio": hf_s / ours_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: random weights, SmolLM2-135M shape)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--stat", default="best", choices=["best", "median"], help="figure kept of the repeats")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else build_random_model(Path(tmp) / "model")
        run(path, args)


def run(path: Path, args) -> None:
    dtype = getattr(torch, args.dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval().to(args.device)
    engine, cluster = create_engine(engine_config(path, args.dtype, args.device))
    print(f"model {path}  dtype {args.dtype}  threads {torch.get_num_threads()}  "
          f"prompt {args.prompt_len}  new tokens {args.new_tokens}")
    try:
        for batch in map(int, args.batch_sizes.split(",")):
            row = compare_batch(hf, engine, batch, args.prompt_len, args.new_tokens, args.repeats, args.stat)
            print(f"batch {batch}: transformers {row['hf_tok_s']:7.1f} tok/s   "
                  f"sglaunch {row['engine_tok_s']:7.1f} tok/s"
                  f"   ratio (sglaunch / transformers) {row['ratio']:.2f}x", flush=True)
    finally:
        cluster.stop(engine)


if __name__ == "__main__":
    main()
