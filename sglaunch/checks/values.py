"""Ranges and flags that only make sense together."""

from __future__ import annotations

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, diag

# dest -> (lowest allowed, highest allowed, what a user should write)
RANGES: dict[str, tuple[float | None, float | None, str]] = {
    "port": (1, 65535, "a TCP port between 1 and 65535"),
    "tp_size": (1, None, "a size of at least 1"),
    "dp_size": (1, None, "a size of at least 1"),
    "pp_size": (1, None, "a size of at least 1"),
    "ep_size": (1, None, "a size of at least 1"),
    "nnodes": (1, None, "at least 1 node"),
    "node_rank": (0, None, "a rank of 0 or more"),
    "page_size": (1, None, "at least 1 token per page"),
    "context_length": (1, None, "a positive token count"),
    "max_total_tokens": (1, None, "a positive token count"),
    "max_running_requests": (1, None, "at least 1 request"),
    "cuda_graph_max_bs_decode": (1, None, "a batch size of at least 1"),
    "linear_replayssm_cache_len": (1, None, "a ring length of at least 1"),
    "base_gpu_id": (0, None, "a GPU index of 0 or more"),
    "max_request_body_mb": (0.001, None, "a positive size in MiB, e.g. 8"),
    "graceful_shutdown_timeout": (0, None, "0 or more seconds (0: abort running requests at once)"),
    "stream_interval": (1, None, "1 (stream every token) or more tokens per stream event"),
}


def check_ranges(ctx: LaunchContext) -> list[Diagnostic]:
    found = []
    for dest, (low, high, what) in RANGES.items():
        value = ctx.known(dest)
        if isinstance(value, (int, float)) and ((low is not None and value < low) or
                                                (high is not None and value > high)):
            flag = ctx.settings.schema.by_dest(dest).name
            found.append(diag("FLAG011", f"{flag} {value} is out of range", flags=(flag,),
                              origin=ctx.origin(dest), fix=f"use {what}"))
    fraction = ctx.known("mem_fraction_static")
    if fraction is not None and not 0 < fraction <= 1:
        found.append(diag("FLAG011", f"--mem-fraction-static {fraction} is not a fraction",
                          flags=("--mem-fraction-static",), origin=ctx.origin("mem_fraction_static"),
                          fix="use a value in (0, 1], e.g. 0.85"))
    chunk = ctx.known("chunked_prefill_size")
    if chunk is not None and chunk != -1 and chunk < 1:
        found.append(diag("FLAG011", f"--chunked-prefill-size {chunk} is out of range",
                          flags=("--chunked-prefill-size",), origin=ctx.origin("chunked_prefill_size"),
                          fix="use a positive token count, or -1 to turn chunking off"))
    return found


def check_inert_flags(ctx: LaunchContext) -> list[Diagnostic]:
    """Flags given where something else switches them off."""
    found = []
    if ctx.get("disable_cuda_graph"):
        for dest in ("cuda_graph_max_bs_decode", "cuda_graph_bs_decode"):
            if ctx.given(dest) and ctx.origin(dest) != "resolved":
                flag = ctx.settings.schema.by_dest(dest).name
                found.append(diag("FLAG013", f"{flag} has no effect with --disable-cuda-graph",
                                  flags=(flag, "--disable-cuda-graph"), origin=ctx.origin(dest),
                                  fix=f"drop {flag} or --disable-cuda-graph"))
    dspark_only = [d for d in ("speculative_dspark_block_size", "speculative_dspark_sps_table_path",
                               "speculative_dspark_confidence_sts_path",
                               "speculative_dspark_align_verify_tokens_to_graph_tier")
                   if ctx.given(d) and ctx.origin(d) != "resolved"]
    if dspark_only and not ctx.dspark:
        names = tuple(ctx.settings.schema.by_dest(d).name for d in dspark_only)
        found.append(diag("SPEC011", f"{', '.join(names)} only apply to DSpark, which is not enabled",
                          flags=names + ("--speculative-algorithm",),
                          fix="add --speculative-algorithm DSPARK, or drop these flags"))
    return found
