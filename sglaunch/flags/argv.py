"""Split an SGLang argument list into flag occurrences, using the schema.

Unlike argparse, there is no prefix abbreviation: `--tp` works because it is a declared
alias, `--speculative-algo` does not, so a removed flag can never be silently mapped onto a
surviving one. Strict mode raises `SglaunchError` with a did-you-mean hint; lenient mode
(launch commands read out of scripts) records what it cannot place and carries on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    if len(expansions) == 1:
        hint = (f"SGLang's argparse would have expanded it as an abbreviation of {expansions[0]}; "
                f"sglaunch never guesses: write {expansions[0]} in full")
    elif expansions:
        hint = f"it is a prefix of several flags ({', '.join(expansions[:4])}); write the one you mean in full"
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
        if flag is None:
            if not lenient:
                raise unknown_flag_error(spelling, schema, release)
            result.unknown.append((i, token))
            i += 1 if eq or i + 1 >= len(tokens) or looks_like_flag(tokens[i + 1]) else 2
            continue
        i, occurrence = _take_value(tokens, i, flag, spelling, inline if eq else None, origin, dynamic)
        result.occurrences.append(occurrence)
    return result


def _take_value(tokens: Sequence[str], i: int, flag: Flag, spelling: str, inline: str | None,
                origin: Origin, dynamic: Sequence[bool] | None) -> tuple[int, Occurrence]:
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
        while j < len(tokens) and not looks_like_flag(tokens[j]):
            j += 1
        if j == i + 1:
            raise _missing_value(flag, spelling)
        values = tuple(tokens[i + 1:j])
        return j, Occurrence(flag, spelling, values, origin, i,
                             bool(dynamic and any(dynamic[i + 1:j])))
    if i + 1 >= len(tokens) or looks_like_flag(tokens[i + 1]):
        raise _missing_value(flag, spelling)
    return i + 2, Occurrence(flag, spelling, tokens[i + 1], origin, i,
                             bool(dynamic and dynamic[i + 1]))


def _missing_value(flag: Flag, spelling: str) -> SglaunchError:
    example = flag.metavar or (flag.choices[0] if flag.choices else flag.kind.value.upper())
    return SglaunchError(f"{spelling} needs a value", hint=f"write {spelling} {example}")


def convert(flag: Flag, raw: str | tuple[str, ...] | None, spelling: str | None = None):
    """Turn the text of a value into the flag's type; SglaunchError names the flag on failure."""
    spelling = spelling or flag.name
    if flag.kind is Kind.BOOL:
        return True
    if flag.kind is Kind.LIST:
        items = raw if isinstance(raw, tuple) else tuple(str(raw).split())
        return tuple(_scalar(flag.item_kind, item, spelling) for item in items)
    value = _scalar(flag.kind, str(raw), spelling)
    return value.upper() if flag.upper_case and isinstance(value, str) else value


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
