"""benchmarks/inprocess_ab.py on the CPU: each arm in its own process, the order alternating by pair,
the window's statistics as differences, an arm's environment reaching its engine, bad arms refused."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, file: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_arm_and_numeric_delta():
    ab = load("bench_script_inprocess_ab_parse", "inprocess_ab.py")
    assert ab.parse_arm("x=compact,A=1,B=2") == {"label": "x", "kind": "compact", "env": {"A": "1", "B": "2"}}
    for bad in ("x", "x=", "x=eagle", "x=plain,NOVALUE", "=plain"):
        with pytest.raises(Exception, match="--arm"):
            ab.parse_arm(bad)
    before = {"a": 1, "b": {"c": [2, 3.0]}, "d": "s", "e": True, "f": [1]}
    after = {"a": 4, "b": {"c": [5, 3.5]}, "d": "s", "e": True, "f": [1, 2], "g": 9}
    assert ab.numeric_delta(after, before) == {"a": 3, "b": {"c": [3, 0.5]}, "g": 9}
    assert ab.numeric_delta({"k": {"new": 2}}, {}) == {"k": {"new": 2}}


def test_arms_run_in_turn_and_the_environment_reaches_the_engine(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    aside = load("bench_script_aside_host_cost_ab", "aside_host_cost.py")
    ab = load("bench_script_inprocess_ab", "inprocess_ab.py")
    model, drafter = aside.tiny_model(tmp_path)
    out = tmp_path / "ab.json"
    code = ab.main(["--model", str(model), "--drafter", str(drafter), "--device", "cpu", "--dtype", "float32",
                    "--concurrency", "4", "--output-len", "12", "--requests", "8", "--warmup-requests", "4",
                    "--pairs", "2", "--prompt-limit", "20",
                    "--arm", "plain=plain", "--arm", "always=compact,SGLAUNCH_DSPARK_STEP_ASIDE=0",
                    "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [r["label"] for r in runs] == ["plain", "always", "always", "plain"]  # pair 2 in the other order
    for r in runs:
        assert r["output_tokens"] >= 8 * 12 - 4 * 12 and r["window_s"] > 0
        assert r["tok_s"] == pytest.approx(r["output_tokens"] / r["window_s"], rel=1e-2)
        steps = sum(s["steps"] for s in r["steps"].values())
        assert steps > 0 and r["tokens_per_step"] == pytest.approx(r["output_tokens"] / steps, abs=1e-3)
        assert r["steps"]["prefill"]["steps"] >= 1  # new requests were admitted inside the window
        # the collector's passes and seconds per generation inside the window (engine/heap.py's counters,
        # registered when the engine froze its start-up heap; a window this small may run none)
        assert set(r["gc"]) == {"collections", "seconds"}
        assert len(r["gc"]["collections"]) == 3 and all(n >= 0 for n in r["gc"]["collections"])
        assert len(r["gc"]["seconds"]) == 3 and all(s >= 0 for s in r["gc"]["seconds"])
        # each step timed around engine.step(), split as the engine splits them: the same counts
        for kind, spread in r["step_ms"].items():
            assert spread["steps"] == r["steps"][kind]["steps"]
            assert 0 < spread["p50"] <= spread["p90"] <= spread["p99"] <= spread["max"]
            assert 0 < spread["slowest_1pct_share"] <= 1
        assert set(r["step_ms"]) == {"decode", "prefill"}
        # the finer split covers every step and every token of the window once
        split = r["step_split"]
        assert sum(k["steps"] for k in split.values()) == steps
        assert sum(k["tokens"] for k in split.values()) == r["output_tokens"]
        assert split["prefill"]["steps"] == r["steps"]["prefill"]["steps"]
        # the slowest steps, slowest first, of the kinds above (no graphs on the CPU: no replays to name)
        slow = r["slow_steps"]
        assert 0 < len(slow) <= min(24, steps) and [s["ms"] for s in slow] == sorted((s["ms"] for s in slow), reverse=True)
        assert all(s["kind"] in split and s["graph_replays"] is None for s in slow)
        assert slow[0]["ms"] >= max(v["p50_ms"] for v in split.values()) - 1e-3  # both rounded
    plain = [r for r in runs if r["label"] == "plain"]
    always = [r for r in runs if r["label"] == "always"]
    assert all(r["spec"] == {} for r in plain)
    # a plain engine never drafts; the always-drafting one yields more than a token a row in its drafted steps
    assert all(set(r["step_split"]) <= {"prefill", "plain"} for r in plain)
    for r in always:
        drafted = r["step_split"]["drafted"]
        assert drafted["steps"] > 0 and drafted["tokens"] > drafted["steps"]
    # SGLAUNCH_DSPARK_STEP_ASIDE=0 reached the child's engine: it drafted and never stepped aside
    assert all(r["spec"]["steps"] > 0 and r["spec"]["step_aside_steps"] == 0 for r in always)
    ratios = report["summary"]["ratios_vs_plain"]["always"]
    assert ratios == [round(always[i]["tok_s"] / plain[i]["tok_s"], 4) for i in range(2)]
    assert "pair 2" in capsys.readouterr().out


def test_a_dspark_arm_without_a_drafter_is_refused(tmp_path):
    ab = load("bench_script_inprocess_ab_refuse", "inprocess_ab.py")
    with pytest.raises(SystemExit) as exc:
        ab.main(["--model", str(tmp_path), "--arm", "a=plain", "--arm", "b=compact"])
    assert exc.value.code == 2


def tiny_ab(tmp_path, tag: str):
    """The script as a module (loaded under a name of its own) and a tiny random-weight model."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    aside = load(f"bench_script_aside_host_cost_{tag}", "aside_host_cost.py")
    return load(f"bench_script_inprocess_ab_{tag}", "inprocess_ab.py"), aside.tiny_model(tmp_path)[0]


