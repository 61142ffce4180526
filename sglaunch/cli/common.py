"""What every command shares: consoles, the error funnel, shared option aliases."""

from __future__ import annotations

import functools
import sys
from typing import Annotated, Callable, TypeVar

import typer

from sglaunch.errors import EXIT_USAGE, SglaunchError

F = TypeVar("F", bound=Callable)

# Options declared once and reused by every command that reads machine output.
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]

# Commands that take SGLang launch flags verbatim: Typer must not parse them.
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_error(message: str, hint: str | None = None) -> None:
    """`Error: ...` and `Hint: ...` on stderr; plain text so logs and CI read it too."""
    from rich.markup import escape

    console = stderr_console()
    console.print(f"[bold red]Error:[/] {escape(message)}")
    if hint:
        console.print(f"[bold]Hint:[/] {escape(hint)}")


# optional dependencies -> the extra that installs them (pyproject.toml)
OPTIONAL_MODULES = {
    "httpx": "bench", "matplotlib": "bench",
    "torch": "engine", "safetensors": "engine", "tokenizers": "engine", "transformers": "engine",
    "jinja2": "engine", "fastapi": "engine", "uvicorn": "engine", "pydantic": "engine",
    "prometheus_client": "engine", "gguf": "engine",
    "flashinfer": "gpu", "triton": "test",
}


def missing_extra(exc: ModuleNotFoundError) -> SglaunchError | None:
    """A command that needs an optional dependency that is not installed: which extra to install."""
    top = (exc.name or "").split(".")[0]
    extra = OPTIONAL_MODULES.get(top)
    if extra is None:
        return None
    hint = f"pip install 'sglaunch[{extra}]'"
    if top == "torch" or extra == "engine":
        hint = f"on a CPU-only machine first `pip install torch==2.13.0` (its CPU build), then {hint}"
    return SglaunchError(f"this command needs the Python package '{top}', which is not installed", hint=hint)


def funnel(func: F) -> F:
    """Turn SglaunchError into the Error/Hint output and its exit code, and a missing optional
    dependency into the extra to install; nothing else is caught, so genuine bugs keep their
    traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except SglaunchError as exc:
            print_error(exc.message, exc.hint)
            raise typer.Exit(exc.exit_code) from None
        except ModuleNotFoundError as exc:
            error = missing_extra(exc)
            if error is None:
                raise
            print_error(error.message, error.hint)
            raise typer.Exit(error.exit_code) from None

    return wrapper


def exit_usage(message: str, hint: str | None = None) -> None:
    print_error(message, hint)
    sys.exit(EXIT_USAGE)
