"""Cold-start time of the front-end commands (target: under 0.3 s each), against bare Python.

    python benchmarks/cold_start.py [--runs 15]

Each command runs in a fresh interpreter; the table gives the median wall time, the ratio to
`python -c pass` measured in the same run, and whether torch was imported (it must not be).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3
COMMANDS = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "sglaunch --help": [sys.executable, "-m", "sglaunch", "--help"],
    "sglaunch serve --help": [sys.executable, "-m", "sglaunch", "serve", "--help"],
    "sglaunch check-config": [sys.executable, "-m", "sglaunch", "check-config", "--no-machine", "--tp", "2"],
    "sglaunch check-config (with GPU probe)": [sys.executable, "-m", "sglaunch", "check-config", "--tp", "1"],
    "sglaunch migrate-flags --help": [sys.executable, "-m", "sglaunch", "migrate-flags", "--help"],
    "sglaunch version": [sys.executable, "-m", "sglaunch", "version"],
}


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def imports_torch(argv: list[str]) -> bool:
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True)
    return any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    rows, baseline, worst = [], None, 0.0
    for name, argv in COMMANDS.items():
        time_once(argv)  # warm the file cache
        median = statistics.median(time_once(argv) for _ in range(args.runs))
        baseline = baseline or median
        torch = imports_torch(argv)
        if name != "python -c pass (baseline)":
            worst = max(worst, median)
        rows.append((name, median, median / baseline, torch))
    print(f"{'command':42} {'median s':>9} {'x bare':>7}  torch")
    for name, median, ratio, torch in rows:
        print(f"{name:42} {median:9.3f} {ratio:7.1f}  {'IMPORTED' if torch else 'no'}")
    ok = worst < TARGET_S and not any(t for *_, t in rows)
    print(f"slowest front-end command {worst:.3f} s; target < {TARGET_S} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
