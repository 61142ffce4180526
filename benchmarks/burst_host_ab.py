"""Host time of greedy DSpark bursts at 8 requests on the CPU, for an A/B of two trees: the tests' tiny
target and oracle drafter (tests/dspark/dspark_helpers.py; host work dominates a step), 8 requests x 300
greedy tokens with SGLAUNCH_DSPARK_BURST=4 in static mode, REPEATS times on one engine; prints the tree, the
best and median wall time and the bursts run. Session 39 (benchmarks/NOTES.md), e04eb44's tree against this one:

    bash benchmarks/old_sides.sh && rm -rf /tmp/old && mkdir -p /tmp/old && cp -a sglaunch /tmp/old/ \
      && cp -a .pre39/sglaunch/. /tmp/old/sglaunch/
    PYTHONPATH=/tmp/old python3 -P benchmarks/burst_host_ab.py 9; PYTHONPATH=. python3 -P benchmarks/burst_host_ab.py 9
"""
import json
import os
import sys
import time
from pathlib import Path

os.environ["SGLAUNCH_DSPARK_BURST"] = "4"
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "dspark"))
import torch
torch.set_num_threads(1)
from dspark_helpers import build_target, oracle_drafter, engine_config, prompts
from sglaunch.engine.launch import create_engine
from sglaunch.engine.interface import GenerateRequest, SamplingParams
root = Path(os.environ.get("BURST_HOST_AB_DIR", "/tmp/burst_host_ab"))
if not (root / "target").exists():
    build_target(root / "target"); oracle_drafter(root / "oracle", root / "target")
config = engine_config(root / "target", root / "oracle", "static")
engine, cluster = create_engine(config)
times = []
try:
    for rep in range(int(sys.argv[1])):
        batch = prompts(8, seed=rep)
        for i, p in enumerate(batch):
            engine.add_request(GenerateRequest(f"r{rep}-{i}", tuple(p), SamplingParams(max_new_tokens=300, temperature=0.0, ignore_eos=True)))
        t = time.perf_counter()
        steps = 0
        while engine.has_work:
            engine.step(); steps += 1
        times.append(time.perf_counter() - t)
    import sglaunch
    print(json.dumps({"tree": sglaunch.__file__, "best": min(times), "median": sorted(times)[len(times)//2], "bursts": engine.runner.burst.bursts}))
finally:
    cluster.stop(engine)
