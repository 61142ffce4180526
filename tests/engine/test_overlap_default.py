"""SGLAUNCH_OVERLAP's default: auto, on for CUDA devices only (CPU operators run synchronously)."""

import pytest

from sglaunch.engine.model_runner import OVERLAP_ENV, overlap_from_env


@pytest.mark.parametrize("value, cpu, cuda", [(None, False, True), ("auto", False, True), ("", False, True),
                                              ("0", False, False), ("1", True, True)])
def test_overlap_values(monkeypatch, value, cpu, cuda):
    if value is None:
        monkeypatch.delenv(OVERLAP_ENV, raising=False)
    else:
        monkeypatch.setenv(OVERLAP_ENV, value)
    assert overlap_from_env("cpu") is cpu
    assert overlap_from_env("cuda") is cuda


def test_overlap_bad_value_names_the_choices(monkeypatch):
    monkeypatch.setenv(OVERLAP_ENV, "yes")
    with pytest.raises(ValueError, match="expected 0 or 1, or auto"):
        overlap_from_env("cuda")
