"""Liveness of tensor-parallel ranks: if any rank dies, every process exits non-zero, fast.

- Each worker bumps a heartbeat counter in rank 0's TCPStore every HEARTBEAT_INTERVAL_S; when
  the store is unreachable, rank 0 is gone and the worker exits.
- Rank 0 watches its local child processes (exit codes, immediate) and every worker's
  heartbeat (covers ranks on other nodes, and NCCL collectives that would otherwise hang).
Both sides end the process with os._exit: a rank blocked in a collective cannot be unwound.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from typing import Callable, NoReturn

import torch.distributed as dist

HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_STALE_S = 5.0
STORE_TIMEOUT_S = 5.0


_BEFORE_EXIT: list[Callable[[str], None]] = []
_EXITING = threading.Lock()


def before_fatal_exit(hook: Callable[[str], None]) -> None:
    """Run `hook(message)` before `fatal` ends the process (hooks run in the order added, on the
    dying thread, and must return within a few seconds), e.g. to end open streams properly."""
    _BEFORE_EXIT.append(hook)


def fatal(message: str) -> NoReturn:
    """Print `Error: message` on stderr, run the before-exit hooks, end the process with status 1."""
    sys.stderr.write(f"Error: {message}\n")
    sys.stderr.flush()
    if _EXITING.acquire(blocking=False):  # NOTE: a second dying thread waits for the first's exit
        for hook in list(_BEFORE_EXIT):
            try:
                hook(message)
            except BaseException as exc:  # noqa: BLE001 - exiting anyway
                sys.stderr.write(f"warning: a before-exit hook failed: {exc!r}\n")
    else:
        _EXITING.acquire()
    os._exit(1)


def heartbeat_key(rank: int) -> str:
    return f"heartbeat/{rank}"


def _store_client(host: str, port: int) -> dist.TCPStore:
    """A private connection (the store client is not shared across threads)."""
    from datetime import timedelta

    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))


class WorkerHeartbeat(threading.Thread):
    """Worker side: beat, and exit when rank 0 (the store's host) or the process that
    spawned this worker disappears."""

    def __init__(self, host: str, port: int, rank: int):
        super().__init__(name=f"heartbeat-rank{rank}", daemon=True)
        self.host, self.port, self.rank = host, port, rank
        self.parent_pid = os.getppid()
        self.stopping = threading.Event()

    def run(self) -> None:
        store = _store_client(self.host, self.port)
        while not self.stopping.wait(HEARTBEAT_INTERVAL_S):
            if os.getppid() != self.parent_pid:  # NOTE: orphaned: nobody would reap or stop us
                fatal(f"TP rank {self.rank}: the process that started it exited; exiting")
            try:
                store.add(heartbeat_key(self.rank), 1)
            except Exception as exc:  # noqa: BLE001 - any failure means rank 0 is unreachable
                if self.stopping.is_set():
                    return
                fatal(f"TP rank {self.rank}: lost contact with rank 0 (the driver) ({exc}); exiting")


class DriverWatchdog(threading.Thread):
    """Rank 0 side: exit naming the rank as soon as a worker process dies or stops beating."""

    def __init__(self, host: str, port: int, worker_ranks: list[int], children: dict[int, BaseProcess]):
        super().__init__(name="tp-watchdog", daemon=True)
        self.host, self.port = host, port
        self.worker_ranks = worker_ranks
        self.children = children  # rank -> process, for ranks spawned by this process
        self.stopping = threading.Event()

    def run(self) -> None:
        store = _store_client(self.host, self.port)
        last_count = {rank: 0 for rank in self.worker_ranks}
        last_change = {rank: time.monotonic() for rank in self.worker_ranks}
        while not self.stopping.wait(0.2):
            self._check_children()
            for rank in self.worker_ranks:
                count = store.add(heartbeat_key(rank), 0)
                now = time.monotonic()
                if count != last_count[rank]:
                    last_count[rank], last_change[rank] = count, now
                elif count and now - last_change[rank] > HEARTBEAT_STALE_S and not self.stopping.is_set():
                    self.die(f"TP rank {rank} sent no heartbeat for {HEARTBEAT_STALE_S:.0f} s (process, node or network gone)")

    def _check_children(self) -> None:
        for rank, proc in self.children.items():
            if proc.exitcode is not None and not self.stopping.is_set():
                self.die(f"TP rank {rank} (pid {proc.pid}) exited unexpectedly with code {proc.exitcode}")

    def die(self, message: str) -> NoReturn:
        kill_processes(list(self.children.values()))
        fatal(f"{message}; shutting the engine down")

    def diagnose_then_die(self, error: BaseException) -> NoReturn:
        """A collective failed on rank 0: give the checks a moment to name the culprit."""
        deadline = time.monotonic() + HEARTBEAT_STALE_S + 1
        while time.monotonic() < deadline:
            self._check_children()
            time.sleep(0.1)
        self.die(f"a tensor-parallel step failed on rank 0: {error!r}")


def kill_processes(processes: list[BaseProcess], grace_s: float = 2.0) -> None:
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
