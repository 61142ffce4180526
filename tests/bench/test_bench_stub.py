"""`sglaunch bench` against a stub endpoint: error accounting, partial results, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stub_server import Faults, StubServer, free_port

from sglaunch.cli.app import app  # noqa: F401 - the command is registered

FAST = ("--num-prompts", "8", "--input-len", "12", "--output-len", "6", "--warmup", "1")


def test_clean_sweep_writes_json_and_png(run_bench):
    with StubServer(Faults(tokenize=True, spec_stats=True)) as stub:
        out = run_bench("--url", stub.url, "--concurrency", "1,4", "--request-rate", "200,inf", *FAST)
        bodies = stub.state.bodies
    assert out.exit_code == 0, out.stderr
    doc = out.doc()
    assert (doc["status"], doc["partial"]) == ("ok", False)
    levels = doc["configs"][0]["levels"]
    assert [lv["label"] for lv in levels] == ["c=1", "c=4", "rate=200/s", "rate=inf"]
    assert all(lv["completed"] == 8 and lv["output_token_throughput"] > 0 for lv in levels)
    assert levels[0]["ttft_ms"]["p50"] is not None and levels[0]["itl_ms"]["p99"] is not None
    assert levels[0]["accept_length"] == 2.0 and levels[0]["verify_tokens_per_step"] == 4.0
    assert doc["requests"]["token_accuracy"] == "exact (server /tokenize)"
    assert all(isinstance(b["prompt"], list) and len(b["prompt"]) == 12 for b in bodies)
    assert bodies[0]["stream"] is True and bodies[0]["ignore_eos"] is True
    assert out.json_path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "c=4" in out.stdout and "n/a" not in out.stdout.split("rate=inf")[1].split("\n")[0]


def test_temperature_and_top_p_go_with_every_request(run_bench):
    """--temperature and --top-p reach every request (warm-up included) and the JSON's settings;
    without --top-p no top_p is sent (the server's default)."""
    for extra, want in ((("--top-p", "0.9"), 0.9), ((), None)):
        with StubServer() as stub:
            out = run_bench("--url", stub.url, "--concurrency", "2", "--no-plot", "--temperature", "0.7", *extra, *FAST)
            bodies = [b for b in stub.state.bodies if b.get("stream")]  # not the token-count calibration
        assert out.exit_code == 0, out.stderr
        assert len(bodies) == 9 and all(b["temperature"] == 0.7 and b.get("top_p") == want for b in bodies)
        assert out.doc()["settings"]["top_p"] == want
    assert run_bench("--url", "http://127.0.0.1:9", "--top-p", "1.5", *FAST).exit_code == 2


def test_same_seed_same_requests_across_runs(run_bench):
    digests = []
    for seed in ("5", "5", "6"):
        with StubServer() as stub:
            out = run_bench("--url", stub.url, "--concurrency", "2", "--seed", seed, "--no-plot",
                            "--range-ratio", "0.3", *FAST)
            prompts = sorted(json.dumps(b["prompt"]) for b in stub.state.bodies[1:])
        assert out.exit_code == 0, out.stderr
        digests.append((out.doc()["requests"]["sha256"], prompts))
    assert digests[0] == digests[1] != digests[2]


def test_server_errors_are_counted_marked_and_exit_1(run_bench):
    faults = Faults(fail_every=4, midstream_every=5, truncate_every=7)
    with StubServer(faults) as stub:
        out = run_bench("--url", stub.url, "--concurrency", "2,3", *FAST)
    assert out.exit_code == 1
    assert "Error:" in out.stderr and "requests failed" in out.stderr and "Hint:" in out.stderr
    doc = out.doc()
    assert (doc["status"], doc["partial"]) == ("errors", True)
    levels = doc["configs"][0]["levels"]
    assert all(lv["status"] == "errors" for lv in levels)
    assert sum(lv["errors"] for lv in levels) >= 4
    assert all(lv["completed"] + lv["errors"] == 8 for lv in levels)
    samples = " ".join(msg for lv in levels for msg in lv["error_samples"])
    assert "HTTP 500: injected failure" in samples
    assert "error event mid-stream" in samples and "before `data: [DONE]`" in samples


def test_slow_responses_time_out_and_count_as_errors(run_bench):
    with StubServer(Faults(slow_every=3, slow_s=3.0)) as stub:
        out = run_bench("--url", stub.url, "--concurrency", "4", "--timeout", "0.5", "--warmup", "0",
                        "--num-prompts", "6", "--output-len", "4", "--no-plot")
    assert out.exit_code == 1
    level = out.doc()["configs"][0]["levels"][0]
    assert (level["completed"], level["errors"]) == (4, 2)
    assert any(msg.startswith("timeout") for msg in level["error_samples"])


def test_server_dying_mid_run_keeps_partial_results(run_bench):
    with StubServer(Faults(die_after=10)) as stub:  # calibration, warm-up, first level (8) succeed
        out = run_bench("--url", stub.url, "--concurrency", "1,2,4", *FAST)
    assert out.exit_code == 1
    assert "stopped answering" in out.stderr and "partial results in" in out.stderr
    doc = out.doc()
    assert (doc["status"], doc["partial"]) == ("aborted", True)
    statuses = [lv["status"] for lv in doc["configs"][0]["levels"]]
    assert statuses == ["ok", "aborted", "skipped"]
    assert out.json_path.with_suffix(".png").exists()


def test_unreachable_server_is_a_clear_error(run_bench):
    out = run_bench("--url", f"http://127.0.0.1:{free_port()}", *FAST)
    assert out.exit_code == 1
    assert "Error: cannot reach http://127.0.0.1:" in out.stderr and "Hint: start the server" in out.stderr
    assert not out.json_path.exists()  # nothing was measured


def test_malformed_workload_exits_2_before_sending(run_bench, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 5}\n')
    with StubServer() as stub:
        out = run_bench("--url", stub.url, "--dataset", str(bad), *FAST)
        assert stub.state.requests == 0
    assert out.exit_code == 2
    assert "Error: malformed workload file" in out.stderr and "bad.jsonl:2" in out.stderr
    assert "Hint:" in out.stderr


def test_usage_errors_exit_2(run_bench):
    assert run_bench("--compare", "http://a:1").exit_code == 2
    out = run_bench("--url", "http://127.0.0.1:9", "--concurrency", "1,zero")
    assert out.exit_code == 2 and "--concurrency: 'zero'" in out.stderr


def test_compare_two_urls_interleaves_and_reports_ratios(run_bench, tmp_path):
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "output_len": 6})
                              for i in range(4)))
    with StubServer() as fast, StubServer(Faults(token_delay_s=0.01)) as slow:
        out = run_bench("--compare", fast.url, "--compare", slow.url, "--label", "fast", "--label", "slow",
                        "--concurrency", "1,2", "--dataset", str(chat), *FAST)
    assert out.exit_code == 0, out.stderr
    doc = out.doc()
    orders = {c["label"]: [lv["run_order"] for lv in c["levels"]] for c in doc["configs"]}
    assert orders == {"fast": [1, 4], "slow": [2, 3]}  # A B, then B A
    ratios = doc["comparison"]
    assert [r["ratio"] for r in ratios] == ["slow/fast"] * 2
    assert all(r["output_token_throughput"] < 1 < r["e2e_ms"] for r in ratios)
    assert "ratios slow/fast" in out.stdout


