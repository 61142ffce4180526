"""DSpark against plain decoding: output tokens/s over concurrency levels, per ragged verify mode.

    python benchmarks/dspark_sweep.py --model SMOLLM2_DIR --drafter DRAFTER_DIR --prompts heldout.jsonl \
        --out OUT [--concurrency 1,4,16,64,256] [--requests 4,8,32,64,256] [--max-tokens 64]
        [--modes static,compact] [--serve-args "--attention-backend torch"]

Configurations, each in its own process, in this order: `plain` (no speculation), then
`dspark-static`, `dspark-compact`, ... (SGLANG_RAGGED_VERIFY_MODE=MODE). Each builds its engine
exactly as `sglaunch serve` would from the same flags (the validation pipeline and
`build_engine_config`, so every `auto` resolves as when serving) and drives it in-process as a
closed loop: `concurrency` requests in flight, a new one queued as soon as one finishes, without
HTTP and detokenisation (left out alike for every configuration). Every configuration runs the
same workload: the prompts file's first --max-prompts prompts (JSONL with `input_ids`,
`messages` or `prompt`; chat-templated as the server does), request i of a level using prompt
i mod count, --max-tokens output tokens each (EOS ignored unless --no-ignore-eos), temperature 0.
Each configuration first runs a short warm-up at every level (compiles, caches), untimed.

Per level: output tokens/s (all output tokens / wall time from the first request queued to the
last finished), the ratio to `plain` at the same level, and for DSpark the mean accept length
(committed tokens per request-step, bonus included) and verify tokens per step (target rows
of the speculative requests per engine step) from the engine's statistics, and the drafter CUDA
graphs captured during the level (`drafter_graph_captures`: 0 expected, they are all captured
at start-up; the configuration's `drafter_graphs` says how many and how long). A level is skipped
when the configuration's share of --time-budget is spent. Writes OUT/dspark_sweep.json and
prints a short table last. Exit 1 if a configuration failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
SPEC_KEYS = ("steps", "request_steps", "committed_tokens", "verify_tokens", "step_aside_steps")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="target checkpoint folder (SmolLM2)")
    parser.add_argument("--drafter", type=Path, required=True, help="DSpark drafter folder")
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL prompts (input_ids, messages or prompt)")
    parser.add_argument("--out", type=Path, required=True, help="folder for dspark_sweep.json")
    parser.add_argument("--concurrency", default="1,4,16,64,256")
    parser.add_argument("--requests", default="auto",
                        help="requests per level, comma-separated like --concurrency "
                             "(auto: max(4, 2c) below 64, then c)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--max-prompts", type=int, default=256, help="prompts read from the file")
    parser.add_argument("--modes", default="static,compact", help="ragged verify modes to run with DSpark")
    parser.add_argument("--no-baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup-tokens", type=int, default=4, help="output tokens per warm-up request (0: none)")
    parser.add_argument("--serve-args", default="", help="more `sglaunch serve` flags, one string")
    parser.add_argument("--time-budget", type=float, default=160.0, help="seconds for all configurations")
    parser.add_argument("--config", help=argparse.SUPPRESS)  # child mode: run this configuration
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # child: time.time() to stop by
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.levels = parse_levels(args.concurrency, args.requests)
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.mode_list if split_mode(m)[0] not in ("static", "cap-accept", "compact")]
    if bad:
        parser.error(f"unknown mode(s) {bad}; choose from static, cap-accept, compact")
    return args


def default_requests(concurrency: int) -> int:
    """Two waves at low concurrency (at least 4 requests), one wave from 64 up."""
    return max(4, 2 * concurrency) if concurrency < 64 else concurrency


def parse_levels(concurrency: str, requests: str) -> list[tuple[int, int]]:
    """-> [(concurrency, requests)]; requests >= concurrency."""
    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1:
        raise SystemExit(f"--concurrency {concurrency!r}: give positive integers, e.g. 1,4,16")
    if requests == "auto":
        counts = [default_requests(c) for c in levels]
    else:
        counts = [int(n) for n in requests.split(",") if n.strip()]
        if len(counts) != len(levels):
            raise SystemExit(f"--requests has {len(counts)} values for {len(levels)} concurrency levels")
    return [(c, max(c, n)) for c, n in zip(levels, counts)]


def split_mode(item: str) -> tuple[str, dict[str, str]]:
    """`compact+SGLAUNCH_DRAFT_CUDA_GRAPH=0` -> ("compact", {"SGLAUNCH_DRAFT_CUDA_GRAPH": "0"}): a
    ragged verify mode and more environment for that configuration only."""
    mode, *assignments = item.split("+")
    env = dict(a.split("=", 1) for a in assignments if "=" in a)
    return mode, env


def configurations(args) -> list[tuple[str, str | None]]:
    """(name, ragged verify mode or None for no speculation), baseline first."""
    configs = [] if args.no_baseline else [("plain", None)]
    return configs + [(f"dspark-{mode}", mode) for mode in args.mode_list]


def serve_tokens(args, mode: str | None) -> tuple[list[str], dict[str, str]]:
    """The `sglaunch serve` flags and environment of one configuration."""
    tokens = ["--model-path", str(args.model), "--served-model-name", "bench",
              "--max-running-requests", str(max(c for c, _ in args.levels))]
    environ = {k: v for k, v in os.environ.items() if k != MODE_ENV}
    if mode is not None:
        mode, extra_env = split_mode(mode)
        tokens += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(args.drafter)]
        environ[MODE_ENV] = mode
        environ.update(extra_env)
        os.environ.update(extra_env)  # NOTE: the engine reads some variables from the process itself
    return tokens + shlex.split(args.serve_args), environ


# ----------------------------------------------------------------------------- one configuration (child)


def build_config(tokens: list[str], environ: dict[str, str]):
    """The EngineConfig `serve` would boot with these flags; SystemExit listing the errors otherwise."""
    from sglaunch.checks.pipeline import build_engine_config, run_pipeline

    report = run_pipeline(tokens, environ, mode="serve")
    if not report.ok:
        raise SystemExit("the launch does not validate: " + "; ".join(f"{d.code} {d.message}" for d in report.errors))
    return build_engine_config(report)


def load_prompt_ids(args, config) -> list[list[int]]:
    sys.path.insert(0, str(HERE))
    from dspark_accept import load_prompts

    from sglaunch.server.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer_path, config.chat_template)
    prompts = [ids for _, ids in load_prompts(args.prompts, tokenizer, args.max_prompts)]
    if not prompts:
        raise SystemExit(f"no prompts in {args.prompts}")
    return prompts


def spec_totals(engine) -> dict[str, float]:
    if engine.spec is None:
        return {}
    stats = engine.spec.stats.to_dict()
    return {key: stats[key] for key in SPEC_KEYS}


def run_level(engine, prompts: list[list[int]], concurrency: int, count: int, max_tokens: int,
              ignore_eos: bool, tag: str) -> dict:
    """Closed loop: keep `concurrency` requests in flight until `count` have finished."""
    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    graphs = drafter_graphs(engine)
    captures_before = graphs.captures if graphs is not None else 0
    queue = deque(GenerateRequest(f"{tag}-{i}", tuple(prompts[i % len(prompts)]), sampling) for i in range(count))
    in_flight = most_in_flight = output_tokens = finished = 0
    before, steps_before = spec_totals(engine), engine.counters["steps"]
    bursts_before = burst_totals(engine)
    sync(engine)
    start = time.perf_counter()
    while queue or engine.has_work:
        outputs = []
        while queue and in_flight < concurrency:
            outputs += engine.add_request(queue.popleft())
            in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        outputs += engine.step()
        for out in outputs:
            output_tokens += len(out.new_token_ids)
            if out.finished:
                in_flight, finished = in_flight - 1, finished + 1
    seconds = time.perf_counter() - start
    row = {"concurrency": concurrency, "requests": count, "finished": finished, "output_tokens": output_tokens,
           "seconds": seconds, "output_tok_s": output_tokens / seconds, "max_in_flight": most_in_flight,
           "engine_steps": engine.counters["steps"] - steps_before}
    if graphs is not None:  # NOTE: every drafter graph is captured at start-up: 0 expected
        row["drafter_graph_captures"] = graphs.captures - captures_before
    after = spec_totals(engine)
    if after:
        delta = {key: after[key] - before[key] for key in SPEC_KEYS}
        row.update(spec_steps=delta["steps"],
                   mean_accept_length=delta["committed_tokens"] / max(1, delta["request_steps"]),
                   verify_tokens_per_step=delta["verify_tokens"] / max(1, delta["steps"]),
                   verify_tokens_per_request_step=delta["verify_tokens"] / max(1, delta["request_steps"]),
                   step_aside_steps=delta["step_aside_steps"],
                   step_aside_fraction=delta["step_aside_steps"] / max(1, delta["steps"] + delta["step_aside_steps"]))
    if bursts_before is not None:  # DSpark bursts in this level: how many, their iterations, why steps did not burst
        bursts_after = burst_totals(engine)
        row["bursts"] = bursts_after["bursts"] - bursts_before["bursts"]
        row["burst_iterations"] = bursts_after["iterations"] - bursts_before["iterations"]
        row["steps_without_burst"] = {why: n - bursts_before["skipped"].get(why, 0)
                                      for why, n in bursts_after["skipped"].items()
                                      if n > bursts_before["skipped"].get(why, 0)}
    return row


def burst_totals(engine):
    """The burst policy's running counts (None: the engine does not burst)."""
    policy = getattr(engine, "burst", None)
    if policy is None:
        return None
    return {"bursts": policy.bursts, "iterations": policy.burst_iterations, "skipped": dict(policy.skipped)}


