"""Prometheus metrics for GET /metrics (with --enable-metrics), named like SGLang's (`sglang:`).

Each server has its own CollectorRegistry, so several apps can live in one process (tests).
Counters and histograms are updated per request; the engine gauges (KV usage, queue length,
running requests) are read from `AsyncEngine.server_info()` at scrape time.

With several HTTP worker processes (`--tokenizer-worker-num`), counters and histograms live in
prometheus-client's multiprocess files (the launcher's private PROMETHEUS_MULTIPROC_DIR, set
before any worker imports prometheus_client): whichever worker answers /metrics reports the
totals of all of them. The engine gauges come from the engine's live statistics, which every
worker receives, so they are never summed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

PREFIX = "sglang:"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)

# gauge name -> keys the engine's server_info() may use for it (first present wins)
ENGINE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "token_usage": ("KV cache usage: tokens held by requests / pool size (0..1); cached prefix "
                    "pages no request holds are not counted (num_evictable_tokens).",
                    ("token_usage", "kv_usage", "kv_cache_usage")),
    "num_queue_reqs": ("Requests waiting in the scheduler queue.",
                       ("num_queue_reqs", "num_waiting_requests", "queue_length")),
    "num_running_reqs": ("Requests in the running batch.",
                         ("num_running_reqs", "num_running_requests")),
    "num_used_tokens": ("KV cache slots held by requests.", ("num_used_tokens", "kv_used_tokens")),
    "num_evictable_tokens": ("KV cache slots holding cached prefixes no request uses (evictable).",
                             ("num_evictable_tokens", "kv_evictable_tokens")),
}


def engine_gauge_values(info: dict[str, Any]) -> dict[str, float]:
    """The engine gauges found in a server_info() dict (searched one level deep too)."""
    flat = dict(info)
    for value in info.values():
        if isinstance(value, dict):
            for key, inner in value.items():
                flat.setdefault(key, inner)
    values = {}
    for gauge, (_, keys) in ENGINE_GAUGES.items():
        found = next((flat[key] for key in keys if isinstance(flat.get(key), (int, float))), None)
        if found is not None:
            values[gauge] = float(found)
    return values


class RequestTracker:
    """Timing and token counts of one request; `finish` records it once."""

    def __init__(self, metrics: "ServerMetrics", prompt_tokens: int):
        self._metrics = metrics
        self._prompt_tokens = prompt_tokens
        self._start = self._last = time.perf_counter()
        self._completion_tokens = 0
        self._finished = False

    def on_tokens(self, count: int) -> None:
        if count <= 0:
            return
        now = time.perf_counter()
        if self._completion_tokens == 0:
            self._metrics.observe_first_token(now - self._start)
        else:
            self._metrics.observe_inter_token((now - self._last) / count, count)
        self._completion_tokens += count
        self._last = now

    def finish(self, reason: str | None, completion_tokens: int | None, cached_tokens: int) -> None:
        if self._finished:
            return
        self._finished = True
        tokens = self._completion_tokens if completion_tokens is None else completion_tokens
        self._metrics.observe_request(reason or "abort", self._prompt_tokens, tokens, cached_tokens,
                                      time.perf_counter() - self._start)


class ServerMetrics:
    """No-op recorder; `PrometheusMetrics` records for real when metrics are enabled."""

    enabled = False

    def track(self, prompt_tokens: int) -> RequestTracker:
        return RequestTracker(self, prompt_tokens)

    def observe_first_token(self, seconds: float) -> None: ...

    def observe_inter_token(self, seconds_per_token: float, tokens: int) -> None: ...

    def observe_request(self, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                        cached_tokens: int, seconds: float) -> None: ...

    def render(self, engine_info: dict[str, Any]) -> tuple[bytes, str]:
        raise NotImplementedError("metrics are disabled")


class PrometheusMetrics(ServerMetrics):
    """Counters, histograms and engine gauges in one prometheus-client registry."""

    enabled = True

    def __init__(self, model_name: str, multiprocess_dir: str | None = None):
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # no `*_created` series: they double the output, nobody reads them
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self._labels = labels
        own = self.registry
        if multiprocess_dir is not None:  # NOTE: every worker's values, summed at scrape time
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=multiprocess_dir)
            own = None  # the values go to this process's files, read back by the collector

        def make(kind: Callable, name: str, doc: str, extra=(), **kwargs):
            return kind(PREFIX + name, doc, [*labels, *extra], registry=own, **kwargs)

        self.requests = make(Counter, "num_requests", "Finished generation requests.",
                             extra=("finish_reason",))
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated.")
        self.cached_tokens = make(Counter, "cached_tokens", "Prompt tokens served from the cache.")
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Time to first token.",
                         buckets=LATENCY_BUCKETS)
        self.itl = make(Histogram, "inter_token_latency_seconds", "Latency between tokens.",
                        buckets=LATENCY_BUCKETS)
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Request latency end to end.",
                        buckets=LATENCY_BUCKETS)
        self.gauges = EngineGaugeCollector(labels)
        self.registry.register(self.gauges)
        self.spec = SpecCollector(labels)
        self.registry.register(self.spec)

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.labels(**self._labels).observe(seconds)

    def observe_inter_token(self, seconds_per_token: float, tokens: int) -> None:
        histogram = self.itl.labels(**self._labels)
        for _ in range(tokens):
            histogram.observe(seconds_per_token)

    def observe_request(self, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                        cached_tokens: int, seconds: float) -> None:
        self.requests.labels(**self._labels, finish_reason=finish_reason).inc()
        self.prompt_tokens.labels(**self._labels).inc(prompt_tokens)
        self.generation_tokens.labels(**self._labels).inc(completion_tokens)
        self.cached_tokens.labels(**self._labels).inc(cached_tokens)
        self.e2e.labels(**self._labels).observe(seconds)

    def render(self, engine_info: dict[str, Any]) -> tuple[bytes, str]:
        """The exposition text and its content type, with engine gauges refreshed."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.gauges.values = engine_gauge_values(engine_info)
        self.spec.info = engine_info.get("speculative")
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class EngineGaugeCollector:
    """The engine gauges (ENGINE_GAUGES), as the engine reported them at the last scrape."""

    def __init__(self, labels: dict[str, str]):
        self.labels, self.values = labels, {}

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        for name, value in self.values.items():
            gauge = GaugeMetricFamily(PREFIX + name, ENGINE_GAUGES[name][0], labels=list(self.labels))
            gauge.add_metric(list(self.labels.values()), value)
            yield gauge


