"""Fixtures for the bench tests: the stub endpoint, the tiny checkpoint, a CLI runner helper."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # stub_server, importable from the test modules

REPO_ROOT = HERE.parents[1]


@dataclass
class BenchOutcome:
    exit_code: int
    stdout: str
    stderr: str
    json_path: Path

    def doc(self) -> dict:
        return json.loads(self.json_path.read_text())


@pytest.fixture
def run_bench(tmp_path):
    """Invoke `sglaunch bench ARGS -o tmp/out.json` through Typer's runner."""
    from sglaunch.cli.app import app

    def invoke(*args: str, output: str = "out.json") -> BenchOutcome:
        json_path = tmp_path / output
        result = CliRunner().invoke(app, ["bench", *args, "-o", str(json_path)])
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return BenchOutcome(result.exit_code, result.stdout, result.stderr, json_path)

    return invoke


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The server tests' tiny random Llama with its real byte-level BPE tokenizer."""
    spec = importlib.util.spec_from_file_location("bench_checkpoints", REPO_ROOT / "tests/server/checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("bench-tiny-llama")
    module.build_llama(folder, max_position_embeddings=256)
    return folder
