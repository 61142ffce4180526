"""Split an SGLang argument list into flag occurrences, using the schema.

Unlike argparse, there is no prefix abbreviation: `--tp` works because it is a declared
alias, `--speculative-algo` does not, so a removed flag can never be silently mapped onto a
surviving one. Strict mode raises `SglaunchError` with a did-you-mean hint; lenient mode
(launch commands read out of scripts) records what it cannot place and carries on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from sglaunch.errors import SglaunchError
from sglaunch.flags.spec import Flag, FlagSchema, Kind
from sglaunch.releases import CURRENT_RELEASE


@dataclass(frozen=True)
class Origin:
    """Where a value came from: cli, config, script, env, default or resolved."""

    source: str
    location: str | None = None  # "file.yaml:3", "run.sh:12"

    def __str__(self) -> str:
        return self.location or self.source


CLI = Origin("cli")
DEFAULT = Origin("default")


@dataclass(frozen=True)
class Occurrence:
    """One flag as written: `--tp 2`, `--tp=2`, a YAML key, ..."""

    flag: Flag
    spelling: str
    raw: str | tuple[str, ...] | None  # None for a bare switch
    origin: Origin
    index: int = -1  # position of the flag token in the argument list
    dynamic: bool = False  # the value is unexpanded shell syntax ($TP, "$@")
    abbreviated: bool = False  # `spelling` is a prefix that argparse expands to `flag`


@dataclass
class SplitResult:
    occurrences: list[Occurrence] = field(default_factory=list)
    unknown: list[tuple[int, str]] = field(default_factory=list)  # lenient mode only
    positionals: list[tuple[int, str]] = field(default_factory=list)  # lenient mode only


def looks_like_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def unknown_flag_error(spelling: str, schema: FlagSchema, release: str = CURRENT_RELEASE,
                       where: str = "") -> SglaunchError:
    """The one message for a flag nobody declared, with the best hint we can give."""
    expansions = schema.prefix_expansions(spelling, release)
    if len(schema.abbreviated(spelling, release)) > 1:
        return SglaunchError(f"ambiguous flag {spelling}{where}: SGLang {release} stops with 'ambiguous "
                             f"option', since it is the start of {', '.join(expansions[:4])}"
                             + (" and more" if len(expansions) > 4 else ""),
                             hint="write the flag you mean in full")
    elif len(historic := schema.prefix_expansions(spelling, None)) == 1:
        old = schema.lookup(historic[0])
        fate = f"renamed to {old.replaced_by}" if old.replaced_by else "removed"
        hint = (f"older SGLang expanded it as an abbreviation of {old.name}, which was {fate} in "
                f"{old.removed}; run `sglaunch migrate-flags FILE` or write "
                f"{old.replaced_by or 'the launch without it'}")
    else:
        close = schema.suggest(spelling, release)
        hint = f"did you mean {' or '.join(close)}?" if close else "see `sglaunch serve --help` for every flag"
    return SglaunchError(f"unknown flag {spelling}{where}", hint=hint)


def split_argv(tokens: Sequence[str], schema: FlagSchema, *, origin: Origin = CLI,
               release: str = CURRENT_RELEASE, lenient: bool = False,
               dynamic: Sequence[bool] | None = None) -> SplitResult:
    """Group `tokens` into flag occurrences (values attached) in order."""
    result = SplitResult()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not looks_like_flag(token):
            if not lenient:
                raise SglaunchError(f"unexpected argument '{token}'",
                                    hint="SGLang flags start with --; is a flag name missing before it?")
            result.positionals.append((i, token))
            i += 1
            continue
        spelling, eq, inline = token.partition("=")
        flag = schema.lookup(spelling)
        abbreviated = False
        if flag is None and len(matches := schema.abbreviated(spelling, release)) == 1:
            flag, abbreviated = matches[0], True  # argparse's allow_abbrev, as SGLang runs it
        if flag is None:
            if not lenient:
                raise unknown_flag_error(spelling, schema, release)
            result.unknown.append((i, token))
            i += 1 if eq or i + 1 >= len(tokens) or looks_like_flag(tokens[i + 1]) else 2
            continue
        i, occurrence = _take_value(tokens, i, flag, spelling, inline if eq else None, origin, dynamic)
        result.occurrences.append(replace(occurrence, abbreviated=True) if abbreviated else occurrence)
    return result


def _take_value(tokens: Sequence[str], i: int, flag: Flag, spelling: str, inline: str | None,
                origin: Origin, dynamic: Sequence[bool] | None) -> tuple[int, Occurrence]:
    """Consume the flag's value(s) the way argparse's nargs does: none for a switch, one, an
    optional one ("?"), exactly N, or a run up to the next flag ("+" needs one, "*" none)."""
    is_dynamic = bool(dynamic and dynamic[i])
    if flag.kind is Kind.BOOL:
        if inline is not None:
            raise SglaunchError(f"{spelling} is a switch and takes no value (got '{spelling}={inline}')",
                                hint=f"write {spelling} alone to turn it on, or leave it out")
        return i + 1, Occurrence(flag, spelling, None, origin, i)
    if inline is not None:
        return i + 1, Occurrence(flag, spelling, inline, origin, i, is_dynamic)
    if flag.kind is Kind.LIST:
        j = i + 1
        limit = flag.nargs if isinstance(flag.nargs, int) else len(tokens)
        while j < len(tokens) and j - i - 1 < limit and not looks_like_flag(tokens[j]):
            j += 1
        count = j - i - 1
        if (count == 0 and flag.nargs != "*") or (isinstance(flag.nargs, int) and count != flag.nargs):
            raise _missing_value(flag, spelling)
        values = tuple(tokens[i + 1:j])
        return j, Occurrence(flag, spelling, values, origin, i,
                             bool(dynamic and any(dynamic[i + 1:j])))
    if i + 1 >= len(tokens) or looks_like_flag(tokens[i + 1]):
        if flag.nargs == "?":  # argparse stores the flag's const
            return i + 1, Occurrence(flag, spelling, None, origin, i)
        raise _missing_value(flag, spelling)
    return i + 2, Occurrence(flag, spelling, tokens[i + 1], origin, i,
                             bool(dynamic and dynamic[i + 1]))


def _missing_value(flag: Flag, spelling: str) -> SglaunchError:
    example = flag.metavar or (flag.choices[0] if flag.choices else flag.kind.value.upper())
    if isinstance(flag.nargs, int) and flag.nargs > 1:
        return SglaunchError(f"{spelling} needs exactly {flag.nargs} values",
                             hint=f"write {spelling} " + " ".join([example] * flag.nargs))
    return SglaunchError(f"{spelling} needs a value", hint=f"write {spelling} {example}")


def convert(flag: Flag, raw: str | tuple[str, ...] | None, spelling: str | None = None):
    """Turn the text of a value into the flag's type; SglaunchError names the flag on failure."""
    spelling = spelling or flag.name
    if flag.kind is Kind.BOOL:
        return flag.switch_value
    if flag.kind is Kind.LIST:
        items = raw if isinstance(raw, tuple) else tuple(str(raw).split())
        return tuple(_scalar(flag.item_kind, item, spelling) for item in items)
    if raw is None:  # nargs="?" given without a value
        return None
    if flag.value_type == "human_readable_int":
        return _human_readable_int(str(raw), spelling)
    value = _scalar(flag.kind, str(raw), spelling)
    if flag.value_type in ("json", "json_list_type") and isinstance(value, str):
        _check_json(value, spelling)
    return value.upper() if flag.upper_case and isinstance(value, str) else value


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_readable_int(text: str, spelling: str) -> int:
    """SGLang's token-count parser: an integer, or a number with an SI (k, M, G, T; decimals
    allowed) or IEC (Ki, Mi, Gi, Ti; integers only) suffix, case-sensitive."""
    import re

    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC and "." not in number:
            return int(number) * _IEC[suffix]
        if suffix in _SI:
            from decimal import Decimal

            return int(Decimal(number) * _SI[suffix])
    else:
        try:
            return int(text)
        except ValueError:
            pass
    raise SglaunchError(f"{spelling} expects a token count, got '{text}'",
                        hint=f"write an integer or use a suffix: {spelling} 32k, {spelling} 1Mi "
                        "(SI suffixes allow decimals, IEC ones do not)")


def _check_json(text: str, spelling: str) -> None:
    """SGLang parses these values with json.loads; argparse then stops with 'invalid loads value'."""
    import json

    try:
        json.loads(text)
    except ValueError as exc:
        raise SglaunchError(f"{spelling} expects JSON, got '{text}' ({exc})",
                            hint=f"""quote the JSON for the shell, e.g. {spelling} '{{"key": 1}}'""") from None


# kind -> (parser, what the user must give, an example value)
_NUMBERS = {Kind.INT: (int, "an integer", "2"), Kind.FLOAT: (float, "a number", "0.85")}


def _scalar(kind: Kind, text: str, spelling: str):
    if kind not in _NUMBERS:
        return text
    parse, what, example = _NUMBERS[kind]
    try:
        return parse(text)
    except ValueError:
        raise SglaunchError(f"{spelling} expects {what}, got '{text}'",
                            hint=f"for example: {spelling} {example}") from None
