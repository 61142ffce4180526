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

    def get(self, dest: str) -> Any:
        return self.settings.get(dest)

    def given(self, dest: str) -> bool:
        return self.settings.given(dest)

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
