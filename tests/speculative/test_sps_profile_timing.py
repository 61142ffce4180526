"""How many times the start-up profile runs each step (sps_profile._median_seconds): every size
warmup + repeats times, except with ProfilePlan.long_step_s, where a step whose first timed run is
that long gets one warm-up and at most 3 timed runs (a slow CPU's large verify: session 26)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglaunch.speculative import sps_profile
from sglaunch.speculative.sps_profile import ProfilePlan, _median_seconds


class Clock:
    """A fake perf_counter: each run() of the step moves it on by the next of `durations`."""

    def __init__(self, durations):
        self.now, self.durations, self.runs = 0.0, list(durations), 0

    def perf_counter(self) -> float:
        return self.now

    def run(self) -> None:
        self.now += self.durations[self.runs]
        self.runs += 1


CPU_ENGINE = SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type="cpu")))


def timed(durations, monkeypatch, **plan) -> tuple[float, int]:
    clock = Clock(durations)
    monkeypatch.setattr(sps_profile.time, "perf_counter", clock.perf_counter)
    seconds = _median_seconds(CPU_ENGINE, ProfilePlan((8,), **plan), clock.run)
    return seconds, clock.runs


@pytest.mark.parametrize("long_step_s", [None, 0.5])
def test_short_steps_run_warmup_plus_repeats(long_step_s, monkeypatch):
    # a slow first run (compiling a shape) does not count as a long step: the second decides
    durations = [3.0, 0.010, 0.012, 0.011, 0.050, 0.013, 9.9]
    seconds, runs = timed(durations, monkeypatch, repeats=5, warmup=2, long_step_s=long_step_s)
    assert runs == 7
    assert seconds == pytest.approx(0.013)  # the median of the five after two warm-ups


def test_long_steps_run_one_warmup_and_three_timed(monkeypatch):
    durations = [12.0, 9.0, 9.4, 8.8, 99.0, 99.0, 99.0]
    seconds, runs = timed(durations, monkeypatch, repeats=5, warmup=2, long_step_s=0.5)
    assert runs == 4
    assert seconds == pytest.approx(9.0)  # the median of 9.0, 9.4 and 8.8: the second run counts


def test_without_the_threshold_long_steps_keep_every_run(monkeypatch):
    # `sglaunch profile-sps` sets no threshold: the runs asked for are the runs made
    durations = [12.0, 9.0, 9.4, 8.8, 9.1, 9.2, 9.3]
    seconds, runs = timed(durations, monkeypatch, repeats=5, warmup=2)
    assert runs == 7
    assert seconds == pytest.approx(9.2)


def test_fewer_repeats_than_three_are_kept(monkeypatch):
    seconds, runs = timed([5.0, 2.0, 2.2, 99.0], monkeypatch, repeats=2, warmup=2, long_step_s=0.5)
    assert runs == 3
    assert seconds == pytest.approx(2.1)


def test_no_warmup_asked_is_not_shortened(monkeypatch):
    seconds, runs = timed([2.0, 2.0, 2.0], monkeypatch, repeats=3, warmup=0, long_step_s=0.5)
    assert runs == 3
    assert seconds == pytest.approx(2.0)
