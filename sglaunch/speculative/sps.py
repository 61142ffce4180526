"""Step-cost table: forward steps per second of the target at a given verify-batch size (tokens),
and optionally what the drafter's stage costs per step at a given number of requests.

File format (JSON; `sglaunch profile-sps` writes it):

    {"version": 1,
     "interpolation": "step",            # or "linear"; optional, default "step"
     "points": [{"tokens": 1, "steps_per_second": 95.0},
                {"tokens": 64, "steps_per_second": 90.1}, ...],
     "draft_points": [{"requests": 1, "seconds": 0.004}, ...],   # optional
     "decode_points": [{"requests": 1, "seconds": 0.002}, ...]}  # optional

Column form is accepted too: {"tokens": [1, 64, ...], "steps_per_second": [95.0, 90.1, ...]}.

A DSpark step pays the draft stage (block forward and sampling, for every speculating request)
whatever it then verifies, so the planner divides the expected committed tokens by the whole
step's time, `step_seconds(B, R) = 1 / SPS(B) + draft_seconds(R)` (vLLM's `draft_cost[num_reqs] +
verify_cost[tokens]`). Without draft points the draft term is 0: Theta = tau * SPS(B), the paper's
form, which prices every extra verify token against the target forward alone and so trims more
than it should where drafting is a large part of the step. draft_seconds(R): linear between the
profiled request counts, the nearest point outside them, non-decreasing (running maximum).

`decode_points` price the step DSpark takes when it steps aside: a plain decode step of R
requests (one token each, the decode graph, the plain sampler), looked up like the draft points.
Without them a plain step of B tokens costs 1 / SPS(B), the verify-shaped price.

Lookup of SPS(B) for B verify tokens:
- monotone forcing: points are sorted by tokens and SPS made non-increasing (running minimum):
  more tokens never run faster, so a noisy profile cannot make extra tokens look free;
- "step" (default): B runs as the smallest profiled size >= B (the captured graph tier it pads
  to), so the curve is a staircase;
- "linear": step *time* (1/SPS) interpolated linearly between neighbouring points;
- below the first point: the first point's SPS; above the last: step time extrapolated linearly
  from the last two points (slope >= 0).
Torch-free.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

INTERPOLATIONS = ("step", "linear")


@dataclass(frozen=True)
class SpsTable:
    tokens: tuple[int, ...]  # strictly increasing
    steps_per_second: tuple[float, ...]  # non-increasing after monotone forcing
    interpolation: str = "step"
    draft_requests: tuple[int, ...] = ()  # strictly increasing; empty: no draft term
    draft_seconds_at: tuple[float, ...] = ()  # non-decreasing after forcing
    decode_requests: tuple[int, ...] = ()  # strictly increasing; empty: plain steps priced by SPS
    decode_seconds_at: tuple[float, ...] = ()  # non-decreasing after forcing
    # step_seconds by (tokens, requests): the planner prices every candidate budget of every step,
    # hundreds of lookups at 64 requests (a fresh table, e.g. from dataclasses.replace, starts empty)
    _step_cache: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    # 1 / SPS(t) for t = 0 .. len - 1 as one numpy array (step_seconds_from), grown on demand
    _time_cache: list = field(default_factory=list, init=False, compare=False, repr=False)

    def with_draft_costs(self, points: dict[int, float]) -> SpsTable:
        """This table plus the draft stage's seconds per step by request count."""
        requests, seconds = _forced_request_points(points, "draft cost")
        return dataclasses.replace(self, draft_requests=requests, draft_seconds_at=seconds)

    def with_decode_costs(self, points: dict[int, float]) -> SpsTable:
        """This table plus a plain decode step's seconds by request count (the step-aside path)."""
        requests, seconds = _forced_request_points(points, "decode cost")
        return dataclasses.replace(self, decode_requests=requests, decode_seconds_at=seconds)

    def draft_seconds(self, requests: int) -> float:
        """The draft stage's seconds per step with `requests` speculating requests (0 without points)."""
        return _interpolate(self.draft_requests, self.draft_seconds_at, requests)

    def step_seconds(self, tokens: int, requests: int) -> float:
        """A whole DSpark step: the target's forward over `tokens` plus the draft stage for `requests`."""
        key = (tokens, requests)
        seconds = self._step_cache.get(key)
        if seconds is None:
            if len(self._step_cache) > 1 << 16:
                self._step_cache.clear()
            seconds = self._step_cache[key] = 1.0 / self.sps(tokens) + self.draft_seconds(requests)
        return seconds

    def step_seconds_from(self, tokens: int, count: int, requests: int):
        """step_seconds(tokens + k, requests) for k = 0 .. count - 1 as a float64 numpy array,
        each value exactly step_seconds' (the same float operations): the planner prices every
        candidate budget of a step at once."""
        import numpy as np

        end = tokens + count
        if not self._time_cache or len(self._time_cache[0]) < end:
            size = max(end, 2 * len(self._time_cache[0]) if self._time_cache else 64)
            self._time_cache[:] = [np.array([1.0 / self.sps(t) for t in range(size)], dtype=np.float64)]
        return self._time_cache[0][tokens:end] + self.draft_seconds(requests)

    def plain_step_seconds(self, requests: int, extra_tokens: int = 0) -> float:
        """The step DSpark takes when it steps aside: `requests` decodes of one token each (plus
        `extra_tokens` prefill rows in the same forward), no drafter."""
        if self.decode_requests and extra_tokens == 0:
            return _interpolate(self.decode_requests, self.decode_seconds_at, requests)
        return 1.0 / self.sps(extra_tokens + requests)

    @classmethod
    def from_points(cls, points: dict[int, float] | list[tuple[int, float]], interpolation: str = "step") -> SpsTable:
        """Sort, de-duplicate (the slowest measurement of a size wins), force monotone."""
        items = sorted(dict(points).items() if isinstance(points, dict) else points)
        if not items:
            raise ValueError("an SPS table needs at least one (tokens, steps_per_second) point")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"SPS interpolation {interpolation!r} is not one of {INTERPOLATIONS}")
        merged: dict[int, float] = {}
        for tokens, sps in items:
            if int(tokens) < 1 or not float(sps) > 0:
                raise ValueError(f"SPS point ({tokens}, {sps}) needs tokens >= 1 and steps_per_second > 0")
            merged[int(tokens)] = min(float(sps), merged.get(int(tokens), float("inf")))
        running, forced = float("inf"), []
        for tokens in sorted(merged):
            running = min(running, merged[tokens])
            forced.append(running)
        return cls(tuple(sorted(merged)), tuple(forced), interpolation)

    @property
    def prices_drafting(self) -> bool:
        """True when the table holds the draft stage's cost (so stepping aside can pay)."""
        return bool(self.draft_requests)

    def sps(self, tokens: int) -> float:
        """Steps per second at a verify batch of `tokens` tokens."""
        xs, ys = self.tokens, self.steps_per_second
        if tokens <= xs[0]:
            return ys[0]
        if tokens > xs[-1]:
            return 1.0 / self._extrapolated_time(tokens)
        i = bisect.bisect_left(xs, tokens)  # xs[i - 1] < tokens <= xs[i]
        if self.interpolation == "step" or xs[i] == tokens:
            return ys[i]
        t0, t1 = 1.0 / ys[i - 1], 1.0 / ys[i]
        frac = (tokens - xs[i - 1]) / (xs[i] - xs[i - 1])
        return 1.0 / (t0 + frac * (t1 - t0))

    def _extrapolated_time(self, tokens: int) -> float:
        xs, ys = self.tokens, self.steps_per_second
        if len(xs) == 1:
            return 1.0 / ys[0]
        slope = max(0.0, (1.0 / ys[-1] - 1.0 / ys[-2]) / (xs[-1] - xs[-2]))
        return 1.0 / ys[-1] + slope * (tokens - xs[-1])

    def to_json(self) -> dict:
        out = {"version": 1, "interpolation": self.interpolation,
               "points": [{"tokens": t, "steps_per_second": s} for t, s in zip(self.tokens, self.steps_per_second)]}
        if self.draft_requests:
            out["draft_points"] = [{"requests": r, "seconds": s} for r, s in zip(self.draft_requests, self.draft_seconds_at)]
        if self.decode_requests:
            out["decode_points"] = [{"requests": r, "seconds": s}
                                    for r, s in zip(self.decode_requests, self.decode_seconds_at)]
        return out


