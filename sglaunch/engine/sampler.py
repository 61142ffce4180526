"""Token sampling on rank 0: greedy, temperature, top-k, top-p, min-p, per-request seeds.

Filtering is vectorised over the batch; the random draw uses each request's own
torch.Generator, so a seeded request samples the same tokens whatever else is in the batch.
With a `failures` dict, a row that cannot be sampled (settings the server would refuse, e.g. a
NaN temperature) is recorded there as that request's failure instead of failing the batch.
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
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
    failures: dict[int, Exception] | None = None,
) -> tuple[list[int], list[float]]:
    """logits: [batch, vocab] float32 -> (token per row, log-probability of that token under
    the unmodified distribution).

    Without `failures` any error raises; with it, row i's error is stored as failures[i] (that
    row's token is then meaningless) and every other row is sampled as usual.
    """
    tokens = logits.argmax(dim=-1)  # [batch]
    random_rows = [i for i, p in enumerate(params) if not is_greedy(p)]
    if random_rows:
        probs = _filtered_rows(logits, random_rows, params, failures)
        for row, i in enumerate(random_rows):
            if probs[row] is None:
                continue
            try:
                tokens[i] = torch.multinomial(probs[row], 1, generator=generators[i])[0]
            except RuntimeError as exc:  # e.g. "probability tensor contains either inf, nan"
                if failures is None:
                    raise
                failures[i] = exc
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    # NOTE: one read-back for both (float64 holds every token id and float32 value exactly)
    host = torch.stack([tokens.double(), logprobs.double()]).tolist()
    return [int(t) for t in host[0]], host[1]


def _filtered_rows(logits: torch.Tensor, rows: list[int], params: list[SamplingParams],
                   failures: dict[int, Exception] | None) -> list[torch.Tensor | None]:
    """filtered_probs of `rows`, one tensor per row; when the batch fails and failures are
    collected, each row is retried alone and a row that still fails becomes None."""
    try:
        return list(filtered_probs(logits[rows], [params[i] for i in rows]))
    except (RuntimeError, ValueError, OverflowError) as exc:
        if failures is None:
            raise
        batch_error = exc
    out: list[torch.Tensor | None] = []
    for i in rows:
        try:
            out.append(filtered_probs(logits[[i]], [params[i]])[0])
        except (RuntimeError, ValueError, OverflowError) as exc:
            failures[i] = exc
            out.append(None)
    if all(p is not None for p in out):  # NOTE: the batch failed but no row does alone
        raise batch_error
    return out


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[n, vocab] probabilities after temperature, top-k, top-p and min-p."""
    device, vocab = logits.device, logits.shape[-1]
    # the per-request settings reach the device in one non-blocking copy (pinned on CUDA)
    temperature, top_k, top_p, min_p = (t[:, None] for t in to_device([
        torch.tensor([p.temperature for p in params], dtype=torch.float32),
        # NOTE: top_k above the vocabulary keeps every token (and never overflows int64)
        torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params],
                     dtype=torch.int64),
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
