"""Token sampling on rank 0: greedy, temperature, top-k, top-p, min-p, per-request seeds.

Filtering and the draw are vectorised over the batch: each sampled row takes one uniform from
its request's own seeded CPU generator through a UniformStream (a list item from a block of the
generator's draws, where a per-row `torch.multinomial` on a GPU was several kernel launches), the
uniforms go down in one copy, and every row is drawn at once by inverse CDF over its filtered
probabilities. So a seeded request samples the same tokens whatever else is in the batch, and the
step makes a fixed number of launches however many rows sample. With a `failures` dict, a row
that cannot be sampled (settings the server would refuse, e.g. a NaN temperature) is recorded there
as that request's failure instead of failing the batch.
"""

from __future__ import annotations

import math

import torch

from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.transfer import rows_of, to_device

GREEDY_TEMPERATURE = 1e-5


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_TEMPERATURE or params.top_k == 1


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own generator. NOTE: on the CPU by default whatever the engine's device: the
    sampler and DSpark draw a handful of uniforms per row from it and copy them down at once."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


class UniformStream:
    """A request's uniforms: its seeded CPU generator's float32 draws, in the order the generator
    makes them, taken from a block drawn BLOCK at a time. One `torch.rand(1)` and its read-back cost
    about 2 us a row a step on the host; a list item costs a tenth of a microsecond. The generator
    draws a float32 tensor serially, so a block holds exactly the values that many one-element
    draws would: every consumer (the sampler's one uniform a row, DSpark's blocks of uniforms)
    takes its values through the stream, in the order it did from the generator, and a seeded
    request gets the same tokens as when each drew from the generator itself."""

    BLOCK = 64
    __slots__ = ("generator", "_block", "_buffer", "_next")

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self._block = torch.empty(0)  # NOTE: replaced, never written: take() hands out views of it
        self._buffer: list[float] = []  # the block's values as Python floats
        self._next = 0

    def next(self) -> float:
        """The next uniform, as a Python float (a float32 value)."""
        if self._next >= len(self._buffer):
            self._block = torch.rand(self.BLOCK, generator=self.generator)
            self._buffer = self._block.tolist()
            self._next = 0
        u = self._buffer[self._next]
        self._next += 1
        return u

    def take(self, *shape: int) -> torch.Tensor:
        """The next prod(shape) uniforms as a float32 CPU tensor of that shape (the block's rest,
        then fresh draws; read-only: it may be a view of the block)."""
        count = math.prod(shape)
        start, rest = self._next, len(self._buffer) - self._next
        if count <= rest:
            self._next += count
            values = self._block[start:start + count]
        elif rest:
            self._next = len(self._buffer)
            values = torch.cat([self._block[start:], torch.rand(count - rest, generator=self.generator)])
        else:
            return torch.rand(*shape, generator=self.generator)
        return values if len(shape) == 1 else values.view(*shape)


def make_uniform_stream(seed: int) -> UniformStream:
    """A sampled request's source of uniforms (make_generator's generator, buffered)."""
    return UniformStream(make_generator(seed))


def draw_uniform(source: UniformStream | torch.Generator | None) -> float:
    """One uniform from a request's stream, a bare generator, or (None) torch's global one."""
    if isinstance(source, UniformStream):
        return source.next()
    return float(torch.rand(1, generator=source))


def draw_uniforms(source: UniformStream | torch.Generator | None, *shape: int) -> torch.Tensor:
    """A float32 CPU tensor of uniforms of `shape` from a request's stream or generator (as draw_uniform)."""
    if isinstance(source, UniformStream):
        return source.take(*shape)
    return torch.rand(*shape, generator=source)


BAD_PROBABILITIES = "probability tensor contains either inf, nan or element < 0, or sums to 0"


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[UniformStream | torch.Generator | None],
    failures: dict[int, Exception] | None = None,
) -> tuple[list[int], list[float]]:
    """logits: [batch, vocab] float32 -> (token per row, log-probability of that token under
    the unmodified distribution).

    Without `failures` any error raises; with it, row i's error is stored as failures[i] (that
    row's token is then meaningless) and every other row is sampled as usual.
    """
    return read_choices(sample_device(logits, params, generators, failures), failures)


