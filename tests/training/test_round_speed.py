"""What keeps a drafter round's GPU time useful: generation hands the engine its requests in
waves (so most steps stay decode-only, CUDA-graph replays), and --train-minutes refits its step
count as the real speed shows (session 8's rounds calibrated while the baseline evaluation
shared the GPU and left 40% of the training budget unused). No torch, no model."""

from __future__ import annotations

import time
from types import SimpleNamespace

from sglaunch.training import data
from sglaunch.training.trainer import Trainer


class FakeEngine:
    """Each admitted request decodes one token a step and finishes after 10-32 tokens (by its
    number); a step that admits requests counts as a mixed (eager) step."""

    def __init__(self, cap: int):
        self.cap = cap
        self.waiting, self.running = [], {}
        self.mixed = self.steps = self.peak = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request):
        self.waiting.append(request.rid)
        return []

    def step(self):
        admitted = False
        while self.waiting and len(self.running) < self.cap:
            self.running[self.waiting.pop(0)] = 0
            admitted = True
        self.steps += 1
        self.mixed += admitted
        self.peak = max(self.peak, len(self.running) + len(self.waiting))
        out = []
        for rid in list(self.running):
            self.running[rid] += 1
            done = self.running[rid] >= 10 + int(rid[1:]) * 7 % 23
            out.append(SimpleNamespace(rid=rid, new_token_ids=(7,), finished=done))
            if done:
                del self.running[rid]
        return out


def _requests(n: int):
    reqs = [SimpleNamespace(rid=f"p{i}") for i in range(n)]
    prompts = [data.Prompt([1, 2, 3], "chat", i + 1) for i in range(n)]
    return reqs, prompts


def test_generation_admits_in_waves_and_finishes_everything():
    reqs, prompts = _requests(200)
    waves = FakeEngine(cap=32)
    samples = data._run_until(waves, reqs, prompts, time.monotonic() + 60, 1, running=32)
    assert len(samples) == 200 and [len(s.response) for s in samples] == [10 + i * 7 % 23 for i in range(200)]
    assert waves.peak <= 32  # never more handed over than the engine runs
    queued = FakeEngine(cap=32)  # the old way: everything queued at once
    data._run_until(queued, reqs, prompts, time.monotonic() + 60, 1)
    assert waves.mixed * 1.8 < queued.mixed  # fewer steps that admit (eager) than queued all at once
    assert waves.steps < 1.15 * queued.steps  # at little cost in steps
    big = FakeEngine(cap=32)
    data._run_until(big, reqs, prompts, time.monotonic() + 60, 1, running=32, wave=12)
    assert big.mixed * 4 < queued.mixed and big.steps < 1.3 * queued.steps


def test_generation_waves_stop_at_the_deadline():
    reqs, prompts = _requests(50)
    assert data._run_until(FakeEngine(cap=8), reqs, prompts, time.monotonic() - 1, 1, running=8) == []


def test_train_minutes_refit_follows_the_real_speed():
    said = []
    fake = SimpleNamespace(args=SimpleNamespace(train_minutes=1.0), fit_at=(25, 10.0), step=75, total_steps=150,
                           agree=lambda v, op="max": v, say=said.append)
    Trainer.refit_steps_to_budget(fake, 20.0)  # 50 steps in 10 s: 5 steps/s for the 40 s left
    assert fake.total_steps == 75 + 200 and fake.fit_at == (75, 20.0) and said
    fake.step = 80
    Trainer.refit_steps_to_budget(fake, 55.0)  # the last 15% of the budget: no refit
    assert fake.total_steps == 275 and fake.fit_at == (75, 20.0)
