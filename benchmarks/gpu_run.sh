#!/usr/bin/env bash
# One GPU run (one H200): the GPU tests (tests/gpu: the kernel tests first, then the rest, so a
# slow FlashInfer JIT in the others cannot take the kernel results down), engine vs transformers
# decoding, the SPS profile of SmolLM2 and the DSpark sweep, in that order, each under its own
# time limit; logs and JSON go into OUT, a compact summary is printed last (OUT/summary.txt).
#
#   bash benchmarks/gpu_run.sh OUT SMOLLM2_DIR DRAFTER_DIR PROMPTS_JSONL
#
# Run from the repository root with the packages installed and PYTHONPATH set. Environment:
#   PYTHON              interpreter (default python3)
#   ATTN                engine attention backend of the benchmarks: torch (default; predictable time)
#                       or flashinfer (JIT-compiles for minutes on a fresh machine unless its cache
#                       is brought along: FLASHINFER_WORKSPACE_BASE, see tests/gpu/conftest.py)
#   DISABLE_CUDA_GRAPH  1: benchmarks run the engine without CUDA graphs
#   PARTS               which parts to run (default: all five, "pytest_kernels pytest_gpu gpu_decode
#                       profile_sps dspark_sweep"), so that one run can be split over two calls
#   T_KERNELS T_PYTEST T_DECODE T_SPS T_SWEEP   per-part limits in seconds (default 90 90 145 40
#                       180: 9.1 min at most; about 6-7 min expected)
# OUT receives at most 6 files: run.log (every part's output, concatenated), summary.txt,
# gpu_decode.json, sps_smollm2.json, dspark_sweep.json, flashinfer_cache.tgz (FI_CACHE_IN=it next time). Exit 0 when every part exited 0.
set -u
if [ $# -ne 4 ]; then
  echo "usage: bash benchmarks/gpu_run.sh OUT SMOLLM2_DIR DRAFTER_DIR PROMPTS_JSONL" >&2
  exit 2
fi
OUT=$1 SMOL=$2 DRAFTER=$3 PROMPTS=$4
PY=${PYTHON:-python3}
T_KERNELS=${T_KERNELS:-90} T_PYTEST=${T_PYTEST:-90} T_DECODE=${T_DECODE:-145} T_SPS=${T_SPS:-40}
T_SWEEP=${T_SWEEP:-180}
mkdir -p "$OUT"
LOG=$OUT/run.log
SUMMARY=$OUT/summary.txt
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
: > "$LOG"
STATUS=""
FAILED=0

PARTS=${PARTS:-pytest_kernels pytest_gpu gpu_decode profile_sps dspark_sweep}
part() {  # part NAME LIMIT_S COMMAND...: run it under `timeout`, append its output to run.log
  local name=$1 limit=$2
  shift 2
  case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
  local start rc took
  start=$(date +%s)
  echo "===== $name (limit ${limit} s, $(date '+%H:%M:%S')): $*" | tee -a "$LOG"
  timeout -k 15 "$limit" "$@" > "$TMP/$name.out" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  cat "$TMP/$name.out" >> "$LOG"
  echo "===== $name: exit $rc after ${took} s" | tee -a "$LOG"
  [ "$rc" -eq 124 ] && rc="124 (timed out)"
  STATUS+=$(printf '%-15s exit %-16s %4d s' "$name" "$rc" "$took")$'\n'
  [ "$rc" = 0 ] || FAILED=1
}

# FlashInfer's JIT cache: compiling one head layout takes 65-90 s on the H200, so a run can start
# from the cache an earlier run brought back (FI_CACHE_IN=flashinfer_cache.tgz) and brings its
# own back as OUT/flashinfer_cache.tgz when it fits what a call returns (16 MiB).
# NOTE: the cache's build.ninja files hold absolute paths (the workspace and FlashInfer's install
# prefix, /tmp/site here): restored under another FLASHINFER_WORKSPACE_BASE or with FlashInfer
# installed elsewhere, ninja rebuilds everything (seen on 2026-11-30: more than 110 s lost)
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
if [ -n "${FI_CACHE_IN:-}" ] && [ -f "$FI_CACHE_IN" ]; then
  tar -xzf "$FI_CACHE_IN" -C "$FLASHINFER_WORKSPACE_BASE" && echo "FlashInfer JIT cache restored from $FI_CACHE_IN"
fi
save_fi_cache() {
  (cd "$FLASHINFER_WORKSPACE_BASE" && [ -d .cache ] && tar -czf "$TMP/fi.tgz" .cache) || return 0
  if [ "$(stat -c %s "$TMP/fi.tgz")" -le $((15 * 1024 * 1024)) ]; then
    cp "$TMP/fi.tgz" "$OUT/flashinfer_cache.tgz"
  else
    echo "FlashInfer JIT cache is $(du -h "$TMP/fi.tgz" | cut -f1) compressed: not brought back" | tee -a "$LOG"
  fi
}

ATTN=${ATTN:-torch}
ENGINE_FLAGS=(--attention-backend "$ATTN")
SERVE_ARGS="--attention-backend $ATTN"
if [ "${DISABLE_CUDA_GRAPH:-0}" = 1 ]; then
  ENGINE_FLAGS+=(--disable-cuda-graph)
  SERVE_ARGS+=" --disable-cuda-graph"
fi
WINDOW=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1] + "/config.json"))["block_size"] + 1)' \
         "$DRAFTER" 2>/dev/null || echo 8)