def test_output_jitter_gives_every_arm_the_same_lengths(tmp_path):
    """--output-jitter: each request's length comes from its index, so two plain arms generate the
    same tokens in their windows, and not what one length for all generates."""
    ab, model = tiny_ab(tmp_path, "jitter")
    totals = {}
    for jitter in ("0", "0.5"):
        out = tmp_path / f"ab{jitter}.json"
        assert ab.main(["--model", str(model), "--device", "cpu", "--dtype", "float32", "--concurrency", "3",
                        "--output-len", "12", "--requests", "9", "--warmup-requests", "2", "--pairs", "1",
                        "--prompt-limit", "10", "--output-jitter", jitter, "--arm", "a=plain", "--arm", "b=plain",
                        "--json", str(out)]) == 0
        totals[jitter] = [r["output_tokens"] for r in json.loads(out.read_text())["runs"]]
    assert totals["0.5"][0] == totals["0.5"][1]
    assert totals["0.5"] != totals["0"]
    with pytest.raises(SystemExit):
        ab.main(["--model", str(model), "--output-jitter", "1.5"])


def test_step_spread_tells_a_stall_from_a_slow_kind():
    ab = load("bench_script_inprocess_ab_spread", "inprocess_ab.py")
    stalled = ab.spread([0.001] * 99 + [0.1])  # 99 steps of 1 ms and one stall of 100 ms
    assert stalled["steps"] == 100 and stalled["p50"] == 1.0 and stalled["p90"] == 1.0 and stalled["max"] == 100.0
    assert stalled["slowest_1pct_share"] == pytest.approx(100 / 199, abs=1e-4)
    slow = ab.spread([0.002] * 100)  # slow step after step: no tail
    assert slow["p50"] == slow["max"] == 2.0 and slow["slowest_1pct_share"] == pytest.approx(0.01)
    assert ab.spread([0.003])["p99"] == 3.0


def test_server_caps_and_engine_flags_reach_the_engine(tmp_path):
    """Session 45: in-process engines capped at the concurrency (graphs and ragged tiers stop there) read
    DSpark at c=8 0.94-0.96 where servers at the default caps read 1.01-1.06 over HTTP. --server-caps
    boots them as `sglaunch serve` does; --engine-flag passes serve flags to every arm."""
    ab, model = tiny_ab(tmp_path, "caps")
    caps = {}
    for name, extra in (("capped", []), ("server", ["--server-caps"]),
                        ("flag", ["--server-caps", "--engine-flag=--max-running-requests", "--engine-flag=5"])):
        out = tmp_path / f"{name}.json"
        assert ab.main(["--model", str(model), "--device", "cpu", "--dtype", "float32", "--concurrency", "3",
                        "--output-len", "6", "--requests", "3", "--warmup-requests", "1", "--pairs", "1",
                        "--prompt-limit", "6", "--arm", "a=plain", "--json", str(out), *extra]) == 0
        report = json.loads(out.read_text())
        caps[name] = report["runs"][0]["max_running_requests"]
        assert report["settings"]["server_caps"] is ("--server-caps" in extra)
    assert caps["capped"] == 3 and caps["flag"] == 5
    assert caps["server"] > 3  # the serve default
