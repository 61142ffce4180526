"""`sglaunch migrate-flags`: find and fix launch flags that a newer SGLang release rejects.

Modes: default prints findings and a unified diff and writes nothing; `--check` prints the
findings only and exits 1 when anything would change or needs a person; `--write` applies
the fixes atomically. Exit codes: 0 clean, 1 findings, 2 usage error or unreadable input.
With `-` the file is read from stdin; `--write` then prints the migrated text on stdout.
"""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from sglaunch import SGLANG_RELEASE
from sglaunch.cli.common import JsonOption, funnel, stdout_console
from sglaunch.errors import EXIT_FINDINGS, EXIT_USAGE, SglaunchError
from sglaunch.migrate.kinds import ERROR, FIX, FORMATS, INFO, MANUAL, STDIN, UNSAFE
from sglaunch.releases import check_release, release_key

if TYPE_CHECKING:
    from sglaunch.migrate.files import FileReport

# NOTE: the engine (and with it the flag schema) is imported inside the command, not here: every
# `sglaunch` invocation, `--help` included, imports this module to register the command

DEFAULT_FROM = "0.5.15"
LEVEL_STYLE = {FIX: "green", UNSAFE: "yellow", MANUAL: "red", INFO: "cyan", ERROR: "bold red"}


@funnel
def migrate_flags(
    paths: Annotated[list[str], typer.Argument(
        help="Launch scripts, YAML configs, manifests, Dockerfiles or folders; '-' reads stdin.",
        show_default=False)],
    from_release: Annotated[str, typer.Option("--from", help="SGLang release the files target now.")] = DEFAULT_FROM,
    to_release: Annotated[str, typer.Option("--to", help="SGLang release to migrate to.")] = SGLANG_RELEASE,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if anything would change "
                                        "or needs manual action.")] = False,
    write: Annotated[bool, typer.Option("--write", help="Apply the fixes in place (atomically).")] = False,
    unsafe_fixes: Annotated[bool, typer.Option("--unsafe-fixes", help="Also apply fixes that change "
                                               "behaviour (see `sglaunch rules list`).")] = False,
    fmt: Annotated[Optional[str], typer.Option("--format", help=f"Force the format: {', '.join(FORMATS)}.")] = None,
    as_json: JsonOption = False,
    output_format: Annotated[str, typer.Option("--output-format", help="text, json, github (workflow "
                                               "annotations) or sarif (2.1.0).")] = "text",
) -> None:
    """Rewrite launch scripts and configs for a newer SGLang release."""
    from sglaunch.migrate.files import iter_files, process_file
    from sglaunch.migrate.rules import load_rules

    options = _options(from_release, to_release, check, write, fmt)
    if output_format not in OUTPUT_FORMATS:
        raise SglaunchError(f"unknown output format '{output_format}'", hint=f"choose one of: {', '.join(OUTPUT_FORMATS)}")
    if as_json:
        output_format = "json"
    rules = load_rules().between(options["from"], options["to"])
    stdin_text = sys.stdin.read() if STDIN in paths else None
    reports = []
    ignored = 0  # walked files that are not launch files of any kind
    for path, explicit in iter_files(paths):
        report = process_file(path, explicit, rules, options["to"], unsafe_fixes, fmt, stdin_text)
        if report is not None:
            reports.append(report)
        else:
            ignored += 1
    if write:
        _write(reports)
    code = exit_code(reports)
    if output_format == "json":
        print(json.dumps(_json(reports, options, code, check, write, ignored), indent=2))
    elif output_format == "github":
        _github(reports, write)
    elif output_format == "sarif":
        print(json.dumps(_sarif(reports, rules), indent=2))
    else:
        _print(reports, check, write, unsafe_fixes, len(rules), ignored)
    raise typer.Exit(code)


OUTPUT_FORMATS = ("text", "json", "github", "sarif")
GITHUB_LEVEL = {MANUAL: "error", ERROR: "error", UNSAFE: "warning", FIX: "warning", INFO: "notice"}
SARIF_LEVEL = {MANUAL: "error", ERROR: "error", UNSAFE: "warning", FIX: "warning", INFO: "note"}


