"""Host cost of an eager step's attention metadata: RaggedMetadata.from_step (numpy, one copy)
against the definition it replaced in session 17 (torch.tensor over the step's lists, one .to()
per field; kept as the oracle in tests/engine/test_ragged_metadata.py and imported from there).

    python benchmarks/ragged_metadata_cost.py [--prompts 64] [--prompt-len 64] [--calls 50]

A step admitting --prompts prompts of --prompt-len tokens (page size 1), with the engine's int32
array page tables and with plain lists; best of 5 rounds of --calls calls each, on the CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests" / "engine"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()

    import torch
    from test_ragged_metadata import reference

    from sglaunch.engine.attention.base import RaggedMetadata
    from sglaunch.engine.step import StepInput

    torch.set_num_threads(1)
    a, p = args.prompts, args.prompt_len
    for kind in ("arrays", "lists"):
        tables = [list(range(i * p, (i + 1) * p)) for i in range(a)]
        if kind == "arrays":
            tables = [array("i", t) for t in tables]
        step = StepInput([0] * (a * p), [j for _ in range(a) for j in range(p)], [p] * a, [p] * a, tables, [])
        sides = {"before (torch.tensor per field)": lambda: reference(step, 1),
                 "from_step (numpy, one copy)": lambda: RaggedMetadata.from_step(step, 1, torch.device("cpu"))}
        for name, fn in sides.items():
            for _ in range(3):
                fn()
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                best = min(best, (time.perf_counter() - start) / args.calls)
            print(f"{a} prompts x {p} tokens, {kind:6s} tables: {name:32s} {best * 1e3:7.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
