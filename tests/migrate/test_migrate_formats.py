"""Every format: fixtures rewritten as expected, DSpark env insertion, unparseable input, robustness."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglaunch.migrate.engine import detect_format, migrate_text
from sglaunch.migrate.rules import load_rules

FIXTURES = Path(__file__).parent / "fixtures"
RULES_16 = load_rules().between("0.5.15", "0.5.16")
RULES_20 = load_rules().between("0.5.15", "0.5.20")


def migrate(text: str, fmt: str, to: str = "0.5.16", unsafe: bool = False):
    rules = RULES_16 if to == "0.5.16" else RULES_20
    return migrate_text(text, fmt, rules, to, unsafe)


@pytest.mark.parametrize("name, fmt, unsafe", [
    ("launch.sh", "shell", True),
    ("deployment.yaml", "k8s", False),
    ("docker-compose.yaml", "compose", False),
    ("sglang-config.yaml", "config", True),
    ("Dockerfile", "dockerfile", True),
])
def test_fixture_is_rewritten_as_expected_and_idempotent(name, fmt, unsafe):
    text = (FIXTURES / name).read_text()
    assert detect_format(name, text) == fmt
    result = migrate(text, fmt, "0.5.20", unsafe)
    assert result.error is None
    assert result.text == (FIXTURES / "expected" / name).read_text()
    assert migrate(result.text, fmt, "0.5.20", unsafe).text == result.text


DSPARK = "--speculative-algorithm DSPARK --speculative-draft-model-path /d"


@pytest.mark.parametrize("fmt, text, expected", [
    ("shell", f"python -m sglang.launch_server {DSPARK}\n",
     f"SGLANG_RAGGED_VERIFY_MODE=compact python -m sglang.launch_server {DSPARK}\n"),
    ("shell", f"export HF_HOME=/c\npython -m sglang.launch_server {DSPARK}\n",
     f"export HF_HOME=/c\nexport SGLANG_RAGGED_VERIFY_MODE=compact\npython -m sglang.launch_server {DSPARK}\n"),
    ("shell", f"docker run img python -m sglang.launch_server {DSPARK}\n",
     f"docker run -e SGLANG_RAGGED_VERIFY_MODE=compact img python -m sglang.launch_server {DSPARK}\n"),
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: x\n"
            "    command: [python3, -m, sglang.launch_server, --speculative-algorithm, DSPARK]\n",
     "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: x\n"
     "    env:\n    - name: SGLANG_RAGGED_VERIFY_MODE\n      value: \"compact\"\n"
     "    command: [python3, -m, sglang.launch_server, --speculative-algorithm, DSPARK]\n"),
    ("compose", "services:\n  s:\n    environment:\n      - A=1\n"
                "    command: python -m sglang.launch_server --speculative-algorithm DSPARK\n",
     "services:\n  s:\n    environment:\n      - A=1\n      - SGLANG_RAGGED_VERIFY_MODE=compact\n"
     "    command: python -m sglang.launch_server --speculative-algorithm DSPARK\n"),
    ("dockerfile", 'FROM x\nCMD ["sglang", "serve", "--speculative-algorithm", "DSPARK"]\n',
     'FROM x\nENV SGLANG_RAGGED_VERIFY_MODE=compact\nCMD ["sglang", "serve", "--speculative-algorithm", "DSPARK"]\n'),
])
def test_dspark_gets_compact_verify_mode_in_the_fitting_form(fmt, text, expected):
    result = migrate(text, fmt)
    assert result.text == expected
    assert migrate(result.text, fmt).text == expected


def test_dspark_in_config_yaml_is_reported_not_rewritten():
    text = "speculative-algorithm: DSPARK\n"
    result = migrate(text, "config")
    assert result.text == text
    assert [f.level for f in result.findings if f.rule_id == "R516-07"] == ["manual"]


@pytest.mark.parametrize("value, level", [("static", "info"), ("cap-accept", "info"), ("fast", "manual")])
def test_explicit_verify_mode_is_kept_and_invalid_values_reported(value, level):
    text = f"SGLANG_RAGGED_VERIFY_MODE={value} python -m sglang.launch_server {DSPARK}\n"
    result = migrate(text, "shell")
    assert result.text == text
    found = [f for f in result.findings if f.rule_id == "R516-07"]
    assert [f.level for f in found] == [level]
    if level == "manual":
        assert "invalid" in found[0].message


def test_compact_already_set_is_clean():
    text = f"export SGLANG_RAGGED_VERIFY_MODE=compact\nsglang serve {DSPARK}\n"
    assert migrate(text, "shell").findings == []


@pytest.mark.parametrize("name, fmt", [("broken.yaml", "compose")])
def test_unparseable_file_is_reported_and_left_alone(name, fmt):
    text = (FIXTURES / name).read_text()
    result = migrate(text, fmt)
    assert result.error and result.text == text
    assert result.findings[0].level == "error"


def test_unparseable_dockerfile_exec_form_is_left_alone():
    text = 'FROM x\nCMD ["python", "-m", "sglang.launch_server", "--enable-deepep-waterfill"\n'
    assert migrate(text, "dockerfile").text == text


@pytest.mark.parametrize("name", ["messy_slurm.sh", "messy_array.sh", "messy_docker.sh", "launch.sh"])
def test_messy_scripts_keep_every_non_launch_line(name):
    text = (FIXTURES / name).read_text()
    result = migrate(text, "shell", "0.5.20", unsafe=True)
    assert result.error is None
    before, after = text.splitlines(), result.text.splitlines()
    untouched = [line for line in before if line.lstrip().startswith(("#", "echo", "grep", "e.g."))
                 or "bench_serving" in line]
    for line in untouched:
        assert line in after, f"non-launch line changed: {line!r}"
    assert migrate(result.text, "shell", "0.5.20", unsafe=True).text == result.text


def test_slurm_fixture_renames_only_inside_the_launch():
    text = (FIXTURES / "messy_slurm.sh").read_text()
    result = migrate(text, "shell", "0.5.20")
    assert result.text.count("--enable-deepep-waterfill") == text.count("--enable-deepep-waterfill") - 1
    assert "--cuda-graph-max-bs-decode=128" in result.text


def test_config_yaml_keeps_comments_and_order():
    text = "# top\nmodel-path: /m   # keep me\nenable-deepep-waterfill: true\nmoe-a2a-backend: mooncake\n"
    result = migrate(text, "config")
    assert result.text == "# top\nmodel-path: /m   # keep me\nenable-waterfill: true\nmoe-a2a-backend: mooncake\n"


def test_k8s_shell_script_in_block_scalar():
    text = ("apiVersion: batch/v1\nkind: Job\nspec:\n  template:\n    spec:\n      containers:\n"
            "      - name: s\n        image: x\n        command: [/bin/bash, -c]\n        args:\n"
            "        - |\n          set -e\n          python3 -m sglang.launch_server \\\n"
            "            --enable-deepep-waterfill --moe-a2a-backend deepep\n")
    result = migrate(text, "k8s")
    assert result.text == text.replace("--enable-deepep-waterfill", "--enable-waterfill")
    assert result.findings[0].line == 14


def test_both_old_and_new_flag_present_is_manual():
    text = "sglang serve --enable-deepep-waterfill --enable-waterfill\n"
    result = migrate(text, "shell")
    assert result.text == text
    assert result.findings[0].level == "manual"


def test_dynamic_value_is_not_guessed():
    text = "sglang serve --optimistic-prefill-retries $N\n"
    result = migrate(text, "shell", unsafe=True)
    assert result.text == text and result.findings[0].level == "manual"


def test_revalidation_reports_flags_unknown_at_target():
    text = "sglang serve --enable-response-store\n"  # added in 0.5.20; the target is 0.5.16
    result = migrate(text, "shell")
    assert [f.rule_id for f in result.findings] == ["validate"]
    assert "0.5.20" in result.findings[0].message and result.findings[0].level == "manual"


def test_revalidation_reports_a_flag_no_release_has():
    result = migrate("sglang serve --enable-warp-drive --tp-size 2\n", "shell")
    assert [f.rule_id for f in result.findings] == ["validate"]
    assert "--enable-warp-drive" in result.findings[0].message and result.findings[0].level == "manual"


def test_revalidation_reports_an_abbreviation_that_becomes_ambiguous():
    """`--dcp` is a unique prefix of --dcp-size in 0.5.16 (argparse expands it), but 0.5.17 adds
    --dcp-comm-backend and --dcp-replicate-q-proj: argparse stops there ('ambiguous option')."""
    assert migrate("sglang serve --dcp 2\n", "shell").findings == []
    result = migrate("sglang serve --dcp 2\n", "shell", "0.5.20")
    assert any(f.rule_id == "validate" and "ambiguous" in f.message for f in result.findings), result.findings


@pytest.mark.parametrize("quote", ['"', "'"])
def test_compose_sh_c_inside_a_command_string_is_rewritten(quote):
    text = ("services:\n  s:\n    environment:\n      - A=1\n"
            f"    command: sh -c {quote}pip install x && python3 -m sglang.launch_server "
            f"--enable-deepep-waterfill --speculative-algorithm DSPARK{quote}\n")
    result = migrate(text, "compose")
    assert result.text == text.replace("--enable-deepep-waterfill",
                                       "--enable-waterfill --moe-a2a-backend deepep").replace(
        "      - A=1\n", "      - A=1\n      - SGLANG_RAGGED_VERIFY_MODE=compact\n")
    assert sorted((f.rule_id, f.line) for f in result.findings) == [("R516-01", 5), ("R516-07", 5)]
    assert migrate(result.text, "compose").text == result.text


@pytest.mark.parametrize("text, expected", [
    ("FROM x\nRUN python3 -m sglang.launch_server --enable-deepep-waterfill & sleep 5\n",
     "FROM x\nRUN python3 -m sglang.launch_server --enable-waterfill --moe-a2a-backend deepep & sleep 5\n"),
    ("FROM x\nRUN --mount=type=cache,target=/c sglang serve --speculative-algorithm DSPARK\n",
     "FROM x\nRUN --mount=type=cache,target=/c SGLANG_RAGGED_VERIFY_MODE=compact sglang serve "
     "--speculative-algorithm DSPARK\n"),
    ('FROM x\nRUN ["python3", "-m", "sglang.launch_server", "--enable-deepep-waterfill"]\n',
     'FROM x\nRUN ["python3", "-m", "sglang.launch_server", "--enable-waterfill", "--moe-a2a-backend", "deepep"]\n'),
    ("FROM x\nRUN pip install sglang && echo 'python -m sglang.launch_server --enable-deepep-waterfill'\n",
     "FROM x\nRUN pip install sglang && echo 'python -m sglang.launch_server --enable-deepep-waterfill'\n"),
])
def test_dockerfile_run_lines_that_launch_sglang(text, expected):
    result = migrate(text, "dockerfile")
    assert result.error is None
    assert result.text == expected
    assert migrate(expected, "dockerfile").text == expected


def test_helm_values_with_a_port_key_are_not_a_config_file():
    text = "replicaCount: 1\nport: 30000\nimage:\n  tag: v1\nservice:\n  port: 80\nresources: {}\n"
    assert detect_format("values.yaml", text) == "yaml"
    assert detect_format("c.yaml", "model-path: /m\ntp-size: 8\nfoo: 1\n") == "config"


def test_non_utf8_bytes_are_kept_byte_for_byte(tmp_path):
    from sglaunch.migrate.files import process_file, write_atomic

    path = tmp_path / "a.sh"
    path.write_bytes(b"# Gr\xf6\xdfe\nsglang serve --model-path /mod\xe8le --enable-deepep-waterfill\n")
    report = process_file(str(path), True, RULES_16, "0.5.16", False)
    assert report.error is None and report.changed
    write_atomic(str(path), report.migrated)
    assert path.read_bytes() == (b"# Gr\xf6\xdfe\nsglang serve --model-path /mod\xe8le "
                                 b"--enable-waterfill --moe-a2a-backend deepep\n")


def test_crlf_file_keeps_crlf_in_inserted_lines(tmp_path):
    from sglaunch.migrate.files import process_file

    path = tmp_path / "a.sh"
    path.write_bytes(b"export A=1\r\nsglang serve --speculative-algorithm DSPARK\r\n")
    report = process_file(str(path), True, RULES_16, "0.5.16", False)
    assert report.migrated == ("export A=1\r\nexport SGLANG_RAGGED_VERIFY_MODE=compact\r\n"
                               "sglang serve --speculative-algorithm DSPARK\r\n")


def test_a_value_rule_on_shell_text_reports_instead_of_passing():
    """`--quantization $Q` may be qoq when the script runs: --check must not pass it silently."""
    text = 'sglang serve --quantization "$Q" --fp4-gemm-backend ${FP4}\n'
    result = migrate(text, "shell", unsafe=True)
    assert result.text == text
    by_rule = {f.rule_id: f for f in result.findings}
    assert by_rule["R516-04"].level == "manual" and "$Q" in by_rule["R516-04"].message
    assert by_rule["R516-03"].level == "manual" and "${FP4}" in by_rule["R516-03"].message
    assert migrate("sglang serve --quantization awq --fp4-gemm-backend auto\n", "shell").findings == []


def test_config_key_the_sglang_loader_refuses_fails_the_check():
    """`disable-cuda-graph: true` in a --config file: SGLang's loader stops with 'Unsupported config
    option' (a deprecated switch action) in every release; --check must not pass it."""
    result = migrate("model-path: /m\ndisable-cuda-graph: true\npage-size: 16\n", "config")
    (finding,) = result.findings
    assert finding.rule_id == "validate" and finding.level == "manual" and finding.line == 2
    assert "Unsupported config option" in finding.message
    assert migrate("model-path: /m\npage-size: 16\n", "config").findings == []
