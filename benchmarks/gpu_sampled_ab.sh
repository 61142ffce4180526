#!/usr/bin/env bash
# Session 34's one device call after the wheels' install (bash benchmarks/gpu_session6.sh install DIR for
# .whlA, .whlB, .whlC): no model upload, so it fits what asks without a machine left of the session's
# device time. Run from the repository root on the GPU machine; results into $OUT.
#   1. the GPU tests of the sampled DSpark step (sessions 31-33: the sampled drafter graphs, the sampled
#      second chain, sampled plain steps in flight), limit $TEST_S seconds;
#   2. where a sampled DSpark step's time goes with the block drawn eagerly after the drafter's greedy graph
#      (SGLAUNCH_DRAFT_SAMPLED_GRAPH=0) and inside the sampled drafter graphs (=1): profile_step.py at
#      T=0.7, drafting at every step (step-aside off), SmolLM2-135M's shape with random weights (the
#      bundled drafter on it: the drafter's work per step is the real one; the accept lengths are not),
#      concurrency $LEVELS. Each run also times plain decoding in the same engine build.
set -u
TEST_S=${TEST_S:-150}
LEVELS=${LEVELS:-1}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws SGLAUNCH_CACHE_DIR=/tmp/cache
timeout -k 10 "$TEST_S" python3 -m pytest -v --tb=short -p no:cacheprovider tests/gpu \
  -k "sampled or wait_only or second_chain" > "$OUT/gputest.log" 2>&1
echo "gputest exit $?"
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gputest.log" | tail -16
P="--model benchmarks/gpu6/smolcfg --random-like --drafter sglaunch/hub/drafters/smollm2-135m-instruct --device cuda"
P="$P --modes compact --steps 40 --warmup 10 --overlap 1 --temperature 0.7"
for c in ${LEVELS//,/ }; do
  for g in 0 1; do
    SGLAUNCH_DSPARK_STEP_ASIDE=0 SGLAUNCH_DRAFT_SAMPLED_GRAPH=$g timeout -k 10 "${PROF_S:-110}" \
      python3 benchmarks/profile_step.py $P --concurrency "$c" --json "$OUT/prof_c${c}_g$g.json" > "$OUT/prof_c${c}_g$g.log" 2>&1
    echo "profile c=$c sampled graphs=$g exit $?"
    grep -A3 "^config  " "$OUT/prof_c${c}_g$g.log" | head -4
    grep -E "^dspark-compact.*- plain" "$OUT/prof_c${c}_g$g.log"
  done
done