def drafter_graphs(engine):
    """The engine's DraftGraphRunner (None: no drafter, or its graphs are off)."""
    draft = engine.runner.draft
    return draft.graphs if draft is not None else None


def sync(engine) -> None:
    if engine.runner.device.type == "cuda":
        import torch

        torch.cuda.synchronize(engine.runner.device)


def run_configuration(args, name: str, mode: str | None, save=lambda result: None) -> dict:
    """Boot the engine `serve` would, warm it up, run the levels; `save(result)` after each level."""
    from sglaunch.engine.launch import create_engine

    deadline = args.deadline or float("inf")
    tokens, environ = serve_tokens(args, mode)
    start = time.perf_counter()
    config = build_config(tokens, environ)
    prompts = load_prompt_ids(args, config)
    engine, cluster = create_engine(config)
    result = {"config": name, "mode": mode, "serve_flags": tokens, "env": {MODE_ENV: mode} if mode else {},
              "device": config.device, "attention_backend": config.attention_backend,
              "disable_cuda_graph": config.disable_cuda_graph, "prompts": len(prompts),
              "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "levels": []}
    try:
        if engine.spec is not None:
            result["block_size"] = engine.spec.gamma
            result["sps_table"] = engine.spec.planner.sps is not None
            if engine.spec.planner.sps is not None:  # what the planner prices steps with (start-up profile)
                result["step_costs"] = engine.spec.planner.sps.to_json()
            graphs = drafter_graphs(engine)
            if graphs is not None:  # captured at start-up, before the profile
                result["drafter_graphs"] = {"captured": graphs.captures, "capture_seconds": graphs.capture_seconds}
        if args.warmup_tokens > 0:
            for concurrency, _ in args.levels:
                run_level(engine, prompts, concurrency, concurrency, args.warmup_tokens, True, f"warm{concurrency}")
        result["startup_s"] = time.perf_counter() - start
        log(f"{name}: ready and warm in {result['startup_s']:.1f} s")
        for concurrency, count in args.levels:
            if time.time() > deadline:
                result["levels"].append({"concurrency": concurrency, "requests": count, "skipped": "time budget"})
                log(f"{name} c={concurrency}: skipped (time budget spent)")
                continue
            row = run_level(engine, prompts, concurrency, count, args.max_tokens, args.ignore_eos, f"c{concurrency}")
            result["levels"].append(row)
            save(result)
            log(f"{name} c={concurrency}: {row['output_tok_s']:.1f} out tok/s over {row['seconds']:.1f} s"
                + (f", accept length {row['mean_accept_length']:.2f}, verify tok/step "
                   f"{row['verify_tokens_per_step']:.1f}" if "mean_accept_length" in row else ""))
    finally:
        cluster.stop(engine)
    return result


def child_main(args) -> int:
    mode = None if args.config == "plain" else args.config.removeprefix("dspark-")

    def save(partial: dict) -> None:
        args.result_file.write_text(json.dumps({**partial, "partial": True}, indent=2))

    try:
        result = run_configuration(args, args.config, mode, save)
    except BaseException as exc:  # noqa: BLE001 - recorded for the parent (SystemExit included)
        import traceback

        traceback.print_exc()
        result = {"config": args.config, "mode": mode, "error": f"{type(exc).__name__}: {exc}"}
    args.result_file.write_text(json.dumps(result, indent=2))
    return 0 if "error" not in result else 1


# ----------------------------------------------------------------------------- orchestration (parent)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def child_argv(args, name: str, deadline: float, result_file: Path) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--model", str(args.model), "--drafter", str(args.drafter),
            "--prompts", str(args.prompts), "--out", str(args.out), "--concurrency", args.concurrency,
            "--requests", ",".join(str(n) for _, n in args.levels), "--max-tokens", str(args.max_tokens),
            "--max-prompts", str(args.max_prompts), "--modes", args.modes,
            "--warmup-tokens", str(args.warmup_tokens), "--serve-args", args.serve_args,
            "--config", name, "--deadline", f"{deadline:.3f}", "--result-file", str(result_file)]
    return argv + ([] if args.ignore_eos else ["--no-ignore-eos"])


