#!/usr/bin/env bash
# Session 37's plan for the next session's first device call, after the wheels' install (bash
# benchmarks/gpu_session6.sh install DIR for .whlA, .whlB, .whlC): no model upload. Run from the repository
# root on the GPU machine; results into $OUT.
# Why: on an H100 (session 37, the real SmolLM2 and the bundled drafter, T=0.7) a stepped-aside DSpark step
# cost 1.29 ms pipelined at c=1 against 1.08 ms for a plain+overlap step, with the same operators, kernel
# launches, device time and host phases (benchmarks/gpu37/prof/aside_c1.log), and 1.60 ms when the planner
# drafted on about half the steps (nat07_c1.log): the gap that keeps DSpark under plain at T=0.7
# (0.961 at c=1). It is not the draft-context write (aside-nowrite: the same 1.29 ms).
#   1. profile_step.py at T=0.7, every DSpark step stepped aside, with and without the context write, against
#      plain+overlap (SmolLM2-135M's shape with random weights and the bundled drafter's shape; a stepped-aside
#      step does not depend on the weights), concurrency $LEVELS: the device's idle time per step and its long
#      gaps (device_gaps), the CUDA calls that held the host (host_waits), and Chrome traces of each pass;
#   2. the same with the planner deciding (drafted and stepped-aside steps interleaved), c=1;
#   3. forced aside at c=1 with the drafter's graphs and bursts off (SGLAUNCH_DRAFT_CUDA_GRAPH=0: no drafter
#      graphs, and the target's graphs carry no draft-context write, so a stepped-aside step replays the graph a
#      plain engine does; SGLAUNCH_DSPARK_BURST=0: no burst graphs). If the gap goes, it is the other graphs
#      (their number or memory) or the graph's content; if it stays, it is the engine around the graph.
# The logs and figures go back in $OUT/aside_gaps.tgz, the traces in $OUT/traces.tgz (or its parts).
set -u
LEVELS=${LEVELS:-1,8}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws SGLAUNCH_CACHE_DIR=/tmp/cache
export PYTHONPATH=/tmp/site:$PWD
P="--model benchmarks/gpu6/smolcfg --random-like --drafter sglaunch/hub/drafters/smollm2-135m-instruct --device cuda"
P="$P --modes compact --steps 60 --warmup 20 --overlap 1 --top 40"
mkdir -p "$OUT"
for c in ${LEVELS//,/ }; do
  timeout -k 5 "${PROF_S:-100}" python3 benchmarks/profile_step.py $P --temperature 0.7 --force-aside --no-context-write \
    --concurrency "$c" --trace "$OUT/trace_aside_c$c" --json "$OUT/gaps_aside_c$c.json" > "$OUT/gaps_aside_c$c.log" 2>&1
  echo "aside c=$c exit $?"
  grep -E "device idle|host waits|stepped-aside step" "$OUT/gaps_aside_c$c.log"
done
timeout -k 5 "${PROF_S:-100}" python3 benchmarks/profile_step.py $P --temperature 0.7 --concurrency 1 \
  --trace "$OUT/trace_natural_c1" --json "$OUT/gaps_natural_c1.json" > "$OUT/gaps_natural_c1.log" 2>&1
echo "natural c=1 exit $?"
grep -E "device idle|host waits|stepped-aside step|steps by kind" "$OUT/gaps_natural_c1.log"
SGLAUNCH_DRAFT_CUDA_GRAPH=0 SGLAUNCH_DSPARK_BURST=0 timeout -k 5 "${PROF_S:-100}" python3 benchmarks/profile_step.py $P \
  --temperature 0.7 --force-aside --concurrency 1 --json "$OUT/gaps_nographs_c1.json" > "$OUT/gaps_nographs_c1.log" 2>&1
echo "aside without the drafter's graphs and bursts, c=1 exit $?"
grep -E "device idle|host waits|stepped-aside step" "$OUT/gaps_nographs_c1.log"
# NOTE: a call brings back at most 8 files of 16 MiB each: the logs and figures in one archive, the traces in
# another, cut into 15 MiB parts if larger (`cat traces.tgz.part_* > traces.tgz` here)
cd "$OUT" || exit 1
tar -czf aside_gaps.tgz --remove-files gaps_*
if ls -d trace_* > /dev/null 2>&1 && tar -cf traces.tgz --remove-files trace_* \
    && [ "$(stat -c %s traces.tgz)" -gt 15000000 ]; then
  split -b 15000000 traces.tgz traces.tgz.part_ && rm traces.tgz
fi
ls -la
