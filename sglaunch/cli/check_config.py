"""`sglaunch check-config [FLAGS...] [--config FILE] [--script FILE]`: validate a launch and this machine.

Exit 0: no errors; 1: errors found; 2: usage error (unknown flag, unreadable file, ...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel, stdout_console
from sglaunch.errors import EXIT_FINDINGS, SglaunchError
from sglaunch.releases import CURRENT_RELEASE, check_release

ScriptOption = Annotated[Optional[Path], typer.Option(
    "--script", help="Read the launch command(s) out of this shell script.", metavar="FILE")]
ReleaseOption = Annotated[str, typer.Option(
    "--release", help="SGLang release to validate against.", metavar="X.Y.Z")]
AllOption = Annotated[bool, typer.Option("--all", help="Also list flags left at their defaults.")]
NoMachineOption = Annotated[bool, typer.Option(
    "--no-machine", help="Skip probing this machine's GPUs (validate the launch only).")]


@funnel
def check_config(ctx: typer.Context, script: ScriptOption = None, as_json: JsonOption = False,
                 release: ReleaseOption = CURRENT_RELEASE, show_all: AllOption = False,
                 no_machine: NoMachineOption = False) -> None:
    from sglaunch.checks.pipeline import run_pipeline
    from sglaunch.probe.environment import probe_environment

    release = check_release(release)
    tokens = list(ctx.args)
    launches = _script_launches(script) if script else [("command line", [], {}, [])]
    reports, machines = [], {}
    for label, extra, env, notes in launches:
        environ = {**os.environ, **env}
        # NOTE: probe the machine (an nvidia-smi subprocess) once per distinct GPU visibility,
        # not once per launch of the script
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        if visible not in machines:
            machines[visible] = probe_environment(environ, with_gpus=not no_machine)
        machine = machines[visible]
        report = run_pipeline(tokens, environ, mode="check", release=release, extra=extra, env_info=machine)
        report.notes.extend(notes)
        reports.append((label, report))
    if as_json:
        print(json.dumps(_as_json(reports), indent=2, default=str))
    else:
        from sglaunch.cli.report import print_report

        console = stdout_console()
        for label, report in reports:
            print_report(console, report, label if script else None, show_all)
    if any(not report.ok for _, report in reports):
        raise typer.Exit(EXIT_FINDINGS)


def _script_launches(script: Path):
    """Each SGLang launch command in the script, as pre-split occurrences plus its environment."""
    from sglaunch.flags.argv import Origin, split_argv
    from sglaunch.flags.registry import SCHEMA
    from sglaunch.migrate.shell import extract_launch_commands

    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SglaunchError(f"cannot read script {script}: {exc}", hint="check the path and that it is text")
    commands = extract_launch_commands(text)
    if not commands:
        raise SglaunchError(f"no SGLang launch command found in {script}",
                            hint="expected `python -m sglang.launch_server ...` or `sglang serve ...`")
    launches = []
    for command in commands:
        origin = Origin("script", f"{script}:{command.line}")
        split = split_argv(list(command.args), SCHEMA, origin=origin, lenient=True, dynamic=list(command.dynamic))
        if split.unknown:
            from sglaunch.flags.argv import unknown_flag_error

            index, token = split.unknown[0]
            raise unknown_flag_error(token.split("=")[0], SCHEMA, where=f" in {origin}")
        notes = []
        if command.passthrough:
            notes.append(f"{origin}: the command passes the script's own arguments (\"$@\"); they are not checked")
        if any(command.dynamic):
            notes.append(f"{origin}: values with shell expansions ($VAR) are not type-checked")
        launches.append((f"{script}:{command.line} ({command.launcher})", split.occurrences,
                         dict(command.env), notes))
    return launches


def _as_json(reports) -> dict:
    from sglaunch.cli.report import report_dict

    items = [dict(report_dict(report), launch=label) for label, report in reports]
    return items[0] if len(items) == 1 else {"launches": items, "ok": all(i["ok"] for i in items)}
