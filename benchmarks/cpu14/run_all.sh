#!/bin/bash
# cpu14: three back-to-back plain vs DSpark bench --compare runs on a 2-core CPU host.
cd /work/main
. /work/venv/bin/activate
for N in 1 2 3; do
  mkdir -p benchmarks/cpu14/run$N
  echo "=== run$N start $(date -Is)"
  /usr/bin/time -v python -m sglaunch bench --compare "sglaunch serve" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl \
    --num-prompts 16 --output-len 64 --concurrency 1,8 --temperature 0 \
    --output benchmarks/cpu14/run$N/bench.json --no-plot \
    > benchmarks/cpu14/run$N/bench.stdout 2> benchmarks/cpu14/run$N/bench.stderr
  echo "=== run$N rc=$? end $(date -Is)"
done
