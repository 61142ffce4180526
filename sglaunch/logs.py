"""The one log format of sglaunch's processes (the HTTP server and the engine process), on stderr.
Torch-free."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def configure_logging(level: str) -> None:
    """sglaunch's loggers to stderr in LOG_FORMAT, at `level` (once per process)."""
    root = logging.getLogger("sglaunch")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
        root.addHandler(handler)
    root.setLevel(level.upper())
