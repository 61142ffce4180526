"""0.5.16 behaviour changes that surprise, known issues, and removed environment variables."""

from __future__ import annotations

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, diag
from sglaunch.releases import at_or_after


def check_unified_radix_tree(ctx: LaunchContext) -> list[Diagnostic]:
    if ctx.checkpoint is None or ctx.get("disable_radix_cache"):
        return []
    kinds = ctx.checkpoint.hybrid_kinds()
    if not kinds or not at_or_after(ctx.settings.release, "0.5.16"):
        return []
    return [diag("NOTE001", f"this is a {'/'.join(kinds)} model: since SGLang 0.5.16 its prefix cache is "
                 "the UnifiedRadixTree instead of the per-kind radix cache (#30468); cache hit rates and "
                 "memory use can differ from 0.5.15", release="0.5.16", flags=("--disable-radix-cache",),
                 fix="compare prefix-cache hit rates after the upgrade; --disable-radix-cache turns "
                 "prefix caching off entirely")]


def check_dp_attention_determinism(ctx: LaunchContext) -> list[Diagnostic]:
    if not ctx.get("enable_dp_attention"):
        return []
    breakable = ctx.get("enable_breakable_cuda_graph") or ctx.get("cuda_graph_backend_prefill") == "breakable"
    default_on = at_or_after(ctx.settings.release, "0.5.17")
    if not (breakable or default_on):
        return []
    why = "the breakable prefill CUDA graph is on" if breakable else \
        "from 0.5.17 the breakable prefill CUDA graph is on by default with DP attention (#31682)"
    return [diag("NOTE002", f"known issue of 0.5.16: with DP attention, {why}, and temperature-0 output "
                 "can differ between runs (idle ranks run a dummy extend, #30898)", release="0.5.16",
                 flags=("--enable-dp-attention", "--enable-breakable-cuda-graph"),
                 fix="drop --enable-breakable-cuda-graph when you need reproducible greedy output")]


def check_replayssm(ctx: LaunchContext) -> list[Diagnostic]:
    on = ctx.get("enable_gdn_replayssm_spec") or ctx.get("enable_linear_replayssm_spec")
    if not on:
        return []
    flag = "--enable-gdn-replayssm-spec" if ctx.get("enable_gdn_replayssm_spec") else "--enable-linear-replayssm-spec"
    found = []
    if ctx.get("speculative_eagle_topk") not in (None, 1):
        found.append(diag("NOTE003", f"{flag} needs a linear draft chain; --speculative-eagle-topk is "
                          f"{ctx.get('speculative_eagle_topk')}", flags=(flag, "--speculative-eagle-topk"),
                          fix="drop --speculative-eagle-topk or set it to 1"))
    if ctx.get("enable_linear_replayssm"):
        found.append(diag("NOTE003", f"{flag} cannot be combined with the decode-only "
                          "--enable-linear-replayssm", flags=(flag, "--enable-linear-replayssm"),
                          fix="keep one of the two"))
    mode = ctx.ragged_mode
    if mode not in (None, "static") and ctx.get("speculative_algorithm") not in ("DSPARK", "DFLASH"):
        found.append(diag("NOTE003", f"{flag} with SGLANG_RAGGED_VERIFY_MODE={mode} needs "
                          "--speculative-algorithm DSPARK or DFLASH", flags=(flag, "--speculative-algorithm"),
                          fix="use DSPARK/DFLASH or SGLANG_RAGGED_VERIFY_MODE=static"))
    if ctx.checkpoint is not None and not ctx.checkpoint.is_gdn_hybrid:
        found.append(diag("NOTE003", f"{flag} only applies to gated delta-net (GDN) hybrid models; "
                          f"{ctx.checkpoint.path} is {ctx.checkpoint.model_type or 'not one'}",
                          flags=(flag,), fix=f"drop {flag} for this model"))
    return found


def check_dsa_layer_split(ctx: LaunchContext) -> list[Diagnostic]:
    if not ctx.get("enable_dsa_cache_layer_split"):
        return []
    found = []
    flag = "--enable-dsa-cache-layer-split"
    if not ctx.get("enable_prefill_cp") or ctx.get("cp_strategy") != "interleave":
        found.append(diag("NOTE004", f"{flag} needs prefill context parallelism with the interleave "
                          "strategy", flags=(flag, "--enable-prefill-cp", "--cp-strategy"),
                          fix="add --enable-prefill-cp --cp-strategy interleave"))
    backend = ctx.get("disaggregation_transfer_backend")
    if backend not in ("mooncake", "mooncake_tcp"):
        found.append(diag("NOTE004", f"{flag} supports only the mooncake and mooncake_tcp transfer "
                          f"backends, got {backend}", flags=(flag, "--disaggregation-transfer-backend"),
                          fix="use --disaggregation-transfer-backend mooncake"))
    return found


