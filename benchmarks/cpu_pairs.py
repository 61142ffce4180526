"""Which logical CPUs of this machine slow each other down, measured rather than read from sysfs.

    python benchmarks/cpu_pairs.py [--seconds 0.2] [--threshold 0.85] [--json out.json]
    python benchmarks/cpu_pairs.py --scaling [--seconds 0.5]

A virtual machine may report every vCPU as its own core while the host runs two of them on one
core's hyperthreads; two busy processes placed there each run about a third slower. Issue 15's
HTTP row was bimodal on the H200 host (session 17: both the server and the engine process spent
about 35% more CPU time per token in the slow runs), which fits that. This script:

1. times a fixed pure-Python spin on each allowed CPU alone (three times, so a CPU that is slow alone,
   a busy neighbour on the host, shows as such),
2. times every pair of CPUs spinning together, each process pinned to its CPU with
   os.sched_setaffinity, and reports each one's rate against its solo rate,
3. prints the pairs that slow each other down (rate below --threshold of solo) beside what the
   kernel reports in /sys/devices/system/cpu/cpu*/topology/thread_siblings_list.

--scaling instead spins k processes pinned to CPUs 0..k-1 (k = 1, 2, 3, 4, 6, 8, 12, 16 up to the
CPUs allowed, two repeats each), then 2, 4 and 8 spread evenly, and prints every process's rate
(millions of loop iterations a second): which CPUs run slowly with no neighbour of ours at all.
On the H200 host (session 18, benchmarks/gpu18/run2/cpu_scaling.txt) every vCPU ran at either
about 33-36 or about 18 M/s, changing between repeats: the host's other tenants, not our pairing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import time
from pathlib import Path


def _spin(cpu: int, seconds: float, start, out) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(2000):
            n += 1
    out.put((cpu, n / seconds))


def run_together(cpus: tuple[int, ...], seconds: float) -> dict[int, float]:
    """Loop rates (iterations a second) of one spinning process per CPU, all started at once."""
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(c, seconds, start, out)) for c in cpus]
    for p in procs:
        p.start()
    time.sleep(0.05)
    start.set()
    rates = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    return rates


def kernel_siblings(cpus: list[int]) -> list[str]:
    groups = set()
    for c in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        if path.exists():
            groups.add(path.read_text().strip())
    return sorted(groups)


def scaling(cpus: list[int], seconds: float) -> None:
    """k pinned spinning processes at once, on the first k allowed CPUs, then spread evenly."""
    def show(label: str, rates: dict[int, float]) -> None:
        print(f"{label} total {sum(rates.values()) / 1e6:.2f}: "
              + " ".join(f"{c}:{rates[c] / 1e6:.2f}" for c in sorted(rates)))

    for k in [k for k in (1, 2, 3, 4, 6, 8, 12, 16) if k <= len(cpus)]:
        for repeat in range(2):
            show(f"{k} first, repeat {repeat}", run_together(tuple(cpus[:k]), seconds))
    for k in [k for k in (2, 4, 8) if k <= len(cpus)]:
        show(f"{k} spread", run_together(tuple(cpus[:: len(cpus) // k][:k]), seconds))


def cpulist(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.2, help="spin time of each measurement")
    parser.add_argument("--threshold", type=float, default=0.85,
                        help="a pair whose rates fall below this fraction of solo shares a core")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--scaling", action="store_true", help="k processes at once instead of pairs")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.scaling:
        scaling(cpus, args.seconds)
        return
    print(f"{len(cpus)} CPUs allowed: {cpulist(cpus)}; kernel's thread siblings: {kernel_siblings(cpus)}")
    solo: dict[int, list[float]] = {c: [] for c in cpus}
    for _ in range(3):
        for c in cpus:
            solo[c].append(run_together((c,), args.seconds)[c])
    base = {c: max(v) for c, v in solo.items()}
    fastest = max(base.values())
    print("solo rate against the fastest CPU: " + " ".join(
        f"{c}:{base[c] / fastest:.2f}" + ("" if min(solo[c]) > 0.9 * max(solo[c]) else "~") for c in cpus))
    pairs = {}
    shared: set[frozenset[int]] = set()
    for a, b in itertools.combinations(cpus, 2):
        rates = run_together((a, b), args.seconds)
        ratio = min(rates[a] / base[a], rates[b] / base[b])
        pairs[f"{a},{b}"] = round(ratio, 3)
        if ratio < args.threshold:
            shared.add(frozenset((a, b)))
    print("pairs slowed below %.2f of solo: %s" % (args.threshold, " ".join(
        f"{min(p)}+{max(p)}:{pairs[f'{min(p)},{max(p)}']:.2f}" for p in sorted(shared, key=min)) or "none"))
    ratios = sorted(pairs.values())
    print(f"pair ratios: min {ratios[0]:.2f}, median {ratios[len(ratios) // 2]:.2f}, max {ratios[-1]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"cpus": cpus, "solo": solo, "pairs": pairs,
                                         "shared": sorted(sorted(p) for p in shared),
                                         "kernel_siblings": kernel_siblings(cpus)}, indent=1))


if __name__ == "__main__":
    main()
