"""Attention backends, by the name `--attention-backend` uses.

Factories import lazily so that choosing "torch" never imports FlashInfer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from sglaunch.engine.attention.base import AttentionBackend


def _torch_backend() -> type[AttentionBackend]:
    from sglaunch.engine.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend


def _flashinfer_backend() -> type[AttentionBackend]:
    from sglaunch.engine.attention.flashinfer_backend import FlashInferAttentionBackend

    return FlashInferAttentionBackend


# Backends this build can run; the front end reads it (torch-free) to resolve `auto`.
# NOTE: "flashinfer" also needs CUDA, fp16/bf16 and the optional `flashinfer-python` package
# (extra `gpu`); the front end checks those before picking it.
IMPLEMENTED: frozenset[str] = frozenset({"torch", "flashinfer"})

ATTENTION_BACKENDS: dict[str, Callable[[], type[AttentionBackend]]] = {
    "torch": _torch_backend,
    "flashinfer": _flashinfer_backend,
}


def attention_backend_class(name: str) -> type[AttentionBackend]:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]()
