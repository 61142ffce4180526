"""Launch commands in Makefiles, systemd units and env files.

All three hold shell (or shell-like) text in known places. Each reader writes a *masked* copy
of the file, of the same length, in which everything but those places is blanked out (and
make's `$(VAR)` is written `${VAR}`), and hands it to the shell reader (tree-sitter-bash):
offsets stay the file's own, so an edit is made on the original text at the same place.
Edits that would bring in a `$` (make and systemd expand it) are refused and reported.
"""

from __future__ import annotations

import os
import re
import shlex

from sglaunch.migrate import shell
from sglaunch.migrate.tokens import Site, TextEdit
from sglaunch.migrate.yamlfmt import Document

MAKE_VAR = re.compile(r"\$([({])([A-Za-z_][A-Za-z0-9_.-]*)([)}])")
MAKE_ASSIGN = re.compile(r"^(?:export\s+|override\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*(\?=|:=|::=|\+=|!=|=)\s*(.*)$")


# `serve: EP_FLAGS += --x` (a target-specific variable)
MAKE_TARGET_VAR = re.compile(r"^[^\s#=:][^=:]*:\s*(?:export\s+|override\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*"
                             r"(?:\?=|:=|::=|\+=|!=|=)(.*)$")


def _blank(line: str) -> str:
    return " " * len(line)


def _guard(forbidden: str):
    def mapper(edit: TextEdit) -> TextEdit | None:
        return None if any(ch in edit.text for ch in forbidden) else edit

    return mapper


def _problems(parsed) -> list:
    from sglaunch.migrate.engine import shell_problems

    return shell_problems(parsed)


# --------------------------------------------------------------------------- Makefile


def read_makefile(text: str) -> Document:
    """Recipe lines (tab-indented, with their backslash continuations) are shell; `@`, `-`
    and `+` prefixes are dropped, `$(VAR)` / `${VAR}` become shell expansions and `$$` a
    literal `$`. Make variables (`SGLANG_ARGS = --x`, `SERVE := python3 -m ...`, `+=`) are
    known to the recipes as word lists, as make expands them: their words are edited where
    they are written. One that holds a rule's flag and that no readable launch uses is
    reported."""
    lines = text.split("\n")
    out: list[str] = []
    in_recipe = continued = False
    assignments: list[tuple[int, str, str, str, int]] = []  # line, name, operator, value, offset
    offset = 0
    unfollowed: list[tuple[int, str, str]] = []  # define blocks, target-specific variables
    # `export NAME` lines: make passes these variables to the recipes' environment
    exported = set(re.findall(r"(?m)^export\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", text))
    define: tuple[int, str, list[str]] | None = None
    for number, line in enumerate(lines, 1):
        start = offset
        offset += len(line) + 1
        if define is not None:
            if re.match(r"^\s*endef\b", line):
                unfollowed.append((define[0], define[1], "\n".join(define[2])))
                define = None
            else:
                define[2].append(line)
            out.append(_blank(line))
            continue
        opened = re.match(r"^(?:export\s+|override\s+)?define\s+([A-Za-z_][A-Za-z0-9_.-]*)", line)
        if opened and not line.startswith("\t"):
            define = (number, opened.group(1), [])
            out.append(_blank(line))
            in_recipe = continued = False
            continue
        target_var = MAKE_TARGET_VAR.match(line)
        if target_var and not continued:
            unfollowed.append((number, target_var.group(1), target_var.group(2)))
        if continued and in_recipe:
            out.append(_mask_make(line))
        elif line.startswith("\t") and in_recipe:
            body = line[1:]
            stripped = body.lstrip("@-+ \t")
            out.append("\t" + " " * (len(body) - len(stripped)) + _mask_make(stripped))
        elif not line.strip() or line.lstrip().startswith("#"):
            out.append(_blank(line))  # blank lines and comments do not end a recipe
            continued = False
            continue
        else:
            in_recipe = bool(re.match(r"^[^\s#=][^=]*:(?!=)", line)) and not MAKE_ASSIGN.match(line)
            match = MAKE_ASSIGN.match(line)
            if match and not line.startswith("\t"):
                assignments.append((number, match.group(1), match.group(2), match.group(3), start + match.start(3)))
            out.append(_blank(line))
        continued = line.endswith("\\") and (in_recipe or continued)
    masked = "\n".join(out)
    state = shell._State()
    for number, name, op, value, at in assignments:
        previous = state.words.get(name)
        if previous is not None and op in ("=", ":=", "::="):
            # `ifeq (...)` / `else` branches set it twice: the recipes may get either value
            first = previous.tokens[0] if previous.tokens else None
            unfollowed.append((first[0].tokens[first[1]].line if first else number, name, previous.source))
        _make_words(text, state, number, name, op, value, at)
        if re.match(r"^\s*export\s", lines[number - 1]) or name in exported:
            shell._set_export(state, name, _mask_make(value).strip(), "$" in value)
    parsed = shell.parse_script(masked, _guard("$#"), fmt="makefile", state=state)
    doc = Document(sites=list(parsed.sites), errors=_problems(parsed))
    for number, name, value in unfollowed:
        doc.errors.append((number, f"${{{name}}} holds what looks like SGLang launch flags in a make construct "
                           "the tool does not follow (a define block, a target-specific variable, or an assignment "
                           "a later one replaces, as in ifeq/else branches): check and fix it by hand",
                           value, "variable"))
    for number, name, op, value, at in assignments:
        var = state.words.get(name)
        if ("-" in value or shell.mentions(value)) and (var is None or not var.used):
            doc.errors.append((number, f"${{{name}}} holds what looks like SGLang launch flags; make expands it "
                               "where the tool does not follow it: check and fix it by hand", value, "variable"))
    return doc


