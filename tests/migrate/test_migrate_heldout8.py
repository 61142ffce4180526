"""Issue 17, held-out review 8: the launch places migrate-flags still missed (workflow steps
with a non-POSIX `shell:`, Python launchers through runpy / exec* / call arguments, Helm
define bodies outside _helpers.tpl and values read by templates, JSON flag mappings and
argument lists, systemd drop-ins, setup.cfg / Pipfile / lock files), and launch files in forms
written for this review (Nomad, a CronJob, tox.ini, nox, notebooks, Ansible, Terraform,
SkyPilot, docker-bake, Taskfile, PowerShell, cmd, fish, TOML, Earthfile, a Podman quadlet).
Each fixture breaks on 0.5.16 (or is a decoy that must stay as it is); `--check` must fail
with the expected findings, `--write --unsafe-fixes` must fix what is fixable, keep the rest
byte for byte and change nothing on a second run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sglaunch.cli.migrate_flags import exit_code
from sglaunch.migrate.evaluate import FIX, MANUAL, UNSAFE
from sglaunch.migrate.files import iter_files, process_file, write_atomic
from sglaunch.migrate.rules import load_rules

DIR = Path(__file__).parent / "fixtures" / "heldout8"
RULES = load_rules().between("0.5.15", "0.5.16")
TO = "0.5.16"

# fixture -> (format, {(rule, line)} reported, text kept by --write, text --write produces)
EXPECT: dict[str, tuple[str, set[tuple[str, int]], list[str], list[str]]] = {
    # 1. `shell: python` steps are Python; pwsh and cmd steps are reported; a printed launch is a decoy
    ".github/workflows/serve.yml": ("workflow", {("R516-01", 12), ("unread", 15), ("unread", 26)},
                                    ['print("python -m sglang.launch_server --enable-deepep-waterfill")',
                                     "            --enable-deepep-waterfill\n",
                                     "run: python -m sglang.launch_server --quantization qoq"],
                                    ['"--model-path", "m", "--enable-waterfill", "--moe-a2a-backend", "deepep"])']),
    # defaults: run: shell: of the workflow and of a job, and a Windows runner (PowerShell) are inherited
    ".github/workflows/defaults.yml": ("workflow", {("unread", 8), ("R516-03", 10), ("R516-01", 18), ("unread", 22)},
                                       ["- run: python -m sglang.launch_server --enable-deepep-waterfill\n",
                                        "- run: python -m sglang.launch_server --quantization qoq"],
                                       ["--fp4-gemm-backend auto\n", '"--enable-waterfill", "--moe-a2a-backend", "deepep"])']),
    # 2. Python launchers: runpy with sys.argv, exec*/Popen with lists built by +, .extend and shlex.split,
    # call arguments as the argv (nox's session.run, os.execlp); a logged launch is a decoy
    "runpy_launch.py": ("python", {("R516-01", 4)}, ['runpy.run_module("sglang.launch_server", run_name="__main__")'],
                        ['sys.argv = ["sglang.launch_server", "--model-path", "m", "--enable-waterfill", '
                         '"--moe-a2a-backend", "deepep"]']),
    "exec_launch.py": ("python", {("R516-01", 11), ("R516-02", 7), ("R516-03", 9), ("R516-04", 12)},
                       ['shlex.split("python3 -m sglang.launch_server --quantization qoq")'],
                       ['flags = ["--model-path", "m", "--optimistic-prefill-attempts", "3"]',
                        'extra.extend(["--fp4-gemm-backend", "auto"])',
                        '"--enable-waterfill", "--moe-a2a-backend", "deepep"])']),
    "nox_session.py": ("python", {("R516-01", 8), ("R516-50", 6)},
                       ['session.log("python -m sglang.launch_server --enable-deepep-waterfill")'],
                       ['"/m", "--enable-waterfill", "--moe-a2a-backend", "deepep")', 'session.install("sglang==0.5.16")']),
    "kinds/execl.py": ("python", {("R516-01", 2), ("R516-02", 4)}, ['os.execlp("python3", "python3", "-m"'],
                       ['"--enable-waterfill", "--moe-a2a-backend", "deepep")',
                        'shlex.split("--optimistic-prefill-attempts 3 --tp 8")']),
    # 3. Helm: define bodies in any template file, values lists the templates range over, a values map
    # the templates turn into flags (reported), a flag built from a directive (reported)
    "chart/templates/_args.tpl": ("helm", {("R516-01", 4)}, ['{{- define "sgl.args" -}}', "{{- end }}"],
                                  ["- --enable-waterfill\n- --moe-a2a-backend\n- deepep\n{{- end }}"]),
    "chart/templates/_server.yaml": ("helm", {("R516-02", 5), ("R516-03", 6)},
                                     ["- --optimistic-prefill-retries={{ .Values.retries | default 1 }}"],
                                     ["- --fp4-gemm-backend\n- auto\n"]),
    # a helpers file of several define bodies (a command line, an env list): read body by body
    "chart/templates/_cmd.tpl": ("helm", {("R516-01", 3), ("R516-04", 3), ("unread", 9)},
                                 ['{{- if .Values.quant }} --quantization {{ .Values.quant }}{{ end }}',
                                  'value: "--optimistic-prefill-retries 2"'],
                                 ["{{ .Values.model }} --enable-waterfill --moe-a2a-backend deepep\n"]),
    "chart/templates/deployment.yaml": ("helm", {("validate", 18)}, ["- --{{ $k }}={{ $v }}"], []),
    # the templates range over server.options as `--{{ $k }}={{ $v }}`: its keys are flags, fixed in place;
    # a map no template ranges over into flags stays a report
    # extraArgs, a string of flags that templates/job.yaml writes into its command, is edited inside its quotes
    "chart/values.yaml": ("yaml", {("R516-01", 5), ("R516-50", 1), ("R516-02", 7), ("R516-03", 8), ("unread", 12),
                                   ("R516-02", 13)},
                          ["  # not ranged over by any template\n", "    enable-deepep-waterfill: true\n"],
                          ["    - --enable-waterfill\n    - --moe-a2a-backend\n    - deepep\n", "sglang:v0.5.16",
                           "    optimistic-prefill-attempts: 3\n    fp4-gemm-backend: auto\n",
                           'extraArgs: "--optimistic-prefill-attempts 2 --trust-remote-code"']),
    "chart/templates/job.yaml": ("helm", set(), ["{{ .Values.extraArgs }}"], []),
    "chart/Chart.yaml": ("yaml", set(), ["name: sgl"], []),
    # 4. JSON: a flag mapping (read as a config, new entries written as JSON), a false key of a renamed
    # flag (reported), an argument list, VS Code's launch.json with comments and trailing commas
    "cfg/server.json": ("config", {("R516-01", 3), ("R516-02", 4)}, ['  "model-path": "m",\n'],
                        ['  "enable-waterfill": true,\n  "moe-a2a-backend": "deepep",\n  "optimistic-prefill-attempts": 3\n}']),
    "cfg/server-false.json": ("config", {("unread", 1)}, ['"enable-deepep-waterfill": false'], []),
    "cfg/launcher.json": ("yaml", {("R516-03", 1)}, [], ['"--fp4-gemm-backend", "auto"]}']),
    "cfg/package.json": ("yaml", set(), ['"vite --port 3000"'], []),
    ".vscode/launch.json": ("yaml", {("R516-01", 10)}, ["  // VS Code\n", '"module": "sglang.launch_server",'],
                            ['"args": ["--model-path", "m", "--enable-waterfill", "--moe-a2a-backend", "deepep"],\n']),
    # 5. systemd drop-ins: ExecStart= fixed; flags kept in Environment= reported
    "sglang.service.d/override.conf": ("systemd", {("R516-01", 3)}, ["ExecStart=\n", "Environment=SGLANG_RAGGED_VERIFY_MODE=static"],
                                       ["--model-path m --enable-waterfill --moe-a2a-backend deepep\n"]),
    # a drop-in's explicit SGLANG_RAGGED_VERIFY_MODE=static is in effect for the unit: kept and reported, nothing added
    "unit/sglang-dspark.service": ("systemd", {("R516-07", 5)}, ["[Service]\nExecStart=/usr/bin/python3"], []),
    "unit/sglang-dspark.service.d/verify.conf": ("systemd", set(), ["Environment=SGLANG_RAGGED_VERIFY_MODE=static"], []),
    "sglang.service.d/10-args.conf": ("systemd", {("unread", 2)}, ['"SGLANG_ARGS=--model-path m --enable-deepep-waterfill"'], []),
    # 6. pins: setup.cfg, Pipfile and requirements*.in fixed; lock files reported, never rewritten
    "pins/setup.cfg": ("setupcfg", {("R516-50", 5), ("R516-50", 9), ("R516-51", 6)}, ["    requests>=2  # not ours\n"],
                       ["    sglang==0.5.16\n    flashinfer-python==0.6.14\n",
                        'serve = sglang[all]==0.5.16 ; python_version >= "3.10"']),
    "pins/Pipfile": ("pipfile", {("R516-50", 2)}, ['flashinfer-python = "*"', 'sglang-router = "==0.5.15"'],
                     ['sglang = "==0.5.16"']),
    "pins/requirements-serve.in": ("requirements", {("R516-50", 2)}, ["# compiled with pip-compile"], ["sglang[all]==0.5.16"]),
    "pins/lock/uv.lock": ("lockfile", {("R516-50", 4)}, ['version = "0.5.15"'], []),
    "pins/lock/poetry.lock": ("lockfile", {("R516-50", 3)}, ['version = "0.5.15"'], []),
    "pins/lock/Pipfile.lock": ("lockfile", {("R516-51", 4)}, ['"version": "==0.6.15"'], []),
    # new forms: notebooks (! lines, %%bash cells, Python cells; a markdown cell is a decoy)
    "kinds/serve.ipynb": ("notebook", {("R516-01", 8), ("R516-50", 7)}, [],
                          ['"!pip install sglang==0.5.16\\n"',
                           "--model-path /m --enable-waterfill --moe-a2a-backend deepep &\""]),
    "kinds/cells.ipynb": ("notebook", {("R516-01", 18), ("R516-03", 10)},
                          ['"source": ["Run `python -m sglang.launch_server --enable-deepep-waterfill`"]'],
                          ['"  --fp4-gemm-backend auto &"',
                           '\\"--enable-waterfill\\", \\"--moe-a2a-backend\\", \\"deepep\\"])\\n"']),
    # IPython: `{expr}` in a ! line is a value the rules cannot know, `x = !cmd`, `%%script bash`, and `%env`
    # (an explicit verify mode, in effect for the later cells: kept and reported); without it the fix is reported
    "kinds/magics.ipynb": ("notebook", {("R516-01", 10), ("R516-03", 30), ("R516-04", 20), ("R516-07", 40),
                                        ("R516-07", 49)},
                           ['"%env SGLANG_RAGGED_VERIFY_MODE=static\\n"', "'--quantization', 'qoq'"],
                           ["!{sys.executable} -m sglang.launch_server --model-path /m --enable-waterfill --moe-a2a-backend deepep &",
                            "--fp4-gemm-backend auto\\n"]),
    "kinds/dspark.ipynb": ("notebook", {("R516-07", 9)}, ["--speculative-algorithm DSPARK --model-path /m"], []),
    # Azure Pipelines: a pwsh: step is reported, a bash: step fixed
    "kinds/azure-pipelines.yml": ("yaml", {("unread", 4), ("R516-03", 7)}, ["        --enable-deepep-waterfill\n"],
                                  ["--fp4-gemm-backend auto\n"]),
    # a CronJob with the launcher split across command and args; Ansible argv and shell; SkyPilot; Taskfile
    "kinds/cronjob.yaml": ("k8s", {("R516-02", 20), ("R516-50", 14)}, ['command: ["python3", "-m"]'],
                           ["- --optimistic-prefill-attempts=2\n"]),
    "kinds/ansible-serve.yml": ("yaml", {("R516-01", 12), ("R516-03", 14)}, ["> /var/log/s.log 2>&1 &"],
                                ["          - --enable-waterfill\n          - --moe-a2a-backend\n          - deepep\n",
                                 "--fp4-gemm-backend auto >"]),
    "kinds/skypilot.yaml": ("yaml", {("R516-01", 6), ("R516-50", 4)}, [],
                            ['pip install "sglang[all]==0.5.16"', "--enable-waterfill --moe-a2a-backend deepep --tp 8"]),
    "kinds/Taskfile.yml": ("yaml", {("R516-04", 5)}, ["--quantization qoq"], []),
    # kinds the tool does not read: read as shell when named; a launch, a flag or a pin it cannot read is manual
    "kinds/sglang.nomad": ("shell", {("unread", 9)}, ['"--enable-deepep-waterfill"]'], []),
    "kinds/main.tf": ("shell", {("R516-50", 6), ("unread", 5), ("unread", 7)}, ["--optimistic-prefill-retries 2 &"], []),
    "kinds/docker-bake.hcl": ("shell", {("unread", 4)}, ['SGLANG_ARGS = "--enable-deepep-waterfill --tp 8"'], []),
    "kinds/sglang.toml": ("shell", {("unread", 3)}, ["enable-deepep-waterfill = true"], []),
    "kinds/Earthfile": ("shell", {("unread", 4)}, ["--enable-deepep-waterfill"], []),
    "kinds/sglang.container": ("shell", {("R516-50", 2), ("unread", 3)}, ["--enable-deepep-waterfill"],
                               ["Image=lmsysorg/sglang:v0.5.16"]),
    "kinds/run.ps1": ("shell", {("unread", 1), ("unread", 2)}, ["  --enable-deepep-waterfill\n"], []),
    "kinds/launch.cmd": ("shell", {("R516-01", 2)}, ["@echo off"], ["--enable-waterfill --moe-a2a-backend deepep"]),
    "kinds/tox.ini": ("shell", {("R516-03", 7), ("R516-50", 5)}, ["deps = sglang==0.5.15"], ["--fp4-gemm-backend auto"]),
    "kinds/serve.fish": ("shell", {("R516-03", 3)}, ["set -x CUDA_VISIBLE_DEVICES 0"], ["--fp4-gemm-backend auto"]),
    # more forms: an Argo template (sh -c in args), Ray Serve engine_kwargs, direnv, a batch file, a compose
    # override with flags only, a flag default read from the environment, a pyproject tool table of flags
    "kinds/argo.yaml": ("k8s", {("R516-04", 11)}, ["--quantization qoq"], []),
    "kinds/ray-serve.yaml": ("yaml", {("unread", 7)}, ["enable_deepep_waterfill: true"], []),
    "kinds/.envrc": ("shell", {("unread", 1)}, ['"--tp 8 --enable-deepep-waterfill"'], []),
    "kinds/serve.bat": ("shell", {("unread", 1)}, ["set ARGS=--enable-deepep-waterfill"], []),
    "kinds/compose.override.yml": ("compose", {("unread", 3)}, ["command: --model-path /m --enable-deepep-waterfill"], []),
    "kinds/launch_env.py": ("python", {("unread", 2)}, ['"--optimistic-prefill-retries 2"'], []),
    "kinds/pyproj/pyproject.toml": ("pyproject", {("R516-50", 3), ("unread", 8)}, ['args = ["--enable-deepep-waterfill"]'],
                                    ['"sglang[all]==0.5.16"']),
    # sbatch --wrap="SCRIPT": the option's value is a script (an echo of the same is data)
    "kinds/sbatch_wrap.sh": ("shell", {("R516-01", 2), ("R516-02", 3)},
                             ['echo --wrap="python3 -m sglang.launch_server --enable-deepep-waterfill"'],
                             ['--wrap="python3 -m sglang.launch_server --model-path /m --enable-waterfill --moe-a2a-backend '
                              'deepep"', "--optimistic-prefill-attempts 2'"]),
    # flags kept in a file the launch reads ($(cat FILE), xargs -a FILE): the file is read, its rule flags reported
    "flagfiles/serve_files.sh": ("shell", {("unread", 2), ("unread", 3), ("unread", 4)}, ["$(cat flags.txt)"], []),
    "flagfiles/flags.txt": ("shell", {("unread", 1)}, ["--enable-deepep-waterfill"], []),
    "flagfiles/args.txt": ("shell", {("unread", 1)}, ["--quantization qoq"], []),
}
# nothing there breaks (decoys)
PASSES: set[str] = {"cfg/package.json", "chart/Chart.yaml", "chart/templates/job.yaml", "unit/sglang-dspark.service",
                    "unit/sglang-dspark.service.d/verify.conf"}
# never rewritten, whatever the flags
NEVER_WRITTEN = {"pins/lock/uv.lock", "pins/lock/poetry.lock", "pins/lock/Pipfile.lock"}


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
    assert exit_code([report]) == (0 if name in PASSES else 1)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_write_fixes_keeps_decoys_and_is_idempotent(name, tmp_path):
    _, _, kept, produced = EXPECT[name]
    shutil.copytree(DIR, tmp_path / "repo")
    target = tmp_path / "repo" / name
    before = target.read_bytes()
    first = run(target, unsafe=True)
    if first.changed:
        write_atomic(str(target), first.migrated)
    text = target.read_text()
    for snippet in kept:
        assert snippet in text, snippet
    for snippet in produced:
        assert snippet in text, (snippet, text)
    if name in NEVER_WRITTEN or not produced:
        assert target.read_bytes() == before
    if name.endswith((".json", ".ipynb", ".lock")) and not name.endswith(("uv.lock", "poetry.lock")):
        from sglaunch.migrate.yamlfmt import mask_json

        json.loads(mask_json(text))  # still JSON (comments and trailing commas of JSONC kept)
    second = run(target, unsafe=True)
    assert not second.changed, second.diff()
    assert not [f for f in second.findings if f.level in (FIX, UNSAFE)]
    manual_before = {(f.rule_id, f.token) for f in first.findings if f.level == MANUAL}
    manual_after = {(f.rule_id, f.token) for f in second.findings if f.level == MANUAL}
    assert manual_before <= manual_after | {(r, t) for r, t in manual_before if r.startswith("R")}
    # --check after --write: passes unless something manual remains
    assert exit_code([second]) == (1 if manual_after or second.error else 0)


def test_a_walk_reads_every_kind_and_counts_it(tmp_path):
    """The walk reads the new kinds (the .vscode folder too), rewrites none of the kinds it does
    not know, and skips JSON that holds no launch."""
    shutil.copytree(DIR, tmp_path / "repo")
    reports = [process_file(p, e, RULES, TO, True) for p, e in iter_files([str(tmp_path / "repo")])]
    by_name = {str(Path(r.path).relative_to(tmp_path / "repo")): r for r in reports if r is not None}
    kinds = {r.fmt for r in by_name.values()}
    assert {"workflow", "python", "helm", "config", "yaml", "systemd", "setupcfg", "pipfile", "lockfile",
            "requirements", "notebook", "k8s"} <= kinds
    assert ".vscode/launch.json" in by_name and "cfg/package.json" not in by_name
    for name in ("kinds/sglang.nomad", "kinds/main.tf", "kinds/docker-bake.hcl", "kinds/sglang.toml", "kinds/.envrc",
                 "kinds/serve.bat",
                 "kinds/Earthfile", "kinds/sglang.container", "kinds/run.ps1", "kinds/launch.cmd", "kinds/tox.ini"):
        report = by_name[name]
        assert not report.changed and exit_code([report]) == 1, name
        assert all(f.level not in (FIX, UNSAFE) for f in report.findings), name
    for name in NEVER_WRITTEN:
        assert not by_name[name].changed and exit_code([by_name[name]]) == 1
    assert by_name["kinds/serve.ipynb"].changed  # a notebook is a kind the walk knows: fixed


def test_a_tox_ini_with_only_a_pin_is_read(tmp_path):
    (tmp_path / "tox.ini").write_text("[testenv]\ndeps =\n    sglang==0.5.15\n    pytest\n")
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")  # no pins: read, nothing to say
    reports = [process_file(p, e, RULES, TO, False) for p, e in iter_files([str(tmp_path)])]
    reports = {Path(r.path).name: r for r in reports if r is not None}
    assert {(f.rule_id, f.level, f.line) for f in reports["tox.ini"].findings} == {("R516-50", MANUAL, 3)}
    assert reports["setup.cfg"].fmt == "setupcfg" and exit_code([reports["setup.cfg"]]) == 0


@pytest.mark.parametrize("body, fires", [
    ('"enable-deepep-waterfill": true', True),  # a flag mapping in JSON: the walk reads it
    ('"--tp": 8, "--enable-deepep-waterfill": true', True),  # flags as keys, turned into argv by a launcher
    ('"args": ["--tp", "8", "--quantization", "qoq"]', True),
    ('"scripts": {"dev": "vite --port 3000"}', False),
])
def test_json_in_a_walk(tmp_path, body, fires):
    (tmp_path / "x.json").write_text("{" + body + "}\n")
    reports = [process_file(p, e, RULES, TO, False) for p, e in iter_files([str(tmp_path)])]
    reports = [r for r in reports if r is not None]
    assert bool(reports and exit_code(reports) == 1) is fires


def test_a_lock_file_names_the_command_that_regenerates_it():
    report = run(DIR / "pins/lock/uv.lock")
    assert any("uv lock --upgrade-package sglang" in f.message for f in report.findings)
    report = run(DIR / "pins/lock/Pipfile.lock")
    assert any("pipenv upgrade flashinfer-python" in f.message for f in report.findings)
    assert not any("sglang==" in f.token for f in report.findings)  # sglang is locked at 0.5.16 there


@pytest.mark.parametrize("shell_value", ["pwsh", "powershell", "cmd", "node {0}"])
def test_a_non_posix_step_with_a_launch_is_manual(tmp_path, shell_value):
    path = tmp_path / ".github" / "workflows" / "w.yml"
    path.parent.mkdir(parents=True)
    path.write_text("jobs:\n  a:\n    steps:\n      - shell: " + shell_value
                    + "\n        run: python -m sglang.launch_server --fp4-gemm-backend cutlass\n")
    report = run(path, unsafe=True)
    assert not report.changed and exit_code([report]) == 1
    assert [(f.rule_id, f.level) for f in report.findings if f.level != "info"] == [("unread", MANUAL)]


def test_a_bash_step_is_still_fixed(tmp_path):
    path = tmp_path / ".github" / "workflows" / "w.yml"
    path.parent.mkdir(parents=True)
    path.write_text("jobs:\n  a:\n    steps:\n      - shell: bash -el {0}\n"
                    "        run: python -m sglang.launch_server --fp4-gemm-backend cutlass\n")
    assert "--fp4-gemm-backend auto" in run(path, unsafe=True).migrated


@pytest.mark.parametrize("text, produced, level", [
    # one-line JSON: entries joined with ", "
    ('{"enable-deepep-waterfill": true, "tp-size": 8}\n',
     '{"enable-waterfill": true, "moe-a2a-backend": "deepep", "tp-size": 8}\n', FIX),
    # the last entry: the separator before `}` stays as written
    ('{\n  "tp-size": 8,\n  "optimistic-prefill-retries": 1\n}\n',
     '{\n  "tp-size": 8,\n  "optimistic-prefill-attempts": 2\n}\n', FIX),
    # a value replaced in place, quotes kept
    ('{"tp-size": 8, "fp4-gemm-backend": "cutlass"}\n', '{"tp-size": 8, "fp4-gemm-backend": "auto"}\n', FIX),
])
def test_json_config_edits_stay_json(tmp_path, text, produced, level):
    path = tmp_path / "server.json"
    path.write_text(text)
    report = run(path, unsafe=True)
    assert report.fmt == "config"
    assert report.migrated == produced
    assert {f.level for f in report.findings if f.rule_id.startswith("R")} == {level}
    json.loads(report.migrated)


def test_a_json_manifest_env_insertion_that_would_break_json_is_manual(tmp_path):
    """A DSpark launch in a JSON Kubernetes manifest: the env line the fix would add is YAML, so
    it is reported instead (the file is never left invalid)."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s"},
        "spec": {"containers": [{"name": "s", "image": "lmsysorg/sglang:v0.5.16",
                                 "env": [{"name": "HF_HOME", "value": "/cache"}],
                                 "command": ["python3", "-m", "sglang.launch_server", "--speculative-algorithm",
                                             "DSPARK", "--model-path", "/m"]}]}}, indent=2) + "\n")
    report = run(path, unsafe=True)
    json.loads(report.migrated)
    assert exit_code([report]) == 1


