"""The one exception type the CLI turns into `Error: ...` / `Hint: ...` on stderr."""

from __future__ import annotations

EXIT_FINDINGS = 1
EXIT_USAGE = 2


class SglaunchError(Exception):
    """A user-facing error: bad flag, bad config file, bad input file.

    `hint` tells the user what to do about it; `exit_code` is 2 for usage and
    configuration errors unless a command says otherwise.
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def __str__(self) -> str:  # pragma: no cover - used in logs only
        return self.message if not self.hint else f"{self.message} ({self.hint})"
