"""Find SGLang launch commands in shell scripts with tree-sitter-bash.

Public entry point: `extract_launch_commands(text) -> list[LaunchCommand]`. The migrate
engine uses `parse_script(text)`, which also returns editable `Site`s: every argument
keeps its character span, so a rewrite touches exactly the bytes of that argument.

Recognised: `python[3] [-u ...] -m sglang.launch_server`, `sglang serve`, behind env
prefixes (`X=1 cmd`), `env X=1`, wrappers (`nohup`, `exec`, `srun`, `numactl`, `torchrun`,
`docker run ... IMAGE cmd`, ...), backslash continuations, quoting, `--flag=value`,
bash arrays expanded as `"${args[@]}"` and `"$@"` passthrough. Heredoc bodies, comments,
strings given to `echo` and unrelated commands are never launch commands.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from sglaunch.migrate.tokens import Site, TextEdit, TokenRef, shell_quote

LAUNCH_MODULE = "sglang.launch_server"
# The router's launcher starts SGLang servers: it takes every server flag (and its own `--router-*`).
ROUTER_MODULE = "sglang_router.launch_server"
# Tools that build ServerArgs from their command line (an engine in-process) next to flags of their own
ORIGIN: list[str] = []  # the path of the file being read (engine.read_sites), for `source FILE`
SERVER_ARGS_TOOLS = ("sglang.bench_one_batch", "sglang.bench_offline_throughput", "sglang.compile_deep_gemm")
LAUNCH_MODULES = (LAUNCH_MODULE, ROUTER_MODULE) + SERVER_ARGS_TOOLS

# Programs that run the command given after their own options. Anything else in front of a
# launcher (echo, printf, grep, ...) means the launcher text is just data.
WRAPPERS = frozenset({
    "env", "nohup", "exec", "time", "command", "builtin", "sudo", "srun", "salloc", "sbatch",
    "numactl", "taskset", "torchrun", "docker", "podman", "nvidia-docker", "singularity",
    "apptainer", "enroot", "timeout", "stdbuf", "nice", "ionice", "chrt", "uv", "conda",
    "mamba", "micromamba", "pixi", "poetry", "pipenv", "mpirun", "mpiexec", "ray", "setsid",
    "unbuffer", "catchsegv", "flock", "xargs", "watch", "rocprof", "nsys", "ncu", "perf",
    "py-spy", "cset", "pdm", "hatch", "rye",
})
DOCKER = frozenset({"docker", "podman", "nvidia-docker"})
ARG_NODES = frozenset({
    "word", "string", "raw_string", "number", "concatenation", "simple_expansion", "expansion",
    "command_substitution", "ansi_c_string", "arithmetic_expansion", "translated_string",
    "process_substitution", "brace_expression",
})
DYNAMIC_NODES = frozenset({
    "simple_expansion", "expansion", "command_substitution", "arithmetic_expansion",
    "process_substitution",
})
PASSTHROUGH = re.compile(r'^"?\$(\{)?[@*](?(1)\})"?$')
VAR_USE = re.compile(r'^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$')
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})
LAUNCHER_NAME = re.compile(r"(?i)(sglang|launch|serve|server)")  # ./launch_server.sh, start_sglang
DATA_PROGRAMS = frozenset({
    "pkill", "pgrep", "killall",  # a process pattern, not a command to run
    "echo", "printf", "logger", "cat", "grep", "egrep", "fgrep", "rg", "sed", "awk", "gawk", "tee", "jq",
    "yq", "git", "notify-send", "wall", "curl", "wget", "read", ":", "true", "false", "test", "[", "[[",
    "print", "die", "fail", "log", "info", "warn", "error", "debug", "note", "say", "msg", "usage",
    "local", "declare", "typeset", "readonly", "export", "mail", "sendmail", "slack", "gh", "glab",
})
REMOTE = frozenset({"ssh", "kubectl", "oc", "pdsh", "clush"})  # run the command elsewhere: no exports
SCRIPT_SUFFIXES = (".sh", ".bash", ".zsh", ".ksh", ".slurm", ".sbatch")
ARRAY_USE = re.compile(r'^"?\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}"?$')
DOUBLE_QUOTE_ESCAPES = re.compile(r'\\([\\"$`])|\\\n')


@dataclass(frozen=True)
class LaunchCommand:
    """One SGLang launch command in a shell script (arguments shell-unquoted)."""

    args: tuple[str, ...]  # SGLang arguments after the launcher
    dynamic: tuple[bool, ...]  # per arg: contains unexpanded shell syntax ($TP, $(...))
    line: int  # 1-based line where the command starts
    env: dict[str, str] = field(hash=False)  # exports before it, X=1 prefixes, docker -e
    passthrough: bool  # "$@" / "$*" forwards unknown arguments
    launcher: str  # "python -m sglang.launch_server", "sglang serve", ...
    end_line: int = 0
    arg_lines: tuple[int, ...] = ()  # per arg: its 1-based line (array elements: the array's line)
    env_dynamic: frozenset[str] = frozenset()  # env names whose value is unexpanded shell syntax
    in_docker: bool = False  # runs inside `docker run`; host exports do not reach it


@dataclass(frozen=True)
class ParsedScript:
    commands: tuple[LaunchCommand, ...]
    sites: tuple[Site, ...]
    error_lines: tuple[int, ...]  # lines tree-sitter could not parse (commands there are skipped)
    # (line, source text, why): places that may hold launch flags the reader could not follow
    # (an unparseable region, an argument variable it cannot resolve, a heredoc or shell string
    # it cannot read); the engine reports those that mention a launcher or a rule's flag.
    suspects: tuple[tuple[int, str, str], ...] = ()


def extract_launch_commands(text: str) -> list[LaunchCommand]:
    """Every SGLang launch command in a shell script, in document order."""
    return list(parse_script(text).commands)


def parse_script(text: str, mapper: "Mapper | None" = None, fmt: str = "shell",
                 state: "_State | None" = None) -> ParsedScript:
    """Launch commands plus editable sites. `mapper` moves edits from script offsets into an
    enclosing file (a shell script embedded in YAML or a Dockerfile). `state`: variables known
    before the script starts (a Makefile's variables)."""
    return _Script(text, mapper or _identity, fmt, state=state).parse()


Mapper = Callable[[TextEdit], "TextEdit | None"]


def _identity(edit: TextEdit) -> TextEdit | None:
    return edit


@functools.lru_cache(maxsize=1)
def _parser():
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class ShellToken:
    value: str  # shell-unquoted text; unexpanded parts kept as written
    dynamic: bool
    start: int  # character offsets of the token's source text
    end: int
    line: int


def node_value(node, src: str) -> tuple[str, bool]:
    """Unquote one argument node; expansions stay as written and mark the value dynamic."""
    kind = node.type
    text = src
    if kind == "raw_string":
        return text[1:-1], False
    if kind == "string" or kind == "translated_string":
        inner = text[1:-1] if kind == "string" else text[2:-1]
        dynamic = any(_has_dynamic(child) for child in node.children)
        return DOUBLE_QUOTE_ESCAPES.sub(lambda m: m.group(1) or "", inner), dynamic
    if kind == "ansi_c_string":
        return _ansi_c(text[2:-1]), False
    if kind in DYNAMIC_NODES:
        return text, True
    if kind == "concatenation":
        return "", True  # filled in by the caller from the children's own sources
    return re.sub(r"\\(.)", r"\1", text.replace("\\\n", "")), False


def _has_dynamic(node) -> bool:
    return node.type in DYNAMIC_NODES or any(_has_dynamic(c) for c in node.children)


def _ansi_c(body: str) -> str:
    try:
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return body


# --------------------------------------------------------------------------- container


class ShellContainer:
    """Tokens on one shell command line or in one bash array assignment."""

    def __init__(self, text: str, tokens: Sequence[ShellToken], mapper: Mapper):
        self.text = text
        self.tokens = tuple(tokens)
        self.mapper = mapper

    def _src(self, i: int) -> str:
        token = self.tokens[i]
        return self.text[token.start:token.end]

    def _map(self, edits: list[TextEdit]) -> list[TextEdit] | None:
        mapped = [self.mapper(e) for e in edits]
        return None if any(m is None for m in mapped) else mapped  # type: ignore[return-value]

    def rename_prefix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        token, src = self.tokens[i], self._src(i)
        for skip in (0, 1):
            if skip and src[:1] not in ("'", '"'):
                break
            if src[skip:].startswith(old):
                start = token.start + skip
                return self._map([TextEdit(start, start + len(old), new)])
        return None

    def replace_suffix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        token, src = self.tokens[i], self._src(i)
        closing = src[-1:] if src[-1:] in ("'", '"') and len(src) > 1 else ""
        body_end = len(src) - len(closing)
        if src[:body_end].endswith(old) and _safe_inside(new, closing):
            end = token.start + body_end
            return self._map([TextEdit(end - len(old), end, new)])
        if token.dynamic:
            return None
        prefix = token.value[: len(token.value) - len(old)]
        return self.replace(i, i + 1, [prefix + new])

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        first, last = self.tokens[i], self.tokens[j - 1]
        if not new_tokens:
            start, end = _deletion_span(self.text, first.start, last.end)
            return self._map([TextEdit(start, end, "")])
        if j - i == 1 and len(new_tokens) == 1:
            text = _quote_like(self._src(i), new_tokens[0])
        else:
            text = " ".join(shell_quote(t) for t in new_tokens)
        return self._map([TextEdit(first.start, last.end, text)])


def _safe_inside(value: str, quote: str) -> bool:
    if quote == "'":
        return "'" not in value
    if quote == '"':
        return not re.search(r'[\\"$`]', value)
    return bool(re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]*", value))


def _quote_like(original: str, value: str) -> str:
    """Write `value` with the quoting style of the token it replaces."""
    if original[:1] == '"' and _safe_inside(value, '"'):
        return f'"{value}"'
    if original[:1] == "'" and _safe_inside(value, "'"):
        return f"'{value}'"
    return shell_quote(value)


def _skip_blanks(text: str, pos: int, step: int) -> int:
    """Move over spaces, tabs and backslash-newline continuations in direction `step`."""
    while True:
        if step > 0:
            if text[pos:pos + 1] in (" ", "\t"):
                pos += 1
            elif text[pos:pos + 2] == "\\\n":
                pos += 2
            else:
                return pos
        else:
            if pos > 0 and text[pos - 1] in (" ", "\t"):
                pos -= 1
            elif pos > 1 and text[pos - 2:pos] == "\\\n":
                pos -= 2
            else:
                return pos


def _deletion_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Span to delete for tokens start..end, taking the whitespace and continuations with them."""
    after = _skip_blanks(text, end, +1)
    if after < len(text) and text[after] not in "\n;&|)#":
        return start, after  # another token follows on this logical line
    line_start = text.rfind("\n", 0, start) + 1
    alone = not text[line_start:start].strip(" \t") and (after >= len(text) or text[after] == "\n")
    continued = line_start >= 2 and text[line_start - 2] == "\\"
    if alone and not continued:
        return line_start, min(after + 1, len(text))
    return _skip_blanks(text, start, -1), end


# --------------------------------------------------------------------------- script walk


@dataclass
class _Array:
    tokens: list[tuple[ShellContainer, int]]
    used: bool = False
    passthrough: bool = False  # `set -- --x "$@"`: the script's own arguments follow


@dataclass
class _WordVar:
    """A plain variable whose value is a list of words (`ARGS="--tp 8 --x"`), expanded
    unquoted as `$ARGS`: each word keeps its place inside the assignment."""

    tokens: list[tuple[ShellContainer, int]]
    source: str
    used: bool = False


@dataclass
class _State:
    exports: dict[str, str] = field(default_factory=dict)
    export_dynamic: set[str] = field(default_factory=set)
    shell_vars: dict[str, tuple[str, bool]] = field(default_factory=dict)
    arrays: dict[str, _Array] = field(default_factory=dict)
    words: dict[str, _WordVar] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)  # shell function -> launcher it passes "$@" to
    has_export: bool = False

    def copy(self, expanded: bool = False) -> "_State":
        """What a child shell sees: the exports (variables are not inherited unless exported).
        `expanded`: the child's text is expanded by this shell first (a double-quoted
        `bash -c "..."`, an unquoted heredoc), so this shell's variables apply too."""
        state = _State(exports=dict(self.exports), export_dynamic=set(self.export_dynamic))
        if expanded:
            state.shell_vars = dict(self.shell_vars)
            state.words = dict(self.words)
            state.arrays = dict(self.arrays)
        return state


