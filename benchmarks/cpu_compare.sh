#!/bin/bash
# Issue 19's CPU row: three back-to-back plain vs DSpark `bench --compare` runs on a 2-core CPU host,
# the session-4 command (16 held-out prompts, 64 tokens, c=1 and 8), into OUT/run1..3 (session 14:
# benchmarks/cpu14, session 15: benchmarks/cpu15). Run from anywhere with sglaunch installed and
# the default model pulled:  bash benchmarks/cpu_compare.sh benchmarks/cpu15 > benchmarks/cpu15/run_all.log
# DRAFTER2=DIR compares two drafters instead: DSpark compact with the bundled drafter (label dspark) against
# DSpark compact with DIR's (label dspark2), the same runs otherwise (session 46).
OUT=${1:?usage: [DRAFTER2=DIR] bash benchmarks/cpu_compare.sh OUT_DIR}
# DSPARK_FLAGS: more serve flags for every DSpark server (e.g. one --speculative-dspark-sps-table-path for both
# drafters, so that the start-up profiles' noise does not size the two servers' verify windows differently).
DSPARK="SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK ${DSPARK_FLAGS:-}"
arms=(--compare "sglaunch serve" --compare "$DSPARK" --label plain --label dspark)
if [ -n "${DRAFTER2:-}" ]; then
  arms=(--compare "$DSPARK" --compare "$DSPARK --speculative-draft-model-path $DRAFTER2" --label dspark --label dspark2)
fi
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$OUT"
# the host: its ratios depend on it (session 26's AMD EPYC without AVX-512 had no native bf16, priced an 8-token
# verify at 5x a plain step, and the planner stepped aside on nearly every step)
{ lscpu | grep -E "^Model name|^CPU\(s\)"
  echo "native bf16 flags: $(grep -o -w -E "avx512_bf16|amx_bf16" /proc/cpuinfo | sort -u | tr "\n" " ")"
} > "$OUT/host.txt" 2>&1
for N in 1 2 3; do
  mkdir -p "$OUT/run$N"
  echo "=== run$N start $(date -Is)"
  python -m sglaunch bench "${arms[@]}" --dataset benchmarks/prompt_set/heldout.jsonl \
    --num-prompts 16 --output-len 64 --concurrency 1,8 --temperature 0 \
    --output "$OUT/run$N/bench.json" --no-plot \
    > "$OUT/run$N/bench.stdout" 2> "$OUT/run$N/bench.stderr"
  echo "=== run$N rc=$? end $(date -Is)"
done
