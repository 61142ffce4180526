"""Files in and out: walk paths, skip what is not text, migrate each file, write atomically."""

from __future__ import annotations

import difflib
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from sglaunch.migrate.engine import (DEPENDENCY_FORMATS, DOCUMENT_NAMES, ConvergenceError, Result, detect_format,
                                     migrate_text)
from sglaunch.migrate.evaluate import ERROR, Finding
from sglaunch.migrate.kinds import STDIN  # re-exported
from sglaunch.migrate.rules import Rule

MAX_BYTES = 4 * 1024 * 1024
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__",
                       ".mypy_cache", ".pytest_cache", ".tox", "site-packages", ".ruff_cache", ".nox",
                       ".eggs", ".cache", ".idea", ".terraform", ".direnv"})
# Hidden folders that hold CI and deployment files are walked; other hidden folders are not.
HIDDEN_WALKED = frozenset({".github", ".gitlab", ".circleci", ".buildkite", ".ci", ".devcontainer",
                           ".docker", ".deploy", ".k8s", ".helm", ".slurm", ".jenkins", ".drone", ".woodpecker",
                           ".tekton", ".azure-pipelines", ".config", ".vscode"})
BOM = "\ufeff"


@dataclass
class FileReport:
    path: str
    fmt: str | None = None
    original: str = ""
    migrated: str = ""
    findings: list[Finding] = field(default_factory=list)
    note: str | None = None  # skipped: why
    error: str | None = None  # unreadable or left unchanged on purpose
    written: bool = False

    @property
    def changed(self) -> bool:
        return self.migrated != self.original

    def diff(self) -> str:
        if not self.changed:
            return ""
        name = self.path
        lines = difflib.unified_diff(self.original.splitlines(keepends=True),
                                     self.migrated.splitlines(keepends=True),
                                     fromfile=name if name != STDIN else "<stdin>",
                                     tofile=name if name != STDIN else "<stdout>")
        return display("".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                               for line in lines))


# Files the launches read or run (`--config FILE`, `./serve.sh`), queued by `process_file` and
# read by `iter_files` after the paths it was given (each file once).
_FOLLOW: list[tuple[str, str]] = []  # (path, format or "" when its name tells)
_FOLLOWED: dict[str, str] = {}  # yielded from _FOLLOW -> the format to read it in (a --format is not forced)
_READ: set[str] = set()  # real paths of the files read (reported) since iter_files started
FOLLOWED_KINDS = {"config": (".yaml", ".yml"), "requirements": (".txt", ".in"), "env": ("",),
                  "": (".sh", ".bash", ".slurm", ".sbatch")}


def iter_files(paths: Sequence[str]) -> Iterator[tuple[str, bool]]:
    """(path, named explicitly) for every file under `paths`, in a stable order; then the
    files their launches read or run that were not among them (`follow`)."""
    _FOLLOW.clear()
    _FOLLOWED.clear()
    _READ.clear()
    seen: set[str] = set()
    for raw in paths:
        if raw == STDIN:
            yield raw, True
            continue
        path = Path(raw)
        for found, explicit in ([(str(f), False) for f in _walk(path)] if path.is_dir() else [(raw, True)]):
            if os.path.realpath(found) not in seen:  # a file named and also under a named folder: once
                seen.add(os.path.realpath(found))
                yield found, explicit
    while _FOLLOW:
        found, fmt = _FOLLOW.pop(0)
        if os.path.realpath(found) not in _READ:  # a walk may have passed it by its name (`base.txt`)
            _READ.add(os.path.realpath(found))
            _FOLLOWED[found] = fmt
            yield found, True


def follow(origin: str, written: str) -> str | None:
    """The file a launch in `origin` names as `written` (`--config serve.yaml`, `./serve.sh`), looked
    up next to `origin`, in its parent folders up to its repository's root (a workflow runs from
    there) and in the current folder; None when it is absolute (a path inside a container), has
    `..` or a variable, lies outside the repository and the current folder, or is not there."""
    if os.path.isabs(written) or written.startswith("~") or "$" in written or ".." in Path(written).parts:
        return None
    folder = Path(origin).resolve().parent
    root = next((p for p in [folder, *folder.parents][:8] if (p / ".git").exists()), None)
    cwd = Path.cwd().resolve()
    bases = [folder, *[p for p in folder.parents if root is not None and p.is_relative_to(root)], cwd]
    for base in bases:
        candidate = (base / written).resolve()
        inside = candidate.is_relative_to(cwd) or (root is not None and candidate.is_relative_to(root))
        if inside and candidate.is_file():
            shown = os.path.relpath(candidate)
            return shown if not shown.startswith("..") else str(candidate)
    return None