def sample_device(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[UniformStream | torch.Generator | None],
    failures: dict[int, Exception] | None = None,
) -> torch.Tensor:
    """sample()'s device part, nothing read back: [2 or 3, batch] float64 on the logits' device,
    each row's token and its log-probability, then (when some row samples at T > 0) 1.0 where a
    row could not be sampled (a non-finite or negative probability, or no mass). A row whose
    settings fail on the host is in `failures` at once (raises without it). The uniforms are
    drawn from the generators here, so a seeded request gets the same tokens whenever the
    choices are read (read_choices)."""
    random_rows = [i for i, p in enumerate(params) if not is_greedy(p)]
    if random_rows and fused_sampling(logits.device):
        # NOTE: rows with top-k / top-p / min-p take the fused kernel only with the threshold filter's
        # semantics (SGLAUNCH_FILTER_KERNEL, on by default on CUDA: ties at the boundary all kept)
        filtering = any(filters(params[i], logits.shape[-1]) for i in random_rows)
        if not filtering or filter_kernel(logits.device):
            return _fused(logits, params, generators, random_rows, filtering)
    tokens = logits.argmax(dim=-1)  # [batch]
    bad = None
    if random_rows:
        probs, kept = _filtered_rows(logits, random_rows, params, failures)
        if kept:
            rows = [random_rows[k] for k in kept]
            # NOTE: one uniform per row from its own generator (the global one without), on the host
            uniforms = [draw_uniform(generators[i]) for i in rows]
            index, u = to_device([torch.tensor(rows, dtype=torch.int64),
                                  torch.tensor(uniforms, dtype=torch.float64)], logits.device)
            drawn, invalid = draw(probs, u)
            tokens[index] = drawn
            bad = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
            bad[index] = invalid
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    # NOTE: one read-back for all (float64 holds every token id and float32 value exactly)
    parts = [tokens.double(), logprobs.double()] + ([bad.double()] if bad is not None else [])
    return torch.stack(parts)


# 0: off; 1 or unset: a batch of greedy and temperature-only rows samples in one kernel
FUSED_ENV = "SGLAUNCH_FUSED_SAMPLING"


def fused_sampling(device: torch.device) -> bool:
    """SGLAUNCH_FUSED_SAMPLING: a step whose sampled rows set a temperature alone samples in one
    kernel (sglaunch/kernels/sample_rows.py). Unset: on a CUDA device with Triton; 1: also where
    SGLAUNCH_DSPARK_KERNELS=triton runs the kernels elsewhere (Triton's interpreter on a CPU); 0: off.
    H100, session 39 (benchmarks/gpu39/bench2, plain decoding over HTTP, T=0.7, 64 held-out prompts,
    two rounds): 1.36x at c=1, 1.30x at c=8 against the usual operators."""
    import os

    value = os.environ.get(FUSED_ENV, "").strip()
    if value == "0":
        return False
    from sglaunch.kernels import use_triton

    return use_triton(device) and (value == "1" or device.type == "cuda")


FILTER_KERNEL_ENV = "SGLAUNCH_FILTER_KERNEL"  # 0: top-k / top-p / min-p by a sort; unset on CUDA, or 1: a threshold


def filter_kernel(device: torch.device) -> bool:
    """SGLAUNCH_FILTER_KERNEL: sorted_filter's rule by sglaunch/kernels/filter_rows.py, and with fused
    sampling a plain step's filtering rows drawn in its one kernel (sample_rows.filtered_sample).
    Unset: on a CUDA device with Triton; 1: also where SGLAUNCH_DSPARK_KERNELS=triton runs the kernels
    elsewhere (Triton's interpreter on a CPU); 0: off (the sort). H100, session 40
    (benchmarks/gpu40/bench1, plain decoding over HTTP, T=0.7 and top-p 0.9, 64 held-out prompts, two
    rounds): 1.46x at c=1, 1.20x at c=8, 1.30x at c=16 against the sort."""
    import os

    value = os.environ.get(FILTER_KERNEL_ENV, "").strip()
    if value == "0":
        return False
    from sglaunch.kernels import use_triton

    return use_triton(device) and (value == "1" or device.type == "cuda")


