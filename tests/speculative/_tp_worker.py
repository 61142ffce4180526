"""One TP rank of test_tp: load this rank's drafter shard over gloo, run two draft steps, save
rank 0's outputs. argv: checkpoint, rank, world, port, output file."""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from sglaunch.engine.distributed import TPGroup


def run(ckpt: str, tp: TPGroup) -> dict[str, torch.Tensor]:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from spec_helpers import feature_rows
    from sglaunch.speculative.checkpoint import load_drafter
    from sglaunch.speculative.drafter import DraftContextCache

    drafter = load_drafter(ckpt, tp=tp, dtype=torch.float64)
    cache = DraftContextCache(drafter.make_pool(64))
    out = {}
    for rid, n in enumerate((5, 9, 2)):
        cache.add(rid)
        cache.append(rid, feature_rows(n, drafter.config, seed=rid).double())
    for step in range(2):
        pos = torch.tensor([cache.length(r) for r in range(3)])
        batch = cache.build_batch([0, 1, 2], torch.tensor([4, 5, 6]), pos)
        block_out = drafter.forward_block(batch, cache.pool)
        block = drafter.sample_block(block_out, batch.anchor_tokens, torch.tensor([0.0, 1.0, 0.5]),
                                     uniforms=torch.linspace(0.05, 0.95, 3 * drafter.config.block_size).view(3, -1))
        out.update({f"logits{step}": block_out.logits, f"tokens{step}": block.tokens, f"conf{step}": block.conf_logits})
        for rid in range(3):
            cache.append(rid, feature_rows(step + rid + 1, drafter.config, seed=50 + rid).double())
    return out


def main() -> None:
    ckpt, rank, world, port, out_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        out = run(ckpt, TPGroup(rank, world, dist.group.WORLD, dist.group.WORLD))
        if rank == 0:
            torch.save(out, out_file)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