def _walk(root: Path) -> Iterable[Path]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and (not d.startswith(".") or d in HIDDEN_WALKED)
                         and not os.path.isfile(os.path.join(folder, d, "pyvenv.cfg")))
        for name in sorted(files):
            yield Path(folder) / name


def read_text(path: str, stdin_text: str | None = None) -> tuple[str | None, str | None]:
    """(text, None) or (None, why it is skipped)."""
    if path == STDIN:
        return stdin_text or "", None
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            return None, f"skipped: {size // 1024} KiB is larger than the {MAX_BYTES // 1024 // 1024} MiB limit"
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise OSError(f"cannot read {path}: {exc.strerror or exc}") from None
    if b"\x00" in data[:8192]:
        return None, "skipped: binary file"
    # Bytes that are not UTF-8 (a Latin-1 comment, say) are carried through unchanged as
    # surrogate escapes; the file is written back byte for byte outside the edits.
    return data.decode("utf-8", "surrogateescape"), None


def process_file(path: str, explicit: bool, rules: Sequence[Rule], to_release: str,
                 unsafe_fixes: bool, forced_format: str | None = None,
                 stdin_text: str | None = None) -> FileReport | None:
    """Migrate one file in memory; None for files a directory walk should not mention."""
    report = FileReport(path)
    try:
        text, note = read_text(path, stdin_text)
    except OSError as exc:
        report.error = str(exc)
        report.findings.append(Finding("read", ERROR, 0, str(exc)))
        return report
    if text is None:
        report.note = note
        return report if explicit else None
    report.original = report.migrated = text
    if path in _FOLLOWED:
        forced_format = _FOLLOWED[path] or None
    fmt = forced_format or detect_format(path if path != STDIN else "", text, loose=explicit)
    # read as shell for want of a better reader (a Nomad job, tox.ini, a file with no telling name)
    unknown_kind = fmt is None or (fmt == "shell" and not forced_format and not _told_shell(path, text))
    if fmt is None:
        if not explicit and not _launch_in_unknown_kind(path, text, rules, to_release):
            return None
        fmt = "shell"
    report.fmt = fmt
    bom = text.startswith(BOM)
    work = text[1:] if bom else text
    crlf = "\r\n" in work and work.count("\r\n") == work.count("\n")
    if crlf:  # every line ends in CRLF: migrate with LF, put CR back (lone CRs are kept)
        work = work.replace("\r\n", "\n")
    escaped = _has_surrogates(work)
    if escaped:
        if any(PUA_LOW <= ord(c) < PUA_LOW + 0x100 for c in work):
            report.note = "skipped: not UTF-8 text"
            return report if explicit else None
        work = work.translate(_TO_PUA)
    try:
        result: Result = migrate_text(work, fmt, rules, to_release, unsafe_fixes,
                                      origin=path if path != STDIN else None)
    except ConvergenceError as exc:
        report.error = str(exc)
        report.findings.append(Finding("engine", ERROR, 0, str(exc)))
        return report
    except RecursionError:
        report.error = "the file nests too deeply to be read"
        report.findings.append(Finding("read", ERROR, 0, report.error))
        return report
    except Exception as exc:  # a reader bug must not stop the other files, nor pass this one
        report.error = f"internal error while reading this file ({type(exc).__name__}: {exc}); please report it"
        report.findings.append(Finding("read", ERROR, 0, report.error))
        return report
    migrated = result.text
    if escaped:
        migrated = migrated.translate(_FROM_PUA)
    if crlf:
        migrated = migrated.replace("\n", "\r\n")
    report.migrated = (BOM if bom else "") + migrated

    report.findings = result.findings
    if unknown_kind:
        from sglaunch.migrate.deps import loose_pins

        report.findings += _unread_launches(work, result.findings, rules, to_release)
        report.findings += loose_pins(work, rules, to_release, {f.line for f in result.findings
                                                                  if f.rule_id.startswith("R")})
        if not explicit:
            # found by a walk in a file of a kind it does not know: reported, never rewritten
            # (name the file to have it read as shell, fixes included)
            import dataclasses

            from sglaunch.migrate.evaluate import FIX, MANUAL, UNSAFE

            report.migrated = report.original
            report.findings = [dataclasses.replace(f, level=MANUAL, ops=(), message=f.message + " (a file of a "
                                                   "kind the walk does not rewrite: name it to fix it as shell)")
                               if f.level in (FIX, UNSAFE) else f for f in report.findings]
    if fmt not in DEPENDENCY_FORMATS and path != STDIN:
        report.findings += _flag_files(path, work, rules, to_release)
    if fmt in ("pyproject", "setupcfg", "pipfile"):
        # a tool table holding launch flags (`[tool.x] args = ["--x"]`), a setup.cfg section of a
        # launcher's own: nothing there is read as a launch, so a rule's flag is reported
        report.findings += _unread_launches(work, result.findings, rules, to_release)
    report.error = result.error
    if path != STDIN:
        for written, kind in result.follow:
            target = follow(path, written)
            if target is not None and target.endswith(FOLLOWED_KINDS.get(kind, ())):
                _FOLLOW.append((target, kind))
    if not explicit and not result.sites and not result.deps and not report.findings \
            and fmt not in DEPENDENCY_FORMATS:
        return None
    if path != STDIN:
        _READ.add(os.path.realpath(path))
    return report