def _fused(logits: torch.Tensor, params: list[SamplingParams], generators: list[UniformStream | torch.Generator | None],
           random_rows: list[int], filtering: bool = False) -> torch.Tensor:
    """sample_device for greedy and temperature-only rows in one kernel (with `filtering`, rows with
    top-k / top-p / min-p too: sample_rows.filtered_sample): each sampled row's uniform from its own
    generator as on the usual path (so a seeded request draws the same uniforms), the per-row
    settings and uniforms down in one copy, [3, batch] float64 back."""
    from sglaunch.kernels.sample_rows import filtered_sample, temperature_sample

    n, vocab = len(params), logits.shape[-1]
    temperatures, uniforms = [0.0] * n, [0.0] * n
    for i in random_rows:
        temperatures[i] = params[i].temperature
        uniforms[i] = draw_uniform(generators[i])
    host = [torch.tensor(temperatures, dtype=torch.float32), torch.tensor(uniforms, dtype=torch.float64)]
    if filtering:
        settings = [filter_settings(p, vocab) for p in params]
        host += [torch.tensor([k for k, _, _ in settings], dtype=torch.int64),
                 torch.tensor([p for _, p, _ in settings], dtype=torch.float32),
                 torch.tensor([m for _, _, m in settings], dtype=torch.float32)]
    device = to_device(host, logits.device)
    if filtering:
        return filtered_sample(logits, *device)
    return temperature_sample(logits, *device)


def read_choices(choices, failures: dict[int, Exception] | None = None) -> tuple[list[int], list[float]]:
    """sample_device's choices (a device tensor, or its rows as host lists) -> (tokens, log-probabilities);
    a row flagged as not sampleable raises, or (with `failures`) is stored there."""
    host = choices.tolist() if isinstance(choices, torch.Tensor) else choices
    if len(host) > 2:
        for i, flag in enumerate(host[2]):
            if flag:
                if failures is None:
                    raise RuntimeError(BAD_PROBABILITIES)
                failures[i] = RuntimeError(BAD_PROBABILITIES)
    return [int(t) for t in host[0]], host[1]


