"""benchmarks/tp_scaling.py on the CPU: TP 1 and 2 over gloo on the small shape (tokens identical,
JSON written, table printed last), its argument checks, and the trace/table helpers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_script_tp_scaling", ROOT / "benchmarks/tp_scaling.py")
tps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tps)

SMALL_RUN = ["--shape", "small", "--device", "cpu", "--dtype", "float32", "--tp-sizes", "1,2", "--prompt-len", "12",
             "--output-len", "6", "--concurrency", "1,3", "--check-prompts", "2", "--check-tokens", "6",
             "--step-samples", "3", "--in-process"]


@pytest.fixture
def keep_torch_threads():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_tp1_and_tp2_over_gloo_give_identical_tokens(tmp_path, capsys, keep_torch_threads):
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    code = tps.main(["--out", str(out), "--model-dir", str(tmp_path / "model"), *SMALL_RUN])
    stdout = capsys.readouterr().out
    doc = json.loads((out / "tp_scaling.json").read_text())
    assert code == 0 and doc["passed"], stdout
    assert [c["config"] for c in doc["configs"]] == ["tp1-plain", "tp1-dspark", "tp2-plain", "tp2-dspark"]
    by_name = {c["config"]: c for c in doc["configs"]}
    for name in ("tp2-plain", "tp2-dspark"):
        assert by_name[name]["tokens_vs_tp1"]["identical"], by_name[name]["tokens_vs_tp1"]
        assert by_name[name]["first_logits_max_abs_diff"] <= doc["logits_tolerance"] == 1e-3
    assert by_name["tp2-dspark"]["tokens_vs_plain_tp1"]["identical"]  # DSpark is lossless
    forced = by_name["tp2-plain"]["forced_check"]  # TP 1's tokens forced: every step compared
    assert forced["passed"] and forced["steps"] == forced["argmax_agree"] == 2 * 6
    assert forced["max_abs_diff_top_k"] <= doc["logits_tolerance"] and not forced["mismatches_beyond_tol"]
    assert "forced_check" not in by_name["tp1-plain"] and "forced_check" not in by_name["tp2-dspark"]
    tp2 = by_name["tp2-plain"]
    assert [row["batch"] for row in tp2["steps"]] == [1, 3] and all(r["all_reduce_share"] > 0 for r in tp2["steps"])
    assert "verify_s" in by_name["tp2-dspark"]["steps"][0] and "speedup_vs_tp1" in tp2["steps"][1]
    assert [lv["output_tokens"] for lv in tp2["levels"]] == [4 * 6, 6 * 6] and "ratio_to_tp1" in tp2["levels"][0]
    assert "ratio_to_plain" in by_name["tp2-dspark"]["levels"][0]
    # the table comes last on stdout, and states the tolerance
    lines = stdout.strip().splitlines()
    assert lines[-len(doc["table"]):] == doc["table"] and "tolerance 0.001" in lines[-1]
    assert lines[-len(doc["table"]) + 5].split()[:2] == ["tp2-plain", "1"] and "same" in lines[-len(doc["table"]) + 5]
    assert doc["model"]["parameters"] > 0 and (tmp_path / "model" / tps.BUILD_MARKER).is_file()
    # a second run reuses the build
    assert tps.existing_build(tps.parse_args(["--out", str(out), "--model-dir", str(tmp_path / "model"),
                                              *SMALL_RUN]))["build_s"] == doc["model"]["build_s"]


def parse(*extra: str, gpus: int | None = None, monkeypatch=None):
    if gpus is not None:
        monkeypatch.setattr(tps, "visible_gpus", lambda: gpus)
    return tps.parse_args(["--out", "o", *extra])


@pytest.mark.parametrize("extra, message", [
    (("--device", "cpu", "--tp-sizes", "2,4"), "must include 1"),
    (("--device", "cpu", "--shape", "small", "--tp-sizes", "1,16"), "must divide both"),
    (("--device", "cpu", "--tp-sizes", "1,3"), "must divide both"),
    (("--device", "cpu", "--tp-sizes", "1,two"), "comma-separated integers"),
    (("--device", "cpu", "--concurrency", "0"), "positive integers"),
    (("--device", "cpu", "--output-len", "0"), "--output-len must be at least 1"),
    (("--device", "cpu", "--time-budget", "0"), "must be positive"),
    (("--device", "cpu", "--shape", "70b"), "invalid choice"),
])
def test_bad_arguments_are_refused(extra, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*extra)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_tp_sizes_follow_the_visible_gpus(monkeypatch, capsys):
    assert parse(gpus=2, monkeypatch=monkeypatch).tp_list == [1, 2]
    assert parse(gpus=8, monkeypatch=monkeypatch).tp_list == [1, 2, 4, 8]
    assert parse("--tp-sizes", "4,1,2", gpus=4, monkeypatch=monkeypatch).tp_list == [1, 2, 4]
    with pytest.raises(SystemExit):
        parse("--tp-sizes", "1,2,4", gpus=2, monkeypatch=monkeypatch)
    assert "needs 4 GPUs, 2 visible" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(gpus=0, monkeypatch=monkeypatch)
    assert parse("--device", "cpu").tp_list == [1, 2]


def test_defaults_configurations_and_serve_flags(monkeypatch):
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "static")  # the caller's value never leaks in
    args = parse("--device", "cpu", "--tp-sizes", "1,2", "--model-dir", "M", "--serve-args=--attention-backend torch")
    assert args.logits_tol == 0.25 and args.levels == [(1, 4), (64, 64)] and args.shape == "8b"
    assert parse("--device", "cpu", "--dtype", "float32").logits_tol == 1e-3
    assert parse("--device", "cpu", "--shape", "4b").model_dir.name == "4b-bfloat16"
    assert tps.configurations(args) == [("tp1-plain", 1, False), ("tp1-dspark", 1, True),
                                        ("tp2-plain", 2, False), ("tp2-dspark", 2, True)]
    assert [c[0] for c in tps.configurations(parse("--device", "cpu", "--dspark", "only"))] == ["tp1-dspark", "tp2-dspark"]
    tokens, env = tps.serve_tokens(args, 2, False)
    assert tokens[tokens.index("--tp-size") + 1] == "2" and tokens[-2:] == ["--attention-backend", "torch"]
    assert "--speculative-algorithm" not in tokens and "SGLANG_RAGGED_VERIFY_MODE" not in env
    tokens, env = tps.serve_tokens(args, 1, True)
    assert tokens[tokens.index("--speculative-algorithm") + 1] == "DSPARK" and env["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    assert tokens[tokens.index("--speculative-draft-model-path") + 1] == str(Path("M") / "drafter")
    assert int(tokens[tokens.index("--max-total-tokens") + 1]) >= 64 * (128 + tps.step_budget(args, True))
    assert tps.feature_layers(36) == [1, 9, 17, 25, 33] and tps.feature_layers(2) == [0]


def test_nccl_kernels_are_summed_per_collective():
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(args)", "ts": 10, "dur": 30},
        {"cat": "kernel", "name": "ncclKernel_AllGather_RING_LL_Sum_bf16", "ts": 50, "dur": 5},
        {"cat": "gpu_user_annotation", "name": "nccl:all_reduce", "ts": 100, "dur": 50},
        {"cat": "kernel", "name": "ncclDevKernel_Generic_1", "ts": 110, "dur": 20},  # inside the annotation
        {"cat": "kernel", "name": "ncclDevKernel_Generic_1", "ts": 300, "dur": 7},
        {"cat": "kernel", "name": "ampere_bf16_gemm", "ts": 0, "dur": 999},
        {"cat": "cpu_op", "name": "nccl:all_reduce", "ts": 0, "dur": 999},
    ]}
    found = tps.comm_from_trace(trace)
    assert found["all_reduce_s"] == pytest.approx(50e-6) and found["all_reduce_kernels"] == 2
    assert found["all_gather_s"] == pytest.approx(5e-6) and found["other_nccl_kernels"] == 1


def test_token_mismatch_reports_the_tp1_margin_and_the_table_shows_errors():
    reference = {"config": "tp1-plain", "tp": 1, "dspark": False,
                 "check": {"tokens": [[5, 6, 7]], "top_k": [[[[5], [1.0]], [[6, 9], [2.0, 1.9]], [[7], [0.5]]]]}}
    tie = {"config": "tp2-plain", "tp": 2, "dspark": False, "check": {"tokens": [[5, 9, 1]]}}
    far = {"config": "tp4-plain", "tp": 4, "dspark": False, "check": {"tokens": [[5, 6, 3]]}}
    near = tps.compare_tokens(tie, reference, tol=0.25)
    assert near == {"identical": False, "against": "tp1-plain", "prompt": 0, "token_index": 1,
                    "margin": pytest.approx(0.1), "near_tie": True}
    assert tps.compare_tokens(far, reference, tol=0.25)["near_tie"] is False  # 3 is not in TP 1's top-k
    assert tps.compare_tokens(reference, reference, tol=0.25)["identical"]
    tie["tokens_vs_tp1"] = near
    results = [reference, tie, {"config": "tp8-plain", "tp": 8, "dspark": False, "error": "killed after 90 s"}]
    assert not tps.passed(results)
    assert tps.tokens_cell(tie) == "DIFF p0@1 m=0.100 tie" and tps.tokens_cell(reference) == "ref"
    assert "tp8-plain    ERROR killed after 90 s" in tps.table_lines(results, 0.25)


def test_forced_check_compares_every_step_and_flags_a_real_mismatch(tmp_path, keep_torch_threads):
    pytest.importorskip("transformers")
    from engine_vs_hf import make_prompts

    from sglaunch.engine.launch import create_engine

    args = tps.parse_args(["--out", str(tmp_path / "o"), "--model-dir", str(tmp_path / "m"), *SMALL_RUN])
    tps.build_models(args)
    tokens, environ = tps.serve_tokens(args, 1, False)
    engine, cluster = create_engine(tps.sweep.build_config(tokens, environ))
    try:
        prompts = make_prompts(2, 12, tps.SHAPES["small"]["vocab_size"])
        reference, _ = tps.greedy_check(engine, prompts, 6, keep_top_k=True)
        same = tps.forced_check(engine, prompts, reference, tol=1e-3)
        assert same["passed"] and same["steps"] == same["argmax_agree"] == 12 and same["max_abs_diff_top_k"] < 1e-5
        # a reference whose step 2 of prompt 1 prefers another token by a clear margin
        bad = json.loads(json.dumps(reference))
        ids, values = bad["top_k"][1][2]
        ids[0], ids[1] = ids[1], ids[0]
        values[0] = values[1] + 1.0
        found = tps.forced_check(engine, prompts, bad, tol=1e-3)
        assert not found["passed"] and found["argmax_agree"] == 11
        assert [(m["prompt"], m["token_index"]) for m in found["mismatches_beyond_tol"]] == [(1, 2)]
        # the same swap inside the tolerance is a near-tie, not a failure
        values[0] = values[1] + 1e-4
        assert tps.forced_check(engine, prompts, bad, tol=1e-3)["passed"]
    finally:
        cluster.stop(engine)


def test_pass_criterion():
    plain2 = {"config": "tp2-plain", "tp": 2, "dspark": False, "forced_check": {"passed": True},
              "tokens_vs_tp1": {"identical": False, "near_tie": True}}
    dspark2 = {"config": "tp2-dspark", "tp": 2, "dspark": True, "tokens_vs_tp1": {"identical": True}}
    assert tps.passed([plain2, dspark2])
    assert not tps.passed([{**plain2, "forced_check": {"passed": False}}, dspark2])
    assert not tps.passed([{k: v for k, v in plain2.items() if k != "forced_check"}])  # the check must run
    assert not tps.passed([plain2, {**dspark2, "tokens_vs_tp1": {"identical": False, "near_tie": False}}])
    assert not tps.passed([plain2, {**dspark2, "error": "boom"}])
