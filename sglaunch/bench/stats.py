"""Per-level metrics from request results, and the server's DSpark statistics (when it has them).

Latencies are reported in milliseconds as mean, p50, p90, p99 (linear interpolation between
order statistics). Server statistics are read before and after each level; counters give the
level's own value, otherwise the server's cumulative value after the level is reported.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Iterable, Sequence

PERCENTILES = (50, 90, 99)
ERROR_SAMPLES = 5


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    position = (len(sorted_values) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def distribution_ms(values: Iterable[float | None]) -> dict[str, float | None]:
    """mean/p50/p90/p99 in milliseconds; all None when there is no sample."""
    data = sorted(1e3 * v for v in values if v is not None)
    if not data:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": sum(data) / len(data), **{f"p{q}": percentile(data, q) for q in PERCENTILES}}


def summarize_level(results: Sequence, duration: float) -> dict[str, Any]:
    """Throughput and latency of one level; `results` are client.RequestResult."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    input_tokens = sum(r.input_tokens or 0 for r in ok)
    duration = max(duration, 1e-9)
    return {
        "num_requests": len(results), "completed": len(ok), "errors": len(failed),
        "error_samples": dict(Counter(r.error for r in failed).most_common(ERROR_SAMPLES)),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_token_throughput": input_tokens / duration,
        "output_token_throughput": output_tokens / duration,
        "total_input_tokens": input_tokens if any(r.input_tokens is not None for r in ok) else None,
        "total_output_tokens": output_tokens,
        # prompt tokens served from the server's prefix cache, as its usage reports them (None: not reported)
        "total_cached_tokens": (sum(r.cached_tokens or 0 for r in ok)
                                if any(r.cached_tokens is not None for r in ok) else None),
        "ttft_ms": distribution_ms(r.ttft for r in ok),
        "itl_ms": distribution_ms(itl for r in ok for itl in r.itls),
        "tpot_ms": distribution_ms(r.tpot for r in ok),
        "e2e_ms": distribution_ms(r.e2e for r in ok),
    }


# ---- server-side statistics ------------------------------------------------------------------