class _Script:
    def __init__(self, text: str, mapper: Mapper, fmt: str, line_at: Callable[[int], int] | None = None,
                 state: "_State | None" = None, depth: int = 0):
        self.text = text
        self.mapper = mapper
        self.fmt = fmt
        data = text.encode("utf-8", "surrogatepass")
        self.data = data
        self.ascii = len(data) == len(text)
        self.char_at: list[int] | None = None if self.ascii else _byte_to_char(text)
        self.line_at = line_at  # character offset -> line of the outermost script (nested scripts)
        self.initial = state
        self.depth = depth
        self.commands: list[LaunchCommand] = []
        self.sites: list[Site] = []
        self.errors: list[int] = []
        self.suspects: list[tuple[int, str, str]] = []
        self.shadowed: list[tuple[str, "_WordVar"]] = []  # word variables replaced before any use

    def pos(self, byte: int) -> int:
        return byte if self.char_at is None else self.char_at[byte]

    def src(self, node) -> str:
        return self.text[self.pos(node.start_byte):self.pos(node.end_byte)]

    def line(self, node) -> int:
        if self.line_at is not None:
            return self.line_at(self.pos(node.start_byte))
        return node.start_point[0] + 1

    def offset_line(self, offset: int) -> int:
        if self.line_at is not None:
            return self.line_at(offset)
        return self.text.count("\n", 0, offset) + 1

    def parse(self) -> ParsedScript:
        tree = _parser().parse(self.data)
        state = self.initial if self.initial is not None else _State()
        inherited = {id(v) for v in state.words.values()}
        for node, in_error in _walk(tree.root_node):
            if node.type == "ERROR" or node.is_missing:
                self.errors.append(self.line(node))
                if node.type == "ERROR":
                    self.suspects.append((self.line(node), self.src(node), "region"))
                continue
            if in_error:
                continue
            if node.type in ("declaration_command", "variable_assignment") and _is_statement(node):
                self._record_assignment(node, state)
            elif node.type == "unset_command":
                self._unset(node, state)
            elif node.type == "heredoc_redirect":
                self._heredoc(node, state)
            elif node.type == "herestring_redirect":
                self._herestring(node, state)
            elif node.type == "command":
                self._record_unset(node, state)
                self._record_source(node, state)
                self._record_set_positional(node, state)
                built = self._launch(node, state)
                if built is not None:
                    self.commands.append(built[0])
                    self.sites.append(built[1])
                    function = _enclosing_function(node)
                    if built[0].passthrough and function is not None:
                        state.functions[self.src(function)] = built[0].launcher
                else:
                    self._nested_strings(node, state)
        unused = list(state.words.items()) + [(n, v) for n, v in self.shadowed
                                            if all(v is not w for w in state.words.values())]
        unused = [(n, v) for n, v in unused if isinstance(v, _WordVar) or not v.used]
        for name, var in unused:
            if not var.used and var.tokens and id(var) not in inherited:
                first = var.tokens[0]
                source = var.source if isinstance(var, _WordVar) else " ".join(c.tokens[i].value for c, i in var.tokens)
                self.suspects.append((first[0].tokens[first[1]].line, source, "variable " + name))
        return ParsedScript(tuple(self.commands), tuple(self.sites), tuple(sorted(set(self.errors))),
                            tuple(self.suspects))

    # -- scripts inside this script -------------------------------------------------

    def _inner(self, text: str, offset_of: Callable[[int], int], mapper: Mapper, state: "_State") -> None:
        """Parse `text` (a heredoc body or a shell string of this script) as a script of its own:
        `offset_of` gives the offset in this script of each of its characters."""
        if self.depth >= 4:
            self.suspects.append((self.offset_line(offset_of(0)), text, "nested too deep"))
            return
        inner = _Script(text, mapper, self.fmt, line_at=lambda off: self.offset_line(offset_of(off)),
                        state=state, depth=self.depth + 1).parse()
        self.commands.extend(inner.commands)
        self.sites.extend(inner.sites)
        self.errors.extend(inner.error_lines)
        self.suspects.extend(inner.suspects)

    def _heredoc(self, node, state: "_State") -> None:
        """`bash <<EOF`, `ssh host <<EOF`, `cat > run.sh <<'EOF'`: a body that is a script is read
        as one (its edits stay inside the body); text printed or written elsewhere is data."""
        body = next((c for c in node.children if c.type == "heredoc_body"), None)
        start = next((c for c in node.children if c.type == "heredoc_start"), None)
        parent = node.parent
        if body is None or start is None or parent is None:
            return
        text = self.src(body)
        command = next((c for c in parent.children if c.type == "command"), None)
        words = [] if command is None else [self._token(w).value for w in _command_words(command)]
        if not _mentions(text):
            # `cat > config.yaml <<EOF` holding an SGLang --config mapping: its keys as flags
            as_flags = " ".join(f"--{m.group(1)} {m.group(2).strip()}" for m in
                                re.finditer(r"(?m)^\s*([a-z][a-z0-9_-]*):[ \t]*(.*)$", text))
            if as_flags and any(w.endswith((".yaml", ".yml")) for w in words + [self.src(c) for c in parent.children
                                                                              if c.type == "file_redirect"]):
                self.suspects.append((self.line(body), as_flags, "heredoc written to a config file"))
            return
        target = None
        for child in parent.children:
            if child.type == "file_redirect" and any(c.type in (">", ">>", ">|") for c in child.children):
                dest = child.child_by_field_name("destination") or (child.named_children[-1] if child.named_children else None)
                if dest is not None:
                    target = self._token(dest).value
        prog = os.path.basename(words[0]) if words else ""
        if prog == "tee" and len(words) > 1:
            target = next((w for w in words[1:] if not w.startswith("-")), target)
        piped = self._piped_into(parent, node)
        # `kubectl apply -f - <<EOF`: a manifest, not a script (`kubectl exec ... bash <<EOF` runs one)
        manifest = prog in ("kubectl", "oc") and not any(os.path.basename(w) in SHELLS for w in words)
        runs = prog in SHELLS or (prog in REMOTE and not manifest) or prog in ("read", "mapfile") or \
            (prog in WRAPPERS and any(os.path.basename(w) in SHELLS for w in words)) or \
            (piped is not None and (piped in SHELLS or piped == "ssh"))
        written_script = prog in ("cat", "tee") and target is not None and (
            target.endswith(SCRIPT_SUFFIXES) or _shebang(text))
        if not (runs or written_script):
            if target is not None and prog in ("cat", "tee"):
                self.suspects.append((self.line(body), text, f"heredoc written to {target}"))
            elif piped is not None or prog not in ("cat", "echo", "printf", ""):
                self.suspects.append((self.line(body), text, f"heredoc given to {piped or prog}"))
            return
        quoted = any(q in self.src(start) for q in ("'", '"', "\\"))
        begin = self.pos(body.start_byte)
        forbidden = "" if quoted else "$`\\"
        outer = self.mapper

        def mapper(edit: TextEdit) -> TextEdit | None:
            if any(ch in edit.text for ch in forbidden):
                return None
            return outer(TextEdit(edit.start + begin, edit.end + begin, edit.text))

        inherit = prog in SHELLS or (prog in WRAPPERS and prog not in DOCKER)
        inner_state = state.copy(expanded=not quoted) if inherit else \
            (state.copy(expanded=True) if not quoted else _State())
        if not inherit:
            inner_state.exports, inner_state.export_dynamic = {}, set()
        self._inner(text, lambda off: begin + off, mapper, inner_state)

    def _aliases(self, words, state: "_State") -> None:
        """`alias serve='python -m sglang.launch_server ...'`: the value is a command."""
        for word in words[1:]:
            token = self._token(word)
            name, eq, value = token.value.partition("=")
            if not eq or not _mentions(value):
                continue
            container = ShellContainer(self.text, [token], self.mapper)
            mapper, positions = word_mapper(container, 0)
            if positions is None:
                self.suspects.append((token.line, token.value, "shell string"))
                continue
            skip = len(name) + 1

            def inner_mapper(edit: TextEdit, skip=skip, mapper=mapper) -> TextEdit | None:
                return mapper(TextEdit(edit.start + skip, edit.end + skip, edit.text))

            self._inner(value, lambda off, at=positions, skip=skip, end=token.end:
                        at[off + skip] if off + skip < len(at) else end, inner_mapper, state.copy())

    def _piped_into(self, statement, redirect) -> str | None:
        """The program a heredoc's command pipes into (`cat <<EOF | bash`), if any."""
        inner = next((c for c in redirect.children if c.type == "pipeline"), None)
        pipeline = inner if inner is not None else statement.parent
        if pipeline is None or pipeline.type != "pipeline":
            return None
        after = inner is not None
        for child in pipeline.named_children:
            if child.id == statement.id:
                after = True
            elif after:
                command = child if child.type == "command" else next(
                    (c for c in child.named_children if c.type == "command"), None)
                words = _command_words(command) if command is not None else []
                if words:
                    values = [self._token(w).value for w in words]
                    k = 0
                    while k < len(values) - 1 and os.path.basename(values[k]) in WRAPPERS:
                        k += 1
                    return os.path.basename(values[k])
        return None

    def _nested_strings(self, node, state: "_State") -> None:
        """`bash -c "..."`, `srun ... bash -lc '...'`, `ssh host "..."`, `docker exec c sh -c "..."`,
        `tmux new -d "..."`: a quoted argument of a command runner that holds a launch is a script."""
        words = _command_words(node)
        if not words:
            return
        values = [self._token(w).value for w in words]
        prog = os.path.basename(values[0])
        if prog in DATA_PROGRAMS:
            if prog in ("echo", "printf") and _in_substitution(node) and _mentions(" ".join(values)):
                # `CMD=$(printf '%s ' python -m sglang.launch_server --x)`: a launch built as text
                self.suspects.append((self.line(node), " ".join(values), "built"))
            return  # echo, printf, grep ...: the text is data
        if prog == "alias":
            self._aliases(words, state)
            return
        if any(m in values[1:] for m in LAUNCH_MODULES) and "--" in " ".join(values) and values[:2] != ["set", "--"]:
            # `-m sglang.launch_server --x` after something the tool does not know as a launcher
            self.suspects.append((self.line(node), " ".join(values), "launcher " + prog))
        elif LAUNCHER_NAME.search(prog) and not prog.startswith("python") and len(words) > 1:
            rest = " ".join(self.src(w) for w in words[1:])
            if "--" in rest:  # `./start_sglang.sh --enable-x`: flags handed to a launcher script
                self.suspects.append((self.line(node), rest, "launcher " + prog))
        remote = prog in REMOTE or any(os.path.basename(v) in REMOTE for v in values[1:3]) or \
            (prog in DOCKER and len(values) > 1 and values[1] in ("exec", "run", "create"))
        for index, word in enumerate(words[1:], start=1):
            if word.type not in ("string", "raw_string", "ansi_c_string", "concatenation", "word"):
                continue

            def container_env(inner_state, before=values[:index]) -> None:
                docker = next((k for k, v in enumerate(values[:-1]) if os.path.basename(v) in DOCKER
                               and values[k + 1] in ("run", "create", "exec")), None)
                if docker is not None:  # `docker run -e X=1 img bash -c "..."`: the container's env
                    _wrapper_env(before, docker + 1, inner_state.exports)
                    if any(v == "--env-file" or v.startswith("--env-file=") for v in values[docker:]):
                        inner_state.export_dynamic.add("*")

            self._string_as_script(word, state, remote, container_env if remote else None)

    def _string_as_script(self, word, state: "_State", remote: bool, env=None) -> None:
        """Read the quoted `word` as a script of its own (when it mentions a launch or a rule's
        flag), or report it when its offsets cannot be mapped back. `remote`: it runs elsewhere
        (ssh, a container), so this script's exports do not reach it; `env(inner_state)` adds
        what does."""
        token = self._token(word)
        if not _mentions(token.value):
            return
        container = ShellContainer(self.text, [token], self.mapper)
        mapper, positions = word_mapper(container, 0)
        if positions is None:
            self.suspects.append((token.line, token.value, "shell string"))
            return

        value, skip = token.value, 0
        option = re.match(r"--?[A-Za-z][A-Za-z0-9_-]*=", value)
        if option and _mentions(value[option.end():]):
            # `sbatch --wrap="python3 -m sglang.launch_server ..."`: the option's value is the script
            value, skip = value[option.end():], option.end()
            inner_mapper = mapper

            def mapper(edit, inner=inner_mapper, by=skip):  # noqa: F811
                return inner(TextEdit(edit.start + by, edit.end + by, edit.text))

        def offset_of(off: int, at=positions, end=token.end, by=skip) -> int:
            return at[off + by] if off + by < len(at) else end

        inner_state = state.copy(expanded=self.src(word)[:1] != "'")
        if remote:
            inner_state.exports, inner_state.export_dynamic = {}, set()
            if env is not None:
                env(inner_state)
        self._inner(value, offset_of, mapper, inner_state)

    def _record_set_positional(self, node, state: "_State") -> None:
        """`set -- --model-path m --x "$@"` (entrypoint scripts): the positional parameters, as an
        array named `@`, for a later `"$@"` (an argument of a launch, or `exec "$@"`)."""
        words = _command_words(node)
        if len(words) < 2 or self.src(words[0]) != "set" or self.src(words[1]) != "--":
            return
        tokens, passthrough = [], False
        for word in words[2:]:
            if PASSTHROUGH.match(self.src(word)):
                passthrough = True
                continue
            tokens.append(self._token(word))
        container = ShellContainer(self.text, tokens, self.mapper)
        previous = state.arrays.get("@")
        refs = [(container, i) for i in range(len(tokens))]
        if passthrough and previous is not None:
            refs = previous.tokens + refs  # `set -- "$@" --x`: a rough order, the words are what matters
        state.arrays["@"] = _Array(refs, passthrough=passthrough)

    def _record_source(self, node, state: "_State") -> None:
        """`source ./.env` / `. prod.env` (an env file next to this one): its variables are set
        from here on. Exported unless the script did not `set -a` and the file does not export:
        then whether the launch sees them is not known (values the rules cannot rely on)."""
        words = _command_words(node)
        if len(words) < 2 or self.src(words[0]) not in ("source", ".") or not ORIGIN:
            return
        path = self._token(words[1]).value
        if "$" in path or ".." in path.split("/") or os.path.isabs(path):
            return
        from sglaunch.migrate.textfmt import read_env_file

        values = read_env_file(path, ORIGIN[0])
        if not values:
            return
        all_export = bool(re.search(r"(?m)^\s*set\s+(-[a-z]*a|-o\s+allexport)", self.text[:self.pos(node.start_byte)]))
        for name, value in values.items():
            state.shell_vars[name] = (value, False)
            _set_export(state, name, value, dynamic=not all_export)

    def _herestring(self, node, state: "_State") -> None:
        """`bash <<< "python -m sglang.launch_server ..."`, `ssh host bash <<< '...'`: the string is
        the script a shell reads."""
        command = node.parent
        if command is None or command.type != "command":
            return
        values = [self._token(w).value for w in _command_words(command)]
        if not values or not any(os.path.basename(v) in SHELLS | REMOTE for v in values):
            return
        string = next((c for c in node.children if c.type in ("string", "raw_string", "word", "concatenation")), None)
        if string is not None:
            self._string_as_script(string, state, any(os.path.basename(v) in REMOTE for v in values))

    # -- assignments -------------------------------------------------------------

    def _record_assignment(self, node, state: _State) -> None:
        if node.type == "variable_assignment":
            self._assign(node, state, export=False)
            return
        keyword = node.children[0].type if node.children else ""
        flags = [self.src(c) for c in node.children if c.type == "word"]
        export = keyword == "export" or any(f.startswith("-") and "x" in f for f in flags)
        if export:
            state.has_export = True
        for child in node.children:
            if child.type == "variable_assignment":
                self._assign(child, state, export)
            elif child.type == "variable_name" and export:
                name = self.src(child)
                if name in state.shell_vars:
                    value, dynamic = state.shell_vars[name]
                    _set_export(state, name, value, dynamic)

    def _assign(self, node, state: _State, export: bool) -> None:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        if name_node is None or name_node.type != "variable_name":
            return
        name = self.src(name_node)
        appending = any(c.type == "+=" for c in node.children)
        if value_node is not None and value_node.type == "array":
            self._record_array(name, value_node, state, appending)
            return
        value, dynamic = self._value(value_node) if value_node is not None else ("", False)
        if appending and name in state.shell_vars:
            previous, was_dynamic = state.shell_vars[name]
            value, dynamic = previous + value, dynamic or was_dynamic
        state.shell_vars[name] = (value, dynamic)
        if export or name in state.exports:
            _set_export(state, name, value, dynamic)
        if value_node is not None:
            self._record_words(name, value_node, state, appending)

    def _record_words(self, name: str, node, state: _State, appending: bool) -> None:
        """`CMD="python -m sglang.launch_server ..."` is read as a script (it is run as
        `$CMD`, `bash -c "$CMD"`, `eval`); `ARGS="--tp 8 --enable-x"` as words for `$ARGS`."""
        token = self._token(node)
        if _mentions(token.value):
            container = ShellContainer(self.text, [token], self.mapper)
            mapper, positions = word_mapper(container, 0)
            if positions is None:
                self.suspects.append((token.line, token.value, "variable " + name))
            else:
                self._inner(token.value, lambda off, at=positions, end=token.end: at[off] if off < len(at) else end,
                            mapper, state.copy())
            words = _words_container(self, node, token)  # `$SERVE --tp 8`: the launcher comes from here
            if words is None:
                state.words.pop(name, None)
            else:
                state.words[name] = _WordVar([(words, k) for k in range(len(words.tokens))], token.value, used=True)
            return
        container = _words_container(self, node, token)
        if container is None:
            state.words.pop(name, None)
            return
        refs: list[tuple[ShellContainer, int]] = []
        previous = state.words.get(name)
        for index, word in enumerate(container.tokens):
            ref = VAR_USE.match(word.value)
            if ref and ref.group(1) == name and previous is not None:
                refs.extend(previous.tokens)  # ARGS="$ARGS --x"
                previous.used = True
            elif ref and ref.group(1) in state.words:
                refs.extend(state.words[ref.group(1)].tokens)
                state.words[ref.group(1)].used = True
            else:
                refs.append((container, index))
        if appending and previous is not None:
            refs = previous.tokens + refs
        elif previous is not None and not previous.used and refs[:1] != previous.tokens[:1]:
            # `A="--x"` replaced before any launch used it (another branch of an if or a case):
            # the launch may still get it, so it is reported unless something uses it
            self.shadowed.append((name, previous))
        source = token.value if previous is None or not (appending or refs[:1] == previous.tokens[:1]) \
            else previous.source + " " + token.value
        state.words[name] = _WordVar(refs, source, used=False)

    def _record_array(self, name: str, node, state: _State, appending: bool) -> None:
        tokens = [self._token(c) for c in node.children if c.type in ARG_NODES]
        container = ShellContainer(self.text, tokens, self.mapper)
        refs = [(container, i) for i in range(len(tokens))]
        if appending and name in state.arrays:
            state.arrays[name].tokens.extend(refs)
        else:
            previous = state.arrays.get(name)
            if previous is not None and not previous.used and previous.tokens:
                # `A=(--x)` in one branch, `A=(--y)` in another: the launch may get either
                self.shadowed.append((name, previous))
            state.arrays[name] = _Array(refs)

    def _record_unset(self, node, state: _State) -> None:
        words = [c for c in node.children if c.type in ARG_NODES or c.type == "command_name"]
        if words and self.src(words[0]) == "unset":
            for word in words[1:]:
                name = self.src(word)
                state.exports.pop(name, None)
                state.arrays.pop(name, None)
                state.shell_vars.pop(name, None)
                state.words.pop(name, None)

    def _unset(self, node, state: _State) -> None:
        for child in node.children[1:]:
            name = self.src(child)
            for table in (state.exports, state.arrays, state.shell_vars, state.words):
                table.pop(name, None)

    def _value(self, node) -> tuple[str, bool]:
        if node.type == "concatenation":
            parts = [self._value(c) for c in node.children]
            return "".join(p for p, _ in parts), any(d for _, d in parts)
        return node_value(node, self.src(node))

    def _token(self, node) -> ShellToken:
        value, dynamic = self._value(node)
        return ShellToken(value, dynamic, self.pos(node.start_byte), self.pos(node.end_byte),
                          self.line(node))

    # -- launch commands ---------------------------------------------------------

    def _launch(self, node, state: _State) -> tuple[LaunchCommand, Site] | None:
        prefixes = [c for c in node.children if c.type == "variable_assignment"]
        name = node.child_by_field_name("name")
        if name is None:
            return None
        words = [name.children[0] if name.children else name]
        words += [c for c in node.children if c.type in ARG_NODES and c.start_byte > name.start_byte]
        tokens = [self._token(w) for w in words]
        found = _find_launcher([t.value for t in tokens]) or _image_entrypoint([t.value for t in tokens])
        if found is None and tokens[0].value in state.functions and len(tokens) > 1:
            # `start_server --tp 8` where start_server() { python -m sglang.launch_server "$@"; }
            found = (0, 1, f"{tokens[0].value} (shell function: {state.functions[tokens[0].value]})")
        if found is None:
            return self._launch_from_variable(node, state, words, tokens, prefixes)
        prog, end, launcher = found
        if any(os.path.basename(t.value) == "srun" for t in tokens[:prog]):
            # `srun --het-group=0 python -m sglang.launch_server ... : --het-group=1 other`: the
            # launch ends at the component separator
            stop = next((k for k in range(end, len(tokens)) if tokens[k].value == ":" and not tokens[k].dynamic), None)
            if stop is not None:
                rest = " ".join(t.value for t in tokens[stop + 1:])
                if _mentions(rest):
                    self.suspects.append((tokens[stop].line, rest, "launcher srun"))
                tokens, words = tokens[:stop], words[:stop]
        docker_run = _docker_run_index([t.value for t in tokens[:prog]])
        env: dict[str, str] = {}
        env_dynamic: set[str] = set()
        if docker_run is None:  # host exports and prefixes do not reach a container
            env, env_dynamic = dict(state.exports), set(state.export_dynamic)
            for prefix in prefixes:
                self._prefix_env(prefix, env, env_dynamic)
        _wrapper_env([t.value for t in tokens[:prog]], docker_run, env)
        if docker_run is not None and any(v == "--env-file" or v.startswith("--env-file=")
                                          for v in (t.value for t in tokens[docker_run:prog])):
            env_dynamic.add("*")  # evaluate.UNKNOWN_ENV: the env file may set anything
        return self._build(node, state, tokens[end:], words[end:], launcher, env, env_dynamic,
                           docker_run, tokens)

    def _launch_from_variable(self, node, state: _State, words, tokens, prefixes):
        """`"${CMD[@]}" --port 1` / `$CMD` where the array or variable holds the launcher."""
        if len(words) > 1 and self.src(words[0]) in ("exec", "nohup") and PASSTHROUGH.match(self.src(words[1])):
            words, tokens = words[1:], tokens[1:]  # `exec "$@"` after `set -- python -m sglang.launch_server ...`
        head = self.src(words[0])
        if PASSTHROUGH.match(head) and "@" in state.arrays:
            var = state.arrays["@"]
            var.used = True
            match = None
        else:
            match = ARRAY_USE.match(head) or VAR_USE.match(head.strip('"'))
            if match is None:
                return None
            var = state.arrays.get(match.group(1)) if ARRAY_USE.match(head) else state.words.get(match.group(1))
        if var is None or not var.tokens:
            rest = " ".join(self.src(w) for w in words[1:])
            if "--" in rest:  # `$SERVE --enable-x`: a launcher the tool cannot see, with flags
                self.suspects.append((tokens[0].line, rest, "launcher $" + match.group(1)))
            return None
        lead = list(var.tokens)
        found = _find_launcher([c.tokens[i].value for c, i in lead])
        if found is None:
            return None
        if isinstance(var, _WordVar):
            var.used = True
        _, end, launcher = found
        env, env_dynamic = dict(state.exports), set(state.export_dynamic)
        for prefix in prefixes:
            self._prefix_env(prefix, env, env_dynamic)
        return self._build(node, state, tokens[1:], words[1:], launcher, env, env_dynamic, None, tokens,
                           lead=lead[end:])

    def _prefix_env(self, node, env: dict[str, str], env_dynamic: set[str]) -> None:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        if name_node is None:
            return
        value, dynamic = self._value(value_node) if value_node is not None else ("", False)
        env[self.src(name_node)] = value
        if dynamic:
            env_dynamic.add(self.src(name_node))

    def _build(self, node, state, arg_tokens, arg_nodes, launcher, env, env_dynamic,
               docker_run, all_tokens, lead=()) -> tuple[LaunchCommand, Site]:
        line_container = ShellContainer(self.text, arg_tokens, self.mapper)
        refs: list[tuple[ShellContainer, int]] = list(lead)
        passthrough = False
        for index, token in enumerate(arg_tokens):
            raw = self.src(arg_nodes[index])
            if token.dynamic and "--" in raw and ("$(" in raw or "`" in raw):
                # `$( [ -n "$X" ] && echo --enable-x )`: flags the shell builds at run time
                self.suspects.append((token.line, raw, "built"))
            array = ARRAY_USE.match(raw)
            if PASSTHROUGH.match(raw) and "@" in state.arrays:
                # `set -- --x "$@"` earlier: the positional parameters hold those words
                refs.extend(state.arrays["@"].tokens)
                state.arrays["@"].used = True
                passthrough = passthrough or state.arrays["@"].passthrough
            elif PASSTHROUGH.match(raw):
                passthrough = True
            elif array and array.group(1) in state.arrays:
                refs.extend(state.arrays[array.group(1)].tokens)
                state.arrays[array.group(1)].used = True
            elif (var := VAR_USE.match(raw)) and var.group(1) in state.words \
                    and not _takes_value(arg_tokens[index - 1].value if index else ""):
                state.words[var.group(1)].used = True  # unquoted $ARGS: its words, where they are written
                refs.extend(state.words[var.group(1)].tokens)
            elif (var := VAR_USE.match(raw.strip('"')) or ARRAY_USE.match(raw)) and token.dynamic \
                    and not _takes_value(arg_tokens[index - 1].value if index else ""):
                known = state.shell_vars.get(var.group(1))
                if known is not None:  # set in this file, but its words cannot be lined up with its text
                    self.suspects.append((token.line, known[0], "variable " + var.group(1)))
                else:
                    self.suspects.append((token.line, raw, "unresolved " + var.group(1)))
                refs.append((line_container, index))
            else:
                refs.append((line_container, index))
        values = [c.tokens[i] for c, i in refs]
        in_docker = docker_run is not None
        command = LaunchCommand(
            args=tuple(t.value for t in values), dynamic=tuple(t.dynamic for t in values),
            line=self.line(node), env=env, passthrough=passthrough, launcher=launcher,
            end_line=node.end_point[0] + 1, arg_lines=tuple(t.line for t in values),
            env_dynamic=frozenset(env_dynamic), in_docker=in_docker,
        )
        setter = self._env_setter(node, state, all_tokens, docker_run)
        site = Site(
            args=command.args, dynamic=command.dynamic,
            refs=tuple(TokenRef(c, i, c.tokens[i].line) for c, i in refs),
            line=command.line, launcher=launcher, env=dict(env), env_dynamic=frozenset(env_dynamic),
            passthrough=passthrough, set_env=setter, fmt=self.fmt,
            env_hint="add `-e NAME=VALUE` to docker run" if in_docker else "export NAME=VALUE before the command",
        )
        return command, site

    def _env_setter(self, node, state: _State, tokens: list[ShellToken], docker_run: int | None):
        text, mapper = self.text, self.mapper
        if docker_run is not None:
            at = tokens[docker_run].end

            def set_docker_env(name: str, value: str) -> list[TextEdit] | None:
                edit = mapper(TextEdit(at, at, f" -e {name}={shell_quote(value)}"))
                return None if edit is None else [edit]

            return set_docker_env
        start = self.pos(node.start_byte)
        line_start = text.rfind("\n", 0, start) + 1
        indent = text[line_start:start]
        own_line = not indent.strip(" \t") and not _continues(text, line_start)

        def set_env(name: str, value: str) -> list[TextEdit] | None:
            if own_line and state.has_export:
                edit = TextEdit(line_start, line_start, f"{indent}export {name}={shell_quote(value)}\n")
            else:
                edit = TextEdit(start, start, f"{name}={shell_quote(value)} ")
            mapped = mapper(edit)
            return None if mapped is None else [mapped]

        return set_env


