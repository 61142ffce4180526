"""Cold-start time of the front-end commands (target: under 0.3 s each), against bare Python.

    python benchmarks/cold_start.py [--runs 15] [--against OTHER_CHECKOUT]

Each command runs in a fresh interpreter; the table gives the median wall time, the ratio to
`python -c pass` measured in the same run, and whether torch was imported (it must not be).
`--against DIR` also runs every command from another checkout (e.g. `git worktree add /tmp/base
REV`), interleaved run by run with this one, and prints the median ratio this/other: on a shared
machine whose speed drifts, that ratio is steadier than either time.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3
COMMANDS = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "sglaunch --help": [sys.executable, "-m", "sglaunch", "--help"],
    "sglaunch serve --help": [sys.executable, "-m", "sglaunch", "serve", "--help"],
    "sglaunch check-config": [sys.executable, "-m", "sglaunch", "check-config", "--no-machine", "--tp-size", "2"],
    "sglaunch check-config (with GPU probe)": [sys.executable, "-m", "sglaunch", "check-config", "--tp-size", "1"],
    "sglaunch migrate-flags --help": [sys.executable, "-m", "sglaunch", "migrate-flags", "--help"],
    "sglaunch version": [sys.executable, "-m", "sglaunch", "version"],
}


def time_once(argv: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system). The CPU time barely moves when
    other jobs share the machine, the wall time does: both are reported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imports_torch(argv: list[str]) -> bool:
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True)
    return any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--against", help="another checkout to compare with, interleaved")
    args = parser.parse_args()
    if args.against:
        return compare(args.against, args.runs)
    rows, baseline, worst = [], None, 0.0
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for name, argv in COMMANDS.items():
        time_once(argv)  # warm the file cache
        runs = [time_once(argv) for _ in range(args.runs)]
        median = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        baseline = baseline or median
        torch = imports_torch(argv)
        if name != "python -c pass (baseline)":
            worst = max(worst, median)
        rows.append((name, median, cpu, median / baseline, torch))
    print(f"{'command':42} {'median s':>9} {'cpu s':>6} {'x bare':>7}  torch")
    for name, median, cpu, ratio, torch in rows:
        print(f"{name:42} {median:9.3f} {cpu:6.3f} {ratio:7.1f}  {'IMPORTED' if torch else 'no'}")
    ok = worst < TARGET_S and not any(t for *_, t in rows)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"slowest front-end command {worst:.3f} s; target < {TARGET_S} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


def compare(other: str, runs: int) -> int:
    other_env = {**os.environ, "PYTHONPATH": os.path.abspath(other)}
    print(f"{'command':42} {'this s':>7} {'other s':>8} {'this/other':>10}")
    for name, argv in COMMANDS.items():
        if name.startswith("python -c"):
            continue
        time_once(argv), time_once(argv, other_env)
        ours, theirs, ratios = [], [], []
        for _ in range(runs):
            a, b = time_once(argv)[0], time_once(argv, other_env)[0]
            ours.append(a), theirs.append(b), ratios.append(a / b)
        print(f"{name:42} {statistics.median(ours):7.3f} {statistics.median(theirs):8.3f} "
              f"{statistics.median(ratios):10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
