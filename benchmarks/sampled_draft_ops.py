"""Operators DSpark's eager sampled drafting dispatches, counted on the CPU (each is a kernel launch
on a GPU, where a sampled step's drafting loop runs outside the drafter's graph):

    python benchmarks/sampled_draft_ops.py

The bundled drafter (its block outputs replaced by random ones) over 4 requests,
every row sampling at T=0.7: `DSparkDrafter.sample_block` with `any_greedy` True (the general
path, what every sampled step ran before session 32) and False (what a step whose rows all
sample runs now), and `accept.inverse_cdf` alone. Prints one JSON object: operator calls.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def counted(fn) -> tuple[int, dict]:
    with Count() as c:
        fn()
    return sum(c.ops.values()), dict(c.ops.most_common())


def main() -> None:
    import shutil
    import tempfile

    from sglaunch.speculative.accept import inverse_cdf
    from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
    from sglaunch.speculative.drafter import BlockOutput
    from sglaunch.speculative.drafter_config import load_drafter_config

    bundled = Path(__file__).resolve().parents[1] / "sglaunch" / "hub" / "drafters" / "smollm2-135m-instruct"
    config = load_drafter_config(bundled)
    with tempfile.TemporaryDirectory() as folder:
        path = save_drafter(Path(folder) / "d", config, init_drafter_state(config, seed=0))
        shutil.copy(bundled / "draft_vocab.json", Path(path) / "draft_vocab.json")
        drafter = load_drafter(path)
    B, G = 4, config.block_size
    width = drafter.draft_vocab.shape[0] if drafter.draft_vocab is not None else config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out = BlockOutput(torch.randn(B, G, config.hidden_size, generator=gen).to(drafter.dtype),
                      torch.randn(B, G, width, generator=gen))
    anchors, temps = torch.randint(0, 1000, (B,), generator=gen), torch.full((B,), 0.7)
    u = torch.rand(B, G, generator=gen)
    q = torch.softmax(torch.randn(B, width, generator=gen), -1)
    general, general_ops = counted(lambda: drafter.sample_block(out, anchors, temps, uniforms=u))
    sampled, sampled_ops = counted(lambda: drafter.sample_block(out, anchors, temps, uniforms=u, any_greedy=False))
    draw, draw_ops = counted(lambda: inverse_cdf(q, u[:, 0]))
    print(json.dumps({"block_size": G, "requests": B, "draft_vocab": width,
                      "sample_block any_greedy=True": general, "sample_block any_greedy=False": sampled,
                      "inverse_cdf": draw, "inverse_cdf ops": draw_ops,
                      "sample_block any_greedy=False ops": sampled_ops}, indent=1))


if __name__ == "__main__":
    main()