def run_children(args) -> list[dict]:
    """One child per configuration; each gets an equal share of the remaining time (plus grace
    to shut down), so a slow configuration cannot starve the later ones completely."""
    configs, results = configurations(args), []
    end = time.time() + args.time_budget
    hard_end = end + 30  # NOTE: no child outlives this, so the parent still writes its JSON
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, _) in enumerate(configs):
            share = max(0.0, end - time.time()) / (len(configs) - index)
            result_file = Path(tmp) / f"{name}.json"
            started = time.time()
            limit = max(5.0, min(share + 45, hard_end - started))
            try:
                subprocess.run(child_argv(args, name, started + share, result_file), timeout=limit, check=False)
                result = json.loads(result_file.read_text()) if result_file.exists() else \
                    {"config": name, "error": "the child wrote no result (see the log above)"}
            except subprocess.TimeoutExpired:
                result = json.loads(result_file.read_text()) if result_file.exists() else {"config": name}
                result["error"] = f"killed after {limit:.0f} s" + (" (partial)" if result.get("levels") else "")
            result["wall_s"] = time.time() - started
            results.append(result)
    return results


def add_ratios(results: list[dict]) -> None:
    """ratio = output tok/s / plain's at the same concurrency (same run), where both exist."""
    base = next((r for r in results if r.get("config") == "plain"), None)  # partial levels count too
    plain = {lv["concurrency"]: lv["output_tok_s"] for lv in (base or {}).get("levels", []) if "output_tok_s" in lv}
    for result in results:
        for level in result.get("levels", []):
            if "output_tok_s" in level and level["concurrency"] in plain:
                level["ratio_to_plain"] = level["output_tok_s"] / plain[level["concurrency"]]


