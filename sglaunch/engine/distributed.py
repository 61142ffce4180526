"""Tensor-parallel process group: rank layout over nodes, init, and the collectives we use.

Rank r lives on node r // ranks_per_node. Rank 0 (node 0) hosts the TCPStore every rank
rendezvous at (`dist_init_addr`), drives the others, and is the only rank that samples.
Two groups: `device_group` (NCCL on CUDA, gloo on CPU) for the forward pass, and `cpu_group`
(always gloo) for the step broadcast and small agreements.

Rank 0 sends every command (a step, a keepalive, shutdown) with `send_command` and the workers
take it with `receive_command`: a fixed int64 header (command code, payload bytes), then the
payload, packed by engine/packed_step.py (steps are not pickled).
"""

from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sglaunch.config import EngineConfig
from sglaunch.engine.packed_step import pack_command, unpack_command

RENDEZVOUS_TIMEOUT = timedelta(minutes=10)  # other nodes may start a while after node 0
# NOTE: workers wait in a broadcast for the next step; rank 0 sends a keepalive while idle
# (KEEPALIVE_S), so a collective that waits this long means a rank is gone or hung.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)
KEEPALIVE_S = 2.0


@dataclass(frozen=True)
class RankLayout:
    world_size: int
    nnodes: int
    ranks_per_node: int

    def node_ranks(self, node_rank: int) -> list[int]:
        first = node_rank * self.ranks_per_node
        return list(range(first, first + self.ranks_per_node))

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node


def rank_layout(config: EngineConfig) -> RankLayout:
    if config.tp_size % config.nnodes:
        raise ValueError(
            f"--tp-size {config.tp_size} is not a multiple of --nnodes {config.nnodes}; "
            "every node hosts the same number of tensor-parallel ranks"
        )
    if not 0 <= config.node_rank < config.nnodes:
        raise ValueError(f"--node-rank {config.node_rank} is outside 0..{config.nnodes - 1}")
    return RankLayout(config.tp_size, config.nnodes, config.tp_size // config.nnodes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_address(config: EngineConfig) -> tuple[str, int]:
    """host:port of the rendezvous store; a free local port when single-node and unset."""
    if config.dist_init_addr:
        host, _, port = config.dist_init_addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--dist-init-addr {config.dist_init_addr!r} is not host:port")
        return host.strip("[]"), int(port)
    if config.nnodes > 1:
        raise ValueError("--nnodes > 1 needs --dist-init-addr host:port of node 0")
    return "127.0.0.1", free_port()


def connect_store(host: str, port: int, rank: int, world_size: int) -> dist.TCPStore:
    """Rank 0 hosts the store; the others connect (waiting for it up to RENDEZVOUS_TIMEOUT)."""
    return dist.TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False
    )


# NOTE: the first broadcast of every command has this fixed size (code, payload bytes), so a
# worker knows the payload's size before it receives it; no payload follows when it is 0
HEADER_WORDS = 2
INBOX_BYTES = 1 << 16  # a worker's first receive buffer; grown (doubled at least) on demand


class TPGroup:
    """This rank's view of the tensor-parallel group; every collective is a no-op at size 1."""

    def __init__(self, rank: int, size: int, device_group: Any = None, cpu_group: Any = None):
        self.rank, self.size = rank, size
        self.device_group, self.cpu_group = device_group, cpu_group
        # send_command / receive_command: the header (one tensor, reused), and on workers the
        # payload buffer, reused and grown on demand
        self._header = torch.zeros(HEADER_WORDS, dtype=torch.int64)
        self._header_np = self._header.numpy()  # NOTE: shares the tensor's memory
        self._inbox = torch.empty(0, dtype=torch.uint8)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] per rank -> [..., n * size], rank-major."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=-1)

    def send_command(self, kind: str, payload: Any = None) -> None:
        """Rank 0: broadcast the command `kind` ("step", "draft", "noop", "shutdown", ...) with its
        payload to every worker (receive_command), over the gloo group. Steps go packed
        (packed_step.pack_command): the header, then the packed bytes as a uint8 tensor over the
        same memory (torch.frombuffer, no copy)."""
        if self.size == 1:
            return
        code, body = pack_command(kind, payload)
        self._header_np[0], self._header_np[1] = code, (len(body) if body else 0)
        dist.broadcast(self._header, src=0, group=self.cpu_group)
        if body:
            dist.broadcast(torch.frombuffer(body, dtype=torch.uint8), src=0, group=self.cpu_group)

    def receive_command(self) -> tuple[str, Any]:
        """A worker: wait for rank 0's next send_command; returns (kind, payload), payload None
        for commands without one. The payload lands in a buffer reused from command to command;
        the decoded payload owns its memory."""
        dist.broadcast(self._header, src=0, group=self.cpu_group)
        code, nbytes = self._header.tolist()
        if not nbytes:
            return unpack_command(code, None)
        if nbytes > self._inbox.numel():
            self._inbox = torch.empty(max(nbytes, 2 * self._inbox.numel(), INBOX_BYTES), dtype=torch.uint8)
        body = self._inbox[:nbytes]  # NOTE: a prefix of the buffer: contiguous, gloo fills it in place
        dist.broadcast(body, src=0, group=self.cpu_group)
        return unpack_command(code, body.numpy())

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0 sends `obj`, every rank returns it (pickled over the gloo group). For rare,
        arbitrary objects; the per-step commands go packed, through send_command."""
        if self.size == 1:
            return obj
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.cpu_group)
        if self.rank != 0:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(payload, src=0, group=self.cpu_group)
        return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    def min_int(self, value: int) -> int:
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.cpu_group)


def init_tp_group(config: EngineConfig, rank: int, store: dist.TCPStore | None) -> TPGroup:
    """Join the process group (no-op for a single rank)."""
    if config.tp_size == 1:
        return TPGroup(0, 1)
    backend = "nccl" if config.device == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("tp", store),
        rank=rank,
        world_size=config.tp_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    cpu_group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return TPGroup(rank, config.tp_size, dist.group.WORLD, cpu_group)


def destroy_tp_group(tp: TPGroup) -> None:
    if tp.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
