#!/bin/bash
# cpu14 (issue 19's CPU row): three back-to-back plain vs DSpark `bench --compare` runs on a
# 2-core CPU host, the session-4 command (16 held-out prompts, 64 tokens, c=1 and 8). Run from
# anywhere with sglaunch installed (and the default model pulled); results go to runN/.
cd "$(dirname "$0")/../.." || exit 1
for N in 1 2 3; do
  mkdir -p benchmarks/cpu14/run$N
  echo "=== run$N start $(date -Is)"
  python -m sglaunch bench --compare "sglaunch serve" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl \
    --num-prompts 16 --output-len 64 --concurrency 1,8 --temperature 0 \
    --output benchmarks/cpu14/run$N/bench.json --no-plot \
    > benchmarks/cpu14/run$N/bench.stdout 2> benchmarks/cpu14/run$N/bench.stderr
  echo "=== run$N rc=$? end $(date -Is)"
done