def _enclosing_function(node):
    """The name node of the shell function whose body holds `node`, if any."""
    parent = node.parent
    while parent is not None:
        if parent.type == "function_definition":
            return parent.child_by_field_name("name")
        parent = parent.parent
    return None


def _takes_value(previous: str) -> bool:
    """The token before is a flag that may take this one as its value (`--tp $TP`)."""
    if not previous.startswith("-") or "=" in previous:
        return False
    from sglaunch.flags.registry import SCHEMA
    from sglaunch.flags.spec import Kind

    flag = SCHEMA.lookup(previous)
    return flag is None or flag.kind is not Kind.BOOL


def _command_words(node) -> list:
    name = node.child_by_field_name("name")
    if name is None:
        return []
    words = [name.children[0] if name.children else name]
    return words + [c for c in node.children if c.type in ARG_NODES and c.start_byte > name.start_byte]


def mentions(text: str) -> bool:
    """The text holds an SGLang launcher name."""
    return any(m in text for m in LAUNCH_MODULES) or "sglang/launch_server.py" in text or bool(SERVE.search(text))


_mentions = mentions
SERVE = re.compile(r"\bsglang\s+serve\b")


def _shebang(text: str) -> bool:
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith("#!") and any(s in first for s in ("sh", "bash"))


