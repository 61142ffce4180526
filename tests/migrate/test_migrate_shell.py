"""`extract_launch_commands`: what counts as an SGLang launch command in a shell script."""

from __future__ import annotations

from sglaunch.migrate.shell import extract_launch_commands, parse_script


def one(text: str):
    commands = extract_launch_commands(text)
    assert len(commands) == 1, commands
    return commands[0]


def test_continuations_quoting_and_inline_values():
    cmd = one('python -m sglang.launch_server --model-path "/m/a b" \\\n  --tp=8 --host \'0.0.0.0\'\n')
    assert cmd.args == ("--model-path", "/m/a b", "--tp=8", "--host", "0.0.0.0")
    assert cmd.line == 1 and cmd.end_line == 2
    assert cmd.arg_lines == (1, 1, 2, 2, 2)
    assert cmd.launcher == "python -m sglang.launch_server"


def test_sglang_serve_and_python_options():
    assert one("sglang serve --model-path m\n").launcher == "sglang serve"
    cmd = one("/opt/venv/bin/python3.11 -u -m sglang.launch_server --tp 2\n")
    assert cmd.launcher == "python3.11 -m sglang.launch_server" and cmd.args == ("--tp", "2")


def test_dynamic_values_and_passthrough():
    cmd = one('python -m sglang.launch_server --tp $TP --port "${PORT:-30000}" "$@"\n')
    assert cmd.args == ("--tp", "$TP", "--port", "${PORT:-30000}")
    assert cmd.dynamic == (False, True, False, True)
    assert cmd.passthrough


def test_environment_from_exports_and_prefixes():
    text = "export A=1\nB=2\nexport B\nunset A\nC=3 D=\"x y\" python -m sglang.launch_server --tp 1\n"
    assert one(text).env == {"B": "2", "C": "3", "D": "x y"}


def test_bash_arrays_expand_into_arguments():
    text = 'ARGS=(--tp 8\n  --model-path "$M")\nARGS+=(--dp 2)\npython -m sglang.launch_server "${ARGS[@]}" --port 1\n'
    cmd = one(text)
    assert cmd.args == ("--tp", "8", "--model-path", "$M", "--dp", "2", "--port", "1")
    assert cmd.arg_lines[0] == 1 and cmd.arg_lines[-1] == 4


def test_wrappers_docker_and_launchers():
    text = ("srun -N1 numactl --interleave=all python -m sglang.launch_server --tp 4\n"
            "nohup torchrun --nproc-per-node 8 -m sglang.launch_server --tp 8 &\n"
            "docker run --gpus all -e MODE=x --env=Y=2 img:tag python3 -m sglang.launch_server --port 1\n")
    first, second, third = extract_launch_commands(text)
    assert first.args == ("--tp", "4") and second.args == ("--tp", "8")
    assert third.in_docker and third.env == {"MODE": "x", "Y": "2"}


def test_docker_does_not_inherit_host_exports():
    text = "export SGLANG_RAGGED_VERIFY_MODE=compact\ndocker run img python -m sglang.launch_server --tp 1\n"
    assert one(text).env == {}


def test_heredocs_comments_echo_and_other_programs_are_not_launches():
    text = ("# python -m sglang.launch_server --tp 1\n"
            "echo python -m sglang.launch_server --tp 1\n"
            "printf '%s' \"python -m sglang.launch_server\"\n"
            "cat <<EOF\npython -m sglang.launch_server --tp 1\nEOF\n"
            "python -m sglang.bench_serving --tp 1\n"
            "grep sglang.launch_server x.log\n")
    assert extract_launch_commands(text) == []


def test_commands_in_functions_loops_and_conditionals():
    text = ("start() {\n  exec sglang serve --tp 1\n}\n"
            "for i in 1 2; do python -m sglang.launch_server --port $i & done\n"
            "if true; then python -m sglang.launch_server --tp 2; fi\n")
    assert [c.line for c in extract_launch_commands(text)] == [2, 4, 5]


def test_unicode_offsets_are_characters():
    text = "# ünïcödé\npython -m sglang.launch_server --model-path /mödel --tp 1\n"
    cmd = one(text)
    assert cmd.args[1] == "/mödel"
    site = parse_script(text).sites[0]
    ref = site.refs[1]
    token = ref.container.tokens[ref.index]
    assert text[token.start:token.end] == "/mödel"


def test_parse_errors_are_reported_and_skipped():
    parsed = parse_script('python -m sglang.launch_server --tp 1\nif then fi "unterminated\n')
    assert parsed.error_lines
    assert all(c.args == ("--tp", "1") for c in parsed.commands)


def test_launch_command_is_frozen():
    cmd = one("sglang serve --tp 1\n")
    try:
        cmd.line = 3  # type: ignore[misc]
    except AttributeError:
        return
    raise AssertionError("LaunchCommand must be frozen")
