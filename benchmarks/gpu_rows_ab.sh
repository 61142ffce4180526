#!/usr/bin/env bash
# Session 36's first device call after the wheels' install (bash benchmarks/gpu_session6.sh install DIR for
# .whlA, .whlB, .whlC; carry .pre36 too): no model upload. Run from the repository root on the GPU machine;
# results into $OUT.
#   1. the GPU tests of the changed row picks (model_runner's logit rows through transfer.rows_of, the eager
#      step's input ids and the torch backend's group index through one pinned copy): the new census of graph
#      forwards (test_graph_forward_never_waits_for_the_device), the step's sync censuses, the sampled step's
#      tests; limit $TEST_S seconds;
#   2. where a sampled DSpark step's time goes before (the tree at f884016: .pre36 holds its model_runner.py and
#      torch_backend.py, laid over a copy of this tree in /tmp/old) and after: profile_step.py at T=0.7, drafting
#      at every step (step-aside off), SmolLM2-135M's shape with random weights and the bundled drafter,
#      concurrency $LEVELS, each run also timing plain decoding in the same build.
set -u
TEST_S=${TEST_S:-170}
LEVELS=${LEVELS:-1,8}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws SGLAUNCH_CACHE_DIR=/tmp/cache
rm -rf /tmp/old && mkdir -p /tmp/old && cp -a sglaunch benchmarks /tmp/old/ && cp -a .pre36/sglaunch/. /tmp/old/sglaunch/
PYTHONPATH=/tmp/site:$PWD timeout -k 10 "$TEST_S" python3 -m pytest -v --tb=short -p no:cacheprovider tests/gpu \
  -k "never_waits or host_syncs or sampled or wait_only" > "$OUT/gputest.log" 2>&1
echo "gputest exit $?"
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gputest.log" | tail -24
P="--model benchmarks/gpu6/smolcfg --random-like --drafter sglaunch/hub/drafters/smollm2-135m-instruct --device cuda"
P="$P --modes compact --steps 40 --warmup 10 --overlap 1 --temperature 0.7"
for c in ${LEVELS//,/ }; do
  for side in old new; do
    root=$PWD; [ $side = old ] && root=/tmp/old
    PYTHONPATH=/tmp/site:$root SGLAUNCH_DSPARK_STEP_ASIDE=0 timeout -k 10 "${PROF_S:-110}" \
      python3 $root/benchmarks/profile_step.py $P --concurrency "$c" --json "$OUT/prof_c${c}_$side.json" > "$OUT/prof_c${c}_$side.log" 2>&1
    echo "profile c=$c $side exit $?"
    grep -A3 "^config  " "$OUT/prof_c${c}_$side.log" | head -4
    grep -E "cudaStreamSynchronize" "$OUT/prof_c${c}_$side.log" | tail -1
  done
done
