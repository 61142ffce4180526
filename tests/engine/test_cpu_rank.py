"""A CPU rank's thread flushes denormals, its intra-op workers too, and no other thread changes."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from sglaunch.engine.model_runner import configure_cpu_rank


def nonzero_after_multiply() -> int:
    """A denormal times one, over enough elements that the intra-op workers take part."""
    return int((torch.full((1 << 22,), 1e-40) * 1.0).count_nonzero())


def test_cpu_rank_thread_flushes_denormals_and_leaves_other_threads_alone():
    threads = torch.get_num_threads()
    seen = {}

    def rank_thread():
        configure_cpu_rank(1)
        seen["rank"] = nonzero_after_multiply()

    def other_thread():  # denormals kept here (whatever earlier tests did to the main thread)
        torch.set_flush_denormal(False)
        rank = threading.Thread(target=rank_thread)
        rank.start()
        rank.join()
        seen["other"] = nonzero_after_multiply()

    try:
        other = threading.Thread(target=other_thread)
        other.start()
        other.join()
    finally:
        torch.set_num_threads(threads)
    assert seen["rank"] == 0, f"{seen['rank']} denormal results survived in the rank's thread"
    assert seen["other"] == 1 << 22, "configuring the rank changed the thread that started it"


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_cpu_rank_threads_follow_the_cpus_the_process_may_use(monkeypatch):
    """A rank under `taskset` or a container's cpuset splits the CPUs it may run on, not the
    host's: more threads than those CPUs only oversubscribe them."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    try:
        configure_cpu_rank(2)
        assert torch.get_num_threads() == 2
        configure_cpu_rank(8)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
