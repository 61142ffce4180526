"""Mean DSpark accept length of a drafter on held-out prompts, through the real engine.

    python benchmarks/dspark_accept.py --target DIR --drafter DIR --prompts heldout.jsonl \
        [--temperatures 0 0.7] [--max-prompts 40] [--max-new-tokens 96] [--device cpu]

Runs every prompt (JSONL with `prompt` or `messages`, optional `type`) through the engine with
`--speculative-algorithm DSPARK` in static mode (every drafted token verified, so the figure is
the drafter's, not the planner's) and prints the mean accept length, bonus token included, per
temperature and per prompt type. Exactness is the test suite's job; this measures acceptance.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load_prompts(path: Path, tokenizer, limit: int) -> list[tuple[str, list[int]]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    for row in rows[:limit]:
        if "input_ids" in row:
            ids = list(row["input_ids"])
        else:
            ids = tokenizer.encode_chat(row["messages"]) if "messages" in row else tokenizer.encode(row["prompt"])
        out.append((row.get("type", "all"), ids))
    return out


def engine_config(args, temperature_mode: str = "static"):
    from sglaunch.config import EngineConfig, SpeculativeConfig

    block = json.loads((args.drafter / "config.json").read_text())["block_size"]
    spec = SpeculativeConfig(algorithm="DSPARK", draft_model_path=str(args.drafter), block_size=block,
                             num_draft_tokens=block + 1, ragged_verify_mode=temperature_mode)
    return EngineConfig(model_path=str(args.target), tokenizer_path=str(args.target), served_model_name="bench",
                        dtype=args.dtype, context_length=None, device=args.device, max_total_tokens=65536,
                        max_running_requests=args.concurrency, speculative=spec)


def run(args) -> dict:
    from sglaunch.engine.interface import GenerateRequest, SamplingParams
    from sglaunch.engine.launch import create_engine
    from sglaunch.server.tokenizer import load_tokenizer

    prompts = load_prompts(args.prompts, load_tokenizer(args.target), args.max_prompts)
    engine, cluster = create_engine(engine_config(args))
    results = {}
    try:
        for temperature in args.temperatures:
            # all prompts at once (continuous batching); each speculative increment carries the
            # accept length of the step that produced it, so the figures stay per request
            kinds = {f"{i}-{temperature}": kind for i, (kind, _) in enumerate(prompts)}
            per_type = defaultdict(lambda: [0, 0])  # type -> [committed tokens, steps]
            for i, (kind, ids) in enumerate(prompts):
                sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature, seed=i)
                engine.add_request(GenerateRequest(f"{i}-{temperature}", tuple(ids), sampling))
            while engine.has_work:
                for out in engine.step():
                    if out.accept_length is not None:
                        per_type[kinds[out.rid]][0] += out.accept_length
                        per_type[kinds[out.rid]][1] += 1
            total = [sum(v[0] for v in per_type.values()), sum(v[1] for v in per_type.values())]
            results[str(temperature)] = {
                "mean_accept_length": total[0] / max(total[1], 1),
                "per_type": {k: v[0] / max(v[1], 1) for k, v in sorted(per_type.items())},
                "prompts": len(prompts),
                "steps": total[1],
            }
    finally:
        cluster.stop(engine)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--max-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", type=int, default=64, help="requests decoded at once")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = run(args)
    for temperature, figures in results.items():
        types = ", ".join(f"{k} {v:.2f}" for k, v in figures["per_type"].items())
        print(f"T={temperature}: mean accept length {figures['mean_accept_length']:.2f} "
              f"over {figures['prompts']} prompts ({types})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
