"""Generate per-release SGLang launch-flag data from the release wheels, without importing SGLang.

    python -m sglaunch.flags.extract --releases 0.5.15,0.5.16 [--wheel-dir DIR] [--out DIR]

For each release it finds (or `pip download --no-deps`s) the wheel, reads the sources straight out
of the zip and rebuilds, with `ast` only, the argparse parser that `prepare_server_args` builds:
the `ServerArgs` fields as that release's `arg_groups/arg_utils.add_cli_args_from_dataclass`
derives them (bool -> store_true, Optional[X] unwrapped, List[X] -> nargs "+", Literal -> choices,
cli_name, aliases, custom actions, required when no default), followed by the manual
`parser.add_argument` calls of `ServerArgs.add_cli_args` (deprecated spellings, dynamic choices,
`--config`). Names the code computes (choice lists, defaults, f-string help) are evaluated by a
small static interpreter that follows imports inside the wheel; what it cannot compute is written as
`{"expr": "<source>"}`.

Output, one JSON file per release (`sglaunch/flags/sglang/<release>.json`):

    {"release", "wheel", "sha256", "extractor": 1, "flags": [...], "env": [...]}

Each flag (one per argparse action, sorted by name; every option string appears exactly once):

- `name`: the first option string (what argparse shows first); `aliases`: the others. A
  `BooleanOptionalAction` contributes its `--no-X` spellings as aliases, as argparse does.
- `dest`; `action`: "store", "store_true", ... or the custom action class name.
- `type`: "str" | "int" | "float" | "json" (`json.loads`) | "<callable name>" for value-taking
  actions (a store action without `type=` is "str"), null when the action takes no value.
- `nargs`: as argparse stores it: null means exactly one value, 0 means no value (switches,
  `Deprecated*Action` flags with `nargs=0`), or "?", "*", "+", an int.
- `choices`: the values as Python/argparse holds them (strings, or ints for int-typed flags; a
  set is sorted) or null. `choices_open`: true when the list is not fixed by the code alone: part
  of it could not be resolved (unresolved entries are then kept as `{"expr": ...}`), it depends on
  an environment variable, or it comes from a plugin registry. `choices_open_reason`: why (or null).
  `choices_extensible`: true when the list is one of SGLang's public extension points (a
  module-level list with an `add_*_choices` adder, e.g. QUANTIZATION_CHOICES): out-of-tree
  plugins may append values at runtime, but a stock install accepts exactly `choices`.
- `default`: JSON value, "==SUPPRESS==" for `argparse.SUPPRESS`, `{"expr": "<source>"}` otherwise.
- `help`: the help text, `%(default)s` left as is ("==SUPPRESS==" for hidden flags).
- `deprecated`: null or {"replaced_by": "--flag" | null, "message": str | null,
  "new_flag": str | null, "error": bool}. `new_flag` is SGLang's own `new_flag=` text (it may carry
  a value, e.g. "--cuda-graph-backend-prefill=breakable", or name several flags); `replaced_by`
  is the single flag it names (value stripped), null when it names none or several; `error` is
  true when the spelling makes argparse stop (`DeprecatedAction(error_message=...)`). Flags whose
  help text starts with "Deprecated"/"[Deprecated]"/"(Deprecated" count as deprecated too.
- `const`: what the action stores when given without a value (store_const, DeprecatedStoreConst's
  `const_value`, the `True` of DeprecatedStoreTrueAction), else null.
- `required`; `group`: the section banner comment the declaration sits under (e.g. "Model and
  tokenizer"), null if none; `namespace`: the field's config namespace (`NS(...)` marker or the
  declaring class's `_NS_PATH`, releases >= 0.5.17), else null; `field`: true when the flag comes
  from a `ServerArgs` field, false for a manual `add_argument`; `fallback`: the field's
  `Arg(fallback=...)` (0.5.20+: the value SGLang uses when the flag is left at its None default),
  else null.

Each env entry (from `sglang/srt/environ.py`'s `Envs` class): {"name", "type": "bool" | "int" |
"float" | "str" | "tuple" | "json" | "<class name>", "default", "deprecated_name": str | null}.

`-h/--help` (argparse's own) is not listed. Env-dependent conditions are evaluated with the
variables' declared defaults (and the result marked open); help texts are as Python 3.11 builds
them (SGLang ships cp311 wheels), e.g. a `{fn.__doc__}` keeps its indentation. Post releases get
no file of their own unless their flags differ (0.5.15.post1 is 0.5.15's;
`release_diff.load_release_data` falls back). `KNOWN_DERIVATIONS` fingerprints the
`add_cli_args_from_dataclass` bodies this module reproduces; a new shape is reported as a warning.
Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterable

EXTRACTOR_VERSION = 1
DEFAULT_RELEASES = tuple(f"0.5.{n}" for n in range(15, 24))
DEFAULT_OUT = Path(__file__).resolve().parent / "sglang"
DEFAULT_WHEEL_DIR = Path.home() / ".cache" / "sglaunch" / "sglang-wheels"
SUPPRESS = "==SUPPRESS=="

# Fingerprints of the derivation function bodies we reproduce (ast.dump, docstring dropped).
# An unknown fingerprint means a release changed how fields become flags: check it by hand.
KNOWN_DERIVATIONS = {"b0f15745", "579dd7d6"}


class CannotEval(Exception):
    """The static interpreter cannot compute this expression."""


class Unresolved:
    """A value that could not be computed; keeps its source text."""

    def __init__(self, src: str):
        self.src = src

    def __repr__(self) -> str:
        return f"<unresolved {self.src}>"


class ExternalRef:
    """Something outside the wheel (stdlib, torch, ...), known only by its dotted name."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Instance:
    """The result of calling a class defined in the wheel: class plus call arguments."""

    def __init__(self, cls: "ClassObj", args: list, kwargs: dict):
        self.cls, self.args, self.kwargs = cls, args, kwargs


class EnumMember:
    def __init__(self, cls: "ClassObj", name: str, value: Any):
        self.cls, self.name, self.value = cls, name, value


class FuncObj:
    def __init__(self, node, module: "ModuleObj", closure: dict | None = None):
        self.node, self.module, self.closure = node, module, closure or {}
        self.name = getattr(node, "name", "<lambda>")


class BoundMethod:
    def __init__(self, obj: Any, func: FuncObj):
        self.obj, self.func = obj, func


NOT_HANDLED = object()


class _Return(Exception):
    def __init__(self, value):
        self.value = value


_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in ("list", "set", "dict", "tuple", "sorted", "str", "int", "float", "bool", "len",
                 "range", "enumerate", "zip", "reversed", "min", "max", "any", "all", "frozenset",
                 "repr", "abs", "round")
}
_SAFE_METHODS = {
    str: {"lower", "upper", "replace", "strip", "lstrip", "rstrip", "split", "join", "format",
          "startswith", "endswith", "title", "capitalize"},
    list: {"copy", "index", "count", "append", "extend", "insert", "remove", "pop"},
    dict: {"keys", "values", "items", "get", "copy", "update", "setdefault", "pop"},
    set: {"union", "copy", "add", "update", "discard", "remove", "difference", "intersection"},
    frozenset: {"union", "copy", "difference", "intersection"},
    tuple: {"index", "count"},
}
_MUTATORS = {"append", "extend", "add", "update", "insert", "remove", "discard", "pop",
             "setdefault"}
_EXTERNAL_VALUES = {"argparse.SUPPRESS": SUPPRESS, "sys.maxsize": sys.maxsize}


# --------------------------------------------------------------------------------------------
# Reading the wheel
# --------------------------------------------------------------------------------------------


class Wheel:
    """Python sources of one wheel, read lazily from the zip (or from a dict, for tests)."""

    def __init__(self, path: Path | None = None, files: dict[str, str] | None = None):
        self.path = path
        self._zip = zipfile.ZipFile(path) if path is not None else None
        self._files = files
        self._names = set(files) if files is not None else set(self._zip.namelist())
        self._modules: dict[str, ModuleObj] = {}

    def read(self, name: str) -> str | None:
        if name not in self._names:
            return None
        if self._files is not None:
            return self._files[name]
        return self._zip.read(name).decode("utf-8")

    def module_path(self, modname: str) -> tuple[str, bool] | None:
        base = modname.replace(".", "/")
        if base + ".py" in self._names:
            return base + ".py", False
        if base + "/__init__.py" in self._names:
            return base + "/__init__.py", True
        return None

    def module(self, modname: str) -> "ModuleObj | ExternalRef":
        if modname in self._modules:
            return self._modules[modname]
        found = self.module_path(modname)
        if found is None:
            if any(n.startswith(modname.replace(".", "/") + "/") for n in self._names):
                mod = ModuleObj(self, modname, "", is_package=True)  # namespace package
            else:
                return ExternalRef(modname)
        else:
            mod = ModuleObj(self, modname, self.read(found[0]) or "", is_package=found[1])
        self._modules[modname] = mod
        return mod