def draw(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [n, vocab] (rows need not sum to 1), u [n] uniforms in [0, 1) -> (token per row,
    whether the row could not be sampled: a non-finite or negative probability, or no mass).
    Inverse CDF in float64: the token whose cumulative mass first exceeds u times the row's mass.
    A token of probability 0 is never drawn: its cumulative mass equals the one before it, and for
    u < 1 the product u * mass stays below the mass (a float64 product of u <= 1 - 2**-53 never
    rounds up to it). The clamp only matters for the invalid rows."""
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1]
    invalid = ~(torch.isfinite(probs).all(dim=-1) & (probs >= 0).all(dim=-1) & (total > 0))
    index = torch.searchsorted(cdf, (u * total)[:, None], right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
    return index, invalid


def _filtered_rows(logits: torch.Tensor, rows: list[int], params: list[SamplingParams],
                   failures: dict[int, Exception] | None) -> tuple[torch.Tensor, list[int]]:
    """filtered_probs of `rows` -> ([k, vocab], which of `rows` they are); when the batch fails
    and failures are collected, each row is retried alone and a row that still fails is left out
    (recorded in failures)."""
    try:
        return filtered_probs(rows_of(logits, rows), [params[i] for i in rows]), list(range(len(rows)))
    except (RuntimeError, ValueError, OverflowError) as exc:
        if failures is None:
            raise
        batch_error = exc
    out, kept = [], []
    for k, i in enumerate(rows):
        try:
            out.append(filtered_probs(logits[[i]], [params[i]])[0])
            kept.append(k)
        except (RuntimeError, ValueError, OverflowError) as exc:
            failures[i] = exc
    if len(kept) == len(rows):  # NOTE: the batch failed but no row does alone
        raise batch_error
    return (torch.stack(out) if out else logits[:0]), kept


def filters(params: SamplingParams, vocab: int) -> bool:
    """Whether top-k, top-p or min-p removes any token of a row (else it is softmax(logits / T))."""
    return 0 < params.top_k < vocab or params.top_p < 1.0 or params.min_p > 0.0


def filter_settings(params: SamplingParams, vocab: int) -> tuple[int, float, float]:
    """(top_k, top_p, min_p) as sorted_filter reads them: top_k 0 or above the vocabulary keeps
    every token (and never overflows int64)."""
    return (min(params.top_k, vocab) if params.top_k > 0 else vocab), float(params.top_p), float(params.min_p)


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[n, vocab] probabilities after temperature, top-k, top-p and min-p.

    NOTE: only rows that filter are sorted: the sorted filter of a 49,152-token row took 4.8 ms
    on the dev CPU (one thread) against 0.09 ms without it (`python benchmarks/sampler_cost.py`,
    benchmarks/cpu32/sampler_cost.json), and most requests set a temperature alone. Rows that
    filter nothing skip it and keep every token."""
    vocab = logits.shape[-1]
    which = [i for i, p in enumerate(params) if filters(p, vocab)]
    if len(which) == len(params):
        return _sorted_filter(logits, params)
    temperature, *index = to_device([torch.tensor([p.temperature for p in params], dtype=torch.float32)]
                                    + ([torch.tensor(which, dtype=torch.int64)] if which else []), logits.device)
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    if which:  # NOTE: a mixed batch: the filtering rows over their own (their index came down in the same copy)
        probs[index[0]] = _sorted_filter(logits[index[0]], [params[i] for i in which])
    return probs


def _sorted_filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """filtered_probs over rows sorted by probability (top-k, top-p and min-p all read the order)."""
    device, vocab = logits.device, logits.shape[-1]
    # the per-request settings reach the device in one non-blocking copy (pinned on CUDA)
    settings = [filter_settings(p, vocab) for p in params]
    temperature, top_k, top_p, min_p = (t[:, None] for t in to_device([
        torch.tensor([p.temperature for p in params], dtype=torch.float32),
        torch.tensor([k for k, _, _ in settings], dtype=torch.int64),
        torch.tensor([p for _, p, _ in settings], dtype=torch.float32),
        torch.tensor([m for _, _, m in settings], dtype=torch.float32)], device))
    return sorted_filter(torch.softmax(logits / temperature, dim=-1), top_k, top_p, min_p)


def sorted_filter(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """probs [n, vocab] (each row's softmax at its temperature) after top-k, top-p and min-p, renormalised;
    top_k / top_p / min_p: [n, 1] device tensors (top_k = vocab, top_p = 1, min_p = 0 keep a row's tokens).
    No host sync, so a CUDA graph can hold it (the filtered sampled bursts, speculative/burst.py).
    SGLAUNCH_FILTER_KERNEL (on by default on CUDA): the same rule without the sort, one Triton program a row
    (sglaunch/kernels/filter_rows.py; ties at the boundary all kept)."""
    if filter_kernel(probs.device):
        from sglaunch.kernels.filter_rows import threshold_filter

        return threshold_filter(probs, top_k, top_p, min_p)
    vocab = probs.shape[-1]
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [n, vocab]
    rank = torch.arange(vocab, device=probs.device)[None, :]
    # NOTE: a token is dropped when the mass *before* it already reaches top_p; the first
    # token always survives, so no row ends up empty
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (rank >= top_k) | (mass_before >= top_p) | (sorted_probs < min_p * sorted_probs[:, :1])
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)
