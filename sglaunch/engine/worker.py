"""Tensor-parallel worker ranks (every rank but 0) and the worker-only nodes that host them.

A worker loads its shard of the model, then executes whatever rank 0 sends (TPGroup.send_command):
"step" (a StepInput), "draft" (a DraftStepInput, DSpark), "burst" (DSpark), "noop" while idle,
"shutdown".
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import sys
import traceback
from multiprocessing.process import BaseProcess

from sglaunch.config import EngineConfig


def worker_main(config: EngineConfig, rank: int, host: str, port: int) -> None:
    """Entry point of a spawned worker process."""
    # NOTE: Ctrl+C, and a SIGTERM to the whole group (systemd's default, `kill -- -PGID`), reach
    # every rank at once; the server drains and rank 0 orchestrates the shutdown. A no-op handler,
    # not SIG_IGN, which processes started from here would inherit. A rank whose rank 0 is gone
    # ends itself (WorkerHeartbeat); SIGKILL still ends it at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: None)
    from sglaunch.engine.watchdog import fatal

    try:
        _serve(config, rank, host, port)
    except Exception as exc:  # noqa: BLE001 - any failure ends the rank, loudly
        traceback.print_exc()
        fatal(f"TP rank {rank} failed: {exc}")


def _serve(config: EngineConfig, rank: int, host: str, port: int) -> None:
    from sglaunch.engine.distributed import connect_store, destroy_tp_group, init_tp_group, rank_layout
    from sglaunch.engine.model_runner import ModelRunner, rank_device, configure_cpu_rank
    from sglaunch.engine.model_spec import load_model_spec
    from sglaunch.engine.watchdog import WorkerHeartbeat

    layout = rank_layout(config)
    if config.device == "cpu":
        configure_cpu_rank(layout.ranks_per_node)
    store = connect_store(host, port, rank, layout.world_size)
    heartbeat = WorkerHeartbeat(host, port, rank)
    heartbeat.start()
    tp = init_tp_group(config, rank, store)
    device = rank_device(config, layout.local_rank(rank))
    runner = ModelRunner(config, load_model_spec(config.model_path), tp, device, show_progress=False)
    from sglaunch.engine.heap import freeze_startup_heap

    freeze_startup_heap()  # see engine/heap.py: the collector's full passes stall every step
    while True:
        kind, payload = tp.receive_command()  # steps arrive packed (engine/packed_step.py)
        if kind == "step":
            runner.forward(payload)
        elif kind == "draft":
            runner.draft_block(payload)
        elif kind == "burst":
            runner.run_burst(payload)
        elif kind == "shutdown":
            heartbeat.stopping.set()
            tp.barrier()
            destroy_tp_group(tp)
            return


def spawn_workers(config: EngineConfig, ranks: list[int], host: str, port: int) -> dict[int, BaseProcess]:
    context = multiprocessing.get_context("spawn")
    children = {}
    for rank in ranks:
        proc = context.Process(
            target=worker_main, args=(config, rank, host, port), name=f"sglaunch-tp{rank}", daemon=True
        )
        proc.start()
        children[rank] = proc
    return children


def run_worker_node(config: EngineConfig) -> int:
    """Host this node's ranks (node_rank > 0) until rank 0 shuts them down; returns the exit
    status: 0 after a clean shutdown, 1 (naming the rank) when any rank failed."""
    from sglaunch.engine.distributed import init_address, rank_layout
    from sglaunch.engine.watchdog import kill_processes

    if config.node_rank == 0:
        raise ValueError("node 0 runs the driver (start_engine); run_worker_node is for --node-rank > 0")
    layout = rank_layout(config)
    host, port = init_address(config)
    children = spawn_workers(config, layout.node_ranks(config.node_rank), host, port)
    try:
        return _wait_for_children(children)
    except KeyboardInterrupt:
        kill_processes(list(children.values()))
        return 130


def _wait_for_children(children: dict[int, BaseProcess]) -> int:
    from sglaunch.engine.watchdog import kill_processes

    pending = dict(children)
    while pending:
        multiprocessing.connection.wait([p.sentinel for p in pending.values()])
        for rank, proc in list(pending.items()):
            if proc.exitcode is None:
                continue
            del pending[rank]
            if proc.exitcode != 0:
                kill_processes(list(pending.values()))
                sys.stderr.write(f"Error: TP rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}\n")
                return 1
    return 0