def check_env_vars(ctx: LaunchContext) -> list[Diagnostic]:
    found = []
    release = ctx.settings.release
    for var in ctx.settings.schema.env_vars:
        if var.name not in ctx.environ:
            continue
        if at_or_after(release, var.removed):
            instead = f"use {var.replaced_by_flag}" if var.replaced_by_flag else "unset it"
            found.append(diag("ENV001", f"{var.name} is no longer read since SGLang {var.removed}",
                              flags=(var.name,), release=var.removed, origin="env", fix=instead))
        elif at_or_after(release, var.noop_since):
            found.append(diag("ENV001", f"{var.name} does nothing since SGLang {var.noop_since}",
                              flags=(var.name,), release=var.noop_since, origin="env", fix="unset it"))
    return found


def check_env_names(ctx: LaunchContext) -> list[Diagnostic]:
    """SGLANG_* variables set where the launch runs that the target release does not read: a typo,
    one that a release removed or renamed, or one that only a later release reads. The facts come
    from each release's `environ.py` (extracted with the flags)."""
    from sglaunch.flags.timeline import env_history
    from sglaunch.releases import KNOWN_RELEASES

    names = [n for n in ctx.environ if n.startswith("SGLANG_")]
    if not names:
        return []
    history, release = env_history(), ctx.settings.release
    hand = {v.name for v in ctx.settings.schema.env_vars}
    found = []
    for name in sorted(names):
        seen = history["names"].get(name, [])
        if release in seen:
            continue
        renamed = history["renamed"].get(name)
        if renamed and release in renamed[1]:
            found.append(diag("ENV003", f"{name} is a deprecated name of {renamed[0]} in SGLang {release}",
                              flags=(name,), origin="env", fix=f"set {renamed[0]} instead"))
        elif renamed:
            found.append(diag("ENV002", f"SGLang {release} does not read {name}; the variable is now "
                              f"{renamed[0]}", flags=(name,), origin="env", fix=f"set {renamed[0]} instead"))
        elif seen and name not in hand:
            later = [r for r in seen if at_or_after(r, release)]
            when = (f"only SGLang {later[0]} and later read it" if later and not at_or_after(release, seen[0])
                    else f"SGLang {release} no longer reads it (last read by {seen[-1]})")
            found.append(diag("ENV002", f"{name} is set but {when}", flags=(name,), origin="env",
                              fix="unset it, or check the release you deploy"))
        elif not seen and name not in hand:
            import difflib

            close = difflib.get_close_matches(name, [n for n, r in history["names"].items() if release in r], n=2)
            hint = f"did you mean {' or '.join(close)}?" if close else "unset it"
            found.append(diag("ENV002", f"{name} is set but no SGLang release {KNOWN_RELEASES[0]}-"
                              f"{KNOWN_RELEASES[-1]} reads it", flags=(name,), origin="env", fix=hint))
    return found


def check_env_values(ctx: LaunchContext) -> list[Diagnostic]:
    """A declared variable with a fixed set of values set to something else (RAGGED003 covers
    SGLANG_RAGGED_VERIFY_MODE, which SGLang refuses to start with)."""
    found = []
    for var in ctx.settings.schema.env_vars:
        value = ctx.environ.get(var.name)
        if value is not None and var.at_least is not None and value.strip() and not _whole_at_least(value, var.at_least):
            # NOTE: config.env_int's rule (unset or empty: the default), which refuses the engine's start
            found.append(diag("ENV005", f"{var.name}={value} is not a whole number >= {var.at_least}; the engine "
                              "refuses it", flags=(var.name,), origin="env",
                              fix=f"set {var.name} to a whole number >= {var.at_least}, or unset it"))
            continue
        if value is None or not var.choices or value in var.choices or var.name == "SGLANG_RAGGED_VERIFY_MODE":
            continue
        # NOTE: a value the engine itself refuses would stop it after the spawn: refuse it here
        code, what = ("ENV005", "; the engine refuses it") if var.refused else ("ENV004", "")
        found.append(diag(code, f"{var.name}={value} is not one of {', '.join(var.choices)}{what}",
                          flags=(var.name,), origin="env", fix=f"set {var.name} to one of {', '.join(var.choices)}"))
    return found


def _whole_at_least(value: str, low: int) -> bool:
    try:
        return int(value.strip()) >= low
    except ValueError:
        return False