def _make_words(text: str, state, number: int, name: str, op: str, value: str, at: int) -> None:
    """A make variable as the word list a recipe sees after make expands `$(NAME)`."""
    if op == "!=" or "\\" in value or "#" in value:
        state.words.pop(name, None)
        return
    masked = _mask_make(value)
    tokens, refs = [], []
    for match in re.finditer(r"[^ \t]+", masked):
        word = match.group(0)
        tokens.append(shell.ShellToken(word, "$" in word, at + match.start(), at + match.end(), number))
    container = shell._WordsContainer(text, tokens, _guard("$#\n"))
    previous = state.words.get(name)
    for index, token in enumerate(tokens):
        ref = shell.VAR_USE.match(token.value)
        if ref and ref.group(1) in state.words:
            refs.extend(state.words[ref.group(1)].tokens)
        else:
            refs.append((container, index))
    if op == "+=" and previous is not None:
        refs = previous.tokens + refs
    elif op == "?=" and previous is not None:
        return
    state.words[name] = shell._WordVar(refs, value)


def _mask_make(line: str) -> str:
    line = line.replace("$$", "\\$")
    return MAKE_VAR.sub(lambda m: "${" + m.group(2) + "}" if m.group(1) == "(" or m.group(3) == "}" else m.group(0),
                        line)


# --------------------------------------------------------------------------- systemd


EXEC_KEYS = ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload")


SUPERVISOR_EXPANSION = re.compile(r"%\(([A-Za-z_][A-Za-z0-9_]*)\)")


def read_supervisor(text: str, origin: str | None = None) -> Document:
    """supervisord `[program:x]` sections: `command=` is a command line (supervisor splits it
    like a shell, without running one); `environment=A="1",B="2"` gives the environment. One
    `environment=` line per program: the compact fix is reported, not added."""
    lines = text.split("\n")
    out: list[str] = []
    env: dict[str, str] = {}
    for line in lines:
        match = re.match(r"^(\s*)(command|environment)\s*=\s*", line)
        if match and match.group(2) == "command":
            # `%(process_num)02d` (supervisor's expansions) as `${process_num}02d`: the same length,
            # a value the rules cannot know; `%%` is a literal percent sign
            command = SUPERVISOR_EXPANSION.sub(lambda m: "${" + m.group(1) + "}", line[match.end():])
            out.append(" " * match.end() + command)
            continue
        if match:
            for name, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*("[^"]*"|\'[^\']*\'|[^,]*)', line[match.end():]):
                env[name] = value.strip().strip("\"'")
        out.append(_blank(line))
    parsed = shell.parse_script("\n".join(out), _guard("$%"), fmt="supervisor")
    for site in parsed.sites:
        site.env = {**env, **site.env}
        site.set_env = None
        site.env_hint = "add NAME=\"VALUE\" to the program's environment= line"
    return Document(sites=list(parsed.sites), errors=_problems(parsed))