def test_decoys_a_flag_declaration_call_and_a_flag_schema_json(tmp_path):
    """A call with a flag and other positional arguments is not an argv unless it holds a launcher
    (`Flag("--x", BOOL, "help")` declares a flag); a JSON that names flags as values (a flag
    schema) is data, not read by a walk."""
    (tmp_path / "schema.py").write_text('Flag("--enable-deepep-waterfill", BOOL, "Waterfill.", default=False)\n')
    (tmp_path / "flags.json").write_text(json.dumps({"flags": [{"name": "--enable-deepep-waterfill",
                                                                 "removed": "0.5.16"}]}, indent=1) + "\n")
    reports = [process_file(p, e, RULES, TO, True) for p, e in iter_files([str(tmp_path)])]
    reports = {Path(r.path).name: r for r in reports if r is not None}
    assert "flags.json" not in reports
    schema = reports["schema.py"]
    assert not schema.changed and not [f for f in schema.findings if f.level in (FIX, UNSAFE)]


def test_documents_without_a_suffix_are_not_read(tmp_path):
    (tmp_path / "CHANGELOG").write_text("0.5.16: use --enable-waterfill instead of --enable-deepep-waterfill\n")
    (tmp_path / "NOTES").write_text("pinned sglang==0.5.15 until the upgrade\n")
    reports = [process_file(p, e, RULES, TO, False) for p, e in iter_files([str(tmp_path)])]
    assert [r for r in reports if r is not None] == []
