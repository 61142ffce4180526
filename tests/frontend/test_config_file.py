"""`--config FILE.yaml`: SGLang's precedence, key rules, origins, and every bad-input case."""

from __future__ import annotations

import json
import os

import pytest

from fe_util import check_json, invoke


def settings(report: dict) -> dict[str, tuple]:
    return {s["flag"]: (s["value"], s["origin"]) for s in report["settings"]}


def write(tmp_path, text: str, name: str = "launch.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cli_beats_yaml_beats_default(tmp_path):
    cfg = write(tmp_path, "# serving config\ntp-size: 4\nport: 8080\nenable-metrics: true\n"
                          "disable-radix-cache: false\ncuda-graph-bs: [1, 2, 4]\nhost: 0.0.0.0\n")
    _, report = check_json("--config", str(cfg), "--port", "9000")
    got = settings(report)
    assert got["--tp-size"] == (4, f"{cfg}:2")
    assert got["--port"] == (9000, "cli")
    assert got["--enable-metrics"] == (True, f"{cfg}:4")
    assert "--disable-radix-cache" not in got  # false on a switch drops it, as SGLang does
    assert got["--cuda-graph-bs"] == ([1, 2, 4], f"{cfg}:6")
    assert got["--host"] == ("0.0.0.0", f"{cfg}:7")
    assert "--page-size" not in got  # defaults are only listed with --all


def test_all_lists_defaults(tmp_path):
    result = invoke("check-config", "--no-machine", "--all")
    assert result.exit_code == 0
    assert "--page-size" in result.stdout and "default" in result.stdout


def test_yaml_history_checks_apply(tmp_path):
    cfg = write(tmp_path, "enable-deepep-waterfill: true\nfp4-gemm-backend: cutlass\n")
    code, report = check_json("--config", str(cfg))
    assert code == 1
    found = {d["code"]: d for d in report["diagnostics"]}
    assert found["FLAG003"]["origin"] == f"{cfg}:1"
    assert found["FLAG006"]["origin"] == f"{cfg}:2"


def test_snake_case_key_is_reported(tmp_path):
    cfg = write(tmp_path, "tp_size: 2\n")
    code, report = check_json("--config", str(cfg))
    assert code == 1
    cfg001 = next(d for d in report["diagnostics"] if d["code"] == "CFG001")
    assert "tp-size" in cfg001["fix"]


def test_equals_form_and_null_value(tmp_path):
    cfg = write(tmp_path, "tp-size:\nport: 8000\n")
    _, report = check_json(f"--config={cfg}")
    got = {d["code"] for d in report["diagnostics"]}
    assert {"CFG002", "CFG003"} <= got
    assert settings(report)["--port"] == (8000, f"{cfg}:2")


@pytest.mark.parametrize("text, message", [
    ("tp-size: 2\n  port: [\n", "YAML syntax error in {cfg}:2"),
    ("- tp-size\n- 2\n", "the YAML root is a list"),
    ("just a string\n", "the YAML root is a single value"),
    ("tp-size: 2\ntp-size: 4\n", "key 'tp-size' is set twice (first on line 1)"),
    ("tp-size: two\n", "--tp-size expects an integer, got 'two'"),
    ("enable-metrics: yes please\n", "--enable-metrics is a switch"),
    ("port: [1, 2]\n", "--port takes one value, got a list"),
    ("tp-sise: 2\n", "unknown flag --tp-sise (key 'tp-sise' in {cfg}:1)"),
    ("config: other.yaml\n", "a config file cannot include another"),
    ("tp-size: !!python/object:os.system x\n", "{cfg}:1: cannot read the value"),
])
def test_bad_config_files(tmp_path, text, message):
    cfg = write(tmp_path, text)
    result = invoke("check-config", "--no-machine", "--config", str(cfg))
    assert result.exit_code == 2, result.output
    err = " ".join(result.stderr.split())
    assert err.startswith("Error: ") and message.format(cfg=cfg) in err
    assert "Hint: " in result.stderr
    assert "Traceback" not in result.output


def test_missing_unreadable_and_wrong_kind(tmp_path):
    result = invoke("check-config", "--config", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2 and "config file not found" in result.stderr
    json_cfg = write(tmp_path, "{}", "launch.json")
    result = invoke("check-config", "--config", str(json_cfg))
    assert result.exit_code == 2 and "must be YAML" in result.stderr
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    result = invoke("check-config", "--config", str(folder))
    assert result.exit_code == 2 and "is a directory" in result.stderr
    if os.geteuid() != 0:  # root reads everything
        locked = write(tmp_path, "tp-size: 2\n", "locked.yaml")
        locked.chmod(0)
        result = invoke("check-config", "--config", str(locked))
        assert result.exit_code == 2 and "cannot read config file" in result.stderr
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    result = invoke("check-config", "--config", str(binary))
    assert result.exit_code == 2 and "cannot read config file" in result.stderr


def test_config_given_twice_and_missing_path(tmp_path):
    a, b = write(tmp_path, "tp-size: 2\n", "a.yaml"), write(tmp_path, "tp-size: 4\n", "b.yaml")
    result = invoke("check-config", "--config", str(a), "--config", str(b))
    assert result.exit_code == 2 and "--config given 2 times" in result.stderr
    result = invoke("check-config", "--config")
    assert result.exit_code == 2 and "--config needs a file path" in result.stderr


def test_empty_file_means_no_flags(tmp_path):
    cfg = write(tmp_path, "# nothing yet\n")
    code, report = check_json("--config", str(cfg))
    assert code == 0
    assert all(s["origin"] in ("resolved",) for s in report["settings"])


def test_keys_the_sglang_config_loader_refuses(tmp_path):
    """Up to 0.5.22 SGLang's --config loader refuses keys of actions other than store/store_true,
    by dest, so the new flag that a deprecated alias writes into is refused too; 0.5.23 fixed that."""
    cfg = write(tmp_path, "cuda-graph-max-bs-decode: 8\n")
    code, report = check_json("--config", str(cfg))
    (found,) = [d for d in report["diagnostics"] if d["code"] == "CFG004"]
    assert code == 1 and "--cuda-graph-max-bs" in found["message"] and found["origin"] == f"{cfg}:1"
    code, report = check_json("--release", "0.5.23", "--config", str(cfg))
    assert "CFG004" not in [d["code"] for d in report["diagnostics"]]
    cfg = write(tmp_path, "disable-cuda-graph: true\n")  # a deprecated switch: refused in every release
    for release in ("0.5.16", "0.5.23"):
        _, report = check_json("--release", release, "--config", str(cfg))
        assert "CFG004" in [d["code"] for d in report["diagnostics"]], release
    cfg = write(tmp_path, "page-size: 16\nenable-metrics: true\n")  # plain value and switch: fine
    _, report = check_json("--config", str(cfg))
    assert "CFG004" not in [d["code"] for d in report["diagnostics"]]
