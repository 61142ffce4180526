"""The frozen configuration `serve` hands to the engine after the validation pipeline.

Every value here is resolved: no `auto`, no `None` where the engine needs a number. The
front end builds it (`sglaunch.checks.pipeline.build_engine_config`); the engine only reads it.
Torch-free on purpose.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RaggedVerifyMode = Literal["static", "cap-accept", "compact"]

# The defaults of the values below, shared by the front end (checks/resolve.py, which fills them
# in and logs why) and the engine (for an EngineConfig built directly, as benchmarks and tests do
# it), so both boot the same engine.
GPU_MEM_FRACTION = 0.88  # --mem-fraction-static on GPUs: weights + KV pool
CPU_KV_TOKENS = 16384  # KV pool of a CPU rank in tokens
CUDA_GRAPH_MAX_BS = 256  # largest decode batch captured (never above --max-running-requests)


def default_max_running_requests(device: str) -> int:
    """--max-running-requests when not given: by device, with DSpark as without. NOTE: SGLang caps
    DSpark at 48 running requests; ours steps aside (plain decode steps) when drafting would not
    pay, so a lower cap would only queue requests that plain decoding serves: at concurrency 64 a
    DSpark server ran 48 where plain ran 64 (session 7's `bench --compare`, 0.74x)."""
    return 256 if device == "cuda" else 64


@dataclass(frozen=True)
class SpeculativeConfig:
    """DSpark settings (the only speculative algorithm sglaunch's engine runs)."""

    algorithm: str  # "DSPARK"
    draft_model_path: str  # checkpoint folder of the drafter (may equal the target's when bundled)
    block_size: int  # gamma: drafted tokens per round; the verify window is gamma + 1
    num_draft_tokens: int  # gamma + 1
    ragged_verify_mode: RaggedVerifyMode
    sps_table_path: str | None = None
    confidence_sts_path: str | None = None
    align_verify_tokens_to_graph_tier: bool = False


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to boot, resolved and validated."""

    # model
    model_path: str
    tokenizer_path: str
    served_model_name: str
    dtype: Literal["bfloat16", "float16", "float32"]
    context_length: int | None  # None: take max_position_embeddings from the checkpoint
    chat_template: str | None = None
    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    enable_metrics: bool = False
    log_level: str = "info"
    random_seed: int | None = None
    max_request_body_mb: float = 8.0  # larger request bodies get 413
    graceful_shutdown_timeout: float = 20.0  # after SIGTERM/SIGINT, seconds running requests may finish
    tokenizer_worker_num: int = 1  # HTTP worker processes (tokenize, detokenize, stream) before one engine
    stream_interval: int = 1  # a request's outputs go to the server every N new tokens (and its first and last)
    # parallelism (one process per tensor-parallel rank)
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # "host:port"; None: single node, a free local port
    device: Literal["cuda", "cpu"] = "cpu"
    base_gpu_id: int = 0
    # memory and scheduling
    mem_fraction_static: float | None = None  # GPUs: fraction for weights + KV pool
    max_total_tokens: int | None = None  # CPUs (or an explicit cap on GPUs): KV pool size in tokens
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None  # None or -1: no chunking
    page_size: int = 1
    disable_radix_cache: bool = False
    kv_cache_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # kernels
    attention_backend: Literal["torch", "flashinfer"] = "torch"
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    # speculative decoding; None: plain decoding
    speculative: SpeculativeConfig | None = None
    # free-form record of how each `auto` was resolved, for logs and /server_info
    resolutions: tuple[tuple[str, str], ...] = field(default=())

    @property
    def running_cap(self) -> int:
        """max_running_requests, or its default for this device and algorithm."""
        return self.max_running_requests or default_max_running_requests(self.device)

    @property
    def graph_batch_cap(self) -> int:
        """The largest decode batch a CUDA graph is captured for."""
        return min(self.cuda_graph_max_bs or CUDA_GRAPH_MAX_BS, self.running_cap)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def env_switch(name: str, default: bool) -> bool:
    """A 0/1 environment switch of the engine, read once at start-up: unset or empty gives
    `default`; anything but 0 or 1 is refused, naming the variable."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r}: expected 0 or 1 (unset: {int(default)})")
    return value == "1"


def env_int(name: str, default: int, low: int) -> int:
    """A whole-number environment setting of the engine, read once at start-up: unset or empty
    gives `default`; anything but a whole number >= low is refused, naming the variable."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        n = low - 1
    if n < low:
        raise ValueError(f"{name}={value!r}: expected a whole number >= {low} (unset: {default})")
    return n
