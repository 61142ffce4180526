"""Fixtures for the front-end tests: a clean environment, checkpoints on disk, a fake nvidia-smi."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fe_util import write_safetensors

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4,
         "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "vocab_size": 1000}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No SGLANG_* / CUDA_* from the developer's shell, and no real nvidia-smi."""
    for name in list(os.environ):
        if name.startswith(("SGLANG_", "CUDA_")):
            monkeypatch.delenv(name)
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", f"{empty_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SGLAUNCH_CACHE_DIR", str(tmp_path / "sglaunch-cache"))  # no cached default model
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def make_checkpoint(tmp_path):
    def make(name="model", weights: dict | None = None, fill: bool = True, **config) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**LLAMA, **config}))
        write_safetensors(folder / "model.safetensors",
                          weights or {"embed": ("BF16", [1000, 256]), "layers": ("BF16", [4, 256, 1024])},
                          fill=fill)
        return folder

    return make


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """Put an `nvidia-smi` on PATH that reports the given GPUs (CSV like the real one)."""

    def install(*gpus: tuple[str, int, str]) -> None:
        rows = "\n".join(f"{i}, {name}, {mem}, {mem - 500}, {cap}, GPU-{i:04d}"
                         for i, (name, mem, cap) in enumerate(gpus))
        bin_dir = tmp_path / "gpu-bin"
        bin_dir.mkdir(exist_ok=True)
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\ncat <<'CSV'\n{rows}\nCSV\n")
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install


@pytest.fixture
def fake_flashinfer(tmp_path, monkeypatch):
    """Make `flashinfer-python` look installed at a version (package metadata only)."""

    def install(version: str) -> None:
        site = tmp_path / f"site-fi-{version}"
        info = site / f"flashinfer_python-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(site))

    return install


