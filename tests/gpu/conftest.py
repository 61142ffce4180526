"""GPU tests: skipped as a whole without CUDA; FlashInfer ones also without `flashinfer`.

Run on a GPU machine with:  python -m pytest -v -p no:cacheprovider tests/gpu
FlashInfer JIT-compiles its kernels on first use (minutes); export FLASHINFER_WORKSPACE_BASE=DIR
to keep the compiled kernels in DIR/.cache/flashinfer between runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available()
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
HERE = Path(__file__).parent

# the tiny-checkpoint helpers of the engine and DSpark tests
for folder in ("engine", "dspark"):
    if str(HERE.parent / folder) not in sys.path:
        sys.path.insert(0, str(HERE.parent / folder))


def pytest_collection_modifyitems(config, items):
    """Module-level skip of everything under tests/gpu without a CUDA device."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_bursts_unless_asked(monkeypatch):
    """DSpark bursts (on by default on CUDA) would take over the all-greedy decode steps whose
    per-step paths (drafter graphs, drafts on the device, host-sync censuses) these tests check;
    the burst tests turn them back on with monkeypatch.setenv."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "0")


@pytest.fixture(scope="session")
def flashinfer():
    if not HAS_FLASHINFER:
        pytest.skip("flashinfer is not installed (pip install 'sglaunch[gpu]')")
    import flashinfer as module

    return module
