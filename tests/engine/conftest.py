"""Session fixtures: tiny random-weight Llama, Qwen2 and Qwen3 checkpoints and their HF models."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine_helpers import MODELS, build_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {name: build_checkpoint(name, root / name) for name in MODELS}


@pytest.fixture(scope="session")
def hf_models(checkpoints):
    return {
        name: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for name, path in checkpoints.items()
    }


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """The engine splits cores between ranks; give later tests their threads back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
