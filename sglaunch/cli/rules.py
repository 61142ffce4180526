"""`sglaunch rules list|explain` (built in the migrate-flags issue)."""

from __future__ import annotations

import typer

from sglaunch.cli.common import funnel
from sglaunch.errors import SglaunchError

app = typer.Typer(no_args_is_help=True)


@app.command("list")
@funnel
def list_rules() -> None:
    raise SglaunchError("the migration rules are not built yet", hint="see the migrate-flags issue", exit_code=3)
