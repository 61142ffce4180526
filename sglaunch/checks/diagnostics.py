"""Diagnostics: what the validation pipeline reports, each with a stable code.

The table `CODES` is the catalogue (rendered into docs/diagnostics.md); checks create
`Diagnostic` objects through `diag(code, ...)` so a code's severity lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class CodeInfo:
    severity: Severity
    title: str


E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO

CODES: dict[str, CodeInfo] = {
    # flags and their history (from the schema)
    "FLAG002": CodeInfo(E, "flag removed without replacement"),
    "FLAG003": CodeInfo(E, "flag renamed without alias"),
    "FLAG004": CodeInfo(E, "flag not available in the target release"),
    "FLAG005": CodeInfo(W, "deprecated spelling, still accepted"),
    "FLAG006": CodeInfo(E, "flag value removed"),
    "FLAG007": CodeInfo(W, "deprecated value spelling, still accepted"),
    "FLAG008": CodeInfo(W, "value not known to sglaunch"),
    "FLAG009": CodeInfo(E, "flag value not available in the target release"),
    "FLAG010": CodeInfo(W, "flag given more than once"),
    "FLAG011": CodeInfo(E, "value out of range"),
    "FLAG012": CodeInfo(I, "flag changes in a later release"),
    "FLAG013": CodeInfo(W, "flag has no effect without another flag"),
    "FLAG014": CodeInfo(I, "value is shell text, unknown until the script runs"),
    "FLAG015": CodeInfo(W, "abbreviated flag that argparse expands"),
    "FLAG016": CodeInfo(E, "abbreviation now stands for a different flag"),
    "FLAG017": CodeInfo(W, "value only sglaunch accepts"),
    # --config files
    "CFG001": CodeInfo(E, "config key is not kebab-case"),
    "CFG002": CodeInfo(W, "--config=FILE is not expanded by SGLang"),
    "CFG003": CodeInfo(W, "config key with an empty value"),
    "CFG004": CodeInfo(E, "config key SGLang's --config loader refuses"),
    # environment variables
    "ENV001": CodeInfo(W, "environment variable removed or without effect"),
    "ENV002": CodeInfo(W, "SGLANG_* variable the target release does not read"),
    "ENV003": CodeInfo(W, "deprecated name of an environment variable"),
    "ENV004": CodeInfo(W, "environment variable set to a value it does not take"),
    "ENV005": CodeInfo(E, "environment variable set to a value the engine refuses at start-up"),
    # quantization and checkpoints
    "QUANT001": CodeInfo(E, "checkpoint quantization method removed"),
    "QUANT002": CodeInfo(E, "NVFP4 needs FlashInfer >= 0.6.14"),
    "MODEL001": CodeInfo(E, "model path not found"),
    "MODEL002": CodeInfo(E, "model config unreadable"),
    "MODEL003": CodeInfo(E, "checkpoint weights truncated, missing or inconsistent"),
    # speculative decoding (DSpark)
    "SPEC001": CodeInfo(E, "DSpark block size must be positive"),
    "SPEC002": CodeInfo(E, "DSpark draft-token count must equal block size + 1"),
    "SPEC003": CodeInfo(E, "DSpark needs a draft model"),
    "SPEC004": CodeInfo(E, "DSpark needs --pp-size 1"),
    "SPEC005": CodeInfo(W, "DSpark forces steps and top-k to 1"),
    "SPEC006": CodeInfo(E, "DSpark with DP attention needs --enable-dp-lm-head"),
    "SPEC007": CodeInfo(E, "DSpark with DP attention needs --moe-a2a-backend none"),
    "SPEC008": CodeInfo(E, "DSpark with DP attention needs --attn-cp-size 1"),
    "SPEC009": CodeInfo(E, "draft and target MoE all-to-all backends differ"),
    "SPEC010": CodeInfo(W, "DSpark block size defaulted"),
    "SPEC011": CodeInfo(W, "DSpark flags without --speculative-algorithm DSPARK"),
    "SPEC012": CodeInfo(E, "speculative draft-token count below 2"),
    "SPEC013": CodeInfo(E, "DSpark file missing or malformed"),
    # SGLANG_RAGGED_VERIFY_MODE
    "RAGGED001": CodeInfo(E, "SGLANG_RAGGED_VERIFY_MODE unset for DSpark"),
    "RAGGED002": CodeInfo(W, "diagnostic ragged verify mode"),
    "RAGGED003": CodeInfo(E, "invalid SGLANG_RAGGED_VERIFY_MODE"),
    "RAGGED004": CodeInfo(W, "graph-tier alignment only works in compact mode"),
    "RAGGED005": CodeInfo(W, "step-cost table unused in static mode"),
    "RAGGED006": CodeInfo(I, "compact mode without a step-cost table"),
    # parallelism and topology
    "PAR001": CodeInfo(E, "--tp-size must be a multiple of --nnodes"),
    "PAR002": CodeInfo(E, "--node-rank out of range"),
    "PAR003": CodeInfo(E, "multi-node launch needs --dist-init-addr"),
    "PAR004": CodeInfo(E, "--dist-init-addr is not host:port"),
    "PAR005": CodeInfo(E, "--tp-size does not divide the model's head counts"),
    "PAR006": CodeInfo(E, "not enough visible GPUs"),
    # 0.5.16 behaviour changes and known issues
    "NOTE001": CodeInfo(I, "UnifiedRadixTree is the default prefix cache for this model"),
    "NOTE002": CodeInfo(W, "temperature-0 output may differ between runs"),
    "NOTE003": CodeInfo(E, "ReplaySSM precondition not met"),
    "NOTE004": CodeInfo(E, "DSA cache layer split precondition not met"),
    # sglaunch's own engine
    "ENG001": CodeInfo(W, "accepted for compatibility, no effect in sglaunch"),
    "ENG002": CodeInfo(E, "sglaunch's engine cannot run this configuration"),
    "ENG003": CodeInfo(W, "backend not implemented by sglaunch or unusable here, falling back"),
    "ENG004": CodeInfo(W, "more HTTP worker processes than CPUs"),
    "ENG005": CodeInfo(I, "DSpark on a CPU without bf16 matrix instructions"),
    # memory
    "MEM001": CodeInfo(E, "model does not fit in GPU memory"),
    "MEM002": CodeInfo(W, "KV pool smaller than one full-length request"),
}


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    message: str
    flags: tuple[str, ...] = ()
    fix: str | None = None
    release: str | None = None
    origin: str | None = None  # where the offending value came from (cli, file:line, env)

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "title": CODES[self.code].title,
            "message": self.message,
            "flags": list(self.flags),
            "fix": self.fix,
            "release": self.release,
            "origin": self.origin,
        }


def diag(code: str, message: str, *, flags: tuple[str, ...] | list[str] = (), fix: str | None = None,
         release: str | None = None, origin: str | None = None, severity: Severity | None = None
         ) -> Diagnostic:
    """Make a diagnostic with the catalogue's severity (a check may lower it: `severity=`)."""
    info = CODES[code]
    return Diagnostic(code, severity or info.severity, message, tuple(flags), fix, release, origin)


@dataclass
class DiagnosticList:
    items: list[Diagnostic] = field(default_factory=list)

    def add(self, d: Diagnostic) -> None:
        if d not in self.items:
            self.items.append(d)

    def extend(self, ds) -> None:
        for d in ds:
            self.add(d)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity is Severity.ERROR]

    def codes(self) -> list[str]:
        return [d.code for d in self.items]
