"""What one TokenOutput costs to build on this machine (torch-free), for the figures in
sglaunch/engine/interface.py (`token_output`) and benchmarks/NOTES.md, session 27:

    python benchmarks/token_output_cost.py [--outputs 64] [--number 3000]

Times, in microseconds for `--outputs` outputs (one step's worth at that many running requests,
best of 5 timeit runs of `--number` calls): the frozen dataclass's own __init__, interface.token_output
(what the engine makes), ipc.unpack_output (what the server makes from what crossed the channel) and
the unpack before session 27 (`__dict__.update(zip(...))`). One run on a shared 2-core machine is
noisy: take the order of magnitude.
"""

from __future__ import annotations

import argparse
import dataclasses
import timeit


def main(argv: list[str] | None = None) -> int:
    from sglaunch.engine import ipc
    from sglaunch.engine.interface import TokenOutput, token_output

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=64)
    parser.add_argument("--number", type=int, default=3000)
    args = parser.parse_args(argv)
    fields = [(f"req-{i:04d}-0123456789ab", (175,), False, None, 40, 5, 0, None, (-5.14,), None)
              for i in range(args.outputs)]
    names = tuple(f.name for f in dataclasses.fields(TokenOutput))

    def old_unpack(row):
        out = object.__new__(TokenOutput)
        out.__dict__.update(zip(names, row))
        return out

    ways = {
        "TokenOutput(*fields) (frozen __init__)": lambda: [TokenOutput(*row) for row in fields],
        "interface.token_output(*fields)": lambda: [token_output(*row) for row in fields],
        "ipc.unpack_output(fields)": lambda: [ipc.unpack_output(row) for row in fields],
        "before session 27: __dict__.update(zip)": lambda: [old_unpack(row) for row in fields],
    }
    assert all(fn() == ways["TokenOutput(*fields) (frozen __init__)"]() for fn in ways.values())
    print(f"{args.outputs} outputs, best of 5 x {args.number} calls:")
    for label, fn in ways.items():
        best = min(timeit.repeat(fn, number=args.number, repeat=5)) / args.number
        print(f"  {label:42s} {best * 1e6:8.1f} us  ({best * 1e6 / args.outputs:.2f} us an output)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
