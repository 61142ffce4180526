"""`sglaunch rules list|explain`: the migration rules behind `migrate-flags`."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel, stdout_console
from sglaunch.errors import SglaunchError
from sglaunch.migrate.rules import Rule, load_rules
from sglaunch.releases import KNOWN_RELEASES, OLDEST_RELEASE, check_release

app = typer.Typer(no_args_is_help=True, help="List and explain the migration rules.")
SAFETY_STYLE = {"safe": "green", "unsafe": "yellow", "manual": "red"}


def rule_json(rule: Rule) -> dict:
    data = {"id": rule.id, "name": rule.name, "release": rule.release, "kind": rule.kind,
            "safety": rule.safety, "old": rule.old, "new": rule.new, "flag": rule.flag,
            "env": rule.env, "value": rule.value or rule.set_value, "message": rule.message,
            "example": {"before": rule.before, "after": rule.after}}
    return {k: v for k, v in data.items() if v is not None}


@app.command("list")
@funnel
def list_rules(
    to_release: Annotated[Optional[str], typer.Option("--to", help="Only rules up to this release.")] = None,
    from_release: Annotated[str, typer.Option("--from", help="Only rules after this release.")] = OLDEST_RELEASE,
    as_json: JsonOption = False,
) -> None:
    """List the migration rules, oldest release first."""
    end = check_release(to_release) if to_release else KNOWN_RELEASES[-1]
    rules = load_rules().between(check_release(from_release), end)
    if as_json:
        print(json.dumps([rule_json(r) for r in rules], indent=2))
        return
    from rich.table import Table

    table = Table(title=f"migration rules {from_release} -> {end}", title_justify="left")
    for column in ("id", "release", "kind", "safety", "change"):
        table.add_column(column, no_wrap=column != "change")
    for rule in rules:
        style = SAFETY_STYLE[rule.safety]
        table.add_row(rule.id, rule.release, rule.kind, f"[{style}]{rule.safety}[/]", _change(rule))
    stdout_console().print(table)


def _change(rule: Rule) -> str:
    from rich.markup import escape

    if rule.kind == "rename-flag":
        text = f"{rule.old} -> {rule.new}" + (f" {rule.set_value}" if rule.set_value else "")
    elif rule.kind in ("replace-value", "remove-value"):
        text = f"{rule.flag} {rule.old}" + (f" -> {rule.new}" if rule.new else " (removed)")
    elif rule.kind == "remove-flag":
        text = f"{rule.old} (removed)"
    elif rule.kind == "require-env":
        text = f"{rule.env}={rule.value} with {rule.when.flag if rule.when else ''} {' '.join(rule.when.values) if rule.when else ''}"
    elif rule.kind == "rename-env":
        text = f"{rule.old} -> {rule.new}"
    else:
        text = rule.name
    return escape(text.strip())


@app.command("explain")
@funnel
def explain(
    rule_id: Annotated[str, typer.Argument(help="Rule id (R516-01) or name.", metavar="ID")],
    as_json: JsonOption = False,
) -> None:
    """Show one rule: what changed, how it is fixed, and an example."""
    rules = load_rules()
    rule = rules.find(rule_id)
    if rule is None:
        ids = ", ".join(r.id for r in rules.rules[:6])
        raise SglaunchError(f"no migration rule '{rule_id}'",
                            hint=f"see `sglaunch rules list` (ids look like {ids}, ...)")
    if as_json:
        print(json.dumps(rule_json(rule), indent=2))
        return
    _render(rule)


def _render(rule: Rule) -> None:
    from rich.markup import escape
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.console import Group
    from rich.text import Text

    style = SAFETY_STYLE[rule.safety]
    header = Text.from_markup(
        f"[bold]{rule.id}[/] {escape(rule.name)}\nrelease {rule.release} · {rule.kind} · "
        f"[{style}]{rule.safety}[/] · {escape(_change(rule))}\n")
    fix = {"safe": "Fixed by default.", "unsafe": "Fixed only with --unsafe-fixes (behaviour changes).",
           "manual": "Reported only; a person has to decide."}[rule.safety]
    body = Group(header, Text(rule.message + "\n"), Text(fix + "\n", style=style),
                 Text("before:", style="bold"), Syntax(rule.before, "bash", word_wrap=True),
                 Text("after:", style="bold"), Syntax(rule.after, "bash", word_wrap=True))
    stdout_console().print(Panel(body, title=f"rule {rule.id}", title_align="left"))
