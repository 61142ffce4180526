"""The paged KV pool's tensors and how many pages fit in memory.

Layout per layer: K and V of shape [total_pages * page_size, local_kv_heads, head_dim]; token
slot i of page p is row p * page_size + i (FlashInfer's "NHD" paged layout once viewed as
[total_pages, page_size, kv_heads, head_dim]). Page ids come from the torch-free PageAllocator,
which hands out pages 0 .. num_pages - 1; with CUDA graphs one more page (`padding_page`, the
last) receives the K/V of the dummy requests that pad a batch up to its captured size and is
never handed to a request.
"""

from __future__ import annotations

import logging

import torch

from sglaunch.config import CPU_KV_TOKENS, GPU_MEM_FRACTION, EngineConfig

logger = logging.getLogger(__name__)

# NOTE: the page allocator is a Python list; tiny models on big GPUs would otherwise ask for
# hundreds of millions of slots
MAX_KV_TOKENS = 1 << 22


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype, device,
                 padding_page: bool = False):
        self.num_pages, self.page_size, self.dtype = num_pages, page_size, dtype  # num_pages: allocatable
        self.padding_page = num_pages if padding_page else None
        self.total_pages = num_pages + int(padding_page)
        shape = (self.total_pages * page_size, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def num_slots(self) -> int:
        return self.total_pages * self.page_size

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # slots: [num_tokens]; k, v: [num_tokens, kv_heads, head_dim]
        self.k[layer][slots] = k.to(self.k[layer].dtype)
        self.v[layer][slots] = v.to(self.v[layer].dtype)


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


def plan_kv_tokens(config: EngineConfig, bytes_per_token: int, device: torch.device, reserve_bytes: int = 0) -> int:
    """KV slots this rank can hold: `max_total_tokens` (default on CPU), or what fits in
    `mem_fraction_static` of the GPU after the weights are loaded, less `reserve_bytes` when the
    fraction is the default one (the DSpark drafter's working memory: ModelRunner). An explicit
    --mem-fraction-static is the user's budget for weights and KV, as in SGLang."""
    if device.type != "cuda":
        return config.max_total_tokens or CPU_KV_TOKENS
    free, total = torch.cuda.mem_get_info(device)
    fraction = config.mem_fraction_static or GPU_MEM_FRACTION
    reserve = reserve_bytes if config.mem_fraction_static is None else 0
    # NOTE: the static budget covers weights (already resident) and the KV pool
    budget = total * fraction - (total - free) - reserve
    tokens = int(budget // bytes_per_token)
    if tokens <= 0:
        kept = f", {reserve / 2**30:.2f} GiB kept for the DSpark drafter's working memory" if reserve else ""
        raise ValueError(
            f"no GPU memory left for the KV cache (budget {budget / 2**30:.2f} GiB at "
            f"--mem-fraction-static {fraction}{kept}); raise --mem-fraction-static or use more GPUs"
        )
    return min(tokens, config.max_total_tokens or MAX_KV_TOKENS)