def _names_touched(stmt: ast.stmt) -> set[str]:
    """Module-level names a statement binds or mutates in place."""
    out: set[str] = set()
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    out.add(n.id)
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        for a in stmt.names:
            out.add(a.asname or a.name.split(".")[0])
    elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        out.add(stmt.name)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        if isinstance(f, ast.Attribute) and f.attr in _MUTATORS and isinstance(f.value, ast.Name):
            out.add(f.value.id)
    return out


class ModuleObj:
    """A module of the wheel whose top-level names are evaluated lazily, one name at a time."""

    def __init__(self, wheel: Wheel, name: str, source: str, is_package: bool = False):
        self.wheel, self.name, self.source, self.is_package = wheel, name, source, is_package
        self.tree = ast.parse(source) if source else ast.Module(body=[], type_ignores=[])
        self.values: dict[str, Any] = {}
        self._busy: set[str] = set()
        # name -> [(stmt, guards)] where guards is a tuple of (if-test, taken-branch) pairs
        self._index: dict[str, list] = {}
        self._build_index(self.tree.body, ())

    def _build_index(self, body: list, guards: tuple) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                self._build_index(stmt.body, guards + ((stmt.test, True),))
                self._build_index(stmt.orelse, guards + ((stmt.test, False),))
            elif isinstance(stmt, ast.Try):
                self._build_index(stmt.body, guards)
                for h in stmt.handlers:
                    self._build_index(h.body, guards + ((None, "except"),))
            else:
                for n in _names_touched(stmt):
                    self._index.setdefault(n, []).append((stmt, guards))

    def has(self, name: str) -> bool:
        return name in self._index

    def lookup(self, ev: "Evaluator", name: str) -> Any:
        if name in self.values:
            return self.values[name]
        if name in self._busy:
            raise CannotEval(f"cycle on {self.name}.{name}")
        if name not in self._index:
            if self.is_package:
                sub = self.wheel.module(f"{self.name}.{name}")
                if isinstance(sub, ModuleObj):
                    return sub
            raise CannotEval(f"{self.name} has no {name}")
        self._busy.add(name)
        try:
            value = self._run_statements(ev, name)
        finally:
            self._busy.discard(name)
        self.values[name] = value
        return value

    def _run_statements(self, ev: "Evaluator", name: str) -> Any:
        scope = Scope(self)
        reasons: set[str] = set()
        bound_in_try = any(not any(g[1] == "except" for g in gs) for _, gs in self._index[name])
        for stmt, guards in self._index[name]:
            if bound_in_try and any(g[1] == "except" for g in guards):
                continue  # the try body succeeded (statically); its except fallback does not run
            taken = True
            for test, branch in guards:
                if test is None:
                    continue
                try:
                    cond, why = ev.eval_tainted(test, scope)
                    reasons |= why
                    if bool(cond) != branch:
                        taken = False
                except CannotEval:
                    reasons.add(f"depends on `{_src(test)}`")
                    taken = not branch  # assume an unknown condition is false
                if not taken:
                    break
            if not taken:
                continue
            prior = scope.locals.get(name, MISSING)
            try:
                ev.exec_stmt(stmt, scope)
            except CannotEval:
                if name not in scope.locals:
                    scope.locals[name] = Unresolved(_src(stmt))
            # A later rebinding we cannot follow (e.g. `X = msgspec.defstruct(...)`) keeps the
            # last binding we could compute.
            if isinstance(scope.locals.get(name), Unresolved) and prior is not MISSING \
                    and not isinstance(prior, Unresolved):
                scope.locals[name] = prior
        value = scope.locals.get(name, Unresolved(name))
        if reasons:
            ev.mark_open(value, reasons)
        return value


class ClassObj:
    """A class defined in the wheel; its body is evaluated lazily like a module."""

    def __init__(self, node: ast.ClassDef, module: ModuleObj):
        self.node, self.module, self.name = node, module, node.name
        self._values: dict[str, Any] = {}
        self._bases: list | None = None

    def bases(self, ev: "Evaluator") -> list:
        if self._bases is None:
            self._bases = []
            for b in self.node.bases:
                try:
                    self._bases.append(ev.eval(b, Scope(self.module)))
                except CannotEval:
                    self._bases.append(ExternalRef(_src(b)))
        return self._bases

    def mro_names(self, ev: "Evaluator") -> list[str]:
        out = [self.name]
        for b in self.bases(ev):
            out += b.mro_names(ev) if isinstance(b, ClassObj) else [getattr(b, "name", str(b))]
        return out

    def is_enum(self, ev: "Evaluator") -> bool:
        return any(n.split(".")[-1] in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag")
                   for n in self.mro_names(ev))

    def body_names(self) -> set[str]:
        if not hasattr(self, "_body_names"):
            self._body_names = set()
            for stmt in self.node.body:
                if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.ClassDef,
                                     ast.AsyncFunctionDef)):
                    self._body_names |= _names_touched(stmt)
        return self._body_names

    def body_scope(self, ev: "Evaluator") -> "Scope":
        """Names in a class body see the class attributes assigned before them."""
        cls = self

        class _ClassLocals(dict):
            def __contains__(self, key):
                return dict.__contains__(self, key) or key in cls.body_names()

            def __getitem__(self, key):
                if dict.__contains__(self, key):
                    return dict.__getitem__(self, key)
                try:
                    return cls.own(ev, key)
                except KeyError:
                    raise CannotEval(f"{cls.name}.{key}") from None

        return Scope(self.module, _ClassLocals())

    def own(self, ev: "Evaluator", name: str) -> Any:
        if name in self._values:
            return self._values[name]
        busy = self.__dict__.setdefault("_busy", set())
        if name in busy:
            raise CannotEval(f"cycle on {self.name}.{name}")
        busy.add(name)
        try:
            return self._own(ev, name)
        finally:
            busy.discard(name)

    def _own(self, ev: "Evaluator", name: str) -> Any:
        for stmt in reversed(self.node.body):  # the last binding in a class body wins
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                value: Any = FuncObj(stmt, self.module)
                if any(_src(d) in ("staticmethod", "classmethod") for d in stmt.decorator_list):
                    value = ("static", value)
                self._values[name] = value
                return value
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                self._values[name] = ClassObj(stmt, self.module)
                return self._values[name]
            targets = []
            if isinstance(stmt, ast.Assign):
                targets, value_node = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value_node = [stmt.target], stmt.value
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                value, _ = _field_default(ev, value_node, self.body_scope(ev))
                if self.is_enum(ev) and not name.startswith("_"):
                    value = EnumMember(self, name, value)
                self._values[name] = value
                return value
        raise KeyError(name)

    def attr(self, ev: "Evaluator", name: str) -> Any:
        try:
            return self.own(ev, name)
        except KeyError:
            pass
        for b in self.bases(ev):
            if isinstance(b, ClassObj):
                try:
                    return b.attr(ev, name)
                except CannotEval:
                    continue
        raise CannotEval(f"{self.name}.{name}")

    def attr_or_none(self, ev: "Evaluator", name: str) -> Any:
        try:
            return self.attr(ev, name)
        except CannotEval:
            return None

    def enum_members(self, ev: "Evaluator") -> list[EnumMember]:
        out = []
        for stmt in self.node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                stmt.targets[0], ast.Name
            ) and not stmt.targets[0].id.startswith("_"):
                m = self.own(ev, stmt.targets[0].id)
                if isinstance(m, EnumMember):
                    out.append(m)
        return out


class Scope:
    def __init__(self, module: ModuleObj, locals_: dict | None = None):
        self.module = module
        self.locals = locals_ if locals_ is not None else {}


def _src(node) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - best effort text
        return "<?>"


# --------------------------------------------------------------------------------------------
# The static interpreter
# --------------------------------------------------------------------------------------------


