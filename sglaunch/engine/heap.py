"""The garbage collector after start-up. Torch-free.

Booting a rank leaves a few hundred thousand container objects alive for the life of the
process (torch, transformers and their modules, the model's parameters and buffers, captured
graphs' keys, the KV pool's bookkeeping): 384,559 tracked objects in a CPU SmolLM2 engine, whose
full collection took 176 ms on the dev CPU (`python benchmarks/host_probes.py --model SMOL`). A step allocates lists, tuples and dicts per request,
so the cyclic collector runs every step or two, and each of its full passes walks that whole
start-up heap: a stall of tens to hundreds of milliseconds in the middle of decoding.
freeze_startup_heap() moves everything alive at that moment out of the collector's reach
(gc.freeze()); what steps allocate later is collected as before. The HTTP server process does
the same once it is ready: streaming allocates container objects per token per stream (issue 15:
one full pass caught by perf in a 3 s window at 64 streams took about a third of the server's
CPU there). A process that stops its
engine and goes on (tests, benchmarks that boot engines one after another) unfreezes the heap
when the engine stops (Cluster.stop), so the stopped engine's reference cycles are collected.
"""

from __future__ import annotations

import gc
import time


class _Pauses:
    """The collector's passes by generation and their time, from gc.callbacks (a few us each)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.frozen = 0  # objects frozen at start-up (counted once: gc.get_freeze_count() walks them all)
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            generation = info["generation"]
            self.counts[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._began

    def stats(self) -> dict:
        """For /server_info: passes and seconds per generation since start-up, the frozen count."""
        return {"collections": list(self.counts), "seconds": [round(s, 4) for s in self.seconds],
                "frozen_objects": self.frozen}


PAUSES = _Pauses()


def freeze_startup_heap() -> int:
    """Collect once, then freeze every object alive now, and count the passes from here on
    (PAUSES); -> how many objects were frozen."""
    gc.collect()
    gc.freeze()
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)
    # NOTE: once, here: gc.get_freeze_count() walks the whole frozen list (33 ms for 384,559
    # objects on the dev CPU); live stats are built at most steps of a loaded engine (H200,
    # session 12: calling it there halved the engine process's throughput)
    PAUSES.frozen = gc.get_freeze_count()
    return PAUSES.frozen


def unfreeze_heap() -> None:
    """Give the frozen objects back to the collector (their cycles are collectable again)."""
    gc.unfreeze()
    PAUSES.frozen = 0