# documents and data: a launch mentioned there is an example, not a launch
DOCUMENT_SUFFIXES = (".md", ".rst", ".txt", ".adoc", ".html", ".htm", ".csv", ".tsv", ".log", ".json",
                     ".jsonl", ".lock", ".svg", ".xml", ".tex", ".org", ".patch", ".diff")


def _launch_in_unknown_kind(path: str, text: str, rules: Sequence[Rule] = (), release: str = "") -> bool:
    """A file of a kind the walk does not know (a Nomad job, tox.ini, a Jenkinsfile, a notebook,
    a TOML or HCL file of flags) that names an SGLang launcher or a rule's flag: read as shell,
    and what cannot be read there is reported."""
    from sglaunch.migrate.engine import suspicious
    from sglaunch.migrate.shell import mentions

    if path.lower().endswith(DOCUMENT_SUFFIXES) or os.path.basename(path).upper().split(".")[0] in DOCUMENT_NAMES:
        return False
    if OUR_PIN.search(text):  # `deps = sglang==0.5.15` in a tox.ini
        return True
    if mentions(text):
        return True
    if not rules:
        return False
    return ("--" in text and bool(suspicious(text, rules, release))) or bool(_flag_keys(text, rules, release))


OUR_PIN = re.compile(r"(?i)(?<![\w.-])(sglang|flashinfer[-_.]python)(\[[^\]\s]*\])?\s*(===|==|~=|>=|<=|<|!=)\s*[0-9]")
FLAG_KEY_LINE = re.compile(r'(?m)^[ \t]*"?([a-z][a-z0-9]*(?:[-_][a-z0-9]+)+)"?[ \t]*[=:]')


def _flag_keys(text: str, rules: Sequence[Rule], release: str) -> list[tuple[int, str]]:
    """(line, flag) of `enable-deepep-waterfill = true` / `enable_deepep_waterfill: true` keys
    (TOML, HCL, INI) that name a rule's flag."""
    from sglaunch.migrate.engine import suspicious

    found = []
    for match in FLAG_KEY_LINE.finditer(text):
        flag = "--" + match.group(1).replace("_", "-")
        rest = text[match.end():text.find("\n", match.end()) if "\n" in text[match.end():] else len(text)]
        hit = suspicious(f"{flag} {rest.strip().strip(chr(34) + chr(39))}", rules, release)
        if hit:
            found.append((text.count("\n", 0, match.start(1)) + 1, hit))
    return found


def _told_shell(path: str, text: str) -> bool:
    from sglaunch.migrate.engine import SCRIPT_NAMES

    name = os.path.basename(path).lower()
    first = text.lstrip("\ufeff").split("\n", 1)[0]
    return name.endswith(SCRIPT_NAMES) or name in ("singularity", "apptainer") \
        or name.endswith((".def", ".singularity")) \
        or (first.startswith("#!") and any(s in first for s in ("sh", "bash", "zsh", "ksh")))


