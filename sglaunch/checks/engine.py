"""What sglaunch's own engine runs, and what it only accepts for SGLang compatibility.

In `serve` mode a configuration the engine cannot honour is an error; in `check` mode
(validating a launch for SGLang itself) it is a warning.
"""

from __future__ import annotations

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, Severity, diag
from sglaunch.checks.resolve import DTYPE_NAMES, ENGINE_ATTENTION, flashinfer_unusable
from sglaunch.flags.spec import Status, Support

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# compat flags whose non-default value changes what runs, so ignoring them is not an option
CANNOT_IGNORE = ("dp_size", "pp_size", "quantization", "enable_dp_attention", "speculative_draft_model_quantization")
# SGLang flags that change what a client gets back (another model, other outputs, another API);
# serving as if they were not given would answer with something else than asked. dest -> why.
# Every other SGLang flag our engine lacks is tuning or deployment detail: accepted, one warning.
CANNOT_HONOUR = {
    "enable_lora": "sglaunch serves no LoRA adapters; requests naming one would get the base model",
    "lora_paths": "sglaunch serves no LoRA adapters; requests naming one would get the base model",
    "is_embedding": "sglaunch serves generation models only (no embeddings API)",
    "disaggregation_mode": "sglaunch runs prefill and decode in one server (no PD disaggregation)",
    "json_model_override_args": "sglaunch loads the checkpoint's config.json as it is; an override "
                                "would be dropped and a different model served",
    "enable_multimodal": "sglaunch serves text-only models",
    "attn_dp_size": "sglaunch has no data-parallel attention",
    "skip_tokenizer_init": "sglaunch always tokenizes and detokenizes (its API returns text)",
    "load_format": "sglaunch loads safetensors checkpoints (or the built-in model)",
    "modelopt_quant": "sglaunch serves unquantized checkpoints",
    "quantize_and_serve": "sglaunch serves unquantized checkpoints",
}
# values of those flags that mean "off" (SGLang's default or its spelling of none)
HONOURED_VALUES = {"disaggregation_mode": ("null",), "json_model_override_args": ("{}", ""),
                   "load_format": ("auto", "safetensors"), "attn_dp_size": (1,)}


def check_engine_support(ctx: LaunchContext) -> list[Diagnostic]:
    severity = Severity.ERROR if ctx.mode == "serve" else Severity.WARNING
    found = [diag("ENG002", message, flags=flags, fix=fix, severity=severity)
             for message, flags, fix in _unsupported(ctx)]
    return found + _ignored_compat_flags(ctx) + _tokenizer_workers(ctx) + _cpu_without_bf16(ctx)


def _unsupported(ctx: LaunchContext):
    if ctx.get("device") not in ("cuda", "cpu"):
        yield (f"--device {ctx.get('device')}: sglaunch runs on cuda and cpu", ("--device",), "use cuda or cpu")
    for dest, flag in (("dp_size", "--dp-size"), ("pp_size", "--pp-size")):
        if ctx.get(dest) > 1:
            yield (f"{flag} {ctx.get(dest)}: sglaunch runs tensor parallelism only", (flag,),
                   f"drop {flag}; use --tp-size (and --nnodes) to spread the model")
    if ctx.get("enable_dp_attention"):
        yield ("--enable-dp-attention: sglaunch has no data-parallel attention", ("--enable-dp-attention",),
               "drop it for sglaunch serve")
    for dest, flag in (("quantization", "--quantization"),
                       ("speculative_draft_model_quantization", "--speculative-draft-model-quantization")):
        if ctx.get(dest) is not None:
            yield (f"{flag} {ctx.get(dest)}: sglaunch serves unquantized bf16/fp16/fp32 checkpoints",
                   (flag,), f"drop {flag} and use an unquantized checkpoint")
    for dest, why in CANNOT_HONOUR.items():
        if not ctx.given(dest) or ctx.origin(dest) == "resolved":
            continue
        value = ctx.known(dest)
        if value in (None, False, ()) or value in HONOURED_VALUES.get(dest, ()):
            continue
        flag = ctx.settings.schema.by_dest(dest).name
        shown = " ".join(map(str, value)) if isinstance(value, tuple) else ("" if value is True else value)
        yield (f"{flag}{' ' + str(shown) if shown != '' else ''}: {why}", (flag,),
               f"drop {flag} for sglaunch serve, or serve this launch with SGLang itself")
    algo = ctx.get("speculative_algorithm")
    if algo is not None and algo != "DSPARK":
        yield (f"--speculative-algorithm {algo}: sglaunch implements DSPARK only",
               ("--speculative-algorithm",), "use --speculative-algorithm DSPARK with a DSpark drafter")
    yield from _unsupported_checkpoint(ctx)