{ echo "host $(hostname), $(date '+%Y-%m-%d %H:%M:%S')"; nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader 2>&1; "$PY" -c 'import torch, triton, transformers; print("torch", torch.__version__,
"triton", triton.__version__, "transformers", transformers.__version__)' 2>&1; } | tee -a "$LOG"

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfEsxX)
part pytest_kernels "$T_KERNELS" "${PYTEST[@]}" tests/gpu/test_kernels_gpu.py
part pytest_gpu "$T_PYTEST" "${PYTEST[@]}" tests/gpu --ignore=tests/gpu/test_kernels_gpu.py
part gpu_decode "$T_DECODE" "$PY" benchmarks/gpu_decode.py --model "$SMOL" --out "$OUT" \
  --time-budget $(( T_DECODE - 15 )) "${ENGINE_FLAGS[@]}"
part profile_sps "$T_SPS" "$PY" -m sglaunch profile-sps --model-path "$SMOL" --device cuda --window "$WINDOW" \
  -o "$OUT/sps_smollm2.json" --json
part dspark_sweep "$T_SWEEP" "$PY" benchmarks/dspark_sweep.py --model "$SMOL" --drafter "$DRAFTER" \
  --prompts "$PROMPTS" --out "$OUT" --time-budget $(( T_SWEEP - 40 )) "--serve-args=$SERVE_ARGS"

{
  echo "===== summary"
  printf '%s' "$STATUS"
  for name in pytest_kernels pytest_gpu; do
    [ -f "$TMP/$name.out" ] || continue
    echo "--- $name"
    grep -E '^(FAILED|ERROR|XFAIL|XPASS|SKIPPED)' "$TMP/$name.out" | cut -c1-2500 | tail -n 25
    tail -n 1 "$TMP/$name.out"
  done
  "$PY" - "$OUT" "$WINDOW" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
for name in ("gpu_decode.json", "dspark_sweep.json"):
    print(f"--- {name}")
    try:
        print("\n".join(json.loads((out / name).read_text())["table"]))
    except Exception as exc:
        print(f"(no table: {type(exc).__name__}: {exc})")
print(f"--- sps_smollm2.json (profile-sps, window {sys.argv[2]})")
try:
    points = json.loads((out / "sps_smollm2.json").read_text())["points"]
    print("tokens   " + " ".join(f"{p['tokens']:>7d}" for p in points))
    print("ms/step  " + " ".join(f"{1e3 / p['steps_per_second']:7.2f}" for p in points))
except Exception as exc:
    print(f"(no table: {type(exc).__name__}: {exc})")
EOF
} > "$SUMMARY" 2>&1
cat "$SUMMARY" | tee -a "$LOG"
save_fi_cache
exit "$FAILED"
