"""Suite-wide test set-up.

Without a GPU, Triton kernels can only run through Triton's interpreter, which must be chosen
before triton is first imported; sglaunch's engine imports triton with its layer kernels
(`sglaunch/kernels/`), so the choice is made here, before any test module is collected. The engine itself
runs the kernels only on GPUs unless SGLAUNCH_LAYER_KERNELS / SGLAUNCH_DSPARK_KERNELS force them.
"""

from __future__ import annotations

import glob
import os

import pytest

if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def interpreter_rounds_like_the_gpu(monkeypatch):
    """Triton's CPU interpreter truncates float32 -> bfloat16 (its round-to-nearest variant does
    not carry into the exponent); the GPU rounds to nearest even, as torch does. For the kernels'
    rounding steps to be checked here, the interpreter converts as the GPU does."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import torch
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            as_float = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np.float32).copy())
            return as_float.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(data.shape)
        return original(data, src, dst, rounding_mode)

    monkeypatch.setattr(interpreter, "_convert_float", convert)
