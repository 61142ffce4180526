"""DSpark's constraints (as SGLang 0.5.16's speculative hook) and SGLANG_RAGGED_VERIFY_MODE."""

from __future__ import annotations

from pathlib import Path

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, Severity, diag

RAGGED_MODES = ("static", "cap-accept", "compact")
EXPORT_FIX = "export SGLANG_RAGGED_VERIFY_MODE=compact"


def check_dspark(ctx: LaunchContext) -> list[Diagnostic]:
    if not ctx.dspark:
        return []
    found = []
    gamma = ctx.get("speculative_dspark_block_size")
    if gamma is not None and gamma <= 0:
        found.append(diag("SPEC001", f"DSpark needs a positive block size, got {gamma}",
                          flags=("--speculative-dspark-block-size",),
                          origin=ctx.origin("speculative_dspark_block_size"),
                          fix="use the block size the drafter was trained with (e.g. 7)"))
    tokens = ctx.get("speculative_num_draft_tokens")
    if tokens is not None and tokens < 2:
        found.append(diag("SPEC012", f"--speculative-num-draft-tokens must be at least 2, got {tokens}",
                          flags=("--speculative-num-draft-tokens",), fix="drop it; DSpark derives it"))
    elif tokens is not None and gamma is not None and gamma > 0 and tokens != gamma + 1:
        found.append(diag("SPEC002", f"--speculative-num-draft-tokens {tokens} must equal the DSpark "
                          f"block size + 1 = {gamma + 1} (the verify window is the anchor plus the block)",
                          flags=("--speculative-num-draft-tokens", "--speculative-dspark-block-size"),
                          origin=ctx.origin("speculative_num_draft_tokens"),
                          fix=f"drop --speculative-num-draft-tokens or set it to {gamma + 1}"))
    if ctx.get("speculative_draft_model_path") is None:
        found.append(diag("SPEC003", "DSpark needs a draft model and the target checkpoint bundles none",
                          flags=("--speculative-draft-model-path",),
                          fix="pass --speculative-draft-model-path PATH (a DSpark drafter trained for "
                          "this target; `sglaunch train-draft` makes one)"))
    if ctx.get("pp_size") != 1:
        found.append(diag("SPEC004", f"DSpark supports only --pp-size 1, got {ctx.get('pp_size')}",
                          flags=("--pp-size", "--speculative-algorithm"), fix="use --pp-size 1"))
    return found + _dp_attention(ctx) + _dspark_files(ctx)


def _dp_attention(ctx: LaunchContext) -> list[Diagnostic]:
    if not ctx.get("enable_dp_attention"):
        return []
    found = []
    if ctx.get("dp_size") > 1 and not ctx.get("enable_dp_lm_head"):
        found.append(diag("SPEC006", "DSpark with DP attention and --dp-size > 1 needs the vocab-parallel "
                          "LM head", flags=("--enable-dp-attention", "--dp-size", "--enable-dp-lm-head"),
                          fix="add --enable-dp-lm-head"))
    if ctx.get("moe_a2a_backend") not in (None, "none") and ctx.get("device") != "npu":
        found.append(diag("SPEC007", f"DSpark with DP attention needs --moe-a2a-backend none, got "
                          f"{ctx.get('moe_a2a_backend')}", flags=("--moe-a2a-backend", "--enable-dp-attention"),
                          fix="set --moe-a2a-backend none or turn off --enable-dp-attention"))
    if ctx.get("attn_cp_size") != 1:
        found.append(diag("SPEC008", "DSpark with DP attention needs attention context parallel size 1",
                          flags=("--attn-cp-size", "--enable-dp-attention"), fix="use --attn-cp-size 1"))
    draft_a2a = ctx.get("speculative_moe_a2a_backend")
    if draft_a2a is not None and draft_a2a != ctx.get("moe_a2a_backend"):
        found.append(diag("SPEC009", f"--speculative-moe-a2a-backend {draft_a2a} differs from "
                          f"--moe-a2a-backend {ctx.get('moe_a2a_backend')}",
                          flags=("--speculative-moe-a2a-backend", "--moe-a2a-backend"),
                          fix="drop --speculative-moe-a2a-backend or make the two equal"))
    return found


