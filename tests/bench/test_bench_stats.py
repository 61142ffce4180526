"""Per-level metrics and the tolerant reading of the server's DSpark statistics."""

from __future__ import annotations

import pytest

from sglaunch.bench.client import RequestResult
from sglaunch.bench.report import cached_cell, final_tables, kinds_cell
from sglaunch.bench.stats import distribution_ms, parse_prometheus, spec_stats, summarize_level


def test_distribution_and_level_summary():
    assert distribution_ms([0.001, 0.002, 0.003, 0.004, None]) == pytest.approx(
        {"mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert distribution_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    ok = RequestResult(ok=True, ttft=0.1, itls=[0.02, 0.02], e2e=0.5, output_tokens=5, input_tokens=7)
    bad = RequestResult(ok=False, error="HTTP 500: boom", error_kind="http", e2e=0.01)
    record = summarize_level([ok, ok, bad], duration=2.0)
    assert (record["completed"], record["errors"]) == (2, 1)
    assert record["error_samples"] == {"HTTP 500: boom": 1}
    assert record["request_throughput"] == 1.0 and record["output_token_throughput"] == 5.0
    assert record["total_input_tokens"] == 14
    assert record["tpot_ms"]["p50"] == pytest.approx(100.0)  # (0.5 - 0.1) / 4


PROM_BEFORE = """# HELP x
sglaunch_spec_steps_total 10
sglaunch_spec_request_steps_total 20
sglaunch_spec_committed_tokens_total 40
sglaunch_spec_verify_tokens_total 100
sglaunch_spec_accept_length_bucket{le="1"} 3
garbage line without value
"""
PROM_AFTER = PROM_BEFORE.replace("steps_total 10", "steps_total 20").replace(
    "request_steps_total 20", "request_steps_total 40").replace(
    "committed_tokens_total 40", "committed_tokens_total 100").replace(
    "verify_tokens_total 100", "verify_tokens_total 180")


def test_spec_stats_from_prometheus_counters_are_per_level():
    before = {"metrics": parse_prometheus(PROM_BEFORE), "info": {}}
    after = {"metrics": parse_prometheus(PROM_AFTER), "info": {}}
    out = spec_stats(before, after)
    assert out["accept_length"] == pytest.approx(3.0)  # 60 committed / 20 request-steps
    assert out["verify_tokens_per_step"] == pytest.approx(8.0)  # 80 rows / 10 steps
    assert out["spec_source"] == "/metrics (level)"


def test_spec_stats_from_server_info_histogram_and_steps():
    before = {"spec.steps": 10.0, "spec.mean_accept_length": 2.0, "spec.verify_tokens_per_step": 4.0,
              "spec.accept_length_histogram.1": 5.0, "spec.accept_length_histogram.3": 5.0}
    after = {"spec.steps": 20.0, "spec.mean_accept_length": 2.5, "spec.verify_tokens_per_step": 5.0,
             "spec.accept_length_histogram.1": 5.0, "spec.accept_length_histogram.3": 15.0}
    out = spec_stats({"info": before, "metrics": {}}, {"info": after, "metrics": {}})
    assert out["accept_length"] == pytest.approx(3.0)  # only 3s were added during the level
    assert out["verify_tokens_per_step"] == pytest.approx(6.0)  # (100 - 40) / 10
    assert out["spec_source"] == "/server_info (level)"


def test_spec_stats_cumulative_and_absent():
    flat = {"mean_accept_length": 2.2, "verify_tokens_per_step": 6.0}
    out = spec_stats({}, {"info": flat})
    assert (out["accept_length"], out["verify_tokens_per_step"]) == (2.2, 6.0)
    assert out["spec_source"] == "/server_info (cumulative)"
    plain = {"total_steps": 5.0, "kv_usage": 0.1}  # a server without speculative decoding
    assert spec_stats({"info": plain}, {"info": plain, "metrics": {"up": 1.0}}) == {
        "accept_length": None, "verify_tokens_per_step": None, "spec_source": None, "step_kinds": None}


def test_step_kinds_are_this_levels_shares_of_each_kind():
    # an sglaunch DSpark server's /server_info counters, flattened: 100 drafting steps before the
    # level (40 of them burst iterations), 50 aside; during it 30 more drafting (20 in bursts), 70 aside
    before = {"speculative.steps": 100.0, "speculative.step_aside_steps": 50.0, "speculative.bursts.iterations": 40.0}
    after = {"speculative.steps": 130.0, "speculative.step_aside_steps": 120.0, "speculative.bursts.iterations": 60.0}
    kinds = spec_stats({"info": before}, {"info": after})["step_kinds"]
    assert kinds == pytest.approx({"aside": 0.7, "burst": 0.2, "drafted": 0.1, "steps": 100.0})
    assert kinds_cell(kinds) == "70/20/10"
    # sampled bursts (their own counters) are burst iterations too: 5 of the 10 other drafting steps
    sampled = {**after, "speculative.bursts.sampled.iterations": 5.0}
    kinds = spec_stats({"info": {**before, "speculative.bursts.sampled.iterations": 0.0}}, {"info": sampled})["step_kinds"]
    assert kinds == pytest.approx({"aside": 0.7, "burst": 0.25, "drafted": 0.05, "steps": 100.0})
    # and filtered sampled bursts: 3 more of them
    filtered = {**sampled, "speculative.bursts.filtered.iterations": 3.0}
    kinds = spec_stats({"info": {**before, "speculative.bursts.sampled.iterations": 0.0}},
                       {"info": filtered})["step_kinds"]
    assert kinds == pytest.approx({"aside": 0.7, "burst": 0.28, "drafted": 0.02, "steps": 100.0})
    # no burst counters (bursts off): every drafting step is "drafted"
    no_burst = {k: v for k, v in after.items() if "bursts" not in k}
    kinds = spec_stats({"info": {k: v for k, v in before.items() if "bursts" not in k}}, {"info": no_burst})["step_kinds"]
    assert kinds == pytest.approx({"aside": 0.7, "burst": 0.0, "drafted": 0.3, "steps": 100.0})
    # an idle level (no steps) and a server without the counters: none
    assert spec_stats({"info": after}, {"info": after})["step_kinds"] is None
    assert kinds_cell(None) == "n/a"


def _level(label: str, cached, prompt, status: str = "ok") -> dict:
    dist = {"p50": 1.0}
    return {"label": label, "status": status, "errors": 0, "request_throughput": 1.0, "output_token_throughput": 2.0,
            "ttft_ms": dist, "itl_ms": dist, "tpot_ms": dist, "e2e_ms": dist, "accept_length": None,
            "verify_tokens_per_step": None, "total_cached_tokens": cached, "total_input_tokens": prompt}


def test_the_final_table_shows_each_levels_cached_share():
    """Session 44: later levels of a run met every prompt cached, and nothing in the table said so."""
    from rich.console import Console

    doc = {"status": "ok", "partial": False, "comparison": None, "configs": [
        {"label": "plain", "levels": [_level("c=1", 0, 1000), _level("c=8", 950, 1000)]},
        {"label": "old", "levels": [_level("c=1", None, 1000), _level("c=8", None, None, status="skipped")]}]}
    console = Console(width=250, record=True)
    for table in final_tables(doc):
        console.print(table)
    text = console.export_text()
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in text.splitlines() if line.startswith("│")]
    rows = {f"{row[0]} {row[1]}": row for row in cells}
    assert "cached in %" in text
    assert rows["plain c=1"][-1] == "0" and rows["plain c=8"][-1] == "95"
    assert rows["old c=1"][-1] == "n/a" and rows["old c=8"][-1] == "-"  # not reported; skipped
    assert cached_cell({"total_cached_tokens": 5, "total_input_tokens": 0}) == "n/a"
    # a run where no server reported cached tokens: no column
    for config in doc["configs"]:
        for record in config["levels"]:
            record["total_cached_tokens"] = None
    console = Console(width=250, record=True)
    for table in final_tables(doc):
        console.print(table)
    assert "cached" not in console.export_text()
