"""Helpers shared by the front-end tests (CLI invocation through Typer's runner)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from typer.testing import CliRunner

from sglaunch.cli.app import app


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], fill: bool = True) -> int:
    """A safetensors file with the given tensors (zero bytes of data, or a sparse file of the
    same size when `fill` is False: no disk used, enough for header readers); returns the data size."""
    sizes = {"BF16": 2, "F32": 4, "F16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + (b"\0" * offset if fill else b""))
    if not fill:  # NOTE: the size covers the declared tensors, as a complete file's does
        with open(path, "r+b") as fh:
            fh.truncate(8 + len(blob) + offset)
    return offset


runner = CliRunner()


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env=env)


def check_json(*args: str, env: dict | None = None, machine: bool = False) -> tuple[int, dict]:
    """Run `check-config --json` and return (exit code, parsed report)."""
    extra = [] if machine else ["--no-machine"]
    result = invoke("check-config", "--json", *extra, *args, env=env)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def codes(*args: str, env: dict | None = None, machine: bool = False) -> list[str]:
    return [d["code"] for d in check_json(*args, env=env, machine=machine)[1]["diagnostics"]]

