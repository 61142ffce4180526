"""How many drafted tokens each request verifies [DSpark §3.2.2, Algorithm 1; production §5.2].

Survival a_{r,j} = prod_{i<=j} c_{r,i} of calibrated confidences; a verify batch of B tokens
(each request's anchor plus its window) over R requests is worth Theta = tau / step_seconds(B, R),
tau = sum_r (1 + sum_{j < window_r} a_{r,j}) expected committed tokens, step_seconds = 1 / SPS(B)
plus the draft stage's cost for R requests when the table has one (sps.py); without it, the
paper's Theta = tau * SPS(B).

- `greedy_admission`: the paper's Algorithm 1. Admit candidates by survival, stop at the FIRST
  non-improvement of Theta, so no admission looks at a draft's own value through later
  survivals (App. A).
- Production form (`DSparkPlanner`): the batch budget K comes from an unconstrained argmax of
  Theta over confidences lagged N steps (default 2), so it cannot depend on the current drafts;
  then each request gets its share of a top-K by *current* survival, ties broken by position
  then request (value-independent). Windows are prefixes because survival is non-increasing.
- Without an SPS table nothing is trimmed: every request verifies its whole block.
- Stepping aside (`plan_drafts`, compact and cap-accept with a table that prices the draft
  stage): before anything is drafted, the best Theta over k is compared with a plain decode
  step's R / plain_step_seconds(R) (no drafter at all). When drafting is not expected to beat
  plain decoding by MIN_DRAFT_GAIN, the step drafts nothing: the engine runs its requests as
  plain decodes and the drafter does not run. Requests with no lagged survivals are priced at
  the engine's running mean survival (1.0 before any step), so a stream of new requests cannot
  keep a loaded engine drafting on an optimistic guess. A step that steps aside observes nothing
  but still advances the lag, so `lag` such steps later a request is priced at the running mean
  again (and drafts, if that pays): stale survivals of one bad patch cannot keep it aside.
  The table's step times are scaled by what engine steps of each kind really took
  (`StepCostCalibration`): the table sees the target forward, DSpark's work and a plain decode,
  not the rest of an engine step (on an H200, 2026-12-01, it priced a DSpark step 14-35% low);
  steps where some row samples at T > 0 have scales of their own (their eager sampling and
  accept cost several times the greedy steps' host work).
- Confidences checked against outcomes (`AcceptCalibration`): the survivals a drafting step
  predicted for the slots it verified are compared, slot by slot, with what the target accepted,
  and every price (lagged rows, the prior, a burst's accept estimate) uses the survivals scaled by
  that running ratio, once it is clearly off 1 (`CALIBRATION_TOLERANCE`: the verified drafts are
  the ones the drafter was surest of, so a sound drafter reads a little under 1 there). A drafter
  whose confidences do not know this target or this traffic (session 18: the bundled drafter on
  random target weights, accept 1.00, drafted 22% of its steps at 64 requests and served 0.87x of
  plain) is then priced at what it really commits. While it steps
  aside nothing is learnt, so the ratio drifts back toward 1 (`EXPLORE_DRIFT`): a bad patch cannot
  keep a good drafter aside for good.
- Graph tiers (`align_to_tier`, --speculative-dspark-align-verify-tokens-to-graph-tier): the
  target's verify CUDA graph is keyed on the step's TOTAL tokens rounded up to a captured tier,
  so the rows between the planned total and that tier run anyway as padding. Rounding the
  budget up to the tier turns them into the next-best drafts by survival instead.

Host parts are torch-free; `DSparkPlanner.allocate` runs on the device (kernels.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Sequence

from sglaunch.speculative.sps import SpsTable

DEFAULT_LAG_STEPS = 2
# NOTE: drafting must be expected to commit this much more per second than a plain step, since
# the profile leaves out some host work of a DSpark step (the longer step input, the commit)
MIN_DRAFT_GAIN = 1.05
# The prior (unknown requests' survival row) is a running mean weighted by request-steps: an
# observed step of R rows (a burst: R x iterations) weighs R; the old mean keeps at most
# PRIOR_WINDOW of weight, so older steps fade. NOTE: weighted by rows, not one step one vote:
# a few requests (a bench's warm-up, one easy prompt bursting alone) cannot set the price of the
# next wave of 64 (session 11: two warm-up requests left a prior accept of 5.83; the first wave
# drafted 180 tokens a step at 64 requests).
PRIOR_WINDOW = 512
# a drafter's own measured survivals (its bundle's eval.json) start the prior at this weight
PRIOR_START_WEIGHT = 256
# AcceptCalibration: request-slots of "as predicted" before any outcome; the predicted survival mass a
# slot keeps (older outcomes fade); the largest factor (an underconfident drafter's)
CALIBRATION_START_WEIGHT = 16.0
CALIBRATION_WINDOW = 2048.0
CALIBRATION_MAX = 2.0
# ratios within this factor of 1 count as 1, and the rest move by it: the windows verified are the
# drafts the drafter was surest of, so even a well-calibrated drafter reads a little under 1 there
# (the oracle drafter of tests/dspark: 0.90-0.97), and that alone must not trim its windows
CALIBRATION_TOLERANCE = 0.75
# stepped-aside steps between two moves of the ratio back toward 1, and how far each move goes
# (a quarter of the gap: from 0 to 0.5 of the way in about 2.4 x 256 steps, under a second on an H200)
EXPLORE_EVERY = 256
EXPLORE_DRIFT = 0.25
# a drafter whose first slot the target accepts at under this fraction of what its confidences
# predict is failing this traffic (drafter_failing): stepped-aside steps may then skip its context
# at any batch size, not only past a burst's (the engine's context skip)
FAILING_FACTOR = 0.5
# ... or whose own confidences, as priced, expect under this accept length (bonus included) once
# they have been observed: its planner steps aside everywhere, so no outcome ever calibrates it
# (H100, session 22: the bundled drafter on random target weights priced 1.00 with every factor at 1)
FAILING_ACCEPT = 1.2


CHAIN_DECAY = 0.9  # per chained step: the second chains' running rows and gains (DSparkPlanner.observe_chains)


def theta(tau: float, batch_tokens: int, sps: SpsTable, requests: int = 1) -> float:
    """Expected committed tokens per second of a step verifying `batch_tokens` for `requests`."""
    return tau / sps.step_seconds(batch_tokens, requests)


def greedy_admission(survivals: Sequence[Sequence[float]], sps: SpsTable | None, extra_tokens: int = 0) -> list[int]:
    """Algorithm 1 -> windows [R] (draft tokens to verify per request). `extra_tokens`: other
    tokens in the same forward (prefill chunks) that cost time but add nothing to tau."""
    R = len(survivals)
    if sps is None:
        return [len(row) for row in survivals]
    candidates = sorted(((-a, j, r) for r, row in enumerate(survivals) for j, a in enumerate(row) if a > 0))
    windows, batch, tau = [0] * R, extra_tokens + R, float(R)
    best = theta(tau, batch, sps, R)
    for neg_a, j, r in candidates:
        if j != windows[r]:  # NOTE: cannot happen for non-increasing rows; keeps prefixes regardless
            break
        trial = theta(tau - neg_a, batch + 1, sps, R)
        if trial <= best:
            break  # first non-improvement: stop (non-anticipating)
        windows[r], batch, tau, best = j + 1, batch + 1, tau - neg_a, trial
    return windows


def choose_budget(lagged_survivals: Iterable[float], num_requests: int, sps: SpsTable | None,
                  extra_tokens: int = 0, committed_extra: int = 0) -> int:
    """Total draft tokens K to verify: argmax_k tau(k) / step_seconds(extra + R + k, R) over the k
    best lagged survivals (smallest k among equal maxima). Without a table: all of them.
    committed_extra: tokens the step commits besides the R requests' (_argmax_theta)."""
    values = _descending(lagged_survivals)
    if sps is None:
        return len(values)
    return _argmax_theta(values, num_requests, sps, extra_tokens, committed_extra)[0]