SAMPLE_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets (`_bucket` samples dropped)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE_LINE.match(line)
        if not match or match.group(1).endswith("_bucket"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        samples[match.group(1)] = samples.get(match.group(1), 0.0) + value
    return samples


def flatten(info: Any, prefix: str = "") -> dict[str, float]:
    """Nested dict -> {"a.b.c": number} for the numeric leaves (bools dropped)."""
    flat: dict[str, float] = {}
    if isinstance(info, dict):
        for key, value in info.items():
            name = f"{prefix}{key}"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[name] = float(value)
            elif isinstance(value, dict):
                flat.update(flatten(value, name + "."))
    return flat


def find_name(names: Iterable[str], *needles: str, avoid: tuple[str, ...] = ()) -> str | None:
    """The first name (sorted, so deterministic) holding every needle and none of `avoid`."""
    for name in sorted(names):
        low = name.lower()
        if all(n in low for n in needles) and not any(a in low for a in avoid):
            return name
    return None


def counter_ratio(before: dict[str, float], after: dict[str, float], num: str | None,
                  den: str | None) -> float | None:
    if not num or not den or num not in before or den not in before:
        return None
    steps = after.get(den, 0.0) - before[den]
    return (after.get(num, 0.0) - before[num]) / steps if steps > 0 else None


def metrics_spec_stats(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Level values from Prometheus counters (committed/request_steps, verify_tokens/steps)."""
    names = set(after)
    accept = counter_ratio(before, after, find_name(names, "committed_tokens"),
                           find_name(names, "request_steps", avoid=("bucket",)))
    if accept is None:  # a histogram of accept lengths: sum/count
        hist = find_name(names, "accept", "_sum")
        accept = counter_ratio(before, after, hist, hist[:-4] + "_count" if hist else None)
    verify = counter_ratio(before, after, find_name(names, "verify_tokens", avoid=("per_", "second")),
                           find_name(names, "steps", avoid=("request", "bucket", "per_")))
    return {"accept_length": accept, "verify_tokens_per_step": verify}


def info_spec_stats(before: dict[str, float], after: dict[str, float]) -> tuple[dict, bool]:
    """Level values from /server_info: histogram and step deltas when present, else cumulative."""
    accept_key = find_name(after, "accept", "mean") or find_name(after, "accept_len", avoid=("hist", "rate"))
    verify_key = find_name(after, "verify", "per_step", avoid=("request",))
    values: dict[str, float | None] = {"accept_length": after.get(accept_key) if accept_key else None,
                                       "verify_tokens_per_step": after.get(verify_key) if verify_key else None}
    delta = False
    hist_prefix = find_name({k.rsplit(".", 1)[0] for k in after if "." in k}, "accept", "hist")
    if hist_prefix:
        level = histogram_mean_delta(before, after, hist_prefix + ".")
        if level is not None:
            values["accept_length"], delta = level, True
    if verify_key:
        steps_key = verify_key.rsplit(".", 1)[0] + ".steps" if "." in verify_key else "steps"
        if steps_key in after and steps_key in before and verify_key in before:
            steps = after[steps_key] - before[steps_key]
            values["verify_tokens_per_step"] = ((after[verify_key] * after[steps_key]
                                                 - before[verify_key] * before[steps_key]) / steps
                                                if steps > 0 else None)
            delta = True
    return values, delta


def histogram_mean_delta(before: dict[str, float], after: dict[str, float], prefix: str) -> float | None:
    counts = {}
    for key, value in after.items():
        bucket = key[len(prefix):]
        if key.startswith(prefix) and bucket.isdigit():
            counts[int(bucket)] = value - before.get(key, 0.0)
    total = sum(counts.values())
    return sum(k * c for k, c in counts.items()) / total if total > 0 else None


def step_kinds(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """This level's decode steps by kind, as shares of all of them, from an sglaunch DSpark
    server's /server_info counters: {"aside": stepped aside (plain steps, no drafter), "burst":
    burst iterations, greedy, sampled and filtered, "drafted": other drafting steps}; None where the
    server has no such counters
    (plain servers, SGLang). The ratios alone cannot tell a level that drafted from one that only
    stepped aside; these can."""
    keys = {"drafting": "speculative.steps", "aside": "speculative.step_aside_steps",
            "burst": "speculative.bursts.iterations", "sampled burst": "speculative.bursts.sampled.iterations",
            "filtered burst": "speculative.bursts.filtered.iterations"}
    if not all(keys[k] in after and keys[k] in before for k in ("drafting", "aside")):
        return None
    delta = {k: after.get(key, 0.0) - before.get(key, 0.0) for k, key in keys.items()}
    delta["burst"] += delta.pop("sampled burst") + delta.pop("filtered burst")
    total = delta["drafting"] + delta["aside"]  # burst iterations count as drafting steps
    if total <= 0:
        return None
    burst = min(delta["burst"], delta["drafting"])
    return {"aside": delta["aside"] / total, "burst": burst / total,
            "drafted": (delta["drafting"] - burst) / total, "steps": total}


def spec_stats(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """{"accept_length", "verify_tokens_per_step", "spec_source", "step_kinds"}; None where the
    server has none."""
    from_metrics = metrics_spec_stats(before.get("metrics", {}), after.get("metrics", {}))
    from_info, delta = info_spec_stats(before.get("info", {}), after.get("info", {}))
    out: dict[str, Any] = {}
    sources = set()
    for key in ("accept_length", "verify_tokens_per_step"):
        if from_metrics[key] is not None:
            out[key] = from_metrics[key]
            sources.add("/metrics (level)")
        elif from_info[key] is not None:
            out[key] = from_info[key]
            sources.add("/server_info (level)" if delta else "/server_info (cumulative)")
        else:
            out[key] = None
    out["spec_source"] = ", ".join(sorted(sources)) or None
    out["step_kinds"] = step_kinds(before.get("info", {}), after.get("info", {}))
    return out


async def snapshot(client) -> dict[str, Any]:
    """Best-effort read of /server_info internal_states[0] and /metrics; never raises."""
    import httpx

    snap: dict[str, Any] = {"info": {}, "metrics": {}}
    try:
        response = await client.get("/server_info", timeout=5)
        if response.status_code == 200:
            states = response.json().get("internal_states") or [{}]
            snap["info"] = flatten(states[0] if isinstance(states[0], dict) else {})
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    try:
        response = await client.get("/metrics", timeout=5)
        if response.status_code == 200:
            snap["metrics"] = parse_prometheus(response.text)
    except httpx.HTTPError:
        pass
    return snap
