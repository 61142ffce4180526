"""A synthetic token source behind the real HTTP front end: FRONT-END CEILING MEASUREMENTS ONLY.

`synthetic_engine_main` stands in for `sglaunch.engine.engine_process.engine_main`: it runs the
real engine-process loop (`_EngineLoop`) over the real ZeroMQ channel (`_EngineChannel`), but the
engine behind it is fake: each step sleeps a fixed time (standing for the device step; the
process stays off the CPU, so on a small machine the front end gets the cores) and gives every
running request one token, drawn from a real text's token ids (so detokenization does real work),
with a log-probability, finishing with "length" at max_new_tokens. It is never a stand-in for
the engine in tests: it produces no model output.

Settings come from the environment (the spawned engine process inherits it):
  SGLAUNCH_SYNTH_STEP_MS      sleep per step (default 2.75: SmolLM2 at c=64 on the H200, session 7)
  SGLAUNCH_SYNTH_TOKENS       a JSON file holding a list of token ids to cycle through
  SGLAUNCH_SYNTH_MAX_RUNNING  batch cap (default 64)
"""

from __future__ import annotations

import json
import os
import time

from sglaunch.engine.interface import TokenOutput


class _Pool:
    num_pages = 1 << 20


class _Tp:
    size = 1


class SyntheticEngine:
    def __init__(self, step_s: float, tokens: list[int], max_running: int, context_length: int, config=None):
        from sglaunch.engine.scheduler import SchedulerLimits

        self.config = config  # the server's EngineConfig (the loop reads its stream_interval)
        self.step_s, self.tokens, self.max_running = step_s, tokens, max_running
        self.limits = SchedulerLimits(page_size=1, max_running_requests=max_running, chunked_prefill_size=None,
                                      context_length=context_length, eos_token_ids=())
        self.allocator, self.tp = _Pool(), _Tp()
        self.running: dict[str, list] = {}  # rid -> [prompt_tokens, max_new, produced, offset]
        self.waiting: list = []
        self.counters = {"steps": 0, "generated_tokens": 0, "finished_requests": 0}
        self._arrivals = 0

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add_request(self, request) -> list:
        self._arrivals += 1
        self.waiting.append([request.rid, len(request.input_ids), request.sampling.max_new_tokens,
                             0, (self._arrivals * 7919) % len(self.tokens)])
        return []

    def abort(self, rid: str):
        state = self.running.pop(rid, None)
        if state is None:
            for i, item in enumerate(self.waiting):
                if item[0] == rid:
                    state = self.waiting.pop(i)[1:]
                    break
        if state is None:
            return None
        return TokenOutput(rid, (), True, "abort", state[0], state[2], 0)

    def step(self) -> list:
        while self.waiting and len(self.running) < self.max_running:
            item = self.waiting.pop(0)
            self.running[item[0]] = item[1:]
        time.sleep(self.step_s)
        self.counters["steps"] += 1
        outputs, tokens, n = [], self.tokens, len(self.tokens)
        for rid, state in list(self.running.items()):
            token = tokens[(state[3] + state[2]) % n]
            state[2] += 1
            done = state[2] >= state[1]
            if done:
                del self.running[rid]
                self.counters["finished_requests"] += 1
            outputs.append(TokenOutput(rid, (token,), done, "length" if done else None, state[0], state[2], 0,
                                       None, (-0.5,)))
        self.counters["generated_tokens"] += len(outputs)
        return outputs

    def fail_running(self, exc) -> list:
        outputs = [TokenOutput(rid, (), True, "abort", s[0], s[2], 0, None, (), str(exc))
                   for rid, s in self.running.items()]
        self.running.clear()
        return outputs

    def flush_cache(self) -> dict:
        """/flush_cache: this engine keeps no prefix cache, so an idle one has nothing to free (the answer
        has LLMEngine.flush_cache's shape, so `sglaunch bench --flush-cache` runs against it too)."""
        if self.has_work:
            return {"flushed": False, "running": len(self.running), "waiting": len(self.waiting)}
        return {"flushed": True, "freed_pages": 0, "freed_tokens": 0, "free_pages": 0, "num_pages": 0}

    def keepalive(self) -> None:
        pass

    def live_stats(self) -> dict:
        return {"num_running_requests": len(self.running), "num_waiting_requests": len(self.waiting),
                **{f"total_{k}": v for k, v in self.counters.items()}}

    def static_info(self) -> dict:
        return {"engine": "synthetic (front-end ceiling measurement)"}


class _Cluster:
    def stop(self, engine) -> None:
        pass

    def fail(self, exc) -> None:
        raise exc


def synthetic_engine_main(config, endpoints, server_pid: int) -> None:
    """engine_main's shape, with SyntheticEngine in place of create_engine."""
    import signal

    from sglaunch.engine import engine_process, ipc

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: None)
    engine_process.watch_parent(server_pid)
    channel = engine_process._EngineChannel(endpoints)
    with open(os.environ["SGLAUNCH_SYNTH_TOKENS"]) as f:
        tokens = json.load(f)
    engine = SyntheticEngine(float(os.environ.get("SGLAUNCH_SYNTH_STEP_MS", "2.75")) / 1000, tokens,
                             int(os.environ.get("SGLAUNCH_SYNTH_MAX_RUNNING", "64")),
                             int(config.context_length or 4096), config)
    channel.send((ipc.READY, {"pid": os.getpid(), "static": engine.static_info(), "live": engine.live_stats(),
                              "limits": engine.limits, "num_pages": engine.allocator.num_pages}))
    engine_process._EngineLoop(engine, _Cluster(), channel).run()
    channel.send((ipc.STOPPED,))
    channel.close()
