"""Rich rendering of diagnostics, reports and the schema-generated `serve --help`."""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sglaunch.checks.diagnostics import Diagnostic, Severity
from sglaunch.flags.spec import Flag, FlagSchema, Kind

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
LABEL = {Severity.ERROR: "Error", Severity.WARNING: "Warning", Severity.INFO: "Note"}


def print_diagnostics(console: Console, diagnostics: Iterable[Diagnostic]) -> None:
    """One diagnostic per block: `Error: [CODE] message` then `Hint: fix` (the funnel's shape)."""
    for d in diagnostics:
        where = f" ({escape(d.origin)})" if d.origin and d.origin not in ("cli", "default") else ""
        console.print(f"[{STYLE[d.severity]}]{LABEL[d.severity]}:[/] [dim]\\[{d.code}][/] "
                      f"{escape(d.message)}{where}")
        if d.fix:
            console.print(f"  [bold]Hint:[/] {escape(d.fix)}")


def flag_usage(flag: Flag) -> str:
    names = ", ".join(flag.spellings)
    if flag.kind is Kind.BOOL:
        return names
    if flag.choices:
        shown = [c for c in flag.choices if flag.value_status(c).value == "active"]
        return f"{names} {{{','.join(shown)}}}"
    metavar = flag.metavar or flag.kind.value.upper()
    return f"{names} {metavar}" + (" ..." if flag.kind is Kind.LIST else "")


def flag_help(flag: Flag) -> str:
    text = flag.help
    if flag.default not in (None, False):
        text += f" [default: {flag.default}]"
    if flag.support.value == "compat":
        text += " (accepted for SGLang compatibility; no effect in sglaunch)"
    return text


def serve_help(console: Console, schema: FlagSchema, release: str) -> None:
    console.print("[bold]Usage:[/] sglaunch serve [SGLANG FLAGS...]\n")
    console.print(f"Validates the flags against SGLang {release}, then boots the engine and the "
                  "OpenAI-compatible HTTP server.\nEvery flag below is also accepted as a key of a "
                  "`--config FILE.yaml` (kebab-case, without the dashes); flags on the command line win.\n"
                  "DSpark needs `export SGLANG_RAGGED_VERIFY_MODE=compact` (or static / cap-accept).\n")
    for group, flags in schema.groups(release).items():
        table = Table(title=group, title_justify="left", title_style="bold", box=None, pad_edge=False,
                      show_header=False, expand=False)
        table.add_column(no_wrap=True, style="cyan")
        table.add_column(overflow="fold")
        for flag in flags:
            table.add_row(escape(flag_usage(flag)), escape(flag_help(flag)))
        console.print(table)
        console.print()