def _unread_launches(text: str, findings: list, rules: Sequence[Rule], release: str) -> list:
    """In a file whose kind the tool does not know (read as shell at best): a line naming a
    launcher, with a rule's flag on it or on the lines after it up to a blank line, where no
    finding was reported, is `manual`: the tool could not read that launch."""
    from sglaunch.migrate.engine import suspicious
    from sglaunch.migrate.evaluate import MANUAL
    from sglaunch.migrate.shell import mentions

    reported = {f.line for f in findings}
    lines = text.split("\n")
    out = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith(("#", "//")):
            continue
        if not mentions(line):
            # no launcher on the line, but a rule's flag (`SGLANG_ARGS = "--enable-deepep-waterfill"`
            # in an HCL file, a notebook cell continued from the line above)
            flag = suspicious(line, rules, release) if "--" in line else ""
            if flag and number not in reported:
                out.append(Finding("unread", MANUAL, number, "an SGLang flag in a place the tool does not read as a "
                                   f"launch ({flag}); check and fix it by hand", token=flag))
                reported.add(number)
            continue
        block = []
        for k in range(number - 1, min(number + 14, len(lines))):
            if k > number - 1 and not lines[k].strip():
                break
            block.append(k + 1)
        flag = suspicious(" ".join(lines[k - 1] for k in block), rules, release)
        if flag and not reported & set(block):
            out.append(Finding("unread", MANUAL, number, "an SGLang launch in a file whose kind the tool does not "
                               f"read ({flag}); check and fix it by hand", token=flag))
            reported.update(block)
    for number, flag in _flag_keys(text, rules, release):
        if number not in reported:
            out.append(Finding("unread", MANUAL, number, f"the key on this line names the SGLang flag ({flag}), in a "
                               "file whose kind the tool does not read; check and fix it by hand", token=flag))
            reported.add(number)
    return out


# a launch that takes its flags from a file: `$(cat flags.txt)`, `$(< flags.txt)`, `xargs -a args.txt`,
# `cat args.txt | xargs ...`, `xargs ... < args.txt`
FLAG_FILE = re.compile(r"\$\(\s*(?:cat\s+|<\s*)([^\s)$`;|&]+)\s*\)"
                       r"|\bxargs\b[^|\n]*?(?:-a\s*|--arg-file[ =])([^\s;|&]+)"
                       r"|\bcat\s+([^\s;|&$]+)\s*\|\s*xargs\b"
                       r"|\bxargs\b[^|\n]*<\s*([^\s;|&$]+)")


def _flag_files(path: str, text: str, rules: Sequence[Rule], release: str) -> list:
    """A launch whose flags come from a file (`$(cat flags.txt)`, `xargs -a args.txt`): the file
    is read, and a rule's flag in it is `manual` at the launch's line (the tool does not rewrite
    flag files; a file it cannot find is a notice)."""
    from sglaunch.migrate.engine import suspicious
    from sglaunch.migrate.evaluate import INFO, MANUAL
    from sglaunch.migrate.shell import mentions

    out = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if "cat" not in line and "xargs" not in line and "$(<" not in line:
            continue
        window = " ".join(lines[max(0, number - 4):number + 3])
        for match in FLAG_FILE.finditer(line):
            if not mentions(window):
                continue
            written = next(g for g in match.groups() if g)
            found = follow(path, written.strip("\"'"))
            if found is None:
                out.append(Finding("unread", INFO, number, f"the launch reads flags from {written}, which is not "
                                   "there to check; the flags it passes are not checked", token=written))
                continue
            try:
                content, _ = read_text(found)
            except OSError:
                content = None
            flag = suspicious(content or "", rules, release)
            if flag:
                out.append(Finding("unread", MANUAL, number, f"the launch reads its flags from {written}, which holds "
                                   f"{flag}; the tool does not rewrite flag files: fix {written} by hand", token=flag))
    return out


# Undecodable bytes arrive as lone surrogates (U+DC80-U+DCFF, from surrogateescape). The
# parsers get one private-use character per byte instead (valid UTF-8, printable YAML), so
# offsets stay the same; the migrated text is translated back before it is written.
PUA_LOW = 0xF700
_TO_PUA = {0xDC00 + b: PUA_LOW + b for b in range(0x80, 0x100)}
_FROM_PUA = {v: k for k, v in _TO_PUA.items()}


def _has_surrogates(text: str) -> bool:
    return any("\udc80" <= c <= "\udcff" for c in text)


def display(text: str) -> str:
    """Text safe to print: undecodable bytes shown as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if _has_surrogates(text) else text


def write_atomic(path: str, text: str) -> None:
    """Write via a temp file in the same folder, keep the permissions, then rename over."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target) or "."
    mode = stat.S_IMODE(os.stat(target).st_mode)
    fd, temp = tempfile.mkstemp(prefix=".sglaunch-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8", "surrogateescape"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