class Evaluator:
    """Evaluates expressions and simple statements over the wheel's modules."""

    def __init__(self, wheel: Wheel):
        self.wheel = wheel
        self._taint: list[set[str]] = []
        self._open: dict[int, tuple[Any, set[str]]] = {}
        self._depth = 0
        # Called on every call expression first; answers NOT_HANDLED to let it evaluate.
        self.intercept: Any = None
        self.special_calls: dict[str, Any] = {  # dotted "module.name" -> python callable
            "sys.modules.get": self._sys_modules_get,
        }

    def _sys_modules_get(self, name, default=None):
        # `sys.modules.get("x")` asks whether a plugin already imported (and extended) a
        # registry: a fresh process has not, but a launch with plugins may have.
        self.taint(f"runtime registry (plugins may register entries; sys.modules[{name!r}])")
        return default

    # ---- open/taint bookkeeping
    def mark_open(self, value: Any, reasons: set[str]) -> None:
        if isinstance(value, (list, set, dict, tuple, frozenset)) and reasons:
            prev = self._open.get(id(value), (value, set()))[1]
            self._open[id(value)] = (value, prev | set(reasons))

    def open_reasons(self, value: Any) -> set[str]:
        return set(self._open.get(id(value), (None, set()))[1])

    def taint(self, reason: str) -> None:
        if self._taint:
            self._taint[-1].add(reason)

    def eval_tainted(self, node, scope: Scope) -> tuple[Any, set[str]]:
        self._taint.append(set())
        try:
            value = self._eval(node, scope)
        finally:
            reasons = self._taint.pop()
        self.mark_open(value, reasons)
        if self._taint:
            self._taint[-1] |= reasons
        return value, reasons

    def eval(self, node, scope: Scope) -> Any:
        return self.eval_tainted(node, scope)[0]

    # ---- names
    def lookup(self, name: str, scope: Scope) -> Any:
        if name in scope.locals:
            value = scope.locals[name]
        elif scope.module.has(name):
            value = scope.module.lookup(self, name)
        elif name in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[name]
        elif name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        else:
            raise CannotEval(f"unknown name {name}")
        if isinstance(value, Unresolved):
            raise CannotEval(value.src)
        if id(value) in self._open:
            self._taint and self._taint[-1].update(self._open[id(value)][1])
        return value

    def resolve_import(self, modname: str, attr: str | None) -> Any:
        mod = self.wheel.module(modname)
        if attr is None:
            return mod
        if isinstance(mod, ExternalRef):
            return ExternalRef(f"{modname}.{attr}")
        try:
            return mod.lookup(self, attr)
        except CannotEval:
            sub = self.wheel.module(f"{modname}.{attr}")
            if isinstance(sub, ModuleObj):
                return sub
            raise

    def getattr(self, obj: Any, name: str) -> Any:
        if name == "__doc__" and isinstance(obj, (FuncObj, ClassObj)) and not isinstance(
            obj.node, ast.Lambda
        ):
            return ast.get_docstring(obj.node, clean=False)
        if name == "__name__" and isinstance(obj, (FuncObj, ClassObj)):
            return obj.name
        if isinstance(obj, ModuleObj):
            if obj.has(name):
                return obj.lookup(self, name)
            sub = self.wheel.module(f"{obj.name}.{name}")
            if isinstance(sub, ModuleObj):
                return sub
            raise CannotEval(f"{obj.name}.{name}")
        if isinstance(obj, ExternalRef):
            full = f"{obj.name}.{name}"
            return _EXTERNAL_VALUES.get(full, ExternalRef(full))
        if isinstance(obj, ClassObj):
            value = obj.attr(self, name)
            if isinstance(value, tuple) and value[0] == "static":
                return value[1]
            if isinstance(value, Unresolved):
                raise CannotEval(value.src)
            if isinstance(value, dict):
                # A class-level dict (`ReasoningParser.DetectorMap`) is a registry that plugins
                # write to at runtime.
                self.taint(f"runtime registry {obj.name}.{name}")
            return value
        if isinstance(obj, EnumMember):
            if name == "name":
                return obj.name
            if name == "value":
                return obj.value
            return self.getattr(obj.value, name)
        if isinstance(obj, Instance):
            if name in obj.kwargs and not isinstance(obj.cls.attr_or_none(self, name), FuncObj):
                return obj.kwargs[name]
            value = obj.cls.attr(self, name)
            if isinstance(value, FuncObj):
                return BoundMethod(obj, value)
            if isinstance(value, tuple) and value[0] == "static":
                return value[1]
            return value
        for typ, methods in _SAFE_METHODS.items():
            if type(obj) is typ and name in methods:
                return getattr(obj, name)
        raise CannotEval(f"attribute {name} of {type(obj).__name__}")

    def iterate(self, obj: Any) -> list:
        if isinstance(obj, ClassObj) and obj.is_enum(self):
            return obj.enum_members(self)
        if isinstance(obj, (list, tuple, set, frozenset, dict, str, range)):
            return list(obj)
        if isinstance(obj, (type({}.keys()), type({}.values()), type({}.items()))):
            return list(obj)
        raise CannotEval(f"cannot iterate {type(obj).__name__}")

    # ---- expressions
    def _eval(self, node, scope: Scope) -> Any:  # noqa: C901 - one dispatch over node types
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id, scope)
        if isinstance(node, ast.JoinedStr):
            return "".join(self._format_part(v, scope) for v in node.values)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items: list = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    items.extend(self.iterate(self.eval(elt.value, scope)))
                    continue
                try:
                    items.append(self.eval(elt, scope))
                except CannotEval:
                    self.taint(f"unresolved entry `{_src(elt)}`")
                    items.append(Unresolved(_src(elt)))
            if isinstance(node, ast.Tuple):
                return tuple(items)
            if isinstance(node, ast.Set):
                if any(isinstance(i, Unresolved) for i in items):
                    return [i for i in items]
                return set(items)
            return items
        if isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    out.update(self.eval(v, scope))
                    continue
                key = self.eval(k, scope)
                try:
                    out[key] = self.eval(v, scope)
                except CannotEval:
                    out[key] = Unresolved(_src(v))
            return out
        if isinstance(node, ast.Attribute):
            return self.getattr(self.eval(node.value, scope), node.attr)
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value, scope)
            index = self.eval(node.slice, scope)
            if isinstance(base, (list, tuple, dict, str)):
                return base[index]
            raise CannotEval(_src(node))
        if isinstance(node, ast.Slice):
            parts = [self.eval(p, scope) if p is not None else None
                     for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left, scope), self.eval(node.right, scope)
            self._check_plain(left, right)
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                   ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                   ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
                   ast.Pow: lambda a, b: a ** b, ast.BitOr: lambda a, b: a | b,
                   ast.BitAnd: lambda a, b: a & b, ast.LShift: lambda a, b: a << b}
            op = ops.get(type(node.op))
            if op is None:
                raise CannotEval(_src(node))
            try:
                return op(left, right)
            except Exception as e:  # noqa: BLE001
                raise CannotEval(str(e)) from None
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand, scope)
            self._check_plain(v)
            return {ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Not: lambda a: not a,
                    ast.Invert: lambda a: ~a}[type(node.op)](v)
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            value = None
            for part in node.values:
                value = self.eval(part, scope)
                self._check_plain(value)
                if bool(value) != is_and:
                    return value
            return value
        if isinstance(node, ast.Compare):
            left = self.eval(node.left, scope)
            for op, comp in zip(node.ops, node.comparators):
                right = self.eval(comp, scope)
                self._check_plain(left, right)
                ok = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
                      ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
                      ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
                      ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
                      ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
                      }[type(op)](left, right)
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            test = self.eval(node.test, scope)
            self._check_plain(test)
            return self.eval(node.body if test else node.orelse, scope)
        if isinstance(node, ast.Call):
            return self._call_node(node, scope)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return self._comprehension(node, scope)
        if isinstance(node, ast.Lambda):
            return FuncObj(node, scope.module, dict(scope.locals))
        raise CannotEval(_src(node))

    @staticmethod
    def _check_plain(*values) -> None:
        for v in values:
            if isinstance(v, (Unresolved, ExternalRef, ModuleObj, ClassObj, Instance, FuncObj)):
                raise CannotEval(repr(v))

    def _format_part(self, node, scope: Scope) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        value = self.eval(node.value, scope)
        if isinstance(value, EnumMember):
            value = value.value
        self._check_plain(value)
        conv = {-1: lambda x: x, 115: str, 114: repr, 97: ascii}[node.conversion]
        spec = self._eval(node.format_spec, scope) if node.format_spec is not None else ""
        return format(conv(value), spec)

    def _comprehension(self, node, scope: Scope) -> Any:
        results: list = []
        local = Scope(scope.module, dict(scope.locals))

        def loop(gens):
            if not gens:
                if isinstance(node, ast.DictComp):
                    results.append((self.eval(node.key, local), self.eval(node.value, local)))
                else:
                    results.append(self.eval(node.elt, local))
                return
            gen = gens[0]
            for item in self.iterate(self.eval(gen.iter, local)):
                self._assign(gen.target, item, local)
                if all(self.eval(c, local) for c in gen.ifs):
                    loop(gens[1:])

        loop(node.generators)
        if isinstance(node, ast.DictComp):
            return dict(results)
        if isinstance(node, ast.SetComp):
            return set(results)
        return results

    def _assign(self, target, value, scope: Scope) -> None:
        if isinstance(target, ast.Name):
            scope.locals[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = self.iterate(value) if not isinstance(value, tuple) else list(value)
            if len(values) != len(target.elts):
                raise CannotEval("unpack size")
            for t, v in zip(target.elts, values):
                self._assign(t, v, scope)
        elif isinstance(target, ast.Subscript):
            container = self.eval(target.value, scope)
            if not isinstance(container, (list, dict)):
                raise CannotEval(_src(target))
            container[self.eval(target.slice, scope)] = value
        else:
            raise CannotEval(_src(target))

    def _call_node(self, node: ast.Call, scope: Scope) -> Any:
        if self.intercept is not None:
            handled = self.intercept(node, scope)
            if handled is not NOT_HANDLED:
                return handled
        func = self.eval(node.func, scope)
        args: list = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self.iterate(self.eval(a.value, scope)))
                continue
            try:
                args.append(self.eval(a, scope))
            except CannotEval:
                args.append(Unresolved(_src(a)))
        kwargs: dict = {}
        for k in node.keywords:
            if k.arg is None:
                kwargs.update(self.eval(k.value, scope))
            else:
                try:
                    kwargs[k.arg] = self.eval(k.value, scope)
                except CannotEval:
                    kwargs[k.arg] = Unresolved(_src(k.value))
        return self.call(func, args, kwargs, node)

    def call(self, func: Any, args: list, kwargs: dict, node=None) -> Any:
        if isinstance(func, ExternalRef):
            special = self.special_calls.get(func.name)
            if special is not None:
                return special(*args, **kwargs)
            if func.name.split(".")[-1] == "field" and func.name.split(".")[0] in (
                "dataclasses", "msgspec"
            ):
                return ("field", kwargs)
            raise CannotEval(f"call to external {func.name}")
        if isinstance(func, FuncObj):
            return self.call_function(func, args, kwargs)
        if isinstance(func, BoundMethod):
            if func.func.name == "get" and "EnvField" in func.obj.cls.mro_names(self):
                name = self._env_name(func.obj)
                self.taint(f"depends on environment variable {name}")
                default = func.obj.args[0] if func.obj.args else func.obj.kwargs.get("default")
                if isinstance(default, (FuncObj, Unresolved, ExternalRef)):
                    raise CannotEval(f"{name} has a computed default")
                return default
            return self.call_function(func.func, [func.obj] + args, kwargs)
        if isinstance(func, ClassObj):
            return Instance(func, args, kwargs)
        if any(func is b for b in _SAFE_BUILTINS.values()):
            if args and any(func is b for b in (list, set, tuple, sorted, frozenset, enumerate,
                                                reversed, any, all, min, max, len)):
                args = [self.iterate(args[0])] + list(args[1:])
            self._check_plain(*args, *kwargs.values())
            try:
                return func(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - e.g. int("x")
                raise CannotEval(str(e)) from None
        if callable(func) and getattr(func, "__self__", None) is not None:
            self._check_plain(*args, *kwargs.values())
            owner = func.__self__
            result = func(*args, **kwargs)
            if func.__name__ in _MUTATORS:
                for a in args:
                    self.mark_open(owner, self.open_reasons(a))
            return result
        raise CannotEval(f"cannot call {func!r}")

    def _env_name(self, inst: Instance) -> str:
        return getattr(inst, "env_name", "?")

    def call_function(self, func: FuncObj, args: list, kwargs: dict) -> Any:
        if self._depth > 25:
            raise CannotEval("recursion budget")
        node = func.node
        local: dict = dict(func.closure)
        params = node.args
        positional = [a.arg for a in params.posonlyargs + params.args]
        defaults = params.defaults
        for i, name in enumerate(positional):
            if i < len(args):
                local[name] = args[i]
            elif name in kwargs:
                local[name] = kwargs[name]
            else:
                j = i - (len(positional) - len(defaults))
                if j < 0:
                    raise CannotEval(f"missing argument {name}")
                local[name] = self.eval(defaults[j], Scope(func.module))
        for a, d in zip(params.kwonlyargs, params.kw_defaults):
            if a.arg in kwargs:
                local[a.arg] = kwargs[a.arg]
            elif d is not None:
                local[a.arg] = self.eval(d, Scope(func.module))
        scope = Scope(func.module, local)
        self._depth += 1
        try:
            if isinstance(node, ast.Lambda):
                return self.eval(node.body, scope)
            self.exec_body(node.body, scope)
            return None
        except _Return as r:
            return r.value
        finally:
            self._depth -= 1

    # ---- statements
    def exec_body(self, body: list, scope: Scope) -> None:
        for stmt in body:
            self.exec_stmt(stmt, scope)

    def exec_stmt(self, stmt, scope: Scope) -> None:  # noqa: C901 - one dispatch
        if isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Constant):
                return
            self.eval(stmt.value, scope)
        elif isinstance(stmt, ast.Assign):
            try:
                value = self.eval(stmt.value, scope)
            except CannotEval:
                value = Unresolved(_src(stmt.value))
            for t in stmt.targets:
                self._assign(t, value, scope)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                try:
                    value = self.eval(stmt.value, scope)
                except CannotEval:
                    value = Unresolved(_src(stmt.value))
                self._assign(stmt.target, value, scope)
        elif isinstance(stmt, ast.AugAssign):
            current = self.eval(stmt.target, scope) if not isinstance(stmt.target, ast.Name) \
                else self.lookup(stmt.target.id, scope)
            right = self.eval(stmt.value, scope)
            self._check_plain(current, right)
            if isinstance(current, list) and isinstance(stmt.op, ast.Add):
                current.extend(self.iterate(right))
                value = current
            elif isinstance(current, set) and isinstance(stmt.op, ast.BitOr):
                current |= set(self.iterate(right))
                value = current
            else:
                value = self._eval(ast.BinOp(stmt.target, stmt.op, stmt.value), scope)
            self._assign(stmt.target, value, scope)
        elif isinstance(stmt, ast.Return):
            raise _Return(self.eval(stmt.value, scope) if stmt.value is not None else None)
        elif isinstance(stmt, ast.If):
            try:
                cond, reasons = self.eval_tainted(stmt.test, scope)
                self._check_plain(cond)
            except CannotEval:
                reasons, cond = {f"depends on `{_src(stmt.test)}`"}, False  # assume false
            for reason in reasons:  # what either branch touches depends on the condition
                self.taint(reason)
                self._taint_branch(stmt.body + stmt.orelse, scope, reason)
            self.exec_body(stmt.body if cond else stmt.orelse, scope)
            if reasons:
                self._taint_branch(stmt.body + stmt.orelse, scope, next(iter(sorted(reasons))))
        elif isinstance(stmt, ast.For):
            for item in self.iterate(self.eval(stmt.iter, scope)):
                self._assign(stmt.target, item, scope)
                self.exec_body(stmt.body, scope)
        elif isinstance(stmt, ast.ImportFrom):
            modname = self._absolute(stmt, scope.module)
            for a in stmt.names:
                try:
                    scope.locals[a.asname or a.name] = self.resolve_import(modname, a.name)
                except CannotEval:
                    scope.locals[a.asname or a.name] = Unresolved(f"{modname}.{a.name}")
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    scope.locals[a.asname] = self.wheel.module(a.name)
                else:
                    top = a.name.split(".")[0]
                    scope.locals[top] = self.wheel.module(top)
        elif isinstance(stmt, ast.ClassDef):
            scope.locals[stmt.name] = ClassObj(stmt, scope.module)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope.locals[stmt.name] = FuncObj(stmt, scope.module)
        elif isinstance(stmt, ast.Try):
            self.exec_body(stmt.body, scope)
        elif isinstance(stmt, (ast.Pass, ast.Assert, ast.Global, ast.Nonlocal)):
            return
        elif isinstance(stmt, ast.Raise):
            raise CannotEval(f"raise at line {stmt.lineno}")
        else:
            raise CannotEval(f"statement {type(stmt).__name__}")

    def _taint_branch(self, body: list, scope: Scope, reason: str) -> None:
        for stmt in body:
            for name in _names_touched(stmt):
                if dict.__contains__(scope.locals, name):
                    self.mark_open(scope.locals[name], {reason})

    @staticmethod
    def _absolute(stmt: ast.ImportFrom, module: ModuleObj) -> str:
        if not stmt.level:
            return stmt.module or ""
        parts = module.name.split(".")
        base = parts if module.is_package else parts[:-1]
        base = base[: len(base) - (stmt.level - 1)] if stmt.level > 1 else base
        return ".".join(base + ([stmt.module] if stmt.module else []))