def best_budget(lagged_survivals: Iterable[float], num_requests: int, sps: SpsTable,
                extra_tokens: int = 0, committed_extra: int = 0) -> tuple[int, float]:
    """(K, Theta(K)): choose_budget's K and the committed tokens per second it is expected to give."""
    return _argmax_theta(_descending(lagged_survivals), num_requests, sps, extra_tokens, committed_extra)


SMALL = 48  # candidates up to which plain Python beats numpy's per-call overhead (dev CPU)


def _descending(values):
    """Survivals (any iterable, or a numpy array) -> largest first: a list when there are few
    (at most SMALL), else a float64 numpy array. Either way the same values in the same order."""
    import numpy as np

    if not isinstance(values, np.ndarray):
        values = list(values)
        if len(values) <= SMALL:
            return sorted((float(a) for a in values), reverse=True)
        values = np.asarray(values, dtype=np.float64)
    if values.size <= SMALL:
        return sorted(values.ravel().tolist(), reverse=True)
    return -np.sort(-values.astype(np.float64, copy=False).ravel())


def _argmax_theta(values, num_requests: int, sps: SpsTable, extra_tokens: int,
                  committed_extra: int = 0) -> tuple[int, float]:
    """Over k = 0 .. len(values): tau(k) = C + R + the k largest survivals (added in that order),
    Theta(k) = tau(k) / step_seconds(extra + R + k, R); -> (the first k of the largest Theta, it).
    C (committed_extra): the tokens the step's other rows commit whatever is drafted (decodes that
    do not speculate, a prefill chunk that ends its prompt). NOTE: without it, a few candidates in
    a wide batch were priced as if alone: their drafts looked worth a verify of the whole batch
    (H200, session 14: with most of a batch of 64 unable to draft, 17% of steps drafted, 0.785x).
    NOTE: above SMALL candidates vectorised (one numpy pass): at 64 requests of 7 drafts the
    Python loop took 0.2 ms on the dev CPU every step, stepping aside included. Both ways do the
    same float operations in the same order, so they agree exactly."""
    if isinstance(values, list):
        base = extra_tokens + num_requests
        tau = float(committed_extra + num_requests)
        best_k, best = 0, tau / sps.step_seconds(base, num_requests)
        for k, a in enumerate(values, start=1):
            tau += a
            rate = tau / sps.step_seconds(base + k, num_requests)
            if rate > best:
                best_k, best = k, rate
        return best_k, best
    import numpy as np

    tau = np.cumsum(np.concatenate(([float(committed_extra + num_requests)], values)))  # sequential: the loop's sums
    rates = tau / sps.step_seconds_from(extra_tokens + num_requests, len(tau), num_requests)
    k = int(np.argmax(rates))  # NOTE: the first maximum: the smallest k among equal ones
    return k, float(rates[k])


