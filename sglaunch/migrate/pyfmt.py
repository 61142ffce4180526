"""Launch commands in Python launchers, read with Python's own `ast`.

Found: argument lists (`subprocess.Popen([sys.executable, "-m", "sglang.launch_server", ...])`,
`cmd = [...]`, `cmd += ["--x", ...]`, any list or tuple literal that holds a launcher or starts
with an SGLang flag), and strings that hold a launch command (`os.system("python -m ...")`,
`shell=True`, `shlex.split(...)`, f-strings, whose `{...}` fields count as shell text). A
string literal that is exactly a flag a rule is about, anywhere else (`cmd.append("--x")`),
is reported for a person. Edits stay inside the string literals' quotes; elements that are
not plain literals (`sys.executable`, `str(port)`, `*extra`) are never rewritten.
"""

from __future__ import annotations

import ast
import re
from typing import Sequence

from sglaunch.migrate import shell
from sglaunch.migrate.tokens import Site, TextEdit, TokenRef
from sglaunch.migrate.yamlfmt import Document, flag_list

FLAG_LITERAL = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*(=.*)?")
SAFE = re.compile(r"[^\\\n'\"]*")


class _Offsets:
    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def at(self, lineno: int, col_bytes: int) -> int:
        line = self.lines[lineno - 1]
        col = len(line.encode("utf-8", "surrogatepass")[:col_bytes].decode("utf-8", "surrogatepass"))
        return self.starts[lineno - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


class _Literal:
    """A plain one-line string literal ("x" or 'x', no prefix, no escapes) or None."""

    def __init__(self, text: str, start: int, end: int):
        self.start, self.end = start, end
        src = text[start:end]
        self.quote = src[:1] if src[:1] in ("'", '"') and src[-1:] == src[:1] and len(src) >= 2 else ""
        if src.startswith(self.quote * 3) or not SAFE.fullmatch(src[1:-1] if self.quote else "\\"):
            self.quote = ""


class PyListContainer:
    """The elements of a Python list or tuple literal used as an argv."""

    def __init__(self, text: str, spans: list[tuple[int, int]], literals: list[bool]):
        self.text = text
        self.spans = spans
        self.literal = [_Literal(text, s, e) if ok else None for (s, e), ok in zip(spans, literals)]

    def _plain(self, i: int) -> _Literal | None:
        lit = self.literal[i]
        return lit if lit is not None and lit.quote else None

    def rename_prefix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        lit = self._plain(i)
        if lit is None or not self.text[lit.start + 1:].startswith(old) or not SAFE.fullmatch(new):
            return None
        return [TextEdit(lit.start + 1, lit.start + 1 + len(old), new)]

    def replace_suffix(self, i: int, old: str, new: str) -> list[TextEdit] | None:
        lit = self._plain(i)
        if lit is None or not self.text[lit.start:lit.end - 1].endswith(old) or not SAFE.fullmatch(new):
            return None
        return [TextEdit(lit.end - 1 - len(old), lit.end - 1, new)]

    def replace(self, i: int, j: int, new_tokens: Sequence[str]) -> list[TextEdit] | None:
        if any(self._plain(k) is None for k in range(i, j)) or any(not SAFE.fullmatch(t) for t in new_tokens):
            return None
        quote = self._plain(i).quote  # type: ignore[union-attr]
        start, end = self.spans[i][0], self.spans[j - 1][1]
        if new_tokens:
            return [TextEdit(start, end, ", ".join(quote + t + quote for t in new_tokens))]
        if j < len(self.spans):
            start, end = start, self.spans[j][0]
        elif i > 0:
            start = self.spans[i - 1][1]
        if "#" in self.text[start:end]:
            return None  # a comment between the elements: leave it to a person
        return [TextEdit(start, end, "")]


RUNNERS = frozenset({
    "system", "popen", "run", "call", "check_call", "check_output", "Popen", "split", "getoutput",
    "getstatusoutput", "create_subprocess_shell", "create_subprocess_exec", "spawn", "spawnv", "execl",
    "execlp", "execv", "execvp", "execvpe", "run_cmd", "run_command", "sh", "bash", "shell", "launch",
    "start", "start_server", "popen_launch_server",
})
QUIET = frozenset({"print", "echo", "write", "debug", "info", "warning", "warn", "error", "exception",
                   "critical", "log", "format", "help", "add_argument", "ArgumentParser", "secho", "fail"})


class _Args:
    """The positional arguments of a call, read like a list literal's elements."""

    def __init__(self, call: ast.Call):
        self.elts = list(call.args)
        self.lineno = call.lineno
        self._sglaunch_env = _call_env(call)


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def read_python(text: str) -> Document:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        if shell.mentions(text) or "sglang" in text.lower():
            if isinstance(exc, SyntaxError):
                raise
            raise SyntaxError(type(exc).__name__, ("<file>", 1, 0, "")) from None
        # not Python 3 the tool can read, and nothing of SGLang in it: a notice, not an error
        return Document(errors=[(getattr(exc, "lineno", None) or 1, "not Python the tool can parse "
                                 f"({getattr(exc, 'msg', None) or type(exc).__name__}); it mentions no SGLang launch")])
    offsets = _Offsets(text)
    doc = Document()
    covered: set[int] = set()
    run: set[int] = set()  # strings that are run as commands: given to a runner, or kept in a variable
    quiet: set[int] = set()  # strings printed or logged: data
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            for arg in node.args[:1]:
                if isinstance(arg, (ast.List, ast.Tuple)):
                    arg._sglaunch_env = _call_env(node)  # type: ignore[attr-defined]
            target = run if name in RUNNERS else quiet if name in QUIET else None
            if target is not None:
                # add_argument's default= becomes the program's value (`default="--x --tp 8"`): not quiet
                keywords = [k.value for k in node.keywords
                            if not (name == "add_argument" and k.arg in ("default", "const"))]
                for arg in [*node.args, *keywords]:
                    target.update(id(n) for n in ast.walk(arg))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            run.update(id(n) for n in ast.walk(node.value) if isinstance(n, (ast.Constant, ast.JoinedStr)))
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            argv = any(_is_sys_argv(t) and not isinstance(t, ast.Subscript) for t in targets)
            if argv and isinstance(node.value, (ast.List, ast.Tuple)) and RUNPY_LAUNCH.search(text):
                # sys.argv = ["sglang.launch_server", "--x", ...]; runpy.run_module("sglang.launch_server"):
                # the list is the server's argv (its first element the program name)
                node.value._sglaunch_argv = True  # type: ignore[attr-defined]
        elif isinstance(node, ast.keyword) and node.arg in ("cmd", "command", "args", "script"):
            run.update(id(n) for n in ast.walk(node.value))
    # the string of `shlex.split("--x 1 --y")`
    split_args = {id(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call) and _call_name(n) == "split"
                  and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                  and n.func.value.id == "shlex" and n.args and isinstance(n.args[0], ast.Constant)}
    calls = []
    for node in ast.walk(tree):
        # session.run("python", "-m", "sglang.launch_server", "--x"), os.execlp("python3", "python3", "-m", ...):
        # the positional arguments are the argv
        if isinstance(node, ast.Call) and _call_name(node) not in QUIET and len(node.args) >= 3 \
                and not any(isinstance(a, (ast.List, ast.Tuple)) for a in node.args):
            spread = _Args(node)
            skip = 1 if _call_name(node).startswith(("execl", "spawnl")) else 0  # the path, then argv[0]
            spread.elts = node.args[skip:]
            calls.append(spread)
    for node in [*calls, *ast.walk(tree)]:
        if isinstance(node, (ast.List, ast.Tuple, _Args)):
            site = _argv_site(text, offsets, node)
            if site is not None:
                doc.sites.append(site)
                covered.update(id(e) for e in node.elts)
        elif isinstance(node, ast.JoinedStr):
            covered.update(id(v) for v in node.values)
            if id(node) in run:
                _fstring(text, offsets, node, doc)
            elif id(node) not in quiet:
                start, end = offsets.span(node)
                _unread(doc, node, text[start:end])
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _sglang_call(node):
            for keyword in node.keywords:  # sglang.Engine(enable_deepep_waterfill=True), ServerArgs(...)
                if keyword.arg and "_" in keyword.arg:
                    flag = "--" + keyword.arg.replace("_", "-")
                    doc.errors.append((keyword.lineno, f"the keyword argument {keyword.arg}= names the SGLang flag "
                                       f"{flag} (Engine / ServerArgs take the flags as keywords); rename or remove it "
                                       "by hand", flag, "variable"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            # opts = dict(tp_size=8, enable_deepep_waterfill=True), turned into flags by the launcher
            for keyword in node.keywords:
                if keyword.arg and FLAG_KEY.fullmatch(keyword.arg):
                    flag = "--" + keyword.arg.replace("_", "-")
                    value = keyword.value
                    shown = f"{flag} {value.value}" if isinstance(value, ast.Constant) and \
                        isinstance(value.value, str) else flag
                    doc.errors.append((keyword.lineno, f"the key {keyword.arg}= names the SGLang flag {flag}, in a "
                                       "mapping the launcher turns into arguments the tool cannot read; check it "
                                       "by hand", shown, "variable"))
        if isinstance(node, ast.Dict):
            # SERVER_ARGS = {"enable-deepep-waterfill": True, "quantization": "qoq"} turned into flags
            # by the launcher's own code: reported when a key names a rule's flag
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and FLAG_KEY.fullmatch(key.value):
                    flag = "--" + key.value.replace("_", "-")
                    shown = f"{flag} {value.value}" if isinstance(value, ast.Constant) and \
                        isinstance(value.value, str) else flag
                    doc.errors.append((key.lineno, f"the key {key.value!r} names the SGLang flag {flag}, in a mapping "
                                       "the launcher turns into arguments the tool cannot read; check it by hand",
                                       shown, "variable"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in covered:
            if id(node) in quiet:
                continue
            if shell.mentions(node.value):
                if id(node) in run:
                    _script(text, offsets, node, doc)
                else:
                    _unread(doc, node, node.value)
            elif FLAG_LITERAL.fullmatch(node.value):
                doc.errors.append((node.lineno, f"the string {node.value!r} is an SGLang launch flag outside any "
                                   "argument list the tool can read; check it by hand", node.value, "variable"))
            elif node.value.lstrip().startswith("--") and id(node) in split_args and \
                    _split_site(text, offsets, node, doc):
                pass  # shlex.split("--x 1 --y") inside a launch: its words are the launch's flags
            elif node.value.lstrip().startswith("--") and " " in node.value.strip():
                # `EXTRA = "--quantization qoq --port 1"`, `default="--x --tp 8"`: split into a launch later
                doc.errors.append((node.lineno, "a Python string holds what look like SGLang launch flags outside "
                                   "any argument list the tool can read; check it by hand", node.value, "variable"))
    return doc


FLAG_KEY = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
RUNPY_LAUNCH = re.compile(r"run_(?:module|path)\(\s*[\"'][^\"']*(?:sglang(?:_router)?[./]launch_server|sglang)")


def _is_sys_argv(target) -> bool:
    """`sys.argv` or `sys.argv[1:]` as an assignment target."""
    if isinstance(target, ast.Subscript):
        target = target.value
    return isinstance(target, ast.Attribute) and target.attr == "argv" and isinstance(target.value, ast.Name) \
        and target.value.id == "sys"
SGLANG_CALLS = frozenset({"Engine", "ServerArgs", "Runtime", "launch_server", "EngineArgs", "RuntimeEndpoint"})


def _sglang_call(call: ast.Call) -> bool:
    """`sgl.Engine(...)`, `sglang.Runtime(...)`, `ServerArgs(...)`: calls that take SGLang flags as keywords."""
    func = call.func
    if isinstance(func, ast.Attribute):
        base = func.value
        return func.attr in SGLANG_CALLS or (isinstance(base, ast.Name) and base.id in ("sgl", "sglang"))
    return isinstance(func, ast.Name) and func.id in SGLANG_CALLS


def _unread(doc: Document, node, source: str) -> None:
    if shell.mentions(source):
        doc.errors.append((node.lineno, "a Python string holds an SGLang launch command that is neither run "
                           "where the tool can see it nor printed; check it by hand", source, "variable"))


def _call_env(call: ast.Call) -> dict[str, str]:
    for keyword in call.keywords:
        if keyword.arg == "env" and isinstance(keyword.value, ast.Dict):
            return {k.value: v.value for k, v in zip(keyword.value.keys, keyword.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                    and isinstance(k.value, str) and isinstance(v.value, str)}
    return {}


def _argv_site(text: str, offsets: _Offsets, node) -> Site | None:
    strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if not strings or not (any(v.startswith("--") for v in strings) or any(m in strings for m in shell.LAUNCH_MODULES)
                           or "sglang" in strings):
        return None
    values, dynamic, spans, literal = [], [], [], []
    passthrough = False
    for element in node.elts:
        span = offsets.span(element)
        if isinstance(element, ast.Constant) and isinstance(element.value, str):
            values.append(element.value)
            dynamic.append(False)
            literal.append(True)
        elif isinstance(element, ast.Starred):
            passthrough = True
            continue
        else:
            values.append(text[span[0]:span[1]] or "$expr")
            dynamic.append(True)
            literal.append(False)
        spans.append(span)
    found = shell._find_launcher(["python" if d and k == 0 else v for k, (v, d) in enumerate(zip(values, dynamic))])
    if found is None and getattr(node, "_sglaunch_argv", False) and values:
        found = (0, 1, "runpy.run_module sglang.launch_server")  # sys.argv[0] is the program name
    if found is None and flag_list(values) and not isinstance(node, _Args):
        # (a call's arguments count only with a launcher: `Flag("--x", BOOL, "help")` is not an argv)
        found = (0, 0, "argument list")
    if found is None:
        return None
    _, end, launcher = found
    container = PyListContainer(text, spans, literal)
    refs = tuple(TokenRef(container, k, node.lineno if k >= len(node.elts) else
                          text.count("\n", 0, spans[k][0]) + 1) for k in range(end, len(values)))
    env = getattr(node, "_sglaunch_env", {})
    return Site(args=tuple(values[end:]), dynamic=tuple(dynamic[end:]), refs=refs, line=node.lineno,
                launcher=launcher, env=dict(env), passthrough=passthrough, fmt="python",
                env_hint="pass env={**os.environ, 'NAME': 'VALUE'} to the subprocess call")


def _split_site(text: str, offsets: _Offsets, node: ast.Constant, doc: Document) -> bool:
    """`shlex.split("--optimistic-prefill-retries 2 --tp 8")`: the words as a flag list, edited
    inside the literal's quotes (no quote, backslash or newline brought in)."""
    start, end = offsets.span(node)
    lit = _Literal(text, start, end)
    if not lit.quote:
        return False
    forbidden = lit.quote + "\\\n"

    def mapper(edit: TextEdit) -> TextEdit | None:
        if any(ch in edit.text for ch in forbidden):
            return None
        return TextEdit(edit.start + start + 1, edit.end + start + 1, edit.text)

    container = shell.split_words(text[start + 1:end - 1], mapper)
    if container is None or not flag_list([t.value for t in container.tokens]):
        return False
    tokens = container.tokens
    doc.sites.append(Site(args=tuple(t.value for t in tokens), dynamic=tuple(t.dynamic for t in tokens),
                          refs=tuple(TokenRef(container, k, node.lineno) for k in range(len(tokens))),
                          line=node.lineno, launcher="shlex.split argument list", fmt="python",
                          env_hint="pass env={**os.environ, 'NAME': 'VALUE'} to the subprocess call"))
    return True


def _script(text: str, offsets: _Offsets, node: ast.Constant, doc: Document) -> None:
    start, end = offsets.span(node)
    lit = _Literal(text, start, end)
    src = text[start:end]
    triple = src[:3] in ('"""', "'''")
    if triple and "\\" not in src:
        body_start, body = start + 3, src[3:-3]
        forbidden = src[:1] + "\\"
    elif lit.quote:
        body_start, body = start + 1, src[1:-1]
        forbidden = lit.quote + "\\\n"
    else:
        doc.errors.append((node.lineno, "a Python string holds an SGLang launch the tool cannot line up with "
                           "its escapes; check it by hand", node.value, "unreadable"))
        return
    _parse_into(doc, body, body_start, forbidden, text, node.lineno)


def _fstring(text: str, offsets: _Offsets, node: ast.JoinedStr, doc: Document) -> None:
    start, end = offsets.span(node)
    src = text[start:end]
    match = re.match(r"(?i)[fr]{1,2}('''|\"\"\"|'|\")", src)
    if match is None or "\\" in src:
        if shell.mentions(src):
            doc.errors.append((node.lineno, "an f-string holds an SGLang launch the tool cannot read; check it by hand",
                               src, "unreadable"))
        return
    quote = match.group(1)
    body = src[match.end():len(src) - len(quote)]
    if not shell.mentions(body):
        return
    # `{expr}` fields become shell expansions of the same length: values the rules cannot know
    masked = re.sub(r"\{[^{}]*\}", lambda m: "$" + "_" * (len(m.group(0)) - 1), body)
    _parse_into(doc, masked, start + match.end(), quote[:1] + "\\{}", text, node.lineno)


def _parse_into(doc: Document, body: str, body_start: int, forbidden: str, text: str, lineno: int) -> None:
    def mapper(edit: TextEdit) -> TextEdit | None:
        if any(ch in edit.text for ch in forbidden):
            return None
        return TextEdit(edit.start + body_start, edit.end + body_start, edit.text)

    first_line = text.count("\n", 0, body_start) + 1
    parsed = shell.parse_script(body, mapper, fmt="python")
    for site in parsed.sites:
        site.refs = tuple(TokenRef(r.container, r.index, first_line - 1 + r.line) for r in site.refs)
        site.line = first_line - 1 + site.line
        site.set_env = None
        site.env_hint = "set it in the environment the Python launcher passes to the server"
        doc.sites.append(site)
    for line, source, kind in parsed.suspects:
        doc.errors.append((first_line - 1 + line, "a launch in a Python string the tool could not read fully",
                           source, "region" if kind == "region" else kind.split(" ")[0]))