def test_compare_rounds_flip_the_order_and_take_the_median_ratio(run_bench, tmp_path):
    """--rounds 3 over one level: A B, B A, A B; the ratio is the median of the rounds' ratios, each
    round's listed; a level's rounds are labelled and numbered."""
    with StubServer() as fast, StubServer(Faults(token_delay_s=0.01)) as slow:
        out = run_bench("--compare", fast.url, "--compare", slow.url, "--label", "fast", "--label", "slow",
                        "--concurrency", "2", "--rounds", "3", *FAST)
    assert out.exit_code == 0, out.stderr
    doc = out.doc()
    assert doc["settings"]["rounds"] == 3
    by_label = {c["label"]: c["levels"] for c in doc["configs"]}
    assert [lv["run_order"] for lv in by_label["fast"]] == [1, 4, 5]
    assert [lv["run_order"] for lv in by_label["slow"]] == [2, 3, 6]
    assert [lv["label"] for lv in by_label["fast"]] == ["c=2 #1", "c=2 #2", "c=2 #3"]
    assert [lv["round"] for lv in by_label["slow"]] == [1, 2, 3]
    [row] = doc["comparison"]
    per_round = [s["output_token_throughput"] / f["output_token_throughput"]
                 for f, s in zip(by_label["fast"], by_label["slow"])]
    assert row["rounds"] == per_round and row["label"] == "c=2"
    assert row["output_token_throughput"] == sorted(per_round)[1] < 1
    assert "rounds" in out.stdout and "c=2 #3" in out.stdout


def test_restart_servers_measures_each_round_on_fresh_server_processes(run_bench):
    """--restart-servers with --rounds 2 and two launch lines: both servers are stopped and started
    again before round 2 (new processes, logged to bench-server-LABEL-round2.log), warmed up again,
    and every level record says which server run measured it; the ratio is still the median."""
    stub = Path(__file__).with_name("stub_server.py")
    fast, slow = f"{sys.executable} {stub}", f"{sys.executable} {stub} --token-delay-s 0.01"
    out = run_bench("--compare", fast, "--compare", slow, "--label", "fast", "--label", "slow",
                    "--concurrency", "2", "--rounds", "2", "--restart-servers", "--no-plot", *FAST)
    assert out.exit_code == 0, out.stderr
    doc = out.doc()
    assert doc["settings"]["restart_servers"] is True and doc["status"] == "ok"
    folder = out.json_path.parent
    for label in ("fast", "slow"):
        first = (folder / f"bench-server-{label}.log").read_text()
        second = (folder / f"bench-server-{label}-round2.log").read_text()
        assert first.startswith("stub pid ") and second.startswith("stub pid ")
        assert first.split()[2] != second.split()[2]  # another process
        levels = next(c["levels"] for c in doc["configs"] if c["label"] == label)
        assert [(lv["round"], lv["server_run"], lv["completed"]) for lv in levels] == [(1, 1, 8), (2, 2, 8)]
    [row] = doc["comparison"]
    assert len(row["rounds"]) == 2 and row["output_token_throughput"] < 1