def word_mapper(container: ShellContainer, k: int):
    """(mapper, positions) for shell word k of `container`: edits of the word's unquoted value
    become edits of the container's text (then of the file), with characters that would change
    the quoting refused. positions: per character of the value, its offset in the text
    (None when they cannot be lined up)."""
    from sglaunch.migrate.tokens import align, scalar_mapper

    token = container.tokens[k]
    source = container.text[token.start:token.end]
    quote = source[:1]
    option = re.match(r"--?[A-Za-z][A-Za-z0-9_-]*=([\"'])", source)
    if option and len(source) > option.end() and source.endswith(option.group(1)) \
            and option.group(1) not in source[option.end():-1]:
        quote = option.group(1)  # `--wrap="..."`: the value is one quoted string (edits land in it)
    forbidden = {'"': '"\\$`\n', "'": "'\n"}.get(quote, " \t\n\"'\\$`;&|<>()#")
    positions = align(source, token.start, token.value)
    if positions is None:
        return None, None
    inner = scalar_mapper(positions, token.end, forbidden)

    def mapper(edit: TextEdit) -> TextEdit | None:
        moved = inner(edit)
        return None if moved is None else container.mapper(moved)

    return mapper, positions


class _WordsContainer(ShellContainer):
    """The words of a variable's value (`ARGS="--tp 8 --x"`): edits stay inside the quotes, so
    new words must be plain (no quoting, no `$`)."""

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        if any(not SAFE_PLAIN.fullmatch(t) for t in new_tokens):
            return None
        return super().replace(i, j, new_tokens)


