"""`sglaunch profile-sps`: measure forward-step time over verify-batch sizes on this machine and
write the SPS table `--speculative-dspark-sps-table-path` reads (format in docs/dspark.md).

Profile on the serving hardware with the serving dtype, TP size, attention backend and CUDA-graph
setting: the planner trims verify windows by this table. `--attention-backend` resolves exactly as
`serve` resolves it (auto: FlashInfer on CUDA when it can run, else torch). With graphs on, the
verify-shaped steps replay verify graphs of total-token tiers for `--window`, as DSpark serving
does. With `--draft-model-path` the table also holds the drafter's cost per number of requests
(`draft_points`), which the planner adds to every step. CPU works (tests, rough numbers); a GPU
gives the real staircase.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel, stderr_console
from sglaunch.errors import SglaunchError

AttentionBackend = Literal["auto", "torch", "flashinfer"]


def _token_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise SglaunchError(f"--tokens {text!r} is not a comma-separated list of integers",
                            "e.g. --tokens 1,2,4,8,16,32,64") from None
    if not sizes or sizes[0] < 1:
        raise SglaunchError(f"--tokens {text!r} needs positive sizes", "e.g. --tokens 1,2,4,8,16,32,64")
    return sizes


@funnel
def profile_sps(
    model_path: Annotated[Path, typer.Option("--model-path", help="Target checkpoint folder.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the SPS JSON.")] = Path("sps.json"),
    tokens: Annotated[str, typer.Option(help="Verify-batch sizes (tokens) to measure, comma-separated.")] =
        "1,2,4,8,16,32,64,128,256,512",
    window: Annotated[Optional[int], typer.Option(
        help="Query rows per request: the DSpark block size + 1 (default: 8, or the drafter's).")] = None,
    draft_model_path: Annotated[Optional[Path], typer.Option(
        "--draft-model-path", help="A DSpark drafter: also time its draft stage per number of requests, "
        "which the planner adds to every step's cost (as the start-up profile of compact mode does).")] = None,
    context_len: Annotated[int, typer.Option(help="Cached tokens per request.")] = 512,
    device: Annotated[Optional[str], typer.Option(help="cuda or cpu (default: cuda when available).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="bfloat16, float16 or float32 (default: bfloat16 "
                                                 "on cuda, float32 on cpu).")] = None,
    tp_size: Annotated[int, typer.Option(help="Tensor-parallel ranks, as when serving.")] = 1,
    page_size: Annotated[int, typer.Option(help="KV page size, as when serving.")] = 1,
    attention_backend: Annotated[AttentionBackend, typer.Option(
        help="Attention kernels, as when serving (auto: flashinfer on CUDA when it can run, else torch).")] = "auto",
    disable_cuda_graph: Annotated[bool, typer.Option(
        "--disable-cuda-graph", help="Run without CUDA graphs, as when serving with it.")] = False,
    repeats: Annotated[int, typer.Option(help="Timed runs per size (the median is kept).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed runs per size first.")] = 2,
    as_json: JsonOption = False,
) -> None:
    """Measure steps per second of the target over verify-batch sizes; write the SPS table."""
    import dataclasses

    import torch

    from sglaunch.checks.engine import resolve_engine_attention
    from sglaunch.config import EngineConfig
    from sglaunch.speculative.sps import save_sps_table
    from sglaunch.speculative.sps_profile import ProfilePlan, profile_draft_costs, profile_sps as measure

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    speculative = _speculative_config(draft_model_path, window)
    window = window or (speculative.num_draft_tokens if speculative else 8)
    if window < 1 or repeats < 1 or warmup < 0 or context_len < 0:
        raise SglaunchError("--window and --repeats must be >= 1, --warmup and --context-len >= 0")
    plan = ProfilePlan(_token_sizes(tokens), window, context_len, repeats, warmup)
    console = stderr_console()
    backend, warnings = resolve_engine_attention(model_path, device, dtype, attention_backend)
    for warning in warnings:
        console.print(f"Warning: {warning}")
    config = EngineConfig(model_path=str(model_path), tokenizer_path=str(model_path), served_model_name="profile",
                          dtype=dtype, context_length=None, device=device, tp_size=tp_size, page_size=page_size,
                          kv_cache_dtype=dtype, max_total_tokens=plan.kv_tokens(page_size),
                          attention_backend=backend, disable_cuda_graph=disable_cuda_graph, speculative=speculative)
    try:
        engine, cluster = _create_engine(config, window)
    except ValueError as exc:
        raise SglaunchError(str(exc), "pass a Hugging Face checkpoint folder the engine can run") from None
    graphs = engine.runner.graphs is not None
    try:
        limit = engine.limits.context_length - window
        if context_len > limit:
            plan = dataclasses.replace(plan, context_len=max(0, limit))
        table, seconds = measure(engine, plan, lambda t, s: console.print(f"{t:>6} tokens: {1e3 * s:8.3f} ms/step"))
        draft = {}
        if speculative is not None:
            draft = profile_draft_costs(engine, plan, lambda r, s: console.print(
                f"{r:>6} requests: {1e3 * s:8.3f} ms draft stage"))
            table = table.with_draft_costs(draft)
    except ValueError as exc:
        raise SglaunchError(str(exc), "lower --tokens / --context-len") from None
    finally:
        cluster.stop(engine)
    save_sps_table(table, output)
    summary = {"output": str(output), "device": device, "dtype": dtype, "tp_size": tp_size,
               "attention_backend": backend, "cuda_graph": graphs,
               "seconds_per_step": {str(t): s for t, s in seconds.items()},
               "draft_seconds_per_step": {str(r): s for r, s in draft.items()}, **table.to_json()}
    if as_json:
        print(json.dumps(summary))
        return
    print(f"wrote {output} ({len(table.tokens)} sizes, {table.steps_per_second[0]:.1f} -> "
          f"{table.steps_per_second[-1]:.1f} steps/s)")


def _speculative_config(draft_model_path: Path | None, window: int | None):
    """The drafter's engine settings (static mode: no start-up profile of its own), or None."""
    if draft_model_path is None:
        return None
    from sglaunch.config import SpeculativeConfig
    from sglaunch.speculative.drafter_config import load_drafter_config

    try:
        block = load_drafter_config(draft_model_path).block_size
    except (OSError, ValueError) as exc:
        raise SglaunchError(f"--draft-model-path {draft_model_path}: {exc}",
                            "pass a DSpark drafter folder (config.json + model.safetensors)") from None
    if window is not None and window != block + 1:
        raise SglaunchError(f"--window {window} does not match the drafter's block size {block}",
                            f"drop --window or pass --window {block + 1}")
    return SpeculativeConfig("DSPARK", str(draft_model_path), block, block + 1, "static")


def _create_engine(config, window: int):
    """Boot the engine with verify graphs captured for `window` (every rank reads it at start-up)."""
    from sglaunch.engine.launch import create_engine
    from sglaunch.engine.model_runner import VERIFY_WINDOW_ENV

    previous = os.environ.get(VERIFY_WINDOW_ENV)
    os.environ[VERIFY_WINDOW_ENV] = str(window)
    try:
        return create_engine(config)
    finally:
        if previous is None:
            os.environ.pop(VERIFY_WINDOW_ENV, None)
        else:
            os.environ[VERIFY_WINDOW_ENV] = previous
