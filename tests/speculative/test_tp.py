"""TP=2 (two gloo processes, each loading only its shard) equals TP=1: same logits up to float64
rounding of the split reductions, same draft tokens and confidences."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from sglaunch.engine.distributed import TPGroup, free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_tp2_shards_match_tp1(qwen3_ckpt, tmp_path):
    sys.path.insert(0, str(HERE))
    from _tp_worker import run

    single = run(str(qwen3_ckpt), TPGroup(0, 1))
    port, out_file = str(free_port()), tmp_path / "tp2.pt"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, str(HERE / "_tp_worker.py"), str(qwen3_ckpt), str(rank), "2", port,
                               str(out_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    sharded = torch.load(out_file)
    for key, value in single.items():
        if key.startswith("tokens"):
            assert torch.equal(sharded[key], value), key
        else:
            torch.testing.assert_close(sharded[key], value, rtol=1e-10, atol=1e-10)
