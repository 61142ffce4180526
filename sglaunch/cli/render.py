"""Rich rendering of diagnostics, reports and the schema-generated `serve --help`."""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.markup import escape

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
    # NOTE: about 500 flags: laid out as plain text the way argparse does (a Rich table per group
    # took longer than the whole 0.3 s cold-start budget)
    import textwrap

    width = max(60, min(console.width, 120))
    out = []
    for group, flags in schema.groups(release).items():
        out.append(f"{group}:\n")
        for flag in flags:
            out.append(f"  {flag_usage(flag)}\n")
            out.extend(f"{line}\n" for line in textwrap.wrap(flag_help(flag), width, initial_indent=" " * 8,
                                                              subsequent_indent=" " * 8))
        out.append("\n")
    console.file.write("".join(out))
