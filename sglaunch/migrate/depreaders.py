"""Where packages are installed and images named, per format, as `deps.Ref`s with exact spans.

- requirements / constraints files: one requirement per line (pip's file format: comments,
  `\\` continuations, option lines, `--hash`), the requirement itself parsed by `packaging`;
- pyproject.toml: the PEP 621 / PEP 735 dependency arrays and uv's, read with tomlkit (each
  string's span found by swapping it for a marker and diffing the round-tripped text);
- shell (tree-sitter-bash): `pip install`, `python -m pip install`, `uv pip install`, `uv add`
  and the image arguments of container tools (`docker run/pull`, `srun --container-image=`,
  `enroot import docker://...`), image assignments (`IMAGE=...`), and the same inside
  `bash -c "..."` strings and heredocs that are scripts;
- Dockerfile: `FROM`, `ARG`/`ENV` values, `RUN` in shell, exec and heredoc form;
- YAML (Kubernetes, compose, workflows, Helm values and templates, any YAML): scalar values that
  are image references, `repository` + `tag` pairs, scripts in scalars, `pip:` lists and
  `[pip, install, ...]` argument lists;
- Makefiles, env files, systemd and supervisor units: image references on non-comment lines,
  Makefile recipe lines as shell;
- Python (`ast`): image literals, `pip_install(...)` strings, `setup(install_requires=...)`,
  `["pip", "install", ...]` lists and shell strings given to runners.
Also the scripts a file runs (`./serve.sh`, kind SCRIPT), which `files` reads too.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

from sglaunch.migrate.deps import (CUDA_INDEX, GITREF, IMAGE, INDEX, POETRY, REQUIREMENT, SCRIPT, SGL_GIT, TAG,
                                   DepsUnreadable, Mapper, Ref, parse_image, requirement_name)
from sglaunch.migrate.tokens import TextEdit, align, scalar_mapper

IMAGES = ("lmsysorg/sglang",)  # replaced by the rules' repositories for each scan
PIP_PROGRAM = re.compile(r"pip(\d+(\.\d+)?)?")
PIP_HINT = re.compile(r"\bpip[0-9.]*\s+install\b|\buv\s+(pip\s+install|add)\b|\buvx\s|\buv\s.*\s--(with|from)\b|"
                      r"\bpipx\s+run\b")
RUNNERS = frozenset({"sudo", "env", "time", "exec", "command", "nohup", "nice", "stdbuf", "doas"})
CONTAINER_TOOLS = frozenset({"docker", "podman", "nerdctl", "nvidia-docker", "singularity", "apptainer", "enroot",
                             "skopeo", "crane", "ctr", "srun", "sbatch", "salloc", "kubectl", "oc", "sky", "buildah"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})
SHELL_C = re.compile(r"-[a-z]*c[a-z]*")
RUNS_SCRIPT = re.compile(r"(^|\s)(\./)?[A-Za-z0-9_.][A-Za-z0-9_./-]*\.(sh|bash)(\s|$)")
SBATCH_IMAGE = re.compile(r"(?m)^#SBATCH[ \t]+(?:.*[ \t])?--container-image[= ]([^\s\"']+)")
ENV_PATH = re.compile(r"(\./)?([A-Za-z0-9_.-]+/)*([A-Za-z0-9_.-]*\.env|\.env\.[A-Za-z0-9_-]+)")
SCRIPT_PATH = re.compile(r"(\./)?[A-Za-z0-9_.][A-Za-z0-9_./-]*\.(sh|bash|slurm|sbatch)")  # relative paths only
INDEX_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--index", "--default-index"})
# a CUDA wheel index given with these matters for the target's CUDA version
CUDA_PACKAGES = frozenset({"sglang", "flashinfer-python", "flashinfer", "sgl-kernel", "torch"})
# pip / uv options that take the next word as their value
VALUE_OPTIONS = frozenset({
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url", "--extra-index-url",
    "-f", "--find-links", "-t", "--target", "--prefix", "--root", "--src", "--platform", "--python-version",
    "--implementation", "--abi", "--only-binary", "--no-binary", "--progress-bar", "--timeout", "--retries",
    "--cache-dir", "--upgrade-strategy", "-C", "--config-settings", "--global-option", "--log", "--proxy",
    "--cert", "--client-cert", "--exists-action", "--trusted-host", "--python", "-p", "--index-strategy",
    "--torch-backend", "--resolution", "--prerelease", "--override", "--build-constraint", "--group", "--extra",
    "--optional", "--index", "--default-index", "--keyring-provider", "--link-mode", "--compile-bytecode",
    "--exclude-newer", "--report", "--hash", "--no-build-isolation-package", "--upgrade-package", "-P",
    "--reinstall-package", "--dev-group", "--package", "--directory", "--project",
})


SCAN_NAME: list[str] = []  # the file's name (a lock file's kind tells the command that regenerates it)


def scan(text: str, fmt: str, repositories: Sequence[str] = IMAGES, variables: dict | None = None) -> list[Ref]:
    """The refs of `text`; `variables`, when given, receives the literal assignments of the
    file (shell `V=0.5.15`, Dockerfile `ARG V=0.5.15` / `ENV V=...`): name -> [Ref]."""
    reader = _Reader(text, tuple(repositories) or IMAGES)
    reader.name = SCAN_NAME[0] if SCAN_NAME else ""
    base = fmt[:-len("+jinja")] if fmt.endswith("+jinja") else fmt
    source = text
    if base != fmt:
        from sglaunch.migrate.engine import mask_jinja

        source = mask_jinja(text, base)
    handler = {
        "requirements": reader.requirements, "pyproject": reader.pyproject, "shell": reader.shell_file,
        "dockerfile": reader.dockerfile, "k8s": reader.yaml, "compose": reader.yaml, "yaml": reader.yaml,
        "workflow": reader.yaml, "helm": reader.yaml, "makefile": reader.makefile, "env": reader.lines,
        "systemd": reader.lines, "supervisor": reader.lines, "python": reader.python,
        "setupcfg": reader.setupcfg, "pipfile": reader.pipfile, "lockfile": reader.lockfile,
        "notebook": reader.notebook,
    }.get(base)
    if handler is None:
        return []
    handler(source, base)
    if variables is not None:
        variables.update(reader.variables)
    refs = sorted(reader.refs, key=lambda r: r.offset)
    for ref in refs:
        ref.helm = base == "helm"
    if source != text or base in ("helm", "workflow"):  # show `${{ matrix.v }}`, `{{ .Values.t }}` as written
        for ref in refs:
            located = ref.mapper(TextEdit(0, len(ref.value), "")) if ref.mapper is not None else None
            if located is not None and located.end > located.start:
                ref.shown = text[located.start:located.end]
    if base != fmt:  # a Jinja template: nothing inside a directive is edited
        from sglaunch.migrate.engine import JINJA_DIRECTIVE

        spans = [(m.start(), m.end()) for m in JINJA_DIRECTIVE.finditer(text)]
        for ref in refs:
            if ref.mapper is not None:
                ref.mapper = _guarded(ref.mapper, spans)
    return refs


def _guarded_from(mapper: Mapper, low: int) -> Mapper:
    """`mapper` for edits at or after `low` only (a value whose first `low` characters are not in the file)."""
    def guarded(edit: TextEdit) -> TextEdit | None:
        return None if edit.start < low else mapper(edit)

    return guarded


def _find_key(text: str, name: str) -> int:
    found = text.find(f'"{name}"')
    return max(found, 0)


def _guarded(mapper: Mapper, spans) -> Mapper:
    def guarded(edit: TextEdit) -> TextEdit | None:
        moved = mapper(edit)
        if moved is None or any(a < moved.end + 1 and moved.start - 1 < b for a, b in spans):
            return None
        return moved

    return guarded


def _shift(mapper: Mapper | None, by: int) -> Mapper | None:
    if mapper is None or by == 0:
        return mapper

    def shifted(edit: TextEdit) -> TextEdit | None:
        return mapper(TextEdit(edit.start + by, edit.end + by, edit.text))

    return shifted


def _offset(offset: int, forbidden: str = " \t\n\"'\\$`") -> Mapper:
    def mapper(edit: TextEdit) -> TextEdit | None:
        if any(ch in edit.text for ch in forbidden):
            return None
        return TextEdit(edit.start + offset, edit.end + offset, edit.text)

    return mapper


class _Reader:
    def __init__(self, text: str, repositories: tuple[str, ...]):
        self.text = text
        self.repositories = repositories
        self.refs: list[Ref] = []
        self.cloned = False  # the file clones SGLang's repository: a later `git checkout TAG` pins it
        self.variables: dict[str, list[Ref]] = {}  # literal assignments, for `sglang==${V}` (deps.resolved)

    def add(self, kind: str, value: str, mapper: Mapper | None, fallback: int, where: str, **extra) -> None:
        git = SGL_GIT.search(value) if kind == REQUIREMENT else None
        if git is not None:  # `sglang @ git+https://github.com/sgl-project/sglang@v0.5.15`: the tag is the pin
            kind, value, mapper = GITREF, git.group(1), _shift(mapper, git.start(1))
            fallback += git.start(1)
            extra.pop("hashed", None)
        offset = fallback
        if mapper is not None:
            located = mapper(TextEdit(0, 0, ""))
            offset = located.start if located is not None else fallback
        self.refs.append(Ref(kind, value, mapper, offset, where, **extra))

    def is_image(self, value: str) -> bool:
        return parse_image(value, self.repositories) is not None

    # -- requirements files ------------------------------------------------------

    def requirements(self, text: str, _fmt: str) -> None:
        lines = text.split("\n")
        offset = 0
        indexes: list[Ref] = []
        previous: Ref | None = None
        continued = False
        for line in lines:
            start = offset
            offset += len(line) + 1
            body = line.rstrip("\r")
            if continued:
                if "--hash" in body and previous is not None:
                    previous.hashed = True
                continued = body.endswith("\\")
                continue
            continued = body.endswith("\\")
            comment = re.search(r"(^|\s)#", body)
            if comment:
                body = body[:comment.start()]
            if continued:
                body = body[:-1] if body.endswith("\\") else body
            stripped = body.strip()
            if not stripped:
                continue
            lead = len(body) - len(body.lstrip())
            if stripped.startswith("-"):
                include = re.match(r"(-r|--requirement|-c|--constraint)(\s+|=)(\S+)", stripped)
                if include:
                    self.refs.append(Ref(SCRIPT, include.group(3), None, start + lead, "requirements"))
                index = re.match(r"(-i|--index-url|--extra-index-url|-f|--find-links)(\s+|=)(\S+)", stripped)
                if index and CUDA_INDEX.search(index.group(3)):
                    at = start + lead + index.start(3)
                    indexes.append(Ref(INDEX, index.group(3), _offset(at), at, f"requirements file {index.group(1)}"))
                editable = re.match(r"(-e|--editable)(\s+|=)(\S+)", stripped)
                previous = None
                if editable and ("://" in editable.group(3) or editable.group(3).endswith(".whl")):
                    value = editable.group(3)
                    at = start + lead + editable.start(3)
                    self.add(REQUIREMENT, value, _offset(at, "\n"), at, "requirements file, editable")
                continue
            requirement = re.split(r"\s+--?[A-Za-z]", stripped, maxsplit=1)[0].rstrip()
            hashed = "--hash" in stripped
            where = "requirements file"
            self.add(REQUIREMENT, requirement, _offset(start + lead, "\n"), start + lead, where, hashed=hashed)
            previous = self.refs[-1]
        if any(_cuda_package(r.value) for r in self.refs if r.kind == REQUIREMENT):
            self.refs.extend(indexes)

    # -- setup.cfg, Pipfile, lock files -----------------------------------------

    SETUPCFG_KEYS = ("install_requires", "setup_requires", "tests_require")

    def setupcfg(self, text: str, _fmt: str) -> None:
        """`[options] install_requires =` (and setup_requires, tests_require) and every key of
        `[options.extras_require]`: one requirement a line, on the key's line or indented below it."""
        section, active, offset = "", False, 0
        for line in text.split("\n"):
            start = offset
            offset += len(line) + 1
            body = line.rstrip("\r")
            stripped = body.strip()
            header = re.fullmatch(r"\[([^\]]+)\]", stripped)
            if header:
                section, active = header.group(1).strip().lower(), False
                continue
            if not stripped or stripped.startswith(("#", ";")):
                continue
            value_at = None
            if not body[:1].isspace():
                key = re.match(r"([A-Za-z0-9_.-]+)\s*[=:]\s*", body)
                active = key is not None and ((section == "options" and key.group(1).lower() in self.SETUPCFG_KEYS)
                                              or section == "options.extras_require")
                if not active:
                    continue
                value_at = key.end()
            elif active:
                value_at = len(body) - len(body.lstrip())
            else:
                continue
            value = body[value_at:]
            comment = re.search(r"(^|\s)[#;]", value)
            if comment:
                value = value[:comment.start()]
            requirement = value.strip()
            if requirement:
                at = start + value_at + (len(value) - len(value.lstrip()))
                self.add(REQUIREMENT, requirement, _offset(at, "\n"), at, f"setup.cfg [{section}]")

    def pipfile(self, text: str, _fmt: str) -> None:
        """`[packages]` / `[dev-packages]` (and Pipfile categories): `sglang = "==0.5.15"` or
        `sglang = {version = "==0.5.15", extras = ["all"]}`; `"*"` is no pin."""
        import tomlkit
        from tomlkit.exceptions import TOMLKitError

        try:
            doc = tomlkit.parse(text)
        except (TOMLKitError, ValueError) as exc:
            raise DepsUnreadable(f"invalid TOML: {exc}") from None
        exact = tomlkit.dumps(doc) == text
        for table_name, table in doc.items():
            if table_name in ("source", "requires", "scripts", "pipenv") or not hasattr(table, "keys"):
                continue
            for name in list(table.keys()):
                item = table[name]
                holder, key = (table, name) if isinstance(item, str) else (item, "version")
                value = holder.get(key) if hasattr(holder, "get") else None
                where = f"Pipfile [{table_name}]"
                if not isinstance(value, str):  # a git/path source: no version the tool can read
                    continue
                spec = "" if value.strip() == "*" else str(value)
                span = _toml_span(doc, text, holder, key) if exact else None
                mapper = None
                at = span[0] if span else 0
                if span is not None and spec and text[span[0]:span[1]] == spec:
                    # the value is `name` + the specifier; only the specifier part is in the file
                    mapper = _guarded_from(_offset(span[0] - len(str(name)), "\n\"'\\"), len(str(name)))
                self.add(REQUIREMENT, f"{name}{spec}", mapper, at, where)

    def notebook(self, text: str, _fmt: str) -> None:
        """`!pip install sglang==0.5.15` and `%pip install ...` lines of a notebook's code cells."""
        from sglaunch.migrate import notebook

        try:
            found = notebook.cells(text)
        except ValueError:
            return  # the launch reader reports it
        for cell in found:
            if cell.shell.strip():
                self.shell(cell.shell, cell.mapper(), depth=0, where="notebook")

    LOCKS = {"uv.lock": "uv lock --upgrade-package {name}", "poetry.lock": "poetry update --lock {name}",
             "pdm.lock": "pdm update --update-reuse {name}", "pipfile.lock": "pipenv upgrade {name}",
             "pylock.toml": "uv pip compile ... -o pylock.toml (or the tool that wrote it)"}

    def lockfile(self, text: str, fmt: str) -> None:
        """A lock file (uv.lock, poetry.lock, pdm.lock, Pipfile.lock, pylock*.toml): the locked
        version of every package, reported and never rewritten (a lock is regenerated)."""
        import json

        kind = self.name.lower()
        command = next((c for k, c in self.LOCKS.items() if kind == k or (k == "pylock.toml" and
                                                                           kind.startswith("pylock"))), "")
        if text.lstrip().startswith("{"):  # Pipfile.lock: JSON
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise DepsUnreadable(f"invalid JSON: {exc}") from None
            for group, packages in data.items() if isinstance(data, dict) else ():
                if group == "_meta" or not isinstance(packages, dict):
                    continue
                for name, entry in packages.items():
                    version = entry.get("version") if isinstance(entry, dict) else None
                    if isinstance(version, str):
                        at = _find_key(text, name)
                        self.add(REQUIREMENT, f"{name}{version}", None, at, f"{self.name or 'lock file'} [{group}]",
                                 lock=(command or "pipenv lock").format(name=name))
            return
        # TOML locks: [[package]] tables with name = ... and version = ...
        for match in re.finditer(r'(?ms)^\[\[(?:package|packages)\]\]\s*\n(.*?)(?=^\[|\Z)', text):
            body = match.group(1)
            name = re.search(r'(?m)^name\s*=\s*"([^"]+)"', body)
            version = re.search(r'(?m)^version\s*=\s*"([^"]+)"', body)
            if name and version:
                at = match.start(1) + version.start()
                regenerate = (command or "the tool that wrote it").format(name=name.group(1))
                self.add(REQUIREMENT, f"{name.group(1)}=={version.group(1)}", None, at, self.name or "lock file",
                         lock=regenerate)

    # -- pyproject.toml ----------------------------------------------------------

    def pyproject(self, text: str, _fmt: str) -> None:
        import tomlkit
        from tomlkit.exceptions import TOMLKitError

        try:
            doc = tomlkit.parse(text)
        except (TOMLKitError, ValueError) as exc:
            raise DepsUnreadable(f"invalid TOML: {exc}") from None
        exact = tomlkit.dumps(doc) == text
        for where, array in _dependency_arrays(doc):
            for index in range(len(array)):
                item = array[index]
                if not isinstance(item, str):
                    continue
                span = _toml_span(doc, text, array, index) if exact else None
                if span is None:
                    self.add(REQUIREMENT, str(item), None, 0, where)
                    continue
                start, end = span
                mapper = _offset(start, "\n\"'\\") if text[start:end] == str(item) else None
                self.add(REQUIREMENT, str(item), mapper, start, where)
        for where, table in _poetry_tables(doc):
            for name in list(table.keys()):
                self._poetry(doc, text, exact, where, table, str(name))

    def _poetry(self, doc, text: str, exact: bool, where: str, table, name: str) -> None:
        """`sglang = "^0.5.15"` or `sglang = {version = "0.5.15", extras = ["all"]}`."""
        item = table[name]
        holder, key = (table, name) if isinstance(item, str) else (item, "version")
        value = holder.get(key) if hasattr(holder, "get") else None
        if not isinstance(value, str):  # a git/path/url source, or a list of constraints
            span = _toml_span(doc, text, table, name, any_item=True) if exact else None
            self.add(POETRY, "", None, span[0] if span else 0, where, repository=name)
            return
        span = _toml_span(doc, text, holder, key) if exact else None
        if span is None:
            self.add(POETRY, str(value), None, 0, where, repository=name)
            return
        start, end = span
        mapper = _offset(start, "\n\"'\\") if text[start:end] == str(value) else None
        self.add(POETRY, str(value), mapper, start, where, repository=name)

    # -- shell -------------------------------------------------------------------

    def shell_file(self, text: str, _fmt: str) -> None:
        self.shell(text, lambda e: e, depth=0)
        # `#SBATCH --container-image=lmsysorg/sglang:v0.5.15` (pyxis): the image the whole job runs in
        for match in SBATCH_IMAGE.finditer(text):
            value = match.group(1)
            skip = _image_prefix(value)
            if self.is_image(value[skip:]):
                self.add(IMAGE, value[skip:], _offset(match.start(1) + skip), match.start(1) + skip,
                         "#SBATCH --container-image")

    def shell(self, text: str, mapper: Mapper, depth: int, where: str = "") -> None:
        """Pins and images in a shell script whose edits `mapper` moves into the file."""
        from sglaunch.migrate import shell as sh

        if depth > 4:
            return
        script = sh._Script(text, mapper, "shell")
        tree = sh._parser().parse(script.data)
        for node, in_error in sh._walk(tree.root_node):
            if in_error or node.type == "ERROR":
                continue
            if node.type == "command":
                self._command(script, node, depth, where)
            elif node.type == "variable_assignment":
                value, name = node.child_by_field_name("value"), node.child_by_field_name("name")
                if value is not None:
                    token = script._token(value)
                    if self.is_image(token.value):
                        self._word(script, token, IMAGE, token.value, 0, "a shell variable")
                    elif name is not None and not token.dynamic and re.fullmatch(r"[\w.+-]+", token.value):
                        self._variable(script, token, script.src(name))
            elif node.type == "heredoc_redirect":
                self._heredoc(script, node, depth)

    def _variable(self, script, token, name: str) -> None:
        from sglaunch.migrate import shell as sh

        container = sh.ShellContainer(script.text, [token], script.mapper)
        mapper, _ = sh.word_mapper(container, 0)
        start = script.mapper(TextEdit(token.start, token.start, ""))
        self.variables.setdefault(name, []).append(Ref("variable", token.value, mapper, start.start if start else 0, name))

    def _word(self, script, token, kind: str, value: str, skip: int, where: str) -> None:
        from sglaunch.migrate import shell as sh

        container = sh.ShellContainer(script.text, [token], script.mapper)
        mapper, _ = sh.word_mapper(container, 0)
        start = script.mapper(TextEdit(token.start, token.start, ""))
        self.add(kind, value, _shift(mapper, skip), start.start if start else 0, where)

    def _command(self, script, node, depth: int, where: str) -> None:
        from sglaunch.migrate import shell as sh

        words = sh._command_words(node)
        if not words:
            return
        nodes = list(words)
        tokens = [script._token(w) for w in words]
        values = [t.value for t in tokens]
        program = _program(values)
        if program is None:
            return
        name = os.path.basename(values[program])
        if name == "git" and "clone" in values[program + 1:program + 3]:
            self._git_clone(script, tokens, values, program)
        elif name == "git" and self.cloned and "checkout" in values[program + 1:program + 4]:
            # `git clone .../sgl-project/sglang.git && cd sglang && git checkout v0.5.15`
            k = values.index("checkout", program + 1) + 1
            while k < len(values) and values[k].startswith("-"):
                k += 1
            if k < len(values) and values[k] != "--":
                self._word(script, tokens[k], GITREF, values[k], 0, "git checkout")
        if name in sh.DATA_PROGRAMS:
            return
        self._script(values, program, tokens[program].start)
        first = pip_arguments(values, program)
        if first is not None:
            shown = where or " ".join(values[program:first])
            words = requirement_words(values, first)
            for k in words:
                self._word(script, tokens[k], REQUIREMENT, values[k], 0, shown)
            for k in range(first, len(values) - 1):
                if values[k] in ("-r", "--requirement", "-c", "--constraint"):
                    self.refs.append(Ref(SCRIPT, values[k + 1], None, tokens[k + 1].start, "requirements"))
            if any(_cuda_package(values[k]) for k in words):
                for k, option, url in index_options(values, first):
                    self._word(script, tokens[k], INDEX, url, len(values[k]) - len(url), f"{shown} {option}")
        for k, skip in run_with_requirements(values, program):
            # `uv run --with "sglang==0.5.15" python -m sglang.launch_server`, `uvx --from sglang==X`
            shown = f"{name} {values[k][:skip] or values[k - 1]}"
            self._word(script, tokens[k], REQUIREMENT, values[k][skip:], skip, shown)
        if name in CONTAINER_TOOLS or os.path.basename(values[0]) in CONTAINER_TOOLS:
            for k, value in enumerate(values[1:], 1):
                skip = _image_prefix(value)
                if self.is_image(value[skip:]):
                    self._word(script, tokens[k], IMAGE, value[skip:], skip, f"{name} {values[1] if len(values) > 1 else ''}".strip())
        for k, value in enumerate(values[:-2]):
            if os.path.basename(value) in SHELLS and SHELL_C.fullmatch(values[k + 1]):
                self._nested(script, tokens[k + 2], depth)
                break
        else:
            # `ssh host "pip install ... && uv run --with sglang==X ..."`, `tmux new -d "..."`: a
            # quoted command line given to a runner (echo, printf and other data programs returned above)
            for k, word in enumerate(nodes[1:], 1):
                if word.type in ("string", "raw_string") and k > program and re.search(r"\s", values[k]):
                    self._nested(script, tokens[k], depth)

    def _git_clone(self, script, tokens, values: Sequence[str], program: int) -> None:
        """`git clone -b v0.5.15 https://github.com/sgl-project/sglang.git`: the branch is the pin."""
        if not any(re.search(r"sgl-project/sglang(\.git)?/?$", v) for v in values[program:]):
            return
        self.cloned = True
        for k in range(program + 1, len(values)):
            if values[k] in ("-b", "--branch") and k + 1 < len(values):
                self._word(script, tokens[k + 1], GITREF, values[k + 1], 0, "git clone -b")
            elif values[k].startswith("--branch="):
                self._word(script, tokens[k], GITREF, values[k][9:], 9, "git clone --branch")

    def _script(self, values: Sequence[str], program: int, at: int) -> None:
        """`./serve.sh --x`, `bash scripts/start.sh`: a script of the repository this file runs."""
        path = values[program]
        if path in ("source", ".") and program + 1 < len(values):
            # `source ./.env`, `. deploy/prod.env`: the variables the launch reads come from there
            sourced = values[program + 1]
            if ENV_PATH.fullmatch(sourced) and ".." not in sourced.split("/"):
                self.refs.append(Ref(SCRIPT, sourced, None, at, "env"))
                return
            path = sourced
        if os.path.basename(path) in SHELLS and program + 1 < len(values):
            path = values[program + 1]
        if SCRIPT_PATH.fullmatch(path) and ".." not in path.split("/"):
            self.refs.append(Ref(SCRIPT, path, None, at, ""))

    def _nested(self, script, token, depth: int) -> None:
        from sglaunch.migrate import shell as sh

        if not (PIP_HINT.search(token.value) or any(r in token.value for r in self.repositories)):
            return
        container = sh.ShellContainer(script.text, [token], script.mapper)
        mapper, positions = sh.word_mapper(container, 0)
        if mapper is None:
            return
        self.shell(token.value, mapper, depth + 1)

    def _heredoc(self, script, node, depth: int) -> None:
        from sglaunch.migrate import shell as sh

        body = next((c for c in node.children if c.type == "heredoc_body"), None)
        start = next((c for c in node.children if c.type == "heredoc_start"), None)
        parent = node.parent
        if body is None or start is None or parent is None:
            return
        text = script.src(body)
        if not (PIP_HINT.search(text) or any(r in text for r in self.repositories)):
            return
        command = next((c for c in parent.children if c.type == "command"), None)
        words = [] if command is None else [script._token(w).value for w in sh._command_words(command)]
        program = os.path.basename(words[0]) if words else ""
        target = next((script._token(c.named_children[-1]).value for c in parent.children
                       if c.type == "file_redirect" and c.named_children), "")
        if program in ("tee",) and len(words) > 1:
            target = words[-1]
        if not (program in SHELLS or (program in ("cat", "tee") and (target.endswith(sh.SCRIPT_SUFFIXES)
                                                                     or sh._shebang(text)))):
            return
        begin = script.pos(body.start_byte)
        quoted = any(q in script.src(start) for q in ("'", '"', "\\"))
        outer = script.mapper
        forbidden = "" if quoted else "$`\\"

        def mapper(edit: TextEdit) -> TextEdit | None:
            if any(ch in edit.text for ch in forbidden):
                return None
            return outer(TextEdit(edit.start + begin, edit.end + begin, edit.text))

        self.shell(text, mapper, depth + 1)

    # -- Dockerfile --------------------------------------------------------------

    def dockerfile(self, text: str, _fmt: str) -> None:
        from sglaunch.migrate import dockerfile as df

        try:
            instructions = df._attach_heredocs(text, df._instructions(text))
        except df.DockerfileError:
            return  # the launch reader reports it
        for instruction in instructions:
            keyword, body, masked = instruction.keyword, instruction.body, instruction.masked
            if keyword == "FROM":
                for match in re.finditer(r"\S+", masked):
                    if match.group(0).startswith("--"):
                        continue
                    if self.is_image(match.group(0)):
                        self.add(IMAGE, match.group(0), _offset(body + match.start()), body + match.start(), "FROM")
                    break
            elif keyword in ("ARG", "ENV"):
                for match in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)=([\"']?)([^\s\"']+)\2", masked):
                    at = body + match.start(3)
                    if self.is_image(match.group(3)):
                        self.add(IMAGE, match.group(3), _offset(at), at, f"{keyword} {match.group(1)}")
                    elif "$" not in match.group(3):
                        self.variables.setdefault(match.group(1), []).append(
                            Ref("variable", match.group(3), _offset(at), at, f"{keyword} {match.group(1)}"))
            elif keyword == "RUN":
                self._run(text, instruction)
            elif keyword in ("CMD", "ENTRYPOINT"):
                items = instruction.exec_items(text)
                words = items if items is not None else masked.split()
                if words:
                    self._script(words, 0, body)
            elif keyword in ("COPY", "ADD"):
                option = re.match(r"(?:--\S+\s+)*?--from=(\S+)", masked)
                if option and self.is_image(option.group(1)):
                    self.add(IMAGE, option.group(1), _offset(body + option.start(1)), body + option.start(1),
                             f"{keyword} --from")
            if keyword in ("RUN", "COPY"):
                self._docker_heredocs(text, instruction)

    def _run(self, text: str, instruction) -> None:
        from sglaunch.migrate import dockerfile as df

        items = instruction.exec_items(text)
        if items is not None:
            spans = [(m.start() + instruction.body, m.end() + instruction.body)
                     for m in df.JSON_STRING.finditer(instruction.masked)]
            if len(spans) != len(items):
                return
            script = next((k + 2 for k in range(len(items) - 2) if os.path.basename(items[k]) in SHELLS
                           and SHELL_C.fullmatch(items[k + 1])), None)
            if script is not None:
                start, end = spans[script]
                positions = align(text[start:end], start, items[script])
                if positions is not None:
                    self.shell(items[script], scalar_mapper(positions, end, '"\\\n'), 1)
                return
            first = pip_arguments(items, 0)
            for k in requirement_words(items, first) if first is not None else ():
                start, end = spans[k]
                plain = text[start + 1:end - 1] == items[k]
                self.add(REQUIREMENT, items[k], _offset(start + 1, '"\\\n') if plain else None, start + 1,
                         "RUN " + " ".join(items[:first]))
            return
        skip = 0
        while True:
            option = df.RUN_OPTION.match(instruction.masked, skip)
            if option is None:
                break
            skip = option.end()
        body = instruction.masked[skip:]
        if body.lstrip().startswith("<<"):
            return
        self.shell(body, _offset(instruction.body + skip, ""), 0, "")

    def _docker_heredocs(self, text: str, instruction) -> None:
        from sglaunch.migrate import dockerfile as df
        from sglaunch.migrate import shell as sh

        for doc in instruction.heredocs:
            body = text[doc.start:doc.end]
            head = df.HEREDOC.sub(" ", instruction.masked).strip()
            words = df.RUN_OPTION.sub("", head + " ").split() if instruction.keyword == "RUN" else head.split()
            if instruction.keyword == "RUN":
                program = os.path.basename(words[0]) if words else ""
                script = not words or program in SHELLS or words[:1] == ["set"]
            else:
                script = bool(words) and (words[-1].endswith(sh.SCRIPT_SUFFIXES) or sh._shebang(body))
            if script:
                self.shell(body, _offset(doc.start, "" if doc.quoted else "$`\\"), 1)

    # -- YAML --------------------------------------------------------------------

    def yaml(self, text: str, fmt: str) -> None:
        from sglaunch.migrate import yamlfmt

        if fmt == "helm" and len(yamlfmt.helm_variants(text)) > 1:  # `{{ define }}` blocks, one by one
            for variant in yamlfmt.helm_variants(text):
                self.yaml(variant, "helm-part")
            return
        source = yamlfmt.mask_helm(text) if fmt in ("helm", "helm-part") else yamlfmt.mask_actions(text) \
            if fmt == "workflow" else text
        try:
            roots = yamlfmt.compose(source)
        except (yamlfmt.YamlError, RecursionError):
            return  # the launch reader reports it
        seen: set[int] = set()
        for root in roots:
            self._yaml_node(source, root, seen)
        if fmt == "compose" and "${" in text:
            # compose interpolates `${X}` from the .env file of the project folder: read it too
            self.refs.append(Ref(SCRIPT, ".env", None, 0, "env"))

    def _yaml_node(self, text: str, root, seen: set[int]) -> None:
        from sglaunch.migrate import yamlfmt as yf

        stack = [root]
        while stack:  # every node once: aliases share nodes, and may refer to themselves
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if yf.is_map(node):
                stack.extend(v for _, v in reversed(node.value))
            elif yf.is_seq(node):
                stack.extend(reversed(node.value))
            if yf.is_map(node):
                self._yaml_mapping(text, node, seen)
            elif yf.is_seq(node):
                values = [str(i.value) if yf.is_scalar(i) else "" for i in node.value]
                first = pip_arguments(values, 0) if values and all(yf.is_scalar(i) for i in node.value) else None
                for k in requirement_words(values, first) if first is not None else ():
                    item = node.value[k]
                    self.add(REQUIREMENT, values[k], yf._mapper_for(text, item), item.start_mark.index,
                             " ".join(values[:first]))
            elif yf.is_scalar(node) and node.tag == yf.STR_TAG:
                self._yaml_scalar(text, node)

    def _yaml_mapping(self, text: str, node, seen: set[int]) -> None:
        from sglaunch.migrate import yamlfmt as yf

        pairs = {str(k.value): v for k, v in node.value if yf.is_scalar(k)}
        repository, tag = pairs.get("repository"), pairs.get("tag")
        if repository is None and "newTag" in pairs and "name" in pairs:
            # kustomization `images: [{name: lmsysorg/sglang, newName: ..., newTag: v0.5.15}]`
            new_name = pairs.get("newName")
            repository, tag = (new_name if new_name is not None else pairs["name"]), pairs["newTag"]
            seen.add(id(pairs["name"]))
        if repository is not None:
            seen.add(id(repository))  # Helm `repository:` is read with its `tag:` (or not at all)
        if repository is not None and tag is not None and yf.is_scalar(repository) and yf.is_scalar(tag):
            repo = parse_image(str(repository.value), self.repositories)
            if repo is not None and repo["tag"] is None and repo["digest"] is None:
                self.add(TAG, str(tag.value), yf._mapper_for(text, tag), tag.start_mark.index,
                         "repository + tag", repository=repo["repo"])
        pip = pairs.get("pip")
        if pip is not None and yf.is_seq(pip):  # conda environment.yml: `- pip: [sglang==0.5.15]`
            for item in pip.value:
                if yf.is_scalar(item) and not str(item.value).startswith("-"):
                    self.add(REQUIREMENT, str(item.value), yf._mapper_for(text, item), item.start_mark.index,
                             "conda pip list")

    def _yaml_scalar(self, text: str, node) -> None:
        from sglaunch.migrate import yamlfmt as yf

        value = str(node.value)
        skip = _image_prefix(value)
        if self.is_image(value[skip:]):
            self.add(IMAGE, value[skip:], _shift(yf._mapper_for(text, node), skip), node.start_mark.index, "image")
            return
        if (" " in value or "\n" in value) and (PIP_HINT.search(value) or any(r in value for r in self.repositories)
                                                 or RUNS_SCRIPT.search(value)):
            mapper = yf._mapper_for(text, node)
            if mapper is not None:
                self.shell(value, mapper, 1)

    # -- Python ------------------------------------------------------------------

    def python(self, text: str, _fmt: str) -> None:
        """String literals that are images (`Image.from_registry("lmsysorg/sglang:v0.5.15")`),
        requirements given to a `pip_install(...)`-like call, `["pip", "install", ...]` lists and
        shell strings given to a runner (`subprocess.run("pip install ...", shell=True)`)."""
        import ast

        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            return  # the launch reader reports it
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in parts:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and self.is_image(node.value):
                self._py_string(text, starts, node, IMAGE, "a Python string")
            elif isinstance(node, ast.JoinedStr):
                joined = "".join(v.value if isinstance(v, ast.Constant) else "${_}" for v in node.values)
                if self.is_image(joined):
                    self.add(IMAGE, joined, None, _py_offset(text, starts, node), "a Python f-string")
                    self.refs[-1].shown = ast.get_source_segment(text, node) or joined
            elif isinstance(node, ast.Call):
                self._py_call(text, starts, node)

    def _py_call(self, text: str, starts: list[int], node) -> None:
        import ast

        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        strings = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if name in PY_INSTALLS:
            for arg in strings:
                self._py_string(text, starts, arg, REQUIREMENT, f"{name}(...)")
        if name == "setup":  # setup.py: install_requires=[...], extras_require={"x": [...]}
            for keyword in node.keywords:
                lists = [keyword.value] if keyword.arg == "install_requires" else \
                    list(keyword.value.values) if keyword.arg == "extras_require" and isinstance(keyword.value, ast.Dict) \
                    else []
                for listed in lists:
                    for item in getattr(listed, "elts", []):
                        if isinstance(item, ast.Constant) and isinstance(item.value, str):
                            self._py_string(text, starts, item, REQUIREMENT, f"setup.py {keyword.arg}")
        if name in PY_RUNNERS:
            for arg in strings:
                if PIP_HINT.search(arg.value) or any(r in arg.value for r in self.repositories):
                    mapper = self._py_mapper(text, starts, arg)
                    if mapper is not None:
                        self.shell(arg.value, mapper, 1)
        for arg in node.args:
            if not isinstance(arg, (ast.List, ast.Tuple)) or not arg.elts:
                continue
            plain = [isinstance(e, ast.Constant) and isinstance(e.value, str) for e in arg.elts]
            # `[sys.executable, "-m", "pip", "install", ...]`: a computed program is a Python
            values = [e.value if ok else ("python" if k == 0 else "${_}") for k, (e, ok) in enumerate(zip(arg.elts, plain))]
            first = pip_arguments(values, 0)
            for k in requirement_words(values, first) if first is not None else ():
                if plain[k]:
                    self._py_string(text, starts, arg.elts[k], REQUIREMENT, " ".join(values[:first]))

    def _py_string(self, text: str, starts: list[int], node, kind: str, where: str) -> None:
        self.add(kind, node.value, self._py_mapper(text, starts, node), _py_offset(text, starts, node), where)

    @staticmethod
    def _py_mapper(text: str, starts: list[int], node) -> Mapper | None:
        """Edits of a plain one-line string literal (`"..."`, `'...'`, no escapes) move into the file."""
        start = _py_offset(text, starts, node)
        quote = text[start:start + 1]
        if quote not in ("'", '"') or text[start + 1:start + 1 + len(node.value) + 1] != node.value + quote:
            return None
        return _offset(start + 1, "\n\\'\"")

    # -- line formats ------------------------------------------------------------

    def lines(self, text: str, _fmt: str) -> None:
        names = "|".join(re.escape(r) for r in self.repositories)
        pattern = re.compile(r"(?<![\w./-])(?:[\w.-]+(?::\d+)?/)*(?:" + names +
                             r")(?::[\w.${}-]+)?(?:@[A-Za-z0-9]+:[0-9a-fA-F]+)?(?![\w/-])")
        offset = 0
        for line in text.split("\n"):
            if not line.lstrip().startswith(("#", ";")):
                for match in pattern.finditer(line):
                    self.add(IMAGE, match.group(0), _offset(offset + match.start()), offset + match.start(), "value")
            offset += len(line) + 1

    def makefile(self, text: str, fmt: str) -> None:
        self.lines("\n".join("" if line.startswith("\t") else line for line in text.split("\n")), fmt)
        offset = 0
        for line in text.split("\n"):
            if line.startswith("\t"):
                lead = len(line) - len(line.lstrip("\t@-+ "))
                recipe = line[lead:]
                if PIP_HINT.search(recipe) or any(r in recipe for r in self.repositories):
                    self.shell(recipe, _offset(offset + lead, "$"), 1)
            offset += len(line) + 1


PY_INSTALLS = frozenset({"pip_install", "uv_pip_install", "install", "pip_install_private_repos"})
PY_RUNNERS = frozenset({"run", "call", "check_call", "check_output", "Popen", "system", "run_commands", "getoutput"})


def _py_offset(text: str, starts: list[int], node) -> int:
    """Character offset of an ast node (its col_offset counts UTF-8 bytes)."""
    line = node.lineno - 1
    begin = starts[line] if line < len(starts) else len(text)
    row = text[begin:].split("\n", 1)[0]
    return begin + len(row.encode("utf-8", "surrogateescape")[:node.col_offset].decode("utf-8", "ignore"))


def _program(values: Sequence[str]) -> int | None:
    """Index of the program after runners (`sudo -E`, `env X=1`, `time`)."""
    k = 0
    while k < len(values):
        base = os.path.basename(values[k])
        if base in RUNNERS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", values[k]) or \
                (k > 0 and values[k].startswith("-") and os.path.basename(values[k - 1]) in ("sudo", "env")):
            k += 1
            continue
        return k
    return None


def pip_arguments(values: Sequence[str], program: int) -> int | None:
    """Index of the first argument after `pip install` / `python -m pip install` / `uv pip
    install` / `uv add` when `values[program]` starts one; else None."""
    if program >= len(values):
        return None
    head = values[program]
    base = os.path.basename(head)
    k = program + 1
    if PIP_PROGRAM.fullmatch(base) or re.fullmatch(r"\$\{?[A-Za-z_]*PIP[A-Za-z0-9_]*\}?", head, re.I):
        pass
    elif base.startswith(("python", "pypy")) or re.fullmatch(r"\$\{?[A-Za-z_]*PY[A-Za-z0-9_]*\}?", head, re.I):
        while k < len(values) and values[k].startswith("-") and values[k] != "-m":
            k += 1
        if values[k:k + 2] != ["-m", "pip"]:
            return None
        k += 2
    elif base == "uv":
        while k < len(values) and values[k].startswith("-"):
            k += 1
        if values[k:k + 1] == ["add"]:
            return k + 1
        if values[k:k + 1] != ["pip"]:
            return None
        k += 1
    else:
        return None
    while k < len(values) and values[k].startswith("-"):
        k += 1
    return k + 1 if values[k:k + 1] == ["install"] else None


RUN_WITH_OPTIONS = ("--with", "--from", "--with-editable", "--spec")


def run_with_requirements(values: Sequence[str], program: int) -> list[tuple[int, int]]:
    """(word index, characters to skip) of the requirements a runner installs for the command it
    runs: `uv run --with X`, `uv tool run --from X`, `uvx --from X --with Y`, `pipx run --spec X`
    (`--with=X` too). A comma list (`--with a,b`) is one word per requirement to uv: its words
    are skipped, not guessed."""
    if program >= len(values):
        return []
    base = os.path.basename(values[program])
    k = program + 1
    if base == "uv":
        while k < len(values) and values[k].startswith("-"):
            k += 1
        if values[k:k + 1] == ["run"]:
            k += 1
        elif values[k:k + 2] == ["tool", "run"]:
            k += 2
        else:
            return []
    elif base in ("uvx", "pipx"):
        if base == "pipx":
            if values[k:k + 1] != ["run"]:
                return []
            k += 1
    else:
        return []
    found = []
    while k < len(values) and values[k].startswith("-"):
        option, eq, _ = values[k].partition("=")
        if option in RUN_WITH_OPTIONS and option != "--with-editable":
            if eq:
                found.append((k, len(option) + 1))
            elif k + 1 < len(values):
                found.append((k + 1, 0))
                k += 1
        elif not eq and values[k] in VALUE_OPTIONS | {"--with-requirements", "--python", "-p", "--env-file"}:
            k += 1
        k += 1
    return [(i, skip) for i, skip in found if "," not in values[i][skip:]]


def requirement_words(values: Sequence[str], first: int) -> list[int]:
    """Indexes of the words after `install` that are requirements (options and their values skipped)."""
    found = []
    k = first
    while k < len(values):
        value = values[k]
        if value in VALUE_OPTIONS:
            k += 2
            continue
        if value.startswith("-") or value in ("&&", "||", ";", "|"):
            k += 1
            continue
        found.append(k)
        k += 1
    return found


def index_options(values: Sequence[str], first: int) -> list[tuple[int, str, str]]:
    """(word index, option, URL) of the wheel indexes of a pip line that name a CUDA build."""
    found = []
    for k in range(first, len(values)):
        option, eq, url = values[k].partition("=")
        if eq and option in INDEX_OPTIONS:
            found.append((k, option, url))
        elif values[k] in INDEX_OPTIONS and k + 1 < len(values):
            found.append((k + 1, values[k], values[k + 1]))
    return [(k, option, url) for k, option, url in found if CUDA_INDEX.search(url)]


def _cuda_package(value: str) -> bool:
    from sglaunch.migrate.rules import canonical_name

    name = requirement_name(value)
    return name is not None and canonical_name(name) in CUDA_PACKAGES


def _image_prefix(value: str) -> int:
    """Length of an option or scheme in front of an image (`--container-image=`, `docker://`)."""
    match = re.match(r"(--?[A-Za-z][A-Za-z0-9-]*=|[A-Za-z0-9_.-]+=)?(docker://|docker:)?", value)
    return match.end() if match else 0


def _dependency_arrays(doc):
    """(where, array) for every dependency array of a pyproject.toml."""
    project = doc.get("project", {}) if hasattr(doc, "get") else {}
    out = []
    if isinstance(project.get("dependencies"), list):
        out.append(("pyproject [project] dependencies", project["dependencies"]))
    for name, array in (project.get("optional-dependencies") or {}).items():
        if isinstance(array, list):
            out.append((f"pyproject optional-dependencies.{name}", array))
    for name, array in (doc.get("dependency-groups") or {}).items():
        if isinstance(array, list):
            out.append((f"pyproject dependency-groups.{name}", array))
    build = doc.get("build-system") or {}
    if isinstance(build.get("requires"), list):
        out.append(("pyproject build-system.requires", build["requires"]))
    tool = doc.get("tool") or {}
    uv = tool.get("uv") or {}
    for key in ("constraint-dependencies", "override-dependencies", "dev-dependencies", "build-constraint-dependencies"):
        if isinstance(uv.get(key), list):
            out.append((f"pyproject tool.uv.{key}", uv[key]))
    for name, array in ((tool.get("pdm") or {}).get("dev-dependencies") or {}).items():
        if isinstance(array, list):
            out.append((f"pyproject tool.pdm.dev-dependencies.{name}", array))
    for env, table in ((tool.get("hatch") or {}).get("envs") or {}).items():
        for key in ("dependencies", "extra-dependencies"):
            if isinstance(table, dict) and isinstance(table.get(key), list):
                out.append((f"pyproject tool.hatch.envs.{env}.{key}", table[key]))
    return out


def _poetry_tables(doc):
    """(where, table) of Poetry's dependency tables."""
    poetry = ((doc.get("tool") or {}).get("poetry") or {}) if hasattr(doc, "get") else {}
    out = []
    for key in ("dependencies", "dev-dependencies"):
        if hasattr(poetry.get(key), "keys"):
            out.append((f"pyproject tool.poetry.{key}", poetry[key]))
    for group, table in (poetry.get("group") or {}).items():
        deps = table.get("dependencies") if hasattr(table, "get") else None
        if hasattr(deps, "keys"):
            out.append((f"pyproject tool.poetry.group.{group}.dependencies", deps))
    return out


MARK = "\ue001"


def _toml_span(doc, text: str, array, index, any_item: bool = False) -> tuple[int, int] | None:
    """Span of the string at `array[index]` (an array or a table) in `text`: swapped for a
    marker string of the same kind, the document's text differs from `text` exactly there."""
    import tomlkit
    from tomlkit.items import StringType

    item = array[index]
    kind = getattr(item, "type", None)
    if kind not in (StringType.SLB, StringType.SLL) and not any_item:
        return None
    array[index] = tomlkit.string(MARK, literal=kind is StringType.SLL)
    try:
        changed = tomlkit.dumps(doc)
    finally:
        array[index] = item
    start = 0
    limit = min(len(text), len(changed))
    while start < limit and text[start] == changed[start]:
        start += 1
    tail = 0
    while tail < limit - start and text[len(text) - 1 - tail] == changed[len(changed) - 1 - tail]:
        tail += 1
    if changed[start:len(changed) - tail] != MARK and not (any_item and MARK in changed[start:len(changed) - tail]):
        return None
    return start, len(text) - tail
