"""The one validation pipeline `serve` and `check-config` share: parse -> resolve -> validate.

Parsing errors that leave nothing to check (unknown flag, wrong type, unreadable config
file) raise SglaunchError (exit 2). Everything else becomes a Diagnostic in the Report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from sglaunch.checks import engine, notices, quantization, speculative, topology, values
from sglaunch.checks.context import RESOLVED, LaunchContext, Mode, Resolution, UnknownAtCheckTime
from sglaunch.checks.diagnostics import Diagnostic, DiagnosticList, Severity, diag
from sglaunch.checks.memory import MemoryEstimate, check_memory, estimate_memory
from sglaunch.checks.resolve import RESOLVERS, resolve_default_model
from sglaunch.config import EngineConfig, SpeculativeConfig
from sglaunch.errors import SglaunchError
from sglaunch.flags.argv import Occurrence
from sglaunch.flags.registry import SCHEMA
from sglaunch.flags.sources import Settings, collect_settings
from sglaunch.probe.checkpoint import CheckpointInfo, CorruptCheckpointError, looks_local, read_checkpoint
from sglaunch.probe.environment import EnvironmentInfo, probe_environment
from sglaunch.releases import CURRENT_RELEASE

CHECKS = (
    values.check_ranges, values.check_inert_flags,
    speculative.check_dspark, speculative.check_ragged_mode,
    quantization.check_checkpoint_quantization, quantization.check_nvfp4,
    topology.check_nodes, topology.check_heads, topology.check_gpu_count,
    notices.check_unified_radix_tree, notices.check_dp_attention_determinism,
    notices.check_replayssm, notices.check_dsa_layer_split, notices.check_env_vars, notices.check_env_names,
    notices.check_env_values,
)


@dataclass
class Report:
    release: str
    mode: Mode
    settings: Settings
    diagnostics: list[Diagnostic]
    resolutions: list[Resolution]
    environment: EnvironmentInfo | None
    checkpoint: CheckpointInfo | None = None
    memory: MemoryEstimate | None = None
    notes: list[str] = field(default_factory=list)
    environ: Mapping[str, str] = field(default_factory=dict)
    default_model_pending: bool = False

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors


def run_pipeline(tokens: Sequence[str], environ: Mapping[str, str], *, mode: Mode = "check",
                 release: str = CURRENT_RELEASE, probe: bool = True,
                 extra: Sequence[Occurrence] = (), env_info: EnvironmentInfo | None = None) -> Report:
    """Validate one launch; raises SglaunchError only for input too broken to check."""
    settings, parsed = collect_settings(tokens, environ, SCHEMA, release, extra=extra)
    found = DiagnosticList()
    found.extend(parsed)
    if env_info is None:
        env_info = probe_environment(environ, with_gpus=probe)
    ctx = LaunchContext(settings, environ, mode, env_info)
    skipped: dict[str, list[str]] = {}  # dest given as shell text -> steps that needed it

    def guarded(step, *args):
        try:
            return step(ctx, *args)
        except UnknownAtCheckTime as exc:
            skipped.setdefault(exc.dest, []).append(step.__name__.strip("_").replace("_", " "))
            return None

    guarded(resolve_default_model)
    found.extend(guarded(_load_checkpoints) or [])
    for resolver in RESOLVERS:
        found.extend(guarded(resolver) or [])
    for check in (*CHECKS, engine.check_engine_support):
        found.extend(guarded(check) or [])
    if mode == "serve":
        found.extend(guarded(engine.fall_back_to_engine_backends) or [])
    memory = guarded(estimate_memory)
    found.extend(guarded(check_memory, memory) or [])
    found.extend(_unknown_values(ctx, skipped))
    return Report(release, mode, settings, _ordered(found.items), ctx.resolutions, env_info,
                  ctx.checkpoint, memory, environ=dict(environ),
                  default_model_pending=ctx.default_model_pending)


def _load_checkpoints(ctx: LaunchContext) -> list[Diagnostic]:
    found = []
    for dest, attr in (("model_path", "checkpoint"), ("speculative_draft_model_path", "draft")):
        path = ctx.get(dest)
        if path is None or (attr == "checkpoint" and ctx.default_model_pending):
            continue
        flag = SCHEMA.by_dest(dest).name
        if not looks_local(path):
            continue  # a hub id: nothing on disk to read
        try:
            setattr(ctx, attr, read_checkpoint(path))
        except SglaunchError as exc:
            code = "MODEL001" if "not a folder" in exc.message else \
                "MODEL003" if isinstance(exc, CorruptCheckpointError) else "MODEL002"
            found.append(diag(code, exc.message, flags=(flag,), origin=ctx.origin(dest), fix=exc.hint))
    return found


def _unknown_values(ctx: LaunchContext, skipped: dict[str, list[str]]) -> list[Diagnostic]:
    """One notice per value left as shell text: it is unknown until the script runs, and the
    checks that needed it did not run (no default was put in its place)."""
    found = []
    for dest, setting in ctx.settings.unexpanded.items():
        if dest in ctx.settings.values:
            continue  # a later, literal value (e.g. on the command line) won
        raw = " ".join(setting.value) if isinstance(setting.value, tuple) else setting.value
        steps = skipped.get(dest, [])
        what = f"; skipped because of it: {', '.join(dict.fromkeys(steps))}" if steps else ""
        found.append(diag("FLAG014", f"{setting.spelling} {raw} is shell text, so its value is unknown "
                          f"until the script runs{what}", flags=(setting.flag.name,), origin=str(setting.origin),
                          fix=f"check again with the value on the command line, e.g. "
                          f"`sglaunch check-config --script FILE {setting.flag.name} VALUE`"))
    return found


def _ordered(items: list[Diagnostic]) -> list[Diagnostic]:
    rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(items, key=lambda d: rank[d.severity])


def build_engine_config(report: Report) -> EngineConfig:
    """The frozen config `serve` hands to the engine; call only on a report without errors."""
    get = report.settings.get
    speculative_config = None
    if get("speculative_algorithm") == "DSPARK":
        mode = report.settings.env_value("SGLANG_RAGGED_VERIFY_MODE") or "static"
        speculative_config = SpeculativeConfig(
            algorithm="DSPARK", draft_model_path=get("speculative_draft_model_path"),
            block_size=get("speculative_dspark_block_size"),
            num_draft_tokens=get("speculative_num_draft_tokens"), ragged_verify_mode=mode,
            sps_table_path=get("speculative_dspark_sps_table_path"),
            confidence_sts_path=get("speculative_dspark_confidence_sts_path"),
            align_verify_tokens_to_graph_tier=get("speculative_dspark_align_verify_tokens_to_graph_tier"))
    # NOTE: a fraction resolved to sglaunch's default (shown as resolved) reaches the engine as None, the
    # default: the engine then keeps a DSpark drafter's measured working memory out of it, which it never
    # takes from a --mem-fraction-static the user gave (session 25: serve handed the resolved 0.88 over as if
    # given, the reserve never applied, and DSpark ran out of memory capturing drafter graphs on an H100)
    fraction = None if report.settings.origin("mem_fraction_static") == RESOLVED else get("mem_fraction_static")
    return EngineConfig(
        model_path=get("model_path"), tokenizer_path=get("tokenizer_path"),
        served_model_name=get("served_model_name"), dtype=get("dtype"),
        context_length=get("context_length"), chat_template=get("chat_template"),
        host=get("host"), port=get("port"), api_key=get("api_key"), enable_metrics=get("enable_metrics"),
        log_level=get("log_level"), random_seed=get("random_seed"),
        max_request_body_mb=get("max_request_body_mb"), graceful_shutdown_timeout=get("graceful_shutdown_timeout"),
        tokenizer_worker_num=get("tokenizer_worker_num"),
        stream_interval=get("stream_interval"),
        tp_size=get("tp_size"), nnodes=get("nnodes"), node_rank=get("node_rank"),
        dist_init_addr=get("dist_init_addr"), device=get("device"), base_gpu_id=get("base_gpu_id"),
        mem_fraction_static=fraction, max_total_tokens=get("max_total_tokens"),
        max_running_requests=get("max_running_requests"), chunked_prefill_size=get("chunked_prefill_size"),
        page_size=get("page_size"), disable_radix_cache=get("disable_radix_cache"),
        kv_cache_dtype=get("kv_cache_dtype"), attention_backend=get("attention_backend"),
        cuda_graph_max_bs=get("cuda_graph_max_bs_decode"),
        disable_cuda_graph=bool(get("disable_cuda_graph")) or get("cuda_graph_backend_decode") == "disabled",
        speculative=speculative_config,
        resolutions=tuple((r.flag, f"{r.value} ({r.reason})") for r in report.resolutions),
    )
