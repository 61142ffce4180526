"""Tokens/s of the sglaunch engine against transformers `generate`, same model and prompts.

    python benchmarks/engine_vs_hf.py                      # random-weight SmolLM2-135M shape
    python benchmarks/engine_vs_hf.py --model PATH         # any Llama/Qwen2/Qwen3 checkpoint
    python benchmarks/engine_vs_hf.py --device cuda --dtype bfloat16

Both sides decode greedily with EOS ignored, so each produces exactly batch * --new-tokens
tokens; the time covers prefill and decode (weights loaded and one warm-up run beforehand).
Each figure is the best of --repeats runs, alternating the two sides, because a shared
machine's noise only ever adds time.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    return [torch.randint(3, vocab, (length - i,), generator=gen).tolist() for i in range(batch)]


def time_hf(model, prompts: list[list[int]], new_tokens: int) -> float:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    starts = torch.tensor([width - len(p) for p in prompts], device=model.device)
    mask = (torch.arange(width, device=model.device)[None, :] >= starts[:, None]).long()
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, **kwargs)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_engine(engine, prompts: list[list[int]], new_tokens: int, tag: str) -> float:
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    requests = [GenerateRequest(f"{tag}-{i}", tuple(p), sampling) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    done = run_requests(engine, requests)
    elapsed = time.perf_counter() - start
    assert all(len(c.token_ids) == new_tokens for c in done.values())
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: random weights, SmolLM2-135M shape)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else build_random_model(Path(tmp) / "model")
        run(path, args)


def run(path: Path, args) -> None:
    dtype = getattr(torch, args.dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval().to(args.device)
    config = EngineConfig(
        model_path=str(path), tokenizer_path=str(path), served_model_name="bench", dtype=args.dtype,
        kv_cache_dtype=args.dtype, context_length=None, max_total_tokens=32768, disable_radix_cache=True,
        device=args.device,
    )
    engine, cluster = create_engine(config)
    print(f"model {path}  dtype {args.dtype}  threads {torch.get_num_threads()}  "
          f"prompt {args.prompt_len}  new tokens {args.new_tokens}")
    try:
        for batch in map(int, args.batch_sizes.split(",")):
            prompts = make_prompts(batch, args.prompt_len, hf.config.vocab_size)
            time_hf(hf, prompts, 4), time_engine(engine, prompts, 4, f"warm{batch}")  # warm-up
            hf_s, ours_s = float("inf"), float("inf")
            for r in range(args.repeats):
                hf_s = min(hf_s, time_hf(hf, prompts, args.new_tokens))
                ours_s = min(ours_s, time_engine(engine, prompts, args.new_tokens, f"b{batch}-{r}"))
            tokens = batch * args.new_tokens
            print(f"batch {batch}: transformers {tokens / hf_s:7.1f} tok/s   sglaunch {tokens / ours_s:7.1f} tok/s"
                  f"   ratio (sglaunch / transformers) {hf_s / ours_s:.2f}x", flush=True)
    finally:
        cluster.stop(engine)


if __name__ == "__main__":
    main()
