"""Tiny DSpark drafter configs and checkpoints written in the DeepSpec format."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spec_helpers import tiny_config  # noqa: E402
from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_ckpt(tmp_path_factory):
    cfg = tiny_config()
    return save_drafter(tmp_path_factory.mktemp("dspark") / "qwen3", cfg, init_drafter_state(cfg, seed=7))


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