# --------------------------------------------------------------------------------------------
# Types of annotations (what arg_utils inspects with get_type_hints / get_origin / get_args)
# --------------------------------------------------------------------------------------------

_TYPING_ORIGINS = {
    "Optional": "optional", "Union": "union", "List": "list", "list": "list", "Literal": "literal",
    "Annotated": "annotated", "Dict": "dict", "dict": "dict", "Set": "set", "set": "set",
    "Tuple": "tuple", "tuple": "tuple", "Sequence": "sequence", "Type": "type", "type": "type",
    "Callable": "callable", "ClassVar": "classvar", "FrozenSet": "frozenset",
}


class T:
    """A static view of a type: kind is 'atom' (name), 'union', 'literal', 'annotated', or a
    generic origin ('list', 'dict', ...); args are nested T's (or values, for literal/annotated)."""

    def __init__(self, kind: str, args: tuple = (), name: str = ""):
        self.kind, self.args, self.name = kind, args, name

    def __repr__(self) -> str:
        return f"T({self.kind}, {self.name}, {self.args})"


NONE_T = T("atom", name="None")


def _type_name(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, ExternalRef):
        return value.name.split(".")[-1]
    if isinstance(value, ClassObj):
        return value.name
    return repr(value)


def eval_type(ev: Evaluator, node, scope: Scope) -> T:
    """Evaluate an annotation AST into a T, the way typing would see it."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return eval_type(ev, ast.parse(node.value, mode="eval").body, scope)
    if isinstance(node, ast.Constant) and node.value is None:
        return NONE_T
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = []
        for side in (node.left, node.right):
            t = eval_type(ev, side, scope)
            parts.extend(t.args if t.kind == "union" else (t,))
        return T("union", tuple(parts))
    if isinstance(node, ast.Subscript):
        origin = _origin_of(ev, node.value, scope)
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if origin == "annotated":
            inner = eval_type(ev, elts[0], scope)
            meta = []
            for e in elts[1:]:
                try:
                    meta.append(ev.eval(e, scope))
                except CannotEval:
                    meta.append(Unresolved(_src(e)))
            return T("annotated", (inner, *meta))
        if origin == "literal":
            return T("literal", tuple(ev.eval(e, scope) for e in elts))
        args = tuple(eval_type(ev, e, scope) for e in elts if not isinstance(e, ast.Constant)
                     or e.value is not Ellipsis)
        if origin == "optional":
            inner = args[0].args if args[0].kind == "union" else (args[0],)
            return T("union", (*inner, NONE_T))
        if origin == "union":
            flat = []
            for a in args:
                flat.extend(a.args if a.kind == "union" else (a,))
            return T("union", tuple(flat))
        return T(origin or "generic", args, name=_src(node.value))
    # A plain name or attribute: a builtin type, a typing alias, or a class.
    origin = _origin_of(ev, node, scope)
    if origin in ("list", "dict", "set", "tuple"):
        return T(origin, (), name=origin)
    try:
        value = ev.eval(node, scope)
    except CannotEval:
        return T("atom", name=_src(node))
    return T("atom", name=_type_name(value))


def _origin_of(ev: Evaluator, node, scope: Scope) -> str | None:
    try:
        value = ev.eval(node, scope)
    except CannotEval:
        return _TYPING_ORIGINS.get(_src(node).split(".")[-1])
    if isinstance(value, ExternalRef):
        return _TYPING_ORIGINS.get(value.name.split(".")[-1])
    if isinstance(value, type):
        return _TYPING_ORIGINS.get(value.__name__)
    return None


# --------------------------------------------------------------------------------------------
# Recording the parser: fields -> add_argument calls (arg_utils), then add_cli_args
# --------------------------------------------------------------------------------------------


class ArgCall:
    """One recorded `parser.add_argument(*names, **kwargs)`."""

    def __init__(self, names: list[str], kwargs: dict, sources: dict, *, field: bool,
                 group: str | None, namespace: str | None, lineno: int = 0):
        self.names, self.kwargs, self.sources = names, kwargs, sources
        self.field, self.group, self.namespace, self.lineno = field, group, namespace, lineno


class ParserRecorder:
    """Stands in for the `argparse.ArgumentParser` given to `add_cli_args`."""

    def __init__(self, title: str | None = None, calls: list | None = None):
        self.title = title
        self.calls: list[ArgCall] = calls if calls is not None else []


def _banner_map(source: str) -> list[tuple[int, str]]:
    """(line number, title) of every section banner comment in a file."""
    lines = source.splitlines()
    out = []
    dash = re.compile(r"^\s*#\s*[-=]{5,}\s*$")
    inline = re.compile(r"^\s*#\s*-{2,}\s*(.+?)\s*-{2,}\s*$")
    for i, line in enumerate(lines):
        m = inline.match(line)
        if m and not dash.match(line):
            out.append((i + 1, m.group(1)))
        elif dash.match(line) and i + 2 < len(lines) and dash.match(lines[i + 2]):
            title = lines[i + 1].strip().lstrip("#").strip()
            if title and not dash.match(lines[i + 1]):
                out.append((i + 2, title))
    return out


def _group_at(banners: list[tuple[int, str]], lineno: int, start: int = 0) -> str | None:
    title = None
    for line, name in banners:
        if start <= line <= lineno:
            title = name
    return title


class FieldDecl:
    def __init__(self, name: str, annotation: T, default: Any, default_src: str | None,
                 group: str | None, namespace: str | None, lineno: int):
        self.name, self.annotation, self.default, self.default_src = name, annotation, default, \
            default_src
        self.group, self.namespace, self.lineno = group, namespace, lineno


MISSING = object()


def _field_default(ev: Evaluator, node, scope: Scope) -> tuple[Any, str | None]:
    """(default value or MISSING, source text) of a field's right-hand side."""
    if node is None:
        return MISSING, None
    src = _src(node)
    try:
        value = ev.eval(node, scope)
    except CannotEval:
        return Unresolved(src), src
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "field":
        kw = value[1]
        if "default" in kw:
            return kw["default"], src
        factory = kw.get("default_factory")
        if factory is not None:
            if factory in (list, dict, set, tuple):
                return factory(), src
            if isinstance(factory, FuncObj):
                try:
                    return ev.call_function(factory, [], {}), src
                except CannotEval:
                    pass
            return Unresolved(src), src
        return MISSING, src
    return value, src