def _forced_request_points(points: dict[int, float], what: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Sorted request counts and their seconds, made non-decreasing (more requests never cost less)."""
    merged: dict[int, float] = {}
    for requests, seconds in sorted(points.items()):
        if int(requests) < 1 or not float(seconds) >= 0:
            raise ValueError(f"{what} point ({requests}, {seconds}) needs requests >= 1 and seconds >= 0")
        merged[int(requests)] = max(float(seconds), merged.get(int(requests), 0.0))
    running, forced = 0.0, []
    for requests in sorted(merged):
        running = max(running, merged[requests])
        forced.append(running)
    return tuple(sorted(merged)), tuple(forced)


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], requests: int) -> float:
    """Linear between the points, the nearest point outside them, 0 without points."""
    if not xs:
        return 0.0
    if requests <= xs[0]:
        return ys[0]
    if requests >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_left(xs, requests)
    if xs[i] == requests:
        return ys[i]
    frac = (requests - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + frac * (ys[i] - ys[i - 1])


def load_sps_table(path: str | Path) -> SpsTable:
    """Read an SPS table file (format in the module docstring); ValueError naming the problem."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"SPS table {path} does not exist; profile one with `sglaunch profile-sps`") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"SPS table {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"SPS table {path}: expected a JSON object with 'points'")
    interpolation = data.get("interpolation", "step")
    if "points" in data:
        try:
            points = [(int(p["tokens"]), float(p["steps_per_second"])) for p in data["points"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"SPS table {path}: every entry of 'points' needs 'tokens' and 'steps_per_second'") from None
    elif "tokens" in data and "steps_per_second" in data:
        if len(data["tokens"]) != len(data["steps_per_second"]):
            raise ValueError(f"SPS table {path}: 'tokens' and 'steps_per_second' differ in length")
        points = list(zip(map(int, data["tokens"]), map(float, data["steps_per_second"])))
    else:
        raise ValueError(f"SPS table {path}: needs 'points' (or 'tokens' + 'steps_per_second' columns)")
    draft_points = _request_points(data, "draft_points", path)
    decode_points = _request_points(data, "decode_points", path)
    try:
        table = SpsTable.from_points(points, interpolation)
        table = table.with_draft_costs(draft_points) if draft_points else table
        return table.with_decode_costs(decode_points) if decode_points else table
    except ValueError as exc:
        raise ValueError(f"SPS table {path}: {exc}") from None


def _request_points(data: dict, key: str, path: Path) -> dict[int, float]:
    entries = data.get(key, [])
    if not isinstance(entries, list):
        raise ValueError(f"SPS table {path}: '{key}' must be a list of {{'requests', 'seconds'}} objects")
    try:
        return {int(p["requests"]): float(p["seconds"]) for p in entries}
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"SPS table {path}: every entry of '{key}' needs 'requests' and 'seconds'") from None


def save_sps_table(table: SpsTable, path: str | Path) -> None:
    Path(path).write_text(json.dumps(table.to_json(), indent=1) + "\n")
