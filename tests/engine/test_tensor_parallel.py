"""Tensor parallelism over gloo on CPU: TP=2 equals TP=1, two "nodes" on localhost, and a dead
rank brings the driver down with a message naming it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine_helpers import PROMPTS, engine_config
from sglaunch.engine.distributed import free_port
from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.launch import generate_batch

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_tp2_matches_tp1(name, checkpoints):
    single = generate_batch(engine_config(checkpoints[name]), PROMPTS, GREEDY)
    # page_size 2 and a small pool: preemption and paging run under TP as well
    config = engine_config(checkpoints[name], tp_size=2, page_size=2, max_total_tokens=48)
    assert generate_batch(config, PROMPTS, GREEDY) == single


def python_subprocess(code: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs,
    )


def test_two_nodes_on_localhost_match_tp1(checkpoints):
    path = checkpoints["qwen2"]
    single = generate_batch(engine_config(path), PROMPTS, GREEDY)
    addr = f"127.0.0.1:{free_port()}"
    node1 = start_node1(path, tp_size=2, nnodes=2, node_rank=1, dist_init_addr=addr)
    try:
        config = engine_config(path, tp_size=2, nnodes=2, node_rank=0, dist_init_addr=addr)
        assert generate_batch(config, PROMPTS, GREEDY) == single
        _, err = node1.communicate(timeout=60)
        assert node1.returncode == 0, err
    finally:
        node1.kill()


DRIVER = """
    import sys, time
    sys.path.insert(0, {helpers!r})
    from engine_helpers import engine_config
    from sglaunch.engine.interface import GenerateRequest, SamplingParams
    from sglaunch.engine.launch import create_engine
    if __name__ == "__main__":
        engine, cluster = create_engine(engine_config({path!r}, **{overrides!r}))
        print("ready", *[p.pid for p in cluster.children.values()], flush=True)
        sampling = SamplingParams(max_new_tokens=100000, temperature=0.0, ignore_eos=True)
        engine.add_request(GenerateRequest("forever", (1, 2, 3), sampling))
        while True:  # keeps stepping until a rank dies
            engine.step() if engine.has_work else time.sleep(0.01)
"""

NODE1 = """
    import sys
    sys.path.insert(0, {helpers!r})
    from engine_helpers import engine_config
    from sglaunch.engine.launch import run_worker_node
    if __name__ == "__main__":
        sys.exit(run_worker_node(engine_config({path!r}, **{overrides!r})))
"""


def start_driver(path: Path, **overrides) -> tuple[subprocess.Popen, list[int]]:
    driver = python_subprocess(DRIVER.format(helpers=str(Path(__file__).parent), path=str(path), overrides=overrides))
    line = driver.stdout.readline()
    assert line.startswith("ready"), driver.stderr.read()
    return driver, [int(pid) for pid in line.split()[1:]]


def start_node1(path: Path, **overrides) -> subprocess.Popen:
    return python_subprocess(NODE1.format(helpers=str(Path(__file__).parent), path=str(path), overrides=overrides))


def wait_for_failure(proc: subprocess.Popen, within_s: float) -> str:
    start = time.monotonic()
    _, err = proc.communicate(timeout=within_s + 15)
    assert time.monotonic() - start < within_s, err
    assert proc.returncode != 0, err
    return err


def test_killing_a_worker_ends_the_driver_naming_the_rank(checkpoints):
    driver, (worker_pid,) = start_driver(checkpoints["llama"], tp_size=2)
    try:
        time.sleep(0.5)
        os.kill(worker_pid, signal.SIGKILL)
        err = wait_for_failure(driver, within_s=10)
        assert "TP rank 1" in err and "exited unexpectedly" in err, err
    finally:
        driver.kill()


def test_dead_node_or_dead_driver_ends_the_other_side(checkpoints):
    """Node 1 dies: the driver exits naming rank 1. Driver dies: node 1 exits non-zero.

    The two cases are independent clusters (each its own rendezvous port): both start at once and
    both victims die at once, so their start-ups and their detection waits overlap."""
    path = checkpoints["llama"]
    clusters = {}
    try:
        for victim in ("node1", "driver"):
            two_nodes = dict(tp_size=2, nnodes=2, dist_init_addr=f"127.0.0.1:{free_port()}")
            node1 = start_node1(path, node_rank=1, **two_nodes)
            clusters[victim] = [node1, None]
            clusters[victim][1] = python_subprocess(DRIVER.format(helpers=str(Path(__file__).parent), path=str(path),
                                                                  overrides=dict(node_rank=0, **two_nodes)))
        for victim, (node1, driver) in clusters.items():
            line = driver.stdout.readline()
            assert line.startswith("ready"), driver.stderr.read()
        time.sleep(0.5)
        clusters["node1"][0].kill()  # its worker notices the orphaning and exits; rank 1 is gone
        clusters["driver"][1].kill()
        survivors = {"node1": clusters["node1"][1], "driver": clusters["driver"][0]}
        with ThreadPoolExecutor(2) as pool:
            errs = dict(zip(survivors, pool.map(lambda proc: wait_for_failure(proc, within_s=15),
                                                survivors.values())))
        assert "TP rank 1" in errs["node1"], errs["node1"]
        assert "TP rank 1" in errs["driver"], errs["driver"]
    finally:
        for node1, driver in clusters.values():
            if driver is not None:
                driver.kill()
            node1.kill()
