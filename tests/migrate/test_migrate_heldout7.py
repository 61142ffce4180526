"""Issue 17, held-out check 7: launch files written outside the project in forms the earlier
fixtures did not have. Each fixture breaks on 0.5.16 (or holds a decoy that must stay as it
is); `--check` must fail with the expected findings, `--write --unsafe-fixes` must fix what is
fixable, keep the rest byte for byte and change nothing on a second run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sglaunch.cli.migrate_flags import exit_code
from sglaunch.migrate.evaluate import FIX, MANUAL, UNSAFE
from sglaunch.migrate.files import process_file, write_atomic
from sglaunch.migrate.rules import load_rules

DIR = Path(__file__).parent / "fixtures" / "heldout7"
RULES = load_rules().between("0.5.15", "0.5.16")
TO = "0.5.16"

# fixture -> (format, {(rule, line)} reported, text kept by --write, text --write produces)
EXPECT: dict[str, tuple[str, set[tuple[str, int]], list[str], list[str]]] = {
    # QUANT_ARGS is set in two case branches; only the last assignment used to be read
    "case_branches.sh": ("shell", {("unread", 6)}, ['QUANT_ARGS="--quantization modelopt_fp4 --fp4-gemm-backend cutlass"'],
                         []),
    # the same with arrays in an if/else
    "if_arrays.sh": ("shell", {("unread", 3)}, ["--fp4-gemm-backend cutlass)"], []),
    # the router's launcher takes every server flag
    "router.sh": ("shell", {("R516-01", 6)}, [], ["--enable-waterfill --moe-a2a-backend deepep \\\n"]),
    # supervisor's %(process_num)02d used to break the shell parse (an info notice only)
    "supervisord-numprocs.conf": ("supervisor", {("R516-02", 4)}, ["--port=300%(process_num)02d"],
                                  ["--optimistic-prefill-attempts 4\n"]),
    # a define block and a target-specific variable holding rule flags
    "serving.mk": ("makefile", {("unread", 3), ("R516-02", 16)},
                   ["python3 -m sglang.launch_server --model-path /models/m --fp4-gemm-backend cutlass\nendef"],
                   ["--optimistic-prefill-attempts=2\n"]),
    "Makefile": ("makefile", {("unread", 9), ("R516-04", 7)}, ["serve-ep: EP_FLAGS += --enable-deepep-waterfill"], []),
    # a chart's values: a flag list under a key named `args` (not a container: no image)
    "values-args.yaml": ("yaml", {("R516-01", 11), ("unread", 12)},
                         ['extraArgs: "--optimistic-prefill-retries 1 --trust-remote-code"'],
                         ["    - --enable-waterfill   # EP balance\n    - --moe-a2a-backend\n    - deepep\n"]),
    # a Helm template kept outside templates/ that parses as YAML: read as a template all the same
    "chart-lws/lws.yaml": ("helm", {("R516-01", 22), ("R516-04", 24)}, ["{{- if .Values.waterfill }}"],
                           ["--enable-waterfill --moe-a2a-backend deepep \\\n"]),
    # the packages a runner installs for the launch it runs (`uv run --with`, `uvx --from`)
    "uv_run.sh": ("shell", {("R516-01", 2), ("R516-50", 2), ("R516-50", 3), ("R516-51", 3),
                                      ("R516-50", 4)},
                  ['echo "uv run --with sglang==0.5.15"'],
                  ['uv run --with "sglang[all]==0.5.16" python -m sglang.launch_server',
                   "uvx --from sglang==0.5.16 --with=flashinfer-python==0.6.14 sglang serve",
                   'ssh h "uv run --with sglang==0.5.16 python']),
    # a launch built as text by printf inside $(...), then run with eval
    "printf_eval.sh": ("shell", {("unread", 2)}, ["--enable-deepep-waterfill)"], []),
    # flags kept as the keys of a dict the launcher turns into arguments
    "dict_flags.py": ("python", {("unread", 7)}, ['"enable-deepep-waterfill": True,'], []),
    # JSON is YAML: an ECS task definition holding the launch
    "ecs-task.json": ("yaml", {("R516-01", 9)}, ['"environment": [{"name": "HF_HOME", "value": "/cache"}]'],
                      ['"--enable-waterfill", "--moe-a2a-backend", "deepep"\n']),
    # here-strings read by a shell (a grep's here-string is data)
    "herestring.sh": ("shell", {("R516-01", 2), ("R516-02", 3)},
                      ['grep -c x <<< "python3 -m sglang.launch_server --enable-deepep-waterfill"'],
                      ["--enable-waterfill --moe-a2a-backend deepep\"", "--optimistic-prefill-attempts 2'"]),
    # labels and annotations are text for people: never edited, never reported
    "annotations.yaml": ("k8s", set(), ['how-to-run: "python3 -m sglang.launch_server --enable-deepep-waterfill"',
                                        'note: "migrated from --enable-deepep-waterfill (0.5.16)"'], []),
    # kinds read by name: Procfile (process: command), justfile recipes, Singularity definitions
    "kinds/Procfile": ("yaml", {("R516-01", 1)}, ["worker: python worker.py"],
                       ["--port $PORT --enable-waterfill --moe-a2a-backend deepep\n"]),
    "kinds/justfile": ("shell+jinja", {("R516-04", 4)}, ["{{model}}"], []),
    "kinds/sglang.def": ("shell", {("R516-01", 8)}, ["%runscript"], ['--enable-waterfill --moe-a2a-backend deepep "$@"']),
    # kinds the tool does not know, named explicitly: read as shell, and a launch it cannot read is manual
    "kinds/job.nomad.hcl": ("shell", {("unread", 8)}, ['"--enable-deepep-waterfill"]'], []),
    "kinds/Jenkinsfile": ("shell", {("R516-01", 7)}, [], ["--enable-waterfill --moe-a2a-backend deepep --ep-size 8 &"]),
    # the launch of images built FROM this one
    "Dockerfile.onbuild": ("dockerfile", {("unread", 2)}, ['"--enable-deepep-waterfill"]'], []),
    # process patterns (pkill, pgrep) and a --help run are not launches to check
    "process_patterns.sh": ("shell", set(), ['pkill -f "sglang.launch_server --enable-deepep-waterfill"'], []),
    # `args:` alone for the sglang image, made of abbreviations (argparse expands unique prefixes)
    "k8s_abbrev_args.yaml": ("k8s", {("R516-03", 8), ("validate", 8)}, ['"--enable-deepep-w"'], ['"--fp4-gemm=auto"']),
    "compose_abbrev.yaml": ("compose", {("validate", 4)}, ['"--enable-deepep-water"'], []),
    # strings of several flags split into the launch at run time (an argparse default, a constant)
    "flag_strings.py": ("python", {("unread", 3), ("unread", 4), ("R516-02", 8)},
                        ['default="--enable-deepep-waterfill --tp 8"'], ['"--optimistic-prefill-attempts", "2"']),
    # a program's own argparse flag of the same name: a decoy
    "own_argparse.py": ("python", set(), ['p.add_argument("--enable-deepep-waterfill"'], []),
    # a stage FROM an earlier stage inherits its ENTRYPOINT: its CMD of flags is the launch
    "Dockerfile.stages": ("dockerfile", {("R516-01", 6)}, ['ENTRYPOINT ["python3", "-m", "sglang.launch_server"]'],
                          ['"--enable-waterfill", "--moe-a2a-backend", "deepep"]']),
    # an interpolated verify mode (${VERIFY_MODE:-static}) is a value the file does not fix: a notice
    "compose_env_interpolated.yaml": ("compose", {("R516-07", 6)}, ["${VERIFY_MODE:-static}"], []),
    # tools that read ServerArgs from their command line beside flags of their own (bench_serving
    # is a client with its own flags: a decoy)
    "server_args_tools.sh": ("shell", {("R516-04", 2), ("R516-01", 3), ("R516-03", 4)},
                             ["--num-prompts 10 --enable-deepep-waterfill\n", "--batch-size 32 --input-len 256"],
                             ["--trust-remote-code --enable-waterfill --moe-a2a-backend deepep\n",
                              "--num-prompts 10 --fp4-gemm-backend auto\n"]),
    # a chart value mapping flag names to values (the template turns it into flags)
    "values-flag-map.yaml": ("yaml", {("unread", 7), ("unread", 8)}, ["    enable-deepep-waterfill: true\n"], []),
    # srun --export=...,X=static is the launch's env; a het-job `:` ends the launch
    "srun_het_export.sh": ("shell", {("R516-07", 3), ("R516-01", 4)}, ["srun --export=ALL,SGLANG_RAGGED_VERIFY_MODE=static python3"],
                           ["--enable-waterfill --moe-a2a-backend deepep : --het-group=1"]),
    # `- SGLANG_RAGGED_VERIFY_MODE` passes the host's value through: unknown, so a notice and nothing added
    "compose_env_passthrough.yaml": ("compose", {("R516-07", 13)}, ["      - SGLANG_RAGGED_VERIFY_MODE\n      - HF_TOKEN\n"], []),
    # ifeq/else branches setting a variable twice; a make-level export of an explicit static mode
    "Makefile.ifeq": ("makefile", {("unread", 4), ("R516-07", 13)},
                      ["QUANT := --quantization modelopt_fp4 --fp4-gemm-backend cutlass",
                       "\tpython3 -m sglang.launch_server --model-path /m --speculative-algorithm DSPARK"], []),
    # `set -- ...` then "$@": the positional parameters of entrypoint scripts
    "set_positional.sh": ("shell", {("R516-01", 2)}, ['exec python3 -m sglang.launch_server "$@"'],
                          ['set -- --model-path /m --enable-waterfill --moe-a2a-backend deepep "$@"']),
    "docker-entrypoint.sh": ("shell", {("R516-04", 4)}, ['exec "$@"'], []),
    # heredocs: a unit file (tee), a manifest (kubectl apply), a script (tee start.sh), a --config file
    "heredoc_targets.sh": ("shell", {("unread", 3), ("unread", 7), ("R516-02", 18), ("unread", 21)},
                           ['"--quantization", "qoq"]', "fp4-gemm-backend: cutlass"],
                           ["--optimistic-prefill-attempts 2\nEOF"]),
    # dict(...) keywords naming flags, and a conditional list of flags
    "dict_call_flags.py": ("python", {("R516-01", 4), ("unread", 5)}, ['quantization="qoq"'],
                           ['cmd += ["--enable-waterfill", "--moe-a2a-backend", "deepep"] if ep else []']),
    # kustomize: a patch adding a rule's flag (manual) and an images: newTag (the image's release)
    "kustomization.yaml": ("k8s", {("unread", 9), ("R516-50", 15)}, ["value: --enable-deepep-waterfill"],
                           ["    newTag: v0.5.16-cu129\n"]),
    # `#SBATCH --container-image=` (pyxis) is the job's image; apptainer/singularity run launches
    "pyxis.sbatch": ("shell", {("R516-50", 3), ("R516-01", 5), ("R516-50", 5), ("R516-04", 6), ("R516-02", 7)},
                     ["#SBATCH --container-mounts=/models:/models"],
                     ["#SBATCH --container-image=lmsysorg/sglang:v0.5.16-cu129\n",
                      "docker://lmsysorg/sglang:v0.5.16 python3"]),
    # a ConfigMap holding the --config file the launch mounts
    "configmap_config.yaml": ("k8s", {("unread", 9), ("unread", 10)}, ["    quantization: qoq\n"], []),
    # compose interpolates ${X} from the project's .env: it is read with the compose file
    "compose_dotenv/compose.yaml": ("compose", {("R516-50", 3)}, ["${COMMAND_ARGS}"], []),
    "compose_dotenv/.env": ("env", {("unread", 1)}, ["COMMAND_ARGS=--enable-deepep-waterfill --ep-size 8"], []),
    # an env file the script sources: read with it (its flags are reported there)
    "sourced/.env": ("env", {("unread", 3), ("R516-04", 4)}, ['SGLANG_EXTRA_ARGS="--enable-deepep-waterfill'], []),
    "sourced/serve.sh": ("shell", {("unread", 3)}, ["$SGLANG_EXTRA_ARGS"], []),
    # `set -a; source ./verify.env`: its explicit static mode is in effect, kept and reported
    "sourced/dspark.sh": ("shell", {("R516-07", 5)}, ["source ./verify.env\nset +a\npython3 -m"], []),
    "sourced/verify.env": ("env", set(), ["SGLANG_RAGGED_VERIFY_MODE=static"], []),
}
# nothing there breaks (notices only, or decoys)
PASSES: set[str] = {"sourced/dspark.sh", "sourced/verify.env", "compose_env_passthrough.yaml",
                    "compose_env_interpolated.yaml", "annotations.yaml", "process_patterns.sh", "own_argparse.py"}


def test_a_walk_reports_launches_in_unknown_kinds_and_rewrites_none(tmp_path):
    from sglaunch.migrate.files import iter_files

    shutil.copytree(DIR / "kinds", tmp_path / "kinds")
    (tmp_path / "kinds" / "README.md").write_text("# Serving\n\n    python -m sglang.launch_server --enable-deepep-waterfill\n")
    reports = {Path(p).name: process_file(p, e, RULES, TO, True) for p, e in iter_files([str(tmp_path)])}
    reports = {name: r for name, r in reports.items() if r is not None}
    assert "README.md" not in reports  # documents are not read
    for name in ("job.nomad.hcl", "Jenkinsfile"):
        report = reports[name]
        assert not report.changed and exit_code([report]) == 1
        assert all(f.level not in (FIX, UNSAFE) for f in report.findings)
    assert reports["Procfile"].changed  # a kind the walk knows by name is fixed


def test_compose_reads_the_project_env_file():
    from sglaunch.migrate.files import iter_files

    reports = [process_file(p, e, RULES, TO, False) for p, e in iter_files([str(DIR / "compose_dotenv" / "compose.yaml")])]
    assert [Path(r.path).name for r in reports] == ["compose.yaml", ".env"]


def test_a_sourced_env_file_is_read_with_the_script():
    from sglaunch.migrate.files import iter_files

    reports = [process_file(p, e, RULES, TO, False) for p, e in iter_files([str(DIR / "sourced" / "serve.sh")])]
    assert [Path(r.path).name for r in reports] == ["serve.sh", ".env"]
    assert exit_code(reports) == 1


def test_a_walk_reads_json_only_when_it_names_a_launch(tmp_path):
    from sglaunch.migrate.files import iter_files

    (tmp_path / "package.json").write_text('{"name": "x", "dependencies": {"left-pad": "1.0"}}\n')
    shutil.copy(DIR / "ecs-task.json", tmp_path / "task.json")
    reports = [process_file(p, e, RULES, TO, False) for p, e in iter_files([str(tmp_path)])]
    read = {Path(r.path).name: r.fmt for r in reports if r is not None and r.fmt}
    assert read.get("task.json") == "yaml" and "package.json" not in read


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
    manual_before = {(f.rule_id, f.token) for f in first.findings if f.level == MANUAL}
    manual_after = {(f.rule_id, f.token) for f in second.findings if f.level == MANUAL}
    assert manual_before <= manual_after | {(r, t) for r, t in manual_before if r.startswith("R")}
    if name not in PASSES:
        assert exit_code([second]) == 1 or not manual_before