def collect_fields(ev: Evaluator, cls: ClassObj) -> list[FieldDecl]:
    """The annotated fields a dataclass / msgspec.Struct class declares (bases first)."""
    out: list[FieldDecl] = []
    for base in cls.bases(ev):
        if isinstance(base, ClassObj):
            out.extend(collect_fields(ev, base))
    banners = _banner_map(cls.module.source)
    ns_path = None
    try:
        ns_path = cls.own(ev, "_NS_PATH")
    except (KeyError, CannotEval):
        pass
    scope = Scope(cls.module)
    for stmt in cls.node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        ann = eval_type(ev, stmt.annotation, scope)
        if ann.kind == "classvar":
            continue
        default, default_src = _field_default(ev, stmt.value, scope)
        namespace = ns_path if isinstance(ns_path, str) else None
        if ann.kind == "annotated":
            for meta in ann.args[1:]:
                if isinstance(meta, Instance) and meta.cls.name == "NS":
                    namespace = meta.args[0] if meta.args else meta.kwargs.get("path")
        group = _group_at(banners, stmt.lineno, cls.node.lineno)
        out = [f for f in out if f.name != stmt.target.id]
        out.append(FieldDecl(stmt.target.id, ann, default, default_src, group, namespace,
                             stmt.lineno))
    return out


