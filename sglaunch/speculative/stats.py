"""Speculative-decoding statistics: accept lengths, verify tokens per step, draft/verify time.

"Accept length" counts the committed tokens of one request in one step, the bonus/correction
token included (1 .. block_size + 1), as the DSpark paper reports it. Torch-free.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence


class SpecStats:
    """Running totals; `record_step` once per verify step, `to_dict` for /server_info."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._lock = threading.Lock()
        self.accept_length_hist = [0] * (block_size + 2)  # index = accept length (0 unused)
        self.steps = 0
        self.request_steps = 0
        self.committed_tokens = 0
        self.verify_tokens = 0
        self.drafted_tokens = 0
        self.draft_seconds = 0.0
        self.verify_seconds = 0.0
        self.step_aside_steps = 0  # steps where drafting did not pay: plain decodes, no drafter
        self.step_aside_request_steps = 0
        self.second_chains = 0  # request-steps that also verified a runner-up chain (SGLAUNCH_DSPARK_SECOND_CHAIN)
        self.second_chain_wins = 0  # ...whose committed tokens came from it

    def record_step(self, accept_lengths: Sequence[int], verify_tokens: int, draft_seconds: float = 0.0,
                    verify_seconds: float = 0.0) -> None:
        """accept_lengths: committed tokens per request (accepted drafts + 1); verify_tokens: rows the
        target computed for speculative requests this step (anchors included)."""
        with self._lock:
            for length in accept_lengths:
                self.accept_length_hist[max(0, min(int(length), self.block_size + 1))] += 1
            self.steps += 1
            self.request_steps += len(accept_lengths)
            self.committed_tokens += int(sum(accept_lengths))
            self.verify_tokens += int(verify_tokens)
            self.drafted_tokens += len(accept_lengths) * self.block_size
            self.draft_seconds += draft_seconds
            self.verify_seconds += verify_seconds

    def record_step_aside(self, requests: int) -> None:
        """A step whose decoding requests took the plain path (the planner found drafting would not pay)."""
        with self._lock:
            self.step_aside_steps += 1
            self.step_aside_request_steps += int(requests)

    def record_second_chains(self, chains: int, wins: int) -> None:
        """A step's request-steps that verified a second chain, and how many of them it won."""
        with self._lock:
            self.second_chains += int(chains)
            self.second_chain_wins += int(wins)

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            per_req = max(1, self.request_steps)
            per_step = max(1, self.steps)
            return {
                "block_size": self.block_size,
                "steps": self.steps,
                "request_steps": self.request_steps,
                "committed_tokens": self.committed_tokens,
                "verify_tokens": self.verify_tokens,
                "mean_accept_length": self.committed_tokens / per_req if self.request_steps else 0.0,
                "accept_length_histogram": {str(k): v for k, v in enumerate(self.accept_length_hist) if k >= 1},
                "verify_tokens_per_step": self.verify_tokens / per_step if self.steps else 0.0,
                "verify_tokens_per_request_step": self.verify_tokens / per_req if self.request_steps else 0.0,
                "draft_acceptance_rate": (self.committed_tokens - self.request_steps) / max(1, self.drafted_tokens),
                "draft_time_s": self.draft_seconds,
                "verify_time_s": self.verify_seconds,
                "mean_draft_ms": 1e3 * self.draft_seconds / per_step if self.steps else 0.0,
                "mean_verify_ms": 1e3 * self.verify_seconds / per_step if self.steps else 0.0,
                "step_aside_steps": self.step_aside_steps,
                "step_aside_request_steps": self.step_aside_request_steps,
                "step_aside_fraction": self.step_aside_steps / max(1, self.steps + self.step_aside_steps),
                "second_chains": self.second_chains,
                "second_chain_wins": self.second_chain_wins,
            }

    def prometheus_samples(self, prefix: str = "sglaunch_spec_") -> list[tuple[str, str, str, float, dict]]:
        """(name, type, help, value, labels) rows: monotonically increasing counters plus the
        histogram as cumulative `le` buckets, ready for prometheus_client or a text exposition."""
        with self._lock:
            rows = [
                (prefix + "steps_total", "counter", "Speculative verify steps.", self.steps, {}),
                (prefix + "request_steps_total", "counter", "Request-steps verified.", self.request_steps, {}),
                (prefix + "committed_tokens_total", "counter", "Tokens committed by speculative steps (bonus included).",
                 self.committed_tokens, {}),
                (prefix + "verify_tokens_total", "counter", "Target rows computed for verification.",
                 self.verify_tokens, {}),
                (prefix + "draft_seconds_total", "counter", "Time spent drafting.", self.draft_seconds, {}),
                (prefix + "verify_seconds_total", "counter", "Time spent verifying.", self.verify_seconds, {}),
                (prefix + "step_aside_steps_total", "counter", "Decode steps that drafted nothing (drafting would "
                 "not pay at that load).", self.step_aside_steps, {}),
                (prefix + "second_chains_total", "counter", "Request-steps that also verified a runner-up chain.",
                 self.second_chains, {}),
                (prefix + "second_chain_wins_total", "counter", "Request-steps whose tokens came from the runner-up "
                 "chain.", self.second_chain_wins, {}),
            ]
            cumulative = 0
            for length in range(1, self.block_size + 2):
                cumulative += self.accept_length_hist[length]
                rows.append((prefix + "accept_length_bucket", "histogram", "Accept length per request-step.",
                             cumulative, {"le": str(length)}))
            rows.append((prefix + "accept_length_bucket", "histogram", "Accept length per request-step.",
                         cumulative, {"le": "+Inf"}))
            rows.append((prefix + "accept_length_sum", "histogram", "", self.committed_tokens, {}))
            rows.append((prefix + "accept_length_count", "histogram", "", self.request_steps, {}))
            return rows

    def log_line(self) -> str:
        d = self.to_dict()
        return (f"spec: accept len {d['mean_accept_length']:.2f}, verify tok/step {d['verify_tokens_per_step']:.1f}, "
                f"draft {d['mean_draft_ms']:.1f} ms, verify {d['mean_verify_ms']:.1f} ms, "
                f"stepped aside {d['step_aside_steps']} of {d['steps'] + d['step_aside_steps']} steps "
                f"({100 * d['step_aside_fraction']:.0f}%)"
                + (f", second chain won {d['second_chain_wins']} of {d['second_chains']}" if d["second_chains"] else ""))