def plain_rate(num_requests: int, sps: SpsTable, extra_tokens: int = 0, committed_extra: int = 0) -> float:
    """Committed tokens per second of a plain step: one token per request (and committed_extra
    from the other rows), no drafter."""
    return (committed_extra + num_requests) / sps.plain_step_seconds(num_requests, extra_tokens)


def drafting_pays(lagged_survivals: Iterable[float], num_requests: int, sps: SpsTable, extra_tokens: int = 0,
                  min_gain: float = MIN_DRAFT_GAIN, draft_scale: float = 1.0, plain_scale: float = 1.0,
                  committed_extra: float = 0, chain: tuple[int, float] = (0, 0.0)) -> int | None:
    """The budget K when drafting is expected to beat a plain step by `min_gain`, else None
    (step aside: verify nothing, run no drafter). A budget of 0 always steps aside; the rate
    comparison needs a table that prices the draft stage (without it drafting looks free).
    draft_scale / plain_scale: measured over modelled step time of each kind of step.
    committed_extra: tokens the other rows commit either way (_argmax_theta). chain: (rows, tokens)
    the step's second chains add to the drafting side only (DSparkPlanner.chain_terms)."""
    k, rate = best_budget(lagged_survivals, num_requests, sps, extra_tokens + chain[0], committed_extra + chain[1])
    plain = plain_rate(num_requests, sps, extra_tokens, committed_extra)
    return _paying(k, rate, plain, sps, min_gain, draft_scale, plain_scale)


def _paying(k: int, rate: float, plain: float, sps: SpsTable, min_gain: float, draft_scale: float,
            plain_scale: float) -> int | None:
    """drafting_pays's decision from best_budget's (K, Theta(K)) and plain_rate's rate."""
    if k == 0:
        return None
    if sps.prices_drafting and rate / draft_scale < min_gain * (plain / plain_scale):
        return None
    return k


class StepCostCalibration:
    """Measured engine step time over the table's step time, per kind of step ("draft": a DSpark
    step, "plain": a stepped-aside one) and per class (greedy: every row that samples is greedy;
    sampled: some row samples at T > 0), as a running mean. The table prices the target forward,
    DSpark's own work and a plain decode, all timed greedily; the rest of an engine step (step
    input, commit, outputs, the host work that grows with the tokens committed) it does not see,
    and that part differs between the two kinds, and far more between the two classes: a sampled
    step filters the target's rows, draws from them and accepts eagerly (session 31, H100, c=1:
    about 7.8 ms between a DSpark stream's chunks at T=0.7, against about 1.7 ms at T=0). Each
    scale learns only from steps of its own kind and class.

    A greedy step over OUTLIER times its modelled time, or a sampled one over OUTLIER times its
    scale (a lazy drafter-graph capture, a GC pause), is no steady-state cost and teaches
    nothing. For the sampled class, OUTLIER_RUN of them in a row of
    one kind are: the table never timed a sampled step, so a cost far over it is what such steps
    take (before session 32 every sampled DSpark step at 4-5x its model was left out as a stall,
    so their scale never moved); the scale jumps to the least of them. The greedy class keeps
    the plain rule: the start-up profile timed steps like its own."""

    DECAY = 0.9
    OUTLIER = 3.0  # NOTE: a step over 3x its model (greedy) or its scale (sampled) is a stall, not a cost
    #                (a capture once locked a c=1 run aside)
    OUTLIER_RUN = 3
    RELAX = 0.02  # per step of the other kind (same class), a scale moves this far back toward the table's 1.0
    KINDS = ("draft", "plain")

    def __init__(self):
        self.scales = {(kind, sampled): 1.0 for kind in self.KINDS for sampled in (False, True)}
        self._runs: dict[tuple[str, bool], list[float]] = {key: [] for key in self.scales}  # sampled keys only
        # (kind, modelled seconds, sampled) of the planned step
        self.pending: tuple[str, float, bool] | None = None

    @property
    def scale(self) -> dict[str, float]:
        """The greedy class's scales by kind (bursts, the start-up figures)."""
        return self.scale_for(False)

    def scale_for(self, sampled: bool) -> dict[str, float]:
        return {kind: self.scales[(kind, sampled)] for kind in self.KINDS}

    def to_dict(self) -> dict[str, float]:
        """For /server_info: draft, plain (greedy steps), draft_sampled, plain_sampled."""
        return {kind + ("_sampled" if sampled else ""): value for (kind, sampled), value in self.scales.items()}

    def expect(self, kind: str, seconds: float, sampled: bool = False) -> None:
        self.pending = (kind, seconds, sampled)

    def observe(self, seconds: float) -> None:
        """The planned step took `seconds` (host wall time, which waits for its read-backs). The
        kind not taken (of the same class) relaxes toward the table, so a correction it no longer
        sees cannot keep the planner from trying that kind again."""
        if self.pending is None or self.pending[1] <= 0:
            return
        kind, modelled, sampled = self.pending
        self.pending = None
        other = ("plain" if kind == "draft" else "draft", sampled)
        self.scales[other] += self.RELAX * (1.0 - self.scales[other])
        key, ratio = (kind, sampled), seconds / modelled
        run = self._runs[key]
        if not sampled and ratio > self.OUTLIER:  # NOTE: the greedy class: as before session 32
            return
        if ratio > self.OUTLIER * self.scales[key]:
            run.append(ratio)
            if len(run) < self.OUTLIER_RUN:
                return
            self.scales[key] = min(run)
            run.clear()
            return
        run.clear()
        ratio = max(ratio, 1.0 / self.OUTLIER)
        self.scales[key] = self.DECAY * self.scales[key] + (1 - self.DECAY) * ratio