SAFE_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def _words_container(script: "_Script", node, token: ShellToken) -> "_WordsContainer | None":
    """Split a variable's value into its words as unquoted `$VAR` would (on blanks; quotes
    inside the value stay literal), each word with its place in the script."""
    if node.type not in ("string", "raw_string", "word", "concatenation", "simple_expansion", "expansion"):
        return None
    if node.type in ("simple_expansion", "expansion") or "$(" in token.value or "`" in token.value:
        return None
    source = script.text[token.start:token.end]
    base = ShellContainer(script.text, [token], script.mapper)
    mapper, positions = word_mapper(base, 0)
    if positions is None:
        return None
    words = []
    for match in re.finditer(r"[^ \t\n]+", token.value):
        a, b = match.start(), match.end()
        value = match.group(0)
        start, end = positions[a], positions[b - 1] + 1
        if script.text[start:end] != value:
            return None  # an escape inside the word: keep it out of reach
        words.append(ShellToken(value, "$" in value, start, end, script.offset_line(start)))
    quote = source[:1] if source[:1] in ("'", '"') else ""
    forbidden = {'"': '"\\$`\n', "'": "'\n"}.get(quote, " \t\n\"'\\$`;&|<>()#")
    outer = script.mapper

    def guarded(edit: TextEdit) -> TextEdit | None:
        return None if any(ch in edit.text for ch in forbidden) else outer(edit)

    return _WordsContainer(script.text, words, guarded)


