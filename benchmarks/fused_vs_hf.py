"""Greedy tokens of the engine with its fused layer kernels, with the torch kernels, and of
transformers, on a real checkpoint (GPU, bf16): how often they agree token by token.

    python benchmarks/fused_vs_hf.py --model DIR [--prompts FILE.jsonl] [--tokens 48] [--count 16]

bf16 greedy decoding parts at near-ties, so the figure is the share of prompts whose first
parting comes late, plus the mean length of the common prefix, for each pair.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def engine_tokens(model: str, prompts, tokens: int, kernels: str) -> list[list[int]]:
    """In a child process, so the kernel choice (read when modules are built) is clean."""
    code = f"""
import json, os, sys
sys.path.insert(0, {str(HERE)!r}); sys.path.insert(0, {str(HERE.parent)!r})
from dspark_sweep import build_config
from sglaunch.engine.launch import generate_batch
from sglaunch.engine.interface import SamplingParams
prompts = json.loads(sys.stdin.read())
config = build_config(["--model-path", {model!r}, "--dtype", "bfloat16"], dict(os.environ))
out = generate_batch(config, prompts, SamplingParams(max_new_tokens={tokens}, temperature=0.0, ignore_eos=True))
print("RESULT" + json.dumps(out))
"""
    env = {**os.environ, "SGLAUNCH_LAYER_KERNELS": kernels}
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(prompts), capture_output=True, text=True,
                          env=env, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        raise SystemExit(f"engine ({kernels}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT"):])


def hf_tokens(model: str, prompts, tokens: int) -> list[list[int]]:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda().eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        with torch.no_grad():
            g = hf.generate(ids, max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens, pad_token_id=0)
        out.append(g[0, len(p):].tolist())
    return out


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=Path, help="JSONL with messages/prompt; default: fixed sentences")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--count", type=int, default=16)
    args = ap.parse_args()
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    texts = []
    if args.prompts:
        for line in args.prompts.read_text().splitlines()[: args.count]:
            rec = json.loads(line)
            if "messages" in rec:
                texts.append(tok.apply_chat_template(rec["messages"], tokenize=False, add_generation_prompt=True))
            else:
                texts.append(rec.get("prompt", ""))
    else:
        texts = [f"Question {i}: explain why the sky is blue in {i + 2} sentences." for i in range(args.count)]
    prompts = [tok.encode(t) for t in texts]
    runs = {"fused": engine_tokens(args.model, prompts, args.tokens, "auto"),
            "torch": engine_tokens(args.model, prompts, args.tokens, "torch"),
            "hf": hf_tokens(args.model, prompts, args.tokens)}
    result = {}
    for a, b in (("fused", "torch"), ("fused", "hf"), ("torch", "hf")):
        prefixes = [common_prefix(x, y) for x, y in zip(runs[a], runs[b])]
        result[f"{a}-{b}"] = {"identical": sum(p == args.tokens for p in prefixes),
                              "mean_common_prefix": sum(prefixes) / len(prefixes), "prompts": len(prefixes)}
        print(f"{a:>5} vs {b:<5}: identical {result[f'{a}-{b}']['identical']}/{len(prefixes)}, "
              f"mean common prefix {result[f'{a}-{b}']['mean_common_prefix']:.1f} of {args.tokens}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
