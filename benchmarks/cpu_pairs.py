"""Which logical CPUs of this machine share a physical core, measured rather than read from sysfs.

    python benchmarks/cpu_pairs.py [--seconds 0.2] [--json out.json]

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

The last line is `SUGGEST engine=LIST server=LIST rest=LIST`: two CPUs that were measured to share
no core with each other or with the rest's CPUs picked first, for SGLAUNCH_ENGINE_CPUS /
SGLAUNCH_SERVER_CPUS (docs/gpu.md) and `taskset -c` of the clients.
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


def suggest(cpus: list[int], shared: set[frozenset[int]]) -> tuple[list[int], list[int], list[int]]:
    """engine CPU, server CPU, and the rest: the first two share a core with nothing else used."""
    partner = {c: {d for pair in shared if c in pair for d in pair if d != c} for c in cpus}
    engine = cpus[-1]
    server = next((c for c in reversed(cpus[:-1]) if c not in partner[engine]), cpus[0])
    taken = {engine, server} | partner[engine] | partner[server]
    rest = [c for c in cpus if c not in taken] or [c for c in cpus if c not in (engine, server)] or cpus
    return [engine], [server], rest


def cpulist(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.2, help="spin time of each measurement")
    parser.add_argument("--threshold", type=float, default=0.85,
                        help="a pair whose rates fall below this fraction of solo shares a core")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
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
    engine, server, rest = suggest(cpus, shared)
    if args.json:
        args.json.write_text(json.dumps({"cpus": cpus, "solo": solo, "pairs": pairs,
                                         "shared": sorted(sorted(p) for p in shared),
                                         "kernel_siblings": kernel_siblings(cpus)}, indent=1))
    print(f"SUGGEST engine={cpulist(engine)} server={cpulist(server)} rest={cpulist(rest)}")


if __name__ == "__main__":
    main()
