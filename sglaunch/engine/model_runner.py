"""The model on one tensor-parallel rank: weights, KV pool, attention backend, forward pass
(replaying a CUDA graph from cuda_graph.py when one fits the step).

Every rank runs the same ModelRunner; rank 0 additionally samples from the returned logits.
This is the only engine module that owns device tensors.
"""

from __future__ import annotations

import logging
import os

import torch

from sglaunch.config import EngineConfig
from sglaunch.engine.attention import attention_backend_class
from sglaunch.engine.cuda_graph import (
    CudaGraphRunner,
    GraphPlan,
    context_skip_from_env,
    extra_tiers_from_env,
    graphs_disabled_reason,
    mixed_from_env,
    mixed_max_query_from_env,
)
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.kv_pool import KVPool, kv_bytes_per_token, plan_kv_tokens
from sglaunch.engine.loader import load_checkpoint
from sglaunch.engine.model_spec import ModelSpec, find_weight_files, resolve_context_length
from sglaunch.engine.models import CausalLM
from sglaunch.engine.step import SECOND_CHAIN_BASE, DraftStepInput, StepInput
from sglaunch.engine.transfer import rows_of, to_device

logger = logging.getLogger(__name__)

VERIFY_WINDOW_ENV = "SGLAUNCH_VERIFY_GRAPH_WINDOW"  # set by `sglaunch profile-sps` (no drafter there)
OVERLAP_ENV = "SGLAUNCH_OVERLAP"  # 1: the engine launches a step before reading the last one back
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# the DSpark drafter's measured working memory (DraftRunner.working_bytes) times this is kept out of the
# default KV budget: its graphs share one pool over ~200 captures, which fragments beyond one forward's peak
DRAFT_WORKING_MARGIN = 1.5


def rank_device(config: EngineConfig, local_rank: int) -> torch.device:
    if config.device == "cuda":
        return torch.device("cuda", config.base_gpu_id + local_rank)
    return torch.device("cpu")


def overlap_from_env(device_type: str = "cpu") -> bool:
    """SGLAUNCH_OVERLAP (0, 1 or auto, the default: on for CUDA devices, where the host work it
    hides is measured, off on CPUs, whose operators run synchronously so there is nothing to hide),
    read once per process at start-up: every rank sees the same environment, so every rank agrees."""
    value = os.environ.get(OVERLAP_ENV, "auto").strip() or "auto"
    if value not in ("0", "1", "auto"):
        raise ValueError(f"{OVERLAP_ENV}={value!r}: expected 0 or 1, or auto (the default)")
    return value == "1" or (value == "auto" and device_type == "cuda")


def configure_cpu_rank(ranks_on_this_node: int) -> None:
    """For a CPU rank, in the thread that will run its steps: split the CPUs this process may run
    on (its affinity: a `taskset`, a container's cpuset; not every CPU of the host) between the
    ranks sharing them (oversubscription is slow), and flush denormals to zero. Peaked
    distributions put denormal floats in softmax tails, which x86 cores compute on a slow path:
    with profile_step.py's synthetic prompts, log_softmax, the float32 copy and the row gather of
    SmolLM2's 8 verify rows took 2.4, 1.9 and 1.1 ms a step with them, 0.4, 0.3 and 0.2 without.
    The flag is per thread; intra-op worker threads started later from this one inherit it."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cpus // ranks_on_this_node))
    torch.set_flush_denormal(True)


class GreedyReadback:
    """One forward's (token, log-probability) choices on their way to the host: a pinned copy and
    the event after it on CUDA, the lists themselves on a CPU. Greedy choices, or a plain step's
    sampled ones (ModelRunner.keep_choices), which add a third row: 1.0 where a row could not be
    sampled."""

    def __init__(self, host, rows: list[int], event):
        self.host, self.rows, self.event = host, rows, event  # host: [2 or 3, columns]; logit row -> column

    def get(self, logit_rows: list[int]) -> tuple[list[int], list[float]]:
        """Those rows' choices; waits for that forward only (not for any step queued after it)."""
        if self.event is not None:
            self.event.synchronize()
            self.host, self.event = self.host.tolist(), None
        columns = [self.rows[r] for r in logit_rows]
        return [int(self.host[0][c]) for c in columns], [self.host[1][c] for c in columns]

    def failed(self, logit_rows: list[int]) -> list[bool]:
        """After get(): whether each of those rows could not be sampled (never, for greedy choices)."""
        if len(self.host) < 3:
            return [False] * len(logit_rows)
        return [bool(self.host[2][self.rows[r]]) for r in logit_rows]


