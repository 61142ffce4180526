"""Token sampling on rank 0: greedy, temperature, top-k, top-p, min-p, per-request seeds.

Filtering is vectorised over the batch; the random draw uses each request's own
torch.Generator, so a seeded request samples the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import torch

from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.transfer import to_device

GREEDY_TEMPERATURE = 1e-5


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_TEMPERATURE or params.top_k == 1


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[list[int], list[float]]:
    """logits: [batch, vocab] float32 -> (token per row, log-probability of that token under
    the unmodified distribution)."""
    tokens = logits.argmax(dim=-1)  # [batch]
    random_rows = [i for i, p in enumerate(params) if not is_greedy(p)]
    if random_rows:
        probs = filtered_probs(logits[random_rows], [params[i] for i in random_rows])
        for row, i in enumerate(random_rows):
            tokens[i] = torch.multinomial(probs[row], 1, generator=generators[i])[0]
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    # NOTE: one read-back for both (float64 holds every token id and float32 value exactly)
    host = torch.stack([tokens.double(), logprobs.double()]).tolist()
    return [int(t) for t in host[0]], host[1]


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[n, vocab] probabilities after temperature, top-k, top-p and min-p."""
    device, vocab = logits.device, logits.shape[-1]
    # the per-request settings reach the device in one non-blocking copy (pinned on CUDA)
    temperature, top_k, top_p, min_p = (t[:, None] for t in to_device([
        torch.tensor([p.temperature for p in params], dtype=torch.float32),
        torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], dtype=torch.int64),
        torch.tensor([p.top_p for p in params], dtype=torch.float32),
        torch.tensor([p.min_p for p in params], dtype=torch.float32)], device))
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [n, vocab]
    rank = torch.arange(vocab, device=device)[None, :]
    # NOTE: a token is dropped when the mass *before* it already reaches top_p; the first
    # token always survives, so no row ends up empty
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (rank >= top_k) | (mass_before >= top_p) | (sorted_probs < min_p * sorted_probs[:, :1])
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)