def _unsupported_checkpoint(ctx: LaunchContext):
    ckpt = ctx.checkpoint
    if ckpt is None:
        return
    archs = ckpt.architectures
    if archs and not set(archs) & set(SUPPORTED_ARCHITECTURES):
        yield (f"{ckpt.path} is a {', '.join(archs)} checkpoint; sglaunch runs "
               f"{', '.join(SUPPORTED_ARCHITECTURES)}", ("--model-path",), "serve it with SGLang itself")
    if ckpt.quant_method and ctx.get("quantization") is None:
        yield (f"{ckpt.path} is quantized ({ckpt.quant_method}); sglaunch serves unquantized checkpoints",
               ("--model-path",), "use the unquantized checkpoint")


def _tokenizer_workers(ctx: LaunchContext) -> list[Diagnostic]:
    """--tokenizer-worker-num: at least 1; more workers than CPUs only compete for them."""
    count = ctx.known("tokenizer_worker_num")
    if not isinstance(count, int):
        return []
    origin = ctx.origin("tokenizer_worker_num")
    if count < 1:
        return [diag("FLAG011", f"--tokenizer-worker-num {count} is out of range: the server needs at "
                     "least one HTTP worker process", flags=("--tokenizer-worker-num",), origin=origin,
                     fix="use 1 (one HTTP server process) or more")]
    cpus = _usable_cpus()
    if count > cpus:
        return [diag("ENG004", f"--tokenizer-worker-num {count} is more than the {cpus} CPUs this "
                     "process may use; the HTTP workers and the engine process would compete for them",
                     flags=("--tokenizer-worker-num",), origin=origin,
                     fix=f"use at most {max(1, cpus - 1)} (one CPU left for the engine process)")]
    return []


def _cpu_without_bf16(ctx: LaunchContext) -> list[Diagnostic]:
    """DSpark in bf16 on a CPU that has no bf16 matrix instructions: a verify of several tokens costs
    several plain steps there, so the planner steps aside on nearly every step (session 26, an AMD
    EPYC without AVX-512: an 8-token verify priced at 322-347 ms against a 63-69 ms plain step,
    94-100% of steps stepped aside, DSpark at 0.90-1.00x of plain; `benchmarks/cpu26/`)."""
    info = ctx.env_info
    if (ctx.get("device") != "cpu" or ctx.get("speculative_algorithm") != "DSPARK"
            or DTYPE_NAMES.get(ctx.get("dtype")) != "bfloat16" or info is None or info.cpu_native_bf16 is not False):
        return []
    return [diag("ENG005", "this CPU has no bf16 matrix instructions (no avx512_bf16, amx_bf16 or Arm bf16 flag "
                 "in /proc/cpuinfo): torch runs bf16 matmuls of several rows emulated, so a DSpark verify costs "
                 "several plain decode steps here and DSpark will step aside on most steps, serving at about "
                 "plain speed", flags=("--speculative-algorithm", "--dtype"),
                 fix="serve DSpark on a GPU, or on a CPU with AVX512-BF16 or AMX; `sglaunch profile-sps "
                 "--device cpu --draft-model-path DRAFTER` prints this machine's step costs")]