def _dspark_files(ctx: LaunchContext) -> list[Diagnostic]:
    """Read the STS and SPS files with the loaders the engine uses, so both refuse the same files."""
    from sglaunch.speculative.sps import load_sps_table
    from sglaunch.speculative.sts import load_sts

    found = []
    gamma = ctx.get("speculative_dspark_block_size")
    sts = ctx.get("speculative_dspark_confidence_sts_path")
    if sts is not None and gamma and gamma > 0:
        problem = _load_problem(lambda: load_sts(Path(sts).expanduser(), gamma))
        if problem:
            found.append(diag("SPEC013", problem, flags=("--speculative-dspark-confidence-sts-path",),
                              fix="refit it for this drafter (one temperature per block position)"))
    sps = ctx.get("speculative_dspark_sps_table_path")
    if sps is not None:
        problem = _load_problem(lambda: load_sps_table(Path(sps).expanduser()))
        if problem:
            found.append(diag("SPEC013", problem, flags=("--speculative-dspark-sps-table-path",),
                              fix="write one with `sglaunch profile-sps` on the serving GPU"))
    return found


def _load_problem(load) -> str | None:
    try:
        load()
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


def check_ragged_mode(ctx: LaunchContext) -> list[Diagnostic]:
    mode = ctx.ragged_mode
    where = "env SGLANG_RAGGED_VERIFY_MODE"
    if mode is not None and mode not in RAGGED_MODES:
        return [diag("RAGGED003", f"invalid SGLANG_RAGGED_VERIFY_MODE={mode}; expected one of "
                     "'static', 'cap-accept', 'compact' (lower-case, hyphenated)",
                     flags=("SGLANG_RAGGED_VERIFY_MODE",), origin=where, fix=EXPORT_FIX)]
    if not ctx.dspark:
        return []
    if mode is None:
        return [_unset_mode(ctx)]
    found = []
    if mode in ("static", "cap-accept"):
        purpose = ("verifies every drafted token (the safe baseline, no ragged speed-up)" if mode == "static"
                   else "caps acceptance at the planned length (a lossless test harness, no speed-up)")
        found.append(diag("RAGGED002", f"SGLANG_RAGGED_VERIFY_MODE={mode} {purpose}",
                          flags=("SGLANG_RAGGED_VERIFY_MODE",), origin=where,
                          fix=f"for serving speed: {EXPORT_FIX}"))
    if ctx.get("speculative_dspark_align_verify_tokens_to_graph_tier") and mode != "compact":
        found.append(diag("RAGGED004", "--speculative-dspark-align-verify-tokens-to-graph-tier only acts "
                          f"in compact mode (mode is {mode})",
                          flags=("--speculative-dspark-align-verify-tokens-to-graph-tier",), fix=EXPORT_FIX))
    if ctx.get("speculative_dspark_sps_table_path") and mode == "static":
        found.append(diag("RAGGED005", "the step-cost table is only used in compact mode; static verifies "
                          "the whole block", flags=("--speculative-dspark-sps-table-path",), fix=EXPORT_FIX))
    if mode == "compact" and not ctx.get("speculative_dspark_sps_table_path"):
        found.append(diag("RAGGED006", "compact mode without --speculative-dspark-sps-table-path: SGLang "
                          "verifies every drafted token; sglaunch serve profiles step costs at start-up",
                          flags=("--speculative-dspark-sps-table-path",),
                          fix="profile a table once on the serving GPU with `sglaunch profile-sps` and pass it"))
    return found


def _unset_mode(ctx: LaunchContext) -> Diagnostic:
    # NOTE: upstream only defaults to static here; we refuse in `serve` so nobody ships DSpark
    # without its ragged speed-up by accident. check-config reports the same error.
    return diag("RAGGED001", "--speculative-algorithm DSPARK but SGLANG_RAGGED_VERIFY_MODE is unset: "
                "SGLang would silently run the static mode and lose DSpark's variable-length verify "
                "speed-up", flags=("SGLANG_RAGGED_VERIFY_MODE", "--speculative-algorithm"),
                fix=f"{EXPORT_FIX}  (or set static / cap-accept explicitly for diagnostics)",
                severity=Severity.ERROR)
