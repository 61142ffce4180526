# session 43, dev CPU: the collector's passes per window for plain, static DSpark with bursts (always bursting: no CPU
# profile in static mode) and without, on the tiny random model of aside_host_cost.py, c=8, T=0.7. Run from the
# repository root: TRITON_INTERPRET=1 python benchmarks/cpu43/gc_probe.py (output: benchmarks/cpu43/gc_probe.txt)
import sys, json, tempfile, importlib.util
from pathlib import Path
sys.path.insert(0,'benchmarks')
def load(name, file):
    spec = importlib.util.spec_from_file_location(name, Path('benchmarks')/file); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
aside=load('a','aside_host_cost.py'); ab=load('b','inprocess_ab.py')
tmp=Path(tempfile.mkdtemp())
model, drafter = aside.tiny_model(tmp)
ab.main(["--model", str(model), "--drafter", str(drafter), "--device", "cpu", "--dtype", "float32","--concurrency", "8", "--output-len", "64", "--output-jitter", "0.3", "--temperature", "0.7", "--requests", "80", "--warmup-requests", "16","--pairs", "1", "--prompt-limit", "200","--arm", "plain=plain", "--arm", "static=static,SGLAUNCH_DSPARK_BURST=4", "--arm", "noburst=static,SGLAUNCH_DSPARK_BURST=0", "--json", "benchmarks/cpu43/gc_probe.json"])
for r in json.load(open("benchmarks/cpu43/gc_probe.json"))['runs']:
    print(r['label'], r['tok_s'], 'gc', r['gc'], 'step_ms', r['step_ms'], 'sampled bursts', (r['bursts'] or {}).get('sampled'))