def _github_escape(text: str, property_value: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def _github(reports: list[FileReport], write: bool) -> None:
    """GitHub Actions workflow commands: one annotation per finding, at its file and line."""
    for report in reports:
        for f in report.findings:
            kind = GITHUB_LEVEL.get(f.level, "warning")
            label = "fixed" if f.level == FIX and report.written else f.level
            print(f"::{kind} file={_github_escape(report.path, True)},line={max(f.line, 1)},"
                  f"title={_github_escape(f'{f.rule_id} {label}', True)}::{_github_escape(_short(f.message))}")
        if report.error and not report.findings:
            print(f"::error file={_github_escape(report.path, True)}::{_github_escape(report.error)}")
        if report.changed and not report.written and not any(f.level == FIX for f in report.findings):
            print(f"::warning file={_github_escape(report.path, True)}::would change")


def _sarif(reports: list[FileReport], rules) -> dict:
    """SARIF 2.1.0, for code-scanning uploads: one result per finding."""
    from sglaunch import __version__

    described = {}
    for rule in rules:
        described[rule.id] = {"id": rule.id, "name": rule.name,
                              "shortDescription": {"text": headline(rule.message)},
                              "fullDescription": {"text": _short(rule.message)}}
    results = []
    for report in reports:
        for f in report.findings:
            if f.rule_id not in described:
                described[f.rule_id] = {"id": f.rule_id, "shortDescription": {"text": f.rule_id}}
            results.append({
                "ruleId": f.rule_id, "level": SARIF_LEVEL.get(f.level, "warning"),
                "message": {"text": _short(f.message)},
                "properties": {"sglaunchLevel": f.level, "token": f.token},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": report.path if report.path != STDIN else "stdin"},
                    "region": {"startLine": max(f.line, 1)}}}],
            })
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "sglaunch migrate-flags", "version": __version__,
                                      "rules": sorted(described.values(), key=lambda r: r["id"])}},
                  "results": results}],
    }


def _options(from_release: str, to_release: str, check: bool, write: bool, fmt: str | None) -> dict:
    if check and write:
        raise SglaunchError("--check and --write exclude each other",
                            hint="use --check in CI, --write to apply the fixes")
    if fmt is not None and fmt not in FORMATS and not (fmt.endswith("+jinja") and fmt[:-6] in FORMATS):
        raise SglaunchError(f"unknown format '{fmt}'", hint=f"choose one of: {', '.join(FORMATS)}")
    start, end = check_release(from_release), check_release(to_release)
    if release_key(start) >= release_key(end):
        raise SglaunchError(f"--from {start} is not older than --to {end}",
                            hint="migrations run forwards, e.g. --from 0.5.15 --to 0.5.16")
    return {"from": start, "to": end}


def _write(reports: list[FileReport]) -> None:
    from sglaunch.migrate.files import write_atomic

    for report in reports:
        if not report.changed or report.error:
            continue
        if report.path == STDIN:
            _stdout_text(report.migrated)
            report.written = True
            continue
        try:
            write_atomic(report.path, report.migrated)
            report.written = True
        except OSError as exc:
            report.error = f"cannot write {report.path}: {exc.strerror or exc}"


def _stdout_text(text: str) -> None:
    from sglaunch.migrate.files import _has_surrogates, display

    buffer = getattr(sys.stdout, "buffer", None)
    if _has_surrogates(text) and buffer is not None:  # undecodable input bytes go out unchanged
        sys.stdout.flush()
        buffer.write(text.encode("utf-8", "surrogateescape"))
        buffer.flush()
    else:
        sys.stdout.write(display(text))


def exit_code(reports: list[FileReport]) -> int:
    """2 when any input was unreadable, 1 when anything changed or needs action, else 0."""
    if any(r.error for r in reports):
        return EXIT_USAGE
    # NOTE: an `error` finding (a launch whose arguments cannot be read) fails too: --check never
    # passes what it could not check
    if any(r.changed for r in reports) or any(f.level in (FIX, UNSAFE, MANUAL, ERROR) for r in reports
                                              for f in r.findings):
        return EXIT_FINDINGS
    return 0


# --------------------------------------------------------------------------- output