def test_restart_servers_needs_rounds_and_launch_lines(run_bench):
    """--restart-servers with URLs, or with one round, is refused before anything runs (exit 2)."""
    with StubServer() as a, StubServer() as b:
        urls = run_bench("--compare", a.url, "--compare", b.url, "--rounds", "2", "--restart-servers", *FAST)
        assert urls.exit_code == 2 and "--restart-servers" in urls.stderr and "launch lines" in urls.stderr
        assert a.state.requests == 0 and b.state.requests == 0
    stub = Path(__file__).with_name("stub_server.py")
    one = run_bench("--launch", f"{sys.executable} {stub}", "--restart-servers", *FAST)
    assert one.exit_code == 2 and "--rounds 2" in one.stderr


def test_flush_cache_before_every_level_of_every_round_of_every_target(run_bench):
    """--flush-cache: each server's /flush_cache is called right before each of its levels (after
    the warm-up, in every round), never while a level runs; the settings say so. Without the flag
    no flush is asked for."""
    with StubServer(Faults(flush_cache=True)) as a, StubServer(Faults(flush_cache=True)) as b:
        out = run_bench("--compare", a.url, "--compare", b.url, "--concurrency", "1,2", "--rounds", "2",
                        "--flush-cache", "--no-plot", *FAST)
        runs = [(stub.state.flushes, stub.state.requests) for stub in (a, b)]
    assert out.exit_code == 0, out.stderr
    assert out.doc()["settings"]["flush_cache"] is True
    for flushes, requests in runs:  # 2 levels x 2 rounds of 8 requests, each after a flush
        first = requests - 4 * 8
        assert first >= 1  # the warm-up (and the calibration request) came before the first flush
        assert flushes == [first, first + 8, first + 16, first + 24]
    with StubServer(Faults(flush_cache=True)) as stub:
        plain = run_bench("--url", stub.url, "--concurrency", "2", "--no-plot", *FAST)
        assert stub.state.flush_calls == 0
    assert plain.exit_code == 0 and plain.doc()["settings"]["flush_cache"] is False


def test_flush_cache_retries_a_busy_server_then_gives_up_clearly(run_bench, monkeypatch):
    """A 400 (requests in flight) is asked again a few times; a server that stays busy stops the
    run with a clear error, the levels not run marked skipped."""
    from sglaunch.bench import sweep

    monkeypatch.setattr(sweep, "FLUSH_RETRY_S", 0.01)
    with StubServer(Faults(flush_cache=True, flush_busy=3)) as stub:
        out = run_bench("--url", stub.url, "--concurrency", "1,2", "--flush-cache", "--no-plot", *FAST)
        assert (stub.state.flush_calls, len(stub.state.flushes)) == (3 + 2, 2)
    assert out.exit_code == 0, out.stderr
    with StubServer(Faults(flush_cache=True, flush_busy=1000)) as stub:
        out = run_bench("--url", stub.url, "--concurrency", "1,2", "--flush-cache", "--no-plot", *FAST)
        assert stub.state.flush_calls == sweep.FLUSH_ATTEMPTS and stub.state.requests == 2  # no level ran
    assert out.exit_code == 1
    said = " ".join(out.stderr.split())  # NOTE: the console wraps long lines
    assert f"{stub.url}/flush_cache still refused to flush after {sweep.FLUSH_ATTEMPTS} tries" in said
    assert "1 request(s) in flight" in said and "Hint:" in said
    doc = out.doc()
    assert doc["status"] == "aborted" and [lv["status"] for lv in doc["configs"][0]["levels"]] == ["skipped"] * 2


def test_flush_cache_against_a_server_without_the_route_is_a_clear_error(run_bench):
    """A server that has no /flush_cache (404, the stub without it; 405 alike) stops the run before
    any level, naming the URL and what to do instead."""
    with StubServer() as stub:
        out = run_bench("--url", stub.url, "--concurrency", "1,2", "--flush-cache", "--no-plot", *FAST)
        assert stub.state.requests == 2  # the calibration and the warm-up, no level
    assert out.exit_code == 1
    said = " ".join(out.stderr.split())  # NOTE: the console wraps long lines
    assert f"--flush-cache: {stub.url}/flush_cache answered 404" in said
    assert "has no /flush_cache" in said and "drop --flush-cache" in said and "--restart-servers" in said
    assert [lv["status"] for lv in out.doc()["configs"][0]["levels"]] == ["skipped", "skipped"]


def test_subprocess_json_mode(tmp_path):
    with StubServer() as stub:
        proc = subprocess.run([sys.executable, "-m", "sglaunch", "bench", "--url", stub.url, "--json",
                               "--concurrency", "2", "-o", str(tmp_path / "r.json"), *FAST],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == json.loads((tmp_path / "r.json").read_text())
    assert doc["configs"][0]["model"] == "stub-model" and doc["schema"] == "sglaunch-bench/1"
