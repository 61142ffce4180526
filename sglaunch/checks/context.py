"""What every check reads: the settings, the environment, the checkpoints, the mode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from sglaunch.flags.argv import Origin
from sglaunch.flags.sources import Settings
from sglaunch.probe.checkpoint import CheckpointInfo
from sglaunch.probe.environment import EnvironmentInfo

Mode = Literal["serve", "check"]
RESOLVED = Origin("resolved")


class UnknownAtCheckTime(Exception):
    """A check asked for a value that is shell text (`--tp $TP`) only known when the script runs.

    The pipeline catches it and skips that check (recording which one), so no default is ever
    substituted for a value the user did give."""

    def __init__(self, dest: str):
        super().__init__(dest)
        self.dest = dest


@dataclass(frozen=True)
class Resolution:
    """One `auto` (or unset value) turned into a concrete value, and why."""

    flag: str
    value: Any
    reason: str


@dataclass
class LaunchContext:
    settings: Settings
    environ: Mapping[str, str]
    mode: Mode
    env_info: EnvironmentInfo | None = None
    checkpoint: CheckpointInfo | None = None
    draft: CheckpointInfo | None = None
    resolutions: list[Resolution] = field(default_factory=list)
    default_model_pending: bool = False  # the built-in model is not cached yet: serve fetches it
    pending_model_dtype: str | None = None  # ... and the dtype it will have once converted

    def get(self, dest: str) -> Any:
        if dest in self.settings.unexpanded and dest not in self.settings.values:
            raise UnknownAtCheckTime(dest)
        return self.settings.get(dest)

    def known(self, dest: str) -> Any:
        """The value, or None where it is shell text (for checks that look at many flags and
        simply pass over the unknown ones, which FLAG014 reports)."""
        try:
            return self.get(dest)
        except UnknownAtCheckTime:
            return None

    def given(self, dest: str) -> bool:
        return self.settings.given(dest) or dest in self.settings.unexpanded

    def origin(self, dest: str) -> str:
        return str(self.settings.origin(dest))

    def resolve(self, dest: str, value: Any, reason: str) -> None:
        """Record a resolved value (logged by serve, shown by check-config)."""
        flag = self.settings.schema.by_dest(dest)
        self.settings.set(flag, value, RESOLVED)
        self.resolutions.append(Resolution(flag.name, value, reason))

    @property
    def dspark(self) -> bool:
        return self.get("speculative_algorithm") == "DSPARK"

    @property
    def gpus(self) -> list:
        return self.env_info.gpus if self.env_info else []

    @property
    def ragged_mode(self) -> str | None:
        """SGLANG_RAGGED_VERIFY_MODE as set in the environment (None when unset)."""
        entry = self.settings.env.get("SGLANG_RAGGED_VERIFY_MODE")
        return entry[0] if entry and entry[1].source == "env" else None
