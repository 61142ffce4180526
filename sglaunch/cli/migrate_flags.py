"""`sglaunch migrate-flags` (built in the migrate-flags issue)."""

from __future__ import annotations

from sglaunch.cli.common import funnel
from sglaunch.errors import SglaunchError


@funnel
def migrate_flags() -> None:
    raise SglaunchError("migrate-flags is not built yet", hint="see the migrate-flags issue", exit_code=3)
