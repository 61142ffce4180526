"""Tensor-parallel and multi-node layout: sizes, ranks, rendezvous address, GPU count, heads."""

from __future__ import annotations

from sglaunch.checks.context import LaunchContext
from sglaunch.checks.diagnostics import Diagnostic, diag


def check_nodes(ctx: LaunchContext) -> list[Diagnostic]:
    tp, nnodes, rank = ctx.get("tp_size"), ctx.get("nnodes"), ctx.get("node_rank")
    found = []
    if nnodes >= 1 and tp >= 1 and tp % nnodes:
        found.append(diag("PAR001", f"--tp-size {tp} cannot be split evenly over --nnodes {nnodes}",
                          flags=("--tp-size", "--nnodes"), fix="make --tp-size a multiple of --nnodes"))
    if nnodes >= 1 and not 0 <= rank < nnodes:
        found.append(diag("PAR002", f"--node-rank {rank} is outside 0..{nnodes - 1}",
                          flags=("--node-rank", "--nnodes"), fix=f"use a rank from 0 to {nnodes - 1}"))
    addr = ctx.get("dist_init_addr")
    if nnodes > 1 and addr is None:
        found.append(diag("PAR003", f"--nnodes {nnodes} needs the rendezvous address of node 0",
                          flags=("--dist-init-addr", "--nnodes"),
                          fix="add --dist-init-addr NODE0_IP:PORT, the same on every node"))
    if addr is not None and not _host_port(addr):
        found.append(diag("PAR004", f"--dist-init-addr '{addr}' is not HOST:PORT",
                          flags=("--dist-init-addr",), fix="e.g. --dist-init-addr 10.0.0.1:5000"))
    return found


def _host_port(addr: str) -> bool:
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def check_heads(ctx: LaunchContext) -> list[Diagnostic]:
    ckpt, tp = ctx.checkpoint, ctx.get("tp_size")
    if ckpt is None or tp < 1 or not ckpt.num_heads:
        return []
    heads, kv = ckpt.num_heads, ckpt.num_kv_heads
    if heads % tp == 0 and (kv % tp == 0 or tp % kv == 0):
        return []
    usable = [n for n in range(1, heads + 1) if heads % n == 0 and (kv % n == 0 or n % kv == 0)]
    return [diag("PAR005", f"--tp-size {tp} does not divide the model's {heads} attention heads / "
                 f"{kv} KV heads", flags=("--tp-size",), origin=ctx.origin("tp_size"),
                 fix=f"use a --tp-size from {usable}")]


def check_gpu_count(ctx: LaunchContext) -> list[Diagnostic]:
    if ctx.get("device") != "cuda" or ctx.env_info is None:
        return []
    per_node = ctx.get("tp_size") // max(ctx.get("nnodes"), 1)
    visible = len(ctx.gpus) - ctx.get("base_gpu_id")
    if per_node <= visible:
        return []
    return [diag("PAR006", f"this node needs {per_node} GPU(s) (--tp-size {ctx.get('tp_size')} over "
                 f"{ctx.get('nnodes')} node(s)) but {max(visible, 0)} are visible ({ctx.env_info.gpu_probe})",
                 flags=("--tp-size", "--nnodes", "--device"),
                 fix="lower --tp-size, add nodes, or check CUDA_VISIBLE_DEVICES")]