def align_to_tier(budget: int, fixed_tokens: int, max_budget: int, tiers: Sequence[int]) -> int:
    """The budget K rounded up so that fixed_tokens + K (the step's verify tokens: prefill rows,
    one anchor per request, then the drafts) fills the smallest captured tier >= it, never over
    max_budget (drafts that exist). A budget of 0 stays 0: such a step replays a decode graph."""
    budget = min(budget, max_budget)
    if budget <= 0:
        return budget
    tier = min((t for t in tiers if t >= fixed_tokens + budget), default=None)
    return budget if tier is None else min(tier - fixed_tokens, max_budget)


class ConfidenceRelay:
    """Per-request survivals of past steps, served `lag` steps later by request identity.

    push() once per step with that step's request ids and survival rows (host lists or tensors
    whose device->host copy was started non-blocking); lagged() returns, for the given ids, the
    rows pushed `lag` steps ago, or [1.0] * G (verify all) for requests unknown then (new,
    recycled, or not decoding at that step)."""

    def __init__(self, block_size: int, lag: int = DEFAULT_LAG_STEPS):
        if lag < 1:
            raise ValueError("the confidence lag must be >= 1 step; the budget may not see the current draft")
        self.block_size, self.lag = block_size, lag
        self.history: deque[dict[Any, list[float]] | tuple[list, Any]] = deque(maxlen=lag)

    def push(self, request_ids: Sequence[Any], survival_rows: Any) -> None:
        self.history.append((list(request_ids), survival_rows))

    def lagged(self, request_ids: Sequence[Any], default: Sequence[float] | None = None) -> list[list[float]]:
        """default: the row of a request unknown `lag` steps ago ([1.0] * G when not given)."""
        old = self._materialise(0) if len(self.history) == self.lag else {}
        fallback = list(default) if default is not None else [1.0] * self.block_size
        return [old.get(rid, fallback) for rid in request_ids]

    def lagged_values(self, request_ids: Sequence[Any], default: Sequence[float] | None = None):
        """lagged()'s rows flat, as one float64 numpy array [R * G] (what the budget ranks)."""
        import numpy as np

        old = self._materialise(0) if len(self.history) == self.lag else {}
        fallback = list(default) if default is not None else [1.0] * self.block_size
        if len(request_ids) * self.block_size <= SMALL:  # NOTE: few: a list is cheaper (see _descending)
            return [a for rid in request_ids for a in old.get(rid, fallback)]
        if not old:  # NOTE: e.g. every step of a stepping-aside streak: no Python loop over requests
            return np.tile(np.asarray(fallback, dtype=np.float64), len(request_ids))
        return np.array([old.get(rid, fallback) for rid in request_ids], dtype=np.float64).reshape(-1)

    def has_lagged(self) -> bool:
        """Whether any request has survivals of its own `lag` steps back (else lagged() gives
        every request the default row)."""
        return len(self.history) == self.lag and bool(self._materialise(0))

    def knows_all(self, request_ids: Sequence[Any]) -> bool:
        """Whether lagged() has a row of its own for every one of these requests."""
        if len(self.history) != self.lag:
            return False
        old = self._materialise(0)
        return all(rid in old for rid in request_ids)

    def forget(self, request_id: Any) -> None:
        """A finished request's id may be reused: drop its rows so a newcomer starts at survival 1."""
        for i in range(len(self.history)):
            self._materialise(i).pop(request_id, None)

    def _materialise(self, index: int) -> dict[Any, list[float]]:
        entry = self.history[index]
        if isinstance(entry, tuple):
            ids, rows = entry
            rows = rows.tolist() if hasattr(rows, "tolist") else [list(r) for r in rows]
            entry = dict(zip(ids, rows))
            self.history[index] = entry
        return entry


