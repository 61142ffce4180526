# Session 43, dev CPU: the collector's passes per window (and each step kind's spread of step times) for plain,
# static DSpark with bursts (static mode has no CPU profile, so it always bursts) and without, on the tiny random
# model of benchmarks/aside_host_cost.py, c=8, T=0.7. From the repository root:
#     TRITON_INTERPRET=1 python benchmarks/cpu43/gc_probe.py | grep -E "^(plain|static|noburst) " \
#         > benchmarks/cpu43/gc_probe.txt
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "benchmarks")


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, Path("benchmarks") / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


aside, ab = load("aside", "aside_host_cost.py"), load("ab", "inprocess_ab.py")
model, drafter = aside.tiny_model(Path(tempfile.mkdtemp()))
out = "benchmarks/cpu43/gc_probe.json"
ab.main(["--model", str(model), "--drafter", str(drafter), "--device", "cpu", "--dtype", "float32",
         "--concurrency", "8", "--output-len", "64", "--output-jitter", "0.3", "--temperature", "0.7",
         "--requests", "80", "--warmup-requests", "16", "--pairs", "1", "--prompt-limit", "200",
         "--arm", "plain=plain", "--arm", "static=static,SGLAUNCH_DSPARK_BURST=4",
         "--arm", "noburst=static,SGLAUNCH_DSPARK_BURST=0", "--json", out])
for r in json.load(open(out))["runs"]:
    print(r["label"], r["tok_s"], "gc", r["gc"], "step_ms", r["step_ms"],
          "sampled bursts", (r["bursts"] or {}).get("sampled"))
