"""Truncated, missing and self-contradicting safetensors shards: `check-config` finds them from
the headers and file sizes alone, and `serve` refuses them with Error/Hint before binding a port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sglaunch.probe.checkpoint import CorruptCheckpointError, read_checkpoint

from .conftest import REPO_ROOT


@pytest.fixture(scope="module")
def sharded_llama(tmp_path_factory) -> Path:
    """A real tiny Llama saved in several shards with an index (as large checkpoints are)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from .checkpoints import build_tokenizer

    folder = tmp_path_factory.mktemp("sharded-llama")
    build_tokenizer(folder)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder), safe_serialization=True, max_shard_size="100KB")
    assert len(list(folder.glob("*.safetensors"))) >= 3
    return folder


@pytest.fixture
def damaged(sharded_llama, tmp_path):
    """A fresh copy of the checkpoint to damage, and its shards in order."""
    folder = tmp_path / "ckpt"
    shutil.copytree(sharded_llama, folder)
    return folder, sorted(folder.glob("*.safetensors"))


def header_of(shard: Path) -> tuple[int, dict]:
    with open(shard, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return length, json.loads(fh.read(length))


def rewrite_header(shard: Path, header: dict) -> None:
    length, _ = header_of(shard)
    data = shard.read_bytes()[8 + length:]
    blob = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_an_intact_checkpoint_reads_and_counts_every_tensor(sharded_llama):
    info = read_checkpoint(str(sharded_llama))
    expected = sum(end - start for shard in sharded_llama.glob("*.safetensors")
                   for name, meta in header_of(shard)[1].items() if name != "__metadata__"
                   for start, end in [meta["data_offsets"]])
    assert info.weight_bytes == expected > 0


def test_a_truncated_shard_is_found_from_its_size(damaged):
    folder, shards = damaged
    os.truncate(shards[1], shards[1].stat().st_size // 2)
    with pytest.raises(CorruptCheckpointError, match=r"is truncated: .* ends \d+ bytes short") as caught:
        read_checkpoint(str(folder))
    assert shards[1].name in caught.value.message and "re-download" in caught.value.hint


def test_a_shard_cut_inside_its_header_is_unreadable(damaged):
    folder, shards = damaged
    os.truncate(shards[0], 100)
    with pytest.raises(CorruptCheckpointError, match="not a readable safetensors file"):
        read_checkpoint(str(folder))


def test_a_missing_shard_is_named(damaged):
    folder, shards = damaged
    shards[-1].unlink()
    with pytest.raises(CorruptCheckpointError, match=f"misses 1 of the {len(shards)} weight shards") as caught:
        read_checkpoint(str(folder))
    assert shards[-1].name in caught.value.message


def test_a_header_that_lies_about_a_tensor_size_is_found(damaged):
    folder, shards = damaged
    _, header = header_of(shards[0])
    name = next(n for n in header if n != "__metadata__")
    header[name]["shape"] = [dim * 2 for dim in header[name]["shape"]]
    rewrite_header(shards[0], header)
    with pytest.raises(CorruptCheckpointError, match=f"tensor '{name}' .* but that dtype and shape need"):
        read_checkpoint(str(folder))


def test_a_header_whose_ranges_run_past_the_file_is_found(damaged):
    folder, shards = damaged
    _, header = header_of(shards[0])
    name = next(n for n in header if n != "__metadata__")
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start + 10**9, end + 10**9]
    rewrite_header(shards[0], header)
    with pytest.raises(CorruptCheckpointError, match="is truncated"):
        read_checkpoint(str(folder))


def sglaunch(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "sglaunch", *args], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=300)


def test_check_config_reports_a_truncated_checkpoint(damaged):
    folder, shards = damaged
    os.truncate(shards[1], shards[1].stat().st_size // 2)
    result = sglaunch("check-config", "--model-path", str(folder), "--no-machine", "--json")
    assert result.returncode != 0, result.stdout
    report = json.loads(result.stdout)
    (found,) = [d for d in report["diagnostics"] if d["code"] == "MODEL003"]
    assert "truncated" in found["message"] and found["severity"] == "error"


def test_serve_refuses_a_corrupt_checkpoint_before_binding_the_port(damaged):
    """The port is held busy: a serve that got as far as binding would say "Cannot listen"."""
    folder, shards = damaged
    shards[-1].unlink()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = sglaunch("serve", "--model-path", str(folder), "--device", "cpu",
                          "--port", str(busy.getsockname()[1]))
    output = " ".join((result.stdout + result.stderr).split())  # the report wraps long lines
    assert result.returncode == 2, output
    assert "Error: [MODEL003]" in output and "Hint:" in output and "misses 1 of the" in output
    assert "Traceback" not in output and "Cannot listen" not in output
