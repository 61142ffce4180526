"""Issue 17 item 6: package pins and SGLang image tags (the `pin` rules, sglaunch/migrate/deps.py).

Tables of firing and not firing per format, decoys, the tag -> release mapping, byte-exact and
idempotent edits, and the command line over tests/migrate/fixtures/pins/ (`--check` exit codes,
the diff, `--write` with and without `--unsafe-fixes`, the walk's summary).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglaunch.cli.app import app
from sglaunch.errors import SglaunchError
from sglaunch.migrate.engine import detect_format, migrate_text
from sglaunch.migrate.evaluate import FIX, INFO, MANUAL, UNSAFE
from sglaunch.migrate.files import process_file
from sglaunch.migrate.rules import load_rules, parse_rule
from sglaunch.releases import release_key

FIXTURES = Path(__file__).parent / "fixtures"
PINS, EXPECTED = FIXTURES / "pins", FIXTURES / "pins_expected"


def migrate(text: str, fmt: str, to: str = "0.5.16", unsafe: bool = True, start: str = "0.5.15"):
    return migrate_text(text, fmt, load_rules().between(start, to), to, unsafe)


def found(result):
    return [(f.rule_id, f.level, f.line) for f in result.findings]


# --------------------------------------------------------------------------- firing, fixed


FIXED = [
    # shell pip lines
    ("shell", 'pip install "sglang[all]==0.5.15"\n', 'pip install "sglang[all]==0.5.16"\n', "R516-50"),
    ("shell", "pip3 install sglang[all]==0.5.15\n", "pip3 install sglang[all]==0.5.16\n", "R516-50"),
    ("shell", "python3 -m pip install -U --no-cache-dir sglang==0.5.15.post1\n",
     "python3 -m pip install -U --no-cache-dir sglang==0.5.16\n", "R516-50"),
    ("shell", "uv pip install --system 'sglang>=0.5.10,<0.5.16'\n", "uv pip install --system 'sglang==0.5.16'\n",
     "R516-50"),
    ("shell", "sudo -E pip install sglang==0.5.14 -i https://pypi.org/simple\n",
     "sudo -E pip install sglang==0.5.16 -i https://pypi.org/simple\n", "R516-50"),
    ("shell", "uv add sglang==0.5.15\n", "uv add sglang==0.5.16\n", "R516-50"),
    ("shell", 'bash -c "pip install sglang==0.5.15 && echo done"\n',
     'bash -c "pip install sglang==0.5.16 && echo done"\n', "R516-50"),
    ("shell", "bash <<'EOF'\npip install sglang==0.5.15\nEOF\n", "bash <<'EOF'\npip install sglang==0.5.16\nEOF\n",
     "R516-50"),
    ("shell", "pip install flashinfer-python==0.6.15\n", "pip install flashinfer-python==0.6.14\n", "R516-51"),
    ("shell", "pip install flashinfer_python==0.6.11\n", "pip install flashinfer_python==0.6.14\n", "R516-51"),
    ("shell", "pip install flashinfer==0.2.0.post2\n", "pip install flashinfer-python==0.6.14\n", "R516-51"),
    ("shell", "docker pull lmsysorg/sglang:v0.5.15-cu129\n", "docker pull lmsysorg/sglang:v0.5.16-cu129\n", "R516-50"),
    ("shell", "IMAGE=docker.io/lmsysorg/sglang:v0.5.15\n", "IMAGE=docker.io/lmsysorg/sglang:v0.5.16\n", "R516-50"),
    ("shell", "srun --container-image=lmsysorg/sglang:v0.5.14 true\n",
     "srun --container-image=lmsysorg/sglang:v0.5.16 true\n", "R516-50"),
    ("shell", "kubectl set image deploy/s s=lmsysorg/sglang:v0.5.15\n", "kubectl set image deploy/s s=lmsysorg/sglang:v0.5.16\n",
     "R516-50"),
    ("dockerfile", "FROM x\nCOPY --from=lmsysorg/sglang:v0.5.15 /a /b\n", "FROM x\nCOPY --from=lmsysorg/sglang:v0.5.16 /a /b\n",
     "R516-50"),
    ("shell", "docker pull lmsysorg/sglang:v0.5.15-rocm700-mi30x\n",
     "docker pull lmsysorg/sglang:v0.5.16-rocm700-mi30x\n", "R516-50"),
    # a version or tag kept in a variable the file sets once (the assignment is fixed)
    ("dockerfile", "ARG SGLANG_VERSION=0.5.15\nFROM lmsysorg/sglang:v${SGLANG_VERSION}-cu129\nARG SGLANG_VERSION=0.5.15\n"
                   "RUN pip install \"sglang[all]==${SGLANG_VERSION}\"\n",
     "ARG SGLANG_VERSION=0.5.16\nFROM lmsysorg/sglang:v${SGLANG_VERSION}-cu129\nARG SGLANG_VERSION=0.5.16\n"
     "RUN pip install \"sglang[all]==${SGLANG_VERSION}\"\n", "R516-50"),
    ("dockerfile", "FROM x\nENV FI_VERSION=0.6.13\nRUN pip install flashinfer-python==$FI_VERSION\n",
     "FROM x\nENV FI_VERSION=0.6.14\nRUN pip install flashinfer-python==$FI_VERSION\n", "R516-51"),
    ("shell", 'SGLANG_VERSION=0.5.15\npip install "sglang==$SGLANG_VERSION"\n',
     'SGLANG_VERSION=0.5.16\npip install "sglang==$SGLANG_VERSION"\n', "R516-50"),
    ("shell", "TAG=v0.5.15\ndocker pull lmsysorg/sglang:${TAG}\n", "TAG=v0.5.16\ndocker pull lmsysorg/sglang:${TAG}\n",
     "R516-50"),
    # SGLang built from its repository at a tag
    ("shell", "git clone -b v0.5.15 https://github.com/sgl-project/sglang.git && cd sglang && pip install -e 'python[all]'\n",
     "git clone -b v0.5.16 https://github.com/sgl-project/sglang.git && cd sglang && pip install -e 'python[all]'\n",
     "R516-50"),
    ("dockerfile", "FROM x\nRUN git clone https://github.com/sgl-project/sglang.git /sgl\nRUN cd /sgl && git checkout v0.5.15\n",
     "FROM x\nRUN git clone https://github.com/sgl-project/sglang.git /sgl\nRUN cd /sgl && git checkout v0.5.16\n", "R516-50"),
    ("shell", 'pip install "sglang[all] @ git+https://github.com/sgl-project/sglang.git@v0.5.15#subdirectory=python"\n',
     'pip install "sglang[all] @ git+https://github.com/sgl-project/sglang.git@v0.5.16#subdirectory=python"\n', "R516-50"),
    ("requirements", "-e git+https://github.com/sgl-project/sglang.git@v0.5.15#egg=sglang&subdirectory=python\n",
     "-e git+https://github.com/sgl-project/sglang.git@v0.5.16#egg=sglang&subdirectory=python\n", "R516-50"),
    # requirements and constraints files
    ("requirements", 'sglang[all]==0.5.15 ; python_version >= "3.10"  # server\n',
     'sglang[all]==0.5.16 ; python_version >= "3.10"  # server\n', "R516-50"),
    ("requirements", "sglang (==0.5.15)\n", "sglang (==0.5.16)\n", "R516-50"),
    ("requirements", "flashinfer-python>=0.6.10,<0.6.14\n", "flashinfer-python==0.6.14\n", "R516-51"),
    # pyproject.toml
    ("pyproject", '[project]\nname = "x"\ndependencies = [\n    "sglang[all]==0.5.15",  # pin\n]\n',
     '[project]\nname = "x"\ndependencies = [\n    "sglang[all]==0.5.16",  # pin\n]\n', "R516-50"),
    ("pyproject", "[project.optional-dependencies]\ngpu = ['flashinfer-python==0.6.15']\n",
     "[project.optional-dependencies]\ngpu = ['flashinfer-python==0.6.14']\n", "R516-51"),
    ("pyproject", '[dependency-groups]\nserve = ["sglang<0.5.16"]\n', '[dependency-groups]\nserve = ["sglang==0.5.16"]\n',
     "R516-50"),
    ("pyproject", '[tool.uv]\nconstraint-dependencies = ["sglang==0.5.15"]\n',
     '[tool.uv]\nconstraint-dependencies = ["sglang==0.5.16"]\n', "R516-50"),
    ("pyproject", '[tool.poetry.dependencies]\npython = "^3.10"\nsglang = {version = "0.5.15", extras = ["all"]}\n',
     '[tool.poetry.dependencies]\npython = "^3.10"\nsglang = {version = "0.5.16", extras = ["all"]}\n', "R516-50"),
    ("pyproject", '[tool.poetry.group.gpu.dependencies]\nflashinfer-python = "<0.6.14"\n',
     '[tool.poetry.group.gpu.dependencies]\nflashinfer-python = "0.6.14"\n', "R516-51"),
    # Dockerfiles
    ("dockerfile", "FROM lmsysorg/sglang:v0.5.15-cu129 AS base\n", "FROM lmsysorg/sglang:v0.5.16-cu129 AS base\n",
     "R516-50"),
    ("dockerfile", "FROM --platform=linux/amd64 lmsysorg/sglang:v0.5.15\n",
     "FROM --platform=linux/amd64 lmsysorg/sglang:v0.5.16\n", "R516-50"),
    ("dockerfile", "ARG BASE=lmsysorg/sglang:v0.5.15\nFROM ${BASE}\n", "ARG BASE=lmsysorg/sglang:v0.5.16\nFROM ${BASE}\n",
     "R516-50"),
    ("dockerfile", "FROM x\nRUN pip install --no-cache-dir \\\n    sglang==0.5.15\n",
     "FROM x\nRUN pip install --no-cache-dir \\\n    sglang==0.5.16\n", "R516-50"),
    ("dockerfile", 'FROM x\nRUN ["pip", "install", "sglang==0.5.15"]\n', 'FROM x\nRUN ["pip", "install", "sglang==0.5.16"]\n',
     "R516-50"),
    ("dockerfile", "FROM x\nRUN --mount=type=cache,target=/root/.cache uv pip install flashinfer-python==0.6.15\n",
     "FROM x\nRUN --mount=type=cache,target=/root/.cache uv pip install flashinfer-python==0.6.14\n", "R516-51"),
    ("dockerfile", "FROM x\nRUN <<EOF\npip install sglang==0.5.15\nEOF\n", "FROM x\nRUN <<EOF\npip install sglang==0.5.16\nEOF\n",
     "R516-50"),
    # YAML
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang:v0.5.15\n",
     "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang:v0.5.16\n", "R516-50"),
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: x\n"
            "    command: [pip, install, sglang==0.5.15]\n",
     "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: x\n"
     "    command: [pip, install, sglang==0.5.16]\n", "R516-50"),
    ("compose", 'services:\n  s:\n    image: "lmsysorg/sglang:v0.5.15"\n', 'services:\n  s:\n    image: "lmsysorg/sglang:v0.5.16"\n',
     "R516-50"),
    ("yaml", 'image:\n  repository: lmsysorg/sglang\n  tag: "v0.5.15"   # pinned\n',
     'image:\n  repository: lmsysorg/sglang\n  tag: "v0.5.16"   # pinned\n', "R516-50"),
    ("workflow", "jobs:\n  t:\n    container:\n      image: lmsysorg/sglang:v0.5.15\n    steps:\n"
                 "      - run: |\n          pip install sglang==0.5.15\n",
     "jobs:\n  t:\n    container:\n      image: lmsysorg/sglang:v0.5.16\n    steps:\n"
     "      - run: |\n          pip install sglang==0.5.16\n", "R516-50"),
    ("helm", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  template:\n"
             "    spec:\n      containers:\n      - name: s\n        image: lmsysorg/sglang:v0.5.15\n",
     "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  template:\n"
     "    spec:\n      containers:\n      - name: s\n        image: lmsysorg/sglang:v0.5.16\n", "R516-50"),
    ("compose", "x-img: &img lmsysorg/sglang:v0.5.15\nservices:\n  a:\n    image: *img\n  b:\n    image: *img\n",
     "x-img: &img lmsysorg/sglang:v0.5.16\nservices:\n  a:\n    image: *img\n  b:\n    image: *img\n", "R516-50"),
    ("yaml", "dependencies:\n  - python=3.11\n  - pip:\n    - sglang==0.5.15\n",
     "dependencies:\n  - python=3.11\n  - pip:\n    - sglang==0.5.16\n", "R516-50"),
    # Python (Modal / SkyPilot style images, pip calls, subprocess lists and shell strings)
    ("python", 'image = modal.Image.from_registry("lmsysorg/sglang:v0.5.15")\n',
     'image = modal.Image.from_registry("lmsysorg/sglang:v0.5.16")\n', "R516-50"),
    ("python", "image = base.pip_install('sglang[all]==0.5.15', 'numpy')\n",
     "image = base.pip_install('sglang[all]==0.5.16', 'numpy')\n", "R516-50"),
    ("python", 'subprocess.run(["pip", "install", "flashinfer-python==0.6.15"], check=True)\n',
     'subprocess.run(["pip", "install", "flashinfer-python==0.6.14"], check=True)\n', "R516-51"),
    ("python", 'subprocess.run([sys.executable, "-m", "pip", "install", "sglang==0.5.13"])\n',
     'subprocess.run([sys.executable, "-m", "pip", "install", "sglang==0.5.16"])\n', "R516-50"),
    ("python", 'os.system("pip install sglang==0.5.14 && echo ok")\n', 'os.system("pip install sglang==0.5.16 && echo ok")\n',
     "R516-50"),
    ("python", 'setup(name="x", install_requires=["numpy", "sglang==0.5.15"])\n',
     'setup(name="x", install_requires=["numpy", "sglang==0.5.16"])\n', "R516-50"),
    ("python", 'setup(extras_require={"gpu": ["flashinfer-python==0.6.15"]})\n',
     'setup(extras_require={"gpu": ["flashinfer-python==0.6.14"]})\n', "R516-51"),
    # line formats
    ("env", "SGLANG_IMAGE=lmsysorg/sglang:v0.5.15\n", "SGLANG_IMAGE=lmsysorg/sglang:v0.5.16\n", "R516-50"),
    ("makefile", "IMAGE ?= lmsysorg/sglang:v0.5.15\nall:\n\tpip install sglang==0.5.15\n",
     "IMAGE ?= lmsysorg/sglang:v0.5.16\nall:\n\tpip install sglang==0.5.16\n", "R516-50"),
]


@pytest.mark.parametrize("fmt, text, after, rule", FIXED, ids=[f"{f}-{t.strip()[:40]}" for f, t, _, _ in FIXED])
def test_pin_or_tag_that_excludes_the_target_is_fixed_with_unsafe_fixes(fmt, text, after, rule):
    result = migrate(text, fmt)
    assert result.error is None
    assert result.text == after
    pins = {(f.rule_id, f.level) for f in result.findings if f.rule_id.endswith(("-50", "-51"))}
    assert pins == {(rule, FIX)}
    again = migrate(result.text, fmt)
    assert again.text == result.text, "a second run changed the text"
    assert not [f for f in again.findings if f.level in (FIX, UNSAFE)]
    plain = migrate(text, fmt, unsafe=False)  # without --unsafe-fixes: reported, left alone
    assert plain.text == text
    assert {(f.rule_id, f.level) for f in plain.findings if f.rule_id.endswith(("-50", "-51"))} == {(rule, UNSAFE)}


# --------------------------------------------------------------------------- not firing, decoys


QUIET = [
    ("shell", "pip install sglang\n"),  # unpinned
    ("shell", 'pip install "sglang>=0.5.15"\n'),  # allows the target
    ("shell", "pip install 'sglang~=0.5.15'\n"),
    ("shell", "pip install sglang==0.5.16.post1\n"),  # a post release of the target
    ("shell", "pip install sglang==0.5.16\n"),
    ("shell", "pip install flashinfer-python==0.6.14\n"),
    ("shell", "pip install ./dist/sglang-0.5.16-py3-none-any.whl\n"),  # a wheel of the target
    ("shell", "pip install -e 'python[all]' .\n"),  # a source checkout
    ("shell", "pip install 'flashinfer-python>=0.6.14'\n"),
    ("shell", "pip install sglang-router==0.1.0 sgl-kernel==0.3.0\n"),  # other packages
    ("shell", "# pip install sglang==0.5.15\n"),
    ("shell", 'echo "pip install sglang==0.5.15"\n'),
    ("shell", "cat > notes.txt <<'EOF'\npip install sglang==0.5.15\nEOF\n"),
    ("shell", "pip download sglang==0.5.15\n"),
    ("shell", "pip install -r requirements.txt -c constraints.txt\n"),
    ("shell", "python -m sglang.bench_serving pip install sglang==0.5.15\n"),
    ("shell", "echo lmsysorg/sglang:v0.5.15\n"),
    ("shell", "docker pull lmsysorg/sglang-router:v0.1.0\n"),
    ("shell", "docker pull lmsysorg/sglang:v0.5.16-cu129\n"),
    ("requirements", "# sglang==0.5.15\nsglang-router==0.2.1\nnumpy==2.0\n"),
    ("pyproject", '[tool.poetry.dependencies]\nsglang = "^0.5.15"\nflashinfer-python = "~0.6.14"\n'),  # Poetry ranges
    ("pyproject", '[tool.poetry.dependencies]\nsglang = ">=0.5.15, <0.6"\n'),
    ("pyproject", '[project]\nname = "x"\n# "sglang==0.5.15"\ndependencies = ["numpy"]\n'
                  '[tool.other]\nnote = "sglang==0.5.15"\n'),
    ("dockerfile", "# FROM lmsysorg/sglang:v0.5.15\nFROM lmsysorg/sglang:v0.5.16\n"
                   "LABEL note=\"was lmsysorg/sglang:v0.5.15\"\nFROM builder\n"),
    ("dockerfile", "FROM x\nRUN echo pip install sglang==0.5.15\n"),
    ("yaml", 'note: "we ran lmsysorg/sglang:v0.5.10 before"\nrouter:\n  image:\n    repository: lmsysorg/sglang-router\n'
             "    tag: v0.1.0\n"),
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang:v0.5.16\n"),
    ("env", "# IMAGE=lmsysorg/sglang:v0.5.15\nIMAGE=lmsysorg/sglang:v0.5.16\n"),
    ("shell", "git clone -b v0.1.0 https://github.com/sgl-project/sglang-router.git\ngit checkout v0.5.15\n"),
    ("shell", 'git commit -m "pin sglang==0.5.15"\n'),
    ("python", '# lmsysorg/sglang:v0.5.15\nprint("pip install sglang==0.5.15")\nNOTE = "use sglang==0.5.15"\n'),
    ("python", 'logging.info("pull lmsysorg/sglang:v0.5.15 first")\n'),
]


@pytest.mark.parametrize("fmt, text", QUIET, ids=[f"{f}-{t.strip()[:40]}" for f, t in QUIET])
def test_allowed_pins_and_decoys_stay_silent(fmt, text):
    result = migrate(text, fmt)
    assert result.text == text
    assert not [f for f in result.findings if f.rule_id.endswith(("-50", "-51"))], found(result)


def test_a_readme_code_block_is_not_read_in_a_walk(tmp_path):
    (tmp_path / "README.md").write_text("```bash\npip install sglang==0.5.15\n```\n")
    runner = CliRunner()
    result = runner.invoke(app, ["migrate-flags", "--check", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "not launch files" in result.output


# --------------------------------------------------------------------------- reported, not rewritten


REPORTED = [
    ("shell", 'pip install "sglang==${SGLANG_VERSION}"\n', "0.5.16", MANUAL),
    ("shell", "docker run lmsysorg/sglang:${TAG} python3 -m sglang.launch_server --model-path m\n", "0.5.16", MANUAL),
    ("shell", "docker pull lmsysorg/sglang@sha256:0123456789abcdef0123456789abcdef\n", "0.5.16", MANUAL),
    ("shell", "pip install https://example.com/whl/sglang-0.5.15-py3-none-any.whl\n", "0.5.16", MANUAL),
    ("shell", "pip install 'sglang @ git+https://git.example.com/fork/sglang@v0.5.15#subdirectory=python'\n",
     "0.5.16", MANUAL),
    ("requirements", "sglang==0.5.15 \\\n    --hash=sha256:00ff\n", "0.5.16", MANUAL),  # regenerate the lock
    ("requirements", "-e git+https://example.com/mirror/sglang.git@v0.5.15#egg=sglang\n", "0.5.16", MANUAL),
    ("shell", "pip install git+https://github.com/sgl-project/sglang@abc1234#subdirectory=python\n", "0.5.16", MANUAL),
    ("shell", "git clone -b main https://github.com/sgl-project/sglang.git\n", "0.5.16", INFO),
    ("requirements", "sglang==${SGLANG_VERSION}\n", "0.5.16", MANUAL),
    ("pyproject", '[tool.poetry.dependencies]\nsglang = {git = "https://github.com/sgl-project/sglang", tag = "v0.5.15"}\n',
     "0.5.16", MANUAL),
    ("pyproject", '[tool.poetry.dependencies]\nsglang = "0.5.14 || 0.5.15"\n', "0.5.16", MANUAL),
    ("pyproject", '[tool.poetry.dependencies]\nflashinfer = "0.6.13"\n', "0.5.16", MANUAL),  # the old name
    ("dockerfile", "FROM lmsysorg/sglang:${SGLANG_TAG}\n", "0.5.16", MANUAL),
    ("shell", "V=0.5.14\n[ -n \"$X\" ] && V=0.5.15\npip install sglang==$V\n", "0.5.16", MANUAL),  # two values
    ("shell", "V=0.5.15\npip install sglang==$V flashinfer-python==$V\n", "0.5.16", MANUAL),  # two needs, one V
    ("compose", "services:\n  s:\n    image: lmsysorg/sglang:${TAG:-v0.5.15}\n", "0.5.16", MANUAL),
    ("python", 'tag = "v1"\nimage = f"lmsysorg/sglang:{tag}"\n', "0.5.16", MANUAL),
    ("shell", "docker pull lmsysorg/sglang:latest\n", "0.5.16", INFO),  # a moving tag
    ("shell", "docker pull lmsysorg/sglang:dev\n", "0.5.16", INFO),
    ("k8s", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: s\n    image: lmsysorg/sglang\n", "0.5.16", INFO),
    ("shell", "docker pull lmsysorg/sglang:v0.5.20\n", "0.5.16", INFO),  # newer than --to: never downgraded
    ("shell", "pip install sglang==0.5.20\n", "0.5.16", INFO),
    ("requirements", "sglang>=0.5.18\n", "0.5.16", INFO),
    ("pyproject", '[tool.poetry.dependencies]\nsglang = "^0.5.20"\n', "0.5.18", INFO),
    ("yaml", "image:\n  repository: lmsysorg/sglang\n  tag: \"\"\n", "0.5.16", INFO),  # the chart's appVersion
    ("helm", "kind: Pod\napiVersion: v1\nspec:\n  containers:\n  - name: s\n"
             "    image: \"lmsysorg/sglang:{{ .Values.image.tag }}\"\n", "0.5.16", INFO),  # read in values.yaml
    # FlashInfer after 0.5.16: only "0.6.14 or newer, never 0.6.15" is known, so never rewritten
    ("shell", "pip install flashinfer-python==0.6.15\n", "0.5.20", MANUAL),
    ("shell", "pip install flashinfer-python==0.6.13\n", "0.5.20", MANUAL),
    # CUDA 12 wheel indexes next to an sglang install, once the target ships CUDA 13 only
    ("shell", "pip install sglang==0.5.20 --extra-index-url https://download.pytorch.org/whl/cu126\n", "0.5.20", MANUAL),
    ("requirements", "--extra-index-url https://download.pytorch.org/whl/cu128\nsglang==0.5.20\n", "0.5.20", MANUAL),
]


@pytest.mark.parametrize("fmt, text, to, level", REPORTED, ids=[f"{f}-{to}-{t.strip()[:40]}" for f, t, to, _ in REPORTED])
def test_unresolvable_or_unknown_versions_are_reported_never_rewritten(fmt, text, to, level):
    result = migrate(text, fmt, to)
    assert result.text == text
    pins = [f for f in result.findings if f.rule_id.endswith(("-50", "-51"))]
    assert pins and {f.level for f in pins} == {level}, found(result)


def test_flashinfer_later_targets_pass_any_pin_that_can_be_0_6_14_or_newer():
    for text in ("pip install flashinfer-python==0.6.18\n", "pip install 'flashinfer-python>=0.6.14'\n",
                 "pip install 'flashinfer-python>0.6.14'\n"):
        result = migrate(text, "shell", "0.5.20")
        assert not [f for f in result.findings if f.rule_id == "R516-51"], (text, found(result))


def test_what_the_target_needs_does_not_depend_on_from():
    result = migrate("pip install flashinfer-python==0.6.15 sglang==0.5.16\n", "shell", "0.5.17", start="0.5.16")
    assert sorted(found(result)) == [("R516-51", MANUAL, 1), ("R517-50", FIX, 1)]  # 0.6.15 is never right


def test_the_rule_of_the_target_release_reports_once():
    result = migrate("pip install sglang==0.5.15\ndocker pull lmsysorg/sglang:v0.5.15\n", "shell", "0.5.22")
    assert found(result) == [("R522-50", FIX, 1), ("R522-50", FIX, 2)]
    assert result.text == "pip install sglang==0.5.22\ndocker pull lmsysorg/sglang:v0.5.22\n"


def test_image_and_launch_flags_on_one_line_are_both_fixed_from_stdin():
    text = "docker run --gpus all lmsysorg/sglang:v0.5.15 --model-path m --enable-deepep-waterfill\n"
    result = CliRunner().invoke(app, ["migrate-flags", "--write", "--unsafe-fixes", "-"], input=text)
    assert result.stdout == ("docker run --gpus all lmsysorg/sglang:v0.5.16 --model-path m --enable-waterfill "
                             "--moe-a2a-backend deepep\n")


def test_a_line_can_be_silenced_after_a_person_checked_it():
    result = migrate("docker pull lmsysorg/sglang:${TAG}  # sglaunch: ignore[R516-50]\n", "shell")
    assert not result.findings


# --------------------------------------------------------------------------- tags -> releases, CUDA


TAGS = [
    ("v0.5.15-cu129", "0.5.16", "v0.5.16-cu129"),
    ("v0.5.15", "0.5.16", "v0.5.16"),
    ("0.5.15", "0.5.16", "0.5.16"),  # no `v`: none written
    ("v0.5.15.post1-cu126", "0.5.16", "v0.5.16-cu126"),
    ("v0.5.19-cu129", "0.5.20", "v0.5.20"),  # CUDA 12 images are retired from 0.5.20 on
    ("v0.5.20-cu129", "0.5.20", "v0.5.20"),
    ("v0.5.19-cu130", "0.5.20", "v0.5.20-cu130"),
    ("v0.5.15-cu129-b200", "0.5.21", "v0.5.21-b200"),
    ("v0.5.16", "0.5.16", None),
    ("v0.5.16.post1", "0.5.16", None),
    ("v0.5.20", "0.5.20", None),
    ("v0.5.20-cu130", "0.5.21", "v0.5.21-cu130"),
]


@pytest.mark.parametrize("tag, to, new", TAGS)
def test_image_tags_map_to_releases(tag, to, new):
    text = f"FROM lmsysorg/sglang:{tag}\n"
    result = migrate(text, "dockerfile", to)
    assert result.text == (text if new is None else f"FROM lmsysorg/sglang:{new}\n")


# --------------------------------------------------------------------------- bytes and shapes


def test_edits_are_byte_exact_and_minimal(tmp_path):
    text = ("# keep   this\r\nnumpy  >=1.26\r\nsglang[all] == 0.5.15 ;python_version>='3.10'   # x\r\n"
            "caf\u00e9==1\r\n")
    path = tmp_path / "requirements.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    report = process_file(str(path), True, load_rules().between("0.5.15", "0.5.16"), "0.5.16", True)
    assert report.error is None
    assert report.migrated == "\ufeff" + text.replace("== 0.5.15", "==0.5.16")


def test_pyproject_edit_keeps_everything_else():
    text = (PINS / "pyproject.toml").read_text()
    result = migrate(text, "pyproject")
    assert result.text == (EXPECTED / "pyproject.toml").read_text()
    changed = [i for i, (a, b) in enumerate(zip(text.split("\n"), result.text.split("\n"))) if a != b]
    assert changed == [5, 6, 12]


@pytest.mark.parametrize("constraint, spec", [
    ("^0.5.15", ">=0.5.15,<0.6.0"), ("^1.2", ">=1.2,<2.0.0"), ("^0.0.3", ">=0.0.3,<0.0.4"),
    ("~0.5.15", ">=0.5.15,<0.6.0"), ("~1", ">=1,<2.0.0"), ("0.5.15", "==0.5.15"), ("*", ""),
    (">=0.5, <0.6", ">=0.5,<0.6"), ("0.5.*", "==0.5.*"), ("0.5 || 0.6", None), ("latest", None),
])
def test_poetry_constraints_read_as_pep_440(constraint, spec):
    from packaging.specifiers import SpecifierSet

    from sglaunch.migrate.deps import poetry_specifier

    assert poetry_specifier(constraint) == (None if spec is None else SpecifierSet(spec))


def test_invalid_pyproject_is_an_error():
    result = migrate("[project\ndependencies = [\n", "pyproject")
    assert result.error and result.text == "[project\ndependencies = [\n"


@pytest.mark.parametrize("name, fmt", [
    ("requirements.txt", "requirements"), ("requirements-dev.txt", "requirements"),
    ("dev-requirements.txt", "requirements"), ("constraints.txt", "requirements"),
    ("requirements/base.txt", "requirements"), ("requirements.in", "requirements"),
    ("pyproject.toml", "pyproject"), ("notes.txt", None), ("Cargo.toml", None),
])
def test_dependency_files_are_recognised_by_name(name, fmt):
    assert detect_format(name, "x==1\n", loose=False) == fmt


# --------------------------------------------------------------------------- the command line


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "repo"
    shutil.copytree(PINS, target)
    return target


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_check_fails_and_writes_nothing(tmp_path):
    repo = _copy(tmp_path)
    result = CliRunner().invoke(app, ["migrate-flags", "--check", str(repo)])
    assert result.exit_code == 1, result.output
    assert "R516-50" in result.output and "R516-51" in result.output
    assert "read: 3 requirements" in result.output and "1 pyproject" in result.output
    assert "skipped: 1 not launch files" in result.output  # README.md
    assert _tree(repo) == _tree(PINS)


def test_default_mode_prints_the_diff(tmp_path):
    repo = _copy(tmp_path)
    result = CliRunner().invoke(app, ["migrate-flags", "--unsafe-fixes", str(repo / "constraints-gpu.txt")])
    assert result.exit_code == 1
    assert "-flashinfer-python==0.6.15\n+flashinfer-python==0.6.14\n" in result.output
    plain = CliRunner().invoke(app, ["migrate-flags", str(repo / "constraints-gpu.txt")])
    assert "+flashinfer-python" not in plain.output and "unsafe" in plain.output


def test_write_without_unsafe_fixes_leaves_pins_and_reports(tmp_path):
    repo = _copy(tmp_path)
    result = CliRunner().invoke(app, ["migrate-flags", "--write", str(repo)])
    assert result.exit_code == 1
    assert _tree(repo) == _tree(PINS)
    assert "unsafe" in result.output and "--unsafe-fixes" in result.output


def test_write_with_unsafe_fixes_then_check_is_stable(tmp_path):
    repo = _copy(tmp_path)
    first = CliRunner().invoke(app, ["migrate-flags", "--write", "--unsafe-fixes", str(repo)])
    assert first.exit_code == 1, first.output
    assert _tree(repo) == _tree(EXPECTED)
    second = CliRunner().invoke(app, ["migrate-flags", "--check", "--unsafe-fixes", "--json", str(repo)])
    import json

    data = json.loads(second.stdout)
    assert not [f["path"] for f in data["files"] if f["changed"]]
    left = {(Path(f["path"]).name, x["level"]) for f in data["files"] for x in f["findings"]}
    # what still needs a person: the hashed lock, the variable version, and the moving `latest` tag
    assert left == {("requirements-lock.txt", MANUAL), ("setup.sh", MANUAL), ("compose.yaml", INFO)}
    assert data["exit_code"] == 1
    assert data["read"]["requirements"] == 3 and data["read"]["pyproject"] == 1


def test_check_passes_once_everything_is_at_the_target(tmp_path):
    (tmp_path / "requirements.txt").write_text("sglang[all]==0.5.16\nflashinfer-python==0.6.14\n")
    (tmp_path / "Dockerfile").write_text("FROM lmsysorg/sglang:v0.5.16-cu129\nCMD [\"sglang\", \"serve\"]\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["sglang>=0.5.16"]\n')
    result = CliRunner().invoke(app, ["migrate-flags", "--check", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "1 requirements" in result.output and "1 pyproject" in result.output


def test_github_annotations_for_pins(tmp_path):
    repo = _copy(tmp_path)
    result = CliRunner().invoke(app, ["migrate-flags", "--check", "--output-format", "github",
                                      str(repo / "requirements-lock.txt")])
    assert result.output.startswith("::error file=")
    assert "title=R516-50 manual" in result.output


# --------------------------------------------------------------------------- rule files


BASE = {"id": "R516-99", "name": "p", "kind": "pin", "packages": ["sglang"], "version": "0.5.16",
        "safety": "unsafe", "message": "m", "example": {"before": "a", "after": "b"}}


@pytest.mark.parametrize("change, fragment", [
    ({"packages": []}, "non-empty list"),
    ({"packages": ["not a name!"]}, "non-empty list"),
    ({"version": "latest"}, "must be versions"),
    ({"never": "0.6.15"}, "must be versions"),
    ({"images": ["sglang"]}, "image repositories"),
    ({"cuda": "thirteen"}, "CUDA major"),
    ({"safety": "safe"}, "unsafe or manual"),
    ({"floor": "yes"}, "true or false"),
])
def test_malformed_pin_rules_are_clear_errors(change, fragment):
    with pytest.raises(SglaunchError) as info:
        parse_rule({**BASE, **change}, "0.5.16", "x.yaml")
    assert fragment in info.value.message


def test_every_release_has_its_sglang_pin_and_0_5_20_on_say_cuda_13():
    pins = {r.release: r for r in load_rules().rules if r.kind == "pin" and r.packages == ("sglang",)}
    assert sorted(pins) == ["0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    for release, rule in pins.items():
        assert rule.version == release and rule.images == ("lmsysorg/sglang",)
        assert rule.cuda == ("13" if release_key(release) >= release_key("0.5.20") else None)
    flashinfer = [r for r in load_rules().rules if r.kind == "pin" and "flashinfer-python" in r.packages]
    assert [(r.release, r.version, r.never) for r in flashinfer] == [("0.5.16", "0.6.14", ("0.6.15",))]


# --------------------------------------------------------------------------- following a launch into other files


def _launch_tree(root: Path) -> None:
    (root / "scripts").mkdir()
    (root / "configs").mkdir()
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / "Dockerfile").write_text('FROM lmsysorg/sglang:v0.5.16\nCMD ["./scripts/serve.sh"]\n')
    (root / "scripts" / "serve.sh").write_text(
        '#!/bin/bash\nexec python3 -m sglang.launch_server --config configs/serve.yaml "$@"\n')
    (root / "configs" / "serve.yaml").write_text("model-path: /m\nenable-deepep-waterfill: true\ntp-size: 8\n")
    (root / ".github" / "workflows" / "ci.yml").write_text(
        "on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - run: bash scripts/serve.sh --port 1\n")


@pytest.mark.parametrize("start", ["Dockerfile", ".github/workflows/ci.yml", "scripts/serve.sh"])
def test_the_scripts_and_config_files_a_launch_uses_are_checked_too(tmp_path, monkeypatch, start):
    _launch_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["migrate-flags", "--check", start])
    assert result.exit_code == 1, result.output
    assert "configs/serve.yaml:2: R516-01" in result.output
    assert "1 config" in result.output


def test_followed_files_are_fixed_once_and_a_walk_reads_each_file_once(tmp_path, monkeypatch):
    _launch_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["migrate-flags", "--write", "Dockerfile", "scripts/serve.sh", "."])
    assert result.exit_code == 1, result.output
    assert (tmp_path / "configs" / "serve.yaml").read_text() == "model-path: /m\nenable-waterfill: true\n" \
        "moe-a2a-backend: deepep\ntp-size: 8\n"
    assert result.output.count("configs/serve.yaml:2: R516-01") == 1
    assert "read: 1 config, 1 dockerfile, 1 shell" in result.output
    again = CliRunner().invoke(app, ["migrate-flags", "--check", "Dockerfile"])
    assert again.exit_code == 0, again.output


def test_a_forced_format_is_not_forced_on_followed_files(tmp_path, monkeypatch):
    _launch_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Dockerfile.prod").write_text((tmp_path / "Dockerfile").read_text())
    result = CliRunner().invoke(app, ["migrate-flags", "--check", "--format", "dockerfile", "Dockerfile.prod"])
    assert "configs/serve.yaml:2: R516-01" in result.output
    assert "read: 1 config, 1 dockerfile, 1 shell" in result.output


def test_paths_inside_a_container_or_outside_the_tree_are_not_followed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "serve.sh").write_text("python3 -m sglang.launch_server --config /etc/sglang/serve.yaml\n"
                                       "python3 -m sglang.launch_server --config ../outside.yaml\n"
                                       "python3 -m sglang.launch_server --config $CONFIG\n")
    (tmp_path.parent / "outside.yaml").write_text("enable-deepep-waterfill: true\n")
    result = CliRunner().invoke(app, ["migrate-flags", "--check", "serve.sh"])
    assert result.exit_code == 0, result.output
    assert "read: 1 shell" in result.output


def test_requirement_files_a_file_includes_are_read_as_requirements(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "requirements.txt").write_text("-r base.txt\n-c pins.txt\nnumpy\n")
    (tmp_path / "base.txt").write_text("sglang==0.5.15\n")  # not a requirements name: read as included
    (tmp_path / "pins.txt").write_text("flashinfer-python==0.6.15\n")
    (tmp_path / "Dockerfile").write_text("FROM x\nCOPY . .\nRUN pip install -r deps.txt\n")
    (tmp_path / "deps.txt").write_text("sglang[all]==0.5.14\n")
    result = CliRunner().invoke(app, ["migrate-flags", "--write", "--unsafe-fixes", "."])
    assert result.exit_code == 1, result.output
    assert (tmp_path / "base.txt").read_text() == "sglang==0.5.16\n"
    assert (tmp_path / "pins.txt").read_text() == "flashinfer-python==0.6.14\n"
    assert (tmp_path / "deps.txt").read_text() == "sglang[all]==0.5.16\n"
    assert "read: 4 requirements" in result.output


def test_only_files_inside_the_repository_or_the_current_folder_are_followed(tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "serve.yaml").write_text("enable-deepep-waterfill: true\n")
    inner = tmp_path / "work" / "app"
    inner.mkdir(parents=True)
    (inner / "serve.sh").write_text("python3 -m sglang.launch_server --config etc/serve.yaml\n")
    monkeypatch.chdir(inner)
    assert "read: 1 shell" in CliRunner().invoke(app, ["migrate-flags", "--check", "serve.sh"]).output
    (tmp_path / ".git").mkdir()  # now tmp_path is the repository: its etc/serve.yaml is the one meant
    result = CliRunner().invoke(app, ["migrate-flags", "--check", "serve.sh"])
    assert "1 config" in result.output and "R516-01" in result.output
