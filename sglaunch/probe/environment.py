"""What this machine has: Python, torch and its CUDA, GPUs, FlashInfer, Triton, transformers, and
whether its CPU has bf16 matrix instructions.

Nothing here imports torch: versions come from package metadata, the CUDA version from
torch's own `version.py` read as text, GPUs from `nvidia-smi`, CPU flags from /proc/cpuinfo.
"""

from __future__ import annotations

import ast
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata

# distribution names to look for, first match wins
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "triton": ("triton",),
    "transformers": ("transformers",),
    "safetensors": ("safetensors",),
    "sglang": ("sglang",),
}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total_mib: int
    memory_free_mib: int
    compute_capability: str | None = None


@dataclass
class EnvironmentInfo:
    python: str
    platform: str
    packages: dict[str, str | None]
    torch_cuda: str | None
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_probe: str = ""  # how GPUs were found, or why none were
    memory_available_mib: int | None = None
    cpu_native_bf16: bool | None = None  # bf16 matrix instructions (cpu_native_bf16()); None: not probed

    def to_dict(self) -> dict:
        return asdict(self)


def package_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built with, read from torch/version.py without importing torch."""
    try:
        path = metadata.distribution("torch").locate_file("torch/version.py")
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (metadata.PackageNotFoundError, OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
            return node.value.value
    return None


def probe_gpus(environ=os.environ) -> tuple[list[GpuInfo], str]:
    """GPUs visible to this process (nvidia-smi filtered by CUDA_VISIBLE_DEVICES)."""
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return [], "nvidia-smi not found: no NVIDIA GPU visible"
    query = "index,name,memory.total,memory.free,compute_cap,uuid"
    try:
        out = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15, check=True).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        return [], f"nvidia-smi failed: {exc}"
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    gpus = [(GpuInfo(int(r[0]), r[1], int(float(r[2])), int(float(r[3])),
                     r[4] if r[4] not in ("", "[N/A]") else None), r[5]) for r in rows if len(r) >= 6]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [g for g, _ in gpus], f"nvidia-smi: {len(gpus)} GPU(s)"
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    chosen = [g for w in wanted for g, uuid in gpus if w == str(g.index) or w == uuid]
    return chosen, f"nvidia-smi: {len(gpus)} GPU(s), CUDA_VISIBLE_DEVICES={visible} -> {len(chosen)}"


def available_memory_mib() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


CPUINFO = "/proc/cpuinfo"
# x86: AVX512-BF16 (Cooper Lake, Zen 4 and later) or AMX; Arm: FEAT_BF16 ("bf16" under Features)
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_native_bf16(path: str | None = None) -> bool | None:
    """Whether this machine's CPU has bf16 matrix instructions, from the first `flags` (x86) or
    `Features` (Arm) line of /proc/cpuinfo; None when that cannot be read (another OS). Without
    them torch runs bf16 matmuls emulated: on session 26's AMD EPYC without AVX-512 an 8-token
    forward of the built-in model cost about 5 one-token steps (`benchmarks/cpu26/`)."""
    try:
        with open(path or CPUINFO, encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return bool(BF16_FLAGS & set(value.split()))
    except OSError:
        return None
    return None


def probe_environment(environ=os.environ, with_gpus: bool = True) -> EnvironmentInfo:
    gpus, how = probe_gpus(environ) if with_gpus else ([], "GPU probe skipped")
    return EnvironmentInfo(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        packages={key: package_version(names) for key, names in PACKAGES.items()},
        torch_cuda=torch_cuda_version(),
        gpus=gpus,
        gpu_probe=how,
        memory_available_mib=available_memory_mib(),
        cpu_native_bf16=cpu_native_bf16() if with_gpus else None,  # NOTE: --no-machine probes no hardware
    )


def version_at_least(version: str | None, minimum: str) -> bool:
    if version is None:
        return False
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


__all__ = ["EnvironmentInfo", "GpuInfo", "probe_environment", "version_at_least"]
