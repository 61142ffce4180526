"""SGLang releases sglaunch knows about, and how to compare them."""

from __future__ import annotations

from sglaunch import SGLANG_RELEASE
from sglaunch.errors import SglaunchError

# Every release whose launch-surface changes the flag schema and the migration rules record.
# `sglaunch/flags/sglang/<release>.json` holds each one's flags, extracted from its wheel.
KNOWN_RELEASES: tuple[str, ...] = ("0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
                                  "0.5.22", "0.5.23")
OLDEST_RELEASE = KNOWN_RELEASES[0]
CURRENT_RELEASE = SGLANG_RELEASE


def release_key(release: str) -> tuple[int, ...]:
    """`"0.5.16"` -> `(0, 5, 16)`; raises SglaunchError on anything else."""
    try:
        return tuple(int(part) for part in release.strip().lstrip("v").split("."))
    except ValueError:
        raise SglaunchError(
            f"'{release}' is not an SGLang release number",
            hint=f"use one of: {', '.join(KNOWN_RELEASES)}",
        ) from None


def check_release(release: str) -> str:
    """Normalise a release the user typed and make sure we know it."""
    normalised = release.strip().lstrip("v")
    if normalised not in KNOWN_RELEASES:
        release_key(normalised)  # a clearer error for non-numbers
        raise SglaunchError(
            f"sglaunch has no flag history for SGLang {normalised}",
            hint=f"known releases: {', '.join(KNOWN_RELEASES)}",
        )
    return normalised


def at_or_after(release: str, boundary: str | None) -> bool:
    """True when `release` is `boundary` or newer; a None boundary means 'never'."""
    return boundary is not None and release_key(release) >= release_key(boundary)
