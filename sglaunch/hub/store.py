"""The model cache on disk: where it lives, a lock against concurrent pulls, atomic installs.

Layout: `<root>/models/<name>/` holds a finished model (config.json, model.safetensors,
tokenizer files, `sglaunch-model.json`). It appears only by `os.rename` of a finished temp
folder `<root>/models/.tmp-<name>-*` (same file system), so a reader never sees a half-written
model. `<root>/models/.<name>.lock` serialises pulls of one model across processes. Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from sglaunch.errors import SglaunchError

MANIFEST = "sglaunch-model.json"
EXIT_PULL_FAILED = 1


def cache_root() -> Path:
    """`$SGLAUNCH_CACHE_DIR`, else `$XDG_CACHE_HOME/sglaunch`, else `~/.cache/sglaunch`."""
    explicit = os.environ.get("SGLAUNCH_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sglaunch"


def models_dir() -> Path:
    return cache_root() / "models"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_size(folder: Path) -> int:
    """Bytes of the regular files under `folder`, read while another process may be writing and
    deleting there (pip's temp folders during a pull): an entry that vanishes mid-walk is skipped
    (os.walk passes over a folder it cannot list; Path.rglob raised FileNotFoundError)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(root, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def temp_prefix(name: str) -> str:
    return f".tmp-{name}-"


def remove_stale_temps(name: str) -> list[Path]:
    """Temp folders left by a killed pull (call with the lock held)."""
    removed = []
    parent = models_dir()
    if parent.is_dir():
        for path in parent.glob(temp_prefix(name) + "*"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def model_lock(name: str, timeout_s: float = 1800.0, on_wait=None) -> Iterator[None]:
    """Exclusive lock on `<models>/.<name>.lock` (flock; released when the process dies)."""
    import fcntl

    parent = models_dir()
    make_dirs(parent)
    with open(parent / f".{name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SglaunchError(f"another process has been pulling {name} for over {timeout_s:.0f} s",
                                            hint=f"wait for it, or remove {parent / f'.{name}.lock'} if no "
                                                 "sglaunch process is running", exit_code=EXIT_PULL_FAILED) from None
                    time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def make_dirs(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SglaunchError(f"cannot create the cache folder {path}: {exc.strerror or exc}",
                            hint="set SGLAUNCH_CACHE_DIR to a writable folder", exit_code=EXIT_PULL_FAILED) from None


def check_free_space(path: Path, needed: int) -> None:
    free = shutil.disk_usage(path).free
    if free < needed:
        raise SglaunchError(f"not enough disk space in {path}: {free / 1e6:.0f} MB free, the pull needs about "
                            f"{needed / 1e6:.0f} MB", hint="free some space or set SGLAUNCH_CACHE_DIR to a "
                            "folder on a larger disk", exit_code=EXIT_PULL_FAILED)


@contextlib.contextmanager
def staging(name: str) -> Iterator[Path]:
    """A temp folder beside the final one; removed on any failure or interrupt."""
    parent = models_dir()
    make_dirs(parent)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(name), dir=parent))
    try:
        yield tmp
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise SglaunchError(f"the disk holding {parent} filled up while pulling {name}; nothing was kept",
                                hint="free some space or set SGLAUNCH_CACHE_DIR to a folder on a larger disk",
                                exit_code=EXIT_PULL_FAILED) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)  # the caller renamed what it kept out of it


def publish(finished: Path, final: Path) -> Path:
    """Atomically make `finished` (a folder in the same parent) the model at `final`."""
    old = None
    if final.exists():
        old = final.with_name(f"{temp_prefix(final.name)}old-{os.getpid()}")
        os.rename(final, old)
    os.rename(finished, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final
