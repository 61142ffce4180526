"""Issue 17: launches wherever teams keep them, and `--check` never passes a file that breaks.

Every fixture in tests/migrate/fixtures/recall/ holds a launch that fails on 0.5.16 in a place
the tool used to miss (a shell string, a heredoc, a launcher or the flags behind a variable, a
Makefile, a systemd unit, a Python launcher, a CI workflow, a Helm template, ...). For each:
`--check` must exit 1 with the expected findings at the expected lines; `--write
--unsafe-fixes` must fix what it reports as fixable, keep the decoys, and a second run must
change nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sglaunch.cli.migrate_flags import exit_code
from sglaunch.migrate.evaluate import FIX, INFO, MANUAL, UNSAFE
from sglaunch.migrate.files import process_file, write_atomic
from sglaunch.migrate.rules import load_rules

DIR = Path(__file__).parent / "fixtures" / "recall"
RULES = load_rules().between("0.5.15", "0.5.16")
TO = "0.5.16"

# fixture -> (format, {(rule, line)} that must be reported, text that must survive --write,
#             text that --write must produce)
EXPECT: dict[str, tuple[str, set[tuple[str, int]], list[str], list[str]]] = {
    "srun_bash_c.slurm": ("shell", {("R516-01", 9)},
                          ['echo "started: python3 -m sglang.launch_server --enable-deepep-waterfill"',
                           "\\$SLURM_NODEID"],
                          ["--enable-waterfill --moe-a2a-backend deepep\""]),
    "remote_ssh.sh": ("shell", {("R516-04", 4), ("R516-03", 5), ("R516-02", 6)},
                      [], ["--fp4-gemm-backend auto --port 30001'", "--optimistic-prefill-attempts 3'"]),
    "heredoc_writer.sh": ("shell", {("R516-08", 5), ("R516-10", 9)},
                          ["usage: python3 -m sglang.launch_server --enable-deepep-waterfill"],
                          ['--enable-prefill-cp "$@"', "--cp-strategy interleave --port ${PORT}"]),
    "python_var.sh": ("shell", {("R516-01", 4), ("R516-03", 6), ("R516-08", 9)},
                      ["$PYTHON -m sglang.launch_server $ARGS --port 30000"],
                      ['ARGS="--model-path /models/qwen --tp 4 --enable-waterfill --moe-a2a-backend deepep"',
                       'ARGS="$ARGS --fp4-gemm-backend auto"']),
    "dead_args.sh": ("shell", {("unread", 3)}, ['SERVER_ARGS="--model-path /m --enable-deepep-waterfill"'], []),
    "broken_syntax.sh": ("shell", {("unread", 2)}, ["--enable-deepep-waterfill"], []),
    "Dockerfile.heredoc": ("dockerfile", {("R516-01", 5), ("R516-07", 5), ("R516-04", 9), ("R516-08", 14)},
                           ["ENV SGLANG_RAGGED_VERIFY_MODE=static",
                            'print("python -m sglang.launch_server --enable-deepep-waterfill")'],
                           ["--enable-waterfill --moe-a2a-backend deepep --speculative-algorithm DSPARK &",
                            '"--model-path", "/m", "--enable-prefill-cp"])']),
    "sglang_config_false.yaml": ("config", {("R516-01", 3), ("R516-08", 4), ("R516-20", 5)},
                                 ["enable-metrics: false", "tp-size: 8"],
                                 ["enable-waterfill: false   # off for now\n", '"enable-prefill-cp": false\n']),
    "Makefile": ("makefile", {("R516-03", 11), ("R516-01", 4)},
                 ["$(PYTHON) -m sglang.bench_serving --num-prompts 100", '@echo "serving $(MODEL)"',
                  "-$(PYTHON) -m sglang.launch_server --model-path $(MODEL) $(SGLANG_EXTRA)"],
                 ["\t  --tp 8 --fp4-gemm-backend auto\n", "SGLANG_EXTRA = --enable-waterfill --moe-a2a-backend deepep\n"]),
    "deploy/sglang.service": ("systemd", {("R516-01", 11), ("R516-07", 10)},
                              ["Environment=SGLANG_RAGGED_VERIFY_MODE=static\n"],
                              ["    --enable-waterfill --moe-a2a-backend deepep\nRestart"]),
    "deploy/sglang-dspark.service": ("systemd", {("R516-04", 3), ("R516-07", 3)}, [],
                                     ["Environment=SGLANG_RAGGED_VERIFY_MODE=compact\nExecStart="]),
    "deploy/prod.env": ("env", {("unread", 4)}, ['SGLANG_ARGS="--model-path /m --enable-deepep-waterfill"'], []),
    "deploy/docker-compose.yaml": ("compose", {("R516-07", 6)}, ["    env_file:\n      - prod.env\n"], []),
    "launcher.py": ("python", {("R516-01", 14), ("R516-03", 15), ("R516-08", 22), ("R516-02", 23), ("unread", 28)},
                    ['print("--enable-deepep-waterfill was renamed")', '"SGLANG_RAGGED_VERIFY_MODE": "static"'],
                    ['"--enable-waterfill", "--moe-a2a-backend", "deepep",  # EP balance',
                     '"--fp4-gemm-backend", "auto",', "--port {port} --enable-prefill-cp\")",
                     "--optimistic-prefill-attempts 3\", shell=True"]),
    ".github/workflows/serve.yml": ("workflow", {("R516-01", 15), ("R516-07", 15)},
                                    ['run: echo "python3 -m sglang.launch_server --enable-deepep-waterfill"'],
                                    ["--speculative-algorithm DSPARK --enable-waterfill --moe-a2a-backend deepep &"]),
    ".gitlab-ci.yml": ("workflow", {("R516-04", 7), ("R516-03", 7)}, [], ["--fp4-gemm-backend auto &"]),
    "chart/templates/deployment.yaml": ("helm", {("R516-01", 18), ("R516-04", 19), ("R516-07", 25)},
                                        ['{{- include "sglang.labels" . | nindent 4 }}',
                                         "- {{ .Values.quantization }}\n", "{{- range .Values.extraArgs }}"],
                                        ["- --enable-waterfill\n            - --moe-a2a-backend\n"]),
    "chart/templates/statefulset.yaml": ("helm", {("R516-01", 14), ("R516-04", 16)},
                                         ["{{- if .Values.waterfill }}\n", "--quantization {{ .Values.quant }} \\\n"],
                                         ["--enable-waterfill --moe-a2a-backend deepep \\\n                {{- end }}"]),
    ".github/workflows/matrix.yml": ("workflow", {("R516-08", 11), ("R516-04", 12)},
                                     ["--model-path ${{ secrets.MODEL }} --tp ${{ matrix.tp }} \\\n",
                                      "--quantization ${{ matrix.q }}\n"],
                                     ["--enable-prefill-cp &"]),
    "deploy/compose-anchors.yml": ("compose", {("R516-01", 10), ("R516-07", 10), ("R516-03", 14), ("R516-07", 14)},
                                   ["    <<: *common\n    command: >\n", "SGLANG_RAGGED_VERIFY_MODE: cap-accept"],
                                   ['    entrypoint: ["python3", "-m", "sglang.launch_server"]\n    environment:\n'
                                    "      SGLANG_RAGGED_VERIFY_MODE: compact\n"]),
    "deploy/job.yaml": ("k8s", {("R516-01", 15), ("R516-07", 14), ("R516-04", 22)},
                        ["export SGLANG_RAGGED_VERIFY_MODE=static"], ["            --enable-waterfill --moe-a2a-backend deepep\n"]),
    "roles/sglang/templates/sglang.service.j2": ("systemd+jinja", {("R516-01", 8)},
                                                 ["{% if waterfill %}\n", "--port {{ port }}"],
                                                 ["  --enable-waterfill --moe-a2a-backend deepep \\\n{% endif %}"]),
    "roles/sglang/templates/start.sh.j2": ("shell+jinja", {("R516-04", 3), ("R516-08", 3)},
                                           ["# {{ ansible_managed }}", "--quantization {{ quant }}"],
                                           ["--enable-prefill-cp\n"]),
    "roles/sglang/templates/deploy.yaml.j2": ("k8s+jinja", {("R516-01", 9)}, ['"{{ model }}"'],
                                              ['"--enable-waterfill", "--moe-a2a-backend", "deepep"]']),
    "deploy/supervisord.conf": ("supervisor", {("R516-01", 5), ("R516-07", 5)}, ['environment=HF_HOME="/cache"'],
                                ["--speculative-algorithm DSPARK --enable-waterfill --moe-a2a-backend deepep\n"]),
    "chart/values.yaml": ("yaml", {("R516-03", 10), ("R516-08", 12)}, ["  port: 30000"],
                          ["  - auto\n  - --enable-prefill-cp\n"]),
}


# nothing there breaks: the explicit SGLANG_RAGGED_VERIFY_MODE=static of the env_file is kept
# (reported as a notice), so --check passes
PASSES = {"deploy/docker-compose.yaml"}


def test_every_fixture_has_expectations():
    assert sorted(EXPECT) == sorted(str(p.relative_to(DIR)) for p in DIR.rglob("*") if p.is_file())


def run(path: Path, unsafe: bool = False):
    report = process_file(str(path), True, RULES, TO, unsafe)
    assert report is not None
    return report


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_check_fails_with_the_expected_findings(name):
    fmt, expected, _, _ = EXPECT[name]
    report = run(DIR / name)
    assert report.fmt == fmt
    assert report.error is None, report.error
    found = {(f.rule_id, f.line) for f in report.findings}
    assert expected <= found, sorted(found)
    assert exit_code([report]) == (0 if name in PASSES else 1)  # --check never passes a file that breaks


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_write_fixes_keeps_decoys_and_is_idempotent(name, tmp_path):
    _, _, kept, produced = EXPECT[name]
    shutil.copytree(DIR, tmp_path / "repo")
    target = tmp_path / "repo" / name
    first = run(target, unsafe=True)
    if first.changed:
        write_atomic(str(target), first.migrated)
    text = target.read_text()
    for snippet in kept:
        assert snippet in text, snippet
    for snippet in produced:
        assert snippet in text, (snippet, text)
    second = run(target, unsafe=True)
    assert not second.changed, second.diff()
    assert not [f for f in second.findings if f.level in (FIX, UNSAFE)]
    # what cannot be fixed stays reported as manual after the fixes, so --check keeps failing
    manual_before = {(f.rule_id, f.token) for f in first.findings if f.level == MANUAL}
    manual_after = {(f.rule_id, f.token) for f in second.findings if f.level == MANUAL}
    assert manual_before <= manual_after | {(r, t) for r, t in manual_before if r.startswith("R")}


def test_unresolved_argument_variable_is_a_notice_not_silence():
    report = run(DIR / "python_var.sh")
    notes = [f for f in report.findings if f.rule_id == "unread"]
    assert [(f.level, f.line, f.token) for f in notes] == [(INFO, 9, "$EXTRA_ARGS")]


def test_value_variable_is_not_expanded_into_its_assignment():
    from sglaunch.migrate.engine import migrate_text

    text = "B=cutlass\npython -m sglang.launch_server --fp4-gemm-backend $B --fp8-gemm-backend $B\n"
    result = migrate_text(text, "shell", RULES, TO, unsafe_fixes=True)
    assert result.text == text  # the value is shell text: reported, never rewritten at B=
    assert [(f.rule_id, f.level) for f in result.findings if f.rule_id == "R516-03"] == [("R516-03", MANUAL)]


@pytest.mark.parametrize("text", [
    "echo 'bash -c \"python -m sglang.launch_server --enable-deepep-waterfill\"'\n",
    "cat <<EOF\npython -m sglang.launch_server --enable-deepep-waterfill\nEOF\n",
    "grep -- '--enable-deepep-waterfill' notes.txt\n",
    "# ssh host \"python -m sglang.launch_server --enable-deepep-waterfill\"\n",
])
def test_decoys_stay_silent(text):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, "shell", RULES, TO)
    assert result.text == text
    assert [f for f in result.findings if f.level != INFO] == []


def test_false_config_key_keeps_false_and_adds_no_backend(tmp_path):
    target = tmp_path / "c.yaml"
    shutil.copyfile(DIR / "sglang_config_false.yaml", target)
    report = run(target)
    assert "moe-a2a-backend" not in report.migrated  # `ensure` is for the switch turned on
    assert "elastic-ep" not in report.migrated  # false is the default: the dead entry goes
    assert report.migrated.count("\n") == report.original.count("\n") - 1


@pytest.mark.parametrize("name, where", [
    ("deploy/compose-anchors.yml", "merged <<: *common environment"), ("deploy/job.yaml", "export in sh -c"),
    ("deploy/docker-compose.yaml", "env_file"), (".github/workflows/serve.yml", "workflow env"),
    ("deploy/sglang.service", "Environment="), ("Dockerfile.heredoc", "ENV"),
])
def test_explicit_static_verify_mode_wins(name, where):
    report = run(DIR / name)
    mode = [f for f in report.findings if f.rule_id == "R516-07"
            and not (name == "deploy/compose-anchors.yml" and f.line == 14)]
    assert mode and all(f.level == INFO and "is set explicitly" in f.message for f in mode), where
    if name != "deploy/compose-anchors.yml":  # there the other service gets compact, in its own environment
        assert "SGLANG_RAGGED_VERIFY_MODE=compact" not in report.migrated
        assert "SGLANG_RAGGED_VERIFY_MODE: compact" not in report.migrated


def test_directory_walk_reads_every_kind_and_hidden_ci_folders(tmp_path):
    from sglaunch.migrate.files import iter_files

    shutil.copytree(DIR, tmp_path / "repo")
    (tmp_path / "repo" / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "repo" / ".venv" / "bin" / "serve.sh").write_text("python -m sglang.launch_server --enable-deepep-waterfill\n")
    (tmp_path / "repo" / "node_modules").mkdir()
    (tmp_path / "repo" / "node_modules" / "x.sh").write_text("python -m sglang.launch_server --enable-deepep-waterfill\n")
    seen = {}
    for path, explicit in iter_files([str(tmp_path / "repo")]):
        report = process_file(path, explicit, RULES, TO, False)
        if report is not None:
            seen[str(Path(path).relative_to(tmp_path / "repo"))] = report.fmt
    assert seen == {name: fmt for name, (fmt, *_ ) in EXPECT.items()}


@pytest.mark.parametrize("fmt, text, line", [
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang:v0.5.16\n"
            "    env:\n    - name: SGLANG_ARGS\n      value: \"--model-path /m --enable-deepep-waterfill\"\n", 9),
    ("dockerfile", "FROM lmsysorg/sglang:v0.5.16\nENV SGLANG_ARGS=\"--enable-deepep-waterfill\"\nCMD [\"/start.sh\"]\n", 2),
    ("shell", "export SGLANG_ARGS='--tp 8 --quantization qoq'\nexec /opt/start_server.sh\n", 1),
])
def test_rule_flags_in_places_not_read_as_launches_fail_check(fmt, text, line):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, fmt, RULES, TO)
    assert result.text == text
    assert [(f.rule_id, f.level, f.line) for f in result.findings] == [("unread", MANUAL, line)]


@pytest.mark.parametrize("fmt, text", [
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: nginx\n"
            "    env:\n    - name: OPTS\n      value: \"--model-path /m --tp 8\"\n"),
    ("dockerfile", "FROM python:3.12\nENV PIP_OPTS=\"--no-cache-dir\"\nCMD [\"python\"]\n"),
    ("shell", "OPTS='--tp 8 --verbose'\nexec ./other_tool $OPTS\n"),
])
def test_flags_no_rule_is_about_stay_silent(fmt, text):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, fmt, RULES, TO)
    assert [f for f in result.findings if f.level == MANUAL] == []


SHELL_CASES = [
    # (text, rule, level, line, fixed text or None)
    ('CMD=(python3 -m sglang.launch_server --enable-deepep-waterfill)\n"${CMD[@]}" --port 1\n',
     "R516-01", FIX, 1, "CMD=(python3 -m sglang.launch_server --enable-waterfill --moe-a2a-backend deepep)"),
    ('python3 -m sglang.launch_server $( [ -n "$X" ] && echo --enable-deepep-waterfill ) --tp 2\n',
     "unread", MANUAL, 1, None),
    ("alias serve='python -m sglang.launch_server --enable-prefill-context-parallel'\n",
     "R516-08", FIX, 1, "alias serve='python -m sglang.launch_server --enable-prefill-cp'"),
    ("read -r -d '' LAUNCH <<EOF\npython -m sglang.launch_server --quantization qoq\nEOF\neval \"$LAUNCH\"\n",
     "R516-04", MANUAL, 2, None),
    ("cat <<'EOF' | bash\npython -m sglang.launch_server --enable-deepep-waterfill\nEOF\n",
     "R516-01", FIX, 2, "python -m sglang.launch_server --enable-waterfill --moe-a2a-backend deepep\nEOF"),
    ('cat <<EOF | kubectl apply -f -\nargs: ["python3", "-m", "sglang.launch_server", "--enable-deepep-waterfill"]\nEOF\n',
     "unread", MANUAL, 2, None),
    ('cat > run.sh <<EOF && chmod +x run.sh && python -m sglang.launch_server --enable-prefill-context-parallel\n'
     'echo hi\nEOF\n', "R516-08", FIX, 1, "&& python -m sglang.launch_server --enable-prefill-cp\n"),
    ('tmux new-session -d -s sg "python3 -m sglang.launch_server --enable-deepep-waterfill"\n',
     "R516-01", FIX, 1, '--enable-waterfill --moe-a2a-backend deepep"'),
    ('CMD="python3 -m sglang.launch_server --optimistic-prefill-retries 2"\nsrun bash -c "$CMD"\n',
     "R516-02", UNSAFE, 1, None),
    ('SERVE="python3 -m sglang.launch_server"\n$SERVE --model-path /m --enable-deepep-waterfill\n',
     "R516-01", FIX, 2, "$SERVE --model-path /m --enable-waterfill --moe-a2a-backend deepep\n"),
    ("$LAUNCHER --model-path /m --enable-prefill-context-parallel\n", "unread", MANUAL, 1, None),
    ("./launch_server.sh --model-path /m --enable-deepep-waterfill\n", "unread", MANUAL, 1, None),
    ('start_server() {\n  local port=$1; shift\n  python3 -m sglang.launch_server --port "$port" "$@"\n}\n'
     "start_server 30000 --model-path /m --enable-deepep-waterfill\n", "R516-01", FIX, 5,
     "start_server 30000 --model-path /m --enable-waterfill --moe-a2a-backend deepep\n"),
    ('launch() { exec sglang serve "$@"; }\nlaunch --quantization qoq\n', "R516-04", MANUAL, 2, None),
]


@pytest.mark.parametrize("text, rule, level, line, fixed", SHELL_CASES)
def test_shell_constructs(text, rule, level, line, fixed):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, "shell", RULES, TO)
    assert (rule, level, line) in [(f.rule_id, f.level, f.line) for f in result.findings], result.findings
    if fixed is None:
        assert result.text == text
    else:
        assert fixed in result.text
        again = migrate_text(result.text, "shell", RULES, TO)
        assert again.text == result.text


def test_python_engine_keywords_and_printed_launches():
    from sglaunch.migrate.engine import migrate_text

    text = ("import sglang as sgl\n"
            "llm = sgl.Engine(model_path='/m', enable_deepep_waterfill=True, tp_size=8)\n"
            "print('python -m sglang.launch_server --enable-deepep-waterfill')\n"
            "logger.info('run: sglang serve --quantization qoq')\n")
    result = migrate_text(text, "python", RULES, TO)
    assert result.text == text
    assert [(f.rule_id, f.level, f.line, f.token) for f in result.findings] == [
        ("unread", MANUAL, 2, "--enable-deepep-waterfill")]


def test_env_file_values_run_as_commands_or_expanded():
    from sglaunch.migrate.engine import migrate_text

    text = ("# compose .env\n"
            "SGLANG_CMD=python3 -m sglang.launch_server --model-path /m --enable-deepep-waterfill\n"
            'QUOTED="sglang serve --quantization qoq"\n'
            "SGLANG_ARGS=--tp 8 --enable-prefill-context-parallel\n"
            "PIP_OPTS=--no-cache-dir\n")
    result = migrate_text(text, "env", RULES, TO)
    assert [(f.rule_id, f.level, f.line) for f in result.findings] == [
        ("unread", MANUAL, 4), ("R516-01", FIX, 2), ("R516-04", MANUAL, 3)]
    assert result.text == text.replace("--enable-deepep-waterfill", "--enable-waterfill --moe-a2a-backend deepep")


def test_makefile_variables_are_word_lists():
    from sglaunch.migrate.engine import migrate_text

    text = "SGLANG := python3 -m sglang.launch_server\nserve:\n\t$(SGLANG) --enable-deepep-waterfill\n"
    result = migrate_text(text, "makefile", RULES, TO)
    assert result.text.endswith("\t$(SGLANG) --enable-waterfill --moe-a2a-backend deepep\n")
    unused = "EXTRA = --enable-deepep-waterfill\nserve:\n\t./run.sh\n"
    assert [(f.rule_id, f.level, f.line) for f in migrate_text(unused, "makefile", RULES, TO).findings] == [
        ("unread", MANUAL, 1)]
    appended = "ARGS := --tp 8\nARGS += --enable-prefill-context-parallel\ns:\n\tpython -m sglang.launch_server $(ARGS)\n"
    assert "ARGS += --enable-prefill-cp\n" in migrate_text(appended, "makefile", RULES, TO).text


@pytest.mark.parametrize("fmt, text", [
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang:v0.5.16\n"
            "    command: [python3, -m, sglang.launch_server, --speculative-algorithm, DSPARK]\n"
            "    envFrom:\n    - configMapRef: {name: sglang-env}\n"),
    ("compose", "services:\n  s:\n    image: lmsysorg/sglang\n    env_file: [missing.env]\n"
                "    command: python3 -m sglang.launch_server --speculative-algorithm DSPARK\n"),
    ("shell", "docker run --env-file prod.env img python3 -m sglang.launch_server --speculative-algorithm DSPARK\n"),
])
def test_env_the_tool_cannot_read_is_not_overridden(fmt, text):
    """envFrom / an unreadable env_file / docker --env-file may hold an explicit static: the
    added compact would override it, so the tool reports instead."""
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, fmt, RULES, TO)
    assert result.text == text
    assert [(f.rule_id, f.level) for f in result.findings if f.rule_id == "R516-07"] == [("R516-07", INFO)]


def test_compose_command_of_flags_for_the_sglang_image():
    from sglaunch.migrate.engine import migrate_text

    text = "services:\n  s:\n    image: lmsysorg/sglang\n    command: [--model-path, /m, --enable-prefill-context-parallel]\n"
    result = migrate_text(text, "compose", RULES, TO)
    assert "--enable-prefill-cp]" in result.text
    other = "services:\n  web:\n    image: nginx\n    command: [--port, '80', --log-level, debug]\n"
    assert migrate_text(other, "compose", RULES, TO).findings == []


def test_unparseable_shell_inside_yaml_is_manual():
    from sglaunch.migrate.engine import migrate_text

    text = ("jobs:\n  a:\n    steps:\n      - run: |\n          if [ -n \"$X\" ]; then\n"
            "            python -m sglang.launch_server --enable-deepep-waterfill \"unterminated\n          fi\n")
    result = migrate_text(text, "workflow", RULES, TO)
    assert result.text == text
    assert [f.level for f in result.findings if f.rule_id == "unread"] == [MANUAL]


def test_systemd_environment_does_not_reach_a_docker_container():
    from sglaunch.migrate.engine import migrate_text

    text = ("[Service]\nEnvironment=SGLANG_RAGGED_VERIFY_MODE=static\n"
            "ExecStart=/usr/bin/docker run --rm lmsysorg/sglang python3 -m sglang.launch_server "
            "--speculative-algorithm DSPARK\n")
    result = migrate_text(text, "systemd", RULES, TO)
    assert "docker run -e SGLANG_RAGGED_VERIFY_MODE=compact --rm" in result.text
    assert result.text.count("Environment=") == 1


def test_python_that_does_not_parse():
    from sglaunch.migrate.engine import migrate_text

    quiet = migrate_text('print "hello"\n', "python", RULES, TO)
    assert quiet.error is None and [f.level for f in quiet.findings] == [INFO]
    loud = migrate_text('print "python -m sglang.launch_server --enable-deepep-waterfill"\n', "python", RULES, TO)
    assert loud.error and "invalid Python" in loud.error  # exit 2: never a silent pass


@pytest.mark.parametrize("name, fmt", [
    ("dockerfile.py", "python"), ("Dockerfile.cuda13", "dockerfile"), ("GNUmakefile", "makefile"),
    ("ops/sglang.service", "systemd"), (".env.prod", "env"), ("x/.github/workflows/ci.yaml", "workflow"),
    (".gitlab-ci.yml", "workflow"), ("chart/templates/deploy.yaml", "helm"), ("data/flags.json", None),
])
def test_detect_format_by_name(name, fmt):
    from sglaunch.migrate.engine import detect_format

    text = "kind: {{ .Values.kind }}\n" if "templates" in name else "x: 1\n"
    assert detect_format(name, text, loose=False) == fmt


def test_docker_env_reaches_a_shell_string_in_the_container():
    from sglaunch.migrate.engine import migrate_text

    text = ('docker run -e SGLANG_RAGGED_VERIFY_MODE=static img bash -c '
            '"python3 -m sglang.launch_server --speculative-algorithm DSPARK"\n')
    result = migrate_text(text, "shell", RULES, TO)
    assert result.text == text
    assert [(f.rule_id, f.level) for f in result.findings] == [("R516-07", INFO)]


def test_workflow_job_container_env_counts():
    from sglaunch.migrate.engine import migrate_text

    text = ("jobs:\n  smoke:\n    container:\n      image: lmsysorg/sglang:v0.5.16\n      env:\n"
            "        SGLANG_RAGGED_VERIFY_MODE: cap-accept\n    steps:\n"
            "      - run: python3 -m sglang.launch_server --speculative-algorithm DSPARK\n")
    result = migrate_text(text, "workflow", RULES, TO)
    assert result.text == text
    assert [(f.rule_id, f.level) for f in result.findings] == [("R516-07", INFO)]


@pytest.mark.parametrize("fmt, text", [
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: exporter\n    image: example/exporter:1.2\n"
            "    args: [\"--enable-deepep-waterfill\", \"--listen\", \":9400\"]\n"),
    ("compose", "services:\n  exporter:\n    image: example/exporter\n    command: [--enable-deepep-waterfill]\n"),
    ("dockerfile", "FROM lmsysorg/sglang:v0.5.16\nLABEL title=\"sglang --enable-deepep-waterfill\"\n"),
    ("compose", "services:\n  router:\n    image: lmsysorg/sglang-router:latest\n"
                "    command: [\"python3\", \"-m\", \"sglang_router.launch_router\", \"--enable-deepep-waterfill\"]\n"),
])
def test_other_images_and_labels_are_decoys(fmt, text):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, fmt, RULES, TO)
    assert result.text == text and result.findings == []


@pytest.mark.parametrize("text", [
    'ARGS="--a \\"b c\\" --enable-deepep-waterfill"\npython -m sglang.launch_server $ARGS\n',
    "ARGS='--x'\"$Y\"' --enable-deepep-waterfill'\npython -m sglang.launch_server $ARGS\n",
])
def test_argument_variable_the_tool_cannot_split_is_manual(text):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, "shell", RULES, TO)
    assert result.text == text
    assert ("unread", MANUAL, 2) in [(f.rule_id, f.level, f.line) for f in result.findings]


def test_a_checked_line_can_be_silenced():
    from sglaunch.migrate.engine import migrate_text

    text = ('SERVER_ARGS="--enable-deepep-waterfill"  # sglaunch: ignore[unread] (helper maps it)\n'
            "OTHER='--quantization qoq'  # sglaunch: ignore[R516-04]\n"
            "python -m sglang.launch_server --quantization qoq  # sglaunch: ignore\n")
    result = migrate_text(text, "shell", RULES, TO)
    assert [(f.rule_id, f.line) for f in result.findings] == [("unread", 2)]


def test_docker_run_of_an_sglang_image_given_flags():
    from sglaunch.migrate.engine import migrate_text

    text = ("docker run --rm --gpus all -e SGLANG_RAGGED_VERIFY_MODE=static lmsysorg/sglang:v0.5.16 "
            "--model-path /m --enable-deepep-waterfill --speculative-algorithm DSPARK\n"
            "docker run -v /a:/b sglang-bench:latest --verbose --foo\n")
    result = migrate_text(text, "shell", RULES, TO)
    assert "lmsysorg/sglang:v0.5.16 --model-path /m --enable-waterfill --moe-a2a-backend deepep " in result.text
    assert result.text.endswith("docker run -v /a:/b sglang-bench:latest --verbose --foo\n")
    assert ("R516-07", INFO) in [(f.rule_id, f.level) for f in result.findings]


def test_flags_handed_to_a_script_in_an_sglang_container_are_manual():
    from sglaunch.migrate.engine import migrate_text

    text = ("apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang:v0.5.16\n"
            "    command: [/scripts/start.sh]\n    args: [--model-path, /m, --enable-deepep-waterfill]\n")
    result = migrate_text(text, "k8s", RULES, TO)
    assert [(f.rule_id, f.level) for f in result.findings] == [("unread", MANUAL)]


def test_dockerfile_flags_handed_to_an_entrypoint_script_are_manual():
    from sglaunch.migrate.engine import migrate_text

    text = 'FROM lmsysorg/sglang:v0.5.16\nENTRYPOINT ["/start.sh"]\nCMD ["--model-path", "/m", "--enable-deepep-waterfill"]\n'
    result = migrate_text(text, "dockerfile", RULES, TO)
    assert [(f.rule_id, f.level, f.line) for f in result.findings] == [("unread", MANUAL, 2)]


def test_workflow_expressions_are_shown_as_written():
    report = run(DIR / ".github/workflows/matrix.yml")
    quant = [f for f in report.findings if f.rule_id == "R516-04"]
    assert quant and "${{ matrix.q }}" in quant[0].message


@pytest.mark.parametrize("fmt, text", [
    ("compose", "services:\n  s:\n    image: x\n    environment:\n    command: python3 -m sglang.launch_server "
                "--speculative-algorithm DSPARK\n"),
    ("compose", "a: &a\n  <<: *a\nservices:\n  s:\n    <<: *a\n    command: sglang serve --tp 1\n"),
])
def test_odd_yaml_does_not_crash(fmt, text):
    from sglaunch.migrate.engine import migrate_text

    result = migrate_text(text, fmt, RULES, TO)
    assert result.text == text


def test_workflow_docker_action_args_of_a_python_entrypoint():
    from sglaunch.migrate.engine import migrate_text

    text = ("jobs:\n  a:\n    steps:\n      - uses: docker://lmsysorg/sglang:v0.5.16\n        with:\n"
            "          entrypoint: python3\n          args: -m sglang.launch_server --model-path /m --enable-prefill-context-parallel\n")
    result = migrate_text(text, "workflow", RULES, TO)
    assert result.text.endswith("args: -m sglang.launch_server --model-path /m --enable-prefill-cp\n")


def test_launch_server_script_path_and_unknown_module_runner():
    from sglaunch.migrate.engine import migrate_text

    text = ("python3 /sgl-workspace/sglang/python/sglang/launch_server.py --model-path /m --enable-deepep-waterfill\n"
            "myrunner -m sglang.launch_server --enable-prefill-context-parallel\n")
    result = migrate_text(text, "shell", RULES, TO)
    assert "launch_server.py --model-path /m --enable-waterfill --moe-a2a-backend deepep\n" in result.text
    assert ("unread", MANUAL, 2) in [(f.rule_id, f.level, f.line) for f in result.findings]