def _tolerated(ratio: float) -> float:
    """An accepted / predicted ratio as a factor: 1 within CALIBRATION_TOLERANCE of 1, else moved
    toward 1 by it (continuous), at most CALIBRATION_MAX."""
    t = CALIBRATION_TOLERANCE
    if ratio < t:
        return ratio / t
    if ratio > 1.0 / t:
        return min(CALIBRATION_MAX, ratio * t)
    return 1.0


class AcceptCalibration:
    """Per block slot: what the target accepted over what the drafter's survivals predicted, over
    the slots that were verified (running sums, each slot's predicted mass capped at
    CALIBRATION_WINDOW so that older outcomes fade). factors() scale survivals; None while every
    factor is 1 (nothing to do)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.predicted = [CALIBRATION_START_WEIGHT] * block_size
        self.realized = [CALIBRATION_START_WEIGHT] * block_size
        self._factors: list[float] | None = None
        self.outcomes = 0  # request-steps observed

    def observe(self, rows: Sequence[Sequence[float]], verified: Sequence[int], accepted: Sequence[int]) -> None:
        """rows [R][G]: the survivals the step's windows were planned from (uncalibrated);
        verified [R]: drafts each request could accept; accepted [R]: drafts it did accept."""
        import numpy as np

        if not len(rows):
            return
        surv = np.asarray(rows, dtype=np.float64).reshape(len(rows), self.block_size)
        slot = np.arange(self.block_size)
        mask = slot[None, :] < np.asarray(verified)[:, None]
        kept = (slot[None, :] < np.asarray(accepted)[:, None]) & mask
        predicted = np.asarray(self.predicted) + (surv * mask).sum(axis=0)
        realized = np.asarray(self.realized) + kept.sum(axis=0)
        over = predicted > CALIBRATION_WINDOW
        shrink = np.where(over, CALIBRATION_WINDOW / np.maximum(predicted, 1e-12), 1.0)
        self.predicted, self.realized = (predicted * shrink).tolist(), (realized * shrink).tolist()
        self.outcomes += len(rows)
        self._update()

    def drift(self) -> None:
        """Nothing was verified for EXPLORE_EVERY steps: move each ratio EXPLORE_DRIFT of the way
        back to 1."""
        self.realized = [r + EXPLORE_DRIFT * (p - r) for p, r in zip(self.predicted, self.realized)]
        self._update()

    def _update(self) -> None:
        f = [_tolerated(r / p) if p > 0 else 1.0 for p, r in zip(self.predicted, self.realized)]
        self._factors = None if all(abs(x - 1.0) < 1e-3 for x in f) else f

    def factors(self) -> list[float] | None:
        return self._factors

    def apply(self, values):
        """Survivals (flat [R * G], a list or a numpy array, or one row) scaled by the factors,
        capped at 1 and kept non-increasing along each row; `values` itself when nothing to do."""
        f = self._factors
        if f is None:
            return values
        import numpy as np

        arr = np.minimum(np.asarray(values, dtype=np.float64).reshape(-1, self.block_size) * np.asarray(f), 1.0)
        arr = np.minimum.accumulate(arr, axis=1).reshape(-1)
        return arr if isinstance(values, np.ndarray) else arr.tolist()


class DSparkPlanner:
    """The production planner: lagged host budget + device top-K. One per engine."""

    def __init__(self, block_size: int, mode: str, sps: SpsTable | None = None,
                 sts_temperatures: Sequence[float] | None = None, lag_steps: int = DEFAULT_LAG_STEPS,
                 has_confidence_head: bool = True, step_aside: bool = True, calibrate: bool = True,
                 start_prior: Sequence[float] | None = None, price_greedy_chains: bool = False):
        if mode not in ("static", "cap-accept", "compact"):
            raise ValueError(f"unknown ragged verify mode {mode!r}; choose static, cap-accept or compact")
        if mode != "static" and not has_confidence_head:
            raise ValueError(f"SGLANG_RAGGED_VERIFY_MODE={mode} needs a drafter with a confidence head "
                             "(enable_confidence_head=true); use static")
        if sts_temperatures is not None and len(sts_temperatures) != block_size:
            raise ValueError(f"STS has {len(sts_temperatures)} temperatures, the block size is {block_size}")
        self.block_size, self.mode, self.sps = block_size, mode, sps
        self.temperatures = list(sts_temperatures) if sts_temperatures is not None else [1.0] * block_size
        self.relay = ConfidenceRelay(block_size, lag_steps)
        self.step_aside = step_aside  # False: always draft (SGLAUNCH_DSPARK_STEP_ASIDE=0)
        self.calibration = StepCostCalibration() if calibrate else None  # None: the table as it is
        if start_prior is not None and len(start_prior) != block_size:
            raise ValueError(f"the starting prior has {len(start_prior)} survivals, the block size is {block_size}")
        # start_prior: the drafter's measured survival per slot (measured_survivals), else the 1.0 guess
        self.start_prior = list(start_prior) if start_prior is not None else None
        self.reset_prior()
        self._device_temperatures: dict[Any, Any] = {}  # device -> [G] float32, copied once
        # chain_terms: the greedy class's second chain priced too (SGLAUNCH_DSPARK_PRICE_GREEDY_CHAIN)
        self.price_greedy_chains = price_greedy_chains

    @property
    def can_step_aside(self) -> bool:
        """Whether plan_drafts may decide to draft nothing (compact / cap-accept with a table)."""
        return self.step_aside and self.mode != "static" and self.sps is not None

    def budget(self, request_ids: Sequence[Any], extra_tokens: int = 0, committed_extra: float = 0,
               chain: tuple[int, float] = (0, 0.0)) -> int:
        """Host: K for this step from survivals lagged N steps (no device sync); a request unknown
        then counts as surviving everywhere (verify all: new requests are drafted in full).
        chain: chain_terms' (rows, tokens) of the step's second chains."""
        if self.mode == "static" or self.sps is None:
            return len(request_ids) * self.block_size
        return choose_budget(self._priced(self.relay.lagged_values(request_ids)), len(request_ids), self.sps,
                             extra_tokens + chain[0], committed_extra + chain[1])

    def plan_drafts(self, request_ids: Sequence[Any], extra_tokens: int = 0, committed_extra: int = 0,
                    sampled: bool = False, chains: bool = False) -> int | None:
        """Host, before anything is drafted: the budget K, or None to step aside (draft nothing:
        the step is a plain decode step and the drafter does not run). The decision prices
        unknown requests at the running mean survival, not at 1.0. committed_extra: tokens the
        step's other rows commit either way (non-speculating decodes, a prefill chunk that ends
        its prompt): both rates count them. sampled: some row of the step samples at T > 0 (its
        step costs are corrected by the sampled class's scales). chains: a drafting step would
        verify second chains too: their measured rows and tokens go into the drafting side's
        price and its modelled step time (chain_terms)."""
        R = len(request_ids)
        chain = self.chain_terms(R, sampled) if chains else (0, 0.0)
        if not self.can_step_aside:
            return self.budget(request_ids, extra_tokens, committed_extra, chain)
        scale = self.calibration.scale_for(sampled) if self.calibration else {"draft": 1.0, "plain": 1.0}
        budget = None
        if self.relay.has_lagged():
            lagged = self._priced(self.relay.lagged_values(request_ids, self.prior))
            k = drafting_pays(lagged, R, self.sps, extra_tokens, draft_scale=scale["draft"], plain_scale=scale["plain"],
                              committed_extra=committed_extra, chain=chain)
        else:  # every request at the prior: the same question as the step before, asked of the memo
            k, rate, plain = self._at_prior(request_ids, extra_tokens, committed_extra, chain)
            k = _paying(k, rate, plain, self.sps, MIN_DRAFT_GAIN, scale["draft"], scale["plain"])
        if k is not None:
            # NOTE: budget() prices unknown requests at 1.0, not at the prior: when every request is
            # known its K is the one just computed (the same survivals), so it is not computed again
            known = self.mode != "static" and self.relay.knows_all(request_ids)
            budget = (k if known else self.budget(request_ids, extra_tokens, committed_extra, chain)) or None
        if self.calibration is not None:
            self.calibration.expect(*(("plain", self.sps.plain_step_seconds(R, extra_tokens)) if budget is None else
                                      ("draft", self.sps.step_seconds(extra_tokens + chain[0] + R + budget, R))),
                                    sampled)
        return budget

    def chain_terms(self, num_requests: int, sampled: bool) -> tuple[int, float]:
        """(rows, committed tokens) that a drafting step of `num_requests` requests of this class
        adds by verifying second chains, from what its chained steps measured (observe_chains):
        their rows cost verify time and their wins commit tokens the first chains did not, so both
        belong to the drafting side of the step-aside decision and to its modelled step time (else
        the rows' cost lands in the draft scale and the wins nowhere: H100, session 35, T=0.7, the
        sampled chain of 3 stepped aside at 64-67% of c=1's steps against 35% without it and
        served 0.79x). (0, 0.0) before the class has verified a chain, and for the greedy class
        unless price_greedy_chains (its chain's default was measured without the pricing)."""
        measured = self.chain_measure[sampled]
        if measured is None or not (sampled or self.price_greedy_chains):
            return 0, 0.0
        rows, tokens = measured
        return round(rows * num_requests), tokens * num_requests

    def observe_chains(self, sampled: bool, num_requests: int, rows: int, gained: int) -> None:
        """A drafting step of `num_requests` verified second chains in `rows` rows, and their wins
        committed `gained` tokens beyond what the first chains would have (a chain wins only where
        its first chain's first draft was rejected: that chain would have committed one token):
        folded per request into the class's running means (CHAIN_DECAY a step)."""
        if num_requests <= 0:
            return
        now = (rows / num_requests, gained / num_requests)
        before = self.chain_measure[sampled]
        self.chain_measure[sampled] = now if before is None else tuple(
            CHAIN_DECAY * b + (1 - CHAIN_DECAY) * n for b, n in zip(before, now))

    def _at_prior(self, request_ids: Sequence[Any], extra_tokens: int,
                  committed_extra: float = 0, chain: tuple[int, float] = (0, 0.0)) -> tuple[int, float, float]:
        """(K, Theta(K), plain rate) of a step whose requests all have no lagged survivals (priced
        at the prior), memoised per (requests, extra tokens) until the prior or the table changes.
        NOTE: a stepping-aside streak at load asks this every step (the relay holds no survivals
        then): the sort over R * G values, the cumulative sums and the table's step times need
        not be redone (a stepped-aside step's _burst_plan + _decide at 64 requests: 28.5 us on
        the dev CPU with the memo, `benchmarks/host_probes.py`, beside a 1.4 ms step on the H200)."""
        key = (len(request_ids), extra_tokens, committed_extra, chain)
        memo = self._prior_memo
        if self._memo_table is not self.sps or len(memo) > 1024:  # NOTE: extra tokens vary: bounded
            memo.clear()
            self._memo_table = self.sps
        hit = memo.get(key)
        if hit is None:
            R = len(request_ids)
            k, rate = best_budget(self._priced(self.relay.lagged_values(request_ids, self.prior)), R, self.sps,
                                  extra_tokens + chain[0], committed_extra + chain[1])
            hit = memo[key] = (k, rate, plain_rate(R, self.sps, extra_tokens, committed_extra))
        return hit

    def observe_step_seconds(self, seconds: float | None) -> None:
        """The engine step planned last took `seconds` (calibrates the table's step times); None:
        its wall time prices nothing the table models (overlap: a pipeline's first or last step),
        so it is forgotten."""
        if self.calibration is None:
            return
        if seconds is None:
            self.calibration.pending = None
        else:
            self.calibration.observe(seconds)

    def allocate(self, conf_logits, budget: int, active=None, caps=None):
        """Device: current survivals [R, G] and windows [R] (int32) from raw confidence logits.
        caps [R] (optional): drafts a request can take at most; candidates past its cap are
        ranked below every other, so the budget goes to drafts that will be verified."""
        import torch

        from sglaunch.speculative import kernels

        surv = kernels.survival(conf_logits, self.device_temperatures(conf_logits.device))
        if active is None:
            active = torch.ones(conf_logits.shape[0], dtype=torch.bool, device=conf_logits.device)
        if self.mode == "static":
            return surv, torch.full_like(active, self.block_size, dtype=torch.int32)
        ranked = surv
        if caps is not None:
            slot = torch.arange(surv.shape[1], device=surv.device)
            ranked = torch.where(slot[None, :] < caps[:, None], surv, torch.full_like(surv, -1.0))
        return surv, kernels.topk_windows(ranked, active, budget)

    def device_temperatures(self, device):
        """The STS temperatures [G] (float32) on `device`, copied there once."""
        import torch

        key = (str(device), tuple(self.temperatures))  # NOTE: new temperatures get a new copy
        if key not in self._device_temperatures:
            self._device_temperatures[key] = torch.tensor(self.temperatures, dtype=torch.float32).to(device)
        return self._device_temperatures[key]

    def _priced(self, values):
        """Survivals as the prices see them: scaled by what the target really accepted."""
        return self.accepts.apply(values)

    @property
    def priced_prior(self) -> list[float]:
        """The prior survival row as priced (the burst's accept estimate reads it)."""
        return self._priced(list(self.prior))

    def observe(self, request_ids: Sequence[Any], survival: Any) -> None:
        """Record this step's survivals (host rows) for use `lag` steps later, and fold their mean
        into the prior of requests with no lagged survivals. Rows stay as the drafter gave them;
        observe_outcome() later pairs them with what the target accepted."""
        self.relay.push(request_ids, survival)
        rows = survival.tolist() if hasattr(survival, "tolist") else [list(r) for r in survival]
        self._pending = (list(request_ids), rows)
        self._aside_streak = 0
        if rows:
            self._fold_prior([sum(col) / len(rows) for col in zip(*rows)], len(rows))

    def observe_outcome(self, request_ids: Sequence[Any], verified: Sequence[int], accepted: Sequence[int]) -> None:
        """The step last observed was verified: request r could accept verified[r] drafts and
        accepted accepted[r]. Checks its survivals against that (AcceptCalibration)."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != list(request_ids):
            return  # NOTE: e.g. a step whose survivals were never read (static mode): nothing to pair
        before = self.accepts.factors()
        self.accepts.observe(pending[1], verified, accepted)
        if self.accepts.factors() != before:
            self._prior_memo.clear()

    def _fold_prior(self, mean: Sequence[float], rows: int) -> None:
        """The mean survival per slot of `rows` observed request-steps into the running prior
        (a weighted mean, its weight capped at PRIOR_WINDOW). NOTE: the 1.0 guess has no weight:
        the first observation replaces it."""
        total = self._prior_weight + rows
        share = rows / total
        self.prior = [p + share * (m - p) for p, m in zip(self.prior, mean)]
        self._prior_weight = min(total, PRIOR_WINDOW)
        self._observed_prior = True
        self._prior_memo.clear()

    def observe_accepts(self, accepted: Sequence[Sequence[int]]) -> None:
        """A DSpark burst's accepted draft counts [iterations][requests] (no confidences are read
        back from a burst): the fraction of request-iterations that kept slot j is its empirical
        survival, folded into the prior as one observed step's mean survivals are. NOTE: without
        it, an engine that only bursts (1-32 requests) keeps the 1.0 guess, and the first batch too
        wide to burst prices every new request as if all its drafts survive."""
        counts = [n for row in accepted for n in row]
        if counts:
            kept = [sum(n > j for n in counts) / len(counts) for j in range(self.block_size)]
            # NOTE: the prior holds survivals as the drafter states them and is priced through the
            # calibration: an outcome goes in as the confidence that the calibration maps onto it
            f = self.accepts.factors()
            if f is not None:
                kept = [min(1.0, k / x) if x > 0 else 1.0 for k, x in zip(kept, f)]
            self._fold_prior(kept, len(counts))

    def skip_step(self) -> None:
        """A step that drafted nothing: it observed no survivals. NOTE: it still advances the
        relay, so `lag` such steps later every request is priced at the running mean survival
        again: one bad patch of a request cannot keep it out of drafting for good."""
        self.relay.push([], [])
        self._aside_streak += 1
        if self._aside_streak % EXPLORE_EVERY == 0 and self.accepts.factors() is not None:
            self.accepts.drift()
            self._prior_memo.clear()

    def release(self, request_id: Any) -> None:
        self.relay.forget(request_id)

    def drafter_failing(self) -> bool:
        """Whether the drafter is far off this target or traffic: the confidence check found its
        first slot accepted at under FAILING_FACTOR of what it predicted (a factor the drift back
        toward 1 lifts past that within a few EXPLORE_EVERY periods, so it is tried again), or
        the prior learned from its observed confidences (not the starting guess) prices an accept
        length under FAILING_ACCEPT: the planner would step aside for such drafts anyway."""
        factors = self.accepts.factors()
        if factors is not None and factors[0] < FAILING_FACTOR:
            return True
        return self._observed_prior and 1.0 + sum(self.priced_prior) < FAILING_ACCEPT

    def reset_prior(self) -> None:
        """Back to the starting prior (after a profile's synthetic steps): the drafter's measured
        survivals at PRIOR_START_WEIGHT, or the 1.0 guess at no weight; the confidence calibration
        as new (a profile's synthetic drafts say nothing of real traffic)."""
        self.accepts = AcceptCalibration(self.block_size)
        self._pending: tuple[list, list] | None = None  # the last drafting step's (ids, raw survival rows)
        self._aside_streak = 0
        self._observed_prior = False  # whether any observed survival or burst outcome is in the prior
        if self.start_prior is not None:
            self.prior, self._prior_weight = list(self.start_prior), PRIOR_START_WEIGHT
        else:
            self.prior, self._prior_weight = [1.0] * self.block_size, 0
        self._prior_memo: dict = {}  # _at_prior's answers for the current prior and _memo_table
        # per class (sampled?): the second chains' running (rows, tokens gained) per request of a chained step
        self.chain_measure: dict[bool, tuple[float, float] | None] = {False: None, True: None}
        self._memo_table = self.sps


def measured_survivals(drafter_dir: str, block_size: int) -> list[float] | None:
    """The drafter's measured survival per block slot at T=0 from its bundle's eval.json
    (`temperatures["0.0"].per_position.reach_rate_per_position`, written by train-draft's
    evaluation): the planner's starting prior. None when the folder has none (or another size)."""
    import json
    from pathlib import Path

    path = Path(drafter_dir) / "eval.json"
    try:
        rates = json.loads(path.read_text())["temperatures"]["0.0"]["per_position"]["reach_rate_per_position"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(rates, list) or len(rates) != block_size or \
            not all(isinstance(r, (int, float)) and 0.0 <= r <= 1.0 for r in rates):
        return None
    return [float(r) for r in rates]
