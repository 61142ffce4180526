"""Read an SGLang `--config FILE.yaml` into flag occurrences, with file:line origins.

SGLang's rules: YAML only; the root is a mapping of flag names without dashes, kebab-case;
scalars become `--key value`, lists `--key v1 v2`, `true` on a switch adds the bare switch and
`false` drops it, other booleans become the text true/false; an empty file means no flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sglaunch.checks.diagnostics import Diagnostic, diag
from sglaunch.errors import SglaunchError
from sglaunch.flags.argv import Occurrence, Origin, unknown_flag_error
from sglaunch.flags.spec import Flag, FlagSchema, Kind
from sglaunch.flags.timeline import config_refused

# NOTE: yaml is imported where a --config file is read, not on every check-config start


@dataclass
class ConfigFile:
    path: Path
    occurrences: list[Occurrence]
    diagnostics: list[Diagnostic]


def load_config_file(path_text: str, schema: FlagSchema, release: str) -> ConfigFile:
    path = Path(path_text)
    text = _read(path)
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    root = _compose(loader, path)
    occurrences: list[Occurrence] = []
    diagnostics: list[Diagnostic] = []
    seen: dict[str, int] = {}
    refused = config_refused(release)
    for key_node, value_node in root.value if root is not None else ():
        line = key_node.start_mark.line + 1
        key = _key(key_node, path, line)
        if key in seen:
            raise SglaunchError(f"{path}:{line}: key '{key}' is set twice (first on line {seen[key]})",
                                hint="keep one of them; YAML would silently use the last")
        seen[key] = line
        origin = Origin("config", f"{path}:{line}")
        flag = _flag_for_key(key, schema, release, origin, diagnostics)
        refusing = refused.get(key.replace("-", "_"))
        if refusing is not None:
            shared = "" if refusing == flag.name else f", whose key it shares with {refusing}"
            diagnostics.append(diag(
                "CFG004", f"SGLang {release}'s --config loader stops with 'Unsupported config option' on "
                f"the key '{key}' (it only reads plain values and switches{shared})",
                flags=(flag.name,), origin=str(origin),
                fix=f"pass {flag.name} on the command line instead of in the file"))
        value = _construct(loader, value_node, origin)
        occurrence = _occurrence(flag, key, value, origin, diagnostics)
        if occurrence is not None:
            occurrences.append(occurrence)
    loader.dispose()
    return ConfigFile(path, occurrences, diagnostics)


def _read(path: Path) -> str:
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise SglaunchError(f"config file must be YAML (.yaml or .yml), got '{path}'",
                            hint="SGLang's --config reads YAML only; convert the file or rename it")
    if not path.exists():
        raise SglaunchError(f"config file not found: {path}", hint="check the path given to --config")
    if path.is_dir():
        raise SglaunchError(f"config path is a directory: {path}", hint="give --config a YAML file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SglaunchError(f"cannot read config file {path}: {exc}",
                            hint="check the file's permissions and that it is UTF-8 text") from None


def _compose(loader, path: Path):
    import yaml

    """Parse once into nodes (for line numbers and duplicate keys); values are built from them."""
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SglaunchError(f"YAML syntax error in {where}: {exc.problem or exc.context}",
                            hint="fix the YAML at that line (indentation, quotes, a missing ':')") from None
    except yaml.YAMLError as exc:
        raise SglaunchError(f"YAML error in {path}: {exc}", hint="fix the YAML syntax") from None
    if root is not None and not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
        raise SglaunchError(f"{path}: the YAML root is {kind}, not a mapping of flags",
                            hint="write one flag per line, e.g. 'tp-size: 2'")
    return root


def _construct(loader, node, origin: Origin):
    import yaml

    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise SglaunchError(f"{origin}: cannot read the value: {exc}",
                            hint="use plain YAML scalars, lists or mappings") from None


def _key(node, path: Path, line: int) -> str:
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        raise SglaunchError(f"{path}:{line}: a key must be a flag name", hint="e.g. 'tp-size: 2'")
    return str(node.value)


def _flag_for_key(key: str, schema: FlagSchema, release: str, origin: Origin,
                  diagnostics: list[Diagnostic]) -> Flag:
    flag = schema.lookup("--" + key)
    if flag is not None:
        if flag.name == "--config":
            raise SglaunchError(f"{origin}: a config file cannot include another (--config)",
                                hint="merge the files into one")
        return flag
    normal = key.lstrip("-").replace("_", "-")
    flag = schema.lookup("--" + normal)
    if flag is None:
        raise unknown_flag_error("--" + key.lstrip("-"), schema, release, where=f" (key '{key}' in {origin})")
    diagnostics.append(diag(
        "CFG001", f"config key '{key}' is not how SGLang spells it: SGLang passes keys verbatim as "
        f"--{key} and fails", flags=(flag.name,), origin=str(origin),
        fix=f"rename the key to '{normal}'"))
    return flag


def _occurrence(flag: Flag, key: str, value, origin: Origin, diagnostics: list[Diagnostic]):
    spelling = "--" + key.lstrip("-")
    if value is None:
        diagnostics.append(diag("CFG003", f"'{key}' has no value and is ignored", flags=(flag.name,),
                                origin=str(origin), fix=f"give '{key}' a value or delete the line"))
        return None
    if flag.kind is Kind.BOOL:
        if not isinstance(value, bool):
            raise SglaunchError(f"{origin}: {flag.name} is a switch; '{key}' must be true or false, "
                                f"got {value!r}", hint=f"write '{key}: true'")
        return Occurrence(flag, spelling, None, origin) if value else None
    if isinstance(value, list):
        if flag.kind is not Kind.LIST:
            raise SglaunchError(f"{origin}: {flag.name} takes one value, got a list",
                                hint=f"write '{key}: VALUE'")
        return Occurrence(flag, spelling, tuple(_text(v) for v in value), origin) if value else None
    return Occurrence(flag, spelling, _text(value), origin)


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