def _arg_meta(ann: T) -> tuple[T, dict | None]:
    """arg_utils._unwrap_annotated: (inner type, Arg kwargs) or (type, None)."""
    if ann.kind != "annotated":
        return ann, None
    for meta in ann.args[1:]:
        if isinstance(meta, Instance) and meta.cls.name == "Arg":
            kw = dict(meta.kwargs)
            for i, value in enumerate(meta.args):  # Arg's first positional parameter is help
                kw.setdefault(("help", "choices", "aliases", "cli_name")[i], value)
            return ann.args[0], kw
        if isinstance(meta, str):
            return ann.args[0], {"help": meta}
    return ann.args[0], None


def _unwrap_optional(t: T) -> T:
    if t.kind == "union":
        non_none = [a for a in t.args if not (a.kind == "atom" and a.name in ("None", "NoneType"))]
        if len(non_none) == 1:
            return non_none[0]
    return t


def _infer_type_func(t: T | str) -> str:
    name = t if isinstance(t, str) else (t.name if t.kind == "atom" else "")
    return name if name in ("str", "int", "float") else "str"


def derive_field_calls(fields: list[FieldDecl]) -> list[ArgCall]:
    """Reproduce arg_utils.add_cli_args_from_dataclass: one add_argument per CLI field."""
    calls = []
    for f in fields:
        raw, meta = _arg_meta(f.annotation)
        if meta is None or meta.get("no_cli") is True:
            continue
        cli_name = meta.get("cli_name") or "--" + f.name.replace("_", "-")
        names = [cli_name] + list(meta.get("aliases") or [])
        kw: dict = {}
        if cli_name.lstrip("-").replace("-", "_") != f.name:
            kw["dest"] = f.name
        has_default = f.default is not MISSING
        if meta.get("action") is not None:
            kw.update(action=meta["action"], help=meta.get("help", ""))
            if has_default:
                kw["default"] = f.default
            kw.update(meta.get("action_kwargs") or {})
        else:
            inner = _unwrap_optional(raw)
            kw.update(_derive_plain(inner, meta, has_default, names))
            if has_default:
                kw["default"] = f.default
        sources = {"default": f.default_src} if f.default_src else {}
        call = ArgCall(names, kw, sources, field=True, group=f.group, namespace=f.namespace,
                       lineno=f.lineno)
        call.fallback = meta.get("fallback")
        calls.append(call)
    return calls


def _derive_plain(inner: T, meta: dict, has_default: bool, names: list[str]) -> dict:
    help_ = meta.get("help", "")
    type_parser = meta.get("type_parser")
    if inner.kind == "literal":
        values = list(inner.args)
        val_type = type(values[0]).__name__ if values else "str"
        kw = dict(type=type_parser or _infer_type_func(val_type),
                  choices=meta.get("choices") or values, help=help_)
        if meta.get("const") is not None:
            kw["const"] = meta["const"]
        return kw
    if inner.kind == "list" and type_parser is None:
        elem = inner.args[0] if inner.args else T("atom", name="str")
        kw = dict(type=_infer_type_func(elem), nargs=meta.get("nargs") or "+", help=help_)
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        if meta.get("const") is not None:
            kw["const"] = meta["const"]
        return kw
    if inner.kind == "atom" and inner.name == "bool":
        return dict(action="store_true", help=help_)
    kw = dict(type=type_parser or _infer_type_func(inner), help=help_)
    if meta.get("choices"):
        kw["choices"] = meta["choices"]
    if meta.get("nargs"):
        kw["nargs"] = meta["nargs"]
    if meta.get("const") is not None:
        kw["const"] = meta["const"]
    required = meta.get("required")
    if (required is True or (required is None and not has_default)) and any(
        n.startswith("-") for n in names
    ):
        kw["required"] = True
    return kw


# --------------------------------------------------------------------------------------------
# One release
# --------------------------------------------------------------------------------------------


