"""`check-config --script FILE`: the launch command(s) read out of a shell script."""

from __future__ import annotations

import json

from fe_util import invoke

SCRIPT = """#!/bin/bash
# DSpark on two GPUs
export SGLANG_RAGGED_VERIFY_MODE=compact
TP=${TP:-2}
echo "remember --enable-deepep-waterfill"      # a mention, not a launch
python3 -m sglang.launch_server \\
    --model-path /models/target \\
    --tp $TP \\
    --speculative-algorithm DSPARK --speculative-draft-model-path org/draft \\
    --speculative-dspark-block-size 7 \\
    --optimistic-prefill-retries=1 "$@"

SGLANG_RAGGED_VERIFY_MODE=fast sglang serve --model-path /models/other --port 31000
"""


def run(tmp_path, text: str, *extra: str):
    script = tmp_path / "launch.sh"
    script.write_text(text)
    result = invoke("check-config", "--no-machine", "--json", "--script", str(script), *extra)
    return script, result


def test_every_launch_in_the_script_is_checked(tmp_path):
    script, result = run(tmp_path, SCRIPT)
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    first, second = data["launches"]
    assert data["ok"] is False
    assert first["launch"].startswith(f"{script}:6") and second["launch"].startswith(f"{script}:13")
    codes = [d["code"] for d in first["diagnostics"]]
    assert "FLAG003" in codes and "RAGGED001" not in codes  # the export applies to the command
    assert "FLAG003" not in [d["code"] for d in second["diagnostics"]]  # the echo is not a launch
    assert "RAGGED003" in [d["code"] for d in second["diagnostics"]]  # the prefix applies to it only
    tp = next(s for s in first["settings"] if s["flag"] == "--tp-size")
    assert tp["value"] == "$TP" and "unexpanded" in tp["origin"]
    assert any('"$@"' in note for note in first["notes"])
    origin = next(d["origin"] for d in first["diagnostics"] if d["code"] == "FLAG003")
    assert origin == f"{script}:6"


def test_command_line_flags_override_the_script(tmp_path):
    _, result = run(tmp_path, "sglang serve --model-path org/model --port 8000\n", "--port", "9000")
    assert result.exit_code == 0
    settings = {s["flag"]: s for s in json.loads(result.stdout)["settings"]}
    assert settings["--port"] == {"flag": "--port", "value": 9000, "origin": "cli"}


def test_no_launch_command_is_a_usage_error(tmp_path):
    _, result = run(tmp_path, "echo hello\npython3 train.py --tp 8\n")
    assert result.exit_code == 2
    assert "no SGLang launch command found" in result.stderr and "Hint:" in result.stderr


def test_unknown_flag_in_script_names_the_line(tmp_path):
    script, result = run(tmp_path, "\n\npython -m sglang.launch_server --model-path /m --tp-sise 2\n")
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert f"unknown flag --tp-sise in {script}:3" in err and "did you mean --tp-size" in err


def test_missing_script(tmp_path):
    result = invoke("check-config", "--script", str(tmp_path / "absent.sh"))
    assert result.exit_code == 2 and "cannot read script" in result.stderr


def test_unexpanded_model_path_is_never_replaced_by_the_default_model(tmp_path):
    """`--model-path "$MODEL"`: unknown until the script runs, so no built-in model, no checks
    against it (a false --tp-size error against SmolLM2's 9 heads was reported before)."""
    _, result = run(tmp_path, 'MODEL=/models/x\npython -m sglang.launch_server --model-path "$MODEL" --tp 2\n')
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    settings = {s["flag"]: s for s in data["settings"]}
    assert settings["--model-path"]["value"] == "$MODEL"
    assert "unexpanded" in settings["--model-path"]["origin"]
    assert "--served-model-name" not in settings  # the default model's name was not resolved either
    codes = [d["code"] for d in data["diagnostics"]]
    assert "PAR005" not in codes
    (note,) = [d for d in data["diagnostics"] if d["code"] == "FLAG014"]
    assert "$MODEL" in note["message"] and "load checkpoints" in note["message"]


def test_unexpanded_tp_skips_the_head_check_and_says_so(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_attention_heads": 9, "num_key_value_heads": 3,
        "hidden_size": 576, "num_hidden_layers": 2, "vocab_size": 100}))
    _, literal = run(tmp_path, f"python -m sglang.launch_server --model-path {model} --tp 2\n")
    assert "PAR005" in [d["code"] for d in json.loads(literal.stdout)["diagnostics"]]  # the check is real
    _, result = run(tmp_path, f"python -m sglang.launch_server --model-path {model} --tp ${{TP}} --port 1\n")
    data = json.loads(result.stdout)
    codes = [d["code"] for d in data["diagnostics"]]
    assert "PAR005" not in codes and result.exit_code == 0, result.output
    (note,) = [d for d in data["diagnostics"] if d["code"] == "FLAG014"]
    assert "${TP}" in note["message"] and "check heads" in note["message"]


def test_a_literal_value_on_the_command_line_replaces_the_shell_text(tmp_path):
    _, result = run(tmp_path, "python -m sglang.launch_server --model-path /m --port $PORT\n", "--port", "0")
    data = json.loads(result.stdout)
    assert "FLAG014" not in [d["code"] for d in data["diagnostics"]]
    assert "FLAG011" in [d["code"] for d in data["diagnostics"]]  # port 0 is checked, and out of range
