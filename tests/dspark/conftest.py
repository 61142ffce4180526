"""Session fixtures: a tiny target, a random and an "oracle" DSpark drafter, an SPS table."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dspark_helpers import build_target, oracle_drafter, random_drafter, steep_sps  # noqa: E402


@pytest.fixture(scope="session")
def dspark_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dspark")
    target = build_target(root / "target")
    return {
        "target": target,
        "oracle": oracle_drafter(root / "oracle", target),
        "random": random_drafter(root / "random"),
        "sps": steep_sps(root / "sps.json"),
    }


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
