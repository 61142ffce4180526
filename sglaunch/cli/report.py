"""The check-config report, for people (rich tables) and for machines (a dict for JSON)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sglaunch.checks.diagnostics import Severity
from sglaunch.checks.pipeline import Report
from sglaunch.cli.render import print_diagnostics

RELEVANT_ENV_PREFIXES = ("SGLANG_", "CUDA_", "NCCL_", "FLASHINFER_", "TORCH_", "HF_")


def settings_rows(report: Report, show_all: bool):
    schema = report.settings.schema
    for flag in schema.at(report.release):
        setting = report.settings.values.get(flag.dest)
        unexpanded = report.settings.unexpanded.get(flag.dest)
        if setting is not None:
            yield flag.name, setting.value, str(setting.origin)
        elif unexpanded is not None:
            yield flag.name, unexpanded.value, f"{unexpanded.origin} (unexpanded shell text, not checked)"
        elif show_all and flag.status_at(report.release).value == "active":
            yield flag.name, flag.default, "default"


def env_rows(report: Report) -> list[tuple[str, str, str]]:
    """Known SGLang variables (set or defaulted) plus any other set variable that steers a launch."""
    rows = {name: (value, str(origin)) for name, (value, origin) in report.settings.env.items()}
    for name, value in report.environ.items():
        if name.startswith(RELEVANT_ENV_PREFIXES) and name not in rows:
            rows[name] = (value, "env")
    return [(name, value, origin) for name, (value, origin) in sorted(rows.items())]


def print_report(console: Console, report: Report, label: str | None, show_all: bool) -> None:
    title = f"SGLang {report.release} launch check" + (f": {label}" if label else "")
    console.rule(f"[bold]{escape(title)}")
    console.print(_settings_table(report, show_all))
    if report.diagnostics:
        console.print("[bold]Diagnostics[/]")
        print_diagnostics(console, report.diagnostics)
        console.print()
    _print_environment(console, report)
    _print_memory(console, report)
    for note in report.notes:
        console.print(f"[cyan]Note:[/] {escape(note)}")
    console.print(_summary(report))


def _settings_table(report: Report, show_all: bool) -> Table:
    table = Table(title="Resolved flags", title_justify="left")
    table.add_column("flag", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("origin", overflow="fold")
    reasons = {r.flag: r.reason for r in report.resolutions}
    for name, value, origin in settings_rows(report, show_all):
        why = f" ({reasons[name]})" if origin == "resolved" and name in reasons else ""
        table.add_row(name, escape(_show(value)), escape(origin + why))
    return table


def _print_environment(console: Console, report: Report) -> None:
    env = report.environment
    table = Table(title="Environment", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    if env is not None:
        table.add_row("python", f"{env.python} ({env.platform})")
        for name, version in env.packages.items():
            extra = f" (CUDA {env.torch_cuda})" if name == "torch" and env.torch_cuda else ""
            table.add_row(name, (version or "not installed") + extra)
        if env.cpu_native_bf16 is not None:
            table.add_row("CPU bf16", "bf16 matrix instructions" if env.cpu_native_bf16 else
                          "no bf16 matrix instructions (bf16 matmuls emulated)")
        table.add_row("GPUs", env.gpu_probe)
        for gpu in env.gpus:
            table.add_row(f"  GPU {gpu.index}", f"{gpu.name}, {gpu.memory_total_mib} MiB "
                          f"({gpu.memory_free_mib} MiB free), compute {gpu.compute_capability or '?'}")
    for name, value, origin in env_rows(report):
        table.add_row(name, escape(f"{value} ({origin})"))
    console.print(table)


def _print_memory(console: Console, report: Report) -> None:
    memory = report.memory
    if memory is None:
        return
    mib = 1024 * 1024
    console.print(f"[bold]Memory:[/] weights {memory.weight_bytes / mib:,.0f} MiB "
                  f"({memory.weight_bytes_per_rank / mib:,.0f} MiB per rank); KV "
                  f"{memory.kv_bytes_per_token:,} bytes per token per rank ({memory.kv_dtype})")
    for fit in memory.gpus:
        console.print(f"  GPU {fit.index} {escape(fit.name)}: {fit.budget_mib:,} of {fit.total_mib:,} MiB "
                      f"usable -> {fit.kv_tokens:,} KV tokens")
    if memory.cpu_kv_tokens is not None:
        available = f" of {memory.cpu_available_mib:,} MiB available" if memory.cpu_available_mib else ""
        console.print(f"  CPU KV pool: {memory.cpu_kv_tokens:,} tokens = {memory.cpu_kv_mib:,} MiB{available}")


def _summary(report: Report) -> str:
    counts = {s: sum(d.severity is s for d in report.diagnostics) for s in Severity}
    text = f"{counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), {counts[Severity.INFO]} note(s)"
    return f"[bold green]OK:[/] {text}" if report.ok else f"[bold red]FAILED:[/] {text}"


def _show(value) -> str:
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def report_dict(report: Report) -> dict:
    return {
        "ok": report.ok,
        "release": report.release,
        "settings": [{"flag": n, "value": v, "origin": o} for n, v, o in settings_rows(report, False)],
        "resolutions": [{"flag": r.flag, "value": r.value, "reason": r.reason} for r in report.resolutions],
        "diagnostics": [d.to_dict() for d in report.diagnostics],
        "environment": report.environment.to_dict() if report.environment else None,
        "env_vars": {name: {"value": value, "origin": origin} for name, value, origin in env_rows(report)},
        "memory": report.memory.to_dict() if report.memory else None,
        "notes": report.notes,
    }