def _usable_cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ignored_compat_flags(ctx: LaunchContext) -> list[Diagnostic]:
    found = []
    for dest, setting in ctx.settings.values.items():
        flag = setting.flag
        if flag.support is not Support.COMPAT or dest in CANNOT_IGNORE or dest in CANNOT_HONOUR or \
                setting.origin.source == "resolved":
            continue
        if setting.value == flag.default or (isinstance(setting.value, str) and
                                             flag.value_status(setting.value, ctx.settings.release) is Status.REMOVED):
            continue
        note = f" ({flag.engine_note})" if flag.engine_note else ""
        found.append(diag("ENG001", f"{setting.spelling} is accepted for SGLang compatibility but has no "
                          f"effect in sglaunch's engine{note}", flags=(flag.name,), origin=str(setting.origin),
                          fix=f"keep it for SGLang, or drop it for sglaunch serve"))
    return found


def fall_back_to_engine_backends(ctx: LaunchContext) -> list[Diagnostic]:
    """Backends the engine lacks are replaced by the closest one it has, with a warning."""
    found = []
    from sglaunch.engine.attention import IMPLEMENTED

    backend = ctx.get("attention_backend")
    why_not = flashinfer_unusable(ctx) if ENGINE_ATTENTION.get(backend) == "flashinfer" else None
    if why_not is not None:
        ctx.resolve("attention_backend", "torch", f"FlashInfer cannot run here: {why_not}")
        found.append(diag("ENG003", f"--attention-backend {backend} cannot run here ({why_not}); using torch",
                          flags=("--attention-backend",), origin=ctx.origin("attention_backend"),
                          fix="use --attention-backend torch or auto, or fix what the message names"))
    elif ENGINE_ATTENTION.get(backend) in IMPLEMENTED:
        if ENGINE_ATTENTION[backend] != backend:
            ctx.resolve("attention_backend", ENGINE_ATTENTION[backend], f"sglaunch's name for {backend}")
    else:
        fallback = "torch" if flashinfer_unusable(ctx) else "flashinfer"
        ctx.resolve("attention_backend", fallback, f"{backend} is not implemented by sglaunch")
        found.append(diag("ENG003", f"--attention-backend {backend} is not implemented by sglaunch; "
                          f"using {fallback}", flags=("--attention-backend",),
                          origin=ctx.origin("attention_backend"), fix="use flashinfer, torch or auto"))
    kv = ctx.get("kv_cache_dtype")
    if kv not in DTYPE_NAMES:
        ctx.resolve("kv_cache_dtype", ctx.get("dtype"), f"{kv} KV cache is not implemented by sglaunch")
        found.append(diag("ENG003", f"--kv-cache-dtype {kv} is not implemented by sglaunch; using "
                          f"{ctx.get('dtype')}", flags=("--kv-cache-dtype",), fix="use auto, bf16, fp16 or fp32"))
    elif DTYPE_NAMES[kv] != kv:
        ctx.resolve("kv_cache_dtype", DTYPE_NAMES[kv], f"'{kv}' is another name for it")
    return found


def resolve_engine_attention(model_path, device: str, dtype: str, backend: str) -> tuple[str, list[str]]:
    """The attention backend `serve` would run for these settings (`auto` resolved as in
    checks/resolve.py, then the engine's fallback) and the warnings given on the way. For the
    commands that boot an engine without serve's pipeline (profile-sps, train-draft's generation).
    model_path: the checkpoint (its head_dim matters to FlashInfer), or None."""
    import os

    from sglaunch.checks.resolve import resolve_attention
    from sglaunch.errors import SglaunchError
    from sglaunch.flags.registry import SCHEMA
    from sglaunch.flags.sources import collect_settings
    from sglaunch.probe.checkpoint import read_checkpoint
    from sglaunch.probe.environment import probe_environment
    from sglaunch.releases import CURRENT_RELEASE

    tokens = ["--device", device, "--dtype", dtype, "--kv-cache-dtype", dtype, "--attention-backend", backend]
    settings, _ = collect_settings(tokens, {}, SCHEMA, CURRENT_RELEASE)
    checkpoint = None
    if model_path is not None:
        try:
            checkpoint = read_checkpoint(str(model_path))
        except SglaunchError:  # the engine reports an unusable checkpoint with its own hint
            checkpoint = None
    ctx = LaunchContext(settings, {}, "serve", probe_environment(os.environ, with_gpus=False), checkpoint)
    resolve_attention(ctx)
    warnings = [d.message for d in fall_back_to_engine_backends(ctx)]
    return ctx.get("attention_backend"), warnings