class ModelRunner:
    def __init__(self, config: EngineConfig, spec: ModelSpec, tp: TPGroup, device: torch.device, show_progress: bool):
        self.config, self.spec, self.tp, self.device = config, spec, tp, device
        if device.type == "cuda":
            torch.cuda.set_device(device)
            # NOTE: cuDNN's SDPA builds an execution plan for every new shape, ~25 ms of host time
            # on an H200; the drafter's and the torch backend's attention change shape every step
            torch.backends.cuda.enable_cudnn_sdp(False)
        # NOTE: set before the graphs are captured (their input copies). A DSpark engine pipelines
        # its stepped-aside steps and drains before a drafting step (engine.py); on the H200 its
        # graph tests passed with it and the sweep went 0.86/0.63/0.56x -> 0.96/1.01/1.14x of plain
        # at c=1/8/64 (session 8, run 2), so it follows auto like plain decoding
        self.overlap = overlap_from_env(device.type)
        self.context_length = resolve_context_length(spec, config.context_length)
        max_positions = max(self.context_length, spec.max_position_embeddings)
        self.model_dtype = DTYPES[config.dtype]
        self.model = CausalLM(spec, max_positions, tp, self.model_dtype, device).eval()
        load_checkpoint(self.model, find_weight_files(config.model_path), show_progress)
        self.draft = self._load_drafter(max_positions) if config.speculative is not None else None
        backend_cls = attention_backend_class(config.attention_backend)
        no_graphs = graphs_disabled_reason(device.type, config.disable_cuda_graph, backend_cls)
        if no_graphs is not None and device.type == "cuda":
            logger.info("CUDA graphs off: %s", no_graphs)
        reserve = 0
        if self.draft is not None and device.type == "cuda" and config.mem_fraction_static is None:
            from sglaunch.engine.cuda_graph import capture_batch_sizes

            # NOTE: outside the default KV budget, as the drafter graphs' buffers were said to be; without
            # it the H100's 12% beside weights + KV did not hold them (session 24)
            reserve = int(DRAFT_WORKING_MARGIN * self.draft.working_bytes(
                capture_batch_sizes(config.graph_batch_cap), self.context_length, DTYPES[config.kv_cache_dtype]))
        self.kv_pool = self._allocate_kv_pool(padding_page=no_graphs is None, reserve_bytes=reserve)
        if self.draft is not None:
            self.draft.allocate_pool(self.kv_pool.num_slots, DTYPES[config.kv_cache_dtype])
        heads, kv_heads = spec.num_heads // tp.size, spec.num_kv_heads // tp.size
        self.attn = backend_cls(self.kv_pool, heads, kv_heads, spec.head_dim, device)
        self.attn.set_query_dtype(self.model_dtype)
        self.step_greedy, self._greedy_read = None, None  # set by forward() (see greedy_host)
        self._extra_read = None  # (tensor, its host copy): the extra read with the greedy choices
        self._readback_buffers: list[torch.Tensor | None] = [None, None]  # pinned (greedy_readback)
        self._readback_turn = 0
        self.graphs = self._capture_graphs(show_progress) if no_graphs is None else None
        if self.draft is not None:
            from sglaunch.speculative.draft_graphs import start_up_graphs

            start_up_graphs(self)  # every drafter graph, now (none is captured while serving)
        self.burst = self._start_bursts()

    def _start_bursts(self):
        """DSpark bursts (speculative/burst.py) when SGLAUNCH_DSPARK_BURST allows them: their
        graphs, with CUDA graphs, are captured now (none while serving)."""
        if self.draft is None:
            return None
        from sglaunch.speculative.burst import BurstRunner, filtered_from_env, iterations_from_env, sampled_from_env

        iterations = iterations_from_env(self.device.type, self.graphs is not None)
        if not iterations:
            return None
        from sglaunch.speculative.decoder import second_chain_length

        sizes = list(self.graphs.plan.decode_sizes) if self.graphs is not None else [1]
        burst = BurstRunner(self, iterations, sizes, self.context_length, graphs=self.graphs is not None,
                            second_chain=second_chain_length(self.draft.block_size, self.kv_pool.page_size,
                                                              self.device.type) > 0,
                            sampled=sampled_from_env(), filtered=filtered_from_env())
        burst.capture_all()
        return burst

    def run_burst(self, burst):
        """Every rank runs a DSpark burst; rank 0 gets its results (BurstResult)."""
        return self.burst.run(burst, read=self.tp.rank == 0)

    def launch_burst(self, burst, queue: int | None = None):
        """Rank 0: queue a DSpark burst -> PendingBurst (BurstRunner.read waits for it); queue=k:
        its first k iterations only (one rank: BurstRunner.extend queues the rest)."""
        return self.burst.launch(burst, queue=queue)

    def _load_drafter(self, max_positions: int):
        from sglaunch.speculative.draft_runner import DraftRunner

        return DraftRunner(self.config, self.model, self.tp, DTYPES[self.config.dtype], self.device, max_positions)

    def _capture_graphs(self, show_progress: bool) -> CudaGraphRunner:
        # NOTE: a bucket above max_running_requests could never be replayed
        max_bs = self.config.graph_batch_cap
        # NOTE: without a drafter, `sglaunch profile-sps` names the verify window it will time,
        # so its verify-shaped steps replay the same total-token tier graphs as DSpark serving
        window = self.draft.block_size + 1 if self.draft is not None else int(os.environ.get(VERIFY_WINDOW_ENV, "0"))
        from sglaunch.speculative.draft_graphs import enabled_from_env

        # NOTE: with the context write outside the graphs, a step that skips it just does not call it
        contextless = self.draft is not None and enabled_from_env() and context_skip_from_env()
        plan = GraphPlan.build(max_bs, window, self.context_length, self.config.page_size, extra_tiers_from_env(),
                               mixed=mixed_from_env(), contextless=contextless,
                               mixed_max_query=mixed_max_query_from_env())
        return CudaGraphRunner(self, plan, show_progress)

    @property
    def graph_max_batch(self) -> int | None:
        """Query segments (requests, second-chain windows) the largest captured graph takes; None without graphs."""
        return self.graphs.plan.max_bs if self.graphs is not None else None

    @property
    def verify_token_tiers(self) -> tuple[int, ...]:
        """Total-token tiers of the captured verify graphs (empty when none are captured)."""
        return self.graphs.plan.verify_tiers if self.graphs is not None else ()

    def _allocate_kv_pool(self, padding_page: bool, reserve_bytes: int = 0) -> KVPool:
        kv_heads = self.spec.num_kv_heads // self.tp.size
        kv_dtype = DTYPES[self.config.kv_cache_dtype]
        per_token = kv_bytes_per_token(self.spec.num_layers, kv_heads, self.spec.head_dim, kv_dtype)
        if self.draft is not None:  # the draft context K/V share the target's slots
            per_token += self.draft.bytes_per_token(kv_dtype)
        # NOTE: every rank must use the same page ids, so all agree on the smallest pool
        tokens = self.tp.min_int(plan_kv_tokens(self.config, per_token, self.device, reserve_bytes))
        page_size = self.config.page_size
        num_pages = max(1, tokens // page_size)
        logger.info("KV pool: %d pages x %d tokens (%.1f MiB per rank%s)", num_pages, page_size,
                    num_pages * page_size * per_token / 2**20,
                    f"; {reserve_bytes / 2**20:.1f} MiB kept out of the default budget for the drafter's "
                    f"working memory" if reserve_bytes else "")
        return KVPool(self.spec.num_layers, num_pages, page_size, kv_heads, self.spec.head_dim, kv_dtype, self.device,
                      padding_page=padding_page)

    @property
    def num_pages(self) -> int:
        return self.kv_pool.num_pages

    @torch.inference_mode()
    def forward(self, step: StepInput) -> torch.Tensor | None:
        """Run one ragged step (a CUDA graph when one fits); returns logits [len(step.sample_indices),
        vocab] in float32 (identical on every rank), or None when `step.logits` is False and a
        verify graph has already chosen every row greedily (greedy_host has them)."""
        key = self.graphs.pick(step) if self.graphs is not None else None
        previous = self.step_greedy  # overlap: the placeholders of `step` are its choices

        def fill(input_ids: torch.Tensor) -> None:
            self._fill_placeholders(input_ids, step, previous)
            self._fill_drafts(input_ids, step)

        self.step_greedy, self._greedy_read, self._extra_read = None, None, None
        if key is not None:
            hidden, features, positions, out_slots = self.graphs.replay(key, step, fill)
            if features is not None:  # None after a graph that wrote the draft context itself
                self.draft.write_context(features, positions, out_slots)
            t = step.num_tokens
            if not step.sample_indices:
                return torch.empty(0, self.spec.vocab_size, device=self.device)
            self.step_greedy = (self.graphs.greedy[:, :t], step.sample_indices)
            if key.decode:  # the graph computed every row's logits too (all sampling: a view, no gather)
                return rows_of(self.graphs.logits, step.sample_indices)
            if not step.logits:
                return None
        else:
            (input_ids,) = to_device([torch.tensor(step.input_ids, dtype=torch.int64)], self.device)  # NOTE: pinned, no wait
            fill(input_ids)
            meta = self.attn.prepare(step)
            positions, out_slots = meta.positions, meta.out_slots
            if step.draft_context:
                hidden, features = self.model_forward(input_ids, positions)
            else:  # a DSpark step that writes no draft context (its requests never draft again)
                hidden, features = self.model(input_ids, positions, self.attn), None
            if features is not None:
                self.draft.write_context(features, positions, out_slots)
            if not step.sample_indices:  # only partial prefill chunks this step (same on every rank)
                return torch.empty(0, self.spec.vocab_size, device=self.device)
        # NOTE: a view where the rows are a run (a verify step's every row), else one pinned copy of the index:
        # torch.tensor(rows, device=cuda) waited for the verify graph before the accept was launched (session 36)
        logits = self.model.compute_logits(rows_of(hidden, step.sample_indices)).float()  # [num_samples, vocab]
        if key is None and not step.logits:  # an all-greedy eager step: its choices, as a graph gives them
            from sglaunch.kernels.vocab_reduce import greedy_logprob_reference

            tokens, lp = greedy_logprob_reference(logits)
            self.step_greedy = (torch.stack([tokens.double(), lp.double()]), list(range(len(step.sample_indices))))
        return logits

    def _fill_placeholders(self, input_ids: torch.Tensor, step: StepInput, previous) -> None:
        """Overlap: write the previous forward's greedy choices over the placeholder rows of
        `input_ids` [num_tokens], on the device; the host never waited for them. Every rank
        fills them from its own (identical) greedy buffer, before this step's forward overwrites it."""
        if not step.future_rows:
            return
        if previous is None:
            raise RuntimeError("a step with placeholder tokens needs the greedy choices of the step before it")
        greedy, rows = previous  # [2, columns] float64; logit row -> column
        columns = [rows[r] for r in step.future_sources]
        k = len(columns)
        if columns == step.future_rows and columns[-1] == k - 1 and columns[0] == 0:  # a decode batch: one copy
            input_ids[:k].copy_(greedy[0, :k])
            return
        (index,) = to_device([torch.tensor([step.future_rows, columns], dtype=torch.int64)], self.device)
        input_ids[index[0]] = greedy[0, index[1]].to(input_ids.dtype)

    def _fill_drafts(self, input_ids: torch.Tensor, step: StepInput) -> None:
        """DSpark: write the drafter's last block over the draft-marker rows of `input_ids`, on the
        device (the host never read the drafts before this verify step). Every rank fills them
        from its own drafter output (the same on every rank, as its greedy choices are)."""
        if not step.draft_rows:
            return
        rows, sources = step.draft_rows, step.draft_sources
        if max(sources) >= SECOND_CHAIN_BASE:  # a second chain's markers (filled from its own buffer)
            first = [(r, s) for r, s in zip(rows, sources) if s < SECOND_CHAIN_BASE]
            second = [(r, s - SECOND_CHAIN_BASE) for r, s in zip(rows, sources) if s >= SECOND_CHAIN_BASE]
            (index,) = to_device([torch.tensor(second, dtype=torch.int64).T], self.device)
            input_ids[index[0]] = self.draft.second_tokens()[index[1]]
            if not first:
                return
            rows, sources = [r for r, _ in first], [s for _, s in first]
        tokens = self.draft.block_tokens()
        G = self.draft.block_size
        R = len(step.query_lens)
        # NOTE: the common layout, every request [anchor, G drafts] in draft order: one strided copy
        if (len(rows) == R * G and step.num_tokens == R * (G + 1) and rows[0] == 1 and sources[0] == 0
                and rows[-1] == R * (G + 1) - 1 and sources[-1] == R * G - 1
                and all(q == G + 1 for q in step.query_lens)):
            input_ids[: R * (G + 1)].view(R, G + 1)[:, 1:].copy_(tokens[: R * G].view(R, G))
            return
        (index,) = to_device([torch.tensor([rows, sources], dtype=torch.int64)], self.device)
        input_ids[index[0]] = tokens[index[1]]

    def keep_choices(self, choices: torch.Tensor) -> None:
        """Overlap, a plain step that samples (TP 1): its sampled choices (sampler.sample_device,
        [2 or 3, logit rows] on the device) stand in for the forward's greedy ones: the next
        step's placeholders take them, and greedy_readback copies them."""
        self.step_greedy, self._greedy_read, self._extra_read = (choices, list(range(choices.shape[1]))), None, None

    def greedy_readback(self) -> GreedyReadback:
        """Start copying the last forward's greedy choices to the host without waiting for them
        (overlap: the host reads them while the next step runs). Call right after forward()."""
        greedy, rows = self.step_greedy
        if self.device.type != "cuda":
            return GreedyReadback(greedy.tolist(), rows, None)
        k, n = greedy.shape
        self._readback_turn ^= 1  # NOTE: two buffers: one being read while the next one fills
        buffer = self._readback_buffers[self._readback_turn]
        if buffer is None or buffer.numel() < k * n:
            buffer = torch.empty(3 * max(n, 256), dtype=torch.float64, pin_memory=True)
            self._readback_buffers[self._readback_turn] = buffer
        # NOTE: a contiguous pinned destination: into a strided one torch would stage the copy
        # in pageable memory, which waits for the stream (this step) to finish
        host = buffer[: k * n].view(k, n)
        host.copy_(greedy, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return GreedyReadback(host, rows, event)

    def greedy_host(self, logit_rows: list[int], extra: torch.Tensor | None = None):
        """The greedy (token, log-probability) of these rows of the last forward's logits, read
        back in one copy per step, when that forward chose them (any graph replay, or an eager
        step with `logits=False`); else None (sample from the logits). extra: a device tensor read
        back in the same copy where it is the step's first read (DSpark's second chains), returned
        third as a flat list; a later call with the same tensor gets that copy (the engine's plain
        rows read first, the accept second: engine._sample passes the step's chains along)."""
        if self.step_greedy is None:
            return None
        greedy, rows = self.step_greedy
        extra_host = None
        if self._greedy_read is None and extra is not None:
            width = greedy.shape[1]
            flat = torch.cat([greedy.reshape(-1).double(), extra.reshape(-1).double()]).tolist()  # NOTE: one copy
            self._greedy_read, extra_host = [flat[:width], flat[width: 2 * width]], flat[2 * width:]
            self._extra_read = (extra, extra_host)
        elif self._greedy_read is None:
            self._greedy_read = greedy.tolist()  # NOTE: the step's one device-to-host copy
        elif extra is not None and self._extra_read is not None and self._extra_read[0] is extra:
            extra_host = self._extra_read[1]  # read with the greedy choices
        elif extra is not None:  # NOTE: a second copy (after the step's, the forward done: no wait)
            extra_host = extra.reshape(-1).tolist()
        host = self._greedy_read
        picked = [rows[r] for r in logit_rows]
        chosen = [int(host[0][i]) for i in picked], [host[1][i] for i in picked]
        return chosen if extra is None else (*chosen, extra_host)

    def model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """The decoder on prepared attention state -> (hidden [num_tokens, hidden], DSpark's target
        features [num_tokens, n * hidden] or None). What a CUDA graph captures."""
        if self.draft is None:
            return self.model(input_ids, positions, self.attn), None
        return self.model.forward_with_features(input_ids, positions, self.attn, self.draft.layer_ids)

    def draft_block(self, step: DraftStepInput):
        """DSpark's parallel draft stage (every rank: it has collectives) -> BlockOutput."""
        return self.draft.forward(step, self.kv_pool.page_size)
