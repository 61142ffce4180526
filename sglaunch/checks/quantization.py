"""Quantization paths 0.5.16 removed or made depend on FlashInfer."""

from __future__ import annotations

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, diag
from sglaunch.probe.environment import version_at_least

FLASHINFER_FOR_NVFP4 = "0.6.14"
REMOVED_CHECKPOINT_METHODS = {
    "fbgemm_fp8": "FBGEMM FP8 was removed in SGLang 0.5.16 (#31109)",
    "qoq": "QServe (QoQ) W4A8 was removed in SGLang 0.5.16 (#31109)",
}


def check_checkpoint_quantization(ctx: LaunchContext) -> list[Diagnostic]:
    found = []
    for label, ckpt in (("model", ctx.checkpoint), ("draft model", ctx.draft)):
        method = ckpt.quant_method if ckpt else None
        if method in REMOVED_CHECKPOINT_METHODS:
            found.append(diag(
                "QUANT001", f"the {label} at {ckpt.path} is quantized with {method}: "
                f"{REMOVED_CHECKPOINT_METHODS[method]}; loading it fails", release="0.5.16",
                flags=("--model-path",) if label == "model" else ("--speculative-draft-model-path",),
                fix="use an unquantized checkpoint or re-quantize it with a supported method "
                "(e.g. fp8 or awq); no drop-in replacement exists"))
    return found


def check_nvfp4(ctx: LaunchContext) -> list[Diagnostic]:
    wants = ctx.get("quantization") in ("modelopt_fp4", "petit_nvfp4") or \
        (ctx.checkpoint is not None and ctx.checkpoint.is_nvfp4)
    if not wants:
        return []
    installed = ctx.env_info.packages.get("flashinfer") if ctx.env_info else None
    if version_at_least(installed, FLASHINFER_FOR_NVFP4):
        return []
    have = f"FlashInfer {installed} is installed" if installed else "FlashInfer is not installed"
    return [diag("QUANT002", f"NVFP4 GEMM needs FlashInfer >= {FLASHINFER_FOR_NVFP4} since SGLang 0.5.16 "
                 f"removed the built-in NVFP4 kernels (#30448); {have}", release="0.5.16",
                 flags=("--quantization",), fix=f"pip install 'flashinfer-python>={FLASHINFER_FOR_NVFP4}' "
                 "in the serving image")]