def _in_substitution(node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type in ("command_substitution", "process_substitution"):
            return True
        parent = parent.parent
    return False


def _continues(text: str, line_start: int) -> bool:
    return line_start >= 2 and text[line_start - 2] == "\\"


def _set_export(state: _State, name: str, value: str, dynamic: bool) -> None:
    state.exports[name] = value
    if dynamic:
        state.export_dynamic.add(name)
    else:
        state.export_dynamic.discard(name)


def _is_statement(node) -> bool:
    """Assignments that stand alone (not `X=1 cmd` prefixes, which belong to their command)."""
    parent = node.parent
    return parent is None or parent.type not in ("command", "declaration_command")


def _walk(root) -> Iterator[tuple[object, bool]]:
    """Pre-order (document order) walk, skipping heredoc bodies; flags nodes under ERROR."""
    stack = [(root, False)]
    while stack:
        node, in_error = stack.pop()
        yield node, in_error
        if node.type in ("heredoc_body", "comment"):
            continue
        below = in_error or node.type == "ERROR"
        stack.extend((child, below) for child in reversed(node.children))


def _find_launcher(values: Sequence[str]) -> tuple[int, int, str] | None:
    """(program index, index after the launcher, launcher text) or None."""
    if not values or not _runs_commands(values[0]):
        return None
    for k, value in enumerate(values):
        base = os.path.basename(value)
        if value in ("-m", "--module") and k + 1 < len(values) and values[k + 1] in LAUNCH_MODULES:
            prog = _program_index(values, k)
            return prog, k + 2, f"{os.path.basename(values[prog])} -m {values[k + 1]}"
        if value.startswith("-m") and value[2:] in LAUNCH_MODULES:
            prog = _program_index(values, k)
            return prog, k + 1, f"{os.path.basename(values[prog])} -m {value[2:]}"
        if base == "sglang" and k + 1 < len(values) and values[k + 1] == "serve":
            return k, k + 2, "sglang serve"
        if value.endswith("sglang/launch_server.py") and k > 0 and \
                os.path.basename(values[k - 1]).startswith(("python", "pypy")):
            return k - 1, k + 1, f"{os.path.basename(values[k - 1])} .../sglang/launch_server.py"
    return None


def _image_entrypoint(values: Sequence[str]) -> tuple[int, int, str] | None:
    """`docker run ... lmsysorg/sglang:TAG --model-path m --x`: an sglang image whose entrypoint
    launches, given SGLang flags directly (the image is the word before them)."""
    run = _docker_run_index(values)
    if run is None:
        return None
    for k in range(run + 1, len(values) - 1):
        if "sglang" in values[k].lower() and not values[k].startswith("-") and values[k + 1].startswith("--"):
            from sglaunch.migrate.yamlfmt import flag_list

            if flag_list(values[k + 1:]):
                return k, k + 1, "image entrypoint"
            return None
    return None


def _runs_commands(first: str) -> bool:
    base = os.path.basename(first)
    # `$PYTHON -m sglang.launch_server`, `"${PY}" -m ...`, `$(which python3) -m ...`
    return base.startswith("python") or base in ("sglang", "pypy3") or base in WRAPPERS or \
        first.startswith("$")


def _program_index(values: Sequence[str], module_flag: int) -> int:
    for k in range(module_flag - 1, -1, -1):
        base = os.path.basename(values[k])
        if base.startswith("python") or base in ("torchrun", "pypy3"):
            return k
    return max(module_flag - 1, 0)


def _docker_run_index(values: Sequence[str]) -> int | None:
    for k, value in enumerate(values[:-1]):
        if os.path.basename(value) in DOCKER and values[k + 1] in ("run", "create"):
            return k + 1
    return None


def _wrapper_env(values: Sequence[str], docker_run: int | None, env: dict[str, str]) -> None:
    """`env X=1 ...` assignments, `srun --export=ALL,X=1` and `docker run -e X=1 / --env X=1 / --env=X=1`."""
    for k, value in enumerate(values):
        if value.startswith("--export=") and any(os.path.basename(v) in ("srun", "sbatch", "salloc")
                                                 for v in values[:k]):
            for item in value[len("--export="):].split(","):
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item):
                    name, _, val = item.partition("=")
                    env[name] = val
        if os.path.basename(value) == "env":
            for item in values[k + 1:]:
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item):
                    name, _, val = item.partition("=")
                    env[name] = val
                elif not item.startswith("-"):
                    break
    if docker_run is None:
        return
    for k in range(docker_run + 1, len(values)):
        value = values[k]
        item = None
        if value in ("-e", "--env") and k + 1 < len(values):
            item = values[k + 1]
        elif value.startswith("--env="):
            item = value[len("--env="):]
        elif value.startswith("-e") and len(value) > 2 and "=" in value:
            item = value[2:]
        if item and "=" in item:
            name, _, val = item.partition("=")
            env[name] = val


