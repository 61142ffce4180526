"""Mean DSpark accept length of a drafter on held-out prompts, through the real engine.

    python benchmarks/dspark_accept.py --target DIR --drafter DIR --prompts heldout.jsonl \
        [--temperatures 0 0.7] [--max-prompts 40 | --per-kind 20] [--max-new-tokens 96] [--device cpu] \
        [--json OUT.json] [--time-budget S] [--second-chain N]

Runs every prompt (JSONL, optionally .gz, with `prompt`, `messages` or `input_ids`, optional
`type` or `kind`) through the engine with `--speculative-algorithm DSPARK` in static mode (every
drafted token verified, so the figure is the drafter's, not the planner's) and prints the mean
accept length, bonus token included, per temperature and per prompt type. `--per-kind N` takes
the first N prompts of each type instead of the first `--max-prompts` lines. The JSON also holds,
per temperature and per type, the histogram of accept lengths and, per block position k, the
reach rate P(draft k accepted) and the conditional accept rate P(draft k accepted | drafts < k
accepted) (from the accept lengths: in static mode every step verifies the whole block, except
where a request's remaining token budget cuts it). `--time-budget S` stops decoding a temperature
after S seconds and reports what was measured (marked `"cut_by_time_budget": true`).
`--second-chain N` also verifies a second chain of N drafts (SGLAUNCH_DSPARK_SECOND_CHAIN; page
size 1; at T = 0 the block's runner-up chain, at T > 0 one drawn without the block's first draft),
turns bursts off (SGLAUNCH_DSPARK_BURST=0: they run one chain) and decodes at most
SECOND_CHAIN_MAX_BATCH (4) requests at once, so every drafting step can verify it; without it the
chain is off (0), whatever the device's default. Compare with `--concurrency 4` and bursts off.
Exactness is the test suite's job; this measures acceptance.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections import defaultdict
from pathlib import Path


def read_rows(path: Path) -> list[dict]:
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def select_rows(rows: list[dict], limit: int, per_kind: int | None = None) -> list[dict]:
    """The first `limit` rows, or with `per_kind` the first `per_kind` rows of each type (file order kept)."""
    if per_kind is None:
        return rows[:limit]
    taken: dict[str, int] = defaultdict(int)
    out = []
    for row in rows:
        kind = row_type(row)
        if taken[kind] < per_kind:
            taken[kind] += 1
            out.append(row)
    return out


def row_type(row: dict) -> str:
    return str(row.get("type") or row.get("kind") or "all")


def load_prompts(path: Path, tokenizer, limit: int, per_kind: int | None = None) -> list[tuple[str, list[int]]]:
    out = []
    for row in select_rows(read_rows(path), limit, per_kind):
        if "input_ids" in row:
            ids = list(row["input_ids"])
        else:
            ids = tokenizer.encode_chat(row["messages"]) if "messages" in row else tokenizer.encode(row["prompt"])
        out.append((row_type(row), ids))
    return out


def position_figures(lengths: list[int], block: int) -> dict:
    """Histogram of accept lengths (1..block+1, bonus included) and, per block position k, the
    reach rate P(n > k) and the conditional rate P(n > k | n >= k), n = accepted drafts."""
    hist = [0] * (block + 1)
    for length in lengths:
        hist[min(max(length, 1), block + 1) - 1] += 1
    total = len(lengths)
    at_least = [sum(hist[j:]) for j in range(block + 1)]  # at_least[k] = #(n >= k)
    return {
        "steps": total,
        "mean_accept_length": sum(lengths) / total if total else 0.0,
        "histogram": hist,
        "reach_rate_per_position": [round(at_least[k + 1] / total, 4) if total else 0.0 for k in range(block)],
        "accept_rate_per_position": [round(at_least[k + 1] / at_least[k], 4) if at_least[k] else 0.0
                                     for k in range(block)],
    }


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

    import os

    prompts = load_prompts(args.prompts, load_tokenizer(args.target), args.max_prompts, args.per_kind)
    block = json.loads((args.drafter / "config.json").read_text())["block_size"]
    os.environ["SGLAUNCH_DSPARK_SECOND_CHAIN"] = str(args.second_chain)  # NOTE: 0 too (CUDA's default is 3)
    os.environ["SGLAUNCH_DSPARK_SAMPLED_CHAIN"] = str(args.second_chain)  # the same chain at T > 0
    if args.second_chain:
        from sglaunch.speculative.burst import SECOND_CHAIN_MAX_BATCH

        os.environ["SGLAUNCH_DSPARK_BURST"] = "0"
        if args.concurrency > SECOND_CHAIN_MAX_BATCH:
            print(f"--second-chain: decoding {SECOND_CHAIN_MAX_BATCH} requests at once, not {args.concurrency} "
                  "(larger steps verify one chain)", flush=True)
            args.concurrency = SECOND_CHAIN_MAX_BATCH
    engine, cluster = create_engine(engine_config(args))
    results, before = {}, {"second_chains": 0, "second_chain_wins": 0}  # the stats after the last temperature
    try:
        for temperature in args.temperatures:
            # all prompts at once (continuous batching); each speculative increment carries the
            # accept length of the step that produced it, so the figures stay per request
            kinds = {f"{i}-{temperature}": kind for i, (kind, _) in enumerate(prompts)}
            lengths = defaultdict(list)  # type -> accept length of every step
            for i, (kind, ids) in enumerate(prompts):
                sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature, seed=i)
                engine.add_request(GenerateRequest(f"{i}-{temperature}", tuple(ids), sampling))
            start, cut = time.monotonic(), False
            while engine.has_work:
                if args.time_budget is not None and time.monotonic() - start > args.time_budget:
                    cut = True
                    for rid in kinds:  # what was measured so far stands; the rest is not decoded
                        engine.abort(rid)
                    break
                for out in engine.step():
                    if out.accept_length is not None:
                        lengths[kinds[out.rid]].append(out.accept_length)
            every = [n for values in lengths.values() for n in values]
            stats = engine.spec.stats.to_dict()
            results[str(temperature)] = {
                "mean_accept_length": sum(every) / max(len(every), 1),
                "per_type": {k: sum(v) / max(len(v), 1) for k, v in sorted(lengths.items())},
                "prompts": len(prompts),
                "prompts_per_type": {k: sum(1 for kind, _ in prompts if kind == k) for k in sorted({k for k, _ in prompts})},
                "steps": len(every),
                "seconds": round(time.monotonic() - start, 1),
                "cut_by_time_budget": cut,
                "all": position_figures(every, block),
                "per_type_positions": {k: position_figures(v, block) for k, v in sorted(lengths.items())},
                "second_chain": args.second_chain,
                "second_chains": stats["second_chains"] - before["second_chains"],
                "second_chain_wins": stats["second_chain_wins"] - before["second_chain_wins"],
            }
            before = stats
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
    parser.add_argument("--per-kind", type=int, help="instead of --max-prompts: the first N prompts of each type")
    parser.add_argument("--time-budget", type=float, help="seconds of decoding per temperature at most")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", type=int, default=64, help="requests decoded at once")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--second-chain", type=int, default=0,
                        help="drafts of a second chain verified (0: none); bursts off, at most 4 requests at once")
    args = parser.parse_args()
    results = run(args)
    for temperature, figures in results.items():
        types = ", ".join(f"{k} {v:.2f}" for k, v in figures["per_type"].items())
        print(f"T={temperature}: mean accept length {figures['mean_accept_length']:.2f} "
              f"over {figures['prompts']} prompts ({types})")
        if figures["second_chains"]:
            print(f"  second chain won {figures['second_chain_wins']} of {figures['second_chains']} request-steps")
        print("  conditional accept rate per position: "
              + " ".join(f"{x:.2f}" for x in figures["all"]["accept_rate_per_position"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
