"""Entry points: start_engine (the server's AsyncEngine, over an engine process),
run_worker_node (nodes > 0), create_engine and generate_batch (in-process, for the engine
process itself, tests, benchmarks and training).

Rank 0 (node 0) hosts the rendezvous store, spawns its node's other ranks, loads its shard
and drives every rank step by step; a watchdog ends everything if any rank dies.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Callable, NoReturn, Sequence

from sglaunch.config import EngineConfig
from sglaunch.engine.interface import GenerateRequest, SamplingParams, TokenOutput
from sglaunch.engine.worker import run_worker_node, spawn_workers

__all__ = ["start_engine", "run_worker_node", "generate_batch", "create_engine", "run_requests", "Cluster"]


class Cluster:
    """Rank 0's handle on the tensor-parallel group: store, local worker processes, watchdog."""

    def __init__(self, config: EngineConfig):
        from sglaunch.engine.distributed import TPGroup, rank_layout

        self.config = config
        self.layout = rank_layout(config)
        self.children: dict = {}
        self.watchdog = None
        self.tp = TPGroup(0, 1)

    def start(self):
        """Spawn this node's workers, start the watchdog, join the group; returns the TPGroup."""
        from sglaunch.engine.distributed import connect_store, init_address, init_tp_group
        from sglaunch.engine.watchdog import DriverWatchdog

        world = self.layout.world_size
        if world == 1:
            return self.tp
        host, port = init_address(self.config)
        self.store = connect_store(host, port, 0, world)
        self.children = spawn_workers(self.config, self.layout.node_ranks(0)[1:], host, port)
        self.watchdog = DriverWatchdog(host, port, list(range(1, world)), self.children)
        self.watchdog.start()
        self.tp = init_tp_group(self.config, 0, self.store)
        return self.tp

    def fail(self, error: BaseException) -> NoReturn:
        """A step failed: exit non-zero, naming the rank when one is to blame."""
        from sglaunch.engine.watchdog import fatal

        traceback.print_exception(error)
        if self.watchdog is not None:
            self.watchdog.diagnose_then_die(error)
        fatal(f"engine step failed: {error!r}")

    def stop(self, engine=None) -> None:
        """Clean shutdown: tell workers to exit, wait for them, leave the process group."""
        from sglaunch.engine.distributed import destroy_tp_group
        from sglaunch.engine.watchdog import kill_processes

        if self.watchdog is not None:
            self.watchdog.stopping.set()
        if engine is not None and self.tp.size > 1:
            try:
                engine.stop_workers()
            except Exception as exc:  # noqa: BLE001 - a worker already gone; kill the rest below
                print(f"warning: workers did not acknowledge shutdown: {exc!r}", file=sys.stderr)
        for proc in self.children.values():
            proc.join(10)
        kill_processes(list(self.children.values()))
        destroy_tp_group(self.tp)
        from sglaunch.engine.heap import unfreeze_heap

        unfreeze_heap()  # NOTE: a process that boots another engine after this one (tests, sweeps) frees this one

    def abort_startup(self) -> None:
        from sglaunch.engine.watchdog import kill_processes

        if self.watchdog is not None:
            self.watchdog.stopping.set()
        kill_processes(list(self.children.values()))


def validate_before_spawning(config: EngineConfig):
    """Cheap checks on rank 0 so a bad checkpoint fails before any process starts."""
    from sglaunch.engine.attention import attention_backend_class
    from sglaunch.engine.distributed import rank_layout
    from sglaunch.engine.model_spec import check_tp_divides, find_weight_files, load_model_spec

    if config.node_rank != 0:
        raise ValueError(f"--node-rank {config.node_rank} hosts workers only: call run_worker_node")
    spec = load_model_spec(config.model_path)
    check_tp_divides(spec, config.tp_size)
    rank_layout(config)
    find_weight_files(config.model_path)
    attention_backend_class(config.attention_backend)
    return spec


def create_engine(config: EngineConfig):
    """Synchronously boot rank 0: returns (LLMEngine, Cluster); call cluster.stop(engine)."""
    from sglaunch.engine.engine import LLMEngine
    from sglaunch.engine.model_runner import ModelRunner, rank_device, configure_cpu_rank

    spec = validate_before_spawning(config)
    cluster = Cluster(config)
    if config.device == "cpu":
        configure_cpu_rank(cluster.layout.ranks_per_node)
    try:
        tp = cluster.start()
        runner = ModelRunner(config, spec, tp, rank_device(config, 0), show_progress=True)
        engine = LLMEngine(config, runner, tp, on_tp_failure=cluster.fail)
        engine.profile_sps_if_missing()
        engine.profile_bursts()
        from sglaunch.engine.heap import freeze_startup_heap

        freeze_startup_heap()  # NOTE: after the profiles: nothing of start-up is left to collect
        return engine, cluster
    except BaseException:
        cluster.abort_startup()
        raise


@dataclass
class Completion:
    token_ids: list[int]
    final: TokenOutput  # the last output (finish_reason, token counts, cached_tokens)


def run_requests(engine, requests: Sequence[GenerateRequest],
                 on_finish: Callable[[TokenOutput], None] | None = None) -> dict[str, Completion]:
    """Run requests to completion on a booted engine (all queued at once); `on_finish` sees each
    request's last output as it finishes (e.g. to advance a progress bar)."""
    tokens: dict[str, list[int]] = {r.rid: [] for r in requests}
    finals: dict[str, TokenOutput] = {}

    def collect(outputs: list[TokenOutput]) -> None:
        for out in outputs:
            tokens[out.rid].extend(out.new_token_ids)
            if out.finished:
                finals[out.rid] = out
                if on_finish is not None:
                    on_finish(out)

    for request in requests:
        collect(engine.add_request(request))
    while engine.has_work:
        collect(engine.step())
    return {rid: Completion(tokens[rid], finals[rid]) for rid in tokens}


def generate_batch(
    config: EngineConfig, prompts: Sequence[Sequence[int]], sampling: SamplingParams = SamplingParams()
) -> list[list[int]]:
    """Boot the engine, generate for every prompt (continuous batching), shut down."""
    engine, cluster = create_engine(config)
    try:
        requests = [GenerateRequest(f"batch-{i}", tuple(p), sampling) for i, p in enumerate(prompts)]
        done = run_requests(engine, requests)
        return [done[r.rid].token_ids for r in requests]
    finally:
        cluster.stop(engine)


async def start_engine(config: EngineConfig):
    """Boot the engine (workers, weights, KV pool) in an engine process of its own; returns an
    AsyncEngine (torch is never imported here). Raises ValueError for a checkpoint or
    configuration it cannot run."""
    from sglaunch.engine.engine_client import EngineClient

    engine = EngineClient(config)
    await engine.start()
    return engine