def _byte_to_char(text: str) -> list[int]:
    """Map every UTF-8 byte offset (plus the end) to its character offset."""
    table: list[int] = []
    for index, char in enumerate(text):
        table.extend([index] * len(char.encode("utf-8", "surrogatepass")))
    table.append(len(text))
    return table


def split_words(text: str, mapper: Mapper | None = None) -> ShellContainer | None:
    """Split one command string (a compose `command:`) into shell words with spans, or None
    when it is not a single simple command."""
    lead = "_ "
    script = _Script(lead + text, _shifted(mapper or _identity, len(lead)), "shell")
    tree = _parser().parse(script.data)
    root = tree.root_node
    if root.has_error or len(root.named_children) != 1 or root.named_children[0].type != "command":
        return None
    node = root.named_children[0]
    words = [c for c in node.children if c.type in ARG_NODES]
    tokens = [script._token(w) for w in words]
    shifted = [ShellToken(t.value, t.dynamic, t.start - len(lead), t.end - len(lead), t.line) for t in tokens]
    return ShellContainer(text, shifted, mapper or _identity)


def _shifted(mapper: Mapper, by: int) -> Mapper:
    def shifted(edit: TextEdit) -> TextEdit | None:
        return mapper(TextEdit(edit.start - by, edit.end - by, edit.text))

    return shifted
