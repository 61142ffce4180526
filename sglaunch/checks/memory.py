"""Memory estimate: weights per rank, KV bytes per token, how many tokens fit on each GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, diag
from sglaunch.probe.checkpoint import DTYPE_BYTES

MIB = 1024 * 1024


@dataclass
class GpuFit:
    index: int
    name: str
    total_mib: int
    budget_mib: int  # total x mem-fraction-static
    weights_mib: int
    kv_tokens: int  # tokens the KV pool holds on this GPU (per rank)


@dataclass
class MemoryEstimate:
    weight_bytes: int
    weight_bytes_per_rank: int
    kv_bytes_per_token: int  # one rank; target plus drafter under DSpark
    kv_dtype: str
    gpus: list[GpuFit] = field(default_factory=list)
    cpu_kv_tokens: int | None = None
    cpu_kv_mib: int | None = None
    cpu_available_mib: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def estimate_memory(ctx: LaunchContext) -> MemoryEstimate | None:
    ckpt = ctx.checkpoint
    if ckpt is None or ckpt.weight_bytes is None or not ckpt.num_layers:
        return None
    tp = max(ctx.get("tp_size"), 1)
    weights = ckpt.weight_bytes + (ctx.draft.weight_bytes or 0 if ctx.draft else 0)
    kv_dtype = ctx.get("kv_cache_dtype")
    per_token = ckpt.kv_bytes_per_token(DTYPE_BYTES.get(kv_dtype, 2), tp)
    if ctx.draft is not None and ctx.draft.num_layers:  # DSpark keeps draft K/V for every cached token
        per_token += ctx.draft.kv_bytes_per_token(DTYPE_BYTES.get(kv_dtype, 2), tp)
    estimate = MemoryEstimate(weights, weights // tp, per_token, kv_dtype)
    fraction = ctx.get("mem_fraction_static")
    if ctx.get("device") == "cuda" and fraction:
        for gpu in ctx.gpus:
            budget = int(gpu.memory_total_mib * fraction)
            kv_bytes = budget * MIB - weights // tp
            estimate.gpus.append(GpuFit(gpu.index, gpu.name, gpu.memory_total_mib, budget,
                                        weights // tp // MIB, max(kv_bytes // max(per_token, 1), 0)))
    elif ctx.get("max_total_tokens"):
        estimate.cpu_kv_tokens = ctx.get("max_total_tokens")
        estimate.cpu_kv_mib = estimate.cpu_kv_tokens * per_token * tp // MIB
        estimate.cpu_available_mib = ctx.env_info.memory_available_mib if ctx.env_info else None
    return estimate


def check_memory(ctx: LaunchContext, estimate: MemoryEstimate | None) -> list[Diagnostic]:
    if estimate is None:
        return []
    found = []
    context = ctx.get("context_length")
    for fit in estimate.gpus:
        if fit.kv_tokens <= 0:
            found.append(diag("MEM001", f"GPU {fit.index} ({fit.name}): {fit.weights_mib} MiB of weights per "
                              f"rank exceed the {fit.budget_mib} MiB that --mem-fraction-static "
                              f"{ctx.get('mem_fraction_static')} allows", flags=("--mem-fraction-static", "--tp-size"),
                              fix="raise --tp-size or --mem-fraction-static"))
        elif context and fit.kv_tokens < context:
            found.append(_short_pool(f"GPU {fit.index}", fit.kv_tokens, context))
    if estimate.cpu_kv_tokens is not None and context and estimate.cpu_kv_tokens < context:
        found.append(_short_pool("the CPU KV pool", estimate.cpu_kv_tokens, context))
    return found


def _short_pool(where: str, tokens: int, context: int) -> Diagnostic:
    return diag("MEM002", f"{where} holds {tokens} KV tokens, fewer than one request of the full context "
                f"length {context}", flags=("--max-total-tokens", "--context-length"),
                fix="lower --context-length or give the KV pool more memory")
