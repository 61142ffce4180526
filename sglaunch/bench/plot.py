"""PNG of throughput and latency against concurrency (and request rate) for each configuration."""

from __future__ import annotations

import math
from pathlib import Path

KIND_AXIS = {"concurrency": "concurrency (clients)", "rate": "request rate (req/s; inf at the right)"}


def points(config: dict, kind: str, key: str, sub: str | None = None) -> tuple[list, list]:
    """(x, y) of the finished levels of one kind; rate inf drawn at twice the largest finite rate."""
    levels = [lv for lv in config["levels"] if lv["kind"] == kind and "completed" in lv and lv["completed"]]
    finite = [lv["value"] for lv in levels if lv["value"] != "inf"]
    xs, ys = [], []
    for lv in levels:
        x = lv["value"] if lv["value"] != "inf" else 2 * max(finite, default=1)
        y = lv[key][sub] if sub else lv[key]
        if y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def write_plot(doc: dict, path: Path) -> None:
    """One row per level kind: output-token throughput (left), p50 E2E and TTFT latency (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ("concurrency", "rate") if any(lv["kind"] == k for c in doc["configs"] for lv in c["levels"])]
    fig, axes = plt.subplots(len(kinds) or 1, 2, figsize=(11, 4 * max(1, len(kinds))), squeeze=False)
    for row, kind in enumerate(kinds):
        throughput, latency = axes[row]
        for index, config in enumerate(doc["configs"]):
            color = f"C{index}"
            throughput.plot(*points(config, kind, "output_token_throughput"), "o-", color=color,
                            label=config["label"])
            latency.plot(*points(config, kind, "e2e_ms", "p50"), "o-", color=color,
                         label=f"{config['label']} E2E p50")
            latency.plot(*points(config, kind, "ttft_ms", "p50"), "s--", color=color,
                         label=f"{config['label']} TTFT p50")
        for axis, title in ((throughput, "output tokens/s"), (latency, "latency (ms)")):
            axis.set_xlabel(KIND_AXIS[kind])
            axis.set_ylabel(title)
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=8)
            if kind == "concurrency" and wide_range(axis):
                axis.set_xscale("log", base=2)
    fig.suptitle(f"sglaunch bench ({doc['status']}{', partial' if doc['partial'] else ''})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def wide_range(axis) -> bool:
    xs = [x for line in axis.get_lines() for x in line.get_xdata()]
    return bool(xs) and min(xs) > 0 and max(xs) / min(xs) >= 8 and not any(math.isinf(x) for x in xs)