def read_systemd(text: str, origin: str | None = None) -> Document:
    """`ExecStart=` lines (with `-@:+!` prefixes and backslash continuations) are read as
    shell words; `Environment=` and readable `EnvironmentFile=` files give the environment.
    The compact fix goes in as an `Environment=` line before `ExecStart=`."""
    lines = text.split("\n")
    out: list[str] = []
    env: dict[str, str] = {}
    files: dict[str, str] = {}
    problems: list = []
    continued = False
    exec_starts: list[int] = []  # offsets of the ExecStart= lines
    offset = 0
    for line in lines:
        match = re.match(r"^(\s*)(\w+)\s*=\s*", line)
        if continued:
            out.append(line)
        elif match and match.group(2) in EXEC_KEYS:
            prefix = match.end()
            rest = line[prefix:]
            stripped = rest.lstrip("-@:+!")
            out.append(" " * (prefix + len(rest) - len(stripped)) + stripped)
            if match.group(2) == "ExecStart":
                exec_starts.append(offset)
        else:
            if match and match.group(2) == "Environment":
                try:
                    words = shlex.split(line[match.end():])
                except ValueError:
                    words = []
                for word in words:
                    name, eq, value = word.partition("=")
                    if eq:
                        env[name] = value
                        if "--" in value or shell.mentions(value):
                            # `Environment="SGLANG_ARGS=--x"` (a drop-in), expanded as $SGLANG_ARGS by ExecStart=
                            problems.append((len(out) + 1, f"Environment={name} holds what looks like SGLang launch "
                                             "flags, which the tool does not follow into ExecStart=; check and fix "
                                             "them by hand", value, "variable"))
            elif match and match.group(2) == "EnvironmentFile":
                path = line[match.end():].strip().lstrip("-")
                read = read_env_file(path, origin)
                if read is None:
                    files[path] = ""  # it overrides Environment=: an added compact line never beats it
                    problems.append((len(out) + 1, f"EnvironmentFile={path} cannot be read here; the variables "
                                     "it sets (they override Environment=) are not checked"))
                else:
                    env.update(read)
            out.append(_blank(line))
        continued = (continued or bool(match and match.group(2) in EXEC_KEYS)) and line.endswith("\\")
        offset += len(line) + 1
    env.update(_dropin_env(origin))
    masked = "\n".join(out)
    parsed = shell.parse_script(masked, _guard("$%"), fmt="systemd")
    problems.extend(_problems(parsed))
    sites = []
    for site in parsed.sites:
        if "docker run" in site.env_hint:  # the unit's environment does not reach the container
            sites.append(site)
            continue
        site.env = {**env, **site.env}
        at = max((o for o in exec_starts if o <= _site_offset(site, masked)), default=None)
        site.set_env = _systemd_setter(text, at) if at is not None else None
        site.env_hint = "add `Environment=NAME=VALUE` to the [Service] section"
        sites.append(site)
    return Document(sites=sites, errors=problems)


def _dropin_env(origin: str | None) -> dict[str, str]:
    """`Environment=` of the unit's drop-ins (`sglang.service.d/*.conf` beside it), which systemd
    applies after the unit: an explicit value there wins over the unit's own (and over a line the
    fix would add), so it is the value in effect."""
    import os
    import shlex

    if not origin or not origin.endswith(".service"):
        return {}
    folder = origin + ".d"
    env: dict[str, str] = {}
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".conf"))
    except OSError:
        return {}
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                lines = handle.read().split("\n")
        except OSError:
            continue
        for line in lines:
            match = re.match(r"^\s*Environment\s*=\s*", line)
            if not match:
                continue
            try:
                words = shlex.split(line[match.end():])
            except ValueError:
                continue
            for word in words:
                key, eq, value = word.partition("=")
                if eq:
                    env[key] = value
    return env


def _site_offset(site: Site, text: str) -> int:
    lines = text.split("\n")
    return sum(len(line) + 1 for line in lines[:site.line - 1])


def _systemd_setter(text: str, at: int):
    def set_env(name: str, value: str) -> list[TextEdit] | None:
        if any(ch in value for ch in ' "\\$%'):
            return None
        return [TextEdit(at, at, f"Environment={name}={value}\n")]

    return set_env


# --------------------------------------------------------------------------- env files


def parse_env_text(text: str) -> dict[str, str]:
    """`NAME=VALUE` lines of an env file (compose `env_file:`, systemd `EnvironmentFile=`)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        name, eq, value = line.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        env[name.strip()] = value
    return env


def read_env_file(path: str, origin: str | None) -> dict[str, str] | None:
    """The variables of an env file named by another file (relative to that file's folder),
    or None when it cannot be read."""
    if not path:
        return None
    candidates = [path] if os.path.isabs(path) else []
    if origin and not os.path.isabs(path):
        candidates.append(os.path.join(os.path.dirname(origin) or ".", path))
    for candidate in candidates:
        try:
            with open(candidate, encoding="utf-8", errors="surrogateescape") as handle:
                return parse_env_text(handle.read())
        except OSError:
            continue
    return None


def read_envfile(text: str) -> Document:
    """An env file: `NAME=VALUE` lines, the value running to the end of the line. A value
    holding a launch (`SGLANG_CMD=python3 -m sglang.launch_server ...`, run by compose as
    `command: ${SGLANG_CMD}`) is read and fixed as a command line; a value holding launch
    flags (`SGLANG_ARGS=--x`) is reported, since whoever reads the file expands it."""
    out: list[str] = []
    errors: list = []
    for number, line in enumerate(text.split("\n"), 1):
        match = re.match(r"^(\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*=)(.*)$", line)
        if match is None or line.lstrip().startswith("#"):
            out.append(_blank(line))
            continue
        value = match.group(2)
        if shell.mentions(value):
            quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
            body = value[1:-1] if quoted else value
            out.append(" " * (len(match.group(1)) + (1 if quoted else 0)) + body + (" " if quoted else ""))
        else:
            if "--" in value:
                errors.append((number, f"{match.group(1).strip()[:-1]} holds what looks like SGLang launch flags; "
                               "whoever reads this file expands it where the tool does not follow it: check and fix "
                               "it by hand", value, "variable"))
            out.append(_blank(line))
    parsed = shell.parse_script("\n".join(out), _guard("\"'$`\\"), fmt="env")
    return Document(sites=list(parsed.sites), errors=errors + _problems(parsed))