def table_lines(results: list[dict]) -> list[str]:
    width = max([15] + [len(r.get("config", "")) for r in results])
    lines = [f"{'config':{width}s} {'conc':>5s} {'reqs':>5s} {'out tok/s':>10s} {'vs plain':>9s} "
             f"{'accept len':>10s} {'verify tok/step':>15s} {'verify/req-step':>15s} {'aside':>6s}"]
    for result in results:
        if "error" in result:
            lines.append(f"{result['config']:{width}s} ERROR {result['error']}")
        for lv in result.get("levels", []):
            if "skipped" in lv:
                lines.append(f"{result['config']:{width}s} {lv['concurrency']:5d} {lv['requests']:5d} "
                             f"skipped ({lv['skipped']})")
                continue
            ratio = f"{lv['ratio_to_plain']:8.2f}x" if "ratio_to_plain" in lv else f"{'-':>9s}"
            spec = (f"{lv['mean_accept_length']:10.2f} {lv['verify_tokens_per_step']:15.1f} "
                    f"{lv['verify_tokens_per_request_step']:15.2f} {100 * lv.get('step_aside_fraction', 0):5.0f}%") \
                if "mean_accept_length" in lv else f"{'-':>10s} {'-':>15s} {'-':>15s} {'-':>6s}"
            late = lv.get("drafter_graph_captures", 0)
            lines.append(f"{result['config']:{width}s} {lv['concurrency']:5d} {lv['requests']:5d} "
                         f"{lv['output_tok_s']:10.1f} {ratio} {spec}"
                         + (f"  ({late} drafter graphs captured while serving!)" if late else ""))
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.config is not None:
        return child_main(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results = run_children(args)
    add_ratios(results)
    lines = table_lines(results)
    doc = {"script": "benchmarks/dspark_sweep.py", "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M"),
           "max_tokens": args.max_tokens, "ignore_eos": args.ignore_eos, "levels": args.levels,
           "configs": results, "table": lines}
    (args.out / "dspark_sweep.json").write_text(json.dumps(doc, indent=2))
    print("\n".join(lines), flush=True)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