class ReleaseExtractor:
    def __init__(self, wheel: Wheel):
        self.wheel = wheel
        self.ev = Evaluator(wheel)
        self.warnings: list[str] = []
        self.sa = self._module("sglang.srt.server_args")

    def _module(self, name: str) -> ModuleObj:
        mod = self.wheel.module(name)
        if not isinstance(mod, ModuleObj):
            raise SystemExit(f"{name} is not in the wheel")
        return mod

    # ---- fields
    def server_args_fields(self) -> list[FieldDecl]:
        if self.sa.has("_INPUT_NAMESPACES"):
            classes = self.sa.lookup(self.ev, "_INPUT_NAMESPACES")
            fields: list[FieldDecl] = []
            for cls in classes:
                if not isinstance(cls, ClassObj):
                    self.warnings.append(f"namespace class not resolved: {cls!r}")
                    continue
                fields.extend(collect_fields(self.ev, cls))
            own = self.sa.lookup(self.ev, "ServerArgs")
            fields.extend(collect_fields(self.ev, own))
            return fields
        return collect_fields(self.ev, self.sa.lookup(self.ev, "ServerArgs"))

    def check_derivation(self) -> str | None:
        mod = self.wheel.module("sglang.srt.arg_groups.arg_utils")
        if not isinstance(mod, ModuleObj):
            return None
        for node in mod.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args_from_dataclass":
                body = [b for b in node.body
                        if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
                digest = hashlib.sha1("".join(ast.dump(b) for b in body).encode()).hexdigest()[:8]
                if digest not in KNOWN_DERIVATIONS:
                    self.warnings.append(
                        f"add_cli_args_from_dataclass has an unknown shape ({digest}); "
                        "check extract.derive_field_calls against it")
                return digest
        return None

    # ---- the parser
    def record_parser(self) -> list[ArgCall]:
        cls = self.sa.lookup(self.ev, "ServerArgs")
        method = cls.attr(self.ev, "add_cli_args")
        func = method[1] if isinstance(method, tuple) else method
        recorder = ParserRecorder()
        fields = self.server_args_fields()
        banners = _banner_map(self.sa.source)
        ev = self.ev

        def from_dataclass(parser, record_cls, fields_=None, **_):
            parser.calls.extend(c for c in derive_field_calls(fields)
                                if fields_ is None or c.kwargs.get("dest", "") in fields_)

        utils = self.wheel.module("sglang.srt.arg_groups.arg_utils")
        if isinstance(utils, ModuleObj) and utils.has("add_cli_args_from_dataclass"):
            utils.values["add_cli_args_from_dataclass"] = ExternalRef("@from_dataclass")
        ev.special_calls["@from_dataclass"] = from_dataclass
        defaults = {f.name: f.default for f in fields}

        def declared_default(name):
            value = defaults.get(name, MISSING)
            if value is MISSING or isinstance(value, Unresolved):
                raise CannotEval(f"default of {name}")
            return value

        if self.sa.has("_declared_default"):  # 0.5.20+: a Struct field's default, by name
            self.sa.values["_declared_default"] = ExternalRef("@declared_default")
            ev.special_calls["@declared_default"] = declared_default
        self._patch_parser_calls(recorder, banners, func)
        ev.call_function(func, [recorder], {})
        self._check_prepare()
        return recorder.calls

    def _patch_parser_calls(self, recorder: ParserRecorder, banners, func: FuncObj) -> None:
        """Route `<parser>.add_argument(...)` (and argument groups) to the recorder."""
        ev = self.ev
        start = func.node.lineno

        def call_node(node: ast.Call, scope: Scope):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in (
                "add_argument", "add_argument_group", "add_mutually_exclusive_group"
            ):
                try:
                    target = ev.eval(f.value, scope)
                except CannotEval:
                    target = None
                if isinstance(target, ParserRecorder):
                    return self._record(node, scope, target, banners, start)
            return NOT_HANDLED

        ev.intercept = call_node

    def _record(self, node: ast.Call, scope: Scope, parser: ParserRecorder, banners, start):
        ev = self.ev
        if node.func.attr != "add_argument":
            title = ev.eval(node.args[0], scope) if node.args else None
            return ParserRecorder(title if isinstance(title, str) else None, parser.calls)
        names = [ev.eval(a, scope) for a in node.args]
        kwargs, sources = {}, {}
        for k in node.keywords:
            sources[k.arg] = _src(k.value)
            try:
                kwargs[k.arg] = ev.eval(k.value, scope)
            except CannotEval:
                kwargs[k.arg] = Unresolved(_src(k.value))
        group = parser.title or _group_at(banners, node.lineno, start)
        parser.calls.append(ArgCall(names, kwargs, sources, field=False, group=group,
                                    namespace=None, lineno=node.lineno))
        return None

    def _check_prepare(self) -> None:
        if not self.sa.has("prepare_server_args"):
            self.warnings.append("no prepare_server_args in server_args.py")
            return
        for node, _ in self.sa._index["prepare_server_args"]:
            for n in ast.walk(node):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                        n.func.attr in ("add_argument", "add_argument_group"):
                    self.warnings.append(
                        f"prepare_server_args adds arguments itself (line {n.lineno}); not read")

    # ---- plugin extension points
    def extension_lists(self) -> dict[int, str]:
        """id -> name of the module-level choice lists that have a public `add_*` adder
        (`add_quantization_method_choices = QUANTIZATION_CHOICES.extend`, or a def)."""
        if hasattr(self, "_extension_lists"):
            return self._extension_lists
        out: dict[int, str] = {}
        for modname in ("sglang.srt.server_args", "sglang.srt.arg_groups.choices"):
            mod = self.wheel.module(modname)
            if not isinstance(mod, ModuleObj):
                continue
            for stmt in mod.tree.body:
                for name in _adder_targets(stmt):
                    try:
                        value = mod.lookup(self.ev, name)
                    except CannotEval:
                        continue
                    out[id(value)] = name
                    self._keep = getattr(self, "_keep", []) + [value]
        self._extension_lists = out
        return out

    # ---- actions
    def action_info(self, action: Any) -> tuple[str, dict]:
        """(action name, __init__ keyword defaults) of an action kwarg value."""
        if action is None:
            return "store", {}
        if isinstance(action, str):
            return action, {}
        if isinstance(action, ExternalRef):
            return action.name.split(".")[-1], {}
        if isinstance(action, ClassObj):
            return action.name, self._init_defaults(action)
        return _src(action) if isinstance(action, ast.AST) else repr(action), {}

    def _init_defaults(self, cls: ClassObj) -> dict:
        for stmt in cls.node.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                a = stmt.args
                out = {}
                pos = a.args[len(a.args) - len(a.defaults):]
                for arg, d in list(zip(pos, a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults)):
                    if d is not None:
                        try:
                            out[arg.arg] = self.ev.eval(d, Scope(cls.module))
                        except CannotEval:
                            pass
                return out
        for b in cls.bases(self.ev):
            if isinstance(b, ClassObj):
                return self._init_defaults(b)
        return {}

    # ---- env
    def env_entries(self) -> list[dict]:
        mod = self.wheel.module("sglang.srt.environ")
        if not isinstance(mod, ModuleObj) or not mod.has("Envs"):
            return []
        envs_cls = mod.lookup(self.ev, "Envs")
        out = []
        for stmt in envs_cls.node.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                continue
            name = stmt.targets[0].id
            try:
                inst = envs_cls.own(self.ev, name)
            except (KeyError, CannotEval):
                continue
            if not isinstance(inst, Instance) or "EnvField" not in inst.cls.mro_names(self.ev):
                continue
            inst.env_name = name
            call = stmt.value
            default_node = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "default"), None)
            raw = inst.args[0] if inst.args else inst.kwargs.get("default")
            default = to_json(raw, _src(default_node) if default_node is not None else "")
            if isinstance(raw, FuncObj):
                default = {"expr": _src(default_node)}
            dep = inst.kwargs.get("deprecated_name")
            if dep is None and len(inst.args) > 1:
                dep = inst.args[1]
            out.append({"name": name, "type": _env_type(self.ev, inst.cls), "default": default,
                        "deprecated_name": dep if isinstance(dep, str) else None})
        # So envs.X.get() in conditions can say which variable it read.
        for stmt in envs_cls.node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                v = envs_cls._values.get(stmt.targets[0].id)
                if isinstance(v, Instance):
                    v.env_name = stmt.targets[0].id
        last = {e["name"]: e for e in out}  # a name assigned twice: the last assignment wins
        return sorted(last.values(), key=lambda e: e["name"])


