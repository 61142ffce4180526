"""What sending a decode step to the tensor-parallel workers costs: pickled (TPGroup.broadcast_object,
how every step went before issue 15) against packed (TPGroup.send_command / receive_command,
engine/packed_step.py), on a 2-rank gloo group on the CPU.

    python benchmarks/tp_broadcast.py [--iters 2000] [--rounds 10] [--requests 64,256]
        [--page-sizes 1,16] [--context 1000]

The step is what build_step_input makes for a decode batch of `--requests` requests of about
`--context` tokens each (900 to 1100), under overlap (every input a placeholder), their pages
int32 arrays as Req.pages. Each iteration rank 0 sends the step and rank 1 receives and decodes
it, then both join a one-element all-reduce, standing in for the forward's first collective:
the ranks run in lockstep as in the engine, so a slow decode on the worker counts as it would
there. Per path and shape it prints:

- `step_us`: wall time per iteration (mean over `--iters`, after 50 warm-up iterations; the
  paths take turns in `--rounds` blocks);
- `send_us`: rank 0's time inside the send call (pickling or packing, and the broadcasts);
- `bytes`: the payload per step;
- `host_us`: the encoding alone, in one process, no group: pickle.dumps + pickle.loads against
  pack_step + unpack_step (rank 0's and the worker's host work; steadier than the timings over
  gloo, whose collectives cost a few hundred microseconds each on a small, shared machine);
and `sync_us`, the lone all-reduce per iteration (the floor under step_us), and pickled/packed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WARMUP = 50


def decode_step(requests: int, page_size: int, context: int, seed: int = 0):
    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.request import Req
    from sglaunch.engine.scheduler import Chunk
    from sglaunch.engine.step import build_step_input, placeholder

    rng = random.Random(seed)
    chunks = []
    for i in range(requests):
        n = rng.randrange(context - 100, context + 101)
        req = Req(f"r{i}", [rng.randrange(150_000) for _ in range(n - 1)], SamplingParams(), i)
        req.token_ids.append(placeholder(i))  # overlap: the previous step's choice, still on the device
        req.pages = array("i", (rng.randrange(1 << 20) for _ in range(-(-n // page_size))))
        chunks.append(Chunk(req, n - 1, n))
    return build_step_input(chunks, page_size)


def host_seconds(path: str, step, iters: int) -> float:
    """Seconds per step of encoding and decoding `step` as `path` does, in this process."""
    import pickle

    from sglaunch.engine.packed_step import pack_step, unpack_step

    if path == "pickled":
        def once():
            pickle.loads(pickle.dumps(("step", step)))
    else:
        def once():
            unpack_step(pack_step(step))
    once()
    start = time.perf_counter()
    for _ in range(iters):
        once()
    return (time.perf_counter() - start) / iters


def _loop(tp, rank: int, path: str, step, iters: int, sync) -> tuple[float, float]:
    """(wall seconds, rank 0's seconds inside the send calls) of `iters` iterations."""
    import torch.distributed as dist

    send = 0.0
    tp.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        if rank == 0:
            t = time.perf_counter()
            if path == "pickled":
                tp.broadcast_object(("step", step))
            elif path == "packed":
                tp.send_command("step", step)
            send += time.perf_counter() - t
        elif path == "pickled":
            tp.broadcast_object()
        elif path == "packed":
            tp.receive_command()
        dist.all_reduce(sync, group=tp.cpu_group)
    wall = time.perf_counter() - start
    tp.barrier()
    return wall, send


def _rank(rank: int, port: int, args) -> None:
    import pickle

    import torch
    import torch.distributed as dist

    from sglaunch.engine.distributed import TPGroup
    from sglaunch.engine.packed_step import pack_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tp = TPGroup(rank, 2, dist.group.WORLD, dist.group.WORLD)
    sync = torch.zeros(1)
    if rank == 0:
        print(f"2 ranks over gloo on the CPU ({os.cpu_count()} cores), {args.iters} iterations per row "
              f"in {args.rounds} rounds, "
              f"context {args.context - 100}..{args.context + 100} tokens")
        print(f"{'requests':>8} {'page':>4} {'path':>8} {'bytes':>9} {'step_us':>9} {'send_us':>9} "
              f"{'host_us':>8} {'sync_us':>8}")
    try:
        for requests in args.requests:
            for page_size in args.page_sizes:
                step = decode_step(requests, page_size, args.context)
                # NOTE: once per shape, rank 1 checks what it got against its own copy of the step
                if rank == 0:
                    tp.send_command("step", step)
                else:
                    kind, got = tp.receive_command()
                    assert kind == "step" and got.input_ids == step.input_ids and got.page_tables == step.page_tables
                # NOTE: the paths take turns, `--rounds` blocks each, so a machine whose speed
                # drifts (other jobs) slows them alike
                totals = {path: [0.0, 0.0] for path in ("sync", "pickled", "packed")}
                block = max(1, args.iters // args.rounds)
                for path in totals:
                    _loop(tp, rank, path, step, WARMUP, sync)
                for _ in range(args.rounds):
                    for path, total in totals.items():
                        wall, send = _loop(tp, rank, path, step, block, sync)
                        total[0] += wall
                        total[1] += send
                iters = block * args.rounds
                rows = {path: (wall / iters * 1e6, send / iters * 1e6) for path, (wall, send) in totals.items()}
                if rank == 0:
                    sizes = {"pickled": len(pickle.dumps(("step", step))), "packed": len(pack_step(step))}
                    host = {path: host_seconds(path, step, max(1, args.iters // 4)) * 1e6 for path in sizes}
                    for path in ("pickled", "packed"):
                        step_us, send_us = rows[path]
                        print(f"{requests:>8} {page_size:>4} {path:>8} {sizes[path]:>9} {step_us:>9.1f} "
                              f"{send_us:>9.1f} {host[path]:>8.1f} {rows['sync'][0]:>8.1f}")
                    ratios = [rows["pickled"][0] / rows["packed"][0], rows["pickled"][1] / rows["packed"][1],
                              host["pickled"] / host["packed"]]
                    print(f"{'':>8} {'':>4} {'ratio':>8} {'':>9} {ratios[0]:>8.2f}x {ratios[1]:>8.2f}x "
                          f"{ratios[2]:>7.2f}x   (pickled / packed)", flush=True)
                tp.barrier()  # NOTE: rank 1 waits here while rank 0 times the encodings
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10, help="blocks per path, taking turns")
    parser.add_argument("--requests", default="64,256")
    parser.add_argument("--page-sizes", default="1,16")
    parser.add_argument("--context", type=int, default=1000)
    args = parser.parse_args()
    args.requests = [int(x) for x in args.requests.split(",")]
    args.page_sizes = [int(x) for x in args.page_sizes.split(",")]
    import torch.multiprocessing as mp

    from sglaunch.engine.distributed import free_port

    mp.spawn(_rank, args=(free_port(), args), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