def _print(reports: list[FileReport], check: bool, write: bool, unsafe_fixes: bool, rule_count: int,
           ignored: int = 0) -> None:
    from rich.markup import escape

    console = stdout_console()
    err = _stderr() if write and any(r.path == STDIN for r in reports) else console
    for report in reports:
        for line in _finding_lines(report, write):
            err.print(line, soft_wrap=True)
        if report.note:
            err.print(f"[dim]{escape(report.path)}: {escape(report.note)}[/]")
        if report.error:
            err.print(f"[bold red]{escape(report.path)}: {escape(report.error)}[/]")
        if report.changed and not check and not write:
            sys.stdout.flush()
            console.file.write(report.diff())
            console.file.flush()
    err.print(_summary(reports, check, write, unsafe_fixes, rule_count))
    err.print(kinds_line(reports, ignored))


def _stderr():
    from sglaunch.cli.common import stderr_console

    return stderr_console()


def _finding_lines(report: FileReport, write: bool) -> list[str]:
    from rich.markup import escape

    lines = []
    for f in report.findings:
        label = {FIX: "fixed" if write and report.written else "fix"}.get(f.level, f.level)
        style = LEVEL_STYLE.get(f.level, "")
        more = f" [dim](sglaunch rules explain {f.rule_id})[/]" if f.rule is not None else ""
        lines.append(f"{escape(report.path)}:{f.line}: [bold]{escape(f.rule_id)}[/] "
                     f"[{style}]{label}[/] {escape(headline(f.message))}{more}")
    return lines


def _short(message: str) -> str:
    return " ".join(message.split())


def headline(message: str) -> str:
    """First sentence of a finding's message (the full text is in `rules explain` and --json)."""
    text = _short(message)
    match = re.match(r"(.+?[.)])(?=\s+[A-Z(`-]|$)", text)
    return match.group(1) if match else text


def _summary(reports: list[FileReport], check: bool, write: bool, unsafe_fixes: bool, rule_count: int) -> str:
    findings = [f for r in reports for f in r.findings]
    counts = {level: sum(1 for f in findings if f.level == level) for level in (FIX, UNSAFE, MANUAL, INFO, ERROR)}
    changed = sum(1 for r in reports if r.changed)
    verb = "rewritten" if write else "would change"
    parts = [f"{len(reports)} file(s) checked against {rule_count} rule(s)", f"{changed} {verb}"]
    parts.append(f"{counts[FIX]} fix(es)")
    if counts[UNSAFE]:
        parts.append(f"{counts[UNSAFE]} unsafe fix(es) not applied (use --unsafe-fixes)")
    if counts[MANUAL]:
        parts.append(f"{counts[MANUAL]} need manual action")
    if counts[INFO]:
        parts.append(f"{counts[INFO]} notice(s)")
    if counts[ERROR]:
        parts.append(f"{counts[ERROR]} error(s)")
    return ", ".join(parts)


def kinds_line(reports: list[FileReport], ignored: int) -> str:
    """`read: 3 shell, 1 k8s; skipped: 2 (binary, too large), 14 not launch files`."""
    from collections import Counter

    read = Counter(r.fmt for r in reports if r.fmt and not r.note)
    skipped = [r for r in reports if r.note]
    parts = ", ".join(f"{n} {k}" for k, n in sorted(read.items(), key=lambda kv: (-kv[1], kv[0]))) or "nothing"
    line = f"read: {parts}"
    tail = []
    if skipped:
        tail.append(f"{len(skipped)} unreadable or too large")
    if ignored:
        tail.append(f"{ignored} not launch files")
    return line + (f"; skipped: {', '.join(tail)}" if tail else "")


def _json(reports: list[FileReport], options: dict, code: int, check: bool, write: bool, ignored: int = 0) -> dict:
    from collections import Counter

    return {
        "from": options["from"], "to": options["to"],
        "mode": "write" if write else "check" if check else "diff",
        "exit_code": code,
        "read": dict(Counter(r.fmt for r in reports if r.fmt and not r.note)),
        "skipped": {"unreadable": sum(1 for r in reports if r.note), "not_launch_files": ignored},
        "files": [_file_json(r, check) for r in reports],
    }


def _file_json(report: FileReport, check: bool) -> dict:
    return {
        "path": report.path, "format": report.fmt, "changed": report.changed,
        "written": report.written, "skipped": report.note, "error": report.error,
        "findings": [{"rule": f.rule_id, "level": f.level, "line": f.line, "token": f.token,
                      "message": _short(f.message), "fixable": f.level in (FIX, UNSAFE)}
                     for f in report.findings],
        "diff": report.diff() if not check else "",
    }