def _adder_targets(stmt) -> list[str]:
    """Lists an `add_*` adder extends: `add_x = L.extend` or `def add_x(c): L.extend(c)`."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
        stmt.targets[0], ast.Name
    ) and stmt.targets[0].id.startswith("add_"):
        v = stmt.value
        if isinstance(v, ast.Attribute) and v.attr in ("extend", "append") and isinstance(
            v.value, ast.Name
        ):
            return [v.value.id]
    if isinstance(stmt, ast.FunctionDef) and stmt.name.startswith("add_"):
        return [n.func.value.id for n in ast.walk(stmt)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("extend", "append") and isinstance(n.func.value, ast.Name)]
    return []


def _env_type(ev: Evaluator, cls: ClassObj) -> str:
    known = {"EnvBool": "bool", "EnvInt": "int", "EnvFloat": "float", "EnvStr": "str",
             "EnvTuple": "tuple", "EnvJSON": "json"}
    for name in cls.mro_names(ev):
        if name in known:
            return known[name]
    return cls.name


# --------------------------------------------------------------------------------------------
# ArgCall -> JSON entry (argparse's view of the call)
# --------------------------------------------------------------------------------------------

_SWITCH_ACTIONS = {"store_true": (0, False), "store_false": (0, True), "store_const": (0, None),
                   "append_const": (0, None), "count": (0, None), "help": (0, SUPPRESS),
                   "version": (0, SUPPRESS), "BooleanOptionalAction": (0, None)}
_DEPRECATED_HELP = re.compile(r"^\s*[\[(]?\s*deprecated\b", re.IGNORECASE)
_FLAG_IN_TEXT = re.compile(r"(--[a-z0-9][a-z0-9-]*)(=[^\s,;)]+)?", re.IGNORECASE)
_REPLACEMENT_IN_HELP = re.compile(r"\b(?:use|alias for)\s+(--[a-z0-9][a-z0-9-]*(?:=[^\s,;)]+)?)",
                                  re.IGNORECASE)


def to_json(value: Any, src: str | None = None) -> Any:
    """A JSON-safe rendering of an evaluated value, or {"expr": src}."""
    fallback = {"expr": src if src is not None else repr(value)}

    def conv(v):
        if isinstance(v, EnumMember):
            return conv(v.value)
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise CannotEval("non-finite float")
            return v
        if isinstance(v, (list, tuple)):
            return [conv(i) for i in v]
        if isinstance(v, (set, frozenset)):
            items = [conv(i) for i in v]
            return sorted(items, key=lambda x: (str(type(x)), str(x)))
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise CannotEval("non-str keys")
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, (type({}.keys()), type({}.values()))):
            return [conv(i) for i in v]
        raise CannotEval(type(v).__name__)

    try:
        return conv(value)
    except CannotEval:
        return fallback


def _callable_name(value: Any, src: str | None) -> str:
    if value in (str, int, float, bool):
        return value.__name__
    if isinstance(value, str) and value in ("str", "int", "float", "bool"):
        return value
    if isinstance(value, ExternalRef):
        return "json" if value.name in ("json.loads", "json") else value.name.split(".")[-1]
    if isinstance(value, (FuncObj, ClassObj)):
        return value.name
    return src or repr(value)


def _deprecation(call: ArgCall, action: str, kw: dict, help_: Any) -> dict | None:
    new_flag = kw.get("new_flag")
    error = kw.get("error_message")
    deprecated_action = action.startswith("Deprecated")
    by_help = isinstance(help_, str) and _DEPRECATED_HELP.match(help_) is not None
    if not (deprecated_action or by_help or new_flag):
        return None
    if not isinstance(new_flag, str):
        new_flag = None
        if isinstance(help_, str):  # "(Deprecated: use --x=auto) ..." / "Alias for --x y."
            m = _REPLACEMENT_IN_HELP.search(help_)
            new_flag = m.group(1).rstrip(".") if m else None
    replaced_by = None
    if new_flag and "{" not in new_flag:
        found = _FLAG_IN_TEXT.findall(new_flag)
        if len(found) == 1:
            replaced_by = found[0][0]
    message = error if isinstance(error, str) else (
        help_ if isinstance(help_, str) and help_ != SUPPRESS else None)
    return {"replaced_by": replaced_by, "message": message, "new_flag": new_flag,
            "error": isinstance(error, str)}


def to_entry(ex: ReleaseExtractor, call: ArgCall) -> dict:
    kw = dict(call.kwargs)
    action, init = ex.action_info(kw.pop("action", None))
    names = list(call.names)
    if action == "BooleanOptionalAction":
        names = [s for n in names for s in ([n, "--no-" + n[2:]] if n.startswith("--") else [n])]
    long_names = [n for n in names if n.startswith("--")]
    dest = kw.get("dest") or (long_names[0] if long_names else names[0]).lstrip("-").replace(
        "-", "_")
    switch_nargs, switch_default = _SWITCH_ACTIONS.get(action, (None, None))
    if "nargs" in kw:
        nargs = kw["nargs"]
    elif action in _SWITCH_ACTIONS:
        nargs = switch_nargs
    else:
        nargs = init.get("nargs")
    takes_value = nargs != 0
    type_value = kw.get("type")
    if not takes_value:
        type_name = None
    elif type_value is None:
        type_name = "str"
    else:
        type_name = _callable_name(type_value, call.sources.get("type"))
    if "default" in kw:
        default_raw = kw["default"]
    elif action in _SWITCH_ACTIONS:
        default_raw = switch_default
    else:
        default_raw = init.get("default")
    default_src = call.sources.get("default")
    default = {"expr": default_raw.src} if isinstance(default_raw, Unresolved) else to_json(
        default_raw, default_src)
    choices, choices_open, reason = _choices(ex, kw.get("choices"), call.sources.get("choices"))
    help_ = kw.get("help")
    if isinstance(help_, Unresolved):
        help_ = call.sources.get("help") or help_.src
    const_raw = kw.get("const_value", kw.get("const", init.get("const")))
    if action == "store_true":
        const_raw = True
    elif action == "store_false":
        const_raw = False
    const = None if const_raw is None else to_json(const_raw, call.sources.get("const_value"))
    return {
        "name": names[0], "aliases": names[1:], "dest": dest, "action": action,
        "type": type_name, "nargs": to_json(nargs), "choices": choices,
        "choices_open": choices_open, "choices_open_reason": reason,
        "choices_extensible": id(kw.get("choices")) in ex.extension_lists(), "default": default,
        "help": help_ if isinstance(help_, str) else (None if help_ is None else str(help_)),
        "deprecated": _deprecation(call, action, kw, help_), "const": const,
        "required": bool(kw.get("required", False)), "group": call.group,
        "namespace": call.namespace, "field": call.field,
        "fallback": to_json(getattr(call, "fallback", None)),
    }


def _choices(ex: ReleaseExtractor, raw: Any, src: str | None) -> tuple[Any, bool, str | None]:
    if raw is None:
        return None, False, None
    if isinstance(raw, Unresolved):
        return [{"expr": raw.src}], True, f"could not resolve `{raw.src}`"
    reasons = sorted(ex.ev.open_reasons(raw))
    try:
        items = ex.ev.iterate(raw)
    except CannotEval:
        return [{"expr": src or repr(raw)}], True, f"could not resolve `{src}`"
    if isinstance(raw, (set, frozenset)):
        items = sorted(items, key=str)
    out = []
    for item in items:
        if isinstance(item, Unresolved):
            out.append({"expr": item.src})
            reasons.append(f"unresolved entry `{item.src}`")
        else:
            out.append(to_json(item))
    reasons = sorted(set(reasons))
    return out, bool(reasons), "; ".join(reasons) if reasons else None


# --------------------------------------------------------------------------------------------
# Release driver
# --------------------------------------------------------------------------------------------


def extract_wheel(wheel: Wheel) -> dict:
    """{"flags": [...], "env": [...], "warnings": [...]} of one wheel."""
    ex = ReleaseExtractor(wheel)
    ex.check_derivation()
    env = ex.env_entries()
    calls = ex.record_parser()
    flags = [to_entry(ex, c) for c in calls]
    seen: dict[str, str] = {}
    for f in flags:
        for s in [f["name"], *f["aliases"]]:
            if s in seen:
                ex.warnings.append(f"{s} registered twice ({seen[s]} and {f['dest']})")
            seen[s] = f["dest"]
    flags.sort(key=lambda f: f["name"])
    return {"flags": flags, "env": env, "warnings": ex.warnings}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_wheel(release: str, wheel_dir: Path, download: bool = True) -> Path:
    """The sglang wheel of `release` in wheel_dir, downloaded with pip if missing."""
    pattern = f"sglang-{release}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if not found and download:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                f"sglang=={release}", "-d", str(wheel_dir)]
        if subprocess.run(base).returncode != 0:
            # SGLang ships cp311 manylinux wheels only; ask for those from any interpreter.
            subprocess.run(base + ["--python-version", "3.11", "--implementation", "cp",
                                   "--abi", "cp311", "--platform", "manylinux_2_34_x86_64"],
                           check=True)
        found = sorted(wheel_dir.glob(pattern))
    if not found:
        raise SystemExit(f"no wheel for sglang {release} in {wheel_dir}")
    return found[-1]


CONFIG_PARSERS = ("sglang/srt/utils/server_args_config_parser.py", "sglang/srt/server_args_config_parser.py")


def config_loader(wheel: "Wheel") -> str | None:
    """Which argparse actions the release's `--config FILE.yaml` loader accepts as keys:
    "store-only" (store and store_true; any other action is refused with "Unsupported config
    option") or "single-value" (also any action taking one value, from 0.5.23). None: no loader."""
    for name in CONFIG_PARSERS:
        text = wheel.read(name)
        if text is None:
            continue
        tree = ast.parse(text)
        functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        if "_takes_one_value" in functions:
            return "single-value"
        if "ConfigArgumentMerger" in classes:
            return "store-only"
    return None


def extract_release(release: str, wheel_path: Path) -> dict:
    wheel = Wheel(wheel_path)
    data = extract_wheel(wheel)
    return {"release": release, "wheel": wheel_path.name, "sha256": _sha256(wheel_path),
            "extractor": EXTRACTOR_VERSION, "config_loader": config_loader(wheel),
            "flags": data["flags"], "env": data["env"]}, data["warnings"]


def dumps(data: dict) -> str:
    """Compact but diffable: one flag / env entry per line, keys sorted."""
    head = {k: v for k, v in data.items() if k not in ("flags", "env")}
    parts = ["{"]
    for k in sorted(head):
        parts.append(f"{json.dumps(k)}: {json.dumps(head[k], sort_keys=True)},")
    for key in ("env", "flags"):
        items = data.get(key, [])
        parts.append(f"{json.dumps(key)}: [")
        rows = [json.dumps(item, sort_keys=True, ensure_ascii=False) for item in items]
        parts.append(",\n".join(rows))
        parts.append("]" + ("," if key == "env" else ""))
    parts.append("}")
    return "\n".join(parts) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglaunch.flags.extract", description=__doc__.split(
        "\n")[0])
    p.add_argument("--releases", default=",".join(DEFAULT_RELEASES))
    p.add_argument("--wheel-dir", type=Path, default=DEFAULT_WHEEL_DIR)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-download", action="store_true", help="fail instead of running pip")
    args = p.parse_args(list(argv) if argv is not None else None)
    args.out.mkdir(parents=True, exist_ok=True)
    for release in [r.strip() for r in args.releases.split(",") if r.strip()]:
        wheel = find_wheel(release, args.wheel_dir, download=not args.no_download)
        data, warnings = extract_release(release, wheel)
        (args.out / f"{release}.json").write_text(dumps(data), encoding="utf-8")
        spellings = sum(1 + len(f["aliases"]) for f in data["flags"])
        fields = sum(1 for f in data["flags"] if f["field"])
        print(f"{release}: {len(data['flags'])} flags ({fields} from ServerArgs fields), "
              f"{spellings} spellings, {len(data['env'])} env vars  <- {wheel.name}")
        for w in warnings:
            print(f"  warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