class SpecCollector:
    """Speculative-decoding series from the engine's `speculative` statistics (server_info),
    present only when the engine speculates: SGLang's `spec_accept_length` gauge plus counters
    and the accept-length histogram (accept length = accepted drafts + the bonus token)."""

    def __init__(self, labels: dict[str, str]):
        self.labels, self.info = labels, None

    def describe(self):
        return []  # NOTE: the series exist only once the engine reports them

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        info, names, values = self.info, list(self.labels), list(self.labels.values())
        if not info:
            return
        for name, doc, key in SPEC_GAUGES:
            gauge = GaugeMetricFamily(PREFIX + name, doc, labels=names)
            gauge.add_metric(values, float(info[key]))
            yield gauge
        for name, doc, key in SPEC_COUNTERS:
            counter = CounterMetricFamily(PREFIX + name, doc, labels=names)
            counter.add_metric(values, float(info[key]))
            yield counter
        hist = HistogramMetricFamily(PREFIX + "spec_accept_length_per_step", "Tokens committed per request per "
                                     "speculative step (accepted drafts + bonus).", labels=names)
        counts = sorted(info["accept_length_histogram"].items(), key=lambda kv: int(kv[0]))
        buckets, total = [], 0
        for length, count in counts:
            total += count
            buckets.append((length, total))
        hist.add_metric(values, buckets + [("+Inf", total)], info["committed_tokens"])
        yield hist


SPEC_GAUGES = (
    ("spec_accept_length", "Mean accept length per request-step (bonus token included).", "mean_accept_length"),
    ("spec_verify_tokens_per_step", "Mean target rows verified per speculative step.", "verify_tokens_per_step"),
)
SPEC_COUNTERS = (
    ("spec_steps", "Speculative verify steps.", "steps"),
    ("spec_verify_tokens", "Target rows computed for verification.", "verify_tokens"),
    ("spec_draft_seconds", "Time spent drafting.", "draft_time_s"),
    ("spec_verify_seconds", "Time spent verifying (target forward + acceptance).", "verify_time_s"),
    ("spec_step_aside_steps", "Steps where drafting would not pay: plain decodes, no drafter.", "step_aside_steps"),
)
