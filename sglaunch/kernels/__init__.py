"""Triton kernels for DSpark's per-step device work, each with a plain-torch reference beside it.

- `dspark_topk`: per-position STS calibration, prefix survival, top-K verify allocation.
- `dspark_pack`: compact packing of the ragged verify batch (token ids, positions, index arrays).
- `dspark_accept`: greedy and rejection-sampling acceptance given uniform randoms.

`HAS_TRITON` says whether the Triton versions can run here (on CPU only through
`TRITON_INTERPRET=1`). sglaunch imports these through `sglaunch.speculative.kernels`, which falls
back to the references when Triton or a GPU is absent.
"""

from __future__ import annotations

try:  # NOTE: triton is optional (CPU installs do not ship it)
    import triton  # noqa: F401

    HAS_TRITON = True
    TRITON_IMPORT_ERROR: str | None = None
except Exception as exc:  # pragma: no cover - depends on the install
    HAS_TRITON = False
    TRITON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def use_triton(device) -> bool:
    """Whether the Triton kernels run for tensors on `device`: on CUDA when Triton is importable;
    SGLAUNCH_DSPARK_KERNELS=torch|triton forces a side (triton on CPU tensors needs TRITON_INTERPRET=1)."""
    import os

    choice = os.environ.get("SGLAUNCH_DSPARK_KERNELS", "auto")
    if choice == "torch":
        return False
    if choice == "triton":
        return HAS_TRITON
    return HAS_TRITON and device.type == "cuda"
