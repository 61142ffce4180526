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
    raise ValueError(
        "attention backend 'flashinfer' is not available in this build yet; use --attention-backend torch"
    )


# Backends this build can run; the front end reads it (torch-free) to resolve `auto`.
IMPLEMENTED: frozenset[str] = frozenset({"torch"})

ATTENTION_BACKENDS: dict[str, Callable[[], type[AttentionBackend]]] = {
    "torch": _torch_backend,
    "flashinfer": _flashinfer_backend,
}


def attention_backend_class(name: str) -> type[AttentionBackend]:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]()
